// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Definition of kdnn::attention::impl::fused_attention_varlen_forward and
// _backward: the packing is checked once on the host; the packed tensors
// pass the dense checks as one flat entry [1, H, T, ·] (the argument
// structs' dense()), and the dense kernels run over each sequence's own
// rows and blocks (entry_rows.hpp, row_blocks.hpp).
#include <Kokkos_Core.hpp>
#include <string>

#include "kdnn/attention/fused_attention_varlen.hpp"
#include "kdnn/attention/impl/entry_rows.hpp"
#include "kdnn/attention/impl/fused_attention_impl.hpp"
#include "kdnn/core/impl/host_filled.hpp"
#include "kdnn/core/impl/sequence_offsets.hpp"
#include "kdnn/core/validate.hpp"

namespace kdnn::attention::impl {

/// The sequences' rows, and the caller's mask with their lengths as its
/// seq_q and seq_k.
template <class ExecSpace>
struct Packing {
  EntryRows queries, keys;
  AttentionMask<ExecSpace> mask;
};

/// Checks the packing against Tq queries and Tk keys (copying the offsets
/// to the host) and the mask against its sequences and H heads.
template <class ExecSpace>
Packing<ExecSpace> packing(const char* op, const ExecSpace& space,
                           const PackedSequences<ExecSpace>& seqs, std::size_t Tq, std::size_t Tk,
                           std::size_t H, const AttentionMask<ExecSpace>& mask) {
  const auto refuse = [&](const char* name, std::size_t extent) {
    if (extent > 0) {
      fail(op, ": mask.", name, " has extent(0)=", extent,
           ", expected none (packed sequences take their lengths and positions from "
           "cu_seqlens_q and cu_seqlens_k)");
    }
  };
  refuse("seq_q", mask.seq_q.extent(0));
  refuse("seq_k", mask.seq_k.extent(0));
  refuse("lo_win", mask.lo_win.extent(0));
  refuse("hi_win", mask.hi_win.extent(0));
  if (mask.positions.query_length != -1 || mask.positions.key_length != -1) {
    fail(op,
         ": mask.positions given, expected none (packed sequences take their positions "
         "from cu_seqlens_q and cu_seqlens_k)");
  }
  if (seqs.cu_seqlens_q.extent(0) != seqs.cu_seqlens_k.extent(0)) {
    fail(op, ": seqs.cu_seqlens_k has extent(0)=", seqs.cu_seqlens_k.extent(0), ", expected ",
         seqs.cu_seqlens_q.extent(0), " (N + 1, as seqs.cu_seqlens_q)");
  }
  Packing<ExecSpace> p;
  const auto rows = [&](const char* name, const Vector<const int, ExecSpace>& cu, std::size_t total,
                        const char* what) {
    EntryRows r;
    r.offsets = kdnn::impl::host_sequence_offsets(op, name, space, cu, total, what);
    r.entries = int(r.offsets.extent(0)) - 1;
    for (int n = 0; n < r.entries; ++n) {
      const int length = r.offsets(n + 1) - r.offsets(n);
      r.extent = length > r.extent ? length : r.extent;
    }
    r.device = cu.data();
    return r;
  };
  p.queries = rows("seqs.cu_seqlens_q", seqs.cu_seqlens_q, Tq, "Tq, the packed queries");
  p.keys = rows("seqs.cu_seqlens_k", seqs.cu_seqlens_k, Tk, "Tk, the packed keys");
  check_mask(op, mask, std::size_t(p.queries.entries), std::size_t(p.queries.extent),
             std::size_t(p.keys.extent), H);
  // The lengths on the device, as the dense mask's padding lengths.
  const auto lengths = [&](const EntryRows& r, const char* label) {
    return kdnn::impl::filled_on_host(
        space,
        Vector<int, ExecSpace>(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                                                  std::string("kdnn::attention::") + label),
                               std::size_t(r.entries)),
        [&](const auto& host) {
          for (int n = 0; n < r.entries; ++n) host(n) = r.offsets(n + 1) - r.offsets(n);
        });
  };
  p.mask = mask;
  p.mask.seq_q = lengths(p.queries, "varlen_seq_q");
  p.mask.seq_k = lengths(p.keys, "varlen_seq_k");
  return p;
}

/// Checks that the packed tensors agree: q [Tq, H, D], k [Tk, Hkv, D],
/// v [Tk, Hkv, Dv], o [Tq, H, Dv], lse [H, Tq] (the number of heads, H a
/// multiple of Hkv, is checked with the dense tensors).
template <class ExecSpace, class T>
void check_packed_shapes(const char* op, const StridedTensor3<const T, ExecSpace>& q,
                         const StridedTensor3<const T, ExecSpace>& k,
                         const StridedTensor3<const T, ExecSpace>& v,
                         const StridedTensor3<const T, ExecSpace>& o,
                         const Matrix<const T, ExecSpace>& lse) {
  validate::extent(op, "k", k, 2, q.extent(2), "D, q's extent(2)");
  validate::extent(op, "v", v, 0, k.extent(0), "Tk, k's extent(0)");
  validate::extent(op, "v", v, 1, k.extent(1), "Hkv, k's extent(1)");
  validate::extent(op, "o", o, 0, q.extent(0), "Tq, q's extent(0)");
  validate::extent(op, "o", o, 1, q.extent(1), "H, q's extent(1)");
  validate::extent(op, "o", o, 2, v.extent(2), "Dv, v's extent(2)");
  validate::extent(op, "lse", lse, 0, q.extent(1), "H, q's extent(1)");
  validate::extent(op, "lse", lse, 1, q.extent(0), "Tq, q's extent(0)");
}

/// The forward's.
template <class ExecSpace, class T>
void check_packed_shapes(const char* op, const FusedAttentionVarlenForward<T, ExecSpace>& a) {
  check_packed_shapes<ExecSpace, T>(op, a.q, a.k, a.v, a.o, a.lse);
}

/// The backward's, and its gradients'. The dense checks would see the same
/// mismatches on the flat entries, but name their extents in the flat
/// layout's terms (a packed dq's extent(2) as extent(3)).
template <class ExecSpace, class T>
void check_packed_shapes(const char* op, const FusedAttentionVarlenBackward<T, ExecSpace>& a) {
  check_packed_shapes<ExecSpace, T>(op, a.q, a.k, a.v, a.o, a.lse);
  validate::same_shape(op, "dout", a.dout, "o", a.o);
  validate::same_shape(op, "dq", a.dq, "q", a.q);
  validate::same_shape(op, "dk", a.dk, "k", a.k);
  validate::same_shape(op, "dv", a.dv, "v", a.v);
}

/// The start of a packed call (forward or backward arguments `a`): checks
/// the packed tensors' shapes, then the packing (packing).
template <class ExecSpace, class Args>
Packing<ExecSpace> packed_call(const char* op, const ExecSpace& space, const Args& a) {
  check_packed_shapes(op, a);
  return packing(op, space, a.seqs, a.q.extent(0), a.k.extent(0), a.q.extent(1), a.mask);
}

/// The forward on the flat entries [1, H, T, ·] of packed tensors whose
/// rows `p` gives (checked: packing), lse [1, H, Tq]; p's mask replaces a's.
template <class ExecSpace, class T>
void packed_fused_forward(const char* op, const ExecSpace& space,
                          FusedAttentionForward<T, ExecSpace> a, const FusedAttentionOptions& opts,
                          const Packing<ExecSpace>& p) {
  a.mask = p.mask;
  const auto data =
      forward_data<ExecSpace, T>(op, space, a, opts, MaskCheck::done_by_caller, p.queries, p.keys);
  run_fused_forward<ExecSpace, T>(op, space, data, opts, p.queries, p.keys);
}

/// The same for the backward.
template <class ExecSpace, class T>
void packed_fused_backward(const char* op, const ExecSpace& space,
                           FusedAttentionBackward<T, ExecSpace> a,
                           const FusedAttentionOptions& opts, const Packing<ExecSpace>& p) {
  a.mask = p.mask;
  fused_backward_on_rows<ExecSpace, T>(op, space, a, opts, MaskCheck::done_by_caller, p.queries,
                                       p.keys);
}

template <class ExecSpace, class T>
void fused_attention_varlen_forward(const ExecSpace& space,
                                    const FusedAttentionVarlenForward<T, ExecSpace>& a,
                                    const FusedAttentionOptions& opts) {
  constexpr const char* op = "attention::fused_attention_varlen_forward";
  const Packing<ExecSpace> p = packed_call(op, space, a);
  packed_fused_forward<ExecSpace, T>(op, space, a.dense(), opts, p);
}

template <class ExecSpace, class T>
void fused_attention_varlen_backward(const ExecSpace& space,
                                     const FusedAttentionVarlenBackward<T, ExecSpace>& a,
                                     const FusedAttentionOptions& opts) {
  constexpr const char* op = "attention::fused_attention_varlen_backward";
  const Packing<ExecSpace> p = packed_call(op, space, a);
  packed_fused_backward<ExecSpace, T>(op, space, a.dense(), opts, p);
}

}  // namespace kdnn::attention::impl
