// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The cuDNN-shaped descriptor interface: buffer sizes, the weight buffer's
// views, the three calls against the double reference and the functional
// API (with the fused and the unfused attention), sizes below the
// descriptor's maxima, and bad descriptors.
#include <gtest/gtest.h>

#include <vector>

#include "allclose.hpp"
#include "expect_error.hpp"
#include "kdnn/attention/mha_descriptor.hpp"
#include "mha_layer.hpp"
#include "mha_reference.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace at = kdnn::attention;
using Kind = at::MhaWeightKind;

/// A descriptor for MhaCase c (maxima: c's sizes plus `extra`).
at::AttnDescriptor descriptor_of(const MhaCase& c, std::size_t extra = 0,
                                 at::AttentionAlgo algo = at::AttentionAlgo::fused) {
  at::AttnDescriptor d;
  d.algo = algo;
  d.heads = c.H;
  d.sm_scaler = c.scale();
  d.dropout_p = c.p, d.dropout_seed = c.seed, d.dropout_offset = c.offset;
  d.q_size = c.Eq, d.k_size = c.Ek, d.v_size = c.Ev;
  d.q_proj_size = d.k_proj_size = c.D, d.v_proj_size = c.Dv, d.o_proj_size = c.Eo;
  d.qo_max_seq_length = c.S + extra, d.kv_max_seq_length = c.Sk + extra;
  d.max_batch_size = c.B + extra;
  d.proj_biases = true;
  return d;
}

/// The case's parameters, read out of the weight buffer kind by kind.
MhaData params_from_buffer(const at::AttnDescriptor& d, const DeviceView<double*>& w,
                           MhaData data) {
  const auto get = [&](Kind kind) { return to_host(at::get_multi_head_attn_weights(d, kind, w)); };
  data.wq = get(Kind::q_weights), data.wk = get(Kind::k_weights);
  data.wv = get(Kind::v_weights), data.wo = get(Kind::o_weights);
  data.bq = get(Kind::q_biases), data.bk = get(Kind::k_biases);
  data.bv = get(Kind::v_biases), data.bo = get(Kind::o_biases);
  return data;
}

MhaCase sample_case() {
  MhaCase c;
  c.B = 2, c.S = 3, c.Sk = 5, c.H = 2, c.D = 3, c.Dv = 2;
  c.p = 0.2, c.seed = 11, c.offset = 3;
  c.seq_q = {3, 2};
  c.seq_k = {5, 3};
  return c;
}

TEST(MhaDescriptor, BufferSizesAndWeightViewsTileTheBuffer) {
  const MhaCase c = sample_case();
  const std::size_t HD = c.H * c.D, HDv = c.H * c.Dv;
  const std::size_t count = HD * c.Eq + HD * c.Ek + HDv * c.Ev + c.Eo * HDv + 2 * HD + HDv + c.Eo;
  for (const auto algo : kAlgos) {
    SCOPED_TRACE(name_of(algo));
    const auto bytes = at::get_multi_head_attn_buffers<float>(descriptor_of(c, 2, algo));
    EXPECT_EQ(bytes.weights, count * sizeof(float));
    at::MhaShape max;
    max.batch = c.B + 2, max.seq_q = c.S + 2, max.seq_k = c.Sk + 2;
    max.q_size = c.Eq, max.k_size = c.Ek, max.v_size = c.Ev;
    max.heads = c.H, max.head_dim = c.D, max.v_head_dim = c.Dv, max.o_size = c.Eo;
    max.algo = algo;
    EXPECT_EQ(bytes.workspace, at::mha_buffer_sizes(max).workspace * sizeof(float));
    EXPECT_EQ(bytes.reserve, at::mha_buffer_sizes(max).reserve * sizeof(float));
  }
  EXPECT_LT(at::get_multi_head_attn_buffers<float>(descriptor_of(c, 2)).reserve,
            at::get_multi_head_attn_buffers<float>(descriptor_of(c, 2, at::AttentionAlgo::unfused))
                .reserve);

  const at::AttnDescriptor d = descriptor_of(c, 2);

  // The eight views are disjoint, in cuDNN's kind order, and cover the buffer.
  DeviceView<float*> w("w", count);
  const std::pair<Kind, std::pair<std::size_t, std::size_t>> expected[] = {
      {Kind::q_weights, {HD, c.Eq}},  {Kind::k_weights, {HD, c.Ek}}, {Kind::v_weights, {HDv, c.Ev}},
      {Kind::o_weights, {c.Eo, HDv}}, {Kind::q_biases, {HD, 1}},     {Kind::k_biases, {HD, 1}},
      {Kind::v_biases, {HDv, 1}},     {Kind::o_biases, {c.Eo, 1}}};
  std::size_t offset = 0;
  for (const auto& [kind, shape] : expected) {
    const auto view = at::get_multi_head_attn_weights(d, kind, w);
    EXPECT_EQ(view.data(), w.data() + offset) << int(kind);
    EXPECT_EQ(view.extent(0), shape.first) << int(kind);
    EXPECT_EQ(view.extent(1), shape.second) << int(kind);
    offset += view.size();
  }
  EXPECT_EQ(offset, count);
}

TEST(MhaDescriptor, CallsMatchTheReferenceAndTheFunctionalApi) {
  const MhaCase c = sample_case();
  for (const auto algo : kAlgos) {
    SCOPED_TRACE(name_of(algo));
    const at::AttnDescriptor d = descriptor_of(c, 1, algo);  // actual sizes below the maxima
    const auto bytes = at::get_multi_head_attn_buffers<double>(d);
    const auto w = to_device<double*>(normal(bytes.weights / sizeof(double), 5),
                                      bytes.weights / sizeof(double));
    const MhaData data = params_from_buffer(d, w, MhaData::random(c, 40));
    const auto q = to_device<double***>(data.q, c.B, c.S, c.Eq);
    const auto k = to_device<double***>(data.k, c.B, c.Sk, c.Ek);
    const auto v = to_device<double***>(data.v, c.B, c.Sk, c.Ev);
    const auto dout = to_device<double***>(data.dout, c.B, c.S, c.Eo);
    const auto seq_q = to_device<int*>({3, 2}, 2), seq_k = to_device<int*>({5, 3}, 2);
    DeviceView<double*> workspace("workspace", bytes.workspace / sizeof(double));
    DeviceView<double*> reserve("reserve", bytes.reserve / sizeof(double));
    DeviceView<double*> dw("dw", w.size());
    DeviceView<double***> out("out", c.B, c.S, c.Eo), dq("dq", c.B, c.S, c.Eq),
        dk("dk", c.B, c.Sk, c.Ek), dv("dv", c.B, c.Sk, c.Ev);
    const DeviceView<int*> none;
    at::multi_head_attn_forward(Space(), d, none, none, seq_q, seq_k, q, {}, k, v, out, w,
                                workspace, reserve);
    EXPECT_LT(rel_error(to_host(out), reference_mha_forward(c, data)), 1e-12);
    at::multi_head_attn_backward_data(Space(), d, none, none, seq_q, seq_k, dout, dq, dk, dv, w,
                                      workspace, reserve);
    at::multi_head_attn_backward_weights(Space(), d, at::WgradMode::set, q, k, v, w, dw, reserve);

    // The same layer through the functional API gives the same bits.
    at::MhaOptions opts;
    opts.heads = c.H, opts.sm_scaler = c.scale(), opts.dropout = {c.p, c.seed, c.offset};
    opts.algo = algo;
    at::AttentionMask<Space> mask;
    mask.seq_q = seq_q, mask.seq_k = seq_k;
    const auto view = [&](const DeviceView<double*>& buffer, Kind kind) {
      return at::get_multi_head_attn_weights(d, kind, buffer);
    };
    const auto column = [&](const DeviceView<double*>& buffer, Kind kind) {
      const auto m = view(buffer, kind);
      return DeviceView<double*>(m.data(), m.extent(0));
    };
    at::MhaParams<double, Space> params{view(w, Kind::q_weights),  view(w, Kind::k_weights),
                                        view(w, Kind::v_weights),  view(w, Kind::o_weights),
                                        column(w, Kind::q_biases), column(w, Kind::k_biases),
                                        column(w, Kind::v_biases), column(w, Kind::o_biases)};
    DeviceView<double*> dw2("dw2", w.size());
    at::MhaParams<double, Space> grads{view(dw2, Kind::q_weights),  view(dw2, Kind::k_weights),
                                       view(dw2, Kind::v_weights),  view(dw2, Kind::o_weights),
                                       column(dw2, Kind::q_biases), column(dw2, Kind::k_biases),
                                       column(dw2, Kind::v_biases), column(dw2, Kind::o_biases)};
    const auto sizes = at::mha_buffer_sizes(
        at::MhaShape{std::size_t(c.B), std::size_t(c.S), std::size_t(c.Sk), std::size_t(c.Eq),
                     std::size_t(c.Ek), std::size_t(c.Ev), std::size_t(c.H), std::size_t(c.D),
                     std::size_t(c.Dv), std::size_t(c.Eo), algo});
    DeviceView<double*> ws2("ws2", sizes.workspace), rs2("rs2", sizes.reserve);
    DeviceView<double***> out2("out2", c.B, c.S, c.Eo), dq2("dq2", c.B, c.S, c.Eq),
        dk2("dk2", c.B, c.Sk, c.Ek), dv2("dv2", c.B, c.Sk, c.Ev);
    at::mha_forward(Space(), opts, mask, params, q, k, v, {}, out2, rs2, ws2);
    at::mha_backward_data(Space(), opts, mask, params, dout, dq2, dk2, dv2, {}, rs2, ws2);
    at::mha_backward_weights(Space(), opts, params, q, k, v, grads, at::WgradMode::set, rs2);
    EXPECT_EQ(to_host(out), to_host(out2));
    EXPECT_EQ(to_host(dq), to_host(dq2));
    EXPECT_EQ(to_host(dk), to_host(dk2));
    EXPECT_EQ(to_host(dv), to_host(dv2));
    EXPECT_EQ(to_host(dw), to_host(dw2));

    // CUDNN_WGRAD_MODE_ADD adds the same gradients again.
    at::multi_head_attn_backward_weights(Space(), d, at::WgradMode::add, q, k, v, w, dw, reserve);
    auto doubled = to_host(dw2);
    for (double& x : doubled) x *= 2;
    EXPECT_ALLCLOSE(to_host(dw), doubled, 1e-14, 0);
  }
}

TEST(MhaDescriptor, BadDescriptorsAndSizesAreErrors) {
  const MhaCase c = sample_case();
  at::AttnDescriptor d = descriptor_of(c);
  d.k_proj_size = c.D + 1;
  EXPECT_KDNN_ERROR(at::get_multi_head_attn_buffers<float>(d),
                    "desc.k_proj_size=4, expected 3 (desc.q_proj_size");
  d = descriptor_of(c);
  d.v_proj_size = 0;
  EXPECT_KDNN_ERROR(at::get_multi_head_attn_buffers<float>(d),
                    "desc.v_proj_size=0, expected at least 1");
  d = descriptor_of(c);
  d.dropout_p = 1;
  EXPECT_KDNN_ERROR(at::get_multi_head_attn_buffers<float>(d), "desc.dropout_p=1");
  d = descriptor_of(c);
  d.heads = 0;
  EXPECT_KDNN_ERROR(at::get_multi_head_attn_buffers<float>(d), "desc.heads=0");
  d = descriptor_of(c);
  d.algo = at::AttentionAlgo(2);
  EXPECT_KDNN_ERROR(at::get_multi_head_attn_buffers<float>(d),
                    "desc.algo=2, expected AttentionAlgo::fused or AttentionAlgo::unfused");

  d = descriptor_of(c);
  const auto bytes = at::get_multi_head_attn_buffers<float>(d);
  DeviceView<float*> w("w", bytes.weights / sizeof(float));
  EXPECT_KDNN_ERROR(at::get_multi_head_attn_weights(d, Kind(9), w),
                    "kind=9, expected an MhaWeightKind");
  d.proj_biases = false;
  EXPECT_KDNN_ERROR(at::get_multi_head_attn_weights(d, Kind::o_biases, w),
                    "expected " + std::to_string(w.size() - (2 * c.H * c.D + c.H * c.Dv + c.Eo)));
  DeviceView<float*> small("small",
                           at::get_multi_head_attn_buffers<float>(d).weights / sizeof(float));
  EXPECT_KDNN_ERROR(at::get_multi_head_attn_weights(d, Kind::o_biases, small),
                    "kind=7 is a bias, but desc.proj_biases is false");

  d = descriptor_of(c);
  DeviceView<float***> q("q", c.B + 1, c.S, c.Eq), k("k", c.B + 1, c.Sk, c.Ek),
      v("v", c.B + 1, c.Sk, c.Ev), out("out", c.B + 1, c.S, c.Eo);
  DeviceView<float*> ws("ws", bytes.workspace / sizeof(float)),
      rs("rs", bytes.reserve / sizeof(float));
  const DeviceView<int*> none;
  EXPECT_KDNN_ERROR(
      at::multi_head_attn_forward(Space(), d, none, none, none, none, q, {}, k, v, out, w, ws, rs),
      "batch B=3 exceeds desc.max_batch_size=2");
}

}  // namespace
