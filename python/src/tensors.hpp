// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Arrays from Python (torch tensors, or anything with DLPack) as Kokkos
// Views without a copy, and the execution space a call runs on.
//
// The Python layer hands over C-contiguous tensors of a storage type
// (float32, float64 and, for the operators that take them, bfloat16 and
// float16: kdnn::bfloat16 and kdnn::float16, the same two bytes; it makes
// a non-contiguous one contiguous first), or, for the operators that take
// strides, any tensor whose last dimension is contiguous; here each becomes
// an unmanaged LayoutRight (or LayoutStride) View of its own memory, on the
// host space for CPU tensors and,
// in a CUDA build, on a Kokkos::Cuda instance on PyTorch's current stream for
// CUDA tensors. A wrong rank, dtype or device is a kdnn::Error (a Python
// kdnn.Error, a ValueError) naming the argument.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <Kokkos_Core.hpp>
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "kdnn/core/error.hpp"
#include "kdnn/core/float16.hpp"
#include "kdnn/core/tensor.hpp"
#include "lifetime.hpp"

// DLPack's codes of kdnn's 16-bit storage types (PyTorch's torch.bfloat16
// and torch.float16), so that nb::dtype<T>() names them.
namespace nanobind::detail {
template <>
struct dtype_traits<kdnn::bfloat16> {
  static constexpr dlpack::dtype value{std::uint8_t(dlpack::dtype_code::Bfloat), 16, 1};
  static constexpr auto name = const_name("bfloat16");
};
template <>
struct dtype_traits<kdnn::float16> {
  static constexpr dlpack::dtype value{std::uint8_t(dlpack::dtype_code::Float), 16, 1};
  static constexpr auto name = const_name("float16");
};
}  // namespace nanobind::detail

namespace kdnn_python {

namespace nb = nanobind;

/// Any C-contiguous array; its dtype, rank and device are checked here.
using Array = nb::ndarray<nb::c_contig>;
/// An array of any strides, for LayoutStride Views (the operator checks
/// the strides it needs).
using StridedArray = nb::ndarray<>;
/// An optional argument (None in Python).
using Optional = std::optional<Array>;

inline const char* device_name(std::int32_t device_type) {
  switch (device_type) {
    case nb::device::cpu::value:
      return "cpu";
    case nb::device::cuda::value:
      return "cuda";
    default:
      return "another device";
  }
}

template <class T>
constexpr const char* dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  if constexpr (std::is_same_v<T, double>) return "float64";
  if constexpr (std::is_same_v<T, kdnn::bfloat16>) return "bfloat16";
  if constexpr (std::is_same_v<T, kdnn::float16>) return "float16";
  return "int32";
}

/// The scalar types an operator's dispatch takes.
template <class... T>
struct Dtypes {};
/// float32 and float64.
using FloatDtypes = Dtypes<float, double>;
/// Every storage type: float32, float64, bfloat16 and float16.
using StorageDtypes = Dtypes<float, double, kdnn::bfloat16, kdnn::float16>;

/// g(T{}...): a zero of each of the types.
template <class... T, class G>
auto with_zeros(Dtypes<T...>, const G& g) {
  return g(T{}...);
}

/// "float32, float64, bfloat16 or float16": the names of the types.
template <class... T>
std::string dtype_names(Dtypes<T...>) {
  const char* names[] = {dtype_name<T>()...};
  std::string s;
  for (std::size_t i = 0; i < sizeof...(T); ++i) {
    s += std::string(i == 0 ? "" : i + 1 == sizeof...(T) ? " or " : ", ") + names[i];
  }
  return s;
}

/// The DLPack device type of memory in `MemorySpace`: the host's, or (a
/// CUDA build's device memory) the GPU's.
template <class MemorySpace>
constexpr std::int32_t device_of() {
  return std::is_same_v<MemorySpace, Kokkos::HostSpace> ? nb::device::cpu::value
                                                        : nb::device::cuda::value;
}

/// The View over `data` with `a`'s extents (and, LayoutStride, its strides).
template <class ViewType, class A, std::size_t... d>
ViewType view_with_extents(typename ViewType::pointer_type data, const A& a,
                           std::index_sequence<d...>) {
  if constexpr (std::is_same_v<typename ViewType::array_layout, Kokkos::LayoutStride>) {
    static_assert(sizeof...(d) <= 4, "a strided View of rank 4 at most");
    // Extent and stride of each dimension in turn, 0 past the rank.
    // PyTorch's strides are >= 0 (a stride 0 is a broadcast dimension).
    std::array<std::size_t, 8> n{};
    ((n[2 * d] = std::size_t(a.shape(d)), n[2 * d + 1] = std::size_t(a.stride(d))), ...);
    return ViewType(data, Kokkos::LayoutStride(n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7]));
  } else {
    static_assert(std::is_same_v<A, Array>, "a LayoutRight View of a C-contiguous Array");
    return ViewType(data, std::size_t(a.shape(d))...);
  }
}

/// The View of type `ViewType` (LayoutRight over an Array, or LayoutStride
/// over any array, of an execution space) over `a`'s memory, after checking
/// its rank, dtype and device.
template <class ViewType, class A>
ViewType view_of(const A& a, const std::string& name) {
  constexpr std::int32_t device = device_of<typename ViewType::memory_space>();
  using T = typename ViewType::non_const_value_type;
  constexpr std::size_t rank = ViewType::rank;
  if (a.ndim() != rank) {
    kdnn::fail(name, " has ", a.ndim(), " dimensions, expected ", rank);
  }
  if (a.dtype() != nb::dtype<T>()) {
    kdnn::fail(name, " has the wrong dtype, expected ", dtype_name<T>());
  }
  if (a.device_type() != device) {
    kdnn::fail(name, " is on ", device_name(a.device_type()), ", expected ", device_name(device),
               " (as the first tensor)");
  }
  auto* data = static_cast<typename ViewType::pointer_type>(const_cast<void*>(a.data()));
  return view_with_extents<ViewType>(data, a, std::make_index_sequence<rank>());
}

/// An empty View for None, else view_of.
template <class ViewType>
ViewType view_of(const Optional& a, const std::string& name) {
  return a ? view_of<ViewType>(*a, name) : ViewType();
}

#ifdef KOKKOS_ENABLE_CUDA
/// Makes GPU `device` the calling thread's CUDA device for its lifetime, and
/// the previous one again after. The thread may be one PyTorch started (the
/// autograd engine's thread per device) or the user's, with no CUDA context
/// current: Kokkos' instance constructor asks the driver for the stream's
/// context (for stream 0, the current one) and aborts the process when there
/// is none; cudaSetDevice makes the device's primary context, the one
/// PyTorch uses, current.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    const cudaError_t made = cudaSetDevice(device);
    if (made != cudaSuccess) {
      kdnn::fail("cuda:", device,
                 " could not be made the calling thread's device: ", cudaGetErrorString(made));
    }
  }
  ~CurrentDevice() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int previous_ = -1;
};

/// The Kokkos::Cuda instance on `stream` of GPU `device` (current on the
/// calling thread: CurrentDevice), made by the first call on that pair and
/// reused by the later ones. Keyed by device too: stream 0 is the same handle
/// on every GPU. Making an instance allocates its reduction scratch and lock
/// array (cudaMalloc, cudaMemset) and destroying it frees them (cudaFree):
/// per call, that would synchronise PyTorch's queue at every kdnn operator.
/// The instances are never destroyed (the process's end releases their
/// memory): PyTorch may have destroyed a side stream by then, and an
/// instance's destruction uses its stream. Threads that share an instance
/// take turns in kdnn's calls (core/impl/space_lock.hpp).
inline Kokkos::Cuda cuda_space(int device, cudaStream_t stream) {
  static std::mutex lock;
  using Key = std::pair<int, cudaStream_t>;
  static auto* const spaces = new std::map<Key, Kokkos::Cuda>();  // never freed
  const std::lock_guard<std::mutex> guard(lock);
  const Key key{device, stream};
  auto it = spaces->find(key);
  if (it == spaces->end()) it = spaces->emplace(key, Kokkos::Cuda(stream)).first;
  return it->second;
}
#endif

/// Runs `f(space, T{})` on the execution space of `first`'s device with T its
/// scalar type, one of `Types` (FloatDtypes by default): the host space for CPU arrays (then
/// fenced, so the results are there when Python reads them) and, in a CUDA build, a Kokkos::Cuda
/// instance on the stream `stream` (PyTorch's current stream) of `first`'s GPU for CUDA arrays,
/// ordered on that stream as PyTorch's own kernels. The GIL is released meanwhile, and Kokkos kept
/// up throughout (Lifetime::Call, released before the GIL is taken back).
template <class Types = FloatDtypes, class A, class F>
void dispatch(const A& first, const char* name, std::uintptr_t stream, F&& f) {
  const auto is = [&](auto zero) { return first.dtype() == nb::dtype<decltype(zero)>(); };
  if (!with_zeros(Types{}, [&](auto... zero) { return (is(zero) || ...); })) {
    kdnn::fail(name, " has an unsupported dtype, expected ", dtype_names(Types{}));
  }
  const nb::gil_scoped_release unlocked;
  const Lifetime::Call call(name);
  const auto on_dtype = [&](auto space) {  // f for the one type that is first's
    with_zeros(Types{},
               [&](auto... zero) { return ((is(zero) && (f(space, zero), true)) || ...); });
  };
  if (first.device_type() == nb::device::cpu::value) {
    const Kokkos::DefaultHostExecutionSpace host;
    on_dtype(host);
    host.fence();
    return;
  }
#ifdef KOKKOS_ENABLE_CUDA
  if (first.device_type() == nb::device::cuda::value) {
    const int device = int(first.device_id());
    const CurrentDevice current(device);
    on_dtype(cuda_space(device, reinterpret_cast<cudaStream_t>(stream)));
    return;
  }
#endif
  (void)stream;
  kdnn::fail(name, " is on ", device_name(first.device_type()),
             ", expected cpu"
#ifdef KOKKOS_ENABLE_CUDA
             " or cuda"
#endif
             " (the devices this kdnn was built for)");
}

template <class T, class Space>
using In3 = kdnn::Tensor3<const T, Space>;
template <class T, class Space>
using In4 = kdnn::Tensor4<const T, Space>;

}  // namespace kdnn_python
