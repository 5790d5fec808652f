#pragma once
// kdnn::sinkhorn — batched Sinkhorn–Knopp normalisation of n×n matrices (the
// mHC residual-mixing operator) and its backward.
//
// Forward (the reference's order): P = exp(X); `iters` times divide by the
// column sums (sum over dim -2), then by the row sums (dim -1). The first
// iteration runs in double with max-shifted exponentials (in the log domain
// for a row that would underflow), so any finite X is safe from overflow and
// underflow; later iterations update two scaling vectors, R = diag(u) P diag(v).
//
// Backward, for G = dL/dR:
//  * implicit (default): implicit differentiation of the balancing
//    conditions R1 = 1, Rᵀ1 = 1. With W = G∘R, s_r = W1, s_c = Wᵀ1, solve
//    (I − RᵀR) v = s_c − Rᵀs_r by matrix-free CG (Sp = p − Rᵀ(Rp)) restricted
//    to 1⊥ (the null space of I − RᵀR is span{1}), u = s_r − Rv, and
//    dX = (G − u1ᵀ − 1vᵀ)∘R. Needs only R and G.
//  * block: CG on the 2n×2n system [[I, R], [Rᵀ, I]] [u; v] = [s_r; s_c]
//    (the reference's baseline), restricted to [1; −1]⊥. For comparison.
//  * unrolled (backward_unrolled): exact reverse mode through the `iters`
//    forward iterations, i.e. what autograd returns even when the forward has
//    not converged. Needs X.
// The implicit and block methods are the gradient of the *converged* map;
// they agree with the unrolled one once the forward has converged.
#include <Kokkos_Core.hpp>

#include "kdnn/core/impl/eti.hpp"
#include "kdnn/core/impl/view_checks.hpp"
#include "kdnn/core/launch.hpp"

namespace kdnn::sinkhorn {

/// How matrices are mapped onto Kokkos teams (kdnn::Launch): a team owns
/// `tile` matrices in its scratch memory, each handled by one team thread
/// whose vector lanes split the rows/columns. 0 = chosen per backend and n.
/// They only change speed. Results are bitwise identical for any choice, with
/// one exception: on a GPU the vector length changes the order in which the
/// implicit and block backwards' CG sums dot products across lanes, so those
/// agree to rounding (tested).
using Launch = kdnn::Launch;

struct ForwardOptions {
  int iters = 20;   ///< maximum number of (column, row) iterations, >= 1
  double tol = 0;   ///< stop a matrix early once max_j |colsum_j − 1| <= tol
                    ///< (checked before each iteration; 0 = run all iters)
  Launch launch;
};

enum class Method { implicit, block };

struct BackwardOptions {
  Method method = Method::implicit;
  /// CG stops when ||r|| <= rtol ||b||. 0 = default for the type:
  /// 1e-6 for float, 1e-12 for double.
  double rtol = 0;
  /// CG iteration cap per system. 0 = default: 2n (implicit), 4n (block).
  int max_iters = 0;
  /// Implicit only. Use R's actual row sums a = R1 and column sums c = Rᵀ1
  /// instead of 1, i.e. solve (D_c − Rᵀ D_a⁻¹ R) v = s_c − Rᵀ D_a⁻¹ s_r,
  /// u = D_a⁻¹(s_r − Rv). This is the exact gradient of the balancing of P
  /// to the marginals R actually has. Use it when the forward stopped before
  /// convergence (few iterations or a loose tol): the system stays consistent
  /// and dX keeps zero row and column sums. For a converged R it equals the
  /// default.
  bool measured_marginals = false;
  Launch launch;
};

/// Optional per-matrix diagnostics; leave a view empty to skip it. Forward:
/// iterations used and final marginal error max_j |colsum_j − 1| (rows sum
/// to 1 after each iteration). Backward: CG iterations and final relative
/// residual ||r|| / ||b||.
template <class ExecSpace>
struct Report {
  using memory_space = typename ExecSpace::memory_space;
  Kokkos::View<int*, memory_space> iterations;
  Kokkos::View<double*, memory_space> error;
};

/// A batch of n×n matrices as the operators take them.
template <class T, class ExecSpace>
using Batch = Kokkos::View<T***, Kokkos::LayoutRight, typename ExecSpace::memory_space>;

// Every Sinkhorn operator's signature, written once: the declarations below,
// the `extern template`s for the pairs libkdnn compiles (core/impl/eti.hpp)
// and their instantiations in sinkhorn_eti.cpp are generated from it.
#define KDNN_SINKHORN_OPERATORS(PREFIX, ExecSpace, T)                                  \
  PREFIX void forward(const ExecSpace&, const Batch<const T, ExecSpace>&,              \
                      const Batch<T, ExecSpace>&, const ForwardOptions&,               \
                      const Report<ExecSpace>&);                                       \
  PREFIX void backward(const ExecSpace&, const Batch<const T, ExecSpace>&,             \
                       const Batch<const T, ExecSpace>&, const Batch<T, ExecSpace>&,   \
                       const BackwardOptions&, const Report<ExecSpace>&);              \
  PREFIX void backward_unrolled(const ExecSpace&, const Batch<const T, ExecSpace>&,    \
                                const Batch<const T, ExecSpace>&,                      \
                                const Batch<T, ExecSpace>&, const ForwardOptions&);

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
             const ForwardOptions& opts = {},
             const Report<ExecSpace>& report = {}) {
  KDNN_CHECK_VIEW(ExecSpace, XView, 3, "[B, n, n]", "sinkhorn::forward: X");
  KDNN_CHECK_VIEW(ExecSpace, RView, 3, "[B, n, n]", "sinkhorn::forward: R");
  KDNN_CHECK_OUTPUT(RView, "sinkhorn::forward: R");
  KDNN_CHECK_SAME_TYPE(XView, RView, "sinkhorn::forward: X and R");
  using T = typename RView::non_const_value_type;
  impl::forward<ExecSpace, T>(space, X, R, opts, report);
}

// Compile-time checks of a backward's Views: the input In (R or X, named IN),
// G and the output dX, all [B, n, n] of one scalar type.
#define KDNN_SINKHORN_CHECK_BACKWARD_VIEWS(OP, InView, IN)                \
  KDNN_CHECK_VIEW(ExecSpace, InView, 3, "[B, n, n]", OP ": " IN);          \
  KDNN_CHECK_VIEW(ExecSpace, GView, 3, "[B, n, n]", OP ": G");             \
  KDNN_CHECK_VIEW(ExecSpace, DXView, 3, "[B, n, n]", OP ": dX");           \
  KDNN_CHECK_OUTPUT(DXView, OP ": dX");                                    \
  KDNN_CHECK_SAME_TYPE(InView, DXView, OP ": " IN " and dX");              \
  KDNN_CHECK_SAME_TYPE(GView, DXView, OP ": G and dX")

/// dX from R (forward output) and G = dL/dR by the implicit (default) or
/// block method. Asynchronous on `space`.
template <class ExecSpace, class RView, class GView, class DXView>
void backward(const ExecSpace& space, const RView& R, const GView& G,
              const DXView& dX, const BackwardOptions& opts = {},
              const Report<ExecSpace>& report = {}) {
  KDNN_SINKHORN_CHECK_BACKWARD_VIEWS("sinkhorn::backward", RView, "R");
  using T = typename DXView::non_const_value_type;
  impl::backward<ExecSpace, T>(space, R, G, dX, opts, report);
}

/// dX by exact reverse mode through the forward with opts.iters iterations
/// (opts.tol must be 0: autograd differentiates a fixed iteration count).
template <class ExecSpace, class XView, class GView, class DXView>
void backward_unrolled(const ExecSpace& space, const XView& X, const GView& G,
                       const DXView& dX, const ForwardOptions& opts = {}) {
  KDNN_SINKHORN_CHECK_BACKWARD_VIEWS("sinkhorn::backward_unrolled", XView, "X");
  using T = typename DXView::non_const_value_type;
  impl::backward_unrolled<ExecSpace, T>(space, X, G, dX, opts);
}

}  // namespace kdnn::sinkhorn

// Definitions, for execution spaces and types libkdnn does not instantiate.
#include "kdnn/sinkhorn/impl/sinkhorn_impl.hpp"
