#include "kdnn/io/npy_files.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "kdnn/core/error.hpp"

namespace kdnn::io {

void write_npy_files(const std::vector<NpyFile>& files) {
  std::vector<std::string> temporaries;
  try {
    for (const NpyFile& f : files) {
      temporaries.push_back(
          write_npy_temporary(f.path, f.array.dtype, f.array.shape, f.array.bytes.data()));
    }
  } catch (...) {
    for (const std::string& tmp : temporaries) std::remove(tmp.c_str());
    throw;
  }
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (std::rename(temporaries[i].c_str(), files[i].path.c_str()) == 0) continue;
    const int err = errno;
    for (std::size_t j = i; j < temporaries.size(); ++j) std::remove(temporaries[j].c_str());
    fail(files[i].path, ": cannot rename '", temporaries[i], "' to it: ", std::strerror(err));
  }
}

}  // namespace kdnn::io
