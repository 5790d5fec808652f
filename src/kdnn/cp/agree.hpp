// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Collective argument checks for context-parallel operators: every rank of
// the communicator reaches the same verdict, so a bad argument on one rank
// raises the same kdnn::Error on every rank instead of leaving the others
// waiting in a collective (a hang) or computing with mismatched shapes.
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kdnn/core/error.hpp"

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
template <class Lock, class Checks>
void agree(MPI_Comm comm, Lock& lock, const Checks& local_checks) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  std::string message;
  int failed_at = size;
  try {
    local_checks();
  } catch (const std::exception& e) {
    message = e.what();
    failed_at = rank;
  }
  int first = size;
  lock.released_while([&] {
    MPI_Allreduce(&failed_at, &first, 1, MPI_INT, MPI_MIN, comm);
    if (first == size) return;
    int length = int(message.size());
    MPI_Bcast(&length, 1, MPI_INT, first, comm);
    message.resize(std::size_t(length));
    MPI_Bcast(message.data(), length, MPI_CHAR, first, comm);
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

/// One named integer a rank contributes to a Signature.
struct Field {
  const char* name;
  std::int64_t value;
  enum Rule {
    same,        ///< must be equal on every rank
    rank0_only,  ///< nonzero ("given") on rank 0 at most
    any          ///< may differ (gathered for the caller, e.g. each rank's length)
  } rule = same;
};

/// Gathers each rank's fields (the same names, in the same order, on every
/// rank) and checks them: a `same` field that differs from rank 0's, or a
/// `rank0_only` field set on another rank, throws on every rank the same
/// kdnn::Error, e.g. "cp::conv_dt_forward: C=4 on rank 2, expected 3 (as on
/// rank 0)". Returns every rank's values, [rank][field]. Collective.
inline std::vector<std::vector<std::int64_t>> gather_signature(MPI_Comm comm, const char* op,
                                                               const std::vector<Field>& fields) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  const int n = int(fields.size());
  std::vector<std::int64_t> mine(fields.size()), all(std::size_t(n) * size);
  for (int f = 0; f < n; ++f) mine[f] = fields[f].value;
  MPI_Allgather(mine.data(), n, MPI_INT64_T, all.data(), n, MPI_INT64_T, comm);
  std::vector<std::vector<std::int64_t>> by_rank(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) by_rank[r].assign(all.begin() + r * n, all.begin() + (r + 1) * n);
  for (int r = 1; r < size; ++r) {
    for (int f = 0; f < n; ++f) {
      const std::int64_t v = by_rank[r][f], v0 = by_rank[0][f];
      if (fields[f].rule == Field::same && v != v0) {
        fail(op, ": ", fields[f].name, "=", v, " on rank ", r, ", expected ", v0,
             " (as on rank 0; every rank must agree)");
      }
      if (fields[f].rule == Field::rank0_only && v != 0) {
        fail(op, ": ", fields[f].name, " given on rank ", r,
             ", expected it on rank 0 only (it belongs to the start of the sequence)");
      }
    }
  }
  return by_rank;
}

}  // namespace kdnn::cp
