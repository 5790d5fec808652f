// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The SSD against golden data from PyTorch autograd in float64
// (unit_tests/reference/gen_ssd_golden.py: the chunked formulation
// kdnn_reference.ssd, cross-checked there against the step-by-step
// recurrence): y, the final state and every gradient of
// L = Σ dy·y + Σ dfinal·final, for float and double run on the stored
// float32 inputs. Cases: two groups with D, an initial state and d(final
// state); Q not dividing L; one group per head; 300 steps whose decays
// underflow.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "allclose.hpp"
#include "golden_case.hpp"
#include "kdnn/ssm/ssd.hpp"
#include "test_paths.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
using kdnn::io::DType;
using Shape = std::vector<std::size_t>;
using Vec = std::vector<double>;
namespace ssm = kdnn::ssm;

/// float: float32 arithmetic against float64 (sums over up to P·N·H terms of
/// size ~1 per output, more for dA and dD); double: only the order of the
/// operations differs from PyTorch's.
template <class T>
constexpr double ssd_golden_tol() {
  return sizeof(T) == 4 ? 2e-4 : 1e-11;
}

struct SsdGolden {
  int B = 0, L = 0, H = 0, P = 0, G = 0, N = 0, chunk = 0;
  bool has_d = false, has_init = false, has_dfinal = false;
  Vec x, dt, a, b, c, d, init, dy, dfinal;             // float32 inputs
  Vec y, final_state, dx, ddt, da, db, dc, dd, dinit;  // expected
};

void flag(const std::map<std::string, std::string>& meta, const std::string& key, bool& out) {
  const std::string& v = meta.at(key);
  ASSERT_TRUE(v == "true" || v == "false") << key << ": " << v;
  out = v == "true";
}

void load_ssd(const std::string& name, SsdGolden& g) {
  const GoldenCase f{data_dir() + "/ssm/ssd_" + name + "_"};
  std::map<std::string, std::string> meta;
  ASSERT_NO_FATAL_FAILURE(load_meta(f, meta));
  ASSERT_EQ(meta.size(), 4u) << f.path("meta", ".json");
  g.chunk = std::stoi(meta.at("chunk"));
  ASSERT_NO_FATAL_FAILURE(flag(meta, "d", g.has_d));
  ASSERT_NO_FATAL_FAILURE(flag(meta, "init", g.has_init));
  ASSERT_NO_FATAL_FAILURE(flag(meta, "dfinal", g.has_dfinal));
  EXPECT_EQ(f.has("d"), g.has_d);
  EXPECT_EQ(f.has("dd"), g.has_d);
  EXPECT_EQ(f.has("init"), g.has_init);
  EXPECT_EQ(f.has("dinit"), g.has_init);
  EXPECT_EQ(f.has("dfinal"), g.has_dfinal);

  Shape xs{0, 0, 0, 0};
  ASSERT_NO_FATAL_FAILURE(load(f, "x", DType::f32, xs, g.x));
  g.B = int(xs[0]), g.L = int(xs[1]), g.H = int(xs[2]), g.P = int(xs[3]);
  Shape bs{xs[0], xs[1], 0, 0};
  ASSERT_NO_FATAL_FAILURE(load(f, "b", DType::f32, bs, g.b));
  g.G = int(bs[2]), g.N = int(bs[3]);
  const Shape dts{xs[0], xs[1], xs[2]}, hs{xs[2]}, states{xs[0], xs[2], xs[3], bs[3]};
  const auto in = [&](const char* array, DType type, Shape shape, Vec& out) {
    load(f, array, type, shape, out);
  };
  ASSERT_NO_FATAL_FAILURE(in("dt", DType::f32, dts, g.dt));
  ASSERT_NO_FATAL_FAILURE(in("a", DType::f32, hs, g.a));
  ASSERT_NO_FATAL_FAILURE(in("c", DType::f32, bs, g.c));
  ASSERT_NO_FATAL_FAILURE(in("dy", DType::f32, xs, g.dy));
  if (g.has_d) {
    ASSERT_NO_FATAL_FAILURE(in("d", DType::f32, hs, g.d));
  }
  if (g.has_init) {
    ASSERT_NO_FATAL_FAILURE(in("init", DType::f32, states, g.init));
  }
  if (g.has_dfinal) {
    ASSERT_NO_FATAL_FAILURE(in("dfinal", DType::f32, states, g.dfinal));
  }
  ASSERT_NO_FATAL_FAILURE(in("y", DType::f64, xs, g.y));
  ASSERT_NO_FATAL_FAILURE(in("final", DType::f64, states, g.final_state));
  ASSERT_NO_FATAL_FAILURE(in("dx", DType::f64, xs, g.dx));
  ASSERT_NO_FATAL_FAILURE(in("ddt", DType::f64, dts, g.ddt));
  ASSERT_NO_FATAL_FAILURE(in("da", DType::f64, hs, g.da));
  ASSERT_NO_FATAL_FAILURE(in("db", DType::f64, bs, g.db));
  ASSERT_NO_FATAL_FAILURE(in("dc", DType::f64, bs, g.dc));
  if (g.has_d) {
    ASSERT_NO_FATAL_FAILURE(in("dd", DType::f64, hs, g.dd));
  }
  if (g.has_init) {
    ASSERT_NO_FATAL_FAILURE(in("dinit", DType::f64, states, g.dinit));
  }
}

template <class T>
void check_ssd(const std::string& name) {
  SsdGolden g;
  ASSERT_NO_FATAL_FAILURE(load_ssd(name, g));
  SCOPED_TRACE("ssd_" + name + (sizeof(T) == 4 ? " (float)" : " (double)"));
  const int B = g.B, L = g.L, H = g.H, P = g.P, G = g.G, N = g.N;
  const auto x = to_device<T****>(g.x, B, L, H, P);
  const auto dt = to_device<T***>(g.dt, B, L, H);
  const auto A = to_device<T*>(g.a, H);
  const auto Bm = to_device<T****>(g.b, B, L, G, N);
  const auto Cm = to_device<T****>(g.c, B, L, G, N);
  const auto dy = to_device<T****>(g.dy, B, L, H, P);
  DeviceView<T*> D, dD;
  DeviceView<T****> init, dinit, dfinal;
  if (g.has_d) D = to_device<T*>(g.d, H), dD = DeviceView<T*>("dD", H);
  if (g.has_init) {
    init = to_device<T****>(g.init, B, H, P, N);
    dinit = DeviceView<T****>("dinit", B, H, P, N);
  }
  if (g.has_dfinal) dfinal = to_device<T****>(g.dfinal, B, H, P, N);
  const ssm::SsdOptions opts{g.chunk, true};

  DeviceView<T****> y("y", B, L, H, P), fin("final", B, H, P, N);
  ssm::SsdForward<T, Space> fa;
  fa.x = x, fa.dt = dt, fa.A = A, fa.B = Bm, fa.C = Cm, fa.D = D, fa.initial_state = init;
  fa.y = y, fa.final_state = fin;
  ssm::ssd_forward(Space(), fa, opts);
  EXPECT_ALLCLOSE(to_host(y), g.y, ssd_golden_tol<T>(), ssd_golden_tol<T>());
  EXPECT_ALLCLOSE(to_host(fin), g.final_state, ssd_golden_tol<T>(), ssd_golden_tol<T>());

  DeviceView<T****> dx("dx", B, L, H, P), dB("dB", B, L, G, N), dC("dC", B, L, G, N);
  DeviceView<T***> ddt("ddt", B, L, H);
  DeviceView<T*> dA("dA", H);
  ssm::SsdBackward<T, Space> ba;
  ba.x = x, ba.dt = dt, ba.A = A, ba.B = Bm, ba.C = Cm, ba.D = D, ba.initial_state = init;
  ba.dy = dy, ba.dfinal_state = dfinal;
  ba.dx = dx, ba.ddt = ddt, ba.dA = dA, ba.dB = dB, ba.dC = dC, ba.dD = dD;
  ba.dinitial_state = dinit;
  ssm::ssd_backward(Space(), ba, opts);
  EXPECT_ALLCLOSE(to_host(dx), g.dx, ssd_golden_tol<T>(), ssd_golden_tol<T>());
  EXPECT_ALLCLOSE(to_host(ddt), g.ddt, ssd_golden_tol<T>(), ssd_golden_tol<T>());
  EXPECT_ALLCLOSE(to_host(dA), g.da, ssd_golden_tol<T>(), ssd_golden_tol<T>());
  EXPECT_ALLCLOSE(to_host(dB), g.db, ssd_golden_tol<T>(), ssd_golden_tol<T>());
  EXPECT_ALLCLOSE(to_host(dC), g.dc, ssd_golden_tol<T>(), ssd_golden_tol<T>());
  if (g.has_d) {
    EXPECT_ALLCLOSE(to_host(dD), g.dd, ssd_golden_tol<T>(), ssd_golden_tol<T>());
  }
  if (g.has_init) {
    EXPECT_ALLCLOSE(to_host(dinit), g.dinit, ssd_golden_tol<T>(), ssd_golden_tol<T>());
  }
}

TEST(SsmGolden, SsdMatchesPyTorch) {
  for (const char* name : {"basic", "ragged", "per_head", "long"}) {
    ASSERT_NO_FATAL_FAILURE(check_ssd<float>(name));
    ASSERT_NO_FATAL_FAILURE(check_ssd<double>(name));
  }
}

}  // namespace
