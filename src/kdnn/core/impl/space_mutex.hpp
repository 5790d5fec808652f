// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The process's per-backend locks behind core/impl/space_lock.hpp, declared
// apart from it so that their one definition (space_lock.cpp) is compiled
// without Kokkos.
#include <mutex>

namespace kdnn::impl {

/// The process's lock for execution spaces whose type's name() is
/// `space_name` (one definition, in libkdnn).
std::recursive_mutex& space_mutex(const char* space_name);

}  // namespace kdnn::impl
