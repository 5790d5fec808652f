// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include "kdnn/io/npy.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <sstream>

#include "kdnn/core/error.hpp"
#include "kdnn/io/escape.hpp"
#include "kdnn/io/impl/npy_header.hpp"
#include "kdnn/io/impl/unique_name.hpp"

// The element bytes are copied to and from memory unchanged, which is only
// correct for little-endian descrs on a little-endian host.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kdnn .npy I/O assumes a little-endian host"
#endif

namespace kdnn::io {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicLen = 6;
constexpr std::size_t kAlign = 64;  // NumPy pads the header to this many bytes

/// The dtypes and their .npy descrs, in the order the "not supported"
/// message lists them: a string ('<f4'), or for bfloat16 a structured
/// dtype's list (npy.hpp), written and matched as the text NumPy writes.
constexpr struct {
  DType dtype;
  const char* descr;
  bool is_string;
  const char* name;
} kDTypes[] = {{DType::f32, "<f4", true, "float32"},
               {DType::f64, "<f8", true, "float64"},
               {DType::i32, "<i4", true, "int32"},
               {DType::i64, "<i8", true, "int64"},
               {DType::f16, "<f2", true, "float16"},
               {DType::bf16, "[('bfloat16', '<u2')]", false, "bfloat16"}};

/// The descr of `dtype` as the header's dict writes it ('<f4', quoted).
std::string descr_of(DType dtype) {
  for (const auto& d : kDTypes) {
    if (d.dtype == dtype) return d.is_string ? std::string("'") + d.descr + "'" : d.descr;
  }
  fail("npy: invalid DType ", static_cast<int>(dtype));
}

std::size_t product(const std::vector<std::size_t>& shape) {
  std::size_t n = 1;
  for (const std::size_t d : shape) n *= d;
  return n;
}

/// Bytes of data for `shape`, failing if the count does not fit in size_t.
std::size_t data_bytes(const std::string& path, const std::vector<std::size_t>& shape,
                       std::size_t element_size) {
  for (const std::size_t d : shape) {
    if (d == 0) return 0;
  }
  std::size_t bytes = element_size;
  for (const std::size_t d : shape) {
    if (d > std::numeric_limits<std::size_t>::max() / bytes) {
      fail(path, ": malformed header: shape ", format_shape(shape), " is too large");
    }
    bytes *= d;
  }
  return bytes;
}

DType check_descr(const std::string& path, const impl::Header& header) {
  std::string expected;  // "'<f4' (float32), ... or [('bfloat16', '<u2')] (bfloat16)"
  constexpr std::size_t n = std::size(kDTypes);
  for (std::size_t i = 0; i < n; ++i) {
    if (header.descr_is_string == kDTypes[i].is_string && header.descr == kDTypes[i].descr) {
      return kDTypes[i].dtype;
    }
    if (i > 0) expected += i + 1 < n ? ", " : " or ";
    expected += descr_of(kDTypes[i].dtype) + " (" + kDTypes[i].name + ")";
  }
  const std::string descr = escape_bytes(header.descr);
  const std::string shown = header.descr_is_string ? "'" + descr + "'" : descr;
  fail(path, ": dtype ", shown, " not supported, expected ", expected);
}

std::size_t read_le(const unsigned char* p, std::size_t n) {
  std::size_t value = 0;
  for (std::size_t i = n; i-- > 0;) value = (value << 8) | p[i];
  return value;
}

// ---- reading a regular file ----

/// "a FIFO", "a directory", ...: what a file that is not a regular one is.
const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "an unknown kind of file";
}

/// A regular file open for reading. The descriptor is checked and read, not
/// the path again, so the file checked is the file read; opening never
/// blocks (O_NONBLOCK: a FIFO is refused before any read).
class InputFile {
 public:
  explicit InputFile(const std::string& path)
      : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)) {
    if (fd_ < 0) fail_to_open();
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;
      ::close(fd_);
      fail(path_, ": cannot inspect the file: ", std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd_);
      fail(path_, ": not a regular file (", file_type_name(st.st_mode), ")");
    }
    size_ = std::size_t(st.st_size);
  }
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  std::size_t size() const { return size_; }

  /// Reads `n` bytes at `offset` into `out`.
  void read(std::size_t offset, void* out, std::size_t n) const {
    auto* p = static_cast<unsigned char*>(out);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, p, n, off_t(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) fail(path_, ": read error: ", std::strerror(errno));
      if (got == 0) fail(path_, ": read error: the file got shorter while being read");
      p += got;
      offset += std::size_t(got);
      n -= std::size_t(got);
    }
  }

 private:
  [[noreturn]] void fail_to_open() const {
    const int err = errno;
    struct stat st {};
    if (err == ENOENT && ::lstat(path_.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      fail(path_, ": symbolic link to a missing file");
    }
    fail(path_, ": cannot open file: ", std::strerror(err));
  }

  const std::string& path_;
  int fd_;
  std::size_t size_ = 0;
};

// ---- header writing ----

/// The complete version 1.0 header: magic, version, length and the dict,
/// padded with spaces and ended by '\n' to a multiple of kAlign bytes.
std::string make_header(const std::string& path, DType dtype,
                        const std::vector<std::size_t>& shape) {
  std::string dict = "{'descr': " + descr_of(dtype) +
                     ", 'fortran_order': False, 'shape': " + format_shape(shape) + ", }";
  constexpr std::size_t prefix_len = kMagicLen + 2 + 2;       // magic, version, uint16 length
  const std::size_t unpadded = prefix_len + dict.size() + 1;  // + '\n'
  dict.append((kAlign - unpadded % kAlign) % kAlign, ' ');
  dict.push_back('\n');
  if (dict.size() > std::numeric_limits<std::uint16_t>::max()) {
    fail(path, ": shape ", format_shape(shape), " is too long for a .npy 1.0 header");
  }
  std::string header(kMagic, kMagicLen);
  header.push_back('\x01');
  header.push_back('\x00');
  header.push_back(static_cast<char>(dict.size() & 0xff));
  header.push_back(static_cast<char>(dict.size() >> 8));
  return header + dict;
}

}  // namespace

const char* dtype_name(DType dtype) {
  for (const auto& d : kDTypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "(invalid dtype)";
}

std::size_t NpyArray::size() const { return product(shape); }

NpyArray allocate_npy(DType dtype, const std::vector<std::size_t>& shape) {
  NpyArray array;
  array.dtype = dtype;
  array.shape = shape;
  array.bytes.resize(array.size() * array.element_size());
  return array;
}

template <class T>
const T* NpyArray::data() const {
  if (dtype != dtype_of<T>()) {
    fail("npy: array has dtype ", dtype_name(dtype), ", requested ", dtype_name(dtype_of<T>()));
  }
  if (bytes.size() != size() * element_size()) {
    fail("npy: array holds ", bytes.size(), " bytes, expected ", size() * element_size(),
         " for shape ", format_shape(shape), " of ", dtype_name(dtype));
  }
  // The vector's storage comes from operator new, so it is aligned for T
  // (and the .npy header is not in it).
  static_assert(__STDCPP_DEFAULT_NEW_ALIGNMENT__ >= alignof(double));
  return reinterpret_cast<const T*>(bytes.data());
}

template <class T>
T* NpyArray::data() {
  return const_cast<T*>(static_cast<const NpyArray&>(*this).data<T>());
}

template const float* NpyArray::data<float>() const;
template const double* NpyArray::data<double>() const;
template const std::int32_t* NpyArray::data<std::int32_t>() const;
template const std::int64_t* NpyArray::data<std::int64_t>() const;
template const kdnn::float16* NpyArray::data<kdnn::float16>() const;
template const kdnn::bfloat16* NpyArray::data<kdnn::bfloat16>() const;
template float* NpyArray::data<float>();
template double* NpyArray::data<double>();
template std::int32_t* NpyArray::data<std::int32_t>();
template std::int64_t* NpyArray::data<std::int64_t>();
template kdnn::float16* NpyArray::data<kdnn::float16>();
template kdnn::bfloat16* NpyArray::data<kdnn::bfloat16>();

void require_floating(const NpyArray& array, const std::string& name) {
  if (is_floating(array.dtype)) return;
  fail(name, ": dtype ", dtype_name(array.dtype), ", expected float32 or float64");
}

std::vector<int> read_int_vector(const NpyArray& array, const std::string& name) {
  if (array.dtype == DType::i32) {
    const std::int32_t* data = array.data<std::int32_t>();
    return std::vector<int>(data, data + array.size());
  }
  if (array.dtype != DType::i64) {
    fail(name, ": dtype ", dtype_name(array.dtype), ", expected int32 or int64");
  }
  const std::int64_t* data = array.data<std::int64_t>();
  std::vector<int> values(array.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (data[i] < std::numeric_limits<int>::min() || data[i] > std::numeric_limits<int>::max()) {
      fail(name, ": value ", data[i], " at flat index ", i, " is outside the range of int [",
           std::numeric_limits<int>::min(), ", ", std::numeric_limits<int>::max(), "]");
    }
    values[i] = int(data[i]);
  }
  return values;
}

NpyArray read_npy(const std::string& path) {
  const InputFile in(path);
  const std::size_t size = in.size();

  // Magic, version and header length: at most 6 + 2 + 4 bytes.
  unsigned char prefix[12] = {};
  in.read(0, prefix, std::min<std::size_t>(size, sizeof prefix));
  if (size < kMagicLen || std::memcmp(prefix, kMagic, kMagicLen) != 0) {
    fail(path, ": not a .npy file (missing the \\x93NUMPY magic string)");
  }
  if (size < kMagicLen + 2) fail(path, ": truncated: file ends inside the header");
  const int major = prefix[6], minor = prefix[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    fail(path, ": unsupported .npy format version ", major, ".", minor,
         " (supported: 1.0, 2.0, 3.0)");
  }
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  const std::size_t prefix_len = kMagicLen + 2 + len_bytes;
  if (size < prefix_len) fail(path, ": truncated: file ends inside the header");
  const std::size_t header_len = read_le(prefix + kMagicLen + 2, len_bytes);
  if (size - prefix_len < header_len) {
    fail(path, ": truncated: expected ", header_len, " bytes of header, found ", size - prefix_len);
  }

  std::string text(header_len, '\0');
  in.read(prefix_len, text.data(), header_len);
  const impl::Header header = impl::HeaderParser(path, text).parse();

  NpyArray array;
  array.dtype = check_descr(path, header);
  if (header.fortran_order) fail(path, ": Fortran order not supported, expected C order");
  array.shape = header.shape;

  const std::size_t expected = data_bytes(path, array.shape, array.element_size());
  const std::size_t found = size - prefix_len - header_len;
  if (found < expected) {
    fail(path, ": truncated: expected ", expected, " bytes of data, found ", found);
  }
  if (found > expected) {
    fail(path, ": unexpected trailing bytes: expected ", expected, " bytes of data, found ", found);
  }
  array.bytes.resize(expected);
  in.read(prefix_len + header_len, array.bytes.data(), expected);
  return array;
}

std::string write_npy_temporary(const std::string& path, DType dtype,
                                const std::vector<std::size_t>& shape, const void* data) {
  const std::string header = make_header(path, dtype, shape);
  const std::size_t nbytes = product(shape) * element_size(dtype);

  std::string tmp;
  int fd = -1;
  do {
    tmp = impl::unique_name(path, "tmp");
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  } while (fd < 0 && errno == EEXIST);
  std::FILE* file = fd < 0 ? nullptr : ::fdopen(fd, "wb");
  if (file == nullptr) {
    const int err = errno;
    if (fd >= 0) {
      ::close(fd);
      std::remove(tmp.c_str());
    }
    fail(path, ": cannot open '", tmp, "' for writing: ", std::strerror(err));
  }
  bool ok = std::fwrite(header.data(), 1, header.size(), file) == header.size() &&
            (nbytes == 0 || std::fwrite(data, 1, nbytes, file) == nbytes);
  int err = ok ? 0 : errno;
  if (std::fclose(file) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    fail(path, ": writing '", tmp, "' failed: ", std::strerror(err));
  }
  return tmp;
}

void write_npy(const std::string& path, DType dtype, const std::vector<std::size_t>& shape,
               const void* data) {
  const std::string tmp = write_npy_temporary(path, dtype, shape, data);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    fail(path, ": cannot rename '", tmp, "' to it: ", std::strerror(err));
  }
}

template <class T>
void write_npy(const std::string& path, const std::vector<std::size_t>& shape, const T* data) {
  write_npy(path, dtype_of<T>(), shape, data);
}

template void write_npy<float>(const std::string&, const std::vector<std::size_t>&, const float*);
template void write_npy<double>(const std::string&, const std::vector<std::size_t>&, const double*);
template void write_npy<std::int32_t>(const std::string&, const std::vector<std::size_t>&,
                                      const std::int32_t*);
template void write_npy<std::int64_t>(const std::string&, const std::vector<std::size_t>&,
                                      const std::int64_t*);
template void write_npy<kdnn::float16>(const std::string&, const std::vector<std::size_t>&,
                                       const kdnn::float16*);
template void write_npy<kdnn::bfloat16>(const std::string&, const std::vector<std::size_t>&,
                                        const kdnn::bfloat16*);

std::string format_shape(const std::vector<std::size_t>& shape) {
  std::ostringstream os;
  os << '(';
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  if (shape.size() == 1) os << ',';
  os << ')';
  return os.str();
}

}  // namespace kdnn::io
