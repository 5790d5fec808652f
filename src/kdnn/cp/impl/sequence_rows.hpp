// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Moving per-head rows between the ranks' pieces and the whole sequence, for
// the context-parallel attention that gathers the sequence (all_gather,
// all_to_all; cp/attention.hpp). A message from a rank holds its local
// steps of one or more tensors [B, heads, L_r, E], each packed row-major one
// after another ("parts"); a buffer of every rank's message (as
// MPI_Allgatherv and MPI_Alltoallv lay them out) is put in sequence order
// through the layout's map of each global step to its rank and local row.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <vector>

#include "kdnn/core/tensor.hpp"
#include "kdnn/cp/sequence_layout.hpp"

namespace kdnn::cp::impl {

/// Where every global step lies: its rank and its row there, and each
/// rank's number of steps, on the device.
template <class ExecSpace>
struct SequenceMap {
  using Memory = typename ExecSpace::memory_space;
  Kokkos::View<int*, Memory> rank_of, row_of;  ///< [S]
  Kokkos::View<std::int64_t*, Memory> steps;   ///< [R]: L_r

  SequenceMap(const ExecSpace& space, const SequenceLayout& layout)
      : rank_of("kdnn::cp::rank_of", std::size_t(layout.length())),
        row_of("kdnn::cp::row_of", std::size_t(layout.length())),
        steps("kdnn::cp::steps_of", std::size_t(layout.ranks())) {
    auto r = Kokkos::create_mirror_view(rank_of);
    auto t = Kokkos::create_mirror_view(row_of);
    auto l = Kokkos::create_mirror_view(steps);
    for (const Placement& p : layout.in_sequence_order()) {
      for (std::int64_t i = 0; i < p.global.steps(); ++i) {
        r(std::size_t(p.global.begin + i)) = p.rank;
        t(std::size_t(p.global.begin + i)) = int(p.local + i);
      }
    }
    for (int q = 0; q < layout.ranks(); ++q) l(std::size_t(q)) = layout.local_steps(q);
    Kokkos::deep_copy(space, rank_of, r);
    Kokkos::deep_copy(space, row_of, t);
    Kokkos::deep_copy(space, steps, l);
  }
};

/// One part of every rank's message: where it starts in rank r's message
/// (offset(r)), as device values.
template <class ExecSpace>
using PartOffsets = Kokkos::View<std::size_t*, typename ExecSpace::memory_space>;

template <class ExecSpace>
PartOffsets<ExecSpace> part_offsets(const ExecSpace& space, const std::vector<std::size_t>& at) {
  PartOffsets<ExecSpace> out("kdnn::cp::part_offsets", at.size());
  auto h = Kokkos::create_mirror_view(out);
  for (std::size_t i = 0; i < at.size(); ++i) h(i) = at[i];
  Kokkos::deep_copy(space, out, h);
  return out;
}

/// A [B, H, L] View as the [B, H, L, 1] rows the parts are made of.
template <class View3>
auto as_rows(const View3& v) {
  using T = typename View3::value_type;
  using Rows = Kokkos::View<T****, Kokkos::LayoutStride, typename View3::memory_space>;
  return Rows(v.data(), Kokkos::LayoutStride(v.extent(0), v.stride(0), v.extent(1), v.stride(1),
                                             v.extent(2), v.stride(2), 1, 1));
}

/// out[0 …) ← src [B, H, L, E] row-major (any strides).
template <class ExecSpace, class T>
void pack_rows(const ExecSpace& space, const StridedTensor4<const T, ExecSpace>& src, T* out) {
  const int B = int(src.extent(0)), H = int(src.extent(1)), L = int(src.extent(2));
  const int E = int(src.extent(3));
  if (std::size_t(B) * H * L == 0) return;
  Kokkos::parallel_for(
      "kdnn::cp::pack_rows",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0}, {B, H, L}),
      KOKKOS_LAMBDA(int b, int h, int t) {
        const std::size_t row = (std::size_t(b) * H + h) * L + t;
        for (int e = 0; e < E; ++e) out[row * E + e] = src(b, h, t, e);
      });
}

/// dst [B, H, L, E] ← in[0 …) row-major, or += with `add`.
template <class ExecSpace, class T>
void unpack_rows(const ExecSpace& space, const T* in, const StridedTensor4<T, ExecSpace>& dst,
                 bool add) {
  const int B = int(dst.extent(0)), H = int(dst.extent(1)), L = int(dst.extent(2));
  const int E = int(dst.extent(3));
  if (std::size_t(B) * H * L == 0) return;
  Kokkos::parallel_for(
      "kdnn::cp::unpack_rows",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0}, {B, H, L}),
      KOKKOS_LAMBDA(int b, int h, int t) {
        const std::size_t row = (std::size_t(b) * H + h) * L + t;
        for (int e = 0; e < E; ++e) {
          dst(b, h, t, e) = add ? dst(b, h, t, e) + in[row * E + e] : in[row * E + e];
        }
      });
}

/// dst(b, h, first + t, e) += src(b, h, t, e).
template <class ExecSpace, class T>
void add_rows(const ExecSpace& space, const StridedTensor4<T, ExecSpace>& dst, int first,
              const StridedTensor4<const T, ExecSpace>& src) {
  const int B = int(src.extent(0)), H = int(src.extent(1)), n = int(src.extent(2));
  const int E = int(src.extent(3));
  if (std::size_t(B) * H * n == 0) return;
  Kokkos::parallel_for(
      "kdnn::cp::add_rows",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0}, {B, H, n}),
      KOKKOS_LAMBDA(int b, int h, int t) {
        for (int e = 0; e < E; ++e) dst(b, h, first + t, e) += src(b, h, t, e);
      });
}

/// whole [B, H, S, E] ← one part of every rank's message in `buf` (rank
/// r's part [B, H, L_r, E] at buf + at(r)): each step from its rank.
template <class ExecSpace, class T>
void to_sequence(const ExecSpace& space, const SequenceMap<ExecSpace>& map, const T* buf,
                 const PartOffsets<ExecSpace>& at, const StridedTensor4<T, ExecSpace>& whole) {
  const int B = int(whole.extent(0)), H = int(whole.extent(1)), S = int(whole.extent(2));
  const int E = int(whole.extent(3));
  if (std::size_t(B) * H * S == 0) return;
  Kokkos::parallel_for(
      "kdnn::cp::to_sequence",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0}, {B, H, S}),
      KOKKOS_LAMBDA(int b, int h, int p) {
        const int r = map.rank_of(p);
        const std::size_t row =
            (std::size_t(b) * H + h) * std::size_t(map.steps(r)) + std::size_t(map.row_of(p));
        const T* from = buf + at(r) + row * E;
        for (int e = 0; e < E; ++e) whole(b, h, p, e) = from[e];
      });
}

/// The reverse: one part of every rank's message in `buf` ← whole's steps
/// on that rank.
template <class ExecSpace, class T>
void from_sequence(const ExecSpace& space, const SequenceMap<ExecSpace>& map,
                   const StridedTensor4<const T, ExecSpace>& whole, T* buf,
                   const PartOffsets<ExecSpace>& at) {
  const int B = int(whole.extent(0)), H = int(whole.extent(1)), S = int(whole.extent(2));
  const int E = int(whole.extent(3));
  if (std::size_t(B) * H * S == 0) return;
  Kokkos::parallel_for(
      "kdnn::cp::from_sequence",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0}, {B, H, S}),
      KOKKOS_LAMBDA(int b, int h, int p) {
        const int r = map.rank_of(p);
        const std::size_t row =
            (std::size_t(b) * H + h) * std::size_t(map.steps(r)) + std::size_t(map.row_of(p));
        T* to = buf + at(r) + row * E;
        for (int e = 0; e < E; ++e) to[e] = whole(b, h, p, e);
      });
}

}  // namespace kdnn::cp::impl
