// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Tests of kdnn::io .npy reading and writing: dtypes, round trips, the
// files written, files NumPy wrote, typed access, integer vectors and
// arrays as Views. The files under data/npy/ were written by NumPy 1.24
// (np.save / np.lib.format.write_array), with
// unit_tests/reference/gen_npy_fixtures.py. Header parsing, damaged files
// and escaped messages: test_npy_headers.cpp; sets of files, temporaries
// and files that are not regular: test_npy_files.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "expect_error.hpp"
#include "kdnn/core/error.hpp"
#include "kdnn/io/npy.hpp"
#include "kdnn/io/npy_view.hpp"
#include "npy_test_files.hpp"

using kdnn::io::DType;
using kdnn::io::NpyArray;
using kdnn::io::read_int_vector;
using kdnn::io::read_npy;
using kdnn::io::write_npy;
using namespace kdnn_test;  // fs, the fixture and the file helpers

namespace {

/// The i-th test value of type T (i < 32); integers of either sign that use
/// the type's full width.
template <class T>
T sample(std::size_t i) {
  if constexpr (std::is_integral_v<T>) {
    const T high = T(i) << (8 * sizeof(T) - 6);
    return (i % 2 ? -high : high) + T(i);
  } else {
    return T(0.1) * T(i) - T(3);
  }
}

template <class T>
void check_round_trip(const std::string& path, const std::vector<std::size_t>& shape) {
  std::size_t count = 1;
  for (const std::size_t d : shape) count *= d;
  std::vector<T> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = sample<T>(i);

  write_npy<T>(path, shape, values.data());
  const NpyArray array = read_npy(path);

  EXPECT_EQ(array.dtype, kdnn::io::dtype_of<T>());
  EXPECT_EQ(array.shape, shape);
  ASSERT_EQ(array.size(), count);
  ASSERT_EQ(array.bytes.size(), count * sizeof(T));
  const T* data = array.data<T>();
  for (std::size_t i = 0; i < count; ++i) EXPECT_EQ(data[i], values[i]) << "i=" << i;
}

const std::vector<std::vector<std::size_t>> kShapes = {{}, {0}, {5}, {2, 3, 4}, {0, 4, 4}};

}  // namespace

TEST(NpyDType, Names) {
  EXPECT_STREQ(kdnn::io::dtype_name(DType::f32), "float32");
  EXPECT_STREQ(kdnn::io::dtype_name(DType::f64), "float64");
  EXPECT_STREQ(kdnn::io::dtype_name(DType::i32), "int32");
  EXPECT_STREQ(kdnn::io::dtype_name(DType::i64), "int64");
}

TEST(NpyDType, SizesAndKinds) {
  static_assert(kdnn::io::dtype_of<std::int32_t>() == DType::i32);
  static_assert(kdnn::io::dtype_of<std::int64_t>() == DType::i64);
  static_assert(kdnn::io::element_size(DType::f32) == 4);
  static_assert(kdnn::io::element_size(DType::f64) == 8);
  static_assert(kdnn::io::element_size(DType::i32) == 4);
  static_assert(kdnn::io::element_size(DType::i64) == 8);
  static_assert(kdnn::io::is_floating(DType::f32) && kdnn::io::is_floating(DType::f64));
  static_assert(!kdnn::io::is_floating(DType::i32) && !kdnn::io::is_floating(DType::i64));
  for (const DType dtype : {DType::f32, DType::f64, DType::i32, DType::i64}) {
    const NpyArray array = kdnn::io::allocate_npy(dtype, {2, 3});
    EXPECT_EQ(array.element_size(), kdnn::io::element_size(dtype));
    EXPECT_EQ(array.bytes.size(), 6 * kdnn::io::element_size(dtype));
  }
}

TEST_F(Npy, RoundTripFloat32) {
  for (const auto& shape : kShapes) {
    SCOPED_TRACE("rank " + std::to_string(shape.size()));
    check_round_trip<float>(path("a.npy"), shape);
  }
}

TEST_F(Npy, RoundTripFloat64) {
  for (const auto& shape : kShapes) {
    SCOPED_TRACE("rank " + std::to_string(shape.size()));
    check_round_trip<double>(path("a.npy"), shape);
  }
}

TEST_F(Npy, RoundTripInt32) {
  for (const auto& shape : kShapes) {
    SCOPED_TRACE("rank " + std::to_string(shape.size()));
    check_round_trip<std::int32_t>(path("a.npy"), shape);
  }
}

TEST_F(Npy, RoundTripInt64) {
  for (const auto& shape : kShapes) {
    SCOPED_TRACE("rank " + std::to_string(shape.size()));
    check_round_trip<std::int64_t>(path("a.npy"), shape);
  }
}

TEST_F(Npy, WrittenIntegerFilesEqualNumPysByteForByte) {
  const std::int32_t i32[3] = {1, 2, 3};
  write_npy<std::int32_t>(path("i32.npy"), {3}, i32);
  EXPECT_EQ(read_bytes(path("i32.npy")), read_bytes(fixture("i32_3.npy")));
  const std::int64_t i64[5] = {0, -5, 2147483647, -2147483648LL, 12};
  write_npy(path("i64.npy"), DType::i64, {5}, i64);
  EXPECT_EQ(read_bytes(path("i64.npy")), read_bytes(fixture("i64_5.npy")));
}

TEST_F(Npy, WrittenHeaderFollowsNumPy) {
  const std::vector<std::pair<std::vector<std::size_t>, std::string>> cases = {
      {{}, "()"}, {{3}, "(3,)"}, {{2, 3}, "(2, 3)"}};
  for (const auto& [shape, shape_text] : cases) {
    const double values[6] = {};
    write_npy(path("a.npy"), DType::f64, shape, values);
    const std::string bytes = read_bytes(path("a.npy"));
    ASSERT_GE(bytes.size(), 10u);
    EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
    const std::size_t header_len = std::uint8_t(bytes[8]) | std::size_t(std::uint8_t(bytes[9]))
                                                                << 8;
    EXPECT_EQ((10 + header_len) % 64, 0u);
    const std::string text = bytes.substr(10, header_len);
    EXPECT_EQ(
        text.rfind("{'descr': '<f8', 'fortran_order': False, 'shape': " + shape_text + ", }", 0),
        0u)
        << text;
    EXPECT_EQ(text.back(), '\n');
  }
}

TEST_F(Npy, WriteReplacesExistingFileAndLeavesNoTemporary) {
  const float first[2] = {1, 2};
  const float second[3] = {3, 4, 5};
  write_npy<float>(path("a.npy"), {2}, first);
  write_npy<float>(path("a.npy"), {3}, second);
  const NpyArray array = read_npy(path("a.npy"));
  ASSERT_EQ(array.shape, std::vector<std::size_t>{3});
  EXPECT_EQ(array.data<float>()[2], 5.0f);
  EXPECT_EQ(entries(), std::set<std::string>{"a.npy"});
}

TEST_F(Npy, WriteIntoMissingDirectoryThrowsAndLeavesNoFile) {
  const std::string target = path("missing/a.npy");
  const double values[2] = {1, 2};
  const std::string message = kdnn_test::error_of([&] { write_npy<double>(target, {2}, values); });
  EXPECT_EQ(message.rfind(target, 0), 0u) << message;
  EXPECT_TRUE(entries().empty());
}

TEST_F(Npy, FailedRenameRemovesTemporary) {
  // The target is a directory: the temporary is written, the rename fails.
  const std::string target = path("dir.npy");
  fs::create_directory(target);
  const double values[2] = {1, 2};
  const std::string message = kdnn_test::error_of([&] { write_npy<double>(target, {2}, values); });
  EXPECT_EQ(message.rfind(target, 0), 0u) << message;
  expect_contains(message, "rename");
  EXPECT_TRUE(fs::is_directory(target));
  EXPECT_EQ(entries(), std::set<std::string>{"dir.npy"});
}

// ---- files written by NumPy ----

TEST(NpyNumPyFiles, Float32Matrix) {
  const NpyArray array = read_npy(fixture("f32_2x3.npy"));
  EXPECT_EQ(array.dtype, DType::f32);
  EXPECT_EQ(array.shape, (std::vector<std::size_t>{2, 3}));
  const std::vector<float> expected = {1.5f, -2.25f, 0.1f, 3.0f, 1e30f, -0.0f};
  ASSERT_EQ(array.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(array.data<float>()[i], expected[i]) << "i=" << i;
  }
  EXPECT_TRUE(std::signbit(array.data<float>()[5]));
}

TEST(NpyNumPyFiles, Float64Vector) {
  const NpyArray array = read_npy(fixture("f64_4.npy"));
  EXPECT_EQ(array.dtype, DType::f64);
  EXPECT_EQ(array.shape, std::vector<std::size_t>{4});
  const std::vector<double> expected = {0.1, -2.5, 1e300, 3.141592653589793};
  ASSERT_EQ(array.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(array.data<double>()[i], expected[i]) << "i=" << i;
  }
}

TEST(NpyNumPyFiles, Float64Scalar) {
  const NpyArray array = read_npy(fixture("f64_scalar.npy"));
  EXPECT_EQ(array.dtype, DType::f64);
  EXPECT_TRUE(array.shape.empty());
  ASSERT_EQ(array.size(), 1u);
  EXPECT_EQ(array.data<double>()[0], 42.5);
}

TEST(NpyNumPyFiles, Version2) {
  const NpyArray array = read_npy(fixture("f64_2x2_v2.npy"));
  EXPECT_EQ(array.shape, (std::vector<std::size_t>{2, 2}));
  const double* data = array.data<double>();
  EXPECT_EQ(std::vector<double>(data, data + 4), (std::vector<double>{1, 2, 3, 4}));
}

TEST(NpyNumPyFiles, Version3) {
  const NpyArray array = read_npy(fixture("f32_3_v3.npy"));
  EXPECT_EQ(array.shape, std::vector<std::size_t>{3});
  const float* data = array.data<float>();
  EXPECT_EQ(std::vector<float>(data, data + 3), (std::vector<float>{0.25f, 0.5f, 0.75f}));
}

TEST(NpyNumPyFiles, FortranOrderIsRejected) {
  expect_read_error(fixture("f64_2x3_fortran.npy"),
                    {"Fortran order not supported", "expected C order"});
}

TEST(NpyNumPyFiles, Int32Vector) {
  const NpyArray array = read_npy(fixture("i32_3.npy"));
  EXPECT_EQ(array.dtype, DType::i32);
  EXPECT_EQ(array.shape, std::vector<std::size_t>{3});
  const std::int32_t* data = array.data<std::int32_t>();
  EXPECT_EQ(std::vector<std::int32_t>(data, data + 3), (std::vector<std::int32_t>{1, 2, 3}));
}

TEST(NpyNumPyFiles, Int32MatrixWithTheExtremes) {
  const NpyArray array = read_npy(fixture("i32_2x3.npy"));
  EXPECT_EQ(array.dtype, DType::i32);
  EXPECT_EQ(array.shape, (std::vector<std::size_t>{2, 3}));
  const std::int32_t* data = array.data<std::int32_t>();
  EXPECT_EQ(std::vector<std::int32_t>(data, data + 6),
            (std::vector<std::int32_t>{INT32_MIN, -1, 0, 1, 7, INT32_MAX}));
}

TEST(NpyNumPyFiles, Int64Vector) {
  const NpyArray array = read_npy(fixture("i64_5.npy"));
  EXPECT_EQ(array.dtype, DType::i64);
  EXPECT_EQ(array.shape, std::vector<std::size_t>{5});
  const std::int64_t* data = array.data<std::int64_t>();
  EXPECT_EQ(std::vector<std::int64_t>(data, data + 5),
            (std::vector<std::int64_t>{0, -5, INT32_MAX, INT32_MIN, 12}));
}

TEST(NpyNumPyFiles, BigEndianIsRejected) {
  expect_read_error(fixture("f8_bigendian_3.npy"), {"dtype '>f8' not supported"});
  expect_read_error(fixture("i4_bigendian_3.npy"), {"dtype '>i4' not supported"});
}

TEST(NpyNumPyFiles, UnsignedAndOtherIntegerWidthsAreRejected) {
  const std::vector<std::string> expected = {
      "'<f4' (float32), '<f8' (float64), "
      "'<i4' (int32), '<i8' (int64), '<f2' (float16) or [('bfloat16', '<u2')] (bfloat16)"};
  expect_read_error(fixture("u4_3.npy"), {"dtype '<u4' not supported", expected[0]});
  expect_read_error(fixture("i2_3.npy"), {"dtype '<i2' not supported", expected[0]});
}

TEST(NpyNumPyFiles, StructuredDTypeIsRejected) {
  expect_read_error(fixture("structured_2.npy"),
                    {"dtype [('a', '<f4'), ('b', '<i4')] not supported"});
}

// ---- typed access ----

TEST(NpyTypedAccess, DataTypeMismatchThrows) {
  const NpyArray array = read_npy(fixture("f64_4.npy"));
  const std::string message = kdnn_test::error_of([&] { array.data<float>(); });
  expect_contains(message, "dtype float64");
  expect_contains(message, "requested float32");

  NpyArray f32 = read_npy(fixture("f32_2x3.npy"));
  expect_contains(kdnn_test::error_of([&] { f32.data<double>(); }), "requested float64");
}

TEST(NpyTypedAccess, IntegerDataTypeMismatchThrows) {
  const NpyArray i32 = read_npy(fixture("i32_3.npy"));
  expect_contains(kdnn_test::error_of([&] { i32.data<std::int64_t>(); }),
                  "dtype int32, requested int64");
  expect_contains(kdnn_test::error_of([&] { i32.data<float>(); }),
                  "dtype int32, requested float32");
  const NpyArray f64 = read_npy(fixture("f64_4.npy"));
  expect_contains(kdnn_test::error_of([&] { f64.data<std::int64_t>(); }),
                  "dtype float64, requested int64");
  NpyArray i64 = read_npy(fixture("i64_5.npy"));
  expect_contains(kdnn_test::error_of([&] { i64.data<double>(); }),
                  "dtype int64, requested float64");
}

TEST(NpyTypedAccess, InconsistentByteCountThrows) {
  NpyArray array;
  array.dtype = DType::f32;
  array.shape = {2, 2};
  array.bytes.resize(12);
  expect_contains(kdnn_test::error_of([&] { array.data<float>(); }), "holds 12 bytes, expected 16");
}

// ---- integers as int, floats only as floats ----

TEST(NpyIntVector, Int32AndInt64ValuesOfAnyShape) {
  EXPECT_EQ(read_int_vector(read_npy(fixture("i32_2x3.npy")), "w.npy"),
            (std::vector<int>{INT32_MIN, -1, 0, 1, 7, INT32_MAX}));
  EXPECT_EQ(read_int_vector(read_npy(fixture("i64_5.npy")), "w.npy"),
            (std::vector<int>{0, -5, INT32_MAX, INT32_MIN, 12}));
  NpyArray scalar = kdnn::io::allocate_npy(DType::i64, {});
  scalar.data<std::int64_t>()[0] = -9;
  EXPECT_EQ(read_int_vector(scalar, "s.npy"), std::vector<int>{-9});
  EXPECT_TRUE(read_int_vector(kdnn::io::allocate_npy(DType::i32, {0, 4}), "e.npy").empty());
}

TEST(NpyIntVector, Int64BeyondIntNamesTheIndexAndTheValue) {
  const NpyArray numpy = read_npy(fixture("i64_beyond_int_3.npy"));
  const std::string message = kdnn_test::error_of([&] { read_int_vector(numpy, "lengths.npy"); });
  EXPECT_EQ(message.rfind("lengths.npy: ", 0), 0u) << message;
  expect_contains(message, "value 2147483648 at flat index 2");
  expect_contains(message, "outside the range of int [-2147483648, 2147483647]");

  NpyArray below = kdnn::io::allocate_npy(DType::i64, {2, 2});
  below.data<std::int64_t>()[3] = std::int64_t(INT32_MIN) - 1;
  expect_contains(kdnn_test::error_of([&] { read_int_vector(below, "lo.npy"); }),
                  "lo.npy: value -2147483649 at flat index 3");
}

TEST(NpyIntVector, FloatArraysAreRejected) {
  const NpyArray f32 = read_npy(fixture("f32_2x3.npy")), f64 = read_npy(fixture("f64_4.npy"));
  EXPECT_EQ(kdnn_test::error_of([&] { read_int_vector(f32, "w.npy"); }),
            "w.npy: dtype float32, expected int32 or int64");
  EXPECT_EQ(kdnn_test::error_of([&] { read_int_vector(f64, "w.npy"); }),
            "w.npy: dtype float64, expected int32 or int64");
}

TEST(NpyRequireFloating, IntegerArraysAreRejected) {
  EXPECT_EQ(kdnn_test::error_of(
                [&] { kdnn::io::require_floating(read_npy(fixture("i32_3.npy")), "x.npy"); }),
            "x.npy: dtype int32, expected float32 or float64");
  EXPECT_EQ(kdnn_test::error_of(
                [&] { kdnn::io::require_floating(read_npy(fixture("i64_5.npy")), "x.npy"); }),
            "x.npy: dtype int64, expected float32 or float64");
  EXPECT_NO_THROW(kdnn::io::require_floating(read_npy(fixture("f32_2x3.npy")), "x.npy"));
  EXPECT_NO_THROW(kdnn::io::require_floating(read_npy(fixture("f64_4.npy")), "x.npy"));
}

// ---- arrays as Views (npy_view.hpp) ----

TEST(NpyView, AllocatedArrayIsZeroFilled) {
  const NpyArray array = kdnn::io::allocate_npy(DType::f32, {2, 3});
  EXPECT_EQ(array.dtype, DType::f32);
  EXPECT_EQ(array.shape, (std::vector<std::size_t>{2, 3}));
  ASSERT_EQ(array.bytes.size(), 24u);
  for (const unsigned char b : array.bytes) EXPECT_EQ(b, 0);
}

TEST(NpyView, ViewsTheArraysOwnElementsInCOrder) {
  static_assert(kdnn::io::dtype_of<float>() == DType::f32);
  static_assert(kdnn::io::dtype_of<double>() == DType::f64);
  NpyArray array = kdnn::io::allocate_npy(DType::f64, {2, 3, 4});
  const auto view = kdnn::io::view_of<double***>(array, "a");
  EXPECT_EQ(view.data(), array.data<double>());
  EXPECT_EQ(view.extent(0), 2u);
  EXPECT_EQ(view.extent(1), 3u);
  EXPECT_EQ(view.extent(2), 4u);
  view(1, 2, 3) = 7;
  EXPECT_EQ(array.data<double>()[(1 * 3 + 2) * 4 + 3], 7.0);

  const NpyArray& read_only = array;
  EXPECT_EQ(kdnn::io::view_of<const double***>(read_only, "a")(1, 2, 3), 7.0);
  const NpyArray scalar = read_npy(fixture("f64_scalar.npy"));
  EXPECT_EQ(kdnn::io::view_of<const double>(scalar, "s")(), scalar.data<double>()[0]);
}

TEST(NpyView, WrongDTypeOrRankThrows) {
  NpyArray array = kdnn::io::allocate_npy(DType::f32, {2, 3});
  expect_contains(kdnn_test::error_of([&] { kdnn::io::view_of<double**>(array, "x.npy"); }),
                  "x.npy has dtype float32, expected float64");
  expect_contains(kdnn_test::error_of([&] { kdnn::io::view_of<float***>(array, "x.npy"); }),
                  "x.npy has shape (2, 3), expected a 3-d array");
  const NpyArray ints = read_npy(fixture("i32_2x3.npy"));
  expect_contains(kdnn_test::error_of([&] { kdnn::io::view_of<const float**>(ints, "x.npy"); }),
                  "x.npy has dtype int32, expected float32");
}

TEST(NpyView, IntegerArraysAsIntegerViews) {
  const NpyArray array = read_npy(fixture("i32_2x3.npy"));
  const auto view = kdnn::io::view_of<const std::int32_t**>(array, "w.npy");
  EXPECT_EQ(view(1, 2), INT32_MAX);
  EXPECT_EQ(view(0, 0), INT32_MIN);
  expect_contains(
      kdnn_test::error_of([&] { kdnn::io::view_of<const std::int64_t**>(array, "w.npy"); }),
      "w.npy has dtype int32, expected int64");
}
