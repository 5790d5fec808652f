// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// ALiBi (attention with linear biases), as flash-attn applies it: query i
// and key j of head h in batch entry b score
//   s_ij − slope_bh·|i + Sk_b − S_b − j|
// after the scale and the score cap, where S_b and Sk_b are the entry's
// query and key lengths (mask.seq_q and mask.seq_k, else S and Sk). A
// query's position is counted from the end of the keys (bottom-right
// aligned), which for S_b = Sk_b is plain |i − j|. Under a causal mask
// every visible key has j ≤ i, where the bias differs from −slope·(i − j)
// by a constant of the row: the probabilities are those of either
// alignment, the log-sum-exp shifts by it. The bias is constant in q and k,
// so the backward's dS formula is unchanged; the slopes get no gradient.
#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstddef>
#include <limits>

#include "kdnn/attention/types.hpp"
#include "kdnn/core/error.hpp"

namespace kdnn::attention::impl {

/// The bias of one (batch entry, head): −slope·|i + shift − j|, exact for
/// distances below 2^24 in float. slope = 0: none (the bias is ±0, and a
/// score plus ±0 is the score). Kernels take a head's row from the mask
/// they already hold (VisibleKeys::alibi).
template <class T>
struct AlibiRow {
  T slope = 0;
  int shift = 0;  ///< Sk_b − S_b

  KOKKOS_FORCEINLINE_FUNCTION T operator()(int i, int j) const {
    const int d = i + shift - j;
    return slope * T(d < 0 ? d : -d);
  }
};

/// Checks mask.alibi_slopes for an operator over B entries, H heads, S
/// queries and Sk keys; `heads` = 0 for an operator that adds no bias,
/// which refuses slopes. The slopes are copied to the host (a wait on a
/// GPU) to check that every bias is finite in float: |slope|·max(S, Sk)
/// at most a quarter of float's largest value.
template <class ExecSpace>
void check_alibi(const char* op, const Matrix<const double, ExecSpace>& slopes, std::size_t batch,
                 std::size_t heads, std::size_t queries, std::size_t keys) {
  if (slopes.size() == 0) return;  // not given
  if (heads == 0) {
    fail(op, ": mask.alibi_slopes is given (extents ", slopes.extent(0), "x", slopes.extent(1),
         "), expected none: only the fused attention adds ALiBi's bias");
  }
  if (slopes.extent(1) != heads || (slopes.extent(0) != 1 && slopes.extent(0) != batch)) {
    fail(op, ": mask.alibi_slopes has extents ", slopes.extent(0), "x", slopes.extent(1),
         ", expected 1x", heads, " or ", batch, "x", heads, " ([1 or B, H])");
  }
  const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), slopes);
  const double distance = double(queries > keys ? queries : keys);
  const double limit = double(std::numeric_limits<float>::max()) / 4;
  for (std::size_t b = 0; b < h.extent(0); ++b) {
    for (std::size_t x = 0; x < h.extent(1); ++x) {
      if (!(std::isfinite(h(b, x)) && std::abs(h(b, x)) * distance <= limit)) {
        fail(op, ": mask.alibi_slopes(", b, ", ", x, ")=", h(b, x),
             ", expected a finite slope with |slope|·max(S, Sk) <= ", limit,
             " (max(S, Sk) = ", distance, ")");
      }
    }
  }
}

}  // namespace kdnn::attention::impl
