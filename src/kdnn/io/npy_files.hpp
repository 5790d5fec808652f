#pragma once
// Writing a set of .npy files all or nothing, as far as a POSIX file system
// allows: every file is written to a unique temporary first, and the
// temporaries are renamed onto their destinations only once all are complete.
#include <string>
#include <vector>

#include "kdnn/io/npy.hpp"

namespace kdnn::io {

/// One file for write_npy_files: where it goes and what it holds.
struct NpyFile {
  std::string path;
  const NpyArray& array;
};

/// Writes every array to its path, or none. Throws kdnn::Error naming the
/// path that failed; the temporaries are removed.
void write_npy_files(const std::vector<NpyFile>& files);

}  // namespace kdnn::io
