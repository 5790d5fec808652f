// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// kdnn::sinkhorn's forward and backwards on [B, n, n] arrays (kdnn.sinkhorn).
#include <nanobind/nanobind.h>

#include <cstdint>

#include "kdnn/sinkhorn/sinkhorn.hpp"
#include "tensors.hpp"

namespace kdnn_python {

namespace sk = kdnn::sinkhorn;
using namespace nb::literals;

namespace {

/// The forward; with `unrolled_backward` (the caller will differentiate it
/// in reverse mode) the unrolled backward's launch is checked first, so that
/// an impossible one fails here rather than after the forward ran.
void forward(const Array& x, const Array& r, const sk::ForwardOptions& options,
             bool unrolled_backward, std::uintptr_t stream) {
  dispatch(x, "sinkhorn: x", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    const auto in = view_of<kdnn::Tensor3<const T, Space>>(x, "sinkhorn: x");
    if (unrolled_backward) sk::check_backward_unrolled(space, in, options);
    sk::forward(space, in, view_of<kdnn::Tensor3<T, Space>>(r, "sinkhorn: R"), options);
  });
}

void backward(const Array& r, const Array& g, const Array& dx, const sk::BackwardOptions& options,
              std::uintptr_t stream) {
  dispatch(r, "sinkhorn backward: R", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    sk::backward(space, view_of<kdnn::Tensor3<const T, Space>>(r, "sinkhorn backward: R"),
                 view_of<kdnn::Tensor3<const T, Space>>(g, "sinkhorn backward: grad"),
                 view_of<kdnn::Tensor3<T, Space>>(dx, "sinkhorn backward: dx"), options);
  });
}

/// The unrolled backward takes the forward's options (it replays it).
void backward_unrolled(const Array& x, const Array& g, const Array& dx,
                       const sk::ForwardOptions& options, std::uintptr_t stream) {
  dispatch(x, "sinkhorn backward: x", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    sk::backward_unrolled(space, view_of<kdnn::Tensor3<const T, Space>>(x, "sinkhorn backward: x"),
                          view_of<kdnn::Tensor3<const T, Space>>(g, "sinkhorn backward: grad"),
                          view_of<kdnn::Tensor3<T, Space>>(dx, "sinkhorn backward: dx"), options);
  });
}

}  // namespace

// Tensors positionally, then the options (_kdnn.SinkhornForwardOptions or
// SinkhornBackwardOptions) and PyTorch's stream.
void bind_sinkhorn(nb::module_& m) {
  m.def("sinkhorn_forward", &forward, "x"_a, "r"_a, "options"_a, "unrolled_backward"_a, "stream"_a);
  m.def("sinkhorn_backward", &backward, "r"_a, "g"_a, "dx"_a, "options"_a, "stream"_a);
  m.def("sinkhorn_backward_unrolled", &backward_unrolled, "x"_a, "g"_a, "dx"_a, "options"_a,
        "stream"_a);
}

}  // namespace kdnn_python
