// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// kdnn::io's .npy files on disk: a set of files written all or nothing
// (npy_files.hpp), earlier files and links restored when one fails;
// temporaries that never follow what is already under their name; and
// only regular files read (a FIFO without blocking, a directory, dangling
// links and link loops named).
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>

#include "expect_error.hpp"
#include "kdnn/io/npy.hpp"
#include "kdnn/io/npy_files.hpp"
#include "npy_test_files.hpp"

using kdnn::io::DType;
using kdnn::io::NpyArray;
using kdnn::io::read_npy;
using kdnn::io::write_npy;
using namespace kdnn_test;  // fs, the fixture and the file helpers

// ---- a set of files, all or nothing (npy_files.hpp) ----

namespace {

/// The inode of `path` itself (not of a link's target).
ino_t inode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

}  // namespace

TEST_F(Npy, WriteFilesReplacesEveryFileAndLeavesNothingElse) {
  const NpyArray a = read_npy(fixture("f64_4.npy"));
  const NpyArray b = read_npy(fixture("f32_2x3.npy"));
  write_bytes(path("a.npy"), "earlier");
  kdnn::io::write_npy_files({{path("a.npy"), a}, {path("b.npy"), b}});
  EXPECT_EQ(read_npy(path("a.npy")).bytes, a.bytes);
  EXPECT_EQ(read_npy(path("b.npy")).bytes, b.bytes);
  EXPECT_EQ(entries(), (std::set<std::string>{"a.npy", "b.npy"}));
}

TEST_F(Npy, WriteFilesFailingPartWayRestoresEveryEarlierFile) {
  // a.npy and c.npy are replaced before the rename onto the directory b.npy
  // fails; then a.npy must be the very file it was, and c.npy gone again.
  const NpyArray array = read_npy(fixture("f64_4.npy"));
  write_bytes(path("a.npy"), "earlier");
  const ino_t inode = inode_of(path("a.npy"));
  fs::create_directories(path("b.npy") + "/keep");
  const std::string message = kdnn_test::error_of([&] {
    kdnn::io::write_npy_files(
        {{path("a.npy"), array}, {path("c.npy"), array}, {path("b.npy"), array}});
  });
  EXPECT_EQ(message.rfind(path("b.npy"), 0), 0u) << message;
  EXPECT_EQ(read_bytes(path("a.npy")), "earlier");
  EXPECT_EQ(inode_of(path("a.npy")), inode);
  EXPECT_TRUE(fs::is_directory(path("b.npy") + "/keep"));
  EXPECT_EQ(entries(), (std::set<std::string>{"a.npy", "b.npy"}));
}

TEST_F(Npy, WriteFilesRestoresAnEarlierSymbolicLink) {
  // The link itself is kept and put back, not the file it points to.
  const NpyArray array = read_npy(fixture("f64_4.npy"));
  write_bytes(path("target"), "target");
  fs::create_symlink("target", path("a.npy"));
  fs::create_directory(path("b.npy"));
  EXPECT_NE(kdnn_test::error_of([&] {
              kdnn::io::write_npy_files({{path("a.npy"), array}, {path("b.npy"), array}});
            }),
            "");
  ASSERT_TRUE(fs::is_symlink(path("a.npy")));
  EXPECT_EQ(fs::read_symlink(path("a.npy")), "target");
  EXPECT_EQ(read_bytes(path("target")), "target");
  EXPECT_EQ(entries(), (std::set<std::string>{"a.npy", "b.npy", "target"}));
}

// ---- temporaries never follow what is already under their name ----

TEST_F(Npy, TemporaryNamesTakenBySymbolicLinksAreSkipped) {
  // Learn the naming pattern "<path>.tmp.<pid>.<n>" from one temporary.
  const double values[2] = {1, 2};
  const std::string target = path("a.npy");
  const std::string first = kdnn::io::write_npy_temporary(target, DType::f64, {2}, values);
  fs::remove(first);
  const std::string prefix = target + ".tmp." + std::to_string(::getpid()) + ".";
  ASSERT_EQ(first.rfind(prefix, 0), 0u) << first;
  const unsigned long n = std::stoul(first.substr(prefix.size()));

  // Links at the next 50 names, pointing at a file that must stay unchanged.
  const std::string victim = path("victim");
  write_bytes(victim, "victim");
  std::set<std::string> expected = {"a.npy", "victim"};
  for (unsigned long k = n + 1; k <= n + 50; ++k) {
    const std::string link = prefix + std::to_string(k);
    fs::create_symlink(victim, link);
    expected.insert(fs::path(link).filename().string());
  }

  write_npy<double>(target, {2}, values);
  EXPECT_FALSE(fs::is_symlink(target));
  EXPECT_EQ(read_npy(target).data<double>()[1], 2.0);
  EXPECT_EQ(read_bytes(victim), "victim");
  EXPECT_EQ(entries(), expected);
  for (unsigned long k = n + 1; k <= n + 50; ++k) {
    const std::string link = prefix + std::to_string(k);
    ASSERT_TRUE(fs::is_symlink(link)) << link;
    EXPECT_EQ(fs::read_symlink(link), victim) << link;
  }
}

// ---- only regular files are read ----

TEST_F(Npy, FifoIsRejectedWithoutBlocking) {
  // Opening a FIFO for reading would wait for a writer forever; should it
  // block, SIGALRM ends the test binary rather than leave it hanging.
  ASSERT_EQ(::mkfifo(path("a.npy").c_str(), 0600), 0);
  ::alarm(20);
  expect_read_error(path("a.npy"), {": not a regular file (a FIFO)"});
  ::alarm(0);
}

TEST_F(Npy, DirectoryIsRejected) {
  fs::create_directory(path("a.npy"));
  expect_read_error(path("a.npy"), {": not a regular file (a directory)"});
}

TEST_F(Npy, DanglingSymbolicLinkIsNamed) {
  fs::create_symlink(path("missing.npy"), path("a.npy"));
  expect_read_error(path("a.npy"), {": symbolic link to a missing file"});
}

TEST_F(Npy, SymbolicLinkLoopIsRejected) {
  fs::create_symlink("b.npy", path("a.npy"));
  fs::create_symlink("a.npy", path("b.npy"));
  expect_read_error(path("a.npy"), {std::strerror(ELOOP)});
}

TEST_F(Npy, SymbolicLinkToARegularFileIsRead) {
  fs::create_symlink(fixture("f64_4.npy"), path("a.npy"));
  EXPECT_EQ(read_npy(path("a.npy")).bytes, read_npy(fixture("f64_4.npy")).bytes);
}
