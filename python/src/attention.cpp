// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// kdnn::attention's fused (flash) attention forward and backward on
// [B, H, S, D] arrays (kdnn.flash_attention), of any strides whose last
// dimension is contiguous: flash-attn's [B, S, H, D] tensors are read and
// written in place; and its packed variable-length form
// (kdnn.flash_attention_varlen) on [T, H, D] arrays with cu_seqlens.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

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
             const StridedArray& o, const Array& lse, const Optional& sinks,
             const at::FusedAttentionOptions& options, const AttentionMaskArrays& mask,
             std::uintptr_t stream) {
  constexpr const char* op = "flash_attention";
  dispatch(q, "flash_attention: q", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    using In = kdnn::StridedTensor4<const T, Space>;
    const auto name = [&](const char* array) { return std::string(op) + ": " + array; };
    at::fused_attention_forward(
        space,
        at::FusedAttentionForward<T, Space>{
            view_of<In>(q, name("q")), view_of<In>(k, name("k")), view_of<In>(v, name("v")),
            view_of<kdnn::StridedTensor4<T, Space>>(o, name("out")),
            view_of<kdnn::Tensor3<T, Space>>(lse, name("lse")), mask.views<Space>(op),
            view_of<kdnn::Vector<const T, Space>>(sinks, name("sinks"))},
        options);
  });
}

void backward(const StridedArray& q, const StridedArray& k, const StridedArray& v,
              const StridedArray& o, const Array& lse, const StridedArray& dout,
              const StridedArray& dq, const StridedArray& dk, const StridedArray& dv,
              const Optional& sinks, const Optional& dsinks,
              const at::FusedAttentionOptions& options, const AttentionMaskArrays& mask,
              std::uintptr_t stream) {
  constexpr const char* op = "flash_attention backward";
  dispatch(q, "flash_attention backward: q", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    using In = kdnn::StridedTensor4<const T, Space>;
    using Out = kdnn::StridedTensor4<T, Space>;
    const auto name = [&](const char* array) { return std::string(op) + ": " + array; };
    at::fused_attention_backward(
        space,
        at::FusedAttentionBackward<T, Space>{
            view_of<In>(q, name("q")), view_of<In>(k, name("k")), view_of<In>(v, name("v")),
            view_of<In>(o, name("out")), view_of<kdnn::Tensor3<const T, Space>>(lse, name("lse")),
            view_of<In>(dout, name("grad")), view_of<Out>(dq, name("dq")),
            view_of<Out>(dk, name("dk")), view_of<Out>(dv, name("dv")),
            mask.views<Space>("flash_attention"),
            view_of<kdnn::Vector<const T, Space>>(sinks, name("sinks")),
            view_of<kdnn::Vector<T, Space>>(dsinks, name("dsinks"))},
        options);
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
                    const Optional& sinks, const at::FusedAttentionOptions& options,
                    const AttentionMaskArrays& mask, std::uintptr_t stream) {
  constexpr const char* op = "flash_attention_varlen";
  dispatch(q, "flash_attention_varlen: q", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    using In = kdnn::StridedTensor3<const T, Space>;
    const auto name = [&](const char* array) { return std::string(op) + ": " + array; };
    at::fused_attention_varlen_forward(
        space,
        at::FusedAttentionVarlenForward<T, Space>{
            view_of<In>(q, name("q")), view_of<In>(k, name("k")), view_of<In>(v, name("v")),
            view_of<kdnn::StridedTensor3<T, Space>>(o, name("out")),
            view_of<kdnn::Matrix<T, Space>>(lse, name("lse")), packing<Space>(cu_q, cu_k, op),
            mask.views<Space>(op), view_of<kdnn::Vector<const T, Space>>(sinks, name("sinks"))},
        options);
  });
}

void varlen_backward(const StridedArray& q, const StridedArray& k, const StridedArray& v,
                     const StridedArray& o, const Array& lse, const StridedArray& dout,
                     const StridedArray& dq, const StridedArray& dk, const StridedArray& dv,
                     const Array& cu_q, const Array& cu_k, const Optional& sinks,
                     const Optional& dsinks, const at::FusedAttentionOptions& options,
                     const AttentionMaskArrays& mask, std::uintptr_t stream) {
  constexpr const char* op = "flash_attention_varlen backward";
  dispatch(q, "flash_attention_varlen backward: q", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    using In = kdnn::StridedTensor3<const T, Space>;
    using Out = kdnn::StridedTensor3<T, Space>;
    const auto name = [&](const char* array) { return std::string(op) + ": " + array; };
    at::fused_attention_varlen_backward(
        space,
        at::FusedAttentionVarlenBackward<T, Space>{
            view_of<In>(q, name("q")), view_of<In>(k, name("k")), view_of<In>(v, name("v")),
            view_of<In>(o, name("out")), view_of<kdnn::Matrix<const T, Space>>(lse, name("lse")),
            view_of<In>(dout, name("grad")), view_of<Out>(dq, name("dq")),
            view_of<Out>(dk, name("dk")), view_of<Out>(dv, name("dv")),
            packing<Space>(cu_q, cu_k, op), mask.views<Space>(op),
            view_of<kdnn::Vector<const T, Space>>(sinks, name("sinks")),
            view_of<kdnn::Vector<T, Space>>(dsinks, name("dsinks"))},
        options);
  });
}

}  // namespace

// Tensors positionally (the sinks [H] and their gradient: None for none),
// then the options (_kdnn.FusedAttentionOptions), the mask
// (_kdnn.AttentionMask) and PyTorch's stream.
void bind_attention(nb::module_& m) {
  m.def("flash_attention_forward", &forward, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a, "sinks"_a.none(),
        "options"_a, "mask"_a, "stream"_a);
  m.def("flash_attention_backward", &backward, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a, "dout"_a,
        "dq"_a, "dk"_a, "dv"_a, "sinks"_a.none(), "dsinks"_a.none(), "options"_a, "mask"_a,
        "stream"_a);
  m.def("flash_attention_varlen_forward", &varlen_forward, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a,
        "cu_seqlens_q"_a, "cu_seqlens_k"_a, "sinks"_a.none(), "options"_a, "mask"_a, "stream"_a);
  m.def("flash_attention_varlen_backward", &varlen_backward, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a,
        "dout"_a, "dq"_a, "dk"_a, "dv"_a, "cu_seqlens_q"_a, "cu_seqlens_k"_a, "sinks"_a.none(),
        "dsinks"_a.none(), "options"_a, "mask"_a, "stream"_a);
}

}  // namespace kdnn_python
