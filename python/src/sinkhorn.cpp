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

sk::ForwardOptions forward_options(int iters, bool rows_first, double eps, bool check_finite) {
  sk::ForwardOptions f;
  f.iters = iters;
  f.order = rows_first ? sk::Order::rows_first : sk::Order::columns_first;
  f.eps = eps;
  f.check_finite = check_finite;
  return f;
}

/// The forward; with `unrolled_backward` (the caller will differentiate it
/// in reverse mode) the unrolled backward's launch is checked first, so that
/// an impossible one fails here rather than after the forward ran.
void forward(const Array& x, const Array& r, int iters, bool rows_first, double eps,
             bool unrolled_backward, bool check_finite, std::uintptr_t stream) {
  dispatch(x, "sinkhorn: x", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    const auto in = view_of<kdnn::Tensor3<const T, Space>>(x, "sinkhorn: x");
    const auto opts = forward_options(iters, rows_first, eps, check_finite);
    if (unrolled_backward) sk::check_backward_unrolled(space, in, opts);
    sk::forward(space, in, view_of<kdnn::Tensor3<T, Space>>(r, "sinkhorn: R"), opts);
  });
}

void backward(const Array& r, const Array& g, const Array& dx, bool block, bool check_finite,
              std::uintptr_t stream) {
  dispatch(r, "sinkhorn backward: R", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    sk::BackwardOptions b;
    b.method = block ? sk::Method::block : sk::Method::implicit;
    b.check_finite = check_finite;
    sk::backward(space, view_of<kdnn::Tensor3<const T, Space>>(r, "sinkhorn backward: R"),
                 view_of<kdnn::Tensor3<const T, Space>>(g, "sinkhorn backward: grad"),
                 view_of<kdnn::Tensor3<T, Space>>(dx, "sinkhorn backward: dx"), b);
  });
}

void backward_unrolled(const Array& x, const Array& g, const Array& dx, int iters, bool rows_first,
                       double eps, bool check_finite, std::uintptr_t stream) {
  dispatch(x, "sinkhorn backward: x", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    sk::backward_unrolled(space, view_of<kdnn::Tensor3<const T, Space>>(x, "sinkhorn backward: x"),
                          view_of<kdnn::Tensor3<const T, Space>>(g, "sinkhorn backward: grad"),
                          view_of<kdnn::Tensor3<T, Space>>(dx, "sinkhorn backward: dx"),
                          forward_options(iters, rows_first, eps, check_finite));
  });
}

}  // namespace

void bind_sinkhorn(nb::module_& m) {
  m.def("sinkhorn_forward", &forward, "x"_a, "r"_a, "iters"_a, "rows_first"_a, "eps"_a,
        "unrolled_backward"_a, "check_finite"_a, "stream"_a);
  m.def("sinkhorn_backward", &backward, "r"_a, "g"_a, "dx"_a, "block"_a, "check_finite"_a,
        "stream"_a);
  m.def("sinkhorn_backward_unrolled", &backward_unrolled, "x"_a, "g"_a, "dx"_a, "iters"_a,
        "rows_first"_a, "eps"_a, "check_finite"_a, "stream"_a);
}

}  // namespace kdnn_python
