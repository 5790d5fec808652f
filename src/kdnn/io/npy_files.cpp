// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include "kdnn/io/npy_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "kdnn/core/error.hpp"
#include "kdnn/io/impl/unique_name.hpp"

namespace kdnn::io {

namespace {

/// A destination that replace() has given its new file.
struct Replaced {
  std::string path;
  std::string backup;  ///< the earlier file, hard-linked; "" if there was none
};

void remove_each(const std::vector<std::string>& names) {
  for (const std::string& name : names) ::unlink(name.c_str());
}

/// Keeps the file at `path`, if any, under a new name (a hard link to it,
/// or to the symbolic link itself) and returns that name; "" when there is
/// nothing to keep: no file, or a directory, which rename() will refuse to
/// replace. Throws kdnn::Error when the link cannot be made.
std::string keep_earlier(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) return "";
  std::string backup;
  int rc = 0;
  do {
    backup = impl::unique_name(path, "bak");
    rc = ::linkat(AT_FDCWD, path.c_str(), AT_FDCWD, backup.c_str(), 0);
  } while (rc != 0 && errno == EEXIST);
  if (rc == 0) return backup;
  if (errno == ENOENT) return "";  // removed meanwhile
  fail(path, ": cannot keep the earlier file as '", backup, "': ", std::strerror(errno));
}

/// Renames `tmp` onto `path`, keeping the earlier file first, and records it
/// in `done`. Throws kdnn::Error naming `path` on failure; `tmp` stays.
void replace(const std::string& path, const std::string& tmp, std::vector<Replaced>& done) {
  const std::string backup = keep_earlier(path);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    if (!backup.empty()) ::unlink(backup.c_str());
    fail(path, ": cannot rename '", tmp, "' to it: ", std::strerror(err));
  }
  done.push_back({path, backup});
}

/// Puts back every earlier file in `done`, last first, and removes the files
/// that had none. Returns "" or, for each destination it could not put
/// back, what went wrong and where the earlier file is.
std::string undo(const std::vector<Replaced>& done) {
  std::string problems;
  for (auto it = done.rbegin(); it != done.rend(); ++it) {
    const bool had_file = !it->backup.empty();
    if ((had_file ? std::rename(it->backup.c_str(), it->path.c_str())
                  : ::unlink(it->path.c_str())) == 0) {
      continue;
    }
    problems += "; could not restore " + it->path + ": " + std::strerror(errno);
    if (had_file) problems += " (the earlier file is '" + it->backup + "')";
  }
  return problems;
}

}  // namespace

void write_npy_files(const std::vector<NpyFile>& files) {
  std::vector<std::string> temporaries;
  try {
    for (const NpyFile& f : files) {
      temporaries.push_back(
          write_npy_temporary(f.path, f.array.dtype, f.array.shape, f.array.bytes.data()));
    }
  } catch (...) {
    remove_each(temporaries);
    throw;
  }
  std::vector<Replaced> done;
  try {
    for (std::size_t i = 0; i < files.size(); ++i) replace(files[i].path, temporaries[i], done);
  } catch (const Error& e) {
    remove_each({temporaries.begin() + done.size(), temporaries.end()});
    throw Error(e.what() + undo(done));
  }
  for (const Replaced& r : done) {
    if (!r.backup.empty()) ::unlink(r.backup.c_str());
  }
}

}  // namespace kdnn::io
