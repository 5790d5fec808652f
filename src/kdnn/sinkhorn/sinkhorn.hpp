// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::sinkhorn — batched Sinkhorn–Knopp normalisation of n×n matrices (the
// mHC residual-mixing operator) and its backward.
//
// Forward, columns first (the default, the mHC reference's order): P = exp(X);
// `iters` times divide by the column sums (sum over dim -2), then by the row
// sums (dim -1). Rows first (Order::rows_first; TransformerEngine's and
// TileKernels' order) divides by the row sums first; it is the columns-first
// map applied to Xᵀ, transposed back. With eps > 0 (TileKernels' placement)
// the first normalisation is a softmax whose output gets + eps, and every
// later division is by (sum + eps).
//
// The first iteration runs in double with max-shifted exponentials (in the log
// domain for a row that would underflow), so any finite X, up to ±DBL_MAX, is
// safe from overflow and underflow; later iterations update two scaling
// vectors, R = diag(u) P diag(v). NaN or +inf in X, or a row or column that is
// entirely −inf, gives NaN in R and in the report (partial −inf masks are
// fine).
//
// Backward, for G = dL/dR. Which gradient each method returns:
//  * backward_unrolled: exact reverse mode through the `iters` forward
//    iterations (with the same order and eps), i.e. what autograd returns
//    through the forward as run, converged or not. Needs X. This is the
//    gradient mHC training uses.
//  * backward, Method::implicit (default): implicit differentiation of the
//    balancing conditions of R, matrix-free CG on an n×n system. Needs only R
//    and G. With Marginals::measured (default) it is the exact gradient of
//    balancing P = exp(X) to the row and column sums R actually has: well
//    posed for any R, and equal to the converged map's gradient when R has
//    converged. With Marginals::unit it assumes R1 = Rᵀ1 = 1, which is
//    inconsistent (and CG may diverge) when R has not converged: kept for
//    comparison with the reference's formulation.
//  * backward, Method::block: CG on the 2n×2n system [[D_a, R], [Rᵀ, D_c]]
//    (the reference's baseline), same marginals choice. For comparison.
// Implicit and block equal the unrolled gradient only in the limit of
// convergence; the report's marginal_error says how far R is from it.
#include <Kokkos_Core.hpp>

#include "kdnn/core/impl/eti.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/impl/view_checks.hpp"
#include "kdnn/core/launch.hpp"
#include "kdnn/sinkhorn/report.hpp"

namespace kdnn::sinkhorn {

/// How matrices are mapped onto Kokkos teams (kdnn::Launch): a team owns
/// `tile` matrices in its scratch memory, each handled by one team thread
/// whose vector lanes split the rows/columns. 0 = chosen per backend and n.
/// They only change speed. Results are bitwise identical for any choice, with
/// one exception: on a GPU the vector length changes the order in which the
/// implicit and block backwards' CG sums dot products across lanes, so those
/// agree to rounding (tested).
///
/// launch.form: the forward and the three backwards have GPU forms (chosen
/// by KernelForm::automatic on a GPU backend, or by KernelForm::gpu
/// anywhere): for n <= 4 the thread form, one thread per matrix in
/// registers; for n in {8, 16, 32} the lane form, a matrix per n vector
/// lanes, each keeping a row and a column; other n run the host form. The
/// forward's and the implicit and block backwards' GPU forms do the host
/// form's operations in the same order, so the two are bitwise identical on
/// a host backend and agree to rounding on a GPU, where the compiler may
/// fuse multiply-adds differently (the backwards: to the CG tolerance, which
/// amplifies rounding by the system's conditioning; tested). The unrolled
/// backward's GPU forms sum the gradient's rank-1 terms in double, so they
/// agree with the host form to the host form's accuracy, not bitwise
/// (tested); its lane form runs where its 2·iters scaling vectors fit
/// on-chip (else the host form runs), its thread form everywhere. The lane
/// form picks its own vector length (n) and tile, and launch.team_size, if
/// set, is its number of matrices per team; the thread forms take no vector
/// length, and only the unrolled one a tile (matrices per team) and team
/// size. Requests are checked whichever form runs.
using Launch = kdnn::Launch;

/// Which marginal the first normalisation of an iteration enforces.
enum class Order {
  columns_first,  ///< column sums, then row sums (the mHC reference; default)
  rows_first,     ///< row sums, then column sums (TransformerEngine, TileKernels)
};

struct ForwardOptions {
  int iters = 20;  ///< maximum number of iterations (two normalisations each), >= 1
  double tol = 0;  ///< stop a matrix early once the marginal that the next
                   ///< normalisation fixes is within tol of 1 (checked before
                   ///< each iteration; 0 = run all iters)
  Order order = Order::columns_first;
  /// TileKernels' regulariser: the first (softmax) normalisation's output
  /// gets + eps and every later division is by (sum + eps). 0 = plain
  /// Sinkhorn. Finite, in [0, 1].
  double eps = 0;
  Launch launch;
  /// Refuse a NaN or an infinity in X (and, in backward_unrolled, in G),
  /// naming the first: a reduction the host waits for. Without it they
  /// propagate, as in PyTorch (docs/api.md).
  bool check_finite = false;
};

enum class Method { implicit, block };

/// The row and column sums the implicit and block backwards balance to.
enum class Marginals {
  measured,  ///< a = R1, c = Rᵀ1 of the R given (default; consistent for any R)
  unit,      ///< a = c = 1 (the reference's formulation; needs a converged R)
};

struct BackwardOptions {
  Method method = Method::implicit;
  /// With a = R1 and c = Rᵀ1 measured, the implicit method solves
  /// (D_c − Rᵀ D_a⁻¹ R) v = s_c − Rᵀ D_a⁻¹ s_r, u = D_a⁻¹(s_r − Rv): a
  /// consistent system whose dX has zero row and column sums.
  Marginals marginals = Marginals::measured;
  /// CG stops when ||r|| <= rtol ||b||. 0 = default for the type:
  /// 1e-6 for float, 1e-12 for double.
  double rtol = 0;
  /// CG iteration cap per system. 0 = default: 2n (implicit), 4n (block).
  int max_iters = 0;
  Launch launch;
  /// Refuse a NaN or an infinity in R or G, naming the first (as
  /// ForwardOptions::check_finite).
  bool check_finite = false;
};

/// The default CG rtol of BackwardOptions for scalar type T.
template <class T>
constexpr double default_rtol() {
  return sizeof(T) == 4 ? 1e-6 : 1e-12;
}

/// A batch of n×n matrices as the operators take them.
template <class T, class ExecSpace>
using Batch = Kokkos::View<T***, Kokkos::LayoutRight, typename ExecSpace::memory_space>;

// Every Sinkhorn operator's signature, written once: the declarations below,
// the `extern template`s for the pairs libkdnn compiles (core/impl/eti.hpp)
// and their instantiations in sinkhorn_eti.cpp are generated from it.
#define KDNN_SINKHORN_OPERATORS(PREFIX, ExecSpace, T)                                         \
  PREFIX void forward(const ExecSpace&, const Batch<const T, ExecSpace>&,                     \
                      const Batch<T, ExecSpace>&, const ForwardOptions&,                      \
                      const Report<ExecSpace>&);                                              \
  PREFIX void backward(const ExecSpace&, const Batch<const T, ExecSpace>&,                    \
                       const Batch<const T, ExecSpace>&, const Batch<T, ExecSpace>&,          \
                       const BackwardOptions&, const Report<ExecSpace>&);                     \
  PREFIX void backward_unrolled(const ExecSpace&, const Batch<const T, ExecSpace>&,           \
                                const Batch<const T, ExecSpace>&, const Batch<T, ExecSpace>&, \
                                const ForwardOptions&);                                       \
  PREFIX void check_backward_unrolled(const ExecSpace&, const Batch<const T, ExecSpace>&,     \
                                      const ForwardOptions&);

namespace impl {
KDNN_SINKHORN_OPERATORS(KDNN_TEMPLATE_EXEC_SPACE_T, ExecSpace, T)
#define KDNN_SINKHORN_EXTERN(ExecSpace, T) KDNN_SINKHORN_OPERATORS(extern template, ExecSpace, T)
KDNN_ETI_FOR_EACH(KDNN_SINKHORN_EXTERN)
#undef KDNN_SINKHORN_EXTERN
}  // namespace impl

/// R = Sinkhorn(exp(X)). X, R: [B, n, n], LayoutRight, float or double, in
/// the memory space of `space`. Asynchronous on `space`; throws kdnn::Error on
/// invalid arguments.
template <class ExecSpace, class XView, class RView>
void forward(const ExecSpace& space, const XView& X, const RView& R,
             const ForwardOptions& opts = {}, const Report<ExecSpace>& report = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  KDNN_CHECK_VIEW(ExecSpace, XView, 3, "[B, n, n]", "sinkhorn::forward: X");
  KDNN_CHECK_VIEW(ExecSpace, RView, 3, "[B, n, n]", "sinkhorn::forward: R");
  KDNN_CHECK_OUTPUT(RView, "sinkhorn::forward: R");
  KDNN_CHECK_SAME_TYPE(XView, RView, "sinkhorn::forward: X and R");
  using T = typename RView::non_const_value_type;
  impl::forward<ExecSpace, T>(space, X, R, opts, report);
}

// Compile-time checks of a backward's Views: the input In (R or X, named IN),
// G and the output dX, all [B, n, n] of one scalar type.
#define KDNN_SINKHORN_CHECK_BACKWARD_VIEWS(OP, InView, IN)        \
  KDNN_CHECK_VIEW(ExecSpace, InView, 3, "[B, n, n]", OP ": " IN); \
  KDNN_CHECK_VIEW(ExecSpace, GView, 3, "[B, n, n]", OP ": G");    \
  KDNN_CHECK_VIEW(ExecSpace, DXView, 3, "[B, n, n]", OP ": dX");  \
  KDNN_CHECK_OUTPUT(DXView, OP ": dX");                           \
  KDNN_CHECK_SAME_TYPE(InView, DXView, OP ": " IN " and dX");     \
  KDNN_CHECK_SAME_TYPE(GView, DXView, OP ": G and dX")

/// dX from R (forward output) and G = dL/dR by the implicit (default) or
/// block method. Asynchronous on `space`.
template <class ExecSpace, class RView, class GView, class DXView>
void backward(const ExecSpace& space, const RView& R, const GView& G, const DXView& dX,
              const BackwardOptions& opts = {}, const Report<ExecSpace>& report = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  KDNN_SINKHORN_CHECK_BACKWARD_VIEWS("sinkhorn::backward", RView, "R");
  using T = typename DXView::non_const_value_type;
  impl::backward<ExecSpace, T>(space, R, G, dX, opts, report);
}

/// dX by exact reverse mode through the forward with opts.iters iterations,
/// opts.order and opts.eps (opts.tol must be 0: autograd differentiates a
/// fixed iteration count). Memory per matrix: O(n² + n·iters).
template <class ExecSpace, class XView, class GView, class DXView>
void backward_unrolled(const ExecSpace& space, const XView& X, const GView& G, const DXView& dX,
                       const ForwardOptions& opts = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  KDNN_SINKHORN_CHECK_BACKWARD_VIEWS("sinkhorn::backward_unrolled", XView, "X");
  using T = typename DXView::non_const_value_type;
  impl::backward_unrolled<ExecSpace, T>(space, X, G, dX, opts);
}

/// Throws the kdnn::Error backward_unrolled(space, X, G, dX, opts) would
/// throw for X's shape and `opts` (e.g. iters whose scaling vectors exceed
/// the backend's team scratch), without running anything: for a caller that
/// runs the forward now and the backward later (an autograd function checks
/// before its forward). G and dX are checked at the backward.
template <class ExecSpace, class XView>
void check_backward_unrolled(const ExecSpace& space, const XView& X,
                             const ForwardOptions& opts = {}) {
  KDNN_CHECK_VIEW(ExecSpace, XView, 3, "[B, n, n]", "sinkhorn::check_backward_unrolled: X");
  using T = typename XView::non_const_value_type;
  impl::check_backward_unrolled<ExecSpace, T>(space, X, opts);
}

}  // namespace kdnn::sinkhorn

// Definitions, for execution spaces and types libkdnn does not instantiate.
#include "kdnn/sinkhorn/impl/sinkhorn_impl.hpp"
