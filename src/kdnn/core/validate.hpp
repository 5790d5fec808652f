// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Host-side argument checks run before any kernel launch. Each check throws
// kdnn::Error naming the operation (`op`), the argument, what was expected and
// what was found.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "kdnn/core/error.hpp"

namespace kdnn::validate {

/// Requires `view.extent(dim) == expected`; `why` says where the expectation
/// comes from, e.g. "same as R".
template <class View>
void extent(const char* op, const char* name, const View& view, int dim, std::size_t expected,
            const std::string& why = "") {
  if (view.extent(dim) != expected) {
    fail(op, ": ", name, " has extent(", dim, ")=", view.extent(dim), ", expected ", expected,
         why.empty() ? "" : " (" + why + ")");
  }
}

/// Requires two views to have identical extents in every dimension.
template <class View, class RefView>
void same_shape(const char* op, const char* name, const View& view, const char* ref_name,
                const RefView& ref) {
  static_assert(unsigned(View::rank) == unsigned(RefView::rank),
                "same_shape: views of different rank");
  for (int d = 0; d < int(View::rank); ++d) {
    extent(op, name, view, d, ref.extent(d), std::string("same as ") + ref_name);
  }
}

/// Requires a square trailing pair of extents: view.extent(1) == extent(2).
template <class View>
void square(const char* op, const char* name, const View& view) {
  if (view.extent(1) != view.extent(2)) {
    fail(op, ": ", name, " must be a batch of square matrices [B, n, n], got [", view.extent(0),
         ", ", view.extent(1), ", ", view.extent(2), "]");
  }
}

/// Requires the last dimension of a strided View to be contiguous (stride
/// 1; any stride where it holds at most one element, or the View none): the
/// kernels read each row of it as one span.
template <class View>
void unit_last_stride(const char* op, const char* name, const View& view) {
  constexpr int last = int(View::rank) - 1;
  if (view.size() > 0 && view.extent(last) > 1 && view.stride(last) != 1) {
    fail(op, ": ", name, " has stride(", last, ")=", view.stride(last),
         ", expected 1 (its last dimension contiguous)");
  }
}

/// Requires an output View whose elements are all distinct memory (no
/// stride 0, no dimensions interleaved into each other): sorted by stride,
/// each dimension of more than one element steps past the whole span of the
/// ones before it, as any permutation or slice of a dense tensor does.
template <class View>
void distinct_elements(const char* op, const char* name, const View& view) {
  constexpr int rank = int(View::rank);
  if (view.size() == 0) return;
  std::array<int, rank> order{};
  for (int d = 0; d < rank; ++d) order[d] = d;
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return view.stride(a) < view.stride(b); });
  std::size_t covered = 1;  // elements spanned by the dimensions before
  for (const int d : order) {
    if (view.extent(d) <= 1) continue;
    if (std::size_t(view.stride(d)) < covered) {
      fail(op, ": ", name, " has stride(", d, ")=", view.stride(d), " with extent(", d,
           ")=", view.extent(d),
           ", expected an output whose elements do not overlap (stride >= ", covered, ")");
    }
    covered = std::size_t(view.stride(d)) * view.extent(d);
  }
}

/// The bytes a View spans, named for messages; empty for an empty View.
struct MemoryRange {
  const char* name;
  const char* begin;
  const char* end;
  bool overlaps(const MemoryRange& other) const { return begin < other.end && other.begin < end; }
};
template <class View>
MemoryRange memory_of(const char* name, const View& view) {
  const char* begin = reinterpret_cast<const char*>(view.data());
  if (view.size() == 0) return {name, begin, begin};
  // From the first element to the last, through the strides (a strided
  // View's span() may reach past its last element).
  std::size_t last = 0;
  for (int d = 0; d < int(View::rank); ++d) last += (view.extent(d) - 1) * view.stride(d);
  return {name, begin, begin + (last + 1) * sizeof(typename View::value_type)};
}

namespace detail {
template <class Outputs, class Inputs>
void disjoint_ranges(const char* op, const Outputs& outputs, const Inputs& inputs) {
  for (auto o = outputs.begin(); o != outputs.end(); ++o) {
    for (const MemoryRange& in : inputs) {
      if (o->overlaps(in)) {
        fail(op, ": output ", o->name, " overlaps input ", in.name,
             " (outputs must not alias inputs)");
      }
    }
    for (auto other = outputs.begin(); other != o; ++other) {
      if (o->overlaps(*other)) {
        fail(op, ": outputs ", other->name, " and ", o->name, " overlap");
      }
    }
  }
}
}  // namespace detail

/// Requires every output to share no memory with any input or with another
/// output (memory_of each argument). Braced lists bind to initializer_list
/// parameters (nvcc 11 turns a one-element braced list for a std::vector
/// parameter into its element); a std::vector of inputs is accepted too.
inline void disjoint(const char* op, std::initializer_list<MemoryRange> outputs,
                     std::initializer_list<MemoryRange> inputs) {
  detail::disjoint_ranges(op, outputs, inputs);
}
inline void disjoint(const char* op, std::initializer_list<MemoryRange> outputs,
                     const std::vector<MemoryRange>& inputs) {
  detail::disjoint_ranges(op, outputs, inputs);
}

/// Requires that `out` does not share memory with `in` (outputs are written
/// while inputs are still being read).
template <class Out, class In>
void no_alias(const char* op, const char* out_name, const Out& out, const char* in_name,
              const In& in) {
  disjoint(op, {memory_of(out_name, out)}, {memory_of(in_name, in)});
}

/// Requires lo <= value <= hi for a scalar option.
template <class T>
void in_range(const char* op, const char* name, T value, T lo, T hi) {
  if (!(value >= lo && value <= hi)) {
    fail(op, ": ", name, "=", value, ", expected a value in [", lo, ", ", hi, "]");
  }
}

/// Requires lo <= value < hi for a scalar option (false for NaN).
template <class T>
void in_half_open(const char* op, const char* name, T value, T lo, T hi) {
  if (!(value >= lo && value < hi)) {
    fail(op, ": ", name, "=", value, ", expected a value in [", lo, ", ", hi, ")");
  }
}

/// Whether an optional View argument was given: a default-constructed View
/// (no data, every extent 0) means "not given".
template <class View>
bool given(const View& view) {
  if (view.data() != nullptr) return true;
  for (int d = 0; d < int(View::rank); ++d) {
    if (view.extent(d) != 0) return true;
  }
  return false;
}

/// Requires a finite scalar option.
inline void finite(const char* op, const char* name, double value) {
  if (!(value - value == 0)) fail(op, ": ", name, "=", value, ", expected a finite value");
}

/// Requires a finite scalar option that stays finite converted to T, the
/// type the kernels compute in (1e39 is a finite double but +inf as a float).
template <class T>
void finite_as(const char* op, const char* name, double value) {
  finite(op, name, value);
  const double max = double(std::numeric_limits<T>::max());
  if (!(std::abs(value) <= max)) {
    fail(op, ": ", name, "=", value, ", expected a value finite in ",
         sizeof(T) == sizeof(float) ? "float" : "double", " (|", name, "| <= ", max, ")");
  }
}

/// Requires an optional per-batch output (empty = not requested) to have
/// extent(0) == batch.
template <class View>
void optional_batch(const char* op, const char* name, const View& view, std::size_t batch) {
  if (view.data() == nullptr && view.extent(0) == 0) return;
  extent(op, name, view, 0, batch, "batch size");
}

/// Requires an optional seq_idx (packed sequences' ids per step) to be
/// [B, L], the shape of x's first two dimensions.
template <class View, class X>
void sequence_ids(const char* op, const View& seq_idx, const X& x) {
  if (!given(seq_idx)) return;
  extent(op, "seq_idx", seq_idx, 0, x.extent(0), "B, x's extent(0)");
  extent(op, "seq_idx", seq_idx, 1, x.extent(1), "L, x's extent(1)");
}

}  // namespace kdnn::validate
