// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Small tables the host computes for a launch (work lists, per-entry
// lengths and flags): filled in a host mirror and copied to the space's
// memory in one place.
#include <Kokkos_Core.hpp>

namespace kdnn::impl {

/// `view` (allocated by the caller, in `space`'s memory) after `fill(host)`
/// has written every element of `host`, a HostSpace mirror of it, and the
/// mirror has been copied over on `space`. Fenced: the mirror is freed on
/// return, and the table is ready for any later launch.
template <class ExecSpace, class View, class Fill>
View filled_on_host(const ExecSpace& space, const View& view, const Fill& fill) {
  const auto host = Kokkos::create_mirror_view(Kokkos::HostSpace(), view);
  fill(host);
  Kokkos::deep_copy(space, view, host);
  space.fence();
  return view;
}

}  // namespace kdnn::impl
