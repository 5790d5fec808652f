// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What makes kdnn's calls safe from any thread. Kokkos' execution spaces are
// not all safe for concurrent use: Kokkos 3.4's Serial backend keeps one team
// and reduction buffer for the whole process and its OpenMP backend one
// thread pool, and a CUDA instance resizes its reduction scratch without a
// lock (3.4 and 4.6 alike). So every kdnn operator holds the lock of its
// execution space's type while it checks its arguments, launches its kernels
// and, on a host backend, runs them: concurrent calls on one backend take
// turns and each gives what it gives alone. One thread pays one uncontended
// lock per call. The lock is recursive, as an operator may call another
// (the attention layer its Linear), and it is one per type rather than per
// instance because Kokkos 3.4's host instances share their buffers. On
// Kokkos 3.4's OpenMP backend the lock also gives a calling thread that has
// no thread pool its own (core/impl/openmp_thread_pool.hpp).
#include <Kokkos_Core.hpp>
#include <mutex>
#include <type_traits>

#include "kdnn/core/impl/openmp_thread_pool.hpp"
#include "kdnn/core/impl/space_mutex.hpp"

namespace kdnn::impl {

/// Holds the lock of `space`'s type for its lifetime; a context-parallel
/// operator releases it while it waits on MPI (another thread's call on
/// another communicator may be what the peer ranks wait for).
class SpaceLock {
 public:
  template <class ExecSpace>
  explicit SpaceLock(const ExecSpace&) : lock_(space_mutex(ExecSpace::name())) {
#if defined(KOKKOS_ENABLE_OPENMP)
    if constexpr (std::is_same_v<ExecSpace, Kokkos::OpenMP>) ensure_openmp_pool_on_this_thread();
#endif
  }

  /// Runs `wait()` (a blocking wait on something other than this backend)
  /// with the lock released, and takes it again.
  template <class Wait>
  void released_while(const Wait& wait) {
    lock_.unlock();
    wait();
    lock_.lock();
  }

 private:
  std::unique_lock<std::recursive_mutex> lock_;
};

}  // namespace kdnn::impl
