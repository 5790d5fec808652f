// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Writing a set of .npy files all or nothing, as far as a POSIX file system
// allows. Every file is written to a unique temporary beside its path; only
// when all are complete are they renamed onto their paths, one by one, each
// earlier file kept as a hard link ("<path>.bak.<pid>.<n>") until the end. If
// a rename fails, the files already renamed are undone: each earlier file is
// renamed back (the very same file: contents, inode, permissions; a symbolic
// link stays a link), a path that had none is removed, and the temporaries
// and backups are removed.
//
// Not atomic as a whole: another process looking in between sees some new
// files beside old ones, and a crash part way leaves them so (with the
// backups and temporaries beside them, under names no one else uses).
#include <string>
#include <vector>

#include "kdnn/io/npy.hpp"

namespace kdnn::io {

/// One file for write_npy_files: where it goes and what it holds.
struct NpyFile {
  std::string path;
  const NpyArray& array;
};

/// Writes every array to its path, or none: on failure every path is as it
/// was. Throws kdnn::Error starting with the path that failed (a directory
/// in a path's place fails: rename() cannot replace one).
void write_npy_files(const std::vector<NpyFile>& files);

}  // namespace kdnn::io
