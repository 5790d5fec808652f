// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Team scratch carved by a bump allocator. A kernel declares its scratch
// layout once, as a function that takes a ScratchCarver and returns the
// pointers it carved:
//
//   template <class T>
//   struct Work { T* P; double* aux; };
//   KOKKOS_INLINE_FUNCTION static Work<T> carve(ScratchCarver& s, int n) {
//     return {s.take<T>(n * n), s.take<double>(n)};
//   }
//
// Run on a carver without memory it only counts bytes (host-side planning:
// layout_bytes); run on the team's scratch it hands out the same pointers.
// The size formula and the carving cannot drift apart.
#include <cstddef>

#include <Kokkos_Core.hpp>

namespace kdnn::impl {

/// Alignment of a carved block's start (covers float and double vectors).
constexpr std::size_t kScratchAlign = 16;

class ScratchCarver {
 public:
  /// Counts bytes only (every take returns nullptr). Host and device without
  /// annotations: nvcc infers them for a function defaulted on its first
  /// declaration (and nvcc 13 warns, #20012, about explicit ones).
  ScratchCarver() = default;
  /// Hands out memory from `base`, which must be kScratchAlign-aligned.
  KOKKOS_INLINE_FUNCTION explicit ScratchCarver(void* base) : base_(static_cast<char*>(base)) {}

  /// `count` elements of V, aligned for V (and to at least 8 bytes).
  template <class V>
  KOKKOS_INLINE_FUNCTION V* take(std::size_t count) {
    constexpr std::size_t align = alignof(V) > 8 ? alignof(V) : 8;
    offset_ = (offset_ + align - 1) / align * align;
    V* p = base_ ? reinterpret_cast<V*>(base_ + offset_) : nullptr;
    offset_ += count * sizeof(V);
    return p;
  }

  /// Bytes taken so far, rounded up to kScratchAlign (so that blocks of this
  /// size can be laid end to end).
  KOKKOS_INLINE_FUNCTION std::size_t bytes() const {
    return (offset_ + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
  }

 private:
  char* base_ = nullptr;
  std::size_t offset_ = 0;
};

/// Bytes a layout function `carve(ScratchCarver&)` takes. Called on the
/// host with host lambdas (launch planning) and in kernels with the kernel's
/// own layout; nvcc's host/device check is off for it, as it cannot see that
/// each instantiation is only called where its `carve` can run.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Carve>
KOKKOS_INLINE_FUNCTION std::size_t layout_bytes(const Carve& carve) {
  ScratchCarver counter;
  carve(counter);
  return counter.bytes();
}

/// Bytes to request from Kokkos for `bytes` of carved team scratch (room to
/// align the start).
inline std::size_t team_scratch_request(std::size_t bytes) { return bytes + kScratchAlign; }

/// The start of a team's carved scratch of `bytes` (as requested with
/// team_scratch_request) at `level`.
template <class Member>
KOKKOS_INLINE_FUNCTION void* team_scratch_base(const Member& team, int level, std::size_t bytes) {
  return team.team_scratch(level).get_shmem_aligned(bytes, kScratchAlign);
}

}  // namespace kdnn::impl
