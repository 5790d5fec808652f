// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The ways the context-parallel tests split a sequence over ranks, a rank's
// slice of it, and packed sequences in it; this process's rank and the
// number of ranks.
#pragma once
#include <mpi.h>

#include <algorithm>
#include <vector>

namespace kdnn_test {

inline int comm_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int comm_size() {
  int p = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return p;
}

/// Split patterns of L steps over R ranks (step counts per rank, in rank
/// order): even (the remainder on the first ranks); short ranks (every other
/// one `short_steps` steps, the others empty) before a long last one;
/// everything on the first rank; everything on the last; uneven (rank r > 0
/// takes uneven_base + r steps, the rest on rank 0). One rank: the even split
/// only. Patterns that do not fit in L are left out.
inline std::vector<std::vector<int>> rank_splits(int R, int L, int short_steps, int uneven_base) {
  std::vector<std::vector<int>> out;
  std::vector<int> even(R, L / R);
  for (int r = 0; r < L % R; ++r) ++even[r];
  out.push_back(even);
  if (R == 1) return out;
  std::vector<int> short_first(R, 0);
  int used = 0;
  for (int r = 0; r < R - 1; ++r) used += short_first[r] = (r % 2 == 0) ? short_steps : 0;
  short_first[R - 1] = L - used;
  out.push_back(short_first);
  std::vector<int> first_only(R, 0), last_only(R, 0);
  first_only[0] = L;
  last_only[R - 1] = L;
  out.push_back(first_only);
  out.push_back(last_only);
  std::vector<int> uneven(R);
  int rest = L;
  for (int r = 1; r < R; ++r) rest -= uneven[r] = uneven_base + r;
  uneven[0] = rest;
  out.push_back(uneven);
  std::vector<std::vector<int>> valid;
  for (const auto& lengths : out) {
    if (std::all_of(lengths.begin(), lengths.end(), [](int l) { return l >= 0; })) {
      valid.push_back(lengths);
    }
  }
  return valid;
}

/// Steps [first, first + n) of a [B, L, E] tensor, flat.
inline std::vector<double> slice(const std::vector<double>& v, int B, int L, int E, int first,
                                 int n) {
  std::vector<double> out;
  for (int b = 0; b < B; ++b) {
    const auto at = v.begin() + (std::size_t(b) * L + first) * E;
    out.insert(out.end(), at, at + std::size_t(n) * E);
  }
  return out;
}

/// Sequence ids [B, L] (packed sequences): row b's sequences have the
/// lengths lengths[b % size()], in turn, until L steps; ids from 10·b − 3.
inline std::vector<double> packed_ids(int B, int L, const std::vector<std::vector<int>>& lengths) {
  std::vector<double> seq;
  for (int b = 0; b < B; ++b) {
    const auto& row = lengths[b % lengths.size()];
    int id = 10 * b - 3, t = 0;
    for (std::size_t i = 0; t < L; ++i, ++id) {
      for (int k = 0; k < row[i % row.size()] && t < L; ++k, ++t) seq.push_back(id);
    }
  }
  return seq;
}

}  // namespace kdnn_test
