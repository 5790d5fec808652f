// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Collective argument checks for context-parallel operators: every rank of
// the communicator reaches the same verdict, so a bad argument on one rank
// raises the same kdnn::Error on every rank instead of leaving the others
// waiting in a collective (a hang) or computing with mismatched shapes.
#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kdnn/core/error.hpp"
#include "kdnn/core/impl/fingerprint.hpp"

namespace kdnn::cp {

/// Runs `local_checks` (host-side checks that throw kdnn::Error) on every rank
/// of `comm`. Collective. If they threw on any rank, every rank throws
/// kdnn::Error with the message of the lowest such rank, as
/// "<message> (on rank r of P)".
///
/// With `lock`, the caller's hold on an execution space (a class with
/// `released_while(wait)`, such as kdnn's space lock): the checks run under
/// it and the ranks' exchange with it released, so that a thread waiting
/// for the other ranks never keeps this rank's other threads off the space
/// (two threads' calls on two communicators, reaching the ranks in
/// different orders, would each wait for the other).
namespace impl {
/// Sends the message of rank `first`, the lowest whose checks threw, to every
/// rank of `comm` (two broadcasts). Collective; nothing when none threw
/// (first == the number of ranks).
inline void share_failure(MPI_Comm comm, int first, int size, std::string& message) {
  if (first == size) return;
  int length = int(message.size());
  MPI_Bcast(&length, 1, MPI_INT, first, comm);
  message.resize(std::size_t(length));
  MPI_Bcast(message.data(), length, MPI_CHAR, first, comm);
}

/// Runs `local_checks`: the message it threw, or none.
template <class Checks>
std::optional<std::string> failure_of(const Checks& local_checks) {
  try {
    local_checks();
  } catch (const std::exception& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}
}  // namespace impl

template <class Lock, class Checks>
void agree(MPI_Comm comm, Lock& lock, const Checks& local_checks) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const auto failure = impl::failure_of(local_checks);
  std::string message = failure.value_or("");
  const int failed_at = failure ? rank : size;
  int first = size;
  lock.released_while([&] {
    MPI_Allreduce(&failed_at, &first, 1, MPI_INT, MPI_MIN, comm);
    impl::share_failure(comm, first, size, message);
  });
  if (first < size) fail(message, " (on rank ", first, " of ", size, ")");
}

namespace impl {
/// No execution space held: agree()'s exchange runs as it is.
struct Unlocked {
  template <class Wait>
  void released_while(const Wait& wait) {
    wait();
  }
};
}  // namespace impl

template <class Checks>
void agree(MPI_Comm comm, const Checks& local_checks) {
  impl::Unlocked none;
  agree(comm, none, local_checks);
}

/// Throws kdnn::Error naming `comm` unless MPI is initialised and not yet
/// finalised (no communicator can be used then).
inline void check_mpi_running(const char* op) {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (!initialised || finalised) {
    fail(op, ": comm cannot be used, MPI is ", finalised ? "finalised" : "not initialised",
         ", expected a communicator of an initialised MPI");
  }
}

/// Throws kdnn::Error naming `comm` unless it is a live intracommunicator
/// of an initialised MPI: MPI_COMM_NULL (a freed communicator is set to
/// it), an intercommunicator, or MPI not initialised or already finalised.
/// Local: a rank with no usable communicator cannot reach the others.
inline void check_communicator(const char* op, MPI_Comm comm) {
  check_mpi_running(op);
  if (comm == MPI_COMM_NULL) fail(op, ": comm is MPI_COMM_NULL, expected a live communicator");
  int inter = 0;
  MPI_Comm_test_inter(comm, &inter);
  if (inter) fail(op, ": comm is an intercommunicator, expected an intracommunicator");
}

/// The name of a floating-point type of `bytes` bytes, as a rank reports it.
inline const char* dtype_name(std::int64_t bytes) {
  return bytes == 4 ? "float32" : bytes == 8 ? "float64" : bytes == 2 ? "a 16-bit type" : "?";
}

/// One named integer a rank contributes to a Signature.
struct Field {
  const char* name;
  std::int64_t value;
  enum Rule {
    same,         ///< must be equal on every rank
    rank0_only,   ///< nonzero ("given") on rank 0 at most
    any,          ///< may differ (gathered for the caller, e.g. each rank's length)
    same_dtype,   ///< sizeof of the element type: equal on every rank, named as a dtype
    same_real,    ///< the bits of a double option (Field::real): equal on every rank
    same_values,  ///< a parameter's fingerprint (impl::fingerprint): equal on every rank
  } rule = same;

  /// A double option that must be the same on every rank, compared by its bits.
  static Field real(const char* name, double v) {
    std::int64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return {name, bits, same_real};
  }
  static double real_of(std::int64_t bits) {
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  /// A parameter (a contiguous View) that must hold the same values on every
  /// rank, compared by its fingerprint (one reduction on `space`).
  template <class ExecSpace, class View>
  static Field values(const ExecSpace& space, const char* name, const View& v) {
    return {name, std::int64_t(kdnn::impl::fingerprint(space, v)), same_values};
  }
};

namespace impl {
/// Every rank's `values` (the same count on every rank), [rank][value].
/// Collective: one all-gather.
inline std::vector<std::vector<std::int64_t>> all_gathered(MPI_Comm comm,
                                                           const std::vector<std::int64_t>& mine) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  const int n = int(mine.size());
  std::vector<std::int64_t> all(std::size_t(n) * size);
  MPI_Allgather(mine.data(), n, MPI_INT64_T, all.data(), n, MPI_INT64_T, comm);
  std::vector<std::vector<std::int64_t>> by_rank(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) by_rank[r].assign(all.begin() + r * n, all.begin() + (r + 1) * n);
  return by_rank;
}

/// Throws the first rule that every rank's values (`by_rank`, gathered)
/// break. Every rank holds the same values, so every rank throws the same.
inline void check_signature(const char* op, const std::vector<Field>& fields,
                            const std::vector<std::vector<std::int64_t>>& by_rank) {
  for (std::size_t r = 1; r < by_rank.size(); ++r) {
    for (std::size_t f = 0; f < fields.size(); ++f) {
      const std::int64_t v = by_rank[r][f], v0 = by_rank[0][f];
      const Field::Rule rule = fields[f].rule;
      if (rule == Field::same && v != v0) {
        fail(op, ": ", fields[f].name, "=", v, " on rank ", r, ", expected ", v0,
             " (as on rank 0; every rank must agree)");
      }
      if (rule == Field::same_dtype && v != v0) {
        fail(op, ": ", fields[f].name, " has dtype ", dtype_name(v), " on rank ", r, ", expected ",
             dtype_name(v0), " (as on rank 0; every rank must agree)");
      }
      if (rule == Field::same_real && v != v0) {
        fail(op, ": ", fields[f].name, "=", Field::real_of(v), " on rank ", r, ", expected ",
             Field::real_of(v0), " (as on rank 0; every rank must agree)");
      }
      if (rule == Field::same_values && v != v0) {
        fail(op, ": ", fields[f].name, " on rank ", r,
             " differs from rank 0's, expected the same values on every rank (a parameter of the "
             "whole sequence)");
      }
      if (rule == Field::rank0_only && v != 0) {
        fail(op, ": ", fields[f].name, " given on rank ", r,
             ", expected it on rank 0 only (it belongs to the start of the sequence)");
      }
    }
  }
}
}  // namespace impl

/// What a context-parallel call does before it computes, in one all-gather
/// (plus two broadcasts when a rank's checks threw): runs `local_checks` as
/// agree() does, and gathers each rank's `fields` (the same names, in the
/// same order, on every rank) and checks their rules. A rank's failed check
/// comes first, as "<message> (on rank r of P)" from the lowest such rank;
/// then a `same` field that differs from rank 0's, or a `rank0_only` field
/// set on another rank, e.g. "cp::conv_dt_forward: C=4 on rank 2, expected
/// 3 (as on rank 0; every rank must agree)". Every rank throws the same
/// kdnn::Error. `fields` are computed before the checks run, so they must be
/// well defined for any arguments (shapes, flags, fingerprints). Returns
/// every rank's values, [rank][field]. Collective.
template <class Checks>
std::vector<std::vector<std::int64_t>> agree_on_signature(MPI_Comm comm, const char* op,
                                                          const Checks& local_checks,
                                                          const std::vector<Field>& fields) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const auto failure = impl::failure_of(local_checks);
  std::vector<std::int64_t> mine{failure ? 1 : 0};  // the checks' verdict, then the fields
  for (const Field& f : fields) mine.push_back(f.value);
  auto by_rank = impl::all_gathered(comm, mine);
  int first = size;
  for (int r = size - 1; r >= 0; --r) first = by_rank[r][0] != 0 ? r : first;
  std::string message = failure.value_or("");
  impl::share_failure(comm, first, size, message);
  if (first < size) fail(message, " (on rank ", first, " of ", size, ")");
  for (auto& values : by_rank) values.erase(values.begin());
  impl::check_signature(op, fields, by_rank);
  return by_rank;
}

}  // namespace kdnn::cp
