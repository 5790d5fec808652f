// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The descriptor interface's non-template parts: checking a descriptor and
// laying out its weight buffer.
#include "kdnn/attention/mha_descriptor.hpp"

#include "kdnn/core/validate.hpp"

namespace kdnn::attention::impl {

void validate_descriptor(const char* op, const AttnDescriptor& d) {
  if (d.heads < 1) fail(op, ": desc.heads=", d.heads, ", expected at least 1");
  validate::finite(op, "desc.sm_scaler", d.sm_scaler);
  validate::in_half_open(op, "desc.dropout_p", d.dropout_p, 0.0, 1.0);
  check_algo(op, "desc.algo", d.algo);
  const auto positive = [&](const char* name, std::size_t value, const char* what) {
    if (value == 0) fail(op, ": desc.", name, "=0, expected at least 1 (", what, ")");
  };
  positive("q_size", d.q_size, "E_q");
  positive("k_size", d.k_size, "E_k");
  positive("v_size", d.v_size, "E_v");
  positive("q_proj_size", d.q_proj_size, "D per head: kdnn always projects");
  positive("v_proj_size", d.v_proj_size, "Dv per head: kdnn always projects");
  positive("o_proj_size", d.o_proj_size, "E_o: kdnn always projects");
  if (d.k_proj_size != d.q_proj_size) {
    fail(op, ": desc.k_proj_size=", d.k_proj_size, ", expected ", d.q_proj_size,
         " (desc.q_proj_size: queries and keys are projected to the same size)");
  }
}

WeightSlot weight_slot(const AttnDescriptor& d, MhaWeightKind kind) {
  const std::size_t H = std::size_t(d.heads), HD = H * d.q_proj_size, HDv = H * d.v_proj_size;
  const WeightSlot slots[] = {
      {0, HD, d.q_size}, {0, HD, d.k_size}, {0, HDv, d.v_size}, {0, d.o_proj_size, HDv},
      {0, HD, 1},        {0, HD, 1},        {0, HDv, 1},        {0, d.o_proj_size, 1}};
  const int index = int(kind);
  if (index < 0 || index >= 8) {
    fail("attention::get_multi_head_attn_weights: kind=", index,
         ", expected an MhaWeightKind (0 to 7)");
  }
  if (index >= 4 && !d.proj_biases) {
    fail("attention::get_multi_head_attn_weights: kind=", index,
         " is a bias, but desc.proj_biases is false (no biases)");
  }
  std::size_t offset = 0;
  for (int k = 0; k < index; ++k) offset += slots[k].rows * slots[k].cols;
  return {offset, slots[index].rows, slots[index].cols};
}

std::size_t weight_count(const AttnDescriptor& d) {
  const std::size_t H = std::size_t(d.heads), HD = H * d.q_proj_size, HDv = H * d.v_proj_size;
  const std::size_t weights = HD * (d.q_size + d.k_size) + HDv * d.v_size + d.o_proj_size * HDv;
  return weights + (d.proj_biases ? 2 * HD + HDv + d.o_proj_size : 0);
}

MhaShape max_shape(const AttnDescriptor& d) {
  MhaShape s;
  s.batch = d.max_batch_size, s.seq_q = d.qo_max_seq_length, s.seq_k = d.kv_max_seq_length;
  s.q_size = d.q_size, s.k_size = d.k_size, s.v_size = d.v_size;
  s.heads = std::size_t(d.heads), s.head_dim = d.q_proj_size, s.v_head_dim = d.v_proj_size;
  s.o_size = d.o_proj_size;
  s.algo = d.algo;
  return s;
}

MhaOptions options_of(const AttnDescriptor& d) {
  MhaOptions opts;
  opts.heads = d.heads;
  opts.sm_scaler = d.sm_scaler;
  opts.dropout = {d.dropout_p, d.dropout_seed, d.dropout_offset};
  opts.algo = d.algo;
  return opts;
}

void check_within_maxima(const char* op, const AttnDescriptor& d, std::size_t batch,
                         std::size_t seq_q, std::size_t seq_k) {
  const auto within = [&](const char* what, std::size_t value, const char* field, std::size_t max) {
    if (value > max) fail(op, ": ", what, "=", value, " exceeds desc.", field, "=", max);
  };
  within("batch B", batch, "max_batch_size", d.max_batch_size);
  within("query length S", seq_q, "qo_max_seq_length", d.qo_max_seq_length);
  within("key length Sk", seq_k, "kv_max_seq_length", d.kv_max_seq_length);
}

}  // namespace kdnn::attention::impl
