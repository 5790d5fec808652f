// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// A fused attention test case (sizes, mask, dropout) and its mask on the
// tests' execution space, shared by every form's tests.
#include <string>
#include <vector>

#include <cmath>
#include <cstdint>

#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/softmax.hpp"
#include "kdnn/core/launch.hpp"
#include "views.hpp"

namespace kdnn_test {

/// Sizes, the mask (empty vectors: none) and the dropout probability.
struct FusedCase {
  const char* name;
  int B, H, S, Sk, D, Dv;
  bool causal;
  std::vector<int> lo, hi, seq_q, seq_k;
  double p;
};

/// A vector of ints on the device (an empty View for an empty vector).
inline DeviceView<int*> ints(const std::vector<int>& x) {
  std::vector<double> d(x.begin(), x.end());
  return x.empty() ? DeviceView<int*>() : to_device<int*>(d, x.size());
}

/// The case's mask.
inline kdnn::attention::AttentionMask<Space> mask_of(const FusedCase& c) {
  kdnn::attention::AttentionMask<Space> mask;
  mask.causal = c.causal;
  mask.lo_win = ints(c.lo), mask.hi_win = ints(c.hi);
  mask.seq_q = ints(c.seq_q), mask.seq_k = ints(c.seq_k);
  return mask;
}

/// The case's options: scale 1/√D, its dropout with (seed, offset), the
/// form `form`.
inline kdnn::attention::FusedAttentionOptions case_options(
    const FusedCase& c, std::uint64_t seed, std::uint64_t offset,
    kdnn::KernelForm form = kdnn::KernelForm::automatic) {
  kdnn::attention::FusedAttentionOptions opts;
  opts.scale = 1 / std::sqrt(double(c.D));
  opts.dropout = {c.p, seed, offset};
  opts.launch.form = form;
  return opts;
}

/// What a test case's name says of the form it pinned ("" for the host
/// form).
inline std::string form_suffix(kdnn::KernelForm form) {
  switch (form) {
    case kdnn::KernelForm::gpu:
      return ", GPU form";
    case kdnn::KernelForm::tensor_cores:
      return ", tensor-core form";
    default:
      return "";
  }
}

/// The forms the fused attention's tests pin: the host form, the GPU form
/// and the tensor-core form (each where compiled for the case's head
/// sizes, the next form down elsewhere).
inline std::vector<kdnn::KernelForm> fused_forms() {
  return {kdnn::KernelForm::host, kdnn::KernelForm::gpu, kdnn::KernelForm::tensor_cores};
}

}  // namespace kdnn_test
