// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What the tests of kdnn::io's .npy reading and writing share (test_npy.cpp,
// test_npy_headers.cpp, test_npy_files.cpp): the NumPy fixtures under
// data/npy/, the check of a read's error message, files as bytes, and a
// fixture with a fresh, empty directory per test.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "kdnn/io/npy.hpp"
#include "test_paths.hpp"

namespace kdnn_test {

namespace fs = std::filesystem;

inline std::string fixture(const std::string& name) { return data_dir() + "/npy/" + name; }

inline void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos)
      << "message: " << message << "\nexpected to contain: " << part;
}

/// Reading `path` fails with a message that starts with the path and
/// contains every one of `parts`.
inline void expect_read_error(const std::string& path, const std::vector<std::string>& parts) {
  const std::string message = error_of([&] { kdnn::io::read_npy(path); });
  EXPECT_EQ(message.rfind(path, 0), 0u) << "message does not start with the path: " << message;
  for (const auto& part : parts) expect_contains(message, part);
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

/// Each test gets a fresh, empty directory, removed afterwards.
class Npy : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = fs::temp_directory_path() /
           ("kdnn_test_npy_" + name + "_" + std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  /// The names in the directory (temporaries included).
  std::set<std::string> entries() const {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.insert(e.path().filename().string());
    return names;
  }

  fs::path dir_;
};

}  // namespace kdnn_test
