// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// What the SSD computes around its scan on request (mamba's
// mamba_chunk_scan_combined): the step sizes clamp(f(dt + dt_bias), dt_min,
// dt_max) with f = softplus or the identity, and the gate y·SiLU(z). Against
// the float64 recurrence (ssd_reference.hpp) on the transformed step sizes,
// with the transform, the gate and their gradients written out here in
// double; in every kernel form; the backward with and without the forward's
// y_ungated; directional finite differences of kdnn's double forward; on
// kdnn::cp's SSD at one rank as on the single-rank one; bad arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "allclose.hpp"
#include "expect_error.hpp"
#include "kdnn/ssm/ssd.hpp"
#include "ssd_reference.hpp"
#include "ssd_views.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
using ssm_ref::SsdCase;
using ssm_ref::SsdShape;
using ssm_ref::Vec;
namespace ssm = kdnn::ssm;

constexpr double kInf = std::numeric_limits<double>::infinity();

/// One request of what runs around the scan.
struct Around {
  bool softplus = false;
  double lo = 0, hi = kInf;
  bool bias = false, gate = false;
  std::string name() const {
    return std::string(softplus ? "softplus" : "identity") + " [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "]" + (bias ? " bias" : "") + (gate ? " gate" : "");
  }
};

/// A case with raw dt (before the transform), dt_bias and z.
struct AroundCase {
  SsdCase a;  // a.dt is the raw dt
  Vec dt_bias, z;
  Around what;
};

AroundCase make_around_case(SsdShape s, const Around& what, unsigned seed) {
  AroundCase c;
  c.what = what;
  SsdCase& a = c.a;
  a.s = s;
  const std::size_t nx = std::size_t(s.B) * s.L * s.H * s.P;
  const std::size_t nbc = std::size_t(s.B) * s.L * s.G * s.N;
  const std::size_t ns = std::size_t(s.B) * s.H * s.P * s.N;
  a.x = normal(nx, seed);
  // softplus of [−3, 1] is [0.05, 1.3]. The identity: [−0.2, 0.7] (with a
  // bias of ±0.3) where the lower limit 0 clamps the negative steps, else
  // [0.05, 0.7] (the scan's step sizes are >= 0).
  const std::size_t n = std::size_t(s.B) * s.L * s.H;
  a.dt = what.softplus               ? uniform(n, -3.0, 1.0, seed + 1)
         : what.lo == 0 && what.bias ? uniform(n, -0.2, 0.7, seed + 1)
                                     : uniform(n, 0.05, 0.7, seed + 1);
  a.A = uniform(s.H, -1.5, -0.2, seed + 2);
  a.Bm = normal(nbc, seed + 3);
  a.Cm = normal(nbc, seed + 4);
  a.dy = normal(nx, seed + 5);
  a.D = uniform(s.H, -1, 1, seed + 6);
  a.init = normal(ns, seed + 7);
  a.dfinal = normal(ns, seed + 8);
  if (what.bias) c.dt_bias = uniform(s.H, -0.3, 0.3, seed + 9);
  if (what.gate) c.z = normal(nx, seed + 10);
  return c;
}

double softplus(double u) { return u > 20 ? u : std::log1p(std::exp(u)); }
double sigmoid(double u) { return 1 / (1 + std::exp(-u)); }

double bias_of(const AroundCase& c, std::size_t i) {
  return c.dt_bias.empty() ? 0.0 : c.dt_bias[i % c.a.s.H];
}

/// The step sizes and d(step)/d(raw dt), in double.
void transform(const AroundCase& c, Vec& dt, Vec& slope) {
  dt.resize(c.a.dt.size());
  slope.resize(c.a.dt.size());
  for (std::size_t i = 0; i < dt.size(); ++i) {
    const double u = c.a.dt[i] + bias_of(c, i);
    const double f = c.what.softplus ? softplus(u) : u;
    const bool inside = f >= c.what.lo && f <= c.what.hi;
    dt[i] = inside ? f : f < c.what.lo ? c.what.lo : c.what.hi;
    slope[i] = !inside ? 0.0 : c.what.softplus && u <= 20 ? sigmoid(u) : 1.0;
  }
}

struct Expected {
  Vec y, y_ungated, final_state;
  ssm_ref::SsdBackwardResult g;  // g.ddt is d(raw dt)
  Vec ddt_bias, dz;
};

/// The float64 reference: the recurrence on the transformed dt, the gate
/// and both chain rules written out.
Expected expected(const AroundCase& c) {
  Expected e;
  SsdCase inner = c.a;
  Vec slope;
  transform(c, inner.dt, slope);
  const auto f = ssm_ref::ssd_forward(inner);
  e.y_ungated = f.y;
  e.final_state = f.final_state;
  e.y = f.y;
  if (c.what.gate) {
    e.dz.resize(f.y.size());
    for (std::size_t i = 0; i < f.y.size(); ++i) {
      const double z = c.z[i], s = sigmoid(z), dy = c.a.dy[i];
      e.y[i] = f.y[i] * z * s;
      inner.dy[i] = dy * z * s;
      e.dz[i] = dy * f.y[i] * s * (1 + z * (1 - s));
    }
  }
  e.g = ssm_ref::ssd_backward(inner);
  e.ddt_bias.assign(c.a.s.H, 0.0);
  for (std::size_t i = 0; i < slope.size(); ++i) {
    e.g.ddt[i] *= slope[i];
    e.ddt_bias[i % c.a.s.H] += e.g.ddt[i];
  }
  if (c.dt_bias.empty()) e.ddt_bias.clear();
  return e;
}

ssm::SsdOptions around_options(const Around& what, int chunk, kdnn::KernelForm form) {
  ssm::SsdOptions o;
  o.chunk = chunk;
  o.launch.form = form;
  o.dt_softplus = what.softplus;
  o.dt_min = what.lo;
  o.dt_max = what.hi;
  return o;
}

/// The Views of one case, in T.
template <class T>
struct Views : SsdViews<T> {
  explicit Views(const AroundCase& c) : SsdViews<T>(c.a, c.dt_bias, c.z) {}
};

struct Forward {
  Vec y, y_ungated, final_state;
};

/// ssd_forward through `run` (the single-rank operator unless given), with
/// y_ungated kept when `keep` (and z given).
template <class T, class Run>
Forward run_around_forward(const Views<T>& v, const ssm::SsdOptions& opts, bool keep,
                           const Run& run) {
  ssm::SsdForward<T, Space> args;
  v.set_inputs(args);
  const auto y = v.like_x("y"), yu = v.like_x("y_ungated");
  const auto fin = v.like_state("final");
  args.y = y, args.final_state = fin;
  if (keep) args.y_ungated = yu;
  run(args, opts);
  return {to_host(y), keep ? to_host(yu) : Vec(), to_host(fin)};
}

struct Backward {
  Vec dx, ddt, dA, dB, dC, dD, dinit, ddt_bias, dz;
};

template <class T, class Run>
Backward run_around_backward(const Views<T>& v, const ssm::SsdOptions& opts,
                             const DeviceView<T****>& y_ungated, const Run& run) {
  const auto& s = v.s;
  ssm::SsdBackward<T, Space> args;
  v.set_inputs(args);
  const auto dx = v.like_x("dx"), dz = v.like_x("dz"), dinit = v.like_state("dinit");
  DeviceView<T****> dB("dB", s.B, s.L, s.G, s.N), dC("dC", s.B, s.L, s.G, s.N);
  DeviceView<T***> ddt("ddt", s.B, s.L, s.H);
  DeviceView<T*> dA("dA", s.H), dD("dD", s.H), ddt_bias("ddt_bias", s.H);
  Kokkos::deep_copy(ddt_bias, T(99));  // overwritten, never accumulated into
  args.y_ungated = y_ungated;
  args.dy = v.dy, args.dfinal_state = v.dfinal;
  args.dx = dx, args.ddt = ddt, args.dA = dA, args.dB = dB, args.dC = dC, args.dD = dD;
  args.dinitial_state = dinit;
  if (kdnn::validate::given(v.dt_bias)) args.ddt_bias = ddt_bias;
  if (kdnn::validate::given(v.z)) args.dz = dz;
  run(args, opts);
  Backward b{to_host(dx), to_host(ddt),   to_host(dA), to_host(dB), to_host(dC),
             to_host(dD), to_host(dinit), Vec(),       Vec()};
  if (kdnn::validate::given(v.dt_bias)) b.ddt_bias = to_host(ddt_bias);
  if (kdnn::validate::given(v.z)) b.dz = to_host(dz);
  return b;
}

struct SingleRank {
  template <class T>
  void operator()(const ssm::SsdForward<T, Space>& args, const ssm::SsdOptions& opts) const {
    ssm::ssd_forward(Space(), args, opts);
  }
  template <class T>
  void operator()(const ssm::SsdBackward<T, Space>& args, const ssm::SsdOptions& opts) const {
    ssm::ssd_backward(Space(), args, opts);
  }
};

template <class T>
constexpr double around_tol() {
  return sizeof(T) == 4 ? 1e-4 : 1e-11;
}

template <class T>
double sum_tol(double terms) {
  return around_tol<T>() * std::sqrt(terms + 1);
}

const Around kRequests[] = {
    {true, 0, kInf, true, true},      // mamba's usual call: softplus(dt + dt_bias), z
    {true, 0.1, 0.8, false, false},   // softplus without bias, clamped on both sides
    {false, 0, kInf, true, false},    // dt + dt_bias, negatives clamped to 0
    {false, 0, kInf, false, true},    // the gate alone (dt as it is)
    {false, -kInf, 0.5, false, true}  // the identity with an upper limit only
};

template <class T>
class SsdAround : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(SsdAround, Types);

TYPED_TEST(SsdAround, IsTheScanOfTheTransformedStepsThenTheGate) {
  using T = TypeParam;
  struct Config {
    SsdShape s;
    int chunk;
  };
  // Shapes of the host form only, and of the GPU forms (P = N = 64).
  const Config configs[] = {{{2, 37, 4, 8, 2, 8}, 8}, {{1, 150, 2, 64, 2, 64}, 64}};
  unsigned seed = 7000;
  for (const Config& cfg : configs) {
    for (const Around& what : kRequests) {
      const AroundCase c = make_around_case(cfg.s, what, seed += 20);
      const Expected e = expected(c);
      const Views<T> v(c);
      const auto& s = cfg.s;
      for (const auto form :
           {kdnn::KernelForm::host, kdnn::KernelForm::gpu, kdnn::KernelForm::tensor_cores}) {
        SCOPED_TRACE(what.name() + " P=" + std::to_string(s.P) + " form " +
                     std::to_string(int(form)));
        const auto opts = around_options(what, cfg.chunk, form);
        const auto f = run_around_forward(v, opts, what.gate, SingleRank());
        const double atol = sum_tol<T>(4.0 * s.N);
        EXPECT_ALLCLOSE(f.y, e.y, around_tol<T>(), atol) << "y";
        EXPECT_ALLCLOSE(f.final_state, e.final_state, around_tol<T>(), atol) << "final state";
        if (what.gate) {
          EXPECT_ALLCLOSE(f.y_ungated, e.y_ungated, around_tol<T>(), atol) << "y_ungated";
        }

        // The backward from the forward's y_ungated, and recomputing it: the
        // same values bitwise (the same kernels on the same operands).
        DeviceView<T****> kept;
        if (what.gate) kept = to_device<T****>(f.y_ungated, s.B, s.L, s.H, s.P);
        const auto b = run_around_backward(v, opts, kept, SingleRank());
        const double step = sum_tol<T>(4.0 * s.P * s.N);
        const double param = sum_tol<T>(4.0 * s.P * s.N * s.B * s.L);
        EXPECT_ALLCLOSE(b.dx, e.g.dx, around_tol<T>(), step) << "dx";
        EXPECT_ALLCLOSE(b.ddt, e.g.ddt, around_tol<T>(), step) << "ddt";
        EXPECT_ALLCLOSE(b.dB, e.g.dB, around_tol<T>(), step * s.H) << "dB";
        EXPECT_ALLCLOSE(b.dC, e.g.dC, around_tol<T>(), step * s.H) << "dC";
        EXPECT_ALLCLOSE(b.dA, e.g.dA, around_tol<T>(), param) << "dA";
        EXPECT_ALLCLOSE(b.dD, e.g.dD, around_tol<T>(), param) << "dD";
        EXPECT_ALLCLOSE(b.dinit, e.g.dinit, around_tol<T>(), step) << "dinit";
        EXPECT_ALLCLOSE(b.ddt_bias, e.ddt_bias, around_tol<T>(), param) << "ddt_bias";
        EXPECT_ALLCLOSE(b.dz, e.dz, around_tol<T>(), step) << "dz";
        if (what.gate) {
          const auto recomputed = run_around_backward(v, opts, DeviceView<T****>(), SingleRank());
          EXPECT_EQ(recomputed.dx, b.dx);
          EXPECT_EQ(recomputed.ddt, b.ddt);
          EXPECT_EQ(recomputed.dz, b.dz);
          EXPECT_EQ(recomputed.dA, b.dA);
        }
      }
    }
  }
}

/// Σ y·dy + Σ final·dfinal of kdnn's double forward.
double loss(const AroundCase& c, int chunk) {
  const Views<double> v(c);
  const auto f = run_around_forward(v, around_options(c.what, chunk, kdnn::KernelForm::automatic),
                                    false, SingleRank());
  double l = 0;
  for (std::size_t i = 0; i < f.y.size(); ++i) l += f.y[i] * c.a.dy[i];
  for (std::size_t i = 0; i < f.final_state.size(); ++i) l += f.final_state[i] * c.a.dfinal[i];
  return l;
}

TEST(SsdAroundGradient, MatchesFiniteDifferencesOfItsForward) {
  const int chunk = 8;
  for (const Around& what : kRequests) {
    SCOPED_TRACE(what.name());
    const AroundCase c = make_around_case({2, 23, 4, 5, 2, 3}, what, 9100);
    const Views<double> v(c);
    const auto g = run_around_backward(v, around_options(what, chunk, kdnn::KernelForm::automatic),
                                       DeviceView<double****>(), SingleRank());
    struct Input {
      Vec AroundCase::*field;
      Vec SsdCase::*case_field;
      const Vec* gradient;
      const char* name;
    };
    std::vector<Input> inputs = {{nullptr, &SsdCase::dt, &g.ddt, "dt"},
                                 {nullptr, &SsdCase::x, &g.dx, "x"}};
    if (what.bias) inputs.push_back({&AroundCase::dt_bias, nullptr, &g.ddt_bias, "dt_bias"});
    if (what.gate) inputs.push_back({&AroundCase::z, nullptr, &g.dz, "z"});
    for (const Input& in : inputs) {
      SCOPED_TRACE(in.name);
      const auto field = [&](AroundCase& k) -> Vec& {
        return in.field ? k.*in.field : k.a.*in.case_field;
      };
      AroundCase plus = c, minus = c;
      const Vec dir = normal(field(plus).size(), 4343);
      const double eps = 1e-6;
      for (std::size_t i = 0; i < dir.size(); ++i) {
        field(plus)[i] += eps * dir[i];
        field(minus)[i] -= eps * dir[i];
      }
      const double fd = (loss(plus, chunk) - loss(minus, chunk)) / (2 * eps);
      double exact = 0;
      for (std::size_t i = 0; i < dir.size(); ++i) exact += (*in.gradient)[i] * dir[i];
      EXPECT_NEAR(exact, fd, 1e-6 * (std::abs(fd) + 1));
    }
  }
}

TEST(SsdAroundErrors, BadArgumentsAreNamed) {
  using T = double;
  const SsdShape s{1, 6, 2, 3, 1, 2};
  const AroundCase c = make_around_case(s, {true, 0, kInf, true, true}, 11);
  const Views<T> v(c);
  const auto fwd =
      [&](const std::function<void(ssm::SsdForward<T, Space>&, ssm::SsdOptions&)>& edit) {
        ssm::SsdForward<T, Space> args;
        v.set_inputs(args);
        args.y = v.like_x("y");
        ssm::SsdOptions opts = around_options(c.what, 4, kdnn::KernelForm::automatic);
        edit(args, opts);
        ssm::ssd_forward(Space(), args, opts);
      };
  EXPECT_KDNN_ERROR(fwd([](auto& a, auto&) { a.dt_bias = DeviceView<T*>("b", 3); }),
                    "dt_bias has extent(0)=3, expected 2");
  EXPECT_KDNN_ERROR(fwd([&](auto& a, auto&) { a.z = DeviceView<T****>("z", 1, 5, 2, 3); }),
                    "z has extent(1)=5, expected 6");
  EXPECT_KDNN_ERROR(fwd([](auto&, auto& o) { o.dt_min = 1, o.dt_max = 0.5; }),
                    "opts.dt_min=1, opts.dt_max=0.5, expected dt_min <= dt_max");
  EXPECT_KDNN_ERROR(fwd([](auto&, auto& o) { o.dt_max = std::nan(""); }), "(no NaN)");
  EXPECT_KDNN_ERROR(fwd([&](auto& a, auto&) {
                      a.z = {};
                      a.y_ungated = v.like_x("yu");
                    }),
                    "y_ungated is given without z");
  EXPECT_KDNN_ERROR(fwd([&](auto& a, auto&) { a.y_ungated = a.y; }),
                    "outputs y and y_ungated overlap");
  EXPECT_KDNN_ERROR(
      fwd([&](auto& a, auto&) { a.y = DeviceView<T****>(const_cast<T*>(v.z.data()), 1, 6, 2, 3); }),
      "output y overlaps input z");
  // check_dt applies to the step sizes after the transform: the identity
  // with a lower limit of −1 lets a negative step through to the check.
  EXPECT_KDNN_ERROR(fwd([](auto& a, auto& o) {
                      a.dt_bias = {};
                      o.dt_softplus = false, o.dt_min = -1, o.check_dt = true;
                    }),
                    "expected dt >= 0 (check_dt)");
  // The pieces take the step sizes themselves.
  ssm::SsdForward<T, Space> plain;
  v.set_inputs(plain);
  plain.y = v.like_x("y");
  EXPECT_KDNN_ERROR(
      ssm::ssd_diag(Space(), plain, around_options(c.what, 4, kdnn::KernelForm::host)),
      "ssm::ssd_diag: opts.dt_softplus=1");
  EXPECT_KDNN_ERROR(ssm::ssd_diag(Space(), plain, ssm::SsdOptions()),
                    "dt_bias or z is given, expected neither");

  const auto bwd = [&](const std::function<void(ssm::SsdBackward<T, Space>&)>& edit) {
    ssm::SsdBackward<T, Space> args;
    v.set_inputs(args);
    args.dy = v.dy;
    args.dx = v.like_x("dx"), args.dz = v.like_x("dz");
    args.ddt = DeviceView<T***>("ddt", s.B, s.L, s.H);
    args.dA = DeviceView<T*>("dA", s.H);
    args.dB = DeviceView<T****>("dB", s.B, s.L, s.G, s.N);
    args.dC = DeviceView<T****>("dC", s.B, s.L, s.G, s.N);
    edit(args);
    ssm::ssd_backward(Space(), args, around_options(c.what, 4, kdnn::KernelForm::automatic));
  };
  EXPECT_KDNN_ERROR(bwd([](auto& a) { a.dz = {}; }), "dz has extent(0)=0, expected 1");
  EXPECT_KDNN_ERROR(bwd([](auto& a) {
                      a.dt_bias = {};
                      a.ddt_bias = DeviceView<T*>("db", 2);
                    }),
                    "ddt_bias is given without dt_bias");
  EXPECT_KDNN_ERROR(bwd([](auto& a) { a.z = {}; }), "dz is given without z");
  EXPECT_KDNN_ERROR(bwd([&](auto& a) { a.dz = DeviceView<T****>(a.dx.data(), 1, 6, 2, 3); }),
                    "outputs dx and dz overlap");
}

}  // namespace
