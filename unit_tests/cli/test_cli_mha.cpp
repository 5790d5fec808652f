// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// `kdnn mha`, run as a subprocess on .npy fixtures: o.npy against the
// double-loop layer of unit_tests/attention/mha_reference.hpp and every
// gradient against its central differences, in float32 and float64, with
// biases, residual, causal mask, windows, lengths (int32 and int64) and
// dropout; against the PyTorch golden data of the layer's own tests; and
// every error path (exit status, one "kdnn: error:" line, nothing in --out).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "allclose.hpp"
#include "cli_fixture.hpp"
#include "kdnn/io/npy.hpp"
#include "mha_reference.hpp"
#include "test_paths.hpp"

namespace {

using namespace kdnn_test;
using kdnn::io::DType;

/// One gradient file: its name, what it is the gradient of, its shape.
struct Gradient {
  std::string file;
  std::vector<double> MhaData::*of;
  Shape shape;
};

Shape dims(int a, int b, int c = -1) {
  return c < 0 ? Shape{std::size_t(a), std::size_t(b)}
               : Shape{std::size_t(a), std::size_t(b), std::size_t(c)};
}

/// The gradients the tool writes for the case given do.npy.
std::vector<Gradient> gradients(const MhaCase& c) {
  std::vector<Gradient> g = {{"dq.npy", &MhaData::q, dims(c.B, c.S, c.Eq)},
                             {"dk.npy", &MhaData::k, dims(c.B, c.Sk, c.Ek)},
                             {"dv.npy", &MhaData::v, dims(c.B, c.Sk, c.Ev)},
                             {"dw_q.npy", &MhaData::wq, dims(c.H * c.D, c.Eq)},
                             {"dw_k.npy", &MhaData::wk, dims(c.H * c.D, c.Ek)},
                             {"dw_v.npy", &MhaData::wv, dims(c.H * c.Dv, c.Ev)},
                             {"dw_o.npy", &MhaData::wo, dims(c.Eo, c.H * c.Dv)}};
  if (c.bias_q) g.push_back({"db_q.npy", &MhaData::bq, {std::size_t(c.H * c.D)}});
  if (c.bias_k) g.push_back({"db_k.npy", &MhaData::bk, {std::size_t(c.H * c.D)}});
  if (c.bias_v) g.push_back({"db_v.npy", &MhaData::bv, {std::size_t(c.H * c.Dv)}});
  if (c.bias_o) g.push_back({"db_o.npy", &MhaData::bo, {std::size_t(c.Eo)}});
  if (c.residual) g.push_back({"dresidual.npy", &MhaData::residual, dims(c.B, c.S, c.Eo)});
  return g;
}

/// The data as the tool sees it in float32: every value rounded.
MhaData rounded(MhaData d) {
  for (auto* x : {&d.q, &d.k, &d.v, &d.residual, &d.wq, &d.wk, &d.wv, &d.wo, &d.bq, &d.bk, &d.bv,
                  &d.bo, &d.dout}) {
    for (double& v : *x) v = double(float(v));
  }
  return d;
}

/// Every feature of the tool at once (mha_reference.hpp's case and a scale).
MhaCase everything() {
  MhaCase c = mha_case_with_everything();
  c.scaler = 0.45;
  return c;
}

class CliMha : public CliTest {
 protected:
  /// Writes an int32 or int64 vector to in_/name.
  void write_ints(const std::string& name, DType dtype, const std::vector<long long>& values,
                  const Shape& shape = {}) const {
    const std::string path = (in_ / name).string();
    const Shape s = shape.empty() ? Shape{values.size()} : shape;
    if (dtype == DType::i64) {
      const std::vector<std::int64_t> v(values.begin(), values.end());
      kdnn::io::write_npy<std::int64_t>(path, s, v.data());
    } else {
      const std::vector<std::int32_t> v(values.begin(), values.end());
      kdnn::io::write_npy<std::int32_t>(path, s, v.data());
    }
  }

  /// Writes the case's files: q k v and the weights, the biases and the
  /// residual it has, its mask in `int_dtype`, and do.npy when `with_do`.
  void write_case(const MhaCase& c, const MhaData& d, DType dtype, bool with_do,
                  DType int_dtype = DType::i32) const {
    write("q.npy", dtype, dims(c.B, c.S, c.Eq), d.q);
    write("k.npy", dtype, dims(c.B, c.Sk, c.Ek), d.k);
    write("v.npy", dtype, dims(c.B, c.Sk, c.Ev), d.v);
    write("w_q.npy", dtype, dims(c.H * c.D, c.Eq), d.wq);
    write("w_k.npy", dtype, dims(c.H * c.D, c.Ek), d.wk);
    write("w_v.npy", dtype, dims(c.H * c.Dv, c.Ev), d.wv);
    write("w_o.npy", dtype, dims(c.Eo, c.H * c.Dv), d.wo);
    if (c.bias_q) write("b_q.npy", dtype, {std::size_t(c.H * c.D)}, d.bq);
    if (c.bias_k) write("b_k.npy", dtype, {std::size_t(c.H * c.D)}, d.bk);
    if (c.bias_v) write("b_v.npy", dtype, {std::size_t(c.H * c.Dv)}, d.bv);
    if (c.bias_o) write("b_o.npy", dtype, {std::size_t(c.Eo)}, d.bo);
    if (c.residual) write("residual.npy", dtype, dims(c.B, c.S, c.Eo), d.residual);
    if (with_do) write("do.npy", dtype, dims(c.B, c.S, c.Eo), d.dout);
    const auto ints = [&](const char* name, const std::vector<int>& v) {
      if (!v.empty()) write_ints(name, int_dtype, {v.begin(), v.end()});
    };
    ints("lo_win.npy", c.lo);
    ints("hi_win.npy", c.hi);
    ints("seq_q.npy", c.seq_q);
    ints("seq_k.npy", c.seq_k);
  }

  /// "mha --in IN --out OUT --heads H" with the case's options, then `extra`.
  Strings mha(const MhaCase& c, const Strings& extra = {}, const fs::path& out = {}) const {
    Strings args{"mha",
                 "--in",
                 in_.string(),
                 "--out",
                 (out.empty() ? out_ : out).string(),
                 "--heads",
                 std::to_string(c.H)};
    if (c.causal) args.push_back("--causal");
    if (c.scaler) args.insert(args.end(), {"--scale", std::to_string(*c.scaler)});
    if (c.p > 0) {
      args.insert(args.end(), {"--dropout", std::to_string(c.p), "--seed", std::to_string(c.seed)});
    }
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  /// Runs the case (written with do.npy when `with_do`) into `out` and checks
  /// the files written, o.npy and every gradient against the reference on
  /// `d` (the data as the tool read it).
  void expect_layer(const MhaCase& c, const MhaData& d, DType dtype, bool with_do,
                    const fs::path& out, double rtol, double atol) const {
    const Result r = run(mha(c, {}, out));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err, "");
    std::set<std::string> expected_files{"o.npy"};
    if (with_do) {
      for (const Gradient& g : gradients(c)) expected_files.insert(g.file);
    }
    EXPECT_EQ(files(out), expected_files);
    const auto o = read(out / "o.npy", dtype, dims(c.B, c.S, c.Eo));
    EXPECT_ALLCLOSE(o, reference_mha_forward(c, d), rtol, atol) << "o.npy";
    if (!with_do) return;
    for (const Gradient& g : gradients(c)) {
      EXPECT_ALLCLOSE(read(out / g.file, dtype, g.shape), reference_gradient(c, d, g.of), rtol,
                      atol)
          << g.file;
    }
  }
};

// ---- help ----------------------------------------------------------------

TEST_F(CliMha, Help) {
  const Result top = run({"--help"});
  EXPECT_EQ(top.status, 0);
  EXPECT_NE(top.out.find("\n  mha         multi-head attention layer"), std::string::npos)
      << top.out;
  for (const Strings& args : {Strings{"mha", "--help"}, Strings{"mha", "-h"},
                              Strings{"mha", "--in", in_.string(), "--heads", "2", "--help"}}) {
    const Result r = run(args);
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.err, "");
    for (const char* word :
         {"usage: kdnn mha --in DIR --out DIR --heads H [--causal] [--scale S]",
          "[--dropout P --seed N] [--attention fused|unfused]", "q.npy [B, S, E_q]",
          "w_o.npy [E_o, H*Dv]", "b_o.npy [E_o]", "residual.npy [B, S, E_o]", "do.npy [B, S, E_o]",
          "lo_win.npy, hi_win.npy [S]", "seq_q.npy [B]", "seq_k.npy [B]", "int32 or int64",
          "dresidual.npy when residual.npy", "db_q.npy", "needs --seed",
          "an error without --dropout", "fused (default;", "or unfused (batched"}) {
      EXPECT_NE(r.out.find(word), std::string::npos) << word;
    }
  }
  EXPECT_TRUE(files(out_).empty());
}

// ---- results -------------------------------------------------------------

TEST_F(CliMha, ForwardOnlyMatchesReference) {
  const MhaCase c{};  // S != Sk, E_o != E_q, D != Dv, every bias
  const MhaData d = MhaData::random(c, 11);
  write_case(c, d, DType::f32, false);
  const Result r = run(mha(c));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out,
            "mha: B=2 S=3 Sk=4 E_q=5 E_k=4 E_v=3 H=2 D=3 Dv=2 E_o=4 dtype=float32 causal=no "
            "scale=0.5773502691896258 dropout=0 attention=fused mask=none wrote=o.npy\n");
  expect_layer(c, rounded(d), DType::f32, false, out_, 1e-4, 1e-5);
}

TEST_F(CliMha, BackwardWithEveryBiasAndResidual) {
  MhaCase c;
  c.residual = true;
  const MhaData d = MhaData::random(c, 12);
  write_case(c, d, DType::f32, true);
  expect_layer(c, rounded(d), DType::f32, true, out_, 1e-4, 1e-5);
  const Result r = run(mha(c));
  EXPECT_NE(r.out.find(" wrote=o.npy,dq.npy,dk.npy,dv.npy,dw_q.npy,dw_k.npy,dw_v.npy,dw_o.npy,"
                       "db_q.npy,db_k.npy,db_v.npy,db_o.npy,dresidual.npy\n"),
            std::string::npos)
      << r.out;
}

TEST_F(CliMha, BackwardWithoutBiasesWritesNoBiasGradients) {
  MhaCase c;
  c.bias_q = c.bias_k = c.bias_v = c.bias_o = false;
  c.H = 1, c.D = 4, c.Dv = 5;
  const MhaData d = MhaData::random(c, 13);
  write_case(c, d, DType::f32, true);
  expect_layer(c, rounded(d), DType::f32, true, out_, 1e-4, 1e-5);
}

TEST_F(CliMha, CausalWindowsAndInt64Lengths) {
  MhaCase c = everything();
  c.p = 0;  // dropout: DropoutDependsOnTheSeedOnly
  c.residual = false;
  const MhaData d = MhaData::random(c, 14);
  write_case(c, d, DType::f32, true, DType::i64);
  expect_layer(c, rounded(d), DType::f32, true, out_, 1e-4, 1e-5);
  const Result r = run(mha(c));
  EXPECT_NE(r.out.find(" causal=yes scale=0.45 dropout=0 attention=fused "
                       "mask=lo_win,hi_win,seq_q,seq_k "),
            std::string::npos)
      << r.out;
  // The padded query (entry 1, i >= 3) has zero rows in o.npy and dq.npy.
  const auto o = read(out_ / "o.npy", DType::f32, dims(c.B, c.S, c.Eo));
  const auto dq = read(out_ / "dq.npy", DType::f32, dims(c.B, c.S, c.Eq));
  for (int i = 3; i < c.S; ++i) {
    for (int e = 0; e < c.Eo; ++e) EXPECT_EQ(o[(1 * c.S + i) * c.Eo + e], 0.0);
    for (int e = 0; e < c.Eq; ++e) EXPECT_EQ(dq[(1 * c.S + i) * c.Eq + e], 0.0);
  }
}

TEST_F(CliMha, DropoutDependsOnTheSeedOnly) {
  MhaCase c;
  c.p = 0.3, c.seed = 1234;
  const MhaData d = MhaData::random(c, 15);
  write_case(c, d, DType::f64, true);
  const fs::path a = root_ / "a", b = root_ / "b", other = root_ / "other";
  for (const fs::path& dir : {a, b, other}) fs::create_directories(dir);
  expect_layer(c, d, DType::f64, true, a, 1e-6, 1e-8);
  expect_layer(c, d, DType::f64, true, b, 1e-6, 1e-8);
  for (const Gradient& g : gradients(c)) {
    EXPECT_EQ(read_text(a / g.file), read_text(b / g.file)) << g.file;
  }
  EXPECT_EQ(read_text(a / "o.npy"), read_text(b / "o.npy"));
  c.seed = 1235;
  expect_layer(c, d, DType::f64, true, other, 1e-6, 1e-8);
  EXPECT_NE(read(a / "o.npy", DType::f64, dims(c.B, c.S, c.Eo)),
            read(other / "o.npy", DType::f64, dims(c.B, c.S, c.Eo)));
  const Result r = run(mha(c));
  EXPECT_NE(r.out.find(" dropout=0.3 seed=1235 "), std::string::npos) << r.out;
}

// The summary prints the scale and dropout in their shortest form that
// reads back as the same double: a dropout just under 1 is not "1".
TEST_F(CliMha, SummaryPrintsTheOptionsAsGiven) {
  MhaCase c{};
  write_case(c, MhaData::random(c, 15), DType::f64, false);
  struct Case {
    Strings extra;
    std::string fragment;
  };
  for (const Case& e : std::vector<Case>{
           {{"--dropout", "0.9999999999999999", "--seed", "1"}, " dropout=0.9999999999999999 "},
           {{"--dropout", "0.3", "--seed", "1"}, " dropout=0.3 "},
           {{"--scale", "0.30000000000000004"}, " scale=0.30000000000000004 "},
           {{"--scale", "1.0000001"}, " scale=1.0000001 "},
           {{"--scale", "-1e300"}, " scale=-1e+300 "}}) {
    const Result r = run(mha(c, e.extra));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find(e.fragment), std::string::npos) << r.out;
  }
}

TEST_F(CliMha, Float64InFloat64Out) {
  const MhaCase c = everything();  // and dropout, residual, lengths as int32
  const MhaData d = MhaData::random(c, 16);
  write_case(c, d, DType::f64, true);
  expect_layer(c, d, DType::f64, true, out_, 1e-6, 1e-8);
  const auto o = read(out_ / "o.npy", DType::f64, dims(c.B, c.S, c.Eo));
  EXPECT_LT(rel_error(o, reference_mha_forward(c, d)), 1e-12);
}

TEST_F(CliMha, EmptyBatch) {
  MhaCase c;
  c.B = 0;
  c.residual = true;
  write_case(c, MhaData::random(c, 17), DType::f64, true);
  const Result r = run(mha(c));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(read(out_ / "o.npy", DType::f64, dims(0, c.S, c.Eo)).empty());
  for (const Gradient& g : gradients(c)) {
    const auto x = read(out_ / g.file, DType::f64, g.shape);
    for (double v : x) EXPECT_EQ(v, 0.0) << g.file;  // weight gradients: no rows, zero
  }
}

// The fused (default) and the unfused attention give the same files, within
// float32 rounding, with every feature on (dropout: the same mask).
TEST_F(CliMha, BothAttentionAlgorithmsGiveTheSameResults) {
  const MhaCase c = everything();
  const MhaData d = MhaData::random(c, 18);
  write_case(c, d, DType::f32, true);
  const fs::path fused = root_ / "fused", unfused = root_ / "unfused", plain = root_ / "default";
  for (const fs::path& dir : {fused, unfused, plain}) fs::create_directories(dir);
  const Result a = run(mha(c, {"--attention", "fused"}, fused));
  const Result b = run(mha(c, {"--attention=unfused"}, unfused));
  const Result r = run(mha(c, {}, plain));
  for (const Result* x : {&a, &b, &r}) {
    ASSERT_EQ(x->status, 0) << x->err;
    EXPECT_EQ(x->err, "");
  }
  EXPECT_NE(a.out.find(" attention=fused "), std::string::npos) << a.out;
  EXPECT_NE(b.out.find(" attention=unfused "), std::string::npos) << b.out;
  EXPECT_NE(r.out.find(" attention=fused "), std::string::npos) << r.out;
  EXPECT_EQ(files(fused), files(unfused));
  std::vector<Gradient> outputs = gradients(c);
  outputs.push_back({"o.npy", nullptr, dims(c.B, c.S, c.Eo)});
  EXPECT_EQ(files(fused).size(), outputs.size());
  for (const Gradient& g : outputs) {
    SCOPED_TRACE(g.file);
    EXPECT_EQ(read_text(plain / g.file), read_text(fused / g.file));  // fused is the default
    const auto x = read(fused / g.file, DType::f32, g.shape);
    const auto y = read(unfused / g.file, DType::f32, g.shape);
    if (g.file == "db_k.npy") {  // zero but for round-off: see test_mha_golden.cpp
      EXPECT_ALLCLOSE(x, y, 0.0, 1e-5);
    } else {
      EXPECT_ALLCLOSE(x, y, 1e-4, 1e-5);
      EXPECT_LT(rel_error(x, y), 1e-5);
    }
  }
}

// Scales so large that every softmax row is one-hot: the fused backward
// recomputes the forward's scores bitwise, so its gradients are the unfused
// path's (which are exact there) rather than NaN or off by orders of
// magnitude. Every feature but dropout, in float64 with do.npy.
TEST_F(CliMha, HugeScalesGiveTheUnfusedGradients) {
  MhaCase c = everything();
  c.p = 0, c.scaler.reset();
  const MhaData d = MhaData::random(c, 19);
  write_case(c, d, DType::f64, true);
  const fs::path fused = root_ / "fused", unfused = root_ / "unfused";
  for (const fs::path& dir : {fused, unfused}) fs::create_directories(dir);
  std::vector<Gradient> outputs = gradients(c);
  outputs.push_back({"o.npy", nullptr, dims(c.B, c.S, c.Eo)});
  for (const std::string scale : {"1e12", "1e15", "1e18", "-1e300"}) {
    SCOPED_TRACE("--scale " + scale);
    const Result a = run(mha(c, {"--scale", scale}, fused));
    const Result b = run(mha(c, {"--scale", scale, "--attention", "unfused"}, unfused));
    for (const Result* x : {&a, &b}) {
      ASSERT_EQ(x->status, 0) << x->err;
      EXPECT_EQ(x->err, "");
    }
    for (const Gradient& g : outputs) {
      SCOPED_TRACE(g.file);
      const auto x = read(fused / g.file, DType::f64, g.shape);
      const auto y = read(unfused / g.file, DType::f64, g.shape);
      for (const auto* values : {&x, &y}) {
        EXPECT_TRUE(
            std::all_of(values->begin(), values->end(), [](double z) { return std::isfinite(z); }));
      }
      EXPECT_ALLCLOSE(x, y, 1e-10, 1e-10);
    }
  }
}

// The largest scales the dtypes hold give finite files when the scores
// (scale·Q)·K^T stay in range (small q and k, no q/k biases); past that
// range the run is an error naming the first non-finite value, and --out
// keeps what it had.
TEST_F(CliMha, ScalesAtTheEdgeOfTheDtypeGiveFiniteResultsOrAnError) {
  MhaCase c = everything();
  c.bias_q = c.bias_k = false, c.scaler.reset();
  MhaData d = MhaData::random(c, 20);
  for (double& x : d.q) x *= 0.05;
  for (double& x : d.k) x *= 0.05;
  std::vector<Gradient> outputs = gradients(c);
  outputs.push_back({"o.npy", nullptr, dims(c.B, c.S, c.Eo)});
  const std::pair<DType, std::string> edges[] = {
      {DType::f32, "1e38"}, {DType::f32, "-1e38"}, {DType::f64, "-1e300"}, {DType::f64, "1e300"}};
  for (const auto& [dtype, scale] : edges) {
    SCOPED_TRACE("--scale " + scale);
    for (const auto& entry : fs::directory_iterator(in_)) fs::remove(entry.path());
    write_case(c, d, dtype, true);
    const Result r = run(mha(c, {"--scale", scale}));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err, "");
    for (const Gradient& g : outputs) {
      const auto x = read(out_ / g.file, dtype, g.shape);
      EXPECT_TRUE(std::all_of(x.begin(), x.end(), [](double z) { return std::isfinite(z); }))
          << g.file;
    }
  }
  // q 1000 times larger: 1e38·Q overflows float32.
  for (double& x : d.q) x *= 1000;
  for (const auto& entry : fs::directory_iterator(in_)) fs::remove(entry.path());
  write_case(c, d, DType::f32, true);
  for (const auto& entry : fs::directory_iterator(out_)) fs::remove(entry.path());
  expect_error(mha(c, {"--scale", "1e38"}), kInput,
               "(the computation overflowed float32; is --scale times the scores Q·K^T out of "
               "its range?)");  // and --out stays empty
}

// The golden cases of unit_tests/attention/test_mha_golden.cpp (PyTorch
// autograd in float64 on float32 inputs, unit_tests/reference/gen_mha_golden.py)
// run through the tool: data_dir()/attention/mha_CASE_NAME.npy is the tool's
// NAME.npy (dout: do.npy), its out and dNAME the expected o.npy and gradients.
// The dropout case needs a dropout offset, which the tool leaves at 0.
TEST_F(CliMha, MatchesPyTorchGoldenData) {
  for (const std::string name : {"plain", "causal_residual", "masks", "eigenmha"}) {
    SCOPED_TRACE(name);
    fs::remove_all(in_), fs::remove_all(out_);
    fs::create_directories(in_), fs::create_directories(out_);
    const std::string prefix = "mha_" + name + "_";
    std::set<std::string> expected_files{"o.npy"};
    for (const auto& e : fs::directory_iterator(data_dir() + "/attention")) {
      const std::string file = e.path().filename().string();
      if (file.rfind(prefix, 0) != 0 || e.path().extension() != ".npy") continue;
      const std::string array = file.substr(prefix.size());
      if (array == "dout.npy") {
        fs::copy_file(e.path(), in_ / "do.npy");
      } else if (array[0] == 'd') {
        expected_files.insert(array);
      } else if (array != "out.npy") {
        fs::copy_file(e.path(), in_ / array);
      }
    }
    ASSERT_GT(expected_files.size(), 8u);
    // meta.json: {"H": 2, "causal": true, ..., "sm_scaler": 0.4}
    const std::string meta = read_text(data_dir() + "/attention/" + prefix + "meta.json");
    const auto value = [&](const std::string& key) {
      const auto at = meta.find("\"" + key + "\": ");
      return at == std::string::npos
                 ? std::string()
                 : meta.substr(at + key.size() + 4,
                               meta.find_first_of(",}", at) - at - key.size() - 4);
    };
    ASSERT_EQ(value("p"), "0.0");
    Strings args{"mha", "--in", in_.string(), "--out", out_.string(), "--heads", value("H")};
    if (value("causal") == "true") args.push_back("--causal");
    if (!value("sm_scaler").empty()) args.insert(args.end(), {"--scale", value("sm_scaler")});
    const Result r = run(args);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(files(out_), expected_files);
    for (const std::string& file : expected_files) {
      SCOPED_TRACE(file);
      const std::string golden =
          data_dir() + "/attention/" + prefix + (file == "o.npy" ? std::string("out.npy") : file);
      const auto expected = kdnn::io::read_npy(golden);
      const std::vector<double> e(expected.data<double>(),
                                  expected.data<double>() + expected.size());
      const auto a = read(out_ / file, DType::f32, expected.shape);
      if (file == "db_k.npy") {  // zero but for round-off: see test_mha_golden.cpp
        EXPECT_ALLCLOSE(a, e, 0.0, 1e-5);
      } else {
        EXPECT_ALLCLOSE(a, e, 1e-4, 1e-3);
        EXPECT_LT(rel_error(a, e), 1e-5);
      }
    }
  }
}

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
