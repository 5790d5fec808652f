// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// A global tensor and each rank's part of it under a SequenceLayout
// (cp/sequence_layout.hpp): global [B, S, ...] with the sequence as
// dimension 1 (rank 2, 3 or 4; any strides), a rank's part [B, L_r, ...]
// holding its segments one after another.
//  * shard(space, layout, rank, global, local): local = that rank's steps of
//    global. Local (no communication); asynchronous on `space`.
//  * gather(space, comm, layout, local, global): global = every rank's part
//    in its place, on every rank. Collective over `comm` (of layout.ranks()
//    ranks): the parts travel in one MPI_Allgatherv, through host memory.
//    Its checks are collective: a layout, shape or dtype that differs
//    between ranks throws the same kdnn::Error on every rank. Blocks until
//    global is written.
// Both may be called from several threads (the space's lock, core/impl/
// space_lock.hpp, around their kernels).
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kdnn/core/error.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/cp/agree.hpp"
#include "kdnn/cp/impl/layout_checks.hpp"
#include "kdnn/cp/impl/mpi_memory.hpp"
#include "kdnn/cp/impl/segment_views.hpp"
#include "kdnn/cp/sequence_layout.hpp"

namespace kdnn::cp {

namespace impl {

/// The elements of one step of one batch entry (the product of the extents
/// past dimension 1).
template <class View>
std::int64_t step_elements(const View& v) {
  std::int64_t n = 1;
  for (unsigned d = 2; d < unsigned(View::rank); ++d) n *= std::int64_t(v.extent(d));
  return n;
}

/// A contiguous (LayoutRight) View in `Space` with v's extents, uninitialised.
template <class Space, class View>
auto contiguous_like(const View& v, const char* label) {
  using Out = Kokkos::View<typename View::non_const_data_type, Kokkos::LayoutRight, Space>;
  const auto alloc = Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label));
  const auto e = [&](unsigned d) { return d < unsigned(View::rank) ? v.extent(d) : 0; };
  if constexpr (unsigned(View::rank) == 2) return Out(alloc, e(0), e(1));
  if constexpr (unsigned(View::rank) == 3) return Out(alloc, e(0), e(1), e(2));
  if constexpr (unsigned(View::rank) == 4) return Out(alloc, e(0), e(1), e(2), e(3));
}

/// Throws unless `part` has `steps` steps and global's other extents.
template <class Global, class Part>
void check_part(const char* op, const char* name, const Global& global, const Part& part,
                std::int64_t S, std::int64_t steps) {
  static_assert(unsigned(Global::rank) == unsigned(Part::rank), "global and local of one rank");
  validate::extent(op, "global", global, 1, std::size_t(S), "the layout's sequence length");
  validate::extent(op, name, part, 1, std::size_t(steps), "the steps the layout gives this rank");
  for (int d = 0; d < int(Global::rank); ++d) {
    if (d != 1) validate::extent(op, name, part, d, global.extent(d), "global's");
  }
}

}  // namespace impl

template <class ExecSpace, class Global, class Local>
void shard(const ExecSpace& space, const SequenceLayout& layout, int rank, const Global& global,
           const Local& local) {
  const char* op = "cp::shard";
  if (rank < 0 || rank >= layout.ranks()) {
    fail(op, ": rank=", rank, ", expected 0 <= rank < ", layout.ranks(), " (the layout's ranks)");
  }
  impl::check_part(op, "local", global, local, layout.length(), layout.local_steps(rank));
  kdnn::impl::SpaceLock hold(space);
  std::int64_t at = 0;
  for (const Segment& s : layout.segments(rank)) {
    if (s.steps() > 0) {
      Kokkos::deep_copy(space, impl::sequence_steps(local, at, at + s.steps()),
                        impl::sequence_steps(global, s.begin, s.end));
    }
    at += s.steps();
  }
}

template <class ExecSpace, class Local, class Global>
void gather(const ExecSpace& space, MPI_Comm comm, const SequenceLayout& layout, const Local& local,
            const Global& global) {
  using T = typename Global::non_const_value_type;
  const char* op = "cp::gather";
  check_communicator(op, comm);
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const std::int64_t B = std::int64_t(global.extent(0)), row = impl::step_elements(global);
  agree_on_signature(
      comm, op,
      [&] {
        impl::check_layout_ranks(op, comm, layout);
        impl::check_part(op, "local", global, local, layout.length(), layout.local_steps(rank));
        if (B * layout.length() * row > INT_MAX) {
          fail(op, ": global has ", B * layout.length() * row,
               " elements, expected at most 2^31 - 1 (one MPI_Allgatherv)");
        }
      },
      {impl::layout_field("layout", layout), Field{"B", B}, Field{"the elements of a step", row},
       Field{"global", std::int64_t(sizeof(T)), Field::same_dtype}});
  // This rank's part, contiguous and on the host. The space's lock is held
  // for its kernels only, not while the ranks exchange.
  auto packed = impl::contiguous_like<typename ExecSpace::memory_space>(local, "kdnn::cp::gather");
  typename decltype(packed)::HostMirror mine;
  {
    kdnn::impl::SpaceLock hold(space);
    Kokkos::deep_copy(space, packed, local);
    mine = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), packed);
  }
  std::vector<int> counts(static_cast<std::size_t>(size)), starts(static_cast<std::size_t>(size));
  for (int r = 0, at = 0; r < size; ++r) {
    counts[std::size_t(r)] = int(B * layout.local_steps(r) * row);
    starts[std::size_t(r)] = at;
    at += counts[std::size_t(r)];
  }
  std::vector<T> all(static_cast<std::size_t>(B * layout.length() * row));
  MPI_Allgatherv(mine.data(), counts[std::size_t(rank)], impl::mpi_type<T>(), all.data(),
                 counts.data(), starts.data(), impl::mpi_type<T>(), comm);
  // Rank r's block is [B, L_r, row]: each run of its steps goes to its place.
  auto whole = impl::contiguous_like<Kokkos::HostSpace>(global, "kdnn::cp::gather");
  const std::int64_t S = layout.length();
  for (const Placement& p : layout.in_sequence_order()) {
    const std::int64_t L = layout.local_steps(p.rank);
    for (std::int64_t b = 0; b < B; ++b) {
      const T* from = all.data() + starts[std::size_t(p.rank)] + (b * L + p.local) * row;
      std::memcpy(whole.data() + (b * S + p.global.begin) * row, from,
                  std::size_t(p.global.steps() * row) * sizeof(T));
    }
  }
  kdnn::impl::SpaceLock hold(space);
  auto device = Kokkos::create_mirror_view_and_copy(typename ExecSpace::memory_space(), whole);
  Kokkos::deep_copy(space, global, device);
  space.fence();
}

}  // namespace kdnn::cp
