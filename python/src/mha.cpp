// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// kdnn::attention's multi-head attention layer (kdnn.multi_head_attention):
// its buffer sizes, the forward, and the backward (data, then weights) on
// [B, S, E] arrays with nn.Linear-shaped weights. The reserve the forward
// fills is a tensor the Python function keeps for its backward.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <cstdint>

#include "kdnn/attention/mha.hpp"
#include "options.hpp"
#include "tensors.hpp"

namespace kdnn_python {

namespace at = kdnn::attention;
using namespace nb::literals;

namespace {

/// The packed sequences: cu_seqlens_q and cu_seqlens_k, int32 [N + 1] each,
/// or None.
template <class Space>
at::PackedSequences<Space> packing(const Optional& cu_q, const Optional& cu_k) {
  using Ints = kdnn::Vector<const int, Space>;
  return {view_of<Ints>(cu_q, "multi_head_attention: cu_seqlens[0]"),
          view_of<Ints>(cu_k, "multi_head_attention: cu_seqlens[1]")};
}

/// w_q, w_k, w_v, w_o and b_q, b_k, b_v, b_o (biases None or given).
struct Params {
  Array w_q, w_k, w_v, w_o;
  Optional b_q, b_k, b_v, b_o;

  template <class T, class Space>
  at::MhaParams<T, Space> views(const char* what) const {
    const auto name = [&](const char* p) {
      return kdnn::concat("multi_head_attention: ", what, p);
    };
    return {view_of<kdnn::Matrix<T, Space>>(w_q, name("w_q")),
            view_of<kdnn::Matrix<T, Space>>(w_k, name("w_k")),
            view_of<kdnn::Matrix<T, Space>>(w_v, name("w_v")),
            view_of<kdnn::Matrix<T, Space>>(w_o, name("w_o")),
            view_of<kdnn::Vector<T, Space>>(b_q, name("b_q")),
            view_of<kdnn::Vector<T, Space>>(b_k, name("b_k")),
            view_of<kdnn::Vector<T, Space>>(b_v, name("b_v")),
            view_of<kdnn::Vector<T, Space>>(b_o, name("b_o"))};
  }
};

void forward(const Array& q, const Array& k, const Array& v, const Optional& residual,
             const Params& w, const Array& out, const Array& reserve, const Array& workspace,
             const Optional& cu_q, const Optional& cu_k, const at::MhaOptions& options,
             const AttentionMaskArrays& mask, std::uintptr_t stream) {
  dispatch(q, "multi_head_attention: query", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    using In = kdnn::Tensor3<const T, Space>;
    using Buffer = kdnn::Vector<T, Space>;
    at::mha_forward(
        space, options, mask.views<Space>("multi_head_attention"), w.views<const T, Space>(""),
        view_of<In>(q, "multi_head_attention: query"), view_of<In>(k, "multi_head_attention: key"),
        view_of<In>(v, "multi_head_attention: value"),
        view_of<In>(residual, "multi_head_attention: residual"),
        view_of<kdnn::Tensor3<T, Space>>(out, "multi_head_attention: out"),
        view_of<Buffer>(reserve, "multi_head_attention: reserve"),
        view_of<Buffer>(workspace, "multi_head_attention: workspace"), packing<Space>(cu_q, cu_k));
  });
}

void backward(const Array& dout, const Array& dq, const Array& dk, const Array& dv,
              const Optional& dresidual, const Array& q, const Array& k, const Array& v,
              const Params& w, const Params& grads, const Array& reserve, const Array& workspace,
              const Optional& cu_q, const Optional& cu_k, const at::MhaOptions& options,
              const AttentionMaskArrays& mask, std::uintptr_t stream) {
  dispatch(dout, "multi_head_attention backward: grad", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    using In = kdnn::Tensor3<const T, Space>;
    using Out = kdnn::Tensor3<T, Space>;
    using Buffer = kdnn::Vector<T, Space>;
    const auto weights = w.views<const T, Space>("");
    const auto res = view_of<Buffer>(reserve, "multi_head_attention backward: reserve");
    at::mha_backward_data(space, options, mask.views<Space>("multi_head_attention"), weights,
                          view_of<In>(dout, "multi_head_attention backward: grad"),
                          view_of<Out>(dq, "multi_head_attention backward: dquery"),
                          view_of<Out>(dk, "multi_head_attention backward: dkey"),
                          view_of<Out>(dv, "multi_head_attention backward: dvalue"),
                          view_of<Out>(dresidual, "multi_head_attention backward: dresidual"), res,
                          view_of<Buffer>(workspace, "multi_head_attention backward: workspace"),
                          packing<Space>(cu_q, cu_k));
    at::mha_backward_weights(space, options, weights,
                             view_of<In>(q, "multi_head_attention backward: query"),
                             view_of<In>(k, "multi_head_attention backward: key"),
                             view_of<In>(v, "multi_head_attention backward: value"),
                             grads.views<T, Space>("d"), at::WgradMode::set, res);
  });
}

}  // namespace

// Tensors positionally (the weights as one _kdnn.MhaParams), then the
// options (_kdnn.MhaOptions), the mask (_kdnn.AttentionMask) and PyTorch's
// stream.
void bind_mha(nb::module_& m) {
  nb::class_<Params>(m, "MhaParams")
      .def(nb::init<Array, Array, Array, Array, Optional, Optional, Optional, Optional>(), "w_q"_a,
           "w_k"_a, "w_v"_a, "w_o"_a, "b_q"_a.none(), "b_k"_a.none(), "b_v"_a.none(),
           "b_o"_a.none());
  m.def("mha_buffer_sizes", &at::mha_buffer_sizes, "shape"_a);
  m.def("mha_forward", &forward, "q"_a, "k"_a, "v"_a, "residual"_a.none(), "params"_a, "out"_a,
        "reserve"_a, "workspace"_a, "cu_seqlens_q"_a.none(), "cu_seqlens_k"_a.none(), "options"_a,
        "mask"_a, "stream"_a);
  m.def("mha_backward", &backward, "dout"_a, "dq"_a, "dk"_a, "dv"_a, "dresidual"_a.none(), "q"_a,
        "k"_a, "v"_a, "params"_a, "grads"_a, "reserve"_a, "workspace"_a, "cu_seqlens_q"_a.none(),
        "cu_seqlens_k"_a.none(), "options"_a, "mask"_a, "stream"_a);
}

}  // namespace kdnn_python
