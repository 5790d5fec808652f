// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Each packed sequence's final state (SsdForward::sequence_states, mamba's
// varlen states): the state the scan holds after the sequence's last step e,
// from the chunk states of the state pass. With c the chunk of e, starting
// at step c0, and a_k = dt_k·A:
//
//   h_e = Σ_{j=j0..e} exp(a_{j+1} + … + a_e)·dt_j·x_j ⊗ B_j
//         + [no start in c0..e] exp(a_c0 + … + a_e)·H_c
//
// where j0 is the last step of c0..e that starts a sequence (seq_idx, whose
// starts the checks made agree with cu_seqlens), else c0, and H_c the state
// entering chunk c. One element (s, h, p, n) per thread, its loop over at
// most Q steps in reverse; the log-decays summed in double and floored as
// the chunk kernels' (SsdChunks::log_decay), so a decay across a start is 0
// exactly and one that underflows is 0, never NaN.
#include <Kokkos_Core.hpp>
#include <cstddef>

#include "kdnn/core/compat.hpp"
#include "kdnn/ssm/impl/ssd_chunks.hpp"

namespace kdnn::ssm::impl {

template <class ExecSpace, class T>
struct SsdSequenceStates : SsdChunks<ExecSpace, T> {
  using Chunks = SsdChunks<ExecSpace, T>;

  Vector<const int, ExecSpace> cu;           ///< [S + 1] the sequences' offsets
  ChunkStates<const T, ExecSpace> entering;  ///< [1, H, chunks + 1, N·P] after the state pass
  Tensor4<T, ExecSpace> out;                 ///< [S, H, P, N]

  KOKKOS_INLINE_FUNCTION void operator()(std::size_t i) const {
    const int N = this->N(), P = this->P(), H = int(out.extent(1));
    const int n = int(i % N), p = int(i / N % P), h = int(i / N / P % H), s = int(i / N / P / H);
    const int end = cu(s + 1);
    T value = T(0);
    if (end > cu(s)) {
      const int g = h / (H / int(this->Bm.extent(2)));
      const double a = double(this->A(h));
      const int e = end - 1, c = e / this->Q, c0 = c * this->Q;
      double cum = 0;  // a_{j+1} + … + a_e
      int j = e;
      for (; j >= c0; --j) {
        const T dtj = this->dt(0, j, h);
        value += compat::exp(T(cum)) * dtj * this->x(0, j, h, p) * this->Bm(0, j, g, n);
        if (j > 0 && this->seq(0, j) != this->seq(0, j - 1)) break;  // j starts the sequence
        cum += Chunks::log_decay(dtj, a);
      }
      if (j < c0) value += compat::exp(T(cum)) * entering(0, h, c, n * P + p);
    }
    out(s, h, p, n) = value;
  }
};

}  // namespace kdnn::ssm::impl
