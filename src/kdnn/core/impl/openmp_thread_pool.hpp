// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Kokkos 3.4's OpenMP backend serves only the thread that initialised it: its
// thread pool (Impl::OpenMPExec: each OpenMP thread's team, reduction and
// scratch buffers) hangs off a thread-local pointer that only that thread
// has, so a kernel launched from any other thread throws "in parallel or not
// initialized" and a View made there cannot be initialised. Kokkos' own
// OpenMP::partition_master gives each partition's master a pool of its own;
// kdnn does the same for any other thread that calls it: one pool of the
// initial pool's size per thread, made at the thread's first call and freed
// when the thread ends. Kokkos 4 keeps its pool per instance, shared by every
// thread, and needs none of this (nor does any other backend).
#include <Kokkos_Core.hpp>
#include <cstddef>

#if defined(KOKKOS_ENABLE_OPENMP) && KOKKOS_VERSION < 40000

namespace kdnn::impl {

/// What the specialisation below does: make a pool of `size` threads into
/// `*pool`, or, when `size` is 0, free `*pool`.
struct OpenMPPoolRequest {
  Kokkos::Impl::OpenMPExec** pool;
  int size;
};

}  // namespace kdnn::impl

namespace Kokkos {

// OpenMPExec's constructor and destructor are private to Kokkos::OpenMP. An
// explicit specialisation of OpenMP's member template partition_master is a
// member of OpenMP and reaches them; it is for kdnn's own request type, which
// nothing else instantiates. The buffer sizes are those Kokkos starts every
// pool with (they grow on demand).
template <>
inline void OpenMP::partition_master<kdnn::impl::OpenMPPoolRequest>(
    const kdnn::impl::OpenMPPoolRequest& request, int /*partitions*/, int /*partition_size*/) {
  if (request.size == 0) {
    delete *request.pool;
    *request.pool = nullptr;
    return;
  }
  const auto size = std::size_t(request.size);
  auto* const pool = new Impl::OpenMPExec(request.size);
  pool->resize_thread_data(32 * size, 32 * size, 1024 * size, 1024);
  *request.pool = pool;
}

}  // namespace Kokkos

namespace kdnn::impl {

/// Lets the calling thread launch Kokkos::OpenMP kernels and make Views:
/// nothing on the thread that initialised Kokkos (or inside a parallel
/// region, or before Kokkos is initialised); on any other thread, its own
/// pool from now until it ends.
inline void ensure_openmp_pool_on_this_thread() {
  if (Kokkos::Impl::t_openmp_instance != nullptr || omp_in_parallel() ||
      !Kokkos::is_initialized()) {
    return;
  }
  struct ThreadPool {
    Kokkos::Impl::OpenMPExec* pool = nullptr;
    ThreadPool() {
      Kokkos::OpenMP::partition_master(
          OpenMPPoolRequest{&pool, Kokkos::Impl::g_openmp_hardware_max_threads}, 0, 0);
    }
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;
    ~ThreadPool() {
      if (Kokkos::Impl::t_openmp_instance == pool) Kokkos::Impl::t_openmp_instance = nullptr;
      Kokkos::OpenMP::partition_master(OpenMPPoolRequest{&pool, 0}, 0, 0);
    }
  };
  thread_local ThreadPool mine;
  Kokkos::Impl::t_openmp_instance = mine.pool;
}

}  // namespace kdnn::impl

#else

namespace kdnn::impl {

inline void ensure_openmp_pool_on_this_thread() {}

}  // namespace kdnn::impl

#endif
