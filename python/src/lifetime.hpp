// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Kokkos' lifetime in the extension module against the calls in flight.
//
// The module starts Kokkos when it is imported (unless the process already
// did) and ends it at interpreter exit (kdnn/__init__.py registers finalize
// with atexit). Python does not wait for daemon threads: one may be inside a
// kdnn call, with the GIL released, when finalize runs. So every call holds
// a Lifetime::Call for its whole run, without the GIL, and finalize waits
// until none is held. A thread whose call ends, or that starts one, after
// finalize began is parked there for the rest of the process: returning to
// an exiting interpreter, CPython (before 3.14) ends the thread with a
// forced unwind, which aborts the process through C++ frames. A call after
// finalize from the thread that ran it (an atexit handler) is a kdnn::Error.
#include <Kokkos_Core.hpp>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "kdnn/core/compat.hpp"
#include "kdnn/core/error.hpp"

namespace kdnn_python {

class Lifetime {
 public:
  /// The one lifetime of this process's module (never destroyed: a daemon
  /// thread may still reach it while the process ends).
  static Lifetime& instance() {
    static auto* const lifetime = new Lifetime();
    return *lifetime;
  }

  /// Starts Kokkos unless the process has (Kokkos' environment variables,
  /// KOKKOS_NUM_THREADS and the like, apply).
  void start() {
    const std::lock_guard<std::mutex> guard(lock_);
    if (!Kokkos::is_initialized()) {
      kdnn::compat::initialize_without_warnings("kdnn", {});
      started_here_ = true;
    }
  }

  /// Waits for the calls in flight, refuses later ones, and finalizes Kokkos
  /// if start() initialised it (module.cpp releases the GIL meanwhile, so
  /// that the other threads run on).
  void finish() {
    std::unique_lock<std::mutex> guard(lock_);
    finished_ = true;
    finisher_ = std::this_thread::get_id();
    idle_.wait(guard, [&] { return calls_ == 0; });
    if (started_here_ && Kokkos::is_initialized()) Kokkos::finalize();
    started_here_ = false;
  }

  /// Keeps Kokkos up while it lives; make it without the GIL. `what` names
  /// the call in the error a call after finish() gets on finish()'s thread.
  class Call {
   public:
    explicit Call(const char* what) : lifetime_(instance()) {
      std::unique_lock<std::mutex> guard(lifetime_.lock_);
      if (lifetime_.finished_) {
        if (std::this_thread::get_id() != lifetime_.finisher_) lifetime_.park(guard);
        kdnn::fail(what,
                   ": kdnn has been finalized (the interpreter is exiting); no kdnn call "
                   "runs after that");
      }
      ++lifetime_.calls_;
    }
    ~Call() {
      std::unique_lock<std::mutex> guard(lifetime_.lock_);
      if (--lifetime_.calls_ == 0) lifetime_.idle_.notify_all();
      if (lifetime_.finished_) lifetime_.park(guard);
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    Lifetime& lifetime_;
  };

 private:
  Lifetime() = default;
  /// Blocks the calling thread (holding no lock, not the GIL) until the
  /// process ends.
  [[noreturn]] void park(std::unique_lock<std::mutex>& guard) {
    for (;;) never_.wait(guard);
  }

  std::mutex lock_;
  std::condition_variable idle_, never_;
  int calls_ = 0;
  bool finished_ = false;
  std::thread::id finisher_;
  bool started_here_ = false;
};

}  // namespace kdnn_python
