// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// kdnn's options structs as classes of kdnn._kdnn, each bound once here: a
// default-constructed object holds the C++ defaults, and every member is a
// read-write field of its C++ name (a nested struct's, an object of its own
// class; an enum's, a member of its enum class). A new C++ option is one
// def_rw line here and the keyword that sets it in the operator's Options
// record (python/kdnn/_options.py).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/mha.hpp"
#include "kdnn/core/launch.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"
#include "kdnn/ssm/causal_conv1d.hpp"
#include "kdnn/ssm/dt_softplus.hpp"
#include "kdnn/ssm/ssd.hpp"
#ifdef KDNN_ENABLE_MPI
#include "kdnn/cp/conv_dt.hpp"
#endif
#include "options.hpp"

namespace kdnn_python {

namespace at = kdnn::attention;
namespace sk = kdnn::sinkhorn;
namespace ssm = kdnn::ssm;

namespace {

/// The class `name` of options struct T, constructed with T's defaults.
template <class T>
nb::class_<T> options_class(nb::module_& m, const char* name) {
  return nb::class_<T>(m, name).def(nb::init<>());
}

void bind_launch(nb::module_& m) {
  nb::enum_<kdnn::KernelForm>(m, "KernelForm")
      .value("automatic", kdnn::KernelForm::automatic)
      .value("host", kdnn::KernelForm::host)
      .value("gpu", kdnn::KernelForm::gpu)
      .value("tensor_cores", kdnn::KernelForm::tensor_cores);
  using L = kdnn::Launch;
  options_class<L>(m, "Launch")
      .def_rw("tile", &L::tile)
      .def_rw("team_size", &L::team_size)
      .def_rw("vector_length", &L::vector_length)
      .def_rw("form", &L::form)
      .def_rw("allow_tf32", &L::allow_tf32);
}

void bind_attention(nb::module_& m) {
  options_class<at::DropoutOptions>(m, "DropoutOptions")
      .def_rw("p", &at::DropoutOptions::p)
      .def_rw("seed", &at::DropoutOptions::seed)
      .def_rw("offset", &at::DropoutOptions::offset);

  nb::enum_<at::FusedBackwardSchedule>(m, "FusedBackwardSchedule")
      .value("automatic", at::FusedBackwardSchedule::automatic)
      .value("per_head", at::FusedBackwardSchedule::per_head)
      .value("per_key_block", at::FusedBackwardSchedule::per_key_block);
  using F = at::FusedAttentionOptions;
  options_class<F>(m, "FusedAttentionOptions")
      .def_rw("scale", &F::scale)
      .def_rw("softcap", &F::softcap)
      .def_rw("dropout", &F::dropout)
      .def_rw("launch", &F::launch)
      .def_rw("backward", &F::backward)
      .def_rw("check_scores", &F::check_scores)
      .def_rw("check_finite", &F::check_finite);

  nb::enum_<at::AttentionAlgo>(m, "AttentionAlgo")
      .value("fused", at::AttentionAlgo::fused)
      .value("unfused", at::AttentionAlgo::unfused);
  using O = at::MhaOptions;
  options_class<O>(m, "MhaOptions")
      .def_rw("heads", &O::heads)
      .def_rw("sm_scaler", &O::sm_scaler, nb::arg().none())  // None: 1/sqrt(D)
      .def_rw("dropout", &O::dropout)
      .def_rw("algo", &O::algo)
      .def_rw("kv_heads", &O::kv_heads)
      .def_rw("check_finite", &O::check_finite);
  using S = at::MhaShape;
  options_class<S>(m, "MhaShape")
      .def_rw("batch", &S::batch)
      .def_rw("seq_q", &S::seq_q)
      .def_rw("seq_k", &S::seq_k)
      .def_rw("q_size", &S::q_size)
      .def_rw("k_size", &S::k_size)
      .def_rw("v_size", &S::v_size)
      .def_rw("heads", &S::heads)
      .def_rw("head_dim", &S::head_dim)
      .def_rw("v_head_dim", &S::v_head_dim)
      .def_rw("o_size", &S::o_size)
      .def_rw("algo", &S::algo)
      .def_rw("kv_heads", &S::kv_heads);
  options_class<at::MhaBufferSizes>(m, "MhaBufferSizes")
      .def_rw("reserve", &at::MhaBufferSizes::reserve)
      .def_rw("workspace", &at::MhaBufferSizes::workspace);

  using M = AttentionMaskArrays;
  options_class<M>(m, "AttentionMask")
      .def_rw("causal", &M::causal)
      .def_rw("band_left", &M::band_left)
      .def_rw("band_right", &M::band_right)
      .def_rw("lo_win", &M::lo_win, nb::arg().none())
      .def_rw("hi_win", &M::hi_win, nb::arg().none())
      .def_rw("seq_q", &M::seq_q, nb::arg().none())
      .def_rw("seq_k", &M::seq_k, nb::arg().none())
      .def_rw("alibi_slopes", &M::alibi_slopes, nb::arg().none());
}

void bind_sinkhorn(nb::module_& m) {
  nb::enum_<sk::Order>(m, "SinkhornOrder")
      .value("columns_first", sk::Order::columns_first)
      .value("rows_first", sk::Order::rows_first);
  nb::enum_<sk::Method>(m, "SinkhornMethod")
      .value("implicit", sk::Method::implicit)
      .value("block", sk::Method::block);
  nb::enum_<sk::Marginals>(m, "SinkhornMarginals")
      .value("measured", sk::Marginals::measured)
      .value("unit", sk::Marginals::unit);
  using F = sk::ForwardOptions;
  options_class<F>(m, "SinkhornForwardOptions")
      .def_rw("iters", &F::iters)
      .def_rw("tol", &F::tol)
      .def_rw("order", &F::order)
      .def_rw("eps", &F::eps)
      .def_rw("launch", &F::launch)
      .def_rw("check_finite", &F::check_finite);
  using B = sk::BackwardOptions;
  options_class<B>(m, "SinkhornBackwardOptions")
      .def_rw("method", &B::method)
      .def_rw("marginals", &B::marginals)
      .def_rw("rtol", &B::rtol)
      .def_rw("max_iters", &B::max_iters)
      .def_rw("launch", &B::launch)
      .def_rw("check_finite", &B::check_finite);
}

void bind_ssm(nb::module_& m) {
  using C = ssm::CausalConv1dOptions;
  options_class<C>(m, "CausalConv1dOptions")
      .def_rw("silu", &C::silu)
      .def_rw("launch", &C::launch)
      .def_rw("check_finite", &C::check_finite);
  using D = ssm::DtSoftplusOptions;
  options_class<D>(m, "DtSoftplusOptions")
      .def_rw("dt_min", &D::dt_min)
      .def_rw("dt_max", &D::dt_max)
      .def_rw("check_finite", &D::check_finite);
  using S = ssm::SsdOptions;
  options_class<S>(m, "SsdOptions")
      .def_rw("chunk", &S::chunk)
      .def_rw("check_parameters", &S::check_parameters)
      .def_rw("check_dt", &S::check_dt)
      .def_rw("launch", &S::launch)
      .def_rw("dt_softplus", &S::dt_softplus)
      .def_rw("dt_min", &S::dt_min)
      .def_rw("dt_max", &S::dt_max)
      .def_rw("check_finite", &S::check_finite);
#ifdef KDNN_ENABLE_MPI
  using CD = kdnn::cp::ConvDtOptions;
  options_class<CD>(m, "ConvDtOptions").def_rw("conv", &CD::conv).def_rw("dt", &CD::dt);
#endif
}

}  // namespace

void bind_options(nb::module_& m) {
  bind_launch(m);
  bind_attention(m);
  bind_sinkhorn(m);
  bind_ssm(m);
}

}  // namespace kdnn_python
