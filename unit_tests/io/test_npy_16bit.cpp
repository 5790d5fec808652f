// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// .npy files of the 16-bit storage types: float16 as NumPy's '<f2', and
// bfloat16 as its raw bits under the structured dtype [('bfloat16', '<u2')]
// (kdnn/io/npy.hpp). Files NumPy 1.24 wrote (gen_npy_fixtures.py) read as
// the bits NumPy stored, files kdnn writes equal NumPy's byte for byte,
// every bit pattern round-trips, and a structured dtype of any other field
// name or type stays refused. Typed access names both dtypes.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "kdnn/core/float16.hpp"
#include "kdnn/io/npy.hpp"
#include "npy_test_files.hpp"

namespace {
namespace npy16_test {  // one name for this file's helpers (unity builds)

using kdnn::io::DType;
using kdnn::io::NpyArray;
using kdnn::io::read_npy;
using namespace kdnn_test;

/// The bit patterns of an array of a 16-bit dtype.
template <class T>
std::vector<std::uint16_t> bits_of(const NpyArray& array) {
  std::vector<std::uint16_t> bits(array.size());
  const T* data = array.data<T>();
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = data[i].bits;
  return bits;
}

TEST(Npy16, DTypesNamesAndSizes) {
  static_assert(kdnn::io::dtype_of<kdnn::float16>() == DType::f16);
  static_assert(kdnn::io::dtype_of<kdnn::bfloat16>() == DType::bf16);
  static_assert(kdnn::io::element_size(DType::f16) == 2);
  static_assert(kdnn::io::element_size(DType::bf16) == 2);
  static_assert(kdnn::io::is_float16_storage(DType::f16));
  static_assert(kdnn::io::is_float16_storage(DType::bf16));
  static_assert(!kdnn::io::is_floating(DType::f16) && !kdnn::io::is_floating(DType::bf16));
  EXPECT_STREQ(kdnn::io::dtype_name(DType::f16), "float16");
  EXPECT_STREQ(kdnn::io::dtype_name(DType::bf16), "bfloat16");
}

TEST(Npy16, FilesNumPyWroteReadAsTheirBits) {
  const NpyArray f16 = read_npy(fixture("f16_4.npy"));
  EXPECT_EQ(f16.dtype, DType::f16);
  EXPECT_EQ(f16.shape, (std::vector<std::size_t>{4}));
  // 1.5, -2, 65504 (the largest), 2^-24 (the smallest subnormal).
  EXPECT_EQ(bits_of<kdnn::float16>(f16),
            (std::vector<std::uint16_t>{0x3e00, 0xc000, 0x7bff, 0x0001}));
  const NpyArray bf16 = read_npy(fixture("bf16_2x2.npy"));
  EXPECT_EQ(bf16.dtype, DType::bf16);
  EXPECT_EQ(bf16.shape, (std::vector<std::size_t>{2, 2}));
  EXPECT_EQ(bits_of<kdnn::bfloat16>(bf16),
            (std::vector<std::uint16_t>{0x3f80, 0xc020, 0x7f62, 0x0001}));
  EXPECT_EQ(kdnn::to_compute(bf16.data<kdnn::bfloat16>()[1]), -2.5f);
}

TEST_F(Npy, Written16BitFilesEqualNumPysByteForByte) {
  const kdnn::float16 f16[4] = {{0x3e00}, {0xc000}, {0x7bff}, {0x0001}};
  kdnn::io::write_npy(path("f16.npy"), {4}, f16);
  EXPECT_EQ(read_bytes(path("f16.npy")), read_bytes(fixture("f16_4.npy")));
  const kdnn::bfloat16 bf16[4] = {{0x3f80}, {0xc020}, {0x7f62}, {0x0001}};
  kdnn::io::write_npy(path("bf16.npy"), {2, 2}, bf16);
  EXPECT_EQ(read_bytes(path("bf16.npy")), read_bytes(fixture("bf16_2x2.npy")));
}

TEST_F(Npy, EveryBitPatternRoundTrips) {
  std::vector<std::uint16_t> all(65536);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = std::uint16_t(i);
  for (const DType dtype : {DType::f16, DType::bf16}) {
    kdnn::io::write_npy(path("all.npy"), dtype, {256, 256}, all.data());
    const NpyArray back = read_npy(path("all.npy"));
    EXPECT_EQ(back.dtype, dtype);
    EXPECT_EQ(back.shape, (std::vector<std::size_t>{256, 256}));
    ASSERT_EQ(back.bytes.size(), 2 * all.size());
    EXPECT_EQ(std::memcmp(back.bytes.data(), all.data(), back.bytes.size()), 0);
  }
}

TEST_F(Npy, OtherStructuredAndUnsignedDTypesStayRefused) {
  const std::string expected =
      "'<f4' (float32), '<f8' (float64), '<i4' (int32), '<i8' (int64), '<f2' (float16) or "
      "[('bfloat16', '<u2')] (bfloat16)";
  for (const std::string descr : {"[('bf16', '<u2')]", "[('bfloat16', '<i2')]", "'<u2'"}) {
    const std::string dict = "{'descr': " + descr + ", 'fortran_order': False, 'shape': (1,), }";
    std::string header = std::string("\x93NUMPY\x01\x00", 8);
    std::string padded = dict + std::string(64 - (10 + dict.size() + 1) % 64, ' ') + "\n";
    header.push_back(char(padded.size() & 0xff));
    header.push_back(char(padded.size() >> 8));
    write_bytes(path("x.npy"), header + padded + std::string(2, '\0'));
    expect_read_error(path("x.npy"), {"dtype " + descr + " not supported", expected});
  }
}

TEST(Npy16, TypedAccessNamesBothDTypes) {
  const NpyArray f16 = read_npy(fixture("f16_4.npy"));
  EXPECT_NE(error_of([&] { f16.data<kdnn::bfloat16>(); }).find("dtype float16, requested bfloat16"),
            std::string::npos);
  EXPECT_NE(error_of([&] { f16.data<float>(); }).find("dtype float16, requested float32"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              kdnn::io::require_floating(f16, "x.npy");
            }).find("x.npy: dtype float16, expected float32 or float64"),
            std::string::npos);
}

}  // namespace npy16_test
}  // namespace
