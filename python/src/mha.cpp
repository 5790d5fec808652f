// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// kdnn::attention's multi-head attention layer (kdnn.multi_head_attention):
// its buffer sizes, the forward, and the backward (data, then weights) on
// [B, S, E] arrays with nn.Linear-shaped weights. The reserve the forward
// fills is a tensor the Python function keeps for its backward.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>

#include <cstdint>
#include <optional>
#include <utility>

#include "kdnn/attention/mha.hpp"
#include "tensors.hpp"

namespace kdnn_python {

namespace at = kdnn::attention;
using namespace nb::literals;

namespace {

/// The layer's options and mask, as Python passes them.
struct Config {
  int heads = 1, kv_heads = 0;
  std::optional<double> scale;
  double dropout_p = 0;
  std::uint64_t seed = 0, offset = 0;
  bool unfused = false, causal = false, check_finite = false;
  Optional lo_win, hi_win, seq_q, seq_k;  ///< int32 [S], [S], [B], [B] or None
  Optional cu_seqlens_q, cu_seqlens_k;    ///< int32 [N + 1] each, or None: packed sequences

  at::MhaOptions options() const {
    at::MhaOptions o;
    o.heads = heads;
    o.kv_heads = kv_heads;
    o.sm_scaler = scale;
    o.dropout = {dropout_p, seed, offset};
    o.algo = unfused ? at::AttentionAlgo::unfused : at::AttentionAlgo::fused;
    o.check_finite = check_finite;
    return o;
  }

  template <class Space>
  at::AttentionMask<Space> mask() const {
    using Ints = kdnn::Vector<const int, Space>;
    at::AttentionMask<Space> m;
    m.causal = causal;
    m.lo_win = view_of<Ints>(lo_win, "multi_head_attention: window_lo");
    m.hi_win = view_of<Ints>(hi_win, "multi_head_attention: window_hi");
    m.seq_q = view_of<Ints>(seq_q, "multi_head_attention: seq_lengths_q");
    m.seq_k = view_of<Ints>(seq_k, "multi_head_attention: seq_lengths_k");
    return m;
  }

  template <class Space>
  at::PackedSequences<Space> packing() const {
    using Ints = kdnn::Vector<const int, Space>;
    return {view_of<Ints>(cu_seqlens_q, "multi_head_attention: cu_seqlens[0]"),
            view_of<Ints>(cu_seqlens_k, "multi_head_attention: cu_seqlens[1]")};
  }
};

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

std::pair<std::size_t, std::size_t> buffer_sizes(std::size_t B, std::size_t S, std::size_t Sk,
                                                 std::size_t Eq, std::size_t Ek, std::size_t Ev,
                                                 std::size_t H, std::size_t Hkv, std::size_t D,
                                                 std::size_t Dv, std::size_t Eo, bool unfused) {
  at::MhaShape s;
  s.batch = B, s.seq_q = S, s.seq_k = Sk, s.q_size = Eq, s.k_size = Ek, s.v_size = Ev;
  s.heads = H, s.kv_heads = Hkv, s.head_dim = D, s.v_head_dim = Dv, s.o_size = Eo;
  s.algo = unfused ? at::AttentionAlgo::unfused : at::AttentionAlgo::fused;
  const at::MhaBufferSizes sizes = at::mha_buffer_sizes(s);
  return {sizes.reserve, sizes.workspace};
}

void forward(const Array& q, const Array& k, const Array& v, const Optional& residual,
             const Params& w, const Array& out, const Array& reserve, const Array& workspace,
             const Config& c, std::uintptr_t stream) {
  dispatch(q, "multi_head_attention: query", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    using In = kdnn::Tensor3<const T, Space>;
    using Buffer = kdnn::Vector<T, Space>;
    at::mha_forward(
        space, c.options(), c.mask<Space>(), w.views<const T, Space>(""),
        view_of<In>(q, "multi_head_attention: query"), view_of<In>(k, "multi_head_attention: key"),
        view_of<In>(v, "multi_head_attention: value"),
        view_of<In>(residual, "multi_head_attention: residual"),
        view_of<kdnn::Tensor3<T, Space>>(out, "multi_head_attention: out"),
        view_of<Buffer>(reserve, "multi_head_attention: reserve"),
        view_of<Buffer>(workspace, "multi_head_attention: workspace"), c.packing<Space>());
  });
}

void backward(const Array& dout, const Array& dq, const Array& dk, const Array& dv,
              const Optional& dresidual, const Array& q, const Array& k, const Array& v,
              const Params& w, const Params& grads, const Array& reserve, const Array& workspace,
              const Config& c, std::uintptr_t stream) {
  dispatch(dout, "multi_head_attention backward: grad", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    using In = kdnn::Tensor3<const T, Space>;
    using Out = kdnn::Tensor3<T, Space>;
    using Buffer = kdnn::Vector<T, Space>;
    const auto opts = c.options();
    const auto weights = w.views<const T, Space>("");
    const auto res = view_of<Buffer>(reserve, "multi_head_attention backward: reserve");
    at::mha_backward_data(space, opts, c.mask<Space>(), weights,
                          view_of<In>(dout, "multi_head_attention backward: grad"),
                          view_of<Out>(dq, "multi_head_attention backward: dquery"),
                          view_of<Out>(dk, "multi_head_attention backward: dkey"),
                          view_of<Out>(dv, "multi_head_attention backward: dvalue"),
                          view_of<Out>(dresidual, "multi_head_attention backward: dresidual"), res,
                          view_of<Buffer>(workspace, "multi_head_attention backward: workspace"),
                          c.packing<Space>());
    at::mha_backward_weights(space, opts, weights,
                             view_of<In>(q, "multi_head_attention backward: query"),
                             view_of<In>(k, "multi_head_attention backward: key"),
                             view_of<In>(v, "multi_head_attention backward: value"),
                             grads.views<T, Space>("d"), at::WgradMode::set, res);
  });
}

}  // namespace

void bind_mha(nb::module_& m) {
  nb::class_<Config>(m, "MhaConfig")
      .def(nb::init<>())
      .def_rw("heads", &Config::heads)
      .def_rw("kv_heads", &Config::kv_heads)
      .def_rw("scale", &Config::scale, nb::arg().none())
      .def_rw("dropout_p", &Config::dropout_p)
      .def_rw("seed", &Config::seed)
      .def_rw("offset", &Config::offset)
      .def_rw("unfused", &Config::unfused)
      .def_rw("causal", &Config::causal)
      .def_rw("check_finite", &Config::check_finite)
      .def_rw("lo_win", &Config::lo_win, nb::arg().none())
      .def_rw("hi_win", &Config::hi_win, nb::arg().none())
      .def_rw("seq_q", &Config::seq_q, nb::arg().none())
      .def_rw("seq_k", &Config::seq_k, nb::arg().none())
      .def_rw("cu_seqlens_q", &Config::cu_seqlens_q, nb::arg().none())
      .def_rw("cu_seqlens_k", &Config::cu_seqlens_k, nb::arg().none());
  nb::class_<Params>(m, "MhaParams")
      .def(nb::init<Array, Array, Array, Array, Optional, Optional, Optional, Optional>(), "w_q"_a,
           "w_k"_a, "w_v"_a, "w_o"_a, "b_q"_a.none(), "b_k"_a.none(), "b_v"_a.none(),
           "b_o"_a.none());
  m.def("mha_buffer_sizes", &buffer_sizes, "B"_a, "S"_a, "Sk"_a, "Eq"_a, "Ek"_a, "Ev"_a, "H"_a,
        "Hkv"_a, "D"_a, "Dv"_a, "Eo"_a, "unfused"_a);
  m.def("mha_forward", &forward, "q"_a, "k"_a, "v"_a, "residual"_a.none(), "params"_a, "out"_a,
        "reserve"_a, "workspace"_a, "config"_a, "stream"_a);
  m.def("mha_backward", &backward, "dout"_a, "dq"_a, "dk"_a, "dv"_a, "dresidual"_a.none(), "q"_a,
        "k"_a, "v"_a, "params"_a, "grads"_a, "reserve"_a, "workspace"_a, "config"_a, "stream"_a);
}

}  // namespace kdnn_python
