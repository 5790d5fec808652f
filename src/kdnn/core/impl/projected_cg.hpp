// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Conjugate gradient for one small symmetric positive semi-definite system
// A x = b, its vector loops given by `loops` (vector_loops.hpp: one team
// thread's vector lanes, or one thread alone). A has the one-dimensional null
// space span{w}, w_k = +1 for k < split and −1 otherwise (w = 1 for the
// implicit Sinkhorn system, [1; −1] for the block one). Every residual is
// projected onto w⊥, where A is positive definite, so rounding cannot feed
// the null space: plain CG run past convergence there grows errors along w
// (seen up to 10× in float32, n = 16).
// Stops when ||r|| <= rtol ||b|| (relative, so no bias for small |b|), on a
// non-positive curvature p·Ap (breakdown at round-off level), or at the cap.
#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/vector_loops.hpp"

namespace kdnn::impl {

struct CGResult {
  int iterations = 0;
  double relative_residual = 0;
};

/// On entry r = b; on exit x holds the solution (x is zeroed here). p and Ap
/// are work vectors. `apply(p, Ap)` must compute Ap = A p with the same kind
/// of loops as `loops`. All vectors have loops.size() entries.
template <class Loops, class T, class Apply>
KOKKOS_INLINE_FUNCTION CGResult projected_cg(const Loops& loops, int split, double rtol,
                                             int max_iters, T* x, T* r, T* p, T* Ap,
                                             const Apply& apply) {
  const int m = loops.size();
  auto sign = [&](int k) { return k < split ? T(1) : T(-1); };

  // The projection onto w⊥ is folded into the residual's norm: with
  // σ = Σ_k w_k r_k and c = σ/m, Σ_k (r_k − c w_k)² = Σ_k r_k² − σ c, so one
  // pass sums w·r and r·r (loops.two_sums: one butterfly round on lanes) and
  // the projection is applied with the next update of p. The drift along w
  // is rounding-level, so the subtraction loses nothing until r⊥ is itself
  // at rounding level (past any useful tolerance); a negative difference
  // there is zero.
  auto projected_norm = [&](T sigma, T squares) {
    const T d = squares - sigma * (sigma / T(m));
    return d < 0 ? T(0) : d;  // NaN stays NaN
  };
  auto sums = [&]() {
    return loops.template two_sums<T>([&](int k, T& s_w, T& s_r) {
      s_w += sign(k) * r[k];
      s_r += r[k] * r[k];
    });
  };

  // Project b onto w⊥ (a no-op in exact arithmetic), start from x = 0.
  auto s = sums();
  T shift = s.first / T(m);
  T rr = projected_norm(s.first, s.second);
  loops.for_each([&](int k) {
    r[k] -= sign(k) * shift;
    p[k] = r[k];
    x[k] = 0;
  });
  const T bb = rr;
  const T stop = T(rtol * rtol) * bb;

  CGResult result;
  while (rr > stop && result.iterations < max_iters) {
    apply(p, Ap);
    const T pAp = loops.template sum<T>([&](int k, T& s_p) { s_p += p[k] * Ap[k]; });
    if (!(pAp > 0)) break;
    const T alpha = rr / pAp;
    loops.for_each([&](int k) {
      x[k] += alpha * p[k];
      r[k] -= alpha * Ap[k];
    });
    s = sums();
    shift = s.first / T(m);
    const T rr_new = projected_norm(s.first, s.second);
    const T beta = rr_new / rr;
    rr = rr_new;
    loops.for_each([&](int k) {
      r[k] -= sign(k) * shift;
      p[k] = r[k] + beta * p[k];
    });
    ++result.iterations;
  }
  // NaN in b (or A) stays NaN here: it must not read as converged.
  result.relative_residual = bb == 0 ? 0.0 : compat::sqrt(double(rr) / double(bb));
  return result;
}

}  // namespace kdnn::impl
