#pragma once
// Reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0 on
// read, 1.0 on write): float32 ('<f4') and float64 ('<f8') arrays in C order,
// little endian. Anything else (Fortran order, other dtypes, big endian,
// truncated or malformed files) is rejected with a kdnn::Error naming the file
// and the problem. No Kokkos here: the data is a plain host buffer.
#include <cstddef>
#include <string>
#include <vector>

namespace kdnn::io {

enum class DType { f32, f64 };

/// The DType of float / double elements.
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

/// "float32" / "float64".
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
  std::size_t element_size() const { return dtype == DType::f32 ? 4 : 8; }

  /// The elements as T; throws kdnn::Error if T does not match the dtype.
  template <class T>
  const T* data() const;
  template <class T>
  T* data();
};

/// A zero-filled array of `dtype` and `shape` (e.g. to compute an output into).
NpyArray allocate_npy(DType dtype, const std::vector<std::size_t>& shape);

/// Reads `path`, which must be a regular file or a symbolic link to one;
/// throws kdnn::Error on any problem. Anything else (a FIFO, a directory, a
/// device, a link to a missing file) is refused without blocking and without
/// reading from it: "<path>: not a regular file (a FIFO)".
NpyArray read_npy(const std::string& path);

/// Writes `count = product(shape)` elements of `dtype` from `data` to `path`.
/// Written to a temporary file beside `path` and renamed, so a failure never
/// leaves a partial file under `path`. Throws kdnn::Error on I/O failure.
void write_npy(const std::string& path, DType dtype,
               const std::vector<std::size_t>& shape, const void* data);

/// The first half of write_npy: writes the file under a new, unique name
/// beside `path` ("<path>.tmp.<pid>.<n>") and returns that name, for the
/// caller to rename to `path` or remove. On failure nothing is left behind.
std::string write_npy_temporary(const std::string& path, DType dtype,
                                const std::vector<std::size_t>& shape,
                                const void* data);

/// Typed convenience: write_npy with the DType of T (float or double).
template <class T>
void write_npy(const std::string& path, const std::vector<std::size_t>& shape,
               const T* data);

}  // namespace kdnn::io
