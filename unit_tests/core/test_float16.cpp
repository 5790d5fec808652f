// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// kdnn::bfloat16 and kdnn::float16 (kdnn/core/float16.hpp) against an
// independent model of the two formats in double: every one of the 65536
// values of each decodes to its value; every float at, just below and just
// above each midpoint between neighbouring values (the ties, the overflow to
// infinity, the subnormals) and a million random floats encode to the
// nearest value, ties to even; NaN gives the canonical 0x7fff; each value
// round-trips bitwise; and Views of them convert on the default execution
// space as on the host.
#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kdnn/core/float16.hpp"
#include "views.hpp"

namespace {
namespace float16_test {  // one name for this file's helpers (unity builds)

/// A format's fields: exponent and mantissa bits (the sign is the top bit).
struct Format {
  const char* name;
  int exponent_bits, mantissa_bits;
};
constexpr Format kBfloat16{"bfloat16", 8, 7}, kFloat16{"float16", 5, 10};

/// The value of bits `h` in `f`, from the IEEE definition (double holds
/// every one exactly).
double model_value(const Format& f, std::uint16_t h) {
  const int emax = (1 << f.exponent_bits) - 1, bias = emax / 2;
  const bool negative = (h >> 15) != 0;
  const int e = (h >> f.mantissa_bits) & emax;
  const int m = h & ((1 << f.mantissa_bits) - 1);
  double v = 0;
  if (e == emax) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(double(m), 1 - bias - f.mantissa_bits);
  } else {
    v = std::ldexp(double(m + (1 << f.mantissa_bits)), e - bias - f.mantissa_bits);
  }
  return negative ? -v : v;
}

/// The non-negative values of `f` in order, bits 0 … +infinity.
std::vector<std::uint16_t> non_negative(const Format& f) {
  const int emax = (1 << f.exponent_bits) - 1;
  std::vector<std::uint16_t> out;
  for (std::uint32_t h = 0; h <= (std::uint32_t(emax) << f.mantissa_bits); ++h)
    out.push_back(std::uint16_t(h));
  return out;
}

/// The bits `x` should encode to: the nearest value (infinity counted as
/// the value after the largest, 2^(emax − bias + 1)), ties to even bits.
std::uint16_t model_bits(const Format& f, const std::vector<std::uint16_t>& table, double x) {
  if (std::isnan(x)) return 0x7fff;
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  const auto value = [&](std::size_t i) {
    if (i + 1 < table.size()) return model_value(f, table[i]);
    return 2 * model_value(f, std::uint16_t(table[i] - 1)) -
           model_value(f, std::uint16_t(table[i] - 2));  // one step past the largest
  };
  if (a >= value(table.size() - 1)) return std::uint16_t(sign | table.back());
  std::size_t lo = 0, hi = table.size() - 1;  // value(lo) ≤ a < value(hi)
  while (hi - lo > 1) {
    const std::size_t mid = (lo + hi) / 2;
    (value(mid) <= a ? lo : hi) = mid;
  }
  const double below = a - value(lo), above = value(hi) - a;
  const std::size_t pick = below < above ? lo : above < below ? hi : (table[lo] % 2 == 0 ? lo : hi);
  return std::uint16_t(sign | table[pick]);
}

float float_of(std::uint32_t bits) {
  float x = 0;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

template <class T>
std::uint16_t encoded(float x) {
  return kdnn::from_compute<T>(x).bits;
}

template <class T>
void expect_decodes_every_value(const Format& f) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const double want = model_value(f, std::uint16_t(h));
    const float got = kdnn::to_compute(T{std::uint16_t(h)});
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << f.name << " bits " << h;
    } else {
      EXPECT_EQ(double(got), want) << f.name << " bits " << h;
      EXPECT_EQ(std::signbit(got), std::signbit(want)) << f.name << " bits " << h;
    }
  }
}

template <class T>
void expect_encodes_to_nearest_even(const Format& f) {
  const auto table = non_negative(f);
  std::vector<float> inputs;
  // Each midpoint between neighbours, and the floats either side of it.
  for (std::size_t i = 0; i + 1 < table.size(); ++i) {
    const double lo = model_value(f, table[i]);
    const double hi =
        i + 2 < table.size() ? model_value(f, table[i + 1]) : 2 * lo - model_value(f, table[i - 1]);
    const auto mid = float((lo + hi) / 2);  // exact: a 16-bit midpoint has at most 17 bits
    for (const float x : {std::nextafter(mid, 0.0f), mid,
                          std::nextafter(mid, std::numeric_limits<float>::infinity()), float(lo)}) {
      inputs.push_back(x);
      inputs.push_back(-x);
    }
  }
  std::mt19937 gen(7);  // random floats of every exponent (NaN and infinity among them)
  for (int i = 0; i < 1000000; ++i) inputs.push_back(float_of(std::uint32_t(gen())));
  for (const float x :
       {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
        -std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min(),
        std::numeric_limits<float>::max(), -std::numeric_limits<float>::max()})
    inputs.push_back(x);
  int wrong = 0;
  for (const float x : inputs) {
    const std::uint16_t want = model_bits(f, table, double(x)), got = encoded<T>(x);
    if (got != want && ++wrong <= 10) {
      std::uint32_t bits = 0;
      std::memcpy(&bits, &x, sizeof bits);
      ADD_FAILURE() << f.name << ": " << x << " (bits " << std::hex << bits << ") encoded " << got
                    << ", expected " << want;
    }
  }
  EXPECT_EQ(wrong, 0) << f.name << " of " << inputs.size();
}

template <class T>
void expect_round_trips(const Format& f) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    if (std::isnan(model_value(f, std::uint16_t(h)))) continue;
    EXPECT_EQ(encoded<T>(kdnn::to_compute(T{std::uint16_t(h)})), h) << f.name;
  }
}

TEST(Float16, EveryValueDecodesExactly) {
  expect_decodes_every_value<kdnn::bfloat16>(kBfloat16);
  expect_decodes_every_value<kdnn::float16>(kFloat16);
}

TEST(Float16, FloatsEncodeToTheNearestValueTiesToEven) {
  expect_encodes_to_nearest_even<kdnn::bfloat16>(kBfloat16);
  expect_encodes_to_nearest_even<kdnn::float16>(kFloat16);
}

TEST(Float16, EdgesOfTheFormats) {
  using kdnn::bfloat16, kdnn::float16;
  EXPECT_EQ(encoded<float16>(65504.0f), 0x7bff);               // the largest finite
  EXPECT_EQ(encoded<float16>(65519.996f), 0x7bff);             // below the midpoint to 2^16
  EXPECT_EQ(encoded<float16>(65520.0f), 0x7c00);               // the midpoint: to infinity (even)
  EXPECT_EQ(encoded<float16>(-1e6f), 0xfc00);                  // overflow keeps the sign
  EXPECT_EQ(encoded<float16>(std::ldexp(1.0f, -24)), 0x0001);  // the smallest subnormal
  EXPECT_EQ(encoded<float16>(std::ldexp(1.0f, -25)), 0x0000);  // half of it: a tie to 0
  EXPECT_EQ(encoded<float16>(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(encoded<float16>(-std::ldexp(1.0f, -26)), 0x8000);              // −0
  EXPECT_EQ(encoded<bfloat16>(std::numeric_limits<float>::max()), 0x7f80);  // rounds past: inf
  EXPECT_EQ(encoded<bfloat16>(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(encoded<bfloat16>(std::ldexp(1.0f, -133)), 0x0001);           // a bfloat16 subnormal
  EXPECT_EQ(encoded<bfloat16>(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // a tie to even (down)
  EXPECT_EQ(encoded<bfloat16>(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // a tie to even (up)
  EXPECT_EQ(encoded<bfloat16>(std::numeric_limits<float>::quiet_NaN()), 0x7fff);
  EXPECT_EQ(encoded<float16>(-std::numeric_limits<float>::quiet_NaN()), 0x7fff);
  EXPECT_TRUE(std::isnan(kdnn::to_compute(bfloat16{0xffc1})));
  EXPECT_EQ(kdnn::to_compute(float16{0xfc00}), -std::numeric_limits<float>::infinity());
}

TEST(Float16, EveryValueRoundTripsBitwise) {
  expect_round_trips<kdnn::bfloat16>(kBfloat16);
  expect_round_trips<kdnn::float16>(kFloat16);
}

template <class T>
void expect_views_convert_as_the_host() {
  using kdnn_test::Space;
  const int n = 4096;
  std::vector<double> values(n);
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 1000.0f);
  for (double& x : values) x = normal(gen);
  const auto in = kdnn_test::to_device<float*>(values, n);
  Kokkos::View<T*, Space::memory_space> stored("stored", n);
  Kokkos::View<float*, Space::memory_space> back("back", n);
  Kokkos::parallel_for(
      Kokkos::RangePolicy<Space>(0, n), KOKKOS_LAMBDA(int i) {
        stored(i) = kdnn::from_compute<T>(in(i));
        back(i) = kdnn::to_compute(stored(i));
      });
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), stored);
  const auto host_back = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), back);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(host(i).bits, encoded<T>(float(values[std::size_t(i)]))) << i;
    EXPECT_EQ(host_back(i), kdnn::to_compute(host(i))) << i;
  }
}

TEST(Float16, ViewsConvertOnTheDeviceAsOnTheHost) {
  expect_views_convert_as_the_host<kdnn::bfloat16>();
  expect_views_convert_as_the_host<kdnn::float16>();
}

}  // namespace float16_test
}  // namespace
