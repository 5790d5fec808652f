// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What the context-parallel subcommands (cp-conv, ssd) share: the --split
// option, reading the inputs on rank 0 and telling every rank their sizes,
// and moving arrays between rank 0, which reads and writes the
// whole-sequence files, and the ranks that hold their steps.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cli.hpp"
#include "kdnn/core/error.hpp"
#include "kdnn/cp/agree.hpp"
#include "kdnn/cp/impl/mpi_memory.hpp"

namespace kdnn::cli {

/// The counts of --split (empty: none given), each an integer in
/// [0, 2^63 - 1]; usage errors. split_lengths checks them against L.
inline std::vector<std::int64_t> parse_split(const std::string& text, int P) {
  std::vector<std::int64_t> lengths;
  if (text.empty()) return lengths;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::int64_t v = -1;
    const char* end = item.data() + item.size();
    const auto [ptr, ec] = std::from_chars(item.data(), end, v);
    if (ec != std::errc() || ptr != end || v < 0 || item[0] == '-') {
      usage_fail("--split: expected counts >= 0 (at most ", INT64_MAX, "), got '", item, "'");
    }
    lengths.push_back(v);
  }
  if (int(lengths.size()) != P) {
    usage_fail("--split: expected ", P, " counts (one per rank), got ", lengths.size());
  }
  return lengths;
}

/// Each rank's steps: the --split counts (each at most L and summing to L,
/// read from `source`), or L split as evenly as possible. The same verdict
/// on every rank (the same counts and L), so call it inside cp::agree.
inline std::vector<std::int64_t> split_lengths(std::vector<std::int64_t> lengths, std::int64_t L,
                                               int P, const char* source) {
  if (lengths.empty()) {
    for (int r = 0; r < P; ++r) lengths.push_back(L / P + (r < L % P ? 1 : 0));
    return lengths;
  }
  // Each count in [0, L] first: their sum then stays below P * 2^31, no
  // int64 overflow (L fits an int).
  std::int64_t total = 0;
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    if (lengths[r] > L) {
      fail("--split: count ", lengths[r], " of rank ", r, " is more than L=", L, " (from ", source,
           ")");
    }
    total += lengths[r];
  }
  if (total != L)
    fail("--split: counts sum to ", total, ", expected L=", L, " (from ", source, ")");
  return lengths;
}

/// The number of ranks of `comm`.
inline int size_of(MPI_Comm comm) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  return size;
}

/// This process' rank in `comm`.
inline int rank_in(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}

/// What rank 0 read, and what every rank knows of it.
template <class Header, class Inputs>
struct Loaded {
  std::optional<Inputs> inputs;       ///< on rank 0 only
  Header header;                      ///< the sizes and flags, on every rank
  std::vector<std::int64_t> lengths;  ///< each rank's steps

  const Inputs* on_rank0() const { return inputs ? &*inputs : nullptr; }
};

/// The start of every context-parallel subcommand, once its options are
/// parsed (the same on every rank) and its --split `counts` too: rank 0
/// checks the --out directory `out` and reads the inputs with
/// `read(Header&)`, which returns them and fills the header (a struct of
/// std::int64_t with the dtype flag `f64` and the length `L`); every rank
/// receives the header, and checks `counts` against its L (the sequence of
/// the file `lengths_of`). A failure on rank 0 is the same kdnn::Error on
/// every rank (cp::agree).
template <class Header, class Read>
auto load_on_rank0(MPI_Comm comm, const std::string& out, const std::vector<std::int64_t>& counts,
                   const char* lengths_of, Read read) {
  static_assert(std::is_trivially_copyable_v<Header> && sizeof(Header) % sizeof(std::int64_t) == 0,
                "the header is broadcast as an array of std::int64_t");
  using Inputs = std::invoke_result_t<Read, Header&>;
  const int rank = rank_in(comm), ranks = size_of(comm);
  Loaded<Header, Inputs> loaded;
  cp::agree(comm, [&] {
    if (rank != 0) return;
    require_directory("--out", out);
    loaded.inputs.emplace(read(loaded.header));
  });
  MPI_Bcast(&loaded.header, int(sizeof(Header) / sizeof(std::int64_t)), MPI_INT64_T, 0, comm);
  // --split is checked against L on every rank (its usage errors are the same
  // on every rank; the sum needs L, which only rank 0 read).
  cp::agree(comm,
            [&] { loaded.lengths = split_lengths(counts, loaded.header.L, ranks, lengths_of); });
  return loaded;
}

/// B sequences of L steps split across the ranks of `comm`, rank r holding
/// `lengths[r]` steps; rank 0 holds the whole arrays [B, L, E...].
struct Sharding {
  std::vector<std::int64_t> lengths;
  std::int64_t B = 0, L = 0;
  int rank = 0;
  MPI_Comm comm = MPI_COMM_WORLD;
  const char* op = "";  ///< the subcommand, for messages

  std::int64_t mine() const { return lengths[rank]; }
  int ranks() const { return int(lengths.size()); }

  /// The elements of one batch entry that rank `r` holds of a [B, L, E]
  /// array, n_r * E, an MPI count. The same on every rank, so the check
  /// throws on all of them or none.
  int row(int r, std::int64_t E) const {
    if (E != 0 && lengths[r] > INT_MAX / E) {
      fail(op, ": ", lengths[r], " steps of ", E, " values on rank ", r, ", expected fewer than ",
           "2^31 values per batch entry (MPI counts are int)");
    }
    return int(lengths[r] * E);
  }

  /// Every rank checks every rank's count: the same error on all of them.
  void check_rows(std::int64_t E) const {
    for (int r = 0; r < ranks(); ++r) row(r, E);
  }

  /// Rank r's steps of a [B, L, E] array of T as one MPI datatype: B blocks
  /// of n_r * E elements, L * E apart, from the rank's first step. Only for a
  /// non-empty block (B > 0 and n_r * E > 0): then the whole array is in
  /// memory and L * E * sizeof(T) a valid stride. The caller frees it.
  template <class T>
  MPI_Datatype block_type(int r, std::int64_t E) const {
    MPI_Datatype block;
    const MPI_Aint stride = MPI_Aint(L * E * std::int64_t(sizeof(T)));
    MPI_Type_create_hvector(int(B), row(r, E), stride, cp::impl::mpi_type<T>(), &block);
    MPI_Type_commit(&block);
    return block;
  }

  /// The first step of rank r.
  std::int64_t offset(int r) const {
    std::int64_t at = 0;
    for (int q = 0; q < r; ++q) at += lengths[q];
    return at;
  }

  /// Copies between rank 0's own block of `whole` [B, L, E] and its `part`
  /// [B, n_0, E], in the direction `to_part`.
  template <class T>
  void copy_own(T* whole, T* part, std::int64_t E, bool to_part) const {
    const std::int64_t n = row(0, E);
    if (n == 0) return;
    for (std::int64_t b = 0; b < B; ++b) {
      T* w = whole + b * L * E;  // rank 0's steps start at step 0
      T* p = part + b * n;
      if (to_part)
        std::copy(w, w + n, p);
      else
        std::copy(p, p + n, w);
    }
  }

  /// Moves every rank's block between rank 0's `whole` [B, L, E] and the
  /// ranks' `part` [B, n_r, E]: one message per rank with a non-empty block
  /// (a derived datatype on rank 0, B rows of n_r * E on the others).
  template <class T>
  void exchange(T* whole, T* part, std::int64_t E, bool scatter) const {
    constexpr int kTag = 7;
    if (B == 0) return;
    if (rank != 0) {
      const int n = row(rank, E);
      if (n == 0) return;
      MPI_Datatype rows;
      MPI_Type_contiguous(n, cp::impl::mpi_type<T>(), &rows);
      MPI_Type_commit(&rows);
      if (scatter)
        MPI_Recv(part, int(B), rows, 0, kTag, comm, MPI_STATUS_IGNORE);
      else
        MPI_Send(part, int(B), rows, 0, kTag, comm);
      MPI_Type_free(&rows);
      return;
    }
    std::vector<MPI_Request> requests;
    std::vector<MPI_Datatype> types;
    for (int r = 1; r < ranks(); ++r) {
      if (row(r, E) == 0) continue;
      types.push_back(block_type<T>(r, E));
      requests.emplace_back();
      T* first = whole + offset(r) * E;
      if (scatter)
        MPI_Isend(first, 1, types.back(), r, kTag, comm, &requests.back());
      else
        MPI_Irecv(first, 1, types.back(), r, kTag, comm, &requests.back());
    }
    copy_own(whole, part, E, scatter);
    MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
    for (MPI_Datatype& t : types) MPI_Type_free(&t);
  }

  /// Whether rank 0 holds every step (one rank, or every other rank empty):
  /// then rank 0's part of a [B, L, E] array is the whole array, and nothing
  /// moves or is copied.
  bool whole_on_rank0() const { return lengths[0] == L; }

  /// This rank's steps of a [B, L, E] array: a copy, or (whole_on_rank0) the
  /// whole array itself.
  template <class T>
  struct Steps {
    std::vector<T> copy;
    T* data = nullptr;
  };

  /// Scatters the steps of a [B, L, E] array (`whole`, read on rank 0) into
  /// this rank's [B, mine(), E].
  template <class T>
  Steps<T> scatter(const T* whole, std::int64_t E) const {
    check_rows(E);
    Steps<T> part;
    // MPI_Isend takes a non-const buffer; scattering only reads `whole`.
    if (whole_on_rank0()) {
      part.data = const_cast<T*>(whole);  // null on the other ranks (no steps)
      return part;
    }
    part.copy.resize(std::size_t(B) * std::size_t(row(rank, E)));
    part.data = part.copy.data();
    exchange<T>(const_cast<T*>(whole), part.data, E, true);
    return part;
  }

  /// The inverse of scatter: this rank's [B, mine(), E] (`part`) into rank
  /// 0's [B, L, E] (`whole`, written on rank 0).
  template <class T>
  void gather(T* part, T* whole, std::int64_t E) const {
    check_rows(E);
    if (whole_on_rank0()) {
      if (rank == 0 && part != whole) std::copy(part, part + B * L * E, whole);
      return;
    }
    exchange<T>(whole, part, E, false);
  }
};

/// A whole array broadcast from rank 0 (`a` read there; weights).
template <class T>
std::vector<T> broadcast(const io::NpyArray* a, std::size_t n, int rank, MPI_Comm comm) {
  std::vector<T> v(n);
  if (rank == 0 && n) std::copy(a->data<T>(), a->data<T>() + n, v.begin());
  MPI_Bcast(v.data(), int(n), cp::impl::mpi_type<T>(), 0, comm);
  return v;
}

/// A whole array read on rank 0 (`a` there) as a vector on rank `owner`
/// (empty on the other ranks); e.g. d(final state), which belongs to the
/// last rank. Collective: every rank passes the same n.
template <class T>
std::vector<T> send_to_rank(const io::NpyArray* a, std::size_t n, int owner, int rank,
                            MPI_Comm comm) {
  if (n > std::size_t(INT_MAX)) {
    fail("an array of ", n, " values for one rank, expected at most 2^31 - 1 (MPI counts are int)");
  }
  std::vector<T> v;
  if (rank == 0) v.assign(a->data<T>(), a->data<T>() + n);
  if (owner == 0) return v;
  if (rank == 0) {
    MPI_Send(v.data(), int(n), cp::impl::mpi_type<T>(), owner, 2, comm);
    v = std::vector<T>();
  } else if (rank == owner) {
    v.resize(n);
    MPI_Recv(v.data(), int(n), cp::impl::mpi_type<T>(), 0, 2, comm, MPI_STATUS_IGNORE);
  }
  return v;
}

/// Host memory as a View of the execution space with the given extents: the
/// memory itself on a host backend, a device copy otherwise.
template <class DataType, class T, class... Extents>
auto device_view(T* data, Extents... extents) {
  Kokkos::View<DataType, Kokkos::LayoutRight, Kokkos::HostSpace,
               Kokkos::MemoryTraits<Kokkos::Unmanaged>>
  host(data, std::size_t(extents)...);
  return Kokkos::create_mirror_view_and_copy(Space::memory_space(), host);
}
template <class DataType, class T, class... Extents>
auto device_view(std::vector<T>& v, Extents... extents) {
  return device_view<DataType>(v.data(), extents...);
}
template <class DataType, class T, class... Extents>
auto device_view(Sharding::Steps<T>& steps, Extents... extents) {
  return device_view<DataType>(steps.data, extents...);
}

template <class View, class T>
void copy_back(const View& view, std::vector<T>& v) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  v.assign(host.data(), host.data() + host.size());
}

/// The output files, collected on rank 0 from the ranks' Views.
template <class T>
struct Collector {
  const Sharding& s;
  std::vector<Output> outputs;  ///< on rank 0

  /// The View [B, mine(), tail...] of the execution space that the per-step
  /// output `name` is computed into. When rank 0 holds every step and the
  /// backend is on the host, it is the output file's own buffer (allocated
  /// here), so that gathered() moves and copies nothing.
  template <class DataType, class... Tail>
  Kokkos::View<DataType, Kokkos::LayoutRight, Space> per_step(const char* name, Tail... tail) {
    using ViewType = Kokkos::View<DataType, Kokkos::LayoutRight, Space>;
    constexpr bool host =
        Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Space::memory_space>::accessible;
    if (host && s.whole_on_rank0() && s.rank == 0) {
      std::vector<std::size_t> shape{std::size_t(s.B), std::size_t(s.L), std::size_t(tail)...};
      outputs.push_back({name, io::allocate_npy(io::dtype_of<T>(), shape)});
      return ViewType(outputs.back().array.template data<T>(), std::size_t(s.B), std::size_t(s.L),
                      std::size_t(tail)...);
    }
    return ViewType(std::string(name), std::size_t(s.B), std::size_t(s.mine()),
                    std::size_t(tail)...);
  }

  /// A per-step output: every rank's View [B, mine(), tail...] gathered into
  /// one [B, L, tail...] file (nothing to do for a per_step View that is the
  /// file's buffer).
  template <class View>
  void gathered(const char* name, const View& view) {
    std::vector<std::size_t> shape{std::size_t(s.B), std::size_t(s.L)};
    std::int64_t E = 1;
    for (int d = 2; d < int(view.rank); ++d) {
      shape.push_back(view.extent(d));
      E *= std::int64_t(view.extent(d));
    }
    auto part =
        Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);  // on a host: itself
    const auto known = std::find_if(outputs.begin(), outputs.end(),
                                    [&](const Output& o) { return o.name == name; });
    if (known != outputs.end()) {  // per_step gave the file's buffer
      s.gather<T>(part.data(), known->array.template data<T>(), E);
      return;
    }
    io::NpyArray whole;
    if (s.rank == 0) whole = io::allocate_npy(io::dtype_of<T>(), shape);
    s.gather<T>(part.data(), s.rank ? nullptr : whole.data<T>(), E);
    if (s.rank == 0) outputs.push_back({name, std::move(whole)});
  }

  /// An output one rank (`owner`) holds, sent to rank 0.
  template <class View>
  void from_rank(const char* name, const View& view, int owner) {
    std::vector<T> v;
    if (s.rank == owner) copy_back(view, v);
    std::vector<std::size_t> shape;
    for (int d = 0; d < int(view.rank); ++d) shape.push_back(view.extent(d));
    if (owner != 0) {
      if (s.rank == owner) MPI_Send(v.data(), int(v.size()), cp::impl::mpi_type<T>(), 0, 1, s.comm);
      if (s.rank == 0) {
        v.resize(view.size());
        MPI_Recv(v.data(), int(v.size()), cp::impl::mpi_type<T>(), owner, 1, s.comm,
                 MPI_STATUS_IGNORE);
      }
    }
    if (s.rank != 0) return;
    io::NpyArray a = io::allocate_npy(io::dtype_of<T>(), shape);
    std::copy(v.begin(), v.end(), a.data<T>());
    outputs.push_back({name, std::move(a)});
  }
};

}  // namespace kdnn::cli
