// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Tensor-core products in a team kernel (core/impl/team_mma.hpp): a team of
// four warps computes C + A·B for a [4·M, K] A and a [K, 4·N] B, each warp a
// strip of four tiles, its fragments loaded and stored through the PTX maps.
// On the CPU this runs the emulation; on a GPU build the same test runs
// mma.sync and compares the device with the host emulation: bitwise on
// integer data, within the stated bounds on random data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <tuple>
#include <vector>

#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/register_tile.hpp"
#include "kdnn/core/impl/team_mma.hpp"
#include "kdnn/core/impl/team_quads.hpp"
#include "views.hpp"

namespace {

namespace ki = kdnn::impl;
using kdnn_test::Space;
using Host = Kokkos::DefaultHostExecutionSpace;

constexpr int kWarps = 4, kTiles = 4;

/// C += A·B by one team of kWarps warps; warp w owns rows [w·M, (w + 1)·M)
/// and kTiles N-column tiles beside each other.
template <class ExecSpace, class Shape, ki::MmaPrecision P, ki::MmaOrder O = ki::MmaOrder::plain>
struct TeamProduct {
  using T = typename Shape::value_type;
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, typename ExecSpace::memory_space>;
  static constexpr int NT = 32 * kWarps;
  static constexpr bool kPrivate = ki::BackendTraits<ExecSpace>::is_gpu;
  Matrix A, B, C;  // [rows, K], [K, cols], [rows, cols]

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    ki::ThreadRegisters<T, NT, Shape::a_regs, kPrivate> a;
    ki::ThreadRegisters<T, NT, kTiles * Shape::b_regs, kPrivate> b;
    ki::ThreadRegisters<T, NT, kTiles * Shape::c_regs, kPrivate> c;
    const auto threads = [&](const auto& f) {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, NT), f);
    };
    const auto c_at = [](int t, int j, int r) {
      const ki::FragmentIndex i = Shape::c(t % 32, r);
      return ki::FragmentIndex{t / 32 * Shape::M + i.row, j * Shape::N + i.col};
    };
    threads([&](int t) {
      for (int j = 0; j < kTiles; ++j) {
        for (int r = 0; r < Shape::c_regs; ++r) {
          const ki::FragmentIndex e = c_at(t, j, r);
          c(t)[j * Shape::c_regs + r] = C(e.row, e.col);
        }
      }
    });
    for (int k0 = 0; k0 < int(A.extent(1)); k0 += Shape::K) {
      threads([&](int t) {
        const int lane = t % 32, row0 = t / 32 * Shape::M;
        for (int r = 0; r < Shape::a_regs; ++r) {
          const ki::FragmentIndex i = Shape::a(lane, r);
          a(t)[r] = A(row0 + i.row, k0 + i.col);
        }
        for (int j = 0; j < kTiles; ++j) {
          for (int r = 0; r < Shape::b_regs; ++r) {
            const ki::FragmentIndex i = Shape::b(lane, r);
            b(t)[j * Shape::b_regs + r] = B(k0 + i.row, j * Shape::N + i.col);
          }
        }
      });
      for (int j = 0; j < kTiles; ++j) {
        ki::team_mma<Shape, P, NT, kPrivate, O>(team, ki::registers_at(a, 0),
                                                ki::registers_at(b, j * Shape::b_regs),
                                                ki::registers_at(c, j * Shape::c_regs));
      }
    }
    threads([&](int t) {
      for (int j = 0; j < kTiles; ++j) {
        for (int r = 0; r < Shape::c_regs; ++r) {
          const ki::FragmentIndex e = c_at(t, j, r);
          C(e.row, e.col) = c(t)[j * Shape::c_regs + r];
        }
      }
    });
  }
};

/// Row-major data of the product's operands (rows × K, K × cols, rows × cols).
struct Operands {
  int rows, cols, K;
  std::vector<double> A, B, C;
};

template <class Shape>
Operands operands(int K, bool integers, unsigned seed) {
  Operands o{kWarps * Shape::M, kTiles * Shape::N, K, {}, {}, {}};
  const auto draw = [&](int n, unsigned s) {
    if (!integers) return kdnn_test::normal(std::size_t(n), s);
    auto x = kdnn_test::uniform(std::size_t(n), -8.0, 8.0, s);
    for (double& e : x) e = std::round(e);
    return x;
  };
  o.A = draw(o.rows * K, seed);
  o.B = draw(K * o.cols, seed + 1);
  o.C = draw(o.rows * o.cols, seed + 2);
  return o;
}

/// C + A·B by the team kernel on ExecSpace, row-major.
template <class ExecSpace, class Shape, ki::MmaPrecision P, ki::MmaOrder O = ki::MmaOrder::plain>
std::vector<double> team_product(const Operands& o) {
  using Kernel = TeamProduct<ExecSpace, Shape, P, O>;
  using T = typename Shape::value_type;
  using Memory = typename ExecSpace::memory_space;
  Kernel k;
  k.A = kdnn_test::to_view<T**, Memory>(o.A, o.rows, o.K);
  k.B = kdnn_test::to_view<T**, Memory>(o.B, o.K, o.cols);
  k.C = kdnn_test::to_view<T**, Memory>(o.C, o.rows, o.cols);
  const int team = ki::BackendTraits<ExecSpace>::is_gpu ? Kernel::NT : 1;
  Kokkos::parallel_for("kdnn_test::team_product", Kokkos::TeamPolicy<ExecSpace>(1, team), k);
  return kdnn_test::to_host(k.C);
}

/// Per element: C + A·B summed in long double (the products of two
/// doubles exactly where it has 64 mantissa bits), and Σ|a||b| + |c|, the
/// scale of the products' rounding errors.
void exact_product(const Operands& o, std::vector<double>& exact, std::vector<double>& scale) {
  exact.resize(o.C.size());
  scale.resize(o.C.size());
  for (int i = 0; i < o.rows; ++i) {
    for (int j = 0; j < o.cols; ++j) {
      const std::size_t e = std::size_t(i) * o.cols + j;
      long double sum = o.C[e], size = std::fabs(o.C[e]);
      for (int k = 0; k < o.K; ++k) {
        const long double p = (long double)o.A[std::size_t(i) * o.K + k] *
                              (long double)o.B[std::size_t(k) * o.cols + j];
        sum += p;
        size += std::fabs(p);
      }
      exact[e] = double(sum);
      scale[e] = double(size);
    }
  }
}

/// The largest |x − exact| / scale.
double worst_error(const std::vector<double>& x, const std::vector<double>& exact,
                   const std::vector<double>& scale) {
  double worst = 0;
  for (std::size_t e = 0; e < x.size(); ++e) {
    worst = std::fmax(worst, std::fabs(x[e] - exact[e]) / scale[e]);
  }
  return worst;
}

template <class Shape, ki::MmaPrecision P>
void expect_exact_on_integers() {
  for (unsigned seed : {1u, 7u, 19u}) {
    const Operands o = operands<Shape>(48, true, seed);
    std::vector<double> exact, scale;
    exact_product(o, exact, scale);
    const auto device = team_product<Space, Shape, P>(o);
    const auto host = team_product<Host, Shape, P>(o);
    for (std::size_t e = 0; e < exact.size(); ++e) {
      ASSERT_EQ(device[e], exact[e]) << "element " << e << ", seed " << seed;
      ASSERT_EQ(host[e], exact[e]) << "element " << e << ", seed " << seed;
    }
  }
}

TEST(TeamMma, IntegerProductsAreExactOnTheDeviceAndInTheEmulation) {
  expect_exact_on_integers<ki::MmaTf32M16N8K8, ki::MmaPrecision::full>();
  expect_exact_on_integers<ki::MmaTf32M16N8K8, ki::MmaPrecision::tf32>();
  expect_exact_on_integers<ki::MmaF64M8N8K4, ki::MmaPrecision::full>();
}

// Random data, K = 256: the error of each path relative to Σ|a||b| + |c|.
// 3×TF32 drops small·small and rounds the small parts (3·2⁻²² of each
// product) and rounds the float accumulator once per product step; one TF32
// pass rounds both operands (2·2⁻¹¹); float64 rounds at most twice per
// term. The device and the emulation each stay within the bound.
TEST(TeamMma, RandomProductsStayWithinTheirPrecisionsBounds) {
  const int K = 256;
  using Tf32 = ki::MmaTf32M16N8K8;
  using F64 = ki::MmaF64M8N8K4;
  const double steps = double(K) / Tf32::K;
  const double full_bound = 3 * 0x1p-22 + 3 * steps * 0x1p-24;
  const double tf32_bound = 2 * 0x1p-11 + 3 * steps * 0x1p-24;
  const double f64_bound = 2 * (K + 4) * 0x1p-53;

  const Operands o = operands<Tf32>(K, false, 31);
  std::vector<double> exact, scale;
  exact_product(o, exact, scale);
  double worst_full = 0, worst_tf32 = 0;
  for (const auto& [name, full, tf32] :
       {std::tuple{"device", team_product<Space, Tf32, ki::MmaPrecision::full>(o),
                   team_product<Space, Tf32, ki::MmaPrecision::tf32>(o)},
        std::tuple{"emulation", team_product<Host, Tf32, ki::MmaPrecision::full>(o),
                   team_product<Host, Tf32, ki::MmaPrecision::tf32>(o)}}) {
    SCOPED_TRACE(name);
    const double e_full = worst_error(full, exact, scale);
    const double e_tf32 = worst_error(tf32, exact, scale);
    EXPECT_LE(e_full, full_bound);
    EXPECT_LE(e_tf32, tf32_bound);
    EXPECT_GT(e_tf32, 8 * e_full);  // one pass really is the coarser product
    worst_full = std::fmax(worst_full, e_full);
    worst_tf32 = std::fmax(worst_tf32, e_tf32);
  }
  char text[64];
  std::snprintf(text, sizeof text, "%.3g", worst_full);
  RecordProperty("worst_3xtf32", text);
  std::snprintf(text, sizeof text, "%.3g", worst_tf32);
  RecordProperty("worst_tf32", text);

  const Operands d = operands<F64>(K, false, 37);
  exact_product(d, exact, scale);
  EXPECT_LE(worst_error(team_product<Space, F64, ki::MmaPrecision::full>(d), exact, scale),
            f64_bound);
  EXPECT_LE(worst_error(team_product<Host, F64, ki::MmaPrecision::full>(d), exact, scale),
            f64_bound);
}

/// The operands of Cᵀ + Bᵀ·Aᵀ in a product of o's shape: its first
/// o.cols rows and columns are the transposed product's, the rest zero.
Operands transposed(const Operands& o) {
  Operands t{o.rows,
             o.cols,
             o.K,
             std::vector<double>(o.A.size()),
             std::vector<double>(o.B.size()),
             std::vector<double>(o.C.size())};
  for (int j = 0; j < o.cols; ++j) {
    for (int k = 0; k < o.K; ++k) {
      t.A[std::size_t(j) * o.K + k] = o.B[std::size_t(k) * o.cols + j];  // Bᵀ's row j
      t.B[std::size_t(k) * o.cols + j] = o.A[std::size_t(j) * o.K + k];  // Aᵀ's column j
    }
    for (int i = 0; i < o.cols; ++i) {
      t.C[std::size_t(j) * o.cols + i] = o.C[std::size_t(i) * o.cols + j];
    }
  }
  return t;
}

/// How many (i, j), i, j < o.cols, of `plain` (C + A·B) differ from
/// element (j, i) of `swapped` (Cᵀ + Bᵀ·Aᵀ).
int transpose_mismatches(const Operands& o, const std::vector<double>& plain,
                         const std::vector<double>& swapped) {
  int n = 0;
  for (int i = 0; i < o.cols; ++i) {
    for (int j = 0; j < o.cols; ++j) {
      n += plain[std::size_t(i) * o.cols + j] != swapped[std::size_t(j) * o.cols + i];
    }
  }
  return n;
}

// MmaOrder::transposed makes Cᵀ + Bᵀ·Aᵀ bitwise the transpose of C + A·B
// (what lets the backward recompute the forward's scores as Sᵀ = K·Qᵀ).
// 3×TF32 adds a step's two small products into a zeroed fragment before the
// big one, so their order moves a step's sum only far below its last bit and
// the plain order mostly agrees as well; the transposed order makes it exact
// whatever the hardware's summation.
template <class ExecSpace>
void expect_transposed_order_is_bitwise() {
  using Tf32 = ki::MmaTf32M16N8K8;
  using F64 = ki::MmaF64M8N8K4;
  constexpr auto full = ki::MmaPrecision::full, tf32 = ki::MmaPrecision::tf32;
  constexpr auto swap = ki::MmaOrder::transposed;
  const Operands o = operands<Tf32>(64, false, 43);
  const Operands t = transposed(o);
  const auto plain = team_product<ExecSpace, Tf32, full>(o);
  EXPECT_EQ(transpose_mismatches(o, plain, team_product<ExecSpace, Tf32, full, swap>(t)), 0);
  EXPECT_EQ(transpose_mismatches(o, team_product<ExecSpace, Tf32, tf32>(o),
                                 team_product<ExecSpace, Tf32, tf32, swap>(t)),
            0);
  const Operands d = operands<F64>(64, false, 47);
  EXPECT_EQ(transpose_mismatches(d, team_product<ExecSpace, F64, full>(d),
                                 team_product<ExecSpace, F64, full, swap>(transposed(d))),
            0);
}

TEST(TeamMma, TransposedOrderGivesTheTransposeBitwise) {
  {
    SCOPED_TRACE("device");
    expect_transposed_order_is_bitwise<Space>();
  }
  SCOPED_TRACE("emulation");
  expect_transposed_order_is_bitwise<Host>();
}

/// Each thread's R registers reduced over its quad, max and sum.
template <class ExecSpace>
struct QuadReduction {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Values = Kokkos::View<double**, Kokkos::LayoutRight, typename ExecSpace::memory_space>;
  static constexpr int NT = 64, R = 3;
  static constexpr bool kPrivate = ki::BackendTraits<ExecSpace>::is_gpu;
  Values in, max_out, sum_out;  // [NT, R]

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    ki::ThreadRegisters<double, NT, 2 * R, kPrivate> x;
    const auto threads = [&](const auto& f) {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, NT), f);
    };
    threads([&](int t) {
      for (int r = 0; r < R; ++r) x(t)[r] = x(t)[R + r] = in(t, r);
    });
    ki::team_quad_reduce<R>(team, x, 0, [](double a, double b) { return a > b ? a : b; });
    ki::team_quad_reduce<R>(team, x, R, [](double a, double b) { return a + b; });
    threads([&](int t) {
      for (int r = 0; r < R; ++r) max_out(t, r) = x(t)[r], sum_out(t, r) = x(t)[R + r];
    });
  }
};

template <class ExecSpace>
void expect_quad_reductions(const std::vector<double>& values) {
  using Kernel = QuadReduction<ExecSpace>;
  using Memory = typename ExecSpace::memory_space;
  constexpr int NT = Kernel::NT, R = Kernel::R;
  Kernel k;
  k.in = kdnn_test::to_view<double**, Memory>(values, NT, R);
  k.max_out = typename Kernel::Values("max", NT, R);
  k.sum_out = typename Kernel::Values("sum", NT, R);
  const int team = ki::BackendTraits<ExecSpace>::is_gpu ? NT : 1;
  Kokkos::parallel_for("kdnn_test::quad_reduction", Kokkos::TeamPolicy<ExecSpace>(1, team), k);
  const auto mx = kdnn_test::to_host(k.max_out), sum = kdnn_test::to_host(k.sum_out);
  for (int t = 0; t < NT; ++t) {
    for (int r = 0; r < R; ++r) {
      const auto at = [&](int lane) { return values[std::size_t(t / 4 * 4 + lane) * R + r]; };
      // Bitwise (x0 + x1) + (x2 + x3) on every lane of the quad.
      EXPECT_EQ(sum[std::size_t(t) * R + r], (at(0) + at(1)) + (at(2) + at(3))) << t;
      EXPECT_EQ(mx[std::size_t(t) * R + r],
                std::fmax(std::fmax(at(0), at(1)), std::fmax(at(2), at(3))))
          << t;
    }
  }
}

TEST(TeamQuads, EveryLaneOfAQuadGetsItsQuadsReduction) {
  const auto values = kdnn_test::normal(std::size_t(QuadReduction<Host>::NT) * 3, 5);
  expect_quad_reductions<Space>(values);
  expect_quad_reductions<Host>(values);
}

}  // namespace
