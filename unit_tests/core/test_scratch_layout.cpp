// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The scratch carver: counting and carving agree, takes are aligned, blocks
// laid end to end stay aligned.
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "kdnn/core/impl/scratch_layout.hpp"

namespace {

using kdnn::impl::ScratchCarver;

struct Work {
  float* a;
  double* b;
  float* c;
  char* d;
};

Work carve(ScratchCarver& s, int n) {
  return {s.take<float>(n), s.take<double>(n), s.take<float>(3), s.take<char>(1)};
}

TEST(ScratchLayout, CountingAndCarvingAgree) {
  for (int n : {1, 2, 3, 7, 16}) {
    const std::size_t bytes = kdnn::impl::layout_bytes([&](ScratchCarver& s) { carve(s, n); });
    EXPECT_EQ(bytes % kdnn::impl::kScratchAlign, 0u);
    // Two blocks end to end in a buffer of exactly 2·bytes (+ alignment).
    std::vector<char> buffer(2 * bytes + kdnn::impl::kScratchAlign);
    char* base = buffer.data();
    base += (kdnn::impl::kScratchAlign - std::uintptr_t(base) % kdnn::impl::kScratchAlign) %
            kdnn::impl::kScratchAlign;
    for (int block = 0; block < 2; ++block) {
      char* start = base + block * bytes;
      ScratchCarver s(start);
      const Work w = carve(s, n);
      EXPECT_EQ(s.bytes(), bytes);
      EXPECT_EQ(reinterpret_cast<char*>(w.a), start);
      EXPECT_EQ(std::uintptr_t(w.b) % alignof(double), 0u);
      EXPECT_GE(reinterpret_cast<char*>(w.b), reinterpret_cast<char*>(w.a + n));
      EXPECT_GE(reinterpret_cast<char*>(w.c), reinterpret_cast<char*>(w.b + n));
      EXPECT_GE(w.d, reinterpret_cast<char*>(w.c + 3));
      EXPECT_LE(w.d + 1, start + bytes);
    }
  }
}

TEST(ScratchLayout, CountingReturnsNoMemory) {
  ScratchCarver counter;
  EXPECT_EQ(counter.take<double>(4), nullptr);
  EXPECT_EQ(counter.bytes(), 32u);
  EXPECT_EQ(counter.take<float>(1), nullptr);
  EXPECT_EQ(counter.bytes(), 48u);  // 36 rounded up to the block alignment
}

}  // namespace
