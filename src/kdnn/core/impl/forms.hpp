// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::impl::Forms: an operator's table of forms. Each Form names what it is
// (KernelForm::tensor_cores or gpu; the host form is what runs when none
// does), the size tuples its kernels are compiled for (a SizeList: head
// sizes (D, Dv), a chunk's (P, N), ...) and its kernels (a Kernels class
// whose visit<Sizes>(launch, f) calls f with them as KernelType values).
// The argument checks, the launch plans, the runs and so the explicit
// instantiation of the runs all walk the one table: a form runs exactly the
// sizes its list holds, and a list holds exactly what is compiled.
//
// A form whose kernels mask the columns past the run-time size (SizeMatch::
// round_up) runs a call on the first listed tuple that covers it: the lists
// are in ascending order, so that is the next larger compiled size.
//
// Builds that only compile (the CI's CUDA build) list two opposite corners
// of each grid (config.hpp's KDNN_COMPILED_SIZE_CORNERS): the first axis's
// smallest size with the second's largest, and its largest with the
// second's smallest, which keeps every form, every precision, the smallest
// and the largest size of each axis and D ≠ Dv both ways (and of a list of
// single sizes, its smallest and largest); other sizes round up to them, or
// run the host form where a form cannot round.
#include <array>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kdnn/config.hpp"
#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/compiled_sizes.hpp"
#include "kdnn/core/launch.hpp"

namespace kdnn::impl {

/// One compile-time size tuple of a form.
template <int... S>
struct Sizes {
  static constexpr std::size_t rank = sizeof...(S);
  static constexpr std::array<int, rank> values{S...};

  /// Whether the tuple is `want`.
  static constexpr bool equals(const std::array<int, rank>& want) {
    for (std::size_t i = 0; i < rank; ++i) {
      if (values[i] != want[i]) return false;
    }
    return true;
  }
  /// Whether every size of the tuple is at least the wanted one (and the
  /// wanted ones are positive: an empty axis has no columns to mask).
  static constexpr bool covers(const std::array<int, rank>& want) {
    for (std::size_t i = 0; i < rank; ++i) {
      if (want[i] <= 0 || values[i] < want[i]) return false;
    }
    return true;
  }
};

/// How a form meets a run-time size tuple: only its own compiled tuples
/// (exact), or the first compiled tuple that covers it (round_up; the
/// kernels mask the extra columns).
enum class SizeMatch { exact, round_up };

/// The size tuples a form is compiled for, in ascending order.
template <class... Tuples>
struct SizeList {
  static constexpr std::size_t count = sizeof...(Tuples);

  /// Calls run(Tuple{}) with the first tuple that `match` admits for
  /// `want`; says whether it did.
  template <std::size_t N, class Run>
  static bool dispatch(const std::array<int, N>& want, SizeMatch match, const Run& run) {
    const auto admits = [&](auto tuple) {
      using Tuple = decltype(tuple);
      return match == SizeMatch::exact ? Tuple::equals(want) : Tuple::covers(want);
    };
    return ((admits(Tuples{}) && (run(Tuples{}), true)) || ...);
  }

  /// Whether some tuple is admitted.
  template <std::size_t N>
  static bool admits(const std::array<int, N>& want, SizeMatch match) {
    return dispatch(want, match, [](auto) {});
  }

  /// The largest size of axis i over the tuples (0 for an empty list).
  static constexpr int largest(std::size_t i) {
    int most = 0;
    static_cast<void>(i);  // unused where the list is empty
    ((most = Tuples::values[i] > most ? Tuples::values[i] : most), ...);
    return most;
  }
};

namespace detail {

template <class Tuple>
struct ListOf;
template <class... T>
struct ListOf<std::tuple<T...>> {
  using type = SizeList<T...>;
};

template <int... L>
constexpr int smallest_of() {
  int least = 0, first = 1;
  ((least = first || L < least ? L : least, first = 0), ...);
  return least;
}
template <int... L>
constexpr int largest_of() {
  int most = 0, first = 1;
  ((most = first || L > most ? L : most, first = 0), ...);
  return most;
}

template <class First, class Second>
struct Grid;
template <int... A, int... B>
struct Grid<CompiledSizes<A...>, CompiledSizes<B...>> {
  template <int a>
  using Row = std::tuple<Sizes<a, B>...>;
  using all = typename ListOf<decltype(std::tuple_cat(std::declval<Row<A>>()...))>::type;

  template <int a, int b>
  static constexpr bool corner = (a == smallest_of<A...>() && b == largest_of<B...>()) ||
                                 (a == largest_of<A...>() && b == smallest_of<B...>());
  template <int a>
  using CornerRow = decltype(std::tuple_cat(
      std::declval<std::conditional_t<corner<a, B>, std::tuple<Sizes<a, B>>, std::tuple<>>>()...));
  using corners = typename ListOf<decltype(std::tuple_cat(std::declval<CornerRow<A>>()...))>::type;
};

template <class List>
struct Line;
template <int... A>
struct Line<CompiledSizes<A...>> {
  using all = SizeList<Sizes<A>...>;
  template <int a>
  using Corner = std::conditional_t<a == smallest_of<A...>() || a == largest_of<A...>(),
                                    std::tuple<Sizes<a>>, std::tuple<>>;
  using corners = typename ListOf<decltype(std::tuple_cat(std::declval<Corner<A>>()...))>::type;
};

}  // namespace detail

/// Every pair (a, b) of First's and Second's sizes (CompiledSizes), a in
/// the outer loop; only the two opposite corners (smallest a with largest
/// b, largest a with smallest b) where KDNN_COMPILED_SIZE_CORNERS.
template <class First, class Second>
using SizeGrid = std::conditional_t<bool(KDNN_COMPILED_SIZE_CORNERS),
                                    typename detail::Grid<First, Second>::corners,
                                    typename detail::Grid<First, Second>::all>;

/// List's sizes (CompiledSizes) as one-size tuples; only the smallest and
/// the largest where KDNN_COMPILED_SIZE_CORNERS.
template <class List>
using SizeLine =
    std::conditional_t<bool(KDNN_COMPILED_SIZE_CORNERS), typename detail::Line<List>::corners,
                       typename detail::Line<List>::all>;

/// A kernel type as a value, for the visitors of a form's kernels.
template <class Kernel>
struct KernelType {
  using type = Kernel;
};

/// One form of an operator: the KernelForm it is, its SizeList, how it
/// meets a size tuple, and its Kernels: a class with
///   template <class Sizes, class F> static void visit(const Launch&, const F& f)
/// calling f with the form's kernels for Sizes (KernelType values).
template <KernelForm F, class List, SizeMatch Match, class Kernels>
struct Form {
  static constexpr KernelForm form = F;
  using sizes = List;
  static constexpr SizeMatch match = Match;
  using kernels = Kernels;
};

/// The name a launch label gives a form.
constexpr const char* form_name(KernelForm form) {
  return form == KernelForm::tensor_cores ? "tensor cores"
         : form == KernelForm::gpu        ? "gpu"
                                          : "host";
}

/// An operator's forms (Form...), at most one tensor-core and one GPU form.
template <class... F>
struct Forms {
  /// Whether the table has a form of kind `form` for `want`.
  template <std::size_t N>
  static bool has(KernelForm form, const std::array<int, N>& want) {
    return ((F::form == form && F::sizes::admits(want, F::match)) || ...);
  }

  /// The largest size of axis i over every form's tuples (SizeList::largest):
  /// past it, no form of the table runs.
  static constexpr int largest(std::size_t i) {
    int most = 0;
    static_cast<void>(i);  // unused where the table is empty
    ((most = F::sizes::largest(i) > most ? F::sizes::largest(i) : most), ...);
    return most;
  }

  /// The form a call runs on `space` (chosen_form's rule, backend_traits.hpp).
  template <class ExecSpace, std::size_t N>
  static KernelForm chosen(const ExecSpace& space, KernelForm asked,
                           const std::array<int, N>& want) {
    return chosen_form(space, asked, has(KernelForm::gpu, want),
                       has(KernelForm::tensor_cores, want));
  }

  /// Calls f(KernelType<K>{}..., form_name) with the kernels of the form a
  /// call runs, at the tuple its list admits; false, calling nothing, where
  /// that is the host form.
  template <class ExecSpace, std::size_t N, class Fn>
  static bool visit(const ExecSpace& space, const Launch& launch, const std::array<int, N>& want,
                    const Fn& fn) {
    const KernelForm form = chosen(space, launch.form, want);
    return (visit_form<F>(form, launch, want, fn) || ...);
  }

  /// Calls f(KernelType<K>{}...) with every kernel of the table at every
  /// listed tuple and each precision `launches` ask for: what a run
  /// instantiates, for tests and plans that walk the whole table.
  template <class Fn>
  static void for_each(const Launch& launch, const Fn& fn) {
    (for_each_tuple<F>(launch, fn, typename F::sizes{}), ...);
  }

 private:
  template <class One, std::size_t N, class Fn>
  static bool visit_form(KernelForm form, const Launch& launch, const std::array<int, N>& want,
                         const Fn& fn) {
    return One::form == form && One::sizes::dispatch(want, One::match, [&](auto tuple) {
             One::kernels::template visit<decltype(tuple)>(
                 launch, [&](auto... kernel) { fn(kernel..., form_name(One::form)); });
           });
  }

  template <class One, class Fn, class... Tuples>
  static void for_each_tuple(const Launch& launch, const Fn& fn, SizeList<Tuples...>) {
    (One::kernels::template visit<Tuples>(launch, fn), ...);
  }
};

}  // namespace kdnn::impl
