// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0 on
// read, 1.0 on write): float32 ('<f4'), float64 ('<f8'), int32 ('<i4'),
// int64 ('<i8'), float16 ('<f2', NumPy's own) and bfloat16 arrays in C
// order, little endian. NumPy has no bfloat16: its arrays are stored as
// their raw 16-bit patterns under a structured dtype that names them,
// [('bfloat16', '<u2')], which NumPy reads and writes as it is (a field
// 'bfloat16' of uint16) and no reader can take for another type (in
// PyTorch: torch.from_numpy(a['bfloat16'].view('<i2')).view(torch.bfloat16)).
// Anything else (Fortran order, other dtypes such as unsigned or other
// widths, big endian, truncated or malformed files) is rejected with a
// kdnn::Error naming the file and the problem. No Kokkos here: the data is
// a plain host buffer.
//
// read_npy accepts all four dtypes, so a caller states which it takes:
// require_floating() for operator data (float32 or float64; the bytes of an
// integer array are never read as floats), read_int_vector() for integer
// parameters (attention windows, sequence lengths) stored as int32 or int64.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kdnn {
struct bfloat16;  // kdnn/core/float16.hpp
struct float16;
}  // namespace kdnn

namespace kdnn::io {

enum class DType { f32, f64, i32, i64, f16, bf16 };

/// The DType of float / double / std::int32_t / std::int64_t /
/// kdnn::float16 / kdnn::bfloat16 elements.
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<kdnn::float16>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<kdnn::bfloat16>() {
  return DType::bf16;
}

/// Bytes per element: 2 for float16 and bfloat16, 4 for float32 and int32,
/// 8 for float64 and int64.
constexpr std::size_t element_size(DType dtype) {
  if (dtype == DType::f16 || dtype == DType::bf16) return 2;
  return dtype == DType::f32 || dtype == DType::i32 ? 4 : 8;
}

/// True for float32 and float64 (what require_floating accepts).
constexpr bool is_floating(DType dtype) { return dtype == DType::f32 || dtype == DType::f64; }

/// True for float16 and bfloat16.
constexpr bool is_float16_storage(DType dtype) {
  return dtype == DType::f16 || dtype == DType::bf16;
}

/// "float32" / "float64" / "int32" / "int64" / "float16" / "bfloat16".
const char* dtype_name(DType dtype);

/// A shape as NumPy prints it: "()", "(3,)", "(2, 3)".
std::string format_shape(const std::vector<std::size_t>& shape);

/// An array as stored in a .npy file: dtype, shape (C order) and raw bytes.
struct NpyArray {
  DType dtype = DType::f64;
  std::vector<std::size_t> shape;
  std::vector<unsigned char> bytes;  // size() * element_size() bytes

  /// Number of elements (product of the shape; 1 for a 0-d array).
  std::size_t size() const;
  std::size_t element_size() const { return io::element_size(dtype); }

  /// The elements as T (float, double, std::int32_t, std::int64_t,
  /// kdnn::float16 or kdnn::bfloat16); throws kdnn::Error naming both dtypes
  /// if T does not match the dtype.
  template <class T>
  const T* data() const;
  template <class T>
  T* data();
};

/// A zero-filled array of `dtype` and `shape` (e.g. to compute an output into).
NpyArray allocate_npy(DType dtype, const std::vector<std::size_t>& shape);

/// Throws kdnn::Error "<name>: dtype int32, expected float32 or float64"
/// unless `array` holds floats.
void require_floating(const NpyArray& array, const std::string& name);

/// The elements of an int32 or int64 array (any shape, C order) as int.
/// Throws kdnn::Error for any other dtype ("<name>: dtype float32, expected
/// int32 or int64") and for an int64 value outside int's range ("<name>:
/// value 4294967296 at flat index 3 is outside the range of int ...").
/// The shape is not checked: that is the caller's.
std::vector<int> read_int_vector(const NpyArray& array, const std::string& name);

/// Reads `path`, which must be a regular file or a symbolic link to one;
/// throws kdnn::Error on any problem. Anything else (a FIFO, a directory, a
/// device, a link to a missing file) is refused without blocking and without
/// reading from it: "<path>: not a regular file (a FIFO)".
NpyArray read_npy(const std::string& path);

/// Writes `count = product(shape)` elements of `dtype` from `data` to `path`.
/// Written to a temporary file beside `path` and renamed, so a failure never
/// leaves a partial file under `path`. Throws kdnn::Error on I/O failure.
void write_npy(const std::string& path, DType dtype, const std::vector<std::size_t>& shape,
               const void* data);

/// The first half of write_npy: writes the file under a new, unique name
/// beside `path` ("<path>.tmp.<pid>.<n>") and returns that name, for the
/// caller to rename to `path` or remove. On failure nothing is left behind.
std::string write_npy_temporary(const std::string& path, DType dtype,
                                const std::vector<std::size_t>& shape, const void* data);

/// Typed convenience: write_npy with the DType of T (as NpyArray::data).
template <class T>
void write_npy(const std::string& path, const std::vector<std::size_t>& shape, const T* data);

}  // namespace kdnn::io
