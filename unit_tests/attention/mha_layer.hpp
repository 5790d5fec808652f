// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// One multi-head attention layer's tensors on the device and the three calls
// on them (mha_forward, mha_backward_data, mha_backward_weights), built from
// an MhaCase and MhaData (mha_reference.hpp); shared by test_mha.cpp,
// test_mha_errors.cpp and test_mha_golden.cpp.
#include <utility>
#include <vector>

#include "kdnn/attention/mha.hpp"
#include "mha_reference.hpp"
#include "views.hpp"

namespace kdnn_test {

/// Both attention algorithms, for tests that run every case on each.
constexpr kdnn::attention::AttentionAlgo kAlgos[] = {kdnn::attention::AttentionAlgo::fused,
                                                     kdnn::attention::AttentionAlgo::unfused};

inline const char* name_of(kdnn::attention::AttentionAlgo algo) {
  return algo == kdnn::attention::AttentionAlgo::fused ? "fused" : "unfused";
}

/// One layer's tensors on the device, and the three calls on them, with the
/// attention algorithm `algo`.
template <class T>
struct DeviceLayer {
  MhaCase c;
  kdnn::attention::MhaOptions opts;
  kdnn::attention::AttentionMask<Space> mask;
  kdnn::attention::MhaParams<T, Space> w, dw;
  DeviceView<T***> q, k, v, residual, out, dq, dk, dv, dresidual, dout;
  DeviceView<T*> reserve, workspace;
  kdnn::attention::PackedSequences<Space> seqs;  ///< packed sequences; none by default

  DeviceLayer(const MhaCase& cs, const MhaData& d,
              kdnn::attention::AttentionAlgo algo = kdnn::attention::AttentionAlgo::fused)
      : c(cs) {
    opts.heads = c.H;
    opts.kv_heads = c.Hkv;
    opts.algo = algo;
    opts.sm_scaler = c.scaler;
    opts.dropout = {c.p, c.seed, c.offset};
    mask.causal = c.causal;
    const auto ints = [](const std::vector<int>& x) {
      DeviceView<int*> v("mask", x.size());
      auto h = Kokkos::create_mirror_view(v);
      for (std::size_t i = 0; i < x.size(); ++i) h(i) = x[i];
      Kokkos::deep_copy(v, h);
      return v;
    };
    if (!c.lo.empty()) mask.lo_win = ints(c.lo);
    if (!c.hi.empty()) mask.hi_win = ints(c.hi);
    if (!c.seq_q.empty()) mask.seq_q = ints(c.seq_q);
    if (!c.seq_k.empty()) mask.seq_k = ints(c.seq_k);
    q = to_device<T***>(d.q, c.B, c.S, c.Eq);
    k = to_device<T***>(d.k, c.B, c.Sk, c.Ek);
    v = to_device<T***>(d.v, c.B, c.Sk, c.Ev);
    if (c.residual) residual = to_device<T***>(d.residual, c.B, c.S, c.Eo);
    dout = to_device<T***>(d.dout, c.B, c.S, c.Eo);
    w.w_q = to_device<T**>(d.wq, c.H * c.D, c.Eq);
    w.w_k = to_device<T**>(d.wk, c.kv() * c.D, c.Ek);
    w.w_v = to_device<T**>(d.wv, c.kv() * c.Dv, c.Ev);
    w.w_o = to_device<T**>(d.wo, c.Eo, c.H * c.Dv);
    dw.w_q = DeviceView<T**>("dw_q", c.H * c.D, c.Eq);
    dw.w_k = DeviceView<T**>("dw_k", c.kv() * c.D, c.Ek);
    dw.w_v = DeviceView<T**>("dw_v", c.kv() * c.Dv, c.Ev);
    dw.w_o = DeviceView<T**>("dw_o", c.Eo, c.H * c.Dv);
    if (c.bias_q)
      w.b_q = to_device<T*>(d.bq, c.H * c.D), dw.b_q = DeviceView<T*>("db_q", c.H * c.D);
    if (c.bias_k)
      w.b_k = to_device<T*>(d.bk, c.kv() * c.D), dw.b_k = DeviceView<T*>("db_k", c.kv() * c.D);
    if (c.bias_v)
      w.b_v = to_device<T*>(d.bv, c.kv() * c.Dv), dw.b_v = DeviceView<T*>("db_v", c.kv() * c.Dv);
    if (c.bias_o) w.b_o = to_device<T*>(d.bo, c.Eo), dw.b_o = DeviceView<T*>("db_o", c.Eo);
    out = DeviceView<T***>("out", c.B, c.S, c.Eo);
    dq = DeviceView<T***>("dq", c.B, c.S, c.Eq);
    dk = DeviceView<T***>("dk", c.B, c.Sk, c.Ek);
    dv = DeviceView<T***>("dv", c.B, c.Sk, c.Ev);
    if (c.residual) dresidual = DeviceView<T***>("dresidual", c.B, c.S, c.Eo);
    const auto sizes = kdnn::attention::mha_buffer_sizes(shape());
    reserve = DeviceView<T*>("reserve", sizes.reserve);
    workspace = DeviceView<T*>("workspace", sizes.workspace);
  }

  kdnn::attention::MhaShape shape() const {
    kdnn::attention::MhaShape s;
    s.batch = c.B, s.seq_q = c.S, s.seq_k = c.Sk;
    s.q_size = c.Eq, s.k_size = c.Ek, s.v_size = c.Ev;
    s.heads = c.H, s.head_dim = c.D, s.v_head_dim = c.Dv, s.o_size = c.Eo;
    s.kv_heads = std::size_t(c.Hkv);
    s.algo = opts.algo;
    return s;
  }

  void forward() {
    kdnn::attention::mha_forward(Space(), opts, mask, w, q, k, v, residual, out, reserve, workspace,
                                 seqs);
  }
  void backward(kdnn::attention::WgradMode mode = kdnn::attention::WgradMode::set) {
    kdnn::attention::mha_backward_data(Space(), opts, mask, w, dout, dq, dk, dv, dresidual, reserve,
                                       workspace, seqs);
    kdnn::attention::mha_backward_weights(Space(), opts, w, q, k, v, dw, mode, reserve);
  }

  /// Every gradient, by the MhaData member it is the gradient of.
  std::vector<std::pair<std::vector<double> MhaData::*, std::vector<double>>> gradients() const {
    std::vector<std::pair<std::vector<double> MhaData::*, std::vector<double>>> g = {
        {&MhaData::q, to_host(dq)},      {&MhaData::k, to_host(dk)},
        {&MhaData::v, to_host(dv)},      {&MhaData::wq, to_host(dw.w_q)},
        {&MhaData::wk, to_host(dw.w_k)}, {&MhaData::wv, to_host(dw.w_v)},
        {&MhaData::wo, to_host(dw.w_o)}};
    if (c.bias_q) g.push_back({&MhaData::bq, to_host(dw.b_q)});
    if (c.bias_k) g.push_back({&MhaData::bk, to_host(dw.b_k)});
    if (c.bias_v) g.push_back({&MhaData::bv, to_host(dw.b_v)});
    if (c.bias_o) g.push_back({&MhaData::bo, to_host(dw.b_o)});
    if (c.residual) g.push_back({&MhaData::residual, to_host(dresidual)});
    return g;
  }
};

inline const char* name_of(std::vector<double> MhaData::*x) {
  if (x == &MhaData::q) return "dq";
  if (x == &MhaData::k) return "dk";
  if (x == &MhaData::v) return "dv";
  if (x == &MhaData::wq) return "dw_q";
  if (x == &MhaData::wk) return "dw_k";
  if (x == &MhaData::wv) return "dw_v";
  if (x == &MhaData::wo) return "dw_o";
  if (x == &MhaData::bq) return "db_q";
  if (x == &MhaData::bk) return "db_k";
  if (x == &MhaData::bv) return "db_v";
  if (x == &MhaData::bo) return "db_o";
  return "dresidual";
}

}  // namespace kdnn_test
