// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The messages of one halo exchange on one rank (cp/halo_plan.hpp): the
// pieces it sends and receives, packed one after another ([B, steps, C]
// each) in one buffer per direction, their requests, the pieces it sends
// itself, and the kernels that copy a piece between a buffer, or another
// tensor, and a step-indexed [B, ·, C] tensor.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <vector>

#include "kdnn/core/float16.hpp"
#include "kdnn/cp/impl/mpi_memory.hpp"
#include "kdnn/cp/sequence_split.hpp"

namespace kdnn::cp::impl {

template <class T, class ExecSpace>
struct HaloMessages {
  std::vector<HaloPiece> sends, recvs;
  std::vector<HaloPiece> selfs;               ///< from this rank to itself: copied, not sent
  std::vector<std::size_t> send_at, recv_at;  ///< element offsets in the buffers
  MpiBuffer<T, ExecSpace> send_buf, recv_buf;
  std::vector<MPI_Request> requests;
  std::size_t BC;  ///< elements per step: B·C
  bool forward;    ///< pieces go from their `from` to their `to` (else back)

  std::size_t count(const HaloPiece& p) const { return BC * std::size_t(p.steps()); }
  int sender(const HaloPiece& p) const { return forward ? p.from : p.to; }
  int receiver(const HaloPiece& p) const { return forward ? p.to : p.from; }

  HaloMessages(const std::vector<HaloPiece>& pieces, int me, bool forward_, std::size_t BC_)
      : send_buf("kdnn::cp::halo_send", total(pieces, me, forward_, true, BC_)),
        recv_buf("kdnn::cp::halo_recv", total(pieces, me, forward_, false, BC_)),
        BC(BC_),
        forward(forward_) {
    std::size_t s = 0, r = 0;
    for (const HaloPiece& p : pieces) {
      if (count(p) == 0) continue;
      if (p.from == me && p.to == me) {
        selfs.push_back(p);
      } else if (sender(p) == me) {
        sends.push_back(p);
        send_at.push_back(s);
        s += count(p);
      } else if (receiver(p) == me) {
        recvs.push_back(p);
        recv_at.push_back(r);
        r += count(p);
      }
    }
  }
  static std::size_t total(const std::vector<HaloPiece>& pieces, int me, bool forward, bool send,
                           std::size_t BC) {
    std::size_t n = 0;
    for (const HaloPiece& p : pieces) {
      const int from = forward ? p.from : p.to, to = forward ? p.to : p.from;
      if (from != to && (send ? from : to) == me) n += BC * std::size_t(p.steps());
    }
    return n;
  }

  void post_receives(MPI_Comm comm, int tag) {
    for (std::size_t i = 0; i < recvs.size(); ++i) {
      requests.emplace_back();
      MPI_Irecv(recv_buf.mpi_data() + recv_at[i], int(count(recvs[i])), mpi_type<T>(),
                sender(recvs[i]), tag, comm, &requests.back());
    }
  }
  /// After the pack kernels: hands the send buffer to MPI.
  void post_sends(const ExecSpace& space, MPI_Comm comm, int tag) {
    send_buf.to_mpi(space);
    for (std::size_t i = 0; i < sends.size(); ++i) {
      requests.emplace_back();
      MPI_Isend(send_buf.mpi_data() + send_at[i], int(count(sends[i])), mpi_type<T>(),
                receiver(sends[i]), tag, comm, &requests.back());
    }
  }
  /// What the exchange moves, in HaloStats' fields.
  template <class Stats>
  void count_into(Stats& stats) const {
    for (const HaloPiece& p : sends) stats.bytes_sent += std::int64_t(count(p) * sizeof(T));
    for (const HaloPiece& p : recvs) stats.bytes_received += std::int64_t(count(p) * sizeof(T));
    stats.messages_sent = int(sends.size());
    stats.messages_received = int(recvs.size());
  }
};

/// buf[at + (b·n + j)·C + c] = get(b, first + j, c): a piece into a buffer.
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

/// dst(b, first + j, c) = (or +=, with `add`) buf[at + (b·n + j)·C + c]
/// (a sum in the compute type, rounded once to T).
template <class ExecSpace, class T, class View>
void unpack(const ExecSpace& space, const Kokkos::View<T*, typename ExecSpace::memory_space>& buf,
            std::size_t at, int B, int n, int C, const View& dst, int first, bool add) {
  Kokkos::parallel_for(
      "kdnn::cp::unpack_halo",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0}, {B, n, C}),
      KOKKOS_LAMBDA(int b, int j, int c) {
        const T v = buf(at + (std::size_t(b) * n + j) * C + c);
        if (add) {
          add_to(dst(b, first + j, c), to_compute(v));
        } else {
          dst(b, first + j, c) = v;
        }
      });
}

/// dst(b, to + j, c) = (or +=, with `add`) src(b, from + j, c) for j < n:
/// a piece that a rank sends itself.
template <class ExecSpace, class Dst, class Src>
void copy_rows(const ExecSpace& space, int B, int n, int C, const Dst& dst, int to, const Src& src,
               int from, bool add) {
  Kokkos::parallel_for(
      "kdnn::cp::copy_halo",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0}, {B, n, C}),
      KOKKOS_LAMBDA(int b, int j, int c) {
        if (add) {
          add_to(dst(b, to + j, c), to_compute(src(b, from + j, c)));
        } else {
          dst(b, to + j, c) = src(b, from + j, c);
        }
      });
}

}  // namespace kdnn::cp::impl
