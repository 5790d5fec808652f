// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// kdnn::attention's fused (flash) attention forward and backward on
// [B, H, S, D] arrays (kdnn.flash_attention), of any strides whose last
// dimension is contiguous: flash-attn's [B, S, H, D] tensors are read and
// written in place; and its packed variable-length form
// (kdnn.flash_attention_varlen) on [T, H, D] arrays with cu_seqlens.
#include <nanobind/nanobind.h>

#include <cstdint>
#include <string>

#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/fused_attention_varlen.hpp"
#include "options.hpp"
#include "tensors.hpp"

namespace kdnn_python {

namespace at = kdnn::attention;
using namespace nb::literals;

namespace {

void forward(const StridedArray& q, const StridedArray& k, const StridedArray& v,
             const StridedArray& o, const Array& lse, const at::FusedAttentionOptions& options,
             const AttentionMaskArrays& mask, std::uintptr_t stream) {
  dispatch(q, "flash_attention: q", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    using In = kdnn::StridedTensor4<const T, Space>;
    at::fused_attention_forward(space, view_of<In>(q, "flash_attention: q"),
                                view_of<In>(k, "flash_attention: k"),
                                view_of<In>(v, "flash_attention: v"),
                                view_of<kdnn::StridedTensor4<T, Space>>(o, "flash_attention: out"),
                                view_of<kdnn::Tensor3<T, Space>>(lse, "flash_attention: lse"),
                                options, mask.views<Space>("flash_attention"));
  });
}

void backward(const StridedArray& q, const StridedArray& k, const StridedArray& v,
              const StridedArray& o, const Array& lse, const StridedArray& dout,
              const StridedArray& dq, const StridedArray& dk, const StridedArray& dv,
              const at::FusedAttentionOptions& options, const AttentionMaskArrays& mask,
              std::uintptr_t stream) {
  dispatch(q, "flash_attention backward: q", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    using In = kdnn::StridedTensor4<const T, Space>;
    using Out = kdnn::StridedTensor4<T, Space>;
    at::fused_attention_backward(
        space, view_of<In>(q, "flash_attention backward: q"),
        view_of<In>(k, "flash_attention backward: k"),
        view_of<In>(v, "flash_attention backward: v"),
        view_of<In>(o, "flash_attention backward: out"),
        view_of<kdnn::Tensor3<const T, Space>>(lse, "flash_attention backward: lse"),
        view_of<In>(dout, "flash_attention backward: grad"),
        view_of<Out>(dq, "flash_attention backward: dq"),
        view_of<Out>(dk, "flash_attention backward: dk"),
        view_of<Out>(dv, "flash_attention backward: dv"), options,
        mask.views<Space>("flash_attention"));
  });
}

/// The packing: cu_seqlens_q and cu_seqlens_k, int32 [N + 1] each.
template <class Space>
at::PackedSequences<Space> packing(const Array& cu_q, const Array& cu_k, const char* op) {
  using Ints = kdnn::Vector<const int, Space>;
  return {view_of<Ints>(cu_q, std::string(op) + ": cu_seqlens_q"),
          view_of<Ints>(cu_k, std::string(op) + ": cu_seqlens_k")};
}

void varlen_forward(const StridedArray& q, const StridedArray& k, const StridedArray& v,
                    const StridedArray& o, const Array& lse, const Array& cu_q, const Array& cu_k,
                    const at::FusedAttentionOptions& options, const AttentionMaskArrays& mask,
                    std::uintptr_t stream) {
  constexpr const char* op = "flash_attention_varlen";
  dispatch(q, "flash_attention_varlen: q", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    using In = kdnn::StridedTensor3<const T, Space>;
    at::fused_attention_varlen_forward(
        space, view_of<In>(q, "flash_attention_varlen: q"),
        view_of<In>(k, "flash_attention_varlen: k"), view_of<In>(v, "flash_attention_varlen: v"),
        view_of<kdnn::StridedTensor3<T, Space>>(o, "flash_attention_varlen: out"),
        view_of<kdnn::Matrix<T, Space>>(lse, "flash_attention_varlen: lse"),
        packing<Space>(cu_q, cu_k, op), options, mask.views<Space>(op));
  });
}

void varlen_backward(const StridedArray& q, const StridedArray& k, const StridedArray& v,
                     const StridedArray& o, const Array& lse, const StridedArray& dout,
                     const StridedArray& dq, const StridedArray& dk, const StridedArray& dv,
                     const Array& cu_q, const Array& cu_k, const at::FusedAttentionOptions& options,
                     const AttentionMaskArrays& mask, std::uintptr_t stream) {
  constexpr const char* op = "flash_attention_varlen backward";
  dispatch(q, "flash_attention_varlen backward: q", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    using In = kdnn::StridedTensor3<const T, Space>;
    using Out = kdnn::StridedTensor3<T, Space>;
    at::fused_attention_varlen_backward(
        space, view_of<In>(q, "flash_attention_varlen backward: q"),
        view_of<In>(k, "flash_attention_varlen backward: k"),
        view_of<In>(v, "flash_attention_varlen backward: v"),
        view_of<In>(o, "flash_attention_varlen backward: out"),
        view_of<kdnn::Matrix<const T, Space>>(lse, "flash_attention_varlen backward: lse"),
        view_of<In>(dout, "flash_attention_varlen backward: grad"),
        view_of<Out>(dq, "flash_attention_varlen backward: dq"),
        view_of<Out>(dk, "flash_attention_varlen backward: dk"),
        view_of<Out>(dv, "flash_attention_varlen backward: dv"), packing<Space>(cu_q, cu_k, op),
        options, mask.views<Space>(op));
  });
}

}  // namespace

// Tensors positionally, then the options (_kdnn.FusedAttentionOptions), the
// mask (_kdnn.AttentionMask) and PyTorch's stream.
void bind_attention(nb::module_& m) {
  m.def("flash_attention_forward", &forward, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a, "options"_a,
        "mask"_a, "stream"_a);
  m.def("flash_attention_backward", &backward, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a, "dout"_a,
        "dq"_a, "dk"_a, "dv"_a, "options"_a, "mask"_a, "stream"_a);
  m.def("flash_attention_varlen_forward", &varlen_forward, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a,
        "cu_seqlens_q"_a, "cu_seqlens_k"_a, "options"_a, "mask"_a, "stream"_a);
  m.def("flash_attention_varlen_backward", &varlen_backward, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a,
        "dout"_a, "dq"_a, "dk"_a, "dv"_a, "cu_seqlens_q"_a, "cu_seqlens_k"_a, "options"_a, "mask"_a,
        "stream"_a);
}

}  // namespace kdnn_python
