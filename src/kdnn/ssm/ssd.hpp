// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::ssm SSD: Mamba-2's selective state-space scan, computed by chunks as
// Mamba-2's state-space duality (SSD) algorithm. Per batch entry b and head h
// (of H heads in G groups; head h reads group g = h / (H/G)), with
// x [B,L,H,P], dt [B,L,H] (positive), A [H] (negative), B, C [B,L,G,N]:
//
//   h_t = exp(dt_t·A)·h_{t−1} + dt_t·x_t ⊗ B_t     (state [P, N]; h_{−1} = initial state)
//   y_t = h_t·C_t + D·x_t                           (y_t[p] = Σ_n h_t[p,n]·C_t[n])
//
// with D one value per head (D [H]) or per channel (D [H·P], mamba's
// (nheads, headdim) row-major: y_t[p] gets D[h·P + p]·x_t[p]).
//
// What mamba's mamba_chunk_scan_combined fuses around the scan, on request:
// the step sizes dt_t ← clamp(f(dt_t + dt_bias), dt_min, dt_max) with f =
// softplus (opts.dt_softplus) or the identity, before the scan (whenever
// dt_bias is given, dt_softplus is set or the limits are not (0, ∞)); and
// the gate y ← y·SiLU(z) after it (when z is given). The backward gives
// d(dt) through the transform, d(dt_bias) and dz.
//
// The sequence is cut into chunks of Q steps (the last may be shorter). With
// a_t = dt_t·A and cum_i = Σ_{k≤i} a_k inside a chunk:
//
//   Y_diag[i] = Σ_{j≤i} exp(cum_i − cum_j)·(C_i·B_j)·dt_j·x_j   (within the chunk)
//   S_c       = Σ_j exp(cum_last − cum_j)·dt_j·x_j ⊗ B_j        (chunk state from zero)
//   H_{c+1}   = exp(cum_last)·H_c + S_c,  H_0 = initial state    (state passing)
//   Y_off[i]  = exp(cum_i)·H_c·C_i,   y = Y_diag + Y_off + D·x,  final state = H_last.
//
// Packed sequences (mamba's seq_idx): with seq_idx [B, L] given, a step
// whose id differs from the previous step's starts a sequence: the state is
// reset there (h_{t−1} is not carried: every decay across the start is 0,
// exactly, not the underflow of a large exponent), so that each sequence is
// scanned as if alone. The initial state belongs to step 0's sequence, and
// the final state is the last sequence's. Any int32 ids (compared with the
// previous step's, never ordered). With one batch entry, cu_seqlens [S + 1]
// (the sequences' offsets along L, checked to agree with seq_idx: its id
// changes exactly where a sequence starts) asks for every sequence's final
// state, sequence_states [S, H, P, N] (mamba's varlen states; the state the
// scan holds after the sequence's last step, 0 for an empty sequence).
// They have no gradient: ssd_backward takes none, as mamba.
//
// The mask j ≤ i is applied before exponentiating, and every exponent is
// ≤ 0 when A ≤ 0, so decays that underflow give 0, never inf or NaN. The
// cumulative sums are kept in double, whatever T is, so that
// exp(cum_i − cum_j) does not lose the small difference of two large sums.
//
// One team per (batch entry, head, chunk) with the chunk's operands in team
// scratch; the chunk-to-chunk state pass runs in parallel over (b, h, p, n)
// with a loop over the chunks. The backward (by the adjoint recurrence,
// mirrored chunk-wise: a reverse state pass of the state gradients) gives
// dx, ddt, dA, dB, dC, dD and d(initial state) from dy and d(final state).
// Deterministic: sums over heads of a group (dB, dC) and over steps (dA, dD)
// run in a fixed order, without atomics.
#include <Kokkos_Core.hpp>
#include <limits>

#include "kdnn/core/impl/eti.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/launch.hpp"
#include "kdnn/core/tensor.hpp"

namespace kdnn::ssm {

struct SsdOptions {
  int chunk = 64;  ///< Q, steps per chunk (≥ 1); L need not be a multiple
  /// Refuse A not finite or > 0, and D or dt_bias not finite: the small
  /// parameters, copied to the host (a wait for the device).
  bool check_parameters = false;
  bool check_dt = false;  ///< refuse a negative dt (a device reduction)
  /// The chunk kernels' launch; only `form` and `allow_tf32` apply:
  /// KernelForm::gpu launches them as on a GPU anywhere: the GPU forms of
  /// the forward's and the backward's chunk kernels for P, N in {64, 128}
  /// and Q <= 256 (equal to the host forms to rounding), else the host
  /// kernels with a bounded team workspace for scratch past on-chip size
  /// (the same results). KernelForm::tensor_cores (automatic on a CUDA
  /// device of compute capability 8.0 or later) runs the GPU forms with
  /// C·Bᵀ, the chunk states (and their gradients), the output's products
  /// and the backward's dX̃, dB and dC on tensor cores:
  /// 3×TF32 in float (float32 accuracy) unless `allow_tf32` asks for one
  /// TF32 pass, FP64 in double.
  Launch launch;
  /// mamba's dt_softplus: softplus(dt + dt_bias) as the step sizes.
  bool dt_softplus = false;
  /// mamba's dt_limit: the step sizes clamped to [dt_min, dt_max] (with the
  /// transform only: see transforms_dt; (0, ∞) clamps a negative dt to 0).
  double dt_min = 0;
  double dt_max = std::numeric_limits<double>::infinity();
  /// Refuse a NaN or an infinity in any input (and the backward's dy and
  /// dfinal_state), naming the first: a reduction over each that the host
  /// waits for. Without it they propagate, as in PyTorch (docs/api.md).
  bool check_finite = false;
};

/// The arguments of ssd_forward. Optional Views may be left empty.
template <class T, class ExecSpace>
struct SsdForward {
  Tensor4<const T, ExecSpace> x;              ///< [B, L, H, P]
  Tensor3<const T, ExecSpace> dt;             ///< [B, L, H], positive (after the transform)
  Vector<const T, ExecSpace> A;               ///< [H], negative
  Tensor4<const T, ExecSpace> B;              ///< [B, L, G, N], G divides H
  Tensor4<const T, ExecSpace> C;              ///< [B, L, G, N]
  Vector<const T, ExecSpace> D;               ///< [H] or [H·P] (per channel); optional (no skip)
  Tensor4<const T, ExecSpace> initial_state;  ///< [B, H, P, N]; optional (zeros)
  Vector<const T, ExecSpace> dt_bias;         ///< [H]; optional (the transform adds 0)
  Tensor4<const T, ExecSpace> z;              ///< [B, L, H, P]; optional (no gate)
  Tensor4<T, ExecSpace> y;                    ///< output [B, L, H, P] (gated when z is given)
  Tensor4<T, ExecSpace> final_state;          ///< output [B, H, P, N]; optional
  /// output [B, L, H, P]; optional, with z only: the output before the gate,
  /// which spares the backward recomputing it.
  Tensor4<T, ExecSpace> y_ungated;
  Matrix<const int, ExecSpace> seq_idx;  ///< [B, L] packed sequences; optional
  /// [S + 1] the packed sequences' offsets (mamba's cu_seqlens), with B = 1
  /// and seq_idx: sequence s holds steps [cu_seqlens[s], cu_seqlens[s + 1]).
  /// Optional, with sequence_states only.
  Vector<const int, ExecSpace> cu_seqlens;
  /// output [S, H, P, N]: each sequence's final state (mamba's varlen
  /// states); optional, with cu_seqlens only.
  Tensor4<T, ExecSpace> sequence_states;
};

/// The arguments of ssd_backward: the forward's inputs, dy and the gradients
/// to write. dA and dD are overwritten (not accumulated).
template <class T, class ExecSpace>
struct SsdBackward {
  Tensor4<const T, ExecSpace> x;              ///< [B, L, H, P]
  Tensor3<const T, ExecSpace> dt;             ///< [B, L, H]
  Vector<const T, ExecSpace> A;               ///< [H]
  Tensor4<const T, ExecSpace> B;              ///< [B, L, G, N]
  Tensor4<const T, ExecSpace> C;              ///< [B, L, G, N]
  Vector<const T, ExecSpace> D;               ///< [H] or [H·P]; optional, as in the forward
  Tensor4<const T, ExecSpace> initial_state;  ///< [B, H, P, N]; optional, as in the forward
  Vector<const T, ExecSpace> dt_bias;         ///< [H]; optional, as in the forward
  Tensor4<const T, ExecSpace> z;              ///< [B, L, H, P]; optional, as in the forward
  /// [B, L, H, P]; optional, with z only: the forward's y_ungated (else the
  /// backward recomputes it, a forward pass).
  Tensor4<const T, ExecSpace> y_ungated;
  Tensor4<const T, ExecSpace> dy;            ///< [B, L, H, P]
  Tensor4<const T, ExecSpace> dfinal_state;  ///< [B, H, P, N]; optional (zero)
  Tensor4<T, ExecSpace> dx;                  ///< output [B, L, H, P]
  Tensor3<T, ExecSpace> ddt;                 ///< output [B, L, H] (of dt before the transform)
  Vector<T, ExecSpace> dA;                   ///< output [H]
  Tensor4<T, ExecSpace> dB;                  ///< output [B, L, G, N]
  Tensor4<T, ExecSpace> dC;                  ///< output [B, L, G, N]
  Vector<T, ExecSpace> dD;                   ///< output, D's length ([H] or [H·P]); optional
  Tensor4<T, ExecSpace> dinitial_state;      ///< output [B, H, P, N]; optional
  Vector<T, ExecSpace> ddt_bias;             ///< output [H]; optional, with dt_bias only
  Tensor4<T, ExecSpace> dz;                  ///< output [B, L, H, P]; required with z
  Matrix<const int, ExecSpace> seq_idx;      ///< [B, L]; optional, as in the forward
};

/// Whether the options ask for the transform of dt (dt_softplus set, or
/// limits other than (0, ∞)).
inline bool transforms_dt(const SsdOptions& opts) {
  return opts.dt_softplus || opts.dt_min != 0 ||
         opts.dt_max != std::numeric_limits<double>::infinity();
}

/// Whether ssd_forward and ssd_backward transform dt (dt_bias given, or the
/// options ask for it).
template <class Args>
bool transforms_dt(const Args& a, const SsdOptions& opts) {
  return a.dt_bias.extent(0) > 0 || transforms_dt(opts);
}

/// What a segment of the sequence (a rank's share) contributes to the state
/// passing: per (b, h) its total decay exp(Σ_t dt_t·A) and its final state
/// from a zero initial state. The inputs are SsdForward's x, dt, A, B, C.
template <class T, class ExecSpace>
struct SsdSummary {
  Tensor4<const T, ExecSpace> x, B, C;
  Tensor3<const T, ExecSpace> dt;
  Vector<const T, ExecSpace> A;
  Matrix<T, ExecSpace> decay;            ///< output [B, H]
  Tensor4<T, ExecSpace> local_state;     ///< output [B, H, P, N]
  Matrix<const int, ExecSpace> seq_idx;  ///< [B, L] packed sequences; optional
};

}  // namespace kdnn::ssm

#define KDNN_SSD_OPERATORS(PREFIX, ExecSpace, T)                                                   \
  PREFIX void ssd_forward(const ExecSpace&, const SsdForward<T, ExecSpace>&, const SsdOptions&);   \
  PREFIX void ssd_backward(const ExecSpace&, const SsdBackward<T, ExecSpace>&, const SsdOptions&); \
  PREFIX void ssd_summary(const ExecSpace&, const SsdSummary<T, ExecSpace>&, const SsdOptions&);   \
  PREFIX void ssd_diag(const ExecSpace&, const SsdForward<T, ExecSpace>&, const SsdOptions&);      \
  PREFIX void ssd_decay_cumsum(                                                                    \
      const ExecSpace&, const Tensor3<const T, ExecSpace>&, const Vector<const T, ExecSpace>&,     \
      const Kokkos::View<T****, Kokkos::LayoutRight, typename ExecSpace::memory_space>&,           \
      const SsdOptions&);

namespace kdnn::ssm {

namespace impl {
KDNN_SSD_OPERATORS(KDNN_TEMPLATE_EXEC_SPACE_T, ExecSpace, T)
#define KDNN_SSD_EXTERN(ExecSpace, T) KDNN_SSD_OPERATORS(extern template, ExecSpace, T)
KDNN_ETI_FOR_EACH(KDNN_SSD_EXTERN)
#undef KDNN_SSD_EXTERN
}  // namespace impl

/// y (and the final state). Asynchronous on `space` after the host-side
/// checks, which throw kdnn::Error naming the argument (with
/// opts.check_parameters, check_dt or check_finite, the checks wait for the
/// device).
template <class ExecSpace, class T>
void ssd_forward(const ExecSpace& space, const SsdForward<T, ExecSpace>& args,
                 const SsdOptions& opts = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  impl::ssd_forward<ExecSpace, T>(space, args, opts);
}

/// dx, ddt, dA, dB, dC (and dD, d(initial state)) from the forward's inputs,
/// dy (and d(final state)). Recomputes the chunk states; keeps nothing from
/// the forward.
template <class ExecSpace, class T>
void ssd_backward(const ExecSpace& space, const SsdBackward<T, ExecSpace>& args,
                  const SsdOptions& opts = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  impl::ssd_backward<ExecSpace, T>(space, args, opts);
}

/// The summary a segment contributes to the state passing (SsdSummary).
template <class ExecSpace, class T>
void ssd_summary(const ExecSpace& space, const SsdSummary<T, ExecSpace>& args,
                 const SsdOptions& opts = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  impl::ssd_summary<ExecSpace, T>(space, args, opts);
}

/// y = Y_diag + D·x: the output without the contribution of the state that
/// enters each chunk (as if every chunk started from a zero state). Reads
/// args' x, dt, A, B, C, D and writes args.y; the states are ignored.
template <class ExecSpace, class T>
void ssd_diag(const ExecSpace& space, const SsdForward<T, ExecSpace>& args,
              const SsdOptions& opts = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  impl::ssd_diag<ExecSpace, T>(space, args, opts);
}

/// out[b, h, c, i] = exp(Σ_{k≤i} dt·A over chunk c's steps k): the decay
/// from the start of chunk c to its step i ([B, H, ceil(L/Q), Q]; 0 past
/// the sequence's end in the last chunk).
template <class ExecSpace, class T>
void ssd_decay_cumsum(const ExecSpace& space, const Tensor3<const T, ExecSpace>& dt,
                      const Vector<const T, ExecSpace>& A, const Tensor4<T, ExecSpace>& out,
                      const SsdOptions& opts = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  impl::ssd_decay_cumsum<ExecSpace, T>(space, dt, A, out, opts);
}

}  // namespace kdnn::ssm

#include "kdnn/ssm/impl/ssd_impl.hpp"
