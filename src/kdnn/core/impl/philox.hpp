// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC 2011; the generator of Random123, cuRAND's philox4_32_10 and
// PyTorch's CUDA dropout): a counter-based generator, so the random words of
// element k are a pure function of (key, counter) — the same on every backend,
// kernel form, team size and thread count, and recomputable in a backward instead of
// stored.
#include <cstdint>

#include <Kokkos_Core.hpp>

namespace kdnn::impl {

struct Philox4x32 {
  std::uint32_t v[4];
};

/// The 10-round Philox-4x32 bijection of `counter` under `key`.
KOKKOS_INLINE_FUNCTION Philox4x32 philox4x32_10(Philox4x32 counter, std::uint32_t key0,
                                                std::uint32_t key1) {
  constexpr std::uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;  // multipliers
  constexpr std::uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;  // Weyl key increments
  std::uint32_t* c = counter.v;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = std::uint64_t(M0) * c[0];
    const std::uint64_t p1 = std::uint64_t(M1) * c[2];
    const std::uint32_t hi0 = std::uint32_t(p0 >> 32), lo0 = std::uint32_t(p0);
    const std::uint32_t hi1 = std::uint32_t(p1 >> 32), lo1 = std::uint32_t(p1);
    const std::uint32_t c1 = c[1], c3 = c[3];
    c[0] = hi1 ^ c1 ^ key0;
    c[1] = lo1;
    c[2] = hi0 ^ c3 ^ key1;
    c[3] = lo0;
    key0 += W0;
    key1 += W1;
  }
  return counter;
}

}  // namespace kdnn::impl
