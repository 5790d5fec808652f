// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::cp::HaloExchange (an exchange of a HaloPlan in flight) and the
// definitions of HaloPlan::gather and HaloPlan::scatter_add: their
// collective checks, then impl::start_gather / impl::start_scatter_add,
// which a kdnn::cp operator that has checked its arguments calls directly.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/cp/halo_plan.hpp"
#include "kdnn/cp/impl/halo_messages.hpp"
#include "kdnn/cp/impl/timed_wait.hpp"

namespace kdnn::cp {

/// A halo exchange in flight (HaloPlan::gather or scatter_add): its
/// messages are posted; finish() waits for them and writes what arrived.
/// Destroyed unfinished, it waits for its messages (their buffers are its
/// own) and writes nothing.
template <class T, class ExecSpace>
struct HaloExchange {
  ExecSpace space;
  impl::HaloMessages<T, ExecSpace> messages;
  HaloStats stats;
  double posted = 0;  ///< MPI_Wtime() when the messages were posted
  int B = 0, C = 0;
  Tensor3<T, ExecSpace> halo;         ///< forward: where the pieces go
  Tensor3<const T, ExecSpace> dhalo;  ///< backward: the pieces' gradients
  /// Backward: where they are added (rows of the pieces' from_row).
  StridedTensor3<T, ExecSpace> dx, dinitial_state;

  HaloExchange(const ExecSpace& s, impl::HaloMessages<T, ExecSpace> m)
      : space(s), messages(std::move(m)) {
    messages.count_into(stats);
  }
  HaloExchange(HaloExchange&&) noexcept = default;
  HaloExchange(const HaloExchange&) = delete;
  HaloExchange& operator=(const HaloExchange&) = delete;
  HaloExchange& operator=(HaloExchange&&) = delete;
  ~HaloExchange() {
    if (!messages.requests.empty()) {
      MPI_Waitall(int(messages.requests.size()), messages.requests.data(), MPI_STATUSES_IGNORE);
    }
  }

  /// Waits for the messages (with the space's lock released) and writes what
  /// arrived: the forward's pieces into the halo; the backward's, then this
  /// rank's own pieces, added into dx and dinitial_state. Returns what moved
  /// and the time it overlapped.
  HaloStats finish() {
    kdnn::impl::SpaceLock hold(space);
    return finish(hold);
  }
  /// As finish(), for a kdnn operator that holds the space's lock (`held`).
  HaloStats finish(kdnn::impl::SpaceLock& held) {
    impl::timed_wait(space, messages.requests, posted, held, stats);
    messages.requests.clear();
    messages.recv_buf.from_mpi(space);
    const auto& buf = messages.recv_buf.device;
    for (std::size_t i = 0; i < messages.recvs.size(); ++i) {
      const HaloPiece& p = messages.recvs[i];
      const std::size_t at = messages.recv_at[i];
      const int n = int(p.steps());
      if (messages.forward) {
        impl::unpack(space, buf, at, B, n, C, halo, int(p.to_row), false);
      } else {
        impl::unpack(space, buf, at, B, n, C, p.initial() ? dinitial_state : dx, int(p.from_row),
                     true);
      }
    }
    if (!messages.forward) {
      for (const HaloPiece& p : messages.selfs) {
        impl::copy_rows(space, B, int(p.steps()), C, p.initial() ? dinitial_state : dx,
                        int(p.from_row), dhalo, int(p.to_row), true);
      }
    }
    return stats;
  }
};

namespace impl {

constexpr int kForwardTag = 0x6b64;  // "kd"
constexpr int kBackwardTag = 0x6b65;

/// HaloPlan::gather without its checks, for a caller that holds the space's
/// lock and has agreed on the arguments with every rank: `with_initial`
/// (rank 0 gives an initial state) is the same on every rank.
template <class T, class ExecSpace>
HaloExchange<T, ExecSpace> start_gather(const HaloPlan& plan, const ExecSpace& space,
                                        const StridedTensor3<const T, ExecSpace>& x,
                                        const StridedTensor3<const T, ExecSpace>& initial_state,
                                        const Tensor3<T, ExecSpace>& halo, bool with_initial) {
  const int B = int(halo.extent(0)), C = int(halo.extent(2));
  HaloExchange<T, ExecSpace> ex(
      space,
      HaloMessages<T, ExecSpace>(plan.pieces(with_initial), plan.rank(), true, std::size_t(B) * C));
  ex.B = B, ex.C = C, ex.halo = halo;
  auto& m = ex.messages;
  m.post_receives(plan.comm(), kForwardTag);
  for (std::size_t i = 0; i < m.sends.size(); ++i) {
    const bool initial = m.sends[i].initial();
    pack(
        space, m.send_buf.device, m.send_at[i], B, int(m.sends[i].steps()), C,
        int(m.sends[i].from_row), KOKKOS_LAMBDA(int b, int s, int c) {
          return initial ? initial_state(b, s, c) : x(b, s, c);
        });
  }
  m.post_sends(space, plan.comm(), kForwardTag);
  ex.posted = MPI_Wtime();
  // The halo's own part while the pieces travel: zeros (before the sequence
  // without an initial state; the pieces overwrite the rest), then the
  // pieces this rank holds itself.
  Kokkos::deep_copy(space, halo, T{});
  for (const HaloPiece& p : m.selfs) {
    copy_rows(space, B, int(p.steps()), C, halo, int(p.to_row), p.initial() ? initial_state : x,
              int(p.from_row), false);
  }
  return ex;
}

/// HaloPlan::scatter_add without its checks, as start_gather.
template <class T, class ExecSpace>
HaloExchange<T, ExecSpace> start_scatter_add(const HaloPlan& plan, const ExecSpace& space,
                                             const Tensor3<const T, ExecSpace>& dhalo,
                                             const StridedTensor3<T, ExecSpace>& dx,
                                             const StridedTensor3<T, ExecSpace>& dinitial_state,
                                             bool with_initial) {
  const int B = int(dhalo.extent(0)), C = int(dhalo.extent(2));
  HaloExchange<T, ExecSpace> ex(
      space, HaloMessages<T, ExecSpace>(plan.pieces(with_initial), plan.rank(), false,
                                        std::size_t(B) * C));
  ex.B = B, ex.C = C, ex.dhalo = dhalo, ex.dx = dx, ex.dinitial_state = dinitial_state;
  auto& m = ex.messages;
  m.post_receives(plan.comm(), kBackwardTag);
  for (std::size_t i = 0; i < m.sends.size(); ++i) {
    pack(
        space, m.send_buf.device, m.send_at[i], B, int(m.sends[i].steps()), C,
        int(m.sends[i].to_row), KOKKOS_LAMBDA(int b, int j, int c) { return dhalo(b, j, c); });
  }
  m.post_sends(space, plan.comm(), kBackwardTag);
  ex.posted = MPI_Wtime();
  return ex;
}

/// The checks of gather and scatter_add: `state` [B, plan.halo_rows(), C]
/// and `steps` [B, plan.steps(), C] share B and C, the optional `initial` is
/// [B, K−1, C],
/// the output shares no memory with the inputs. Returns whether rank 0 gives
/// `initial` (agreed: the same on every rank).
template <class T, class State, class Steps, class Initial>
bool agree_on_halo(const HaloPlan& plan, const char* op, const char* state_name, const State& state,
                   const char* steps_name, const Steps& steps, const char* initial_name,
                   const Initial& initial, std::initializer_list<validate::MemoryRange> outputs,
                   std::initializer_list<validate::MemoryRange> inputs) {
  const auto rows = std::size_t(plan.halo_rows());
  const std::string B_is = std::string("B, ") + state_name + "'s extent(0)";
  const std::string C_is = std::string("C, ") + state_name + "'s extent(2)";
  const auto all = agree_on_signature(
      plan.comm(), op,
      [&] {
        validate::extent(op, state_name, state, 1, rows, "(K-1)·segments, the plan's halo rows");
        validate::extent(op, steps_name, steps, 0, state.extent(0), B_is.c_str());
        validate::extent(op, steps_name, steps, 1, std::size_t(plan.steps()),
                         "the plan's steps on this rank");
        validate::extent(op, steps_name, steps, 2, state.extent(2), C_is.c_str());
        if (validate::given(initial)) {
          validate::extent(op, initial_name, initial, 0, state.extent(0), B_is.c_str());
          validate::extent(op, initial_name, initial, 1, std::size_t(plan.width() - 1),
                           "K-1, the plan's width - 1");
          validate::extent(op, initial_name, initial, 2, state.extent(2), C_is.c_str());
        }
        validate::disjoint(op, outputs, inputs);
      },
      {{"dtype", std::int64_t(sizeof(T)), Field::same_dtype},
       {"B", std::int64_t(state.extent(0))},
       {"C", std::int64_t(state.extent(2))},
       {initial_name, validate::given(initial), Field::rank0_only}});
  return all[0].back() != 0;
}

}  // namespace impl

template <class T, class ExecSpace>
HaloExchange<T, ExecSpace> HaloPlan::gather(const ExecSpace& space,
                                            const StridedTensor3<const T, ExecSpace>& x,
                                            const StridedTensor3<const T, ExecSpace>& initial_state,
                                            const Tensor3<T, ExecSpace>& halo) const {
  const bool with_initial = impl::agree_on_halo<T>(
      *this, "cp::HaloPlan::gather", "halo", halo, "x", x, "initial_state", initial_state,
      {validate::memory_of("halo", halo)},
      {validate::memory_of("x", x), validate::memory_of("initial_state", initial_state)});
  kdnn::impl::SpaceLock hold(space);
  return impl::start_gather(*this, space, x, initial_state, halo, with_initial);
}

template <class T, class ExecSpace>
HaloExchange<T, ExecSpace> HaloPlan::scatter_add(
    const ExecSpace& space, const Tensor3<const T, ExecSpace>& dhalo,
    const StridedTensor3<T, ExecSpace>& dx,
    const StridedTensor3<T, ExecSpace>& dinitial_state) const {
  const bool with_initial = impl::agree_on_halo<T>(
      *this, "cp::HaloPlan::scatter_add", "dhalo", dhalo, "dx", dx, "dinitial_state",
      dinitial_state,
      {validate::memory_of("dx", dx), validate::memory_of("dinitial_state", dinitial_state)},
      {validate::memory_of("dhalo", dhalo)});
  kdnn::impl::SpaceLock hold(space);
  return impl::start_scatter_add(*this, space, dhalo, dx, dinitial_state, with_initial);
}

}  // namespace kdnn::cp
