// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// fingerprint (core/impl/fingerprint.hpp), what the context-parallel
// operators compare between ranks for their parameters: equal values give
// equal fingerprints, whatever the backend; a change of one bit of one
// element, of an element's position or of the shape gives another.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "kdnn/core/impl/fingerprint.hpp"
#include "views.hpp"

namespace {

using kdnn_test::DeviceView;
using kdnn_test::Space;
using kdnn_test::to_device;

std::uint64_t of(const std::vector<double>& values) {
  return kdnn::impl::fingerprint(Space(), to_device<double*>(values, values.size()));
}

TEST(Fingerprint, EqualValuesGiveEqualFingerprints) {
  const std::vector<double> a = {-1.0, 0.5, 3.0, -0.25, 1e300};
  EXPECT_EQ(of(a), of(a));
  // A float View of the same values: the same fingerprint (the dtype is
  // compared on its own).
  const auto f = to_device<float*>({-1.0, 0.5, 3.0, -0.25}, 4);
  EXPECT_EQ(kdnn::impl::fingerprint(Space(), f), of({-1.0, 0.5, 3.0, -0.25}));
}

TEST(Fingerprint, AnyChangeGivesAnotherFingerprint) {
  const std::vector<double> base = {-1.0, 0.5, 3.0, -0.25};
  std::set<std::uint64_t> seen = {of(base)};
  auto one_ulp = base;
  one_ulp[2] = std::nextafter(3.0, 4.0);
  auto swapped = base;
  std::swap(swapped[0], swapped[1]);
  auto longer = base;
  longer.push_back(0.0);
  for (const auto& v :
       {one_ulp, swapped, longer, std::vector<double>{0.0}, std::vector<double>{}}) {
    EXPECT_TRUE(seen.insert(of(v)).second) << "a collision at " << v.size() << " values";
  }
  EXPECT_NE(of({0.0}), of({-0.0}));
  // The shape counts: [2, 2] and [4] of the same values differ.
  const auto matrix = to_device<double**>(base, 2, 2);
  EXPECT_NE(kdnn::impl::fingerprint(Space(), matrix), of(base));
}

TEST(Fingerprint, EmptyViewsDependOnTheirShapeOnly) {
  EXPECT_EQ(kdnn::impl::fingerprint(Space(), DeviceView<double*>()), of({}));
  EXPECT_NE(kdnn::impl::fingerprint(Space(), DeviceView<double**>("m", 0, 3)), of({}));
}

}  // namespace
