// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Definitions of kdnn::cp::impl::{conv_dt_forward, conv_dt_backward}: the
// collective checks, the halo plan (cp/sequence_split.hpp), packing the
// pieces into one buffer per direction, the point-to-point exchange and the
// single-rank kernels (ssm/impl) launched on step ranges around it.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "kdnn/core/impl/fingerprint.hpp"
#include "kdnn/core/impl/host_filled.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/cp/agree.hpp"
#include "kdnn/cp/impl/mpi_memory.hpp"
#include "kdnn/cp/impl/sequence_edges.hpp"
#include "kdnn/cp/impl/timed_wait.hpp"
#include "kdnn/cp/sequence_split.hpp"
#include "kdnn/ssm/impl/causal_conv1d_impl.hpp"
#include "kdnn/ssm/impl/dt_softplus_impl.hpp"

namespace kdnn::cp {
template <class T, class ExecSpace>
struct ConvDtForward;
template <class T, class ExecSpace>
struct ConvDtBackward;
struct ConvDtOptions;
struct HaloStats;
}  // namespace kdnn::cp

namespace kdnn::cp::impl {

/// The fields every rank of a conv + dt call must agree on, its length last:
/// the dtype, the shapes and options, and the parameters' values (weight,
/// bias and dt_bias by fingerprint: the same parameters on every rank).
template <class T, class ExecSpace, class Conv>
std::vector<Field> conv_dt_fields(const ExecSpace& space, const Conv& conv,
                                  const Vector<const T, ExecSpace>& dt_bias,
                                  const ConvDtOptions& opts) {
  using kdnn::impl::fingerprint;
  const auto values = [&](const char* name, const auto& v) {
    return Field{name, std::int64_t(fingerprint(space, v)), Field::same_values};
  };
  return {{"x", std::int64_t(sizeof(T)), Field::same_dtype},
          {"B", std::int64_t(conv.x.extent(0))},
          {"C", std::int64_t(conv.x.extent(2))},
          {"K", std::int64_t(conv.w.extent(1))},
          {"H", std::int64_t(dt_bias.extent(0))},
          {"bias given", validate::given(conv.bias)},
          {"opts.conv.silu", opts.conv.silu},
          Field::real("opts.dt.dt_min", opts.dt.dt_min),
          Field::real("opts.dt.dt_max", opts.dt.dt_max),
          {"seq_idx given", validate::given(conv.seq_idx)},
          values("weight", conv.w),
          values("bias", conv.bias),
          values("dt_bias", dt_bias),
          {"L", std::int64_t(conv.x.extent(1)), Field::any}};
}

/// The sequence ids of this rank's halo, [B, K−1] (steps begin − K + 1 …
/// begin − 1), from the other ranks' edges; empty without seq_idx.
/// Collective when seq_idx is given (on every rank, then).
template <class ExecSpace>
Matrix<const int, ExecSpace> halo_sequence_ids(const ExecSpace& space, MPI_Comm comm,
                                               kdnn::impl::SpaceLock& lock,
                                               const Matrix<const int, ExecSpace>& seq_idx,
                                               const std::vector<std::int64_t>& offsets, int rank,
                                               int K) {
  if (!validate::given(seq_idx) || K == 1) return {};
  const SequenceEdges edges(space, comm, lock, seq_idx, offsets, K - 1);
  const int B = int(seq_idx.extent(0));
  return kdnn::impl::filled_on_host(space,
                                    Matrix<int, ExecSpace>("kdnn::cp::halo_sequence_ids", B, K - 1),
                                    [&](const auto& host) {
                                      for (int b = 0; b < B; ++b) {
                                        for (int j = 0; j < K - 1; ++j)
                                          host(b, j) = edges.id(b, offsets[rank] - (K - 1) + j);
                                      }
                                    });
}

template <class Dt>
void check_dt_steps(const char* op, const char* name, const Dt& dt, std::size_t B, std::size_t L) {
  validate::extent(op, name, dt, 0, B, "B, x's extent(0)");
  validate::extent(op, name, dt, 1, L, "L, x's extent(1)");
}

/// The pieces this rank sends and receives, packed one after another
/// ([B, steps, C] each) in one buffer per direction, and their requests.
template <class T, class ExecSpace>
struct Exchange {
  std::vector<HaloPiece> sends, recvs;
  std::vector<std::size_t> send_at, recv_at;  ///< element offsets in the buffers
  MpiBuffer<T, ExecSpace> send_buf, recv_buf;
  std::vector<MPI_Request> requests;

  static std::size_t count(const HaloPiece& p, std::size_t BC) { return BC * p.steps(); }

  Exchange(const std::vector<HaloPiece>& pieces, int me, bool forward, std::size_t BC)
      : send_buf("kdnn::cp::halo_send", total(pieces, me, forward, true, BC)),
        recv_buf("kdnn::cp::halo_recv", total(pieces, me, forward, false, BC)) {
    std::size_t s = 0, r = 0;
    for (const HaloPiece& p : pieces) {
      if (count(p, BC) == 0) continue;
      const int sender = forward ? p.from : p.to, receiver = forward ? p.to : p.from;
      if (sender == me) {
        sends.push_back(p);
        send_at.push_back(s);
        s += count(p, BC);
      } else if (receiver == me) {
        recvs.push_back(p);
        recv_at.push_back(r);
        r += count(p, BC);
      }
    }
  }
  static std::size_t total(const std::vector<HaloPiece>& pieces, int me, bool forward, bool send,
                           std::size_t BC) {
    std::size_t n = 0;
    for (const HaloPiece& p : pieces) {
      const int sender = forward ? p.from : p.to, receiver = forward ? p.to : p.from;
      if ((send ? sender : receiver) == me) n += count(p, BC);
    }
    return n;
  }

  void post_receives(MPI_Comm comm, bool forward, std::size_t BC, int tag) {
    for (std::size_t i = 0; i < recvs.size(); ++i) {
      const int peer = forward ? recvs[i].from : recvs[i].to;
      requests.emplace_back();
      MPI_Irecv(recv_buf.mpi_data() + recv_at[i], int(count(recvs[i], BC)), mpi_type<T>(), peer,
                tag, comm, &requests.back());
    }
  }
  /// After the pack kernels: hands the send buffer to MPI.
  void post_sends(const ExecSpace& space, MPI_Comm comm, bool forward, std::size_t BC, int tag) {
    send_buf.to_mpi(space);
    for (std::size_t i = 0; i < sends.size(); ++i) {
      const int peer = forward ? sends[i].to : sends[i].from;
      requests.emplace_back();
      MPI_Isend(send_buf.mpi_data() + send_at[i], int(count(sends[i], BC)), mpi_type<T>(), peer,
                tag, comm, &requests.back());
    }
  }
  void wait(const ExecSpace& space, HaloStats& stats, double posted, kdnn::impl::SpaceLock& lock) {
    timed_wait(space, requests, posted, lock, stats);
    recv_buf.from_mpi(space);
  }
  void count_into(HaloStats& stats, std::size_t BC) const {
    for (const HaloPiece& p : sends) stats.bytes_sent += std::int64_t(count(p, BC) * sizeof(T));
    for (const HaloPiece& p : recvs) stats.bytes_received += std::int64_t(count(p, BC) * sizeof(T));
    stats.messages_sent = int(sends.size());
    stats.messages_received = int(recvs.size());
  }
};

/// buf[at + (b·n + j)·C + c] ⇄ a step-indexed [B, ·, C] tensor at step
/// first + j: get(b, first + j, c) → buf, or buf added into it.
template <class ExecSpace, class T, class Get>
void pack(const ExecSpace& space, const Kokkos::View<T*, typename ExecSpace::memory_space>& buf,
          std::size_t at, int B, int n, int C, int first, const Get& get) {
  Kokkos::parallel_for(
      "kdnn::cp::pack_halo",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0}, {B, n, C}),
      KOKKOS_LAMBDA(int b, int j, int c) {
        buf(at + (std::size_t(b) * n + j) * C + c) = get(b, first + j, c);
      });
}

template <class ExecSpace, class T, class View>
void unpack(const ExecSpace& space, const Kokkos::View<T*, typename ExecSpace::memory_space>& buf,
            std::size_t at, int B, int n, int C, const View& dst, int first, bool add) {
  Kokkos::parallel_for(
      "kdnn::cp::unpack_halo",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0}, {B, n, C}),
      KOKKOS_LAMBDA(int b, int j, int c) {
        const T v = buf(at + (std::size_t(b) * n + j) * C + c);
        if (add) {
          dst(b, first + j, c) += v;
        } else {
          dst(b, first + j, c) = v;
        }
      });
}

constexpr int kForwardTag = 0x6b64;  // "kd"
constexpr int kBackwardTag = 0x6b65;

template <class ExecSpace, class T>
HaloStats conv_dt_forward(const ExecSpace& space, MPI_Comm comm,
                          const ConvDtForward<T, ExecSpace>& a, const ConvDtOptions& opts) {
  const char* op = "cp::conv_dt_forward";
  check_communicator(op, comm);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  agree(comm, [&] {
    ssm::impl::check_conv_forward(op, a.conv);
    ssm::impl::check_state(op, "halo", a.halo, a.conv.x, a.conv.w);
    validate::disjoint(op, {validate::memory_of("halo", a.halo)},
                       {validate::memory_of("x", a.conv.x), validate::memory_of("y", a.conv.y),
                        validate::memory_of("final_state", a.conv.final_state),
                        validate::memory_of("initial_state", a.conv.initial_state)});
    ssm::impl::check_dt_forward<ExecSpace, T>(op, a.dt, a.dt_bias, a.dt_out, opts.dt);
    check_dt_steps(op, "dt", a.dt, a.conv.x.extent(0), a.conv.x.extent(1));
    ssm::impl::check_conv_finite(op, space, a.conv, opts.conv);
    ssm::impl::check_dt_finite<ExecSpace, T>(op, space, a.dt, a.dt_bias, {}, opts.dt);
    SequenceEdges::check_size(op, a.conv.seq_idx, int(a.conv.w.extent(1)) - 1);
  });
  auto fields = conv_dt_fields<T>(space, a.conv, a.dt_bias, opts);
  const std::size_t length_field = fields.size() - 1;
  const bool has_init = validate::given(a.conv.initial_state);
  fields.push_back({"initial_state", has_init, Field::rank0_only});
  const auto all = gather_signature(comm, op, fields);
  kdnn::impl::SpaceLock exclusive(space);  // after the collective checks
  const bool rank0_init = all[0].back() != 0;

  const int B = int(a.conv.x.extent(0)), L = int(a.conv.x.extent(1));
  const int C = int(a.conv.x.extent(2)), K = int(a.conv.w.extent(1));
  const std::size_t BC = std::size_t(B) * C;
  const auto offsets = offsets_of(all, length_field);
  const std::int64_t begin = offsets[rank];
  const auto halo_ids = halo_sequence_ids(space, comm, exclusive, a.conv.seq_idx, offsets, rank, K);
  Exchange<T, ExecSpace> ex(halo_pieces(offsets, K - 1, rank0_init), rank, true, BC);
  HaloStats stats;
  ex.count_into(stats, BC);

  ex.post_receives(comm, true, BC, kForwardTag);
  const auto x = a.conv.x;
  const auto init = a.conv.initial_state;
  for (std::size_t i = 0; i < ex.sends.size(); ++i) {  // steps p → local p − begin
    pack(
        space, ex.send_buf.device, ex.send_at[i], B, int(ex.sends[i].steps()), C,
        int(ex.sends[i].begin - begin),
        KOKKOS_LAMBDA(int b, int s, int c) { return s >= 0 ? x(b, s, c) : init(b, s + K - 1, c); });
  }
  ex.post_sends(space, comm, true, BC, kForwardTag);
  const double posted = MPI_Wtime();

  // While the halo is in flight: the halo's local part, dt and the steps
  // that do not read it.
  if (rank == 0 && has_init) {
    Kokkos::deep_copy(space, a.halo, a.conv.initial_state);
  } else {
    Kokkos::deep_copy(space, a.halo, T(0));
  }
  ssm::impl::dt_softplus_forward<ExecSpace, T>(space, a.dt, a.dt_bias, a.dt_out, opts.dt);
  ssm::ConvForward<T, ExecSpace> local = a.conv;
  local.initial_state = a.halo;
  const int interior = K - 1 < L ? K - 1 : L;
  ssm::impl::conv_forward_steps(space, local, opts.conv, interior, L, halo_ids);
  ex.wait(space, stats, posted, exclusive);

  for (std::size_t i = 0; i < ex.recvs.size(); ++i) {  // steps p → halo row p − (begin − K + 1)
    unpack(space, ex.recv_buf.device, ex.recv_at[i], B, int(ex.recvs[i].steps()), C, a.halo,
           int(ex.recvs[i].begin - (begin - (K - 1))), false);
  }
  ssm::impl::conv_forward_steps(space, local, opts.conv, 0, interior, halo_ids);
  if (validate::given(a.conv.final_state)) {
    ssm::impl::conv_final_state(space, a.conv.x, StridedTensor3<const T, ExecSpace>(a.halo),
                                a.conv.final_state,
                                ssm::impl::ConvSequenceIds<ExecSpace>(a.conv.seq_idx, halo_ids));
  }
  return stats;
}

template <class ExecSpace, class T>
HaloStats conv_dt_backward(const ExecSpace& space, MPI_Comm comm,
                           const ConvDtBackward<T, ExecSpace>& a, const ConvDtOptions& opts) {
  const char* op = "cp::conv_dt_backward";
  check_communicator(op, comm);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  agree(comm, [&] {
    ssm::impl::check_conv_backward(op, a.conv);
    if (a.conv.w.extent(1) > 1 && !validate::given(a.conv.initial_state)) {
      fail(op, ": conv.initial_state not given, expected the forward's halo [B, K-1, C] (K=",
           a.conv.w.extent(1), ")");
    }
    ssm::impl::check_dt_backward<ExecSpace, T>(op, a.dt, a.dt_bias, a.ddt_out, a.ddt, a.ddt_bias,
                                               opts.dt);
    check_dt_steps(op, "dt", a.dt, a.conv.x.extent(0), a.conv.x.extent(1));
    ssm::impl::check_conv_finite(op, space, a.conv, opts.conv);
    ssm::impl::check_dt_finite<ExecSpace, T>(op, space, a.dt, a.dt_bias, a.ddt_out, opts.dt);
    SequenceEdges::check_size(op, a.conv.seq_idx, int(a.conv.w.extent(1)) - 1);
  });
  auto fields = conv_dt_fields<T>(space, a.conv, a.dt_bias, opts);
  const std::size_t length_field = fields.size() - 1;
  const bool has_dinit = validate::given(a.conv.dinitial_state);
  fields.push_back({"dbias given", validate::given(a.conv.dbias)});
  fields.push_back({"dinitial_state", has_dinit, Field::rank0_only});
  const auto all = gather_signature(comm, op, fields);
  kdnn::impl::SpaceLock exclusive(space);  // after the collective checks
  const bool rank0_dinit = all[0].back() != 0;

  const int B = int(a.conv.x.extent(0)), L = int(a.conv.x.extent(1));
  const int C = int(a.conv.x.extent(2)), K = int(a.conv.w.extent(1));
  const std::size_t BC = std::size_t(B) * C;
  const auto offsets = offsets_of(all, length_field);
  const std::int64_t begin = offsets[rank];
  const auto halo_ids = halo_sequence_ids(space, comm, exclusive, a.conv.seq_idx, offsets, rank, K);
  Exchange<T, ExecSpace> ex(halo_pieces(offsets, K - 1, rank0_dinit), rank, false, BC);
  HaloStats stats;
  ex.count_into(stats, BC);

  // The halo's gradient first: it is what the other ranks wait for.
  Tensor3<T, ExecSpace> dhalo("kdnn::cp::dhalo", B, K - 1, C);
  ssm::ConvBackward<T, ExecSpace> local = a.conv;
  local.dinitial_state = dhalo;
  ex.post_receives(comm, false, BC, kBackwardTag);
  ssm::impl::conv_backward_steps(space, local, opts.conv, -(K - 1), 0, false, halo_ids);
  for (std::size_t i = 0; i < ex.sends.size(); ++i) {  // steps p → dhalo row p − (begin − K + 1)
    pack(
        space, ex.send_buf.device, ex.send_at[i], B, int(ex.sends[i].steps()), C,
        int(ex.sends[i].begin - (begin - (K - 1))),
        KOKKOS_LAMBDA(int b, int j, int c) { return dhalo(b, j, c); });
  }
  ex.post_sends(space, comm, false, BC, kBackwardTag);
  const double posted = MPI_Wtime();

  ssm::impl::conv_backward_steps(space, local, opts.conv, 0, L, true, halo_ids);
  ssm::impl::dt_softplus_backward<ExecSpace, T>(space, a.dt, a.dt_bias, a.ddt_out, a.ddt,
                                                a.ddt_bias, opts.dt);
  if (has_dinit) Kokkos::deep_copy(space, a.conv.dinitial_state, dhalo);
  ex.wait(space, stats, posted, exclusive);

  // Each received piece adds into the steps it came from, in rank order.
  for (std::size_t i = 0; i < ex.recvs.size(); ++i) {
    const HaloPiece& p = ex.recvs[i];
    const int n = int(p.steps());
    if (p.begin >= begin) {
      unpack(space, ex.recv_buf.device, ex.recv_at[i], B, n, C, a.conv.dx, int(p.begin - begin),
             true);
    } else {  // rank 0's initial state: the piece lies wholly before step 0
      unpack(space, ex.recv_buf.device, ex.recv_at[i], B, n, C, a.conv.dinitial_state,
             int(p.begin + K - 1), true);
    }
  }
  return stats;
}

}  // namespace kdnn::cp::impl
