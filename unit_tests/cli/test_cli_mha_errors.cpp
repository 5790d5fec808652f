// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// `kdnn mha`'s error paths, each with its exit status, one "kdnn: error:"
// line and nothing in --out: shapes checked against each other, buffers too
// large to count, mask files, packed sequences (checked after their
// results), non-finite inputs named by their position, missing inputs, one
// float dtype, heads that do not divide the projections, usage errors.
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "allclose.hpp"
#include "cli_fixture.hpp"
#include "cli_mha.hpp"
#include "kdnn/io/npy.hpp"
#include "mha_reference.hpp"

namespace {

using namespace kdnn_test;
using kdnn::io::DType;

// ---- errors ----------------------------------------------------------------

TEST_F(CliMha, ShapesAreCheckedAgainstEachOther) {
  const MhaCase c{};  // B=2 S=3 Sk=4 E_q=5 E_k=4 E_v=3 H*D=6 H*Dv=4 E_o=4
  struct Case {
    const char* file;
    Shape shape;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"q.npy", {2, 3}, "q.npy: shape (2, 3), expected 3 axes [batch, S, E_q]"},
      {"k.npy", {3, 4, 4}, "k.npy: shape (3, 4, 4), expected batch 2 (from q.npy) at axis 0"},
      {"v.npy", {2, 5, 3}, "v.npy: shape (2, 5, 3), expected Sk 4 (from k.npy) at axis 1"},
      {"q.npy", {2, 3, 6}, "w_q.npy: shape (6, 5), expected E_q 6 (from q.npy) at axis 1"},
      {"w_k.npy", {6, 5}, "w_k.npy: shape (6, 5), expected E_k 4 (from k.npy) at axis 1"},
      {"w_k.npy", {4, 4}, "w_k.npy: shape (4, 4), expected H*D 6 (from w_q.npy) at axis 0"},
      {"w_v.npy", {4, 4}, "w_v.npy: shape (4, 4), expected E_v 3 (from v.npy) at axis 1"},
      {"w_o.npy", {4, 6}, "w_o.npy: shape (4, 6), expected H*Dv 4 (from w_v.npy) at axis 1"},
      {"b_q.npy", {4}, "b_q.npy: shape (4,), expected H*D 6 (from w_q.npy) at axis 0"},
      {"b_v.npy", {1, 4}, "b_v.npy: shape (1, 4), expected 1 axis [H*Dv]"},
      {"b_o.npy", {5}, "b_o.npy: shape (5,), expected E_o 4 (from w_o.npy) at axis 0"},
      {"residual.npy",
       {2, 3, 5},
       "residual.npy: shape (2, 3, 5), expected E_o 4 (from w_o.npy) at axis 2"},
      {"do.npy", {2, 4, 4}, "do.npy: shape (2, 4, 4), expected S 3 (from q.npy) at axis 1"},
      {"q.npy",
       {std::size_t(1) << 31, 0, 5},
       "q.npy: shape (2147483648, 0, 5), expected batch at most 2147483647 at axis 0"},
  };
  for (const Case& e : cases) {
    SCOPED_TRACE(e.file);
    fs::remove_all(in_);
    fs::create_directories(in_);
    write_case(c, MhaData::random(c, 20), DType::f32, true);
    std::size_t n = 1;
    for (std::size_t x : e.shape) n *= x;
    write(e.file, DType::f32, e.shape, std::vector<double>(n, 0.5));
    expect_error(mha(c), kInput, e.message);
  }
}

TEST_F(CliMha, BuffersTooLargeToCountFailBeforeAnythingIsAllocated) {
  // Empty files (E = 0) whose B, S and Sk would make 2^90 attention scores.
  const std::size_t n = std::size_t(1) << 30;
  for (const char* name : {"q.npy", "k.npy", "v.npy"}) write(name, DType::f64, {n, n, 0}, {});
  for (const char* name : {"w_q.npy", "w_k.npy", "w_v.npy"}) write(name, DType::f64, {1, 0}, {});
  write("w_o.npy", DType::f64, {1, 1}, {0.5});
  expect_error({"mha", "--in", in_.string(), "--out", out_.string(), "--heads", "1"}, kInput,
               "the layer's buffers for B=1073741824 S=1073741824 Sk=1073741824 H=1 would "
               "exceed 2^63 bytes");
}

TEST_F(CliMha, MaskFilesAreCheckedByShapeThenByTheLayer) {
  const MhaCase c{};  // B=2 S=3 Sk=4
  write_case(c, MhaData::random(c, 21), DType::f64, true);
  struct Case {
    const char* file;
    DType dtype;
    std::vector<long long> values;
    std::string message;
  };
  const std::string layer = "kdnn: error: attention::mha_forward: ";
  const std::vector<Case> cases = {
      {"lo_win.npy",
       DType::i32,
       {0, 1, 2, 3},
       "lo_win.npy: shape (4,), expected S 3 (from q.npy) at axis 0"},
      {"seq_q.npy", DType::i64, {1}, "seq_q.npy: shape (1,), expected batch 2 (from q.npy)"},
      {"seq_q.npy",
       DType::i32,
       {3, 4},
       layer + "mask.seq_q[1]=4, expected a value in [0, 3] (query length, S)"},
      {"seq_k.npy",
       DType::i64,
       {5, 4},
       layer + "mask.seq_k[0]=5, expected a value in [0, 4] (key length, Sk)"},
      {"hi_win.npy",
       DType::i32,
       {4, -1, 4},
       layer + "mask.hi_win[1]=-1, expected a value in [0, 4]"},
      {"seq_k.npy",
       DType::i64,
       {2, 4294967296LL},
       "seq_k.npy: value 4294967296 at flat index 1 is outside the range of int"},
  };
  for (const Case& e : cases) {
    SCOPED_TRACE(e.message);
    write_ints(e.file, e.dtype, e.values);
    expect_error(mha(c), kInput, e.message);
    fs::remove(in_ / e.file);
  }
  // lo > hi, each valid on its own.
  write_ints("lo_win.npy", DType::i32, {0, 3, 1});
  write_ints("hi_win.npy", DType::i32, {4, 2, 4});
  expect_error(mha(c), kInput, layer + "mask.lo_win[1]=3 > mask.hi_win[1]=2, expected lo <= hi");
  // A float mask file.
  fs::remove(in_ / "hi_win.npy");
  write("lo_win.npy", DType::f32, {3}, {0, 1, 2});
  expect_error(mha(c), kInput, "lo_win.npy: dtype float32, expected int32 or int64");
}

// Packed sequences (cu_seqlens_q.npy, cu_seqlens_k.npy; int64 and int32):
// o.npy and the row gradients are each sequence's layer alone,
// concatenated, the weight gradients their sums; a query sees only its own
// sequence's keys (the sequence without queries only adds keys).
TEST_F(CliMha, PackedSequencesAreEachSequencesLayer) {
  const std::vector<int> len_q{2, 0, 3}, len_k{3, 2, 3};
  MhaCase c;
  c.B = 1, c.S = 5, c.Sk = 8, c.causal = true, c.residual = true;
  const MhaData d = MhaData::random(c, 23);
  write_case(c, d, DType::f64, true);
  write_ints("cu_seqlens_q.npy", DType::i64, {0, 2, 2, 5});
  write_ints("cu_seqlens_k.npy", DType::i32, {0, 3, 5, 8});
  const Result r = run(mha(c));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(" mask=cu_seqlens_q,cu_seqlens_k "), std::string::npos) << r.out;
  // Rows [from, from + count) of a [1, rows, width] tensor.
  const auto rows = [](const std::vector<double>& x, int from, int count, int width) {
    return std::vector<double>(x.begin() + std::size_t(from) * width,
                               x.begin() + std::size_t(from + count) * width);
  };
  std::vector<double> o_want;
  std::vector<std::vector<double>> grad_want(gradients(c).size());
  for (std::size_t n = 0, i = 0, j = 0; n < len_q.size(); i += len_q[n], j += len_k[n], ++n) {
    MhaCase one = c;
    one.S = len_q[n], one.Sk = len_k[n];
    MhaData part = d;
    part.q = rows(d.q, int(i), len_q[n], c.Eq);
    part.residual = rows(d.residual, int(i), len_q[n], c.Eo);
    part.dout = rows(d.dout, int(i), len_q[n], c.Eo);
    part.k = rows(d.k, int(j), len_k[n], c.Ek);
    part.v = rows(d.v, int(j), len_k[n], c.Ev);
    const auto o = reference_mha_forward(one, part);
    o_want.insert(o_want.end(), o.begin(), o.end());
    const auto grads = gradients(c);
    for (std::size_t g = 0; g < grads.size(); ++g) {
      const auto each = reference_gradient(one, part, grads[g].of);
      const bool row_wise = grads[g].of == &MhaData::q || grads[g].of == &MhaData::k ||
                            grads[g].of == &MhaData::v || grads[g].of == &MhaData::residual;
      if (row_wise) {
        grad_want[g].insert(grad_want[g].end(), each.begin(), each.end());
      } else {
        grad_want[g].resize(each.size(), 0.0);
        for (std::size_t e = 0; e < each.size(); ++e) grad_want[g][e] += each[e];
      }
    }
  }
  EXPECT_ALLCLOSE(read(out_ / "o.npy", DType::f64, dims(c.B, c.S, c.Eo)), o_want, 1e-6, 1e-8);
  const auto grads = gradients(c);
  for (std::size_t g = 0; g < grads.size(); ++g) {
    EXPECT_ALLCLOSE(read(out_ / grads[g].file, DType::f64, grads[g].shape), grad_want[g], 1e-6,
                    1e-8)
        << grads[g].file;
  }
  // One file without the other, files that disagree, offsets the layer
  // refuses (each an error that writes nothing: --out emptied first).
  fs::remove_all(out_);
  fs::create_directories(out_);
  fs::remove(in_ / "cu_seqlens_k.npy");
  expect_error(mha(c), kInput,
               "cu_seqlens_q.npy is given without cu_seqlens_k.npy, expected both (packed "
               "sequences) or neither");
  write_ints("cu_seqlens_k.npy", DType::i32, {0, 8});
  expect_error(mha(c), kInput,
               "cu_seqlens_k.npy: shape (2,), expected N+1 4 (from cu_seqlens_q.npy)");
  write_ints("cu_seqlens_k.npy", DType::i32, {0, 3, 5, 7});
  expect_error(mha(c), kInput,
               "kdnn: error: attention::mha_forward: seqs.cu_seqlens_k[3]=7, expected 8");
}

TEST_F(CliMha, NonFiniteInputsAreRejectedWithTheirPosition) {
  const MhaCase c{};
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    const char* file;
    std::vector<double> MhaData::*data;
    Shape shape;
    std::size_t at;
    double value;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"k.npy", &MhaData::k, dims(c.B, c.Sk, c.Ek), (1 * 4 + 2) * 4 + 0, std::nan(""),
       "k.npy: NaN at [1, 2, 0] (expected finite values)"},
      {"w_o.npy", &MhaData::wo, dims(c.Eo, 4), 3 * 4 + 1, inf, "w_o.npy: +inf at [3, 1]"},
      {"b_k.npy", &MhaData::bk, {6}, 5, -inf, "b_k.npy: -inf at [5]"},
      {"do.npy", &MhaData::dout, dims(c.B, c.S, c.Eo), 7, std::nan(""), "do.npy: NaN at [0, 1, 3]"},
  };
  for (const DType dtype : {DType::f32, DType::f64}) {
    for (const Case& e : cases) {
      SCOPED_TRACE(e.message);
      MhaData d = MhaData::random(c, 22);
      write_case(c, d, dtype, true);
      (d.*e.data)[e.at] = e.value;
      write(e.file, dtype, e.shape, d.*e.data);
      expect_error(mha(c), kInput, e.message);
    }
  }
}

TEST_F(CliMha, MissingInputs) {
  const MhaCase c{};
  write_case(c, MhaData::random(c, 23), DType::f32, true);
  fs::remove(in_ / "w_o.npy");
  expect_error(mha(c), kInput, "missing input " + (in_ / "w_o.npy").string());
  fs::remove(in_ / "q.npy");
  expect_error(mha(c), kInput, "missing input " + (in_ / "q.npy").string());
}

TEST_F(CliMha, FloatFilesShareOneDtype) {
  const MhaCase c{};
  const MhaData d = MhaData::random(c, 24);
  write_case(c, d, DType::f32, true);
  write("v.npy", DType::f64, dims(c.B, c.Sk, c.Ev), d.v);
  expect_error(mha(c), kInput,
               "v.npy: dtype float64, expected float32 (from q.npy; the float files share one "
               "dtype)");
  write_case(c, d, DType::f64, true);
  write("do.npy", DType::f32, dims(c.B, c.S, c.Eo), d.dout);
  expect_error(mha(c), kInput, "do.npy: dtype float32, expected float64 (from q.npy;");
  write_case(c, d, DType::f64, true);
  write_ints("b_o.npy", DType::i64, {1, 2, 3, 4});
  expect_error(mha(c), kInput, "b_o.npy: dtype int64, expected float32 or float64");
}

TEST_F(CliMha, HeadsMustDivideTheProjections) {
  MhaCase c;  // H*D = 6, H*Dv = 4
  write_case(c, MhaData::random(c, 25), DType::f32, true);
  c.H = 4;
  expect_error(mha(c), kInput,
               "w_q.npy: shape (6, 5), expected H*D, a positive multiple of --heads 4 at axis 0");
  c.H = 3;
  expect_error(mha(c), kInput,
               "w_v.npy: shape (4, 3), expected H*Dv, a positive multiple of --heads 3 at axis 0");
}

TEST_F(CliMha, UsageErrors) {
  const MhaCase c{};
  write_case(c, MhaData::random(c, 26), DType::f32, true);
  const std::string in = in_.string(), out = out_.string();
  struct Case {
    Strings args;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {{"mha", "--in", in, "--out", out}, "--heads is required"},
      {{"mha", "--in", in, "--heads", "2"}, "--out is required"},
      {mha(c, {"--dropout", "1", "--seed", "3"}),
       "--dropout: expected a finite number >= 0 and < 1, got '1'"},
      {mha(c, {"--dropout", "-0.1", "--seed", "3"}), "--dropout: expected a finite number >= 0"},
      {mha(c, {"--dropout", "nan", "--seed", "3"}), "--dropout: expected a finite number >= 0"},
      {mha(c, {"--dropout", "0.5"}), "--dropout needs --seed N"},
      {mha(c, {"--seed", "3"}), "--seed needs --dropout P"},
      {mha(c, {"--dropout", "0.5", "--seed", "-1"}),
       "--seed: expected an integer >= 0 (at most 18446744073709551615), got '-1'"},
      {mha(c, {"--dropout", "0.5", "--seed", "18446744073709551616"}),
       "--seed: expected an integer >= 0"},
      {mha(c, {"--scale", "inf"}), "--scale: expected a finite number, got 'inf'"},
      {mha(c, {"--scale", "1e39"}),  // finite as a double, +inf in the files' float32
       "--scale: 1e+39 is not finite in float32 (expected |scale| <= 3.40282e+38)"},
      {mha(c, {"--scale", "-3.5e38"}), "--scale: -3.5e+38 is not finite in float32"},
      {{"mha", "--in", in, "--out", out, "--heads", "0"}, "--heads: expected an integer >= 1"},
      {mha(c, {"--iters", "3"}), "unknown option '--iters'"},
      {mha(c, {"--attention", "flash"}), "--attention: flash not in {fused,unfused}"},
      {mha(c, {"--attention", "Fused"}), "--attention: Fused not in {fused,unfused}"},
      {mha(c, {"--attention"}), "--attention"},
  };
  for (const Case& e : cases) expect_error(e.args, kUsage, e.fragment);
  // The largest seed and a dropout of 0 are fine.
  const Result r = run(mha(c, {"--dropout", "0", "--seed", "18446744073709551615"}));
  EXPECT_EQ(r.status, 0) << r.err;
}

}  // namespace
