// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The conv's and the SSD's argument structs from Python's arrays, for the
// single-rank operators (mamba2.cpp) and the context-parallel ones (cp.cpp);
// `op` names the operator in messages.
#include <string>

#include "kdnn/ssm/causal_conv1d.hpp"
#include "kdnn/ssm/ssd.hpp"
#include "tensors.hpp"

namespace kdnn_python {

/// The conv's [B, ·, C] tensors take any strides (x, y, dy, dx: an Array or
/// a StridedArray, `X`; the states: contiguous Arrays).
template <class T, class Space>
using Strided3 = kdnn::StridedTensor3<T, Space>;

/// The conv's inputs, shared by its forward and backward argument structs
/// (the weight and bias, and their gradients, of compute_t<T>).
template <class T, class Space, class Args, class X>
void set_conv_inputs(Args& a, const std::string& at, const X& x, const Array& w,
                     const Optional& bias, const Optional& init) {
  using Param = kdnn::compute_t<T>;
  a.x = view_of<Strided3<const T, Space>>(x, at + "x");
  a.w = view_of<kdnn::Matrix<const Param, Space>>(w, at + "weight");
  a.bias = view_of<kdnn::Vector<const Param, Space>>(bias, at + "bias");
  a.initial_state = view_of<Strided3<const T, Space>>(init, at + "initial_state");
}

/// The SSD's inputs, shared by its forward and backward argument structs.
struct SsdInputs {
  const Array &x, &dt, &A, &B, &C;
  const Optional &D, &init, &dt_bias, &z;
};

template <class T, class Space, class Args>
void set_ssd_inputs(Args& a, const std::string& at, const SsdInputs& in) {
  a.x = view_of<In4<T, Space>>(in.x, at + "x");
  a.dt = view_of<In3<T, Space>>(in.dt, at + "dt");
  a.A = view_of<kdnn::Vector<const T, Space>>(in.A, at + "A");
  a.B = view_of<In4<T, Space>>(in.B, at + "B");
  a.C = view_of<In4<T, Space>>(in.C, at + "C");
  a.D = view_of<kdnn::Vector<const T, Space>>(in.D, at + "D");
  a.initial_state = view_of<In4<T, Space>>(in.init, at + "initial_states");
  a.dt_bias = view_of<kdnn::Vector<const T, Space>>(in.dt_bias, at + "dt_bias");
  a.z = view_of<In4<T, Space>>(in.z, at + "z");
}

template <class T, class Space, class X>
kdnn::ssm::ConvForward<T, Space> conv_forward_arguments(const std::string& op, const X& x,
                                                        const Array& w, const Optional& bias,
                                                        const Optional& init, const X& y,
                                                        const Optional& final_state) {
  const std::string at = op + ": ";
  kdnn::ssm::ConvForward<T, Space> f;
  set_conv_inputs<T, Space>(f, at, x, w, bias, init);
  f.y = view_of<Strided3<T, Space>>(y, at + "out");
  f.final_state = view_of<Strided3<T, Space>>(final_state, at + "final_state");
  return f;
}

template <class T, class Space, class X>
kdnn::ssm::ConvBackward<T, Space> conv_backward_arguments(const std::string& op, const X& x,
                                                          const Array& w, const Optional& bias,
                                                          const Optional& init, const X& dy,
                                                          const Optional& dfinal, const X& dx,
                                                          const Array& dw, const Optional& dbias,
                                                          const Optional& dinit) {
  const std::string at = op + " backward: ";
  kdnn::ssm::ConvBackward<T, Space> b;
  set_conv_inputs<T, Space>(b, at, x, w, bias, init);
  b.dy = view_of<Strided3<const T, Space>>(dy, at + "grad");
  b.dfinal_state = view_of<Strided3<const T, Space>>(dfinal, at + "grad of final_state");
  b.dx = view_of<Strided3<T, Space>>(dx, at + "dx");
  b.dw = view_of<kdnn::Matrix<kdnn::compute_t<T>, Space>>(dw, at + "dweight");
  b.dbias = view_of<kdnn::Vector<kdnn::compute_t<T>, Space>>(dbias, at + "dbias");
  b.dinitial_state = view_of<Strided3<T, Space>>(dinit, at + "dinitial_state");
  return b;
}

template <class T, class Space>
kdnn::ssm::SsdForward<T, Space> ssd_forward_arguments(const std::string& op, const SsdInputs& in,
                                                      const Array& y, const Optional& final_state,
                                                      const Optional& y_ungated) {
  const std::string at = op + ": ";
  kdnn::ssm::SsdForward<T, Space> f;
  set_ssd_inputs<T, Space>(f, at, in);
  f.y = view_of<kdnn::Tensor4<T, Space>>(y, at + "out");
  f.final_state = view_of<kdnn::Tensor4<T, Space>>(final_state, at + "final_states");
  f.y_ungated = view_of<kdnn::Tensor4<T, Space>>(y_ungated, at + "out before the gate");
  return f;
}

/// The SSD backward's gradients.
struct SsdGradients {
  const Array &dx, &ddt, &dA, &dB, &dC;
  const Optional &dD, &dinit, &ddt_bias, &dz;
};

template <class T, class Space>
kdnn::ssm::SsdBackward<T, Space> ssd_backward_arguments(const std::string& op, const SsdInputs& in,
                                                        const Optional& y_ungated, const Array& dy,
                                                        const Optional& dfinal,
                                                        const SsdGradients& out) {
  const std::string at = op + " backward: ";
  kdnn::ssm::SsdBackward<T, Space> g;
  set_ssd_inputs<T, Space>(g, at, in);
  g.y_ungated = view_of<In4<T, Space>>(y_ungated, at + "out before the gate");
  g.dy = view_of<In4<T, Space>>(dy, at + "grad");
  g.dfinal_state = view_of<In4<T, Space>>(dfinal, at + "grad of final_states");
  g.dx = view_of<kdnn::Tensor4<T, Space>>(out.dx, at + "dx");
  g.ddt = view_of<kdnn::Tensor3<T, Space>>(out.ddt, at + "ddt");
  g.dA = view_of<kdnn::Vector<T, Space>>(out.dA, at + "dA");
  g.dB = view_of<kdnn::Tensor4<T, Space>>(out.dB, at + "dB");
  g.dC = view_of<kdnn::Tensor4<T, Space>>(out.dC, at + "dC");
  g.dD = view_of<kdnn::Vector<T, Space>>(out.dD, at + "dD");
  g.dinitial_state = view_of<kdnn::Tensor4<T, Space>>(out.dinit, at + "dinitial_states");
  g.ddt_bias = view_of<kdnn::Vector<T, Space>>(out.ddt_bias, at + "ddt_bias");
  g.dz = view_of<kdnn::Tensor4<T, Space>>(out.dz, at + "dz");
  return g;
}

}  // namespace kdnn_python
