// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The keys a query sees under an AttentionMask (softmax.hpp): every limit is
// an interval, so what is left is one interval [first, last) of key indices,
// empty for a padded query or a fully masked row. Checked on the host once
// (check_mask), evaluated per row in kernels.
#include <Kokkos_Core.hpp>

#include "kdnn/attention/impl/alibi.hpp"
#include "kdnn/attention/softmax.hpp"
#include "kdnn/core/error.hpp"
#include "kdnn/core/impl/profiling_region.hpp"

namespace kdnn::attention::impl {

template <class ExecSpace>
struct VisibleKeys {
  AttentionMask<ExecSpace> mask;
  int queries = 0, keys = 0;  ///< S, Sk
  bool lo = false, hi = false, seq_q = false, seq_k = false, band = false;

  VisibleKeys() = default;
  /// A band's bounds are taken at most the positions' S + Sk (no fewer
  /// keys: no diagonal is further than that from a key), so that range()
  /// computes in int (check_mask refuses a band with S + Sk past 2^29).
  VisibleKeys(const AttentionMask<ExecSpace>& m, int query_count, int key_count)
      : mask(m),
        queries(query_count),
        keys(key_count),
        lo(m.lo_win.extent(0) > 0),
        hi(m.hi_win.extent(0) > 0),
        seq_q(m.seq_q.extent(0) > 0),
        seq_k(m.seq_k.extent(0) > 0),
        band(m.band_left >= 0 || m.band_right >= 0) {
    const long long most = (long long)m.query_positions(query_count) + m.key_positions(key_count);
    if (mask.band_left > most) mask.band_left = int(most);
    if (mask.band_right > most) mask.band_right = int(most);
  }

  /// Keys [first, last) of query i in batch entry b (first >= last: none).
  /// In positions (AttentionMask::Positions): query i is position p = i +
  /// query_begin, and key j position j + key_begin.
  KOKKOS_INLINE_FUNCTION void range(int b, int i, int& first, int& last) const {
    // The entry's lengths in positions (checked to fit them): a padded query
    // sees none.
    const int lq = seq_q ? mask.seq_q(b) : mask.query_positions(queries);
    const int lk = seq_k ? mask.seq_k(b) : mask.key_positions(keys);
    const int p = i + mask.positions.query_begin, k0 = mask.positions.key_begin;
    first = 0;
    last = p < lq ? (lk - k0 < keys ? lk - k0 : keys) : 0;
    if (lo && mask.lo_win(i) > first) first = mask.lo_win(i);
    if (hi && mask.hi_win(i) < last) last = mask.hi_win(i);
    if (mask.causal && p - k0 + 1 < last) last = p - k0 + 1;
    if (band) {
      // The diagonal key d = p + Sk_b − S_b − k0 in (−S − Sk, S + Sk) of the
      // positions, bounds at most S + Sk: in int.
      const int d = p + lk - lq - k0;
      if (mask.band_left >= 0 && d - mask.band_left > first) first = d - mask.band_left;
      if (mask.band_right >= 0 && d + mask.band_right + 1 < last) last = d + mask.band_right + 1;
    }
  }

  /// ALiBi's bias of head h of batch entry b (alibi.hpp), aligned by the
  /// entry's lengths as the band is.
  template <class T>
  KOKKOS_INLINE_FUNCTION AlibiRow<T> alibi(int b, int h) const {
    const auto& slopes = mask.alibi_slopes;
    AlibiRow<T> a;
    if (slopes.extent(0) == 0) return a;
    a.slope = T(slopes(slopes.extent(0) == 1 ? 0 : b, h));
    a.shift = mask.diagonal_shift(b, queries, keys) + mask.positions.query_begin -
              mask.positions.key_begin;
    return a;
  }

  /// What a block of queries sees, for a team: the union [lo, hi) of the
  /// key ranges of queries i0 … i0 + rows − 1 of batch entry b (lo > hi
  /// when none sees a key) and the keys [common_lo, common_hi) every one of
  /// them sees (empty when common_lo ≥ common_hi), so that a tile inside
  /// it needs no mask.
  struct Bounds {
    int lo, hi, common_lo, common_hi;
  };
  template <class Member>
  KOKKOS_INLINE_FUNCTION Bounds team_bounds(const Member& team, int b, int i0, int rows) const {
    Bounds out{keys, 0, 0, keys};
    hull(team, b, i0, rows, out.lo, out.hi);
    fold(
        team, b, i0, rows, [](int f, int, int& x) { x = f > x ? f : x; },
        Kokkos::Max<int>(out.common_lo));
    fold(
        team, b, i0, rows, [](int, int e, int& x) { x = e < x ? e : x; },
        Kokkos::Min<int>(out.common_hi));
    return out;
  }

  /// The union [lo, hi) of the key ranges of queries i0 … i0 + rows − 1 of
  /// batch entry b, as team_bounds (lo > hi when none sees a key).
  template <class Member>
  KOKKOS_INLINE_FUNCTION void hull(const Member& team, int b, int i0, int rows, int& lo,
                                   int& hi) const {
    lo = keys, hi = 0;
    fold(
        team, b, i0, rows, [](int f, int e, int& x) { x = f < e && f < x ? f : x; },
        Kokkos::Min<int>(lo));
    fold(
        team, b, i0, rows, [](int f, int e, int& x) { x = f < e && e > x ? e : x; },
        Kokkos::Max<int>(hi));
  }

 private:
  /// reducer ← update(first, last, x) over the rows' ranges, for a team.
  template <class Member, class Update, class Reducer>
  KOKKOS_INLINE_FUNCTION void fold(const Member& team, int b, int i0, int rows,
                                   const Update& update, const Reducer& reducer) const {
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, rows),
        [&](int r, int& x) {
          int f, e;
          range(b, i0 + r, f, e);
          update(f, e, x);
        },
        reducer);
  }
};

/// The positions (AttentionMask::Positions) of S queries and Sk keys: each
/// block inside its length.
template <class Positions>
void check_positions(const char* op, const Positions& p, std::size_t queries, std::size_t keys,
                     std::size_t heads) {
  const auto check = [&](const char* begin_name, int begin, const char* length_name, int length,
                         std::size_t count, const char* what) {
    if (length < -1) {
      fail(op, ": mask.positions.", length_name, "=", length,
           ", expected -1 (the call's own) or a length >= 0");
    }
    if (length == -1 && begin != 0) {
      fail(op, ": mask.positions.", begin_name, "=", begin, " with ", length_name,
           "=-1, expected 0 (the call's own positions)");
    }
    if (length >= 0 && (begin < 0 || std::size_t(begin) + count > std::size_t(length))) {
      fail(op, ": mask.positions.", begin_name, "=", begin, " with ", count, " ", what,
           ", expected 0 <= ", begin_name, " and ", begin_name, " + ", count, " <= ", length_name,
           "=", length);
    }
  };
  check("query_begin", p.query_begin, "query_length", p.query_length, queries, "queries (S)");
  check("key_begin", p.key_begin, "key_length", p.key_length, keys, "keys (Sk)");
  check("head_begin", p.head_begin, "head_count", p.head_count, heads, "heads (H)");
}

/// The mask against scores of B entries, S queries and Sk keys, and its
/// ALiBi slopes against H = `heads` (0: an operator that adds no bias,
/// alibi.hpp's check_alibi). Each given vector is copied to the host once,
/// inside the profiling region "kdnn::attention::check_mask" (none without
/// vectors).
template <class ExecSpace>
void check_mask(const char* op, const AttentionMask<ExecSpace>& m, std::size_t batch,
                std::size_t queries, std::size_t keys, std::size_t heads = 0) {
  const auto check_bound = [&](const char* name, int bound) {
    if (bound < -1) {
      fail(op, ": mask.", name, "=", bound, ", expected -1 (no bound) or a key count >= 0");
    }
  };
  check_bound("band_left", m.band_left);
  check_bound("band_right", m.band_right);
  check_positions(op, m.positions, queries, keys, heads);
  // The band, ALiBi and the lengths count in the positions.
  const auto S_pos = std::size_t(m.query_positions(int(queries)));
  const auto Sk_pos = std::size_t(m.key_positions(int(keys)));
  if ((m.band_left >= 0 || m.band_right >= 0) && S_pos + Sk_pos > (std::size_t(1) << 29)) {
    fail(op, ": a band (mask.band_left, band_right) with S + Sk = ", S_pos + Sk_pos,
         ", expected S + Sk <= 2^29");
  }
  if (m.lo_win.extent(0) + m.hi_win.extent(0) + m.seq_q.extent(0) + m.seq_k.extent(0) +
          m.alibi_slopes.size() ==
      0) {
    return;  // nothing to copy or check (causal is a flag)
  }
  const kdnn::impl::ProfilingRegion region("kdnn::attention::check_mask");
  check_alibi<ExecSpace>(op, m.alibi_slopes, batch, heads, S_pos, Sk_pos);
  using HostVector = decltype(Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m.lo_win));
  const auto check = [&](const char* name, const auto& v, std::size_t n, const char* count,
                         std::size_t max, const char* what) {
    if (v.extent(0) == 0) return HostVector();  // absent: no host copy (on a GPU, an allocation)
    if (v.extent(0) != n) {
      fail(op, ": mask.", name, " has extent(0)=", v.extent(0), ", expected ", n, " (", count, ")");
    }
    HostVector h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
    for (std::size_t k = 0; k < h.extent(0); ++k) {
      if (h(k) < 0 || std::size_t(h(k)) > max) {
        fail(op, ": mask.", name, "[", k, "]=", h(k), ", expected a value in [0, ", max, "] (",
             what, ")");
      }
    }
    return h;
  };
  const auto lo = check("lo_win", m.lo_win, queries, "one per query, S", keys, "key indices, Sk");
  const auto hi = check("hi_win", m.hi_win, queries, "one per query, S", keys, "key indices, Sk");
  check("seq_q", m.seq_q, batch, "one per batch entry, B", S_pos, "query length, S");
  check("seq_k", m.seq_k, batch, "one per batch entry, B", Sk_pos, "key length, Sk");
  if (lo.extent(0) > 0 && hi.extent(0) > 0) {
    for (std::size_t i = 0; i < queries; ++i) {
      if (lo(i) > hi(i)) {
        fail(op, ": mask.lo_win[", i, "]=", lo(i), " > mask.hi_win[", i, "]=", hi(i),
             ", expected lo <= hi");
      }
    }
  }
}

}  // namespace kdnn::attention::impl
