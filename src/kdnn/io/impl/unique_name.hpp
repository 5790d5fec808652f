// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Names for the files kdnn::io creates beside a destination (temporaries,
// backups): "<path>.<kind>.<pid>.<n>", with n counting up in this process,
// so that no other writer, thread or process, picks the same name. A file
// already under the name (even a symbolic link) is never followed or reused:
// callers create with O_EXCL or link(), and take the next name on EEXIST.
#include <unistd.h>

#include <atomic>
#include <string>

namespace kdnn::io::impl {

/// The next candidate name for a file of `kind` ("tmp", "bak") beside `path`.
inline std::string unique_name(const std::string& path, const char* kind) {
  static std::atomic<unsigned> counter{0};
  return path + "." + kind + "." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

}  // namespace kdnn::io::impl
