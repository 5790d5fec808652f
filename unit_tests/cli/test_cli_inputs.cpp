// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The `kdnn` tool's inputs and outputs, through `kdnn sinkhorn`: missing,
// misshapen, mistyped and malformed inputs, each an error that leaves --out
// as it was; outputs that cannot replace what is there; unique temporaries;
// concurrent runs into one --out; inputs that are not regular files
// (FIFOs, dangling links, link loops, directories, unreadable files) and
// links to regular files; bytes from a file escaped on stderr.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli_fixture.hpp"
#include "cli_sinkhorn.hpp"
#include "kdnn/io/npy.hpp"
#include "random.hpp"
#include "sinkhorn_reference.hpp"

namespace {

using namespace kdnn_test;
using kdnn::io::DType;

TEST_F(Cli, MissingX) {
  expect_error(sinkhorn({"--iters", "3"}), kInput, "missing input " + (in_ / "x.npy").string());
}

TEST_F(Cli, InNotADirectory) {
  const Strings args{"sinkhorn", "--in", (root_ / "nope").string(), "--out", out_.string(),
                     "--iters",  "3"};
  expect_error(args, kInput,
               "--in '" + (root_ / "nope").string() + "' is not an existing directory");
}

TEST_F(Cli, OutNotAnExistingDirectory) {
  write_problem(DType::f64, 2, 3, true);
  const fs::path missing = root_ / "missing";
  expect_error(sinkhorn({"--iters", "3"}, missing), kInput,
               "--out '" + missing.string() + "' is not an existing directory");
  EXPECT_FALSE(fs::exists(missing));
  const fs::path file = root_ / "file";
  std::ofstream(file) << "keep";
  expect_error(sinkhorn({"--iters", "3"}, file), kInput, "is not an existing directory");
  EXPECT_EQ(read_text(file), "keep");
}

TEST_F(Cli, XWrongRank) {
  write("x.npy", DType::f64, {4, 4}, uniform(16, 0, 1, 1));
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               "x.npy has shape (4, 4), expected a 3-d array [B, n, n]");
  write("x.npy", DType::f64, {1, 2, 2, 2}, uniform(8, 0, 1, 1));
  expect_error(sinkhorn({"--iters", "3"}), kInput, "expected a 3-d array");
}

TEST_F(Cli, XNotSquare) {
  write("x.npy", DType::f64, {2, 3, 4}, uniform(24, 0, 1, 1));
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               "x.npy has shape (2, 3, 4), expected [B, n, n] (a batch of square matrices)");
}

TEST_F(Cli, GShapeDiffers) {
  write("x.npy", DType::f64, {3, 4, 4}, uniform(48, 0, 1, 1));
  write("g.npy", DType::f64, {2, 4, 4}, uniform(32, 0, 1, 2));
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               "g.npy has shape (2, 4, 4), expected (3, 4, 4) (same as x.npy)");
}

TEST_F(Cli, DTypeMismatch) {
  write("x.npy", DType::f64, {2, 3, 3}, uniform(18, 0, 1, 1));
  write("g.npy", DType::f32, {2, 3, 3}, uniform(18, 0, 1, 2));
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               "g.npy has dtype float32, expected float64 (same as x.npy)");
}

TEST_F(Cli, UnsupportedDType) {
  // A valid float32 file relabelled as uint32 (same element size).
  write("x.npy", DType::f32, {2, 3, 3}, uniform(18, 0, 1, 1));
  std::string bytes = read_text(in_ / "x.npy");
  const auto pos = bytes.find("<f4");
  ASSERT_NE(pos, std::string::npos);
  bytes.replace(pos, 3, "<u4");
  std::ofstream(in_ / "x.npy", std::ios::binary) << bytes;
  expect_error(sinkhorn({"--iters", "3"}), kInput, "dtype '<u4' not supported");
}

TEST_F(Cli, IntegerInputsAreRejectedNotReadAsFloats) {
  // int32 has float32's element size and int64 float64's: the bytes would
  // make a valid float array; the tool must refuse them by their dtype.
  const std::vector<std::int32_t> i32(18, 1);
  const std::vector<std::int64_t> i64(18, 1);
  const std::string expected = ": dtype int32, expected float32 or float64";
  kdnn::io::write_npy<std::int32_t>((in_ / "x.npy").string(), {2, 3, 3}, i32.data());
  expect_error(sinkhorn({"--iters", "3"}), kInput, "x.npy" + expected);
  kdnn::io::write_npy<std::int64_t>((in_ / "x.npy").string(), {2, 3, 3}, i64.data());
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               "x.npy: dtype int64, expected float32 or float64");
  // A float x.npy with an integer g.npy, forward only and with a backward.
  write("x.npy", DType::f32, {2, 3, 3}, uniform(18, 0, 1, 1));
  kdnn::io::write_npy<std::int32_t>((in_ / "g.npy").string(), {2, 3, 3}, i32.data());
  expect_error(sinkhorn({"--iters", "3"}), kInput, "g.npy" + expected);
  expect_error(sinkhorn({"--iters", "3", "--method", "unrolled"}), kInput, "g.npy" + expected);
  // An earlier output in --out stays as it was.
  std::ofstream(out_ / "r.npy") << "earlier";
  expect_error(sinkhorn({"--iters", "3"}), kInput, "g.npy" + expected, {"r.npy"});
  EXPECT_EQ(read_text(out_ / "r.npy"), "earlier");
}

TEST_F(Cli, MalformedNpy) {
  write("x.npy", DType::f64, {2, 3, 3}, uniform(18, 0, 1, 1));
  std::ofstream(in_ / "g.npy") << "not an array\nsecond line\n";
  expect_error(sinkhorn({"--iters", "3"}), kInput, "not a .npy file");
}

TEST_F(Cli, FailedOutputLeavesOutAsItWas) {
  write_problem(DType::f64, 2, 3, true);
  // An r.npy from an earlier run, and a directory where dx.npy must go: both
  // outputs are written to temporaries, then neither may replace anything.
  std::ofstream(out_ / "r.npy") << "earlier";
  fs::create_directories(out_ / "dx.npy" / "keep");
  expect_error(sinkhorn({"--iters", "3"}), kInput, "dx.npy", {"r.npy", "dx.npy"});
  EXPECT_EQ(read_text(out_ / "r.npy"), "earlier");
}

TEST_F(Cli, TemporariesHaveUniqueNames) {
  write_problem(DType::f64, 2, 3, true);
  // Files under the names a fixed temporary would have are no obstacle.
  fs::create_directories(out_ / "r.npy.tmp");
  fs::create_directories(out_ / "dx.npy.tmp");
  const Result r = run(sinkhorn({"--iters", "3"}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(files(out_), (std::set<std::string>{"r.npy", "dx.npy", "r.npy.tmp", "dx.npy.tmp"}));
}

// ---- concurrent runs ---------------------------------------------------------

TEST_F(Cli, ConcurrentRunsIntoOneOutLeaveOneRunsFiles) {
  // Two problems; each run alone gives the reference outputs.
  const std::size_t batch = 64, n = 8;
  const fs::path in[2] = {in_, root_ / "in2"};
  fs::create_directories(in[1]);
  for (int k = 0; k < 2; ++k) {
    const auto x = uniform(batch * n * n, 0.0, 4.0, 10 + k);
    const auto g = uniform(batch * n * n, -1.0, 1.0, 20 + k);
    kdnn::io::write_npy((in[k] / "x.npy").string(), {batch, n, n}, x.data());
    kdnn::io::write_npy((in[k] / "g.npy").string(), {batch, n, n}, g.data());
  }
  const auto args = [&](int k, const fs::path& out) {
    return Strings{"sinkhorn", "--in", in[k].string(), "--out", out.string(), "--iters", "50"};
  };
  std::string expected[2][2];  // [run][r.npy, dx.npy], the files' bytes
  const char* names[2] = {"r.npy", "dx.npy"};
  for (int k = 0; k < 2; ++k) {
    const fs::path out = root_ / ("alone" + std::to_string(k));
    fs::create_directories(out);
    ASSERT_EQ(run(args(k, out)).status, 0);
    for (int f = 0; f < 2; ++f) expected[k][f] = read_text(out / names[f]);
    ASSERT_NE(expected[k][0], "");
  }
  ASSERT_NE(expected[0][0], expected[1][0]);

  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::string cmd;
    for (int k = 0; k < 2; ++k) {
      const fs::path status = root_ / ("status" + std::to_string(k));
      cmd += "(" + command(args(k, out_)) + " >/dev/null 2>&1; echo $? >" + quote(status.string()) +
             ") & ";
    }
    ASSERT_EQ(std::system((cmd + "wait").c_str()), 0);
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(read_text(root_ / ("status" + std::to_string(k))), "0\n") << "run " << k;
    }
    EXPECT_EQ(files(out_), (std::set<std::string>{"r.npy", "dx.npy"}));
    for (int f = 0; f < 2; ++f) {
      const std::string bytes = read_text(out_ / names[f]);
      EXPECT_TRUE(bytes == expected[0][f] || bytes == expected[1][f]) << names[f];
      read(out_ / names[f], DType::f64, {batch, n, n});  // a valid .npy file
    }
  }
}

// ---- inputs that are not regular files ---------------------------------------

TEST_F(Cli, FifoInputIsAnErrorNotAHang) {
  ASSERT_EQ(::mkfifo((in_ / "x.npy").c_str(), 0600), 0);
  // Under `timeout`, so that a regression fails (status 124) instead of hanging.
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               (in_ / "x.npy").string() + ": not a regular file (a FIFO)", {}, "timeout 20");
}

TEST_F(Cli, DanglingSymbolicLinkIsAnErrorNotAnAbsentInput) {
  write_problem(DType::f64, 2, 3, false);
  fs::create_symlink(in_ / "missing.npy", in_ / "g.npy");
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               (in_ / "g.npy").string() + ": symbolic link to a missing file");
}

TEST_F(Cli, SymbolicLinkLoopIsNamedAsSuch) {
  fs::create_symlink("y.npy", in_ / "x.npy");
  fs::create_symlink("x.npy", in_ / "y.npy");
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               (in_ / "x.npy").string() + ": cannot open file: " + std::strerror(ELOOP));
}

TEST_F(Cli, DirectoryInputIsAnError) {
  write_problem(DType::f64, 2, 3, false);
  fs::create_directories(in_ / "g.npy" / "keep");
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               (in_ / "g.npy").string() + ": not a regular file (a directory)");
}

TEST_F(Cli, UnreadableInputIsAnError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any file";
  write_problem(DType::f64, 2, 3, true);
  fs::permissions(in_ / "g.npy", fs::perms::none);
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               (in_ / "g.npy").string() + ": cannot open file: " + std::strerror(EACCES));
}

TEST_F(Cli, SymbolicLinksToRegularFilesAreRead) {
  const std::size_t batch = 2, n = 3;
  const fs::path data = root_ / "data";
  fs::create_directories(data);
  write_problem(DType::f64, batch, n, true);
  for (const char* name : {"x.npy", "g.npy"}) {
    fs::rename(in_ / name, data / name);
    fs::create_symlink(data / name, in_ / name);
  }
  const Result r = run(sinkhorn({"--iters", "5"}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(files(out_), (std::set<std::string>{"r.npy", "dx.npy"}));
  const auto rr = read(out_ / "r.npy", DType::f64, {batch, n, n});
  EXPECT_LT(rel_error(matrix(rr, 0, n), kdnn_test::ref_forward(matrix(x_, 0, n), n, 5)), 1e-13);
}

// ---- bytes from files in messages ----------------------------------------------

TEST_F(Cli, HeaderBytesAreEscapedOnStderr) {
  write("x.npy", DType::f64, {2, 3, 3}, uniform(18, 0, 1, 1));
  std::string bytes = read_text(in_ / "x.npy");
  const auto pos = bytes.find("'<f8'");
  ASSERT_NE(pos, std::string::npos);
  // A dtype with a terminal escape sequence, a NUL and a newline; as many
  // padding spaces removed, so that the header keeps its length.
  const std::string descr("'\x1b[31m\0\n'", 9);
  bytes.replace(pos, 5, descr);
  bytes.erase(bytes.find("} ") + 1, descr.size() - 5);
  std::ofstream(in_ / "x.npy", std::ios::binary) << bytes;
  // One line on stderr (checked by expect_error), with the bytes escaped.
  expect_error(sinkhorn({"--iters", "3"}), kInput, "dtype '\\x1b[31m\\x00\\x0a' not supported");
  const Result r = run(sinkhorn({"--iters", "3"}));
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
}

}  // namespace
