// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Philox-4x32-10 against the known-answer vectors of Random123 (kat_vectors).
#include <gtest/gtest.h>

#include "kdnn/core/impl/philox.hpp"

namespace {

void expect_kat(kdnn::impl::Philox4x32 counter, std::uint32_t k0, std::uint32_t k1,
                kdnn::impl::Philox4x32 expected) {
  const auto got = kdnn::impl::philox4x32_10(counter, k0, k1);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], expected.v[i]) << "word " << i;
}

TEST(Philox, KnownAnswers) {
  expect_kat({{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}});
  expect_kat({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu,
             {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}});
  expect_kat({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u,
             {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}});
}

}  // namespace
