// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// `kdnn mha`, run as a subprocess on .npy fixtures: o.npy against the
// double-loop layer of unit_tests/attention/mha_reference.hpp and every
// gradient against its central differences, in float32 and float64, with
// biases, residual, causal mask, windows, lengths (int32 and int64) and
// dropout; the two attention algorithms and huge scales; against the
// PyTorch golden data of the layer's own tests. Its error paths:
// test_cli_mha_errors.cpp.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "allclose.hpp"
#include "cli_fixture.hpp"
#include "cli_mha.hpp"
#include "kdnn/io/npy.hpp"
#include "mha_reference.hpp"
#include "test_paths.hpp"

namespace {

using namespace kdnn_test;
using kdnn::io::DType;

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

// ---- help ----------------------------------------------------------------

TEST_F(CliMha, Help) {
  const Result top = run({"--help"});
  EXPECT_EQ(top.status, 0);
  EXPECT_NE(top.out.find("\n  mha           multi-head attention layer"), std::string::npos)
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

}  // namespace
