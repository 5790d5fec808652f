// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// kdnn::ssm's Mamba-2 operators (kdnn.causal_conv1d, kdnn.dt_softplus,
// kdnn.ssd): the causal conv1d (+ SiLU) on [B, L, C] arrays of any strides
// (channel-last, or causal-conv1d's contiguous [B, C, L] transposed),
// the dt softplus, and the SSD chunked scan, forward and backward. Optional
// arguments are None.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <cstdint>

#include "kdnn/ssm/ssm.hpp"
#include "mamba2_arguments.hpp"
#include "tensors.hpp"

namespace kdnn_python {

namespace ssm = kdnn::ssm;
using namespace nb::literals;

namespace {

void conv_forward(const StridedArray& x, const Array& w, const Optional& bias, const Optional& init,
                  const StridedArray& y, const Optional& final_state, const Optional& seq_idx,
                  const ssm::CausalConv1dOptions& options, std::uintptr_t stream) {
  dispatch<StorageDtypes>(x, "causal_conv1d: x", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    auto f = conv_forward_arguments<T, Space>("causal_conv1d", x, w, bias, init, y, final_state);
    f.seq_idx = view_of<kdnn::Matrix<const int, Space>>(seq_idx, "causal_conv1d: seq_idx");
    ssm::causal_conv1d_forward(space, f, options);
  });
}

void conv_backward(const StridedArray& x, const Array& w, const Optional& bias,
                   const Optional& init, const StridedArray& dy, const Optional& dfinal,
                   const StridedArray& dx, const Array& dw, const Optional& dbias,
                   const Optional& dinit, const Optional& seq_idx,
                   const ssm::CausalConv1dOptions& options, std::uintptr_t stream) {
  dispatch<StorageDtypes>(x, "causal_conv1d backward: x", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    auto b = conv_backward_arguments<T, Space>("causal_conv1d", x, w, bias, init, dy, dfinal, dx,
                                               dw, dbias, dinit);
    b.seq_idx = view_of<kdnn::Matrix<const int, Space>>(seq_idx, "causal_conv1d backward: seq_idx");
    ssm::causal_conv1d_backward(space, b, options);
  });
}

/// The decoding step reads the conv's options silu and check_finite.
void conv_update(const Array& x, const Array& state, const Array& w, const Optional& bias,
                 const Array& y, const Optional& state_indices, const Optional& cache_seqlens,
                 const ssm::CausalConv1dOptions& options, std::uintptr_t stream) {
  dispatch<StorageDtypes>(x, "causal_conv1d_update: x", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    ssm::ConvUpdate<T, Space> a;
    a.x = view_of<In3<T, Space>>(x, "causal_conv1d_update: x");
    a.conv_state = view_of<kdnn::Tensor3<T, Space>>(state, "causal_conv1d_update: conv_state");
    using Param = kdnn::compute_t<T>;
    a.w = view_of<kdnn::Matrix<const Param, Space>>(w, "causal_conv1d_update: weight");
    a.bias = view_of<kdnn::Vector<const Param, Space>>(bias, "causal_conv1d_update: bias");
    a.y = view_of<kdnn::Tensor3<T, Space>>(y, "causal_conv1d_update: out");
    using Ints = kdnn::Vector<const int, Space>;
    a.conv_state_indices = view_of<Ints>(state_indices, "causal_conv1d_update: conv_state_indices");
    a.cache_seqlens = view_of<Ints>(cache_seqlens, "causal_conv1d_update: cache_seqlens");
    a.silu = options.silu;
    a.check_finite = options.check_finite;
    ssm::causal_conv1d_update(space, a);
  });
}

void dt_forward(const Array& dt, const Array& bias, const Array& out,
                const ssm::DtSoftplusOptions& options, std::uintptr_t stream) {
  dispatch<StorageDtypes>(dt, "dt_softplus: dt", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    using Param = kdnn::compute_t<T>;  // dt_bias and dt_out
    ssm::dt_softplus_forward(
        space, view_of<In3<T, Space>>(dt, "dt_softplus: dt"),
        view_of<kdnn::Vector<const Param, Space>>(bias, "dt_softplus: dt_bias"),
        view_of<kdnn::Tensor3<Param, Space>>(out, "dt_softplus: out"), options);
  });
}

void dt_backward(const Array& dt, const Array& bias, const Array& dout, const Array& ddt,
                 const Array& dbias, const ssm::DtSoftplusOptions& options, std::uintptr_t stream) {
  dispatch<StorageDtypes>(dt, "dt_softplus backward: dt", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    using Param = kdnn::compute_t<T>;  // dt_bias, dt_out and their gradients
    ssm::dt_softplus_backward(
        space, view_of<In3<T, Space>>(dt, "dt_softplus backward: dt"),
        view_of<kdnn::Vector<const Param, Space>>(bias, "dt_softplus backward: dt_bias"),
        view_of<In3<Param, Space>>(dout, "dt_softplus backward: grad"),
        view_of<kdnn::Tensor3<T, Space>>(ddt, "dt_softplus backward: ddt"),
        view_of<kdnn::Vector<Param, Space>>(dbias, "dt_softplus backward: ddt_bias"), options);
  });
}

void ssd_forward(const Array& x, const Array& dt, const Array& A, const Array& B, const Array& C,
                 const Optional& D, const Optional& init, const Optional& dt_bias,
                 const Optional& z, const Array& y, const Optional& final_state,
                 const Optional& y_ungated, const Optional& seq_idx, const Optional& cu_seqlens,
                 const Optional& sequence_states, const ssm::SsdOptions& options,
                 std::uintptr_t stream) {
  dispatch(x, "ssd: x", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    const SsdInputs in{x, dt, A, B, C, D, init, dt_bias, z};
    auto f = ssd_forward_arguments<T, Space>("ssd", in, y, final_state, y_ungated);
    f.seq_idx = view_of<kdnn::Matrix<const int, Space>>(seq_idx, "ssd: seq_idx");
    f.cu_seqlens = view_of<kdnn::Vector<const int, Space>>(cu_seqlens, "ssd: cu_seqlens");
    f.sequence_states = view_of<kdnn::Tensor4<T, Space>>(sequence_states, "ssd: sequence_states");
    ssm::ssd_forward(space, f, options);
  });
}

void ssd_backward(const Array& x, const Array& dt, const Array& A, const Array& B, const Array& C,
                  const Optional& D, const Optional& init, const Optional& dt_bias,
                  const Optional& z, const Optional& y_ungated, const Array& dy,
                  const Optional& dfinal, const Array& dx, const Array& ddt, const Array& dA,
                  const Array& dB, const Array& dC, const Optional& dD, const Optional& dinit,
                  const Optional& ddt_bias, const Optional& dz, const Optional& seq_idx,
                  const ssm::SsdOptions& options, std::uintptr_t stream) {
  dispatch(x, "ssd backward: x", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    const SsdInputs in{x, dt, A, B, C, D, init, dt_bias, z};
    const SsdGradients out{dx, ddt, dA, dB, dC, dD, dinit, ddt_bias, dz};
    auto g = ssd_backward_arguments<T, Space>("ssd", in, y_ungated, dy, dfinal, out);
    g.seq_idx = view_of<kdnn::Matrix<const int, Space>>(seq_idx, "ssd backward: seq_idx");
    ssm::ssd_backward(space, g, options);
  });
}

}  // namespace

// Tensors positionally (None for an optional one), then the options
// (_kdnn.CausalConv1dOptions, DtSoftplusOptions, SsdOptions) and PyTorch's
// stream.
void bind_mamba2(nb::module_& m) {
  m.def("causal_conv1d_forward", &conv_forward, "x"_a, "w"_a, "bias"_a.none(), "init"_a.none(),
        "y"_a, "final_state"_a.none(), "seq_idx"_a.none(), "options"_a, "stream"_a);
  m.def("causal_conv1d_backward", &conv_backward, "x"_a, "w"_a, "bias"_a.none(), "init"_a.none(),
        "dy"_a, "dfinal"_a.none(), "dx"_a, "dw"_a, "dbias"_a.none(), "dinit"_a.none(),
        "seq_idx"_a.none(), "options"_a, "stream"_a);
  m.def("causal_conv1d_update", &conv_update, "x"_a, "conv_state"_a, "w"_a, "bias"_a.none(), "y"_a,
        "conv_state_indices"_a.none(), "cache_seqlens"_a.none(), "options"_a, "stream"_a);
  m.def("dt_softplus_forward", &dt_forward, "dt"_a, "dt_bias"_a, "out"_a, "options"_a, "stream"_a);
  m.def("dt_softplus_backward", &dt_backward, "dt"_a, "dt_bias"_a, "dout"_a, "ddt"_a, "ddt_bias"_a,
        "options"_a, "stream"_a);
  m.def("ssd_forward", &ssd_forward, "x"_a, "dt"_a, "A"_a, "B"_a, "C"_a, "D"_a.none(),
        "init"_a.none(), "dt_bias"_a.none(), "z"_a.none(), "y"_a, "final_state"_a.none(),
        "y_ungated"_a.none(), "seq_idx"_a.none(), "cu_seqlens"_a.none(), "sequence_states"_a.none(),
        "options"_a, "stream"_a);
  m.def("ssd_backward", &ssd_backward, "x"_a, "dt"_a, "A"_a, "B"_a, "C"_a, "D"_a.none(),
        "init"_a.none(), "dt_bias"_a.none(), "z"_a.none(), "y_ungated"_a.none(), "dy"_a,
        "dfinal"_a.none(), "dx"_a, "ddt"_a, "dA"_a, "dB"_a, "dC"_a, "dD"_a.none(), "dinit"_a.none(),
        "ddt_bias"_a.none(), "dz"_a.none(), "seq_idx"_a.none(), "options"_a, "stream"_a);
}

}  // namespace kdnn_python
