// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The checks every kdnn::cp call that takes a SequenceLayout makes: the
// layout has a rank for each of the communicator's (a local check, run
// inside agree_on_signature), and the ranks were given the same layout
// (compared by its fingerprint, one Field of the call's signature).
#include <mpi.h>

#include "kdnn/core/error.hpp"
#include "kdnn/cp/agree.hpp"
#include "kdnn/cp/sequence_layout.hpp"

namespace kdnn::cp::impl {

inline void check_layout_ranks(const char* op, MPI_Comm comm, const SequenceLayout& layout) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  if (layout.ranks() != size) {
    fail(op, ": the layout has ", layout.ranks(), " ranks, expected ", size,
         " (the communicator's)");
  }
}

/// The signature's field that compares the ranks' layouts.
inline Field layout_field(const char* name, const SequenceLayout& layout) {
  return {name, layout.fingerprint(), Field::same_values};
}

}  // namespace kdnn::cp::impl
