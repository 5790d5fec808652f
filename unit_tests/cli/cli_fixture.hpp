// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What the tests of the `kdnn` tool share: a fixture with a fresh --in and
// --out directory per test, running the tool as a subprocess (no Kokkos in
// the test process), writing inputs and reading outputs as double, and the
// check of every error path (exit status, one "kdnn: error:" line on stderr,
// nothing on stdout, --out as it was).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kdnn/io/npy.hpp"
#include "test_paths.hpp"

namespace kdnn_test {

namespace fs = std::filesystem;
using Shape = std::vector<std::size_t>;
using Strings = std::vector<std::string>;

constexpr int kUsage = 2, kInput = 1;

struct Result {
  int status = -1;
  std::string out, err;
};

inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (const char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

inline std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

#ifdef KDNN_MPIEXEC
/// The launcher of `ranks` processes of the tool, in the environment of
/// every MPI test (KDNN_MPI_ENVIRONMENT, cmake/kdnnTesting.cmake). A hang (a
/// rank left waiting) fails the test after a minute instead of stalling the
/// suite.
inline std::string mpiexec(int ranks) {
  return "timeout 60 env " KDNN_MPI_ENVIRONMENT " " + quote(KDNN_MPIEXEC) + " -n " +
         std::to_string(ranks);
}
#endif

/// The peak resident memory of the largest child process waited for so far,
/// in MiB: a test that runs the tool once measures that run.
inline double peak_child_mib() {
  rusage usage{};
  EXPECT_EQ(::getrusage(RUSAGE_CHILDREN, &usage), 0);
  return double(usage.ru_maxrss) / 1024;  // KiB
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() / ("kdnn_cli_test_" + std::to_string(::getpid()) + "_" +
                                         info->test_suite_name() + "_" + info->name());
    fs::remove_all(root_);
    fs::create_directories(in_ = root_ / "in");
    fs::create_directories(out_ = root_ / "out");
  }
  void TearDown() override { fs::remove_all(root_); }

  /// The shell command that runs the tool with `args`.
  static std::string command(const Strings& args) {
    std::string cmd = quote(env_or("KDNN_CLI_PATH", KDNN_CLI_PATH));
    for (const auto& a : args) cmd += " " + quote(a);
    return cmd;
  }

  /// Runs the tool with `args`, after `launcher` (e.g. "mpiexec -n 2") if given.
  Result run(const Strings& args, const std::string& launcher = "") const {
    return run_to(root_ / "stdout.txt", args, launcher);
  }

  /// run() with stdout to `out` (e.g. /dev/full; Result::out is then what
  /// that file reads).
  Result run_to(const fs::path& out, const Strings& args, const std::string& launcher = "") const {
    std::string cmd = launcher + " " + command(args);
    const fs::path err = root_ / "stderr.txt";
    cmd += " >" + quote(out.string()) + " 2>" + quote(err.string());
    const int raw = std::system(cmd.c_str());
    Result r;
    r.status = raw != -1 && WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    r.out = out == "/dev/full" ? std::string() : read_text(out);
    r.err = read_text(err);
    return r;
  }

  /// Writes in_/name as float64 or float32 (the values rounded).
  void write(const std::string& name, kdnn::io::DType dtype, const Shape& shape,
             const std::vector<double>& values) const {
    const std::string path = (in_ / name).string();
    if (dtype == kdnn::io::DType::f64) {
      kdnn::io::write_npy(path, shape, values.data());
    } else {
      const std::vector<float> f(values.begin(), values.end());
      kdnn::io::write_npy(path, shape, f.data());
    }
  }

  /// Writes in_/name as int64 (what numpy writes for Python integers), and
  /// returns the values as doubles (the references' form).
  std::vector<double> write_ids(const std::string& name, const Shape& shape,
                                const std::vector<std::int64_t>& values) const {
    kdnn::io::write_npy((in_ / name).string(), shape, values.data());
    return std::vector<double>(values.begin(), values.end());
  }

  /// Reads an output file, checking its dtype and shape.
  std::vector<double> read(const fs::path& path, kdnn::io::DType dtype, const Shape& shape) const {
    const auto a = kdnn::io::read_npy(path.string());
    EXPECT_EQ(a.dtype, dtype) << path;
    EXPECT_EQ(a.shape, shape) << path;
    if (a.dtype == kdnn::io::DType::f64) return {a.data<double>(), a.data<double>() + a.size()};
    return {a.data<float>(), a.data<float>() + a.size()};
  }

  static std::set<std::string> files(const fs::path& dir) {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
    return names;
  }

  /// Runs `args` and expects failure with `status`, one error line on stderr
  /// containing `fragment`, nothing on stdout, and an untouched --out.
  /// `launcher` as for run().
  void expect_error(const Strings& args, int status, const std::string& fragment,
                    const std::set<std::string>& out_files = {},
                    const std::string& launcher = "") const {
    std::string shown;
    for (const auto& a : args) shown += " " + a;
    SCOPED_TRACE("kdnn" + shown);
    const Result r = run(args, launcher);
    EXPECT_EQ(r.status, status);
    EXPECT_EQ(r.err.rfind("kdnn: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(r.err.empty() || r.err.back() != '\n') << r.err;
    EXPECT_NE(r.err.find(fragment), std::string::npos)
        << "expected \"" << fragment << "\" in: " << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(files(out_), out_files);
  }

#ifdef KDNN_MPIEXEC
  /// Runs `args` under mpiexec with `ranks` ranks and expects failure with
  /// `status` and one "kdnn: error:" line containing `fragment` (mpiexec
  /// adds lines of its own), nothing on stdout, --out untouched.
  void expect_mpi_failure(const Strings& args, int status, const std::string& fragment,
                          int ranks) const {
    SCOPED_TRACE(fragment);
    const auto r = run(args, mpiexec(ranks));
    EXPECT_EQ(r.status, status);
    const auto at = r.err.find("kdnn: error: ");
    ASSERT_NE(at, std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("kdnn: error: ", at + 1), std::string::npos) << r.err;
    EXPECT_NE(r.err.substr(at, r.err.find('\n', at) - at).find(fragment), std::string::npos)
        << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_TRUE(files(out_).empty());
  }

  /// --split counts whose int64 sum wraps around to the sequence length L
  /// are each checked against L: the same error on every rank (it was a
  /// std::length_error on rank 0 and a hang on the others). `args` makes a
  /// subcommand's arguments from extra options.
  template <class Args>
  void expect_split_counts_above_length_rejected(const Args& args, long long L) const {
    const std::string max = "9223372036854775807", quarter = "4611686018427387904";  // 2^63-1, 2^62
    const std::string l = std::to_string(L);
    expect_mpi_failure(args({"--split", max + "," + max + "," + std::to_string(L + 2)}), 1,
                       "--split: count " + max + " of rank 0 is more than L=" + l, 3);
    // Three quarters of 2^64 plus the last count wrap around to exactly L.
    expect_mpi_failure(args({"--split", quarter + "," + quarter + "," + quarter + "," +
                                            std::to_string(4611686018427387904LL + L)}),
                       1, "--split: count " + quarter + " of rank 0 is more than L=" + l, 4);
    expect_mpi_failure(args({"--split", "0," + std::to_string(L + 1) + ",0"}), 1,
                       "--split: count " + std::to_string(L + 1) + " of rank 1 is more than L=" + l,
                       3);
    expect_mpi_failure(args({"--split", "1," + max + "0,0"}), 2,
                       "--split: expected counts >= 0 (at most " + max + "), got '" + max + "0'",
                       3);
    expect_mpi_failure(args({"--split", "1,-0,0"}), 2, "--split: expected counts >= 0", 3);
  }
#endif

  fs::path root_, in_, out_;
};

}  // namespace kdnn_test
