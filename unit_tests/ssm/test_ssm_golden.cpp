// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Causal depthwise conv1d (+ SiLU) and dt softplus against golden data from
// PyTorch autograd in float64 (unit_tests/reference/gen_ssm_conv_golden.py:
// F.conv1d with groups = C and F.silu, F.softplus and torch.clamp): y, the
// final state and every gradient of L = Σ dy·y + Σ dfinal·final; dt_out and
// the gradients of L = Σ ddt_out·dt_out; for float and double run on the
// stored float32 inputs. Conv cases: K = 1, 2, 4, 7, no bias / initial
// state / SiLU, L < K−1; dt cases: values around the threshold (u = 20) with
// and without the clamp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "allclose.hpp"
#include "golden_case.hpp"
#include "kdnn/io/npy.hpp"
#include "kdnn/ssm/causal_conv1d.hpp"
#include "kdnn/ssm/dt_softplus.hpp"
#include "test_paths.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
using kdnn::io::DType;
using Shape = std::vector<std::size_t>;
using Vec = std::vector<double>;
namespace ssm = kdnn::ssm;

/// Tolerances: float runs float32 arithmetic against a float64 reference
/// (round-off ~6e-8 per operation, summed over at most B·L = 80 terms in dw,
/// dbias and ddt_bias), so 1e-5 relative and absolute; double only differs
/// from PyTorch in the order of its operations.
template <class T>
constexpr double ssm_golden_tol() {
  return sizeof(T) == 4 ? 1e-5 : 1e-12;
}

/// meta.json with exactly `keys` (ASSERTs).
void load_meta(const GoldenCase& f, const std::vector<std::string>& keys,
               std::map<std::string, std::string>& meta) {
  ASSERT_NO_FATAL_FAILURE(kdnn_test::load_meta(f, meta));
  ASSERT_EQ(meta.size(), keys.size()) << f.path("meta", ".json");
  for (const auto& key : keys) ASSERT_EQ(meta.count(key), 1u) << "meta key " << key;
}

/// A boolean of meta.json (ASSERTs).
void meta_bool(const std::map<std::string, std::string>& meta, const std::string& key, bool& out) {
  const std::string& v = meta.at(key);
  ASSERT_TRUE(v == "true" || v == "false") << key << ": " << v;
  out = v == "true";
}

// ---------------------------------------------------------------------------
// Causal conv1d

struct ConvGolden {
  int B = 0, L = 0, C = 0, K = 0;
  bool silu = true, has_bias = false, has_init = false, has_dfinal = false;
  Vec x, w, bias, init, dy, dfinal;          // float32 inputs
  Vec y, final_state, dx, dw, dbias, dinit;  // expected (final_state empty: K = 1)
};

void load_conv(const std::string& name, ConvGolden& g) {
  const GoldenCase f{data_dir() + "/ssm/conv_" + name + "_"};
  std::map<std::string, std::string> meta;
  ASSERT_NO_FATAL_FAILURE(load_meta(f, {"K", "silu", "bias", "init", "dfinal"}, meta));
  ASSERT_NO_FATAL_FAILURE(meta_bool(meta, "silu", g.silu));
  ASSERT_NO_FATAL_FAILURE(meta_bool(meta, "bias", g.has_bias));
  ASSERT_NO_FATAL_FAILURE(meta_bool(meta, "init", g.has_init));
  ASSERT_NO_FATAL_FAILURE(meta_bool(meta, "dfinal", g.has_dfinal));
  // An optional input's file exists iff meta.json says so, as its gradient's.
  EXPECT_EQ(f.has("bias"), g.has_bias);
  EXPECT_EQ(f.has("dbias"), g.has_bias);
  EXPECT_EQ(f.has("init"), g.has_init);
  EXPECT_EQ(f.has("dinit"), g.has_init);
  EXPECT_EQ(f.has("dfinal"), g.has_dfinal);

  Shape xs{0, 0, 0};
  ASSERT_NO_FATAL_FAILURE(load(f, "x", DType::f32, xs, g.x));
  g.B = int(xs[0]), g.L = int(xs[1]), g.C = int(xs[2]);
  Shape ws{xs[2], 0};
  ASSERT_NO_FATAL_FAILURE(load(f, "w", DType::f32, ws, g.w));
  g.K = int(ws[1]);
  ASSERT_EQ(std::to_string(g.K), meta.at("K")) << f.prefix;
  const Shape state{xs[0], std::size_t(g.K - 1), xs[2]}, vec{xs[2]}, wshape = ws;
  Shape s = xs;
  ASSERT_NO_FATAL_FAILURE(load(f, "dy", DType::f32, s, g.dy));
  if (g.has_bias) {
    s = vec;
    ASSERT_NO_FATAL_FAILURE(load(f, "bias", DType::f32, s, g.bias));
  }
  if (g.has_init) {
    s = state;
    ASSERT_NO_FATAL_FAILURE(load(f, "init", DType::f32, s, g.init));
  }
  if (g.has_dfinal) {
    s = state;
    ASSERT_NO_FATAL_FAILURE(load(f, "dfinal", DType::f32, s, g.dfinal));
  }

  s = xs;
  ASSERT_NO_FATAL_FAILURE(load(f, "y", DType::f64, s, g.y));
  EXPECT_EQ(f.has("final"), g.K > 1);
  if (g.K > 1) {
    s = state;
    ASSERT_NO_FATAL_FAILURE(load(f, "final", DType::f64, s, g.final_state));
  }
  s = xs;
  ASSERT_NO_FATAL_FAILURE(load(f, "dx", DType::f64, s, g.dx));
  s = wshape;
  ASSERT_NO_FATAL_FAILURE(load(f, "dw", DType::f64, s, g.dw));
  if (g.has_bias) {
    s = vec;
    ASSERT_NO_FATAL_FAILURE(load(f, "dbias", DType::f64, s, g.dbias));
  }
  if (g.has_init) {
    s = state;
    ASSERT_NO_FATAL_FAILURE(load(f, "dinit", DType::f64, s, g.dinit));
  }
}

/// Runs the forward and the backward in T on case `name` and compares every
/// output with PyTorch's.
template <class T>
void check_conv(const std::string& name) {
  ConvGolden g;
  ASSERT_NO_FATAL_FAILURE(load_conv(name, g));
  SCOPED_TRACE("conv_" + name + (sizeof(T) == 4 ? " (float)" : " (double)"));
  const int B = g.B, L = g.L, C = g.C, K = g.K;
  const auto x = to_device<T***>(g.x, B, L, C);
  const auto w = to_device<T**>(g.w, C, K);
  const auto dy = to_device<T***>(g.dy, B, L, C);
  DeviceView<T*> bias;
  DeviceView<T***> init, dfinal;
  if (g.has_bias) bias = to_device<T*>(g.bias, C);
  if (g.has_init) init = to_device<T***>(g.init, B, K - 1, C);
  if (g.has_dfinal) dfinal = to_device<T***>(g.dfinal, B, K - 1, C);
  const ssm::CausalConv1dOptions opts{g.silu};

  DeviceView<T***> y("y", B, L, C), fin("final", B, K - 1, C);
  ssm::ConvForward<T, Space> fa;
  fa.x = x;
  fa.w = w;
  fa.bias = bias;
  fa.initial_state = init;
  fa.y = y;
  fa.final_state = fin;
  ssm::causal_conv1d_forward(Space(), fa, opts);
  EXPECT_ALLCLOSE(to_host(y), g.y, ssm_golden_tol<T>(), ssm_golden_tol<T>());
  EXPECT_ALLCLOSE(to_host(fin), g.final_state, ssm_golden_tol<T>(),
                  ssm_golden_tol<T>());  // copies of inputs

  DeviceView<T***> dx("dx", B, L, C), dinit;
  DeviceView<T**> dw("dw", C, K);
  DeviceView<T*> dbias;
  if (g.has_bias) dbias = DeviceView<T*>("dbias", C);
  if (g.has_init) dinit = DeviceView<T***>("dinit", B, K - 1, C);
  ssm::ConvBackward<T, Space> ba;
  ba.x = x;
  ba.w = w;
  ba.bias = bias;
  ba.initial_state = init;
  ba.dy = dy;
  ba.dfinal_state = dfinal;
  ba.dx = dx;
  ba.dw = dw;
  ba.dbias = dbias;
  ba.dinitial_state = dinit;
  ssm::causal_conv1d_backward(Space(), ba, opts);
  EXPECT_ALLCLOSE(to_host(dx), g.dx, ssm_golden_tol<T>(), ssm_golden_tol<T>());
  EXPECT_ALLCLOSE(to_host(dw), g.dw, ssm_golden_tol<T>(), ssm_golden_tol<T>());
  if (g.has_bias) {
    EXPECT_ALLCLOSE(to_host(dbias), g.dbias, ssm_golden_tol<T>(), ssm_golden_tol<T>());
  }
  if (g.has_init) {
    EXPECT_ALLCLOSE(to_host(dinit), g.dinit, ssm_golden_tol<T>(), ssm_golden_tol<T>());
  }
}

const char* const conv_cases[] = {"k1", "k2", "k4", "k7", "plain", "short"};

TEST(SsmGolden, ConvMatchesPyTorch) {
  for (const char* name : conv_cases) {
    ASSERT_NO_FATAL_FAILURE(check_conv<float>(name));
    ASSERT_NO_FATAL_FAILURE(check_conv<double>(name));
  }
}

// ---------------------------------------------------------------------------
// dt softplus

struct DtGolden {
  int B = 0, L = 0, H = 0;
  ssm::DtSoftplusOptions opts;
  Vec dt, dt_bias, ddt_out;   // float32 inputs
  Vec dt_out, ddt, ddt_bias;  // expected
};

void load_dt(const std::string& name, DtGolden& g) {
  const GoldenCase f{data_dir() + "/ssm/dt_" + name + "_"};
  std::map<std::string, std::string> meta;
  ASSERT_NO_FATAL_FAILURE(load_meta(f, {"dt_min", "dt_max"}, meta));
  g.opts.dt_min = std::stod(meta.at("dt_min"));
  g.opts.dt_max = meta.at("dt_max") == "null" ? std::numeric_limits<double>::infinity()
                                              : std::stod(meta.at("dt_max"));
  Shape ds{0, 0, 0};
  ASSERT_NO_FATAL_FAILURE(load(f, "dt", DType::f32, ds, g.dt));
  g.B = int(ds[0]), g.L = int(ds[1]), g.H = int(ds[2]);
  Shape s{ds[2]};
  ASSERT_NO_FATAL_FAILURE(load(f, "dt_bias", DType::f32, s, g.dt_bias));
  s = ds;
  ASSERT_NO_FATAL_FAILURE(load(f, "ddt_out", DType::f32, s, g.ddt_out));
  s = ds;
  ASSERT_NO_FATAL_FAILURE(load(f, "dt_out", DType::f64, s, g.dt_out));
  s = ds;
  ASSERT_NO_FATAL_FAILURE(load(f, "ddt", DType::f64, s, g.ddt));
  s = {ds[2]};
  ASSERT_NO_FATAL_FAILURE(load(f, "ddt_bias", DType::f64, s, g.ddt_bias));
}

template <class T>
void check_dt(const std::string& name) {
  DtGolden g;
  ASSERT_NO_FATAL_FAILURE(load_dt(name, g));
  SCOPED_TRACE("dt_" + name + (sizeof(T) == 4 ? " (float)" : " (double)"));
  const int B = g.B, L = g.L, H = g.H;
  const auto dt = to_device<T***>(g.dt, B, L, H);
  const auto bias = to_device<T*>(g.dt_bias, H);
  const auto ddt_out = to_device<T***>(g.ddt_out, B, L, H);
  DeviceView<T***> out("dt_out", B, L, H), ddt("ddt", B, L, H);
  DeviceView<T*> ddt_bias("ddt_bias", H);
  ssm::dt_softplus_forward(Space(), dt, bias, out, g.opts);
  ssm::dt_softplus_backward(Space(), dt, bias, ddt_out, ddt, ddt_bias, g.opts);
  EXPECT_ALLCLOSE(to_host(out), g.dt_out, ssm_golden_tol<T>(), ssm_golden_tol<T>());
  EXPECT_ALLCLOSE(to_host(ddt), g.ddt, ssm_golden_tol<T>(), ssm_golden_tol<T>());
  EXPECT_ALLCLOSE(to_host(ddt_bias), g.ddt_bias, ssm_golden_tol<T>(), ssm_golden_tol<T>());
}

const char* const dt_cases[] = {"noclamp", "clamp"};

TEST(SsmGolden, DtMatchesPyTorch) {
  for (const char* name : dt_cases) {
    ASSERT_NO_FATAL_FAILURE(check_dt<float>(name));
    ASSERT_NO_FATAL_FAILURE(check_dt<double>(name));
  }
}

}  // namespace
