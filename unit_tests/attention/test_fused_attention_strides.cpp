// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Fused attention on strided operands: q, dO and the outputs in a
// [B, S, H, D] layout with padded rows, k and v as the two halves of a
// packed [B, Sk, 2, Hkv, D] tensor (flash-attn's layouts), read and written
// in place through their strides. Every form gives bitwise the results of
// the same call on contiguous copies, leaves the memory between the
// elements as it was, and the score check reads only the elements; strides
// the kernels cannot take are refused.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "fused_case.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "random.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace at = kdnn::attention;

template <class T>
using Strided = kdnn::StridedTensor4<T, Space>;

/// A [n0, n1, n2, n3] View with strides s over `data` (offset `first`).
template <class T>
Strided<T> strided(T* data, std::size_t first, std::array<std::size_t, 4> n,
                   std::array<std::size_t, 4> s) {
  return Strided<T>(data + first,
                    Kokkos::LayoutStride(n[0], s[0], n[1], s[1], n[2], s[2], n[3], s[3]));
}

/// Where element (b, h, i, d) of a [B, H, S, D] tensor lies in a layout.
struct Layout {
  std::size_t first;                ///< offset of element (0, 0, 0, 0)
  std::array<std::size_t, 4> n, s;  ///< extents and strides, [B, H, S, D] order
  std::size_t at(int b, int h, int i, int d) const {
    return first + b * s[0] + h * s[1] + i * s[2] + d * s[3];
  }
  std::size_t size() const { return n[0] * n[1] * n[2] * n[3]; }
  /// f(storage index) for each element, in [B, H, S, D] order.
  template <class F>
  void each(const F& f) const {
    for (std::size_t b = 0; b < n[0]; ++b)
      for (std::size_t h = 0; h < n[1]; ++h)
        for (std::size_t i = 0; i < n[2]; ++i)
          for (std::size_t d = 0; d < n[3]; ++d) f(at(int(b), int(h), int(i), int(d)));
  }
};

/// [B, S, H, D] storage with rows of `ld` >= D values, seen as [B, H, S, D].
Layout heads_second(int B, int H, int S, int D, int ld) {
  const std::size_t row = std::size_t(ld);
  return {0,
          {std::size_t(B), std::size_t(H), std::size_t(S), std::size_t(D)},
          {std::size_t(S) * H * row, row, std::size_t(H) * row, 1}};
}

/// Half `which` (0: k, 1: v) of packed [B, Sk, 2, Hkv, D] storage.
Layout packed_half(int B, int Hkv, int Sk, int D, int which) {
  const std::size_t head = std::size_t(D);
  return {std::size_t(which) * Hkv * head,
          {std::size_t(B), std::size_t(Hkv), std::size_t(Sk), head},
          {std::size_t(Sk) * 2 * Hkv * head, head, 2 * std::size_t(Hkv) * head, 1}};
}

/// The elements of `storage` that layout `l` covers, in [B, H, S, D] order.
std::vector<double> gather(const std::vector<double>& storage, const Layout& l) {
  std::vector<double> x;
  x.reserve(l.size());
  l.each([&](std::size_t at) { x.push_back(storage[at]); });
  return x;
}

/// Whether storage index x is an element of layout `l`.
std::vector<bool> covered(std::size_t size, const Layout& l) {
  std::vector<bool> in(size, false);
  l.each([&](std::size_t at) { in[at] = true; });
  return in;
}

template <class T>
class FusedAttentionStrides : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(FusedAttentionStrides, Types);

// Every form, multi-head and grouped-query, causal with dropout and the
// score check on: outputs and gradients equal bitwise those of contiguous
// copies; the pad columns between the rows (NaN in the inputs, a sentinel in
// the outputs) are neither read into the results nor written.
TYPED_TEST(FusedAttentionStrides, PeerLayoutsReadInPlaceEqualContiguousCopies) {
  using T = TypeParam;
  const int B = 2, H = 4, S = 37, Sk = 29, D = 32, pad = 3;
  const double nan = std::numeric_limits<double>::quiet_NaN(), sentinel = 7.0;
  for (const int Hkv : {4, 2}) {
    const Layout lq = heads_second(B, H, S, D, D + pad), lg = heads_second(B, H, S, D, D),
                 lk = packed_half(B, Hkv, Sk, D, 0), lv = packed_half(B, Hkv, Sk, D, 1),
                 lkv_out = heads_second(B, Hkv, Sk, D, D + pad);
    const std::size_t n_q = std::size_t(B) * S * H * (D + pad),
                      n_kv = std::size_t(B) * Sk * 2 * Hkv * D,
                      n_kv_out = std::size_t(B) * Sk * Hkv * (D + pad);
    std::vector<double> q_host = normal(n_q, 11 + Hkv);
    const std::vector<double> kv_host = normal(n_kv, 12 + Hkv),
                              g_host = normal(lg.size(), 13 + Hkv);
    const std::vector<bool> q_elems = covered(n_q, lq);
    for (std::size_t x = 0; x < n_q; ++x) {
      if (!q_elems[x]) q_host[x] = nan;  // between the rows: never read
    }
    const auto q_store = to_device<T*>(q_host, n_q), kv_store = to_device<T*>(kv_host, n_kv),
               g_store = to_device<T*>(g_host, lg.size());
    const auto q = strided<const T>(q_store.data(), lq.first, lq.n, lq.s),
               k = strided<const T>(kv_store.data(), lk.first, lk.n, lk.s),
               v = strided<const T>(kv_store.data(), lv.first, lv.n, lv.s),
               g = strided<const T>(g_store.data(), lg.first, lg.n, lg.s);
    // The same values, contiguous.
    const auto qc = to_device<T****>(gather(q_host, lq), B, H, S, D),
               kc = to_device<T****>(gather(kv_host, lk), B, Hkv, Sk, D),
               vc = to_device<T****>(gather(kv_host, lv), B, Hkv, Sk, D),
               gc = to_device<T****>(gather(g_host, lg), B, H, S, D);
    for (const auto form : fused_forms()) {
      SCOPED_TRACE("Hkv=" + std::to_string(Hkv) + form_suffix(form));
      at::FusedAttentionOptions opts;
      opts.scale = 1 / std::sqrt(double(D));
      opts.dropout = {0.1, 21, 3};
      opts.launch.form = form;
      opts.check_scores = true;
      at::AttentionMask<Space> mask;
      mask.causal = true;

      const auto filled = [&](std::size_t n) {
        return to_device<T*>(std::vector<double>(n, sentinel), n);
      };
      const auto o_store = filled(n_q), dq_store = filled(n_q), dk_store = filled(n_kv_out),
                 dv_store = filled(n_kv_out);
      const auto o = strided<T>(o_store.data(), lq.first, lq.n, lq.s),
                 dq = strided<T>(dq_store.data(), lq.first, lq.n, lq.s),
                 dk = strided<T>(dk_store.data(), lkv_out.first, lkv_out.n, lkv_out.s),
                 dv = strided<T>(dv_store.data(), lkv_out.first, lkv_out.n, lkv_out.s);
      DeviceView<T***> lse("lse", B, H, S);
      at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);
      at::fused_attention_backward(Space(), q, k, v, Strided<const T>(o), lse, g, dq, dk, dv, opts,
                                   mask);

      DeviceView<T****> oc("o", B, H, S, D), dqc("dq", B, H, S, D), dkc("dk", B, Hkv, Sk, D),
          dvc("dv", B, Hkv, Sk, D);
      DeviceView<T***> lsec("lse", B, H, S);
      at::fused_attention_forward(Space(), qc, kc, vc, oc, lsec, opts, mask);
      at::fused_attention_backward(Space(), qc, kc, vc, oc, lsec, gc, dqc, dkc, dvc, opts, mask);

      EXPECT_EQ(to_host(lse), to_host(lsec));
      const auto check = [&](const char* name, const DeviceView<T*>& store, const Layout& l,
                             const DeviceView<T****>& want) {
        const std::vector<double> got = to_host(store);
        EXPECT_EQ(gather(got, l), to_host(want)) << name;
        const std::vector<bool> elems = covered(got.size(), l);
        std::size_t touched = 0;
        for (std::size_t x = 0; x < got.size(); ++x) touched += !elems[x] && got[x] != sentinel;
        EXPECT_EQ(touched, 0u) << name << ": values between the elements were written";
      };
      check("o", o_store, lq, oc);
      check("dq", dq_store, lq, dqc);
      check("dk", dk_store, lkv_out, dkc);
      check("dv", dv_store, lkv_out, dvc);
      const std::vector<double> o_values = to_host(oc);
      for (const double x : o_values) ASSERT_TRUE(std::isfinite(x));
    }
  }
}

// Strides the kernels cannot take are kdnn::Errors naming the argument: a
// last dimension that is not contiguous, and outputs whose elements overlap.
TEST(FusedAttentionStridesErrors, NonUnitLastStrideAndOverlappingOutputsAreRefused) {
  using T = double;
  const int B = 1, H = 2, S = 3, Sk = 5, D = 4;
  DeviceView<T****> q("q", B, H, S, D), k("k", B, H, Sk, D), v("v", B, H, Sk, D),
      o("o", B, H, S, D), g("g", B, H, S, D), dq("dq", B, H, S, D), dk("dk", B, H, Sk, D),
      dv("dv", B, H, Sk, D);
  DeviceView<T***> lse("lse", B, H, S);
  DeviceView<T*> wide("wide", std::size_t(2) * B * H * Sk * D);
  // Every other value of `wide`: the last stride 2.
  const auto k_every_other = strided<const T>(wide.data(), 0, {1, 2, 5, 4},
                                              {std::size_t(2) * H * Sk * D, 2 * Sk * D, 2 * D, 2});
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k_every_other, v, o, lse),
                    "k has stride(3)=2, expected 1 (its last dimension contiguous)");
  // Both heads of o on the same memory (stride 0): overlapping elements.
  const auto o_shared = strided<T>(o.data(), 0, {1, 2, 3, 4}, {std::size_t(H) * S * D, 0, D, 1});
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o_shared, lse),
                    "o has stride(1)=0 with extent(1)=2, expected an output whose elements do not "
                    "overlap");
  // dq's rows interleaved into each other (stride 2 < D).
  DeviceView<T*> rows("rows", 64);
  const auto dq_interleaved = strided<T>(rows.data(), 0, {1, 2, 3, 4}, {24, 8, 2, 1});
  EXPECT_KDNN_ERROR(
      at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq_interleaved, dk, dv),
      "dq has stride(2)=2 with extent(2)=3, expected an output whose elements do not overlap "
      "(stride >= 4)");
  const auto g_every_other = strided<const T>(wide.data(), 0, {1, 2, 3, 4},
                                              {std::size_t(2) * H * S * D, 2 * S * D, 2 * D, 2});
  EXPECT_KDNN_ERROR(
      at::fused_attention_backward(Space(), q, k, v, o, lse, g_every_other, dq, dk, dv),
      "dout has stride(3)=2, expected 1");
  // A stride 0 in an input is a broadcast, read as it is: k's heads shared.
  const auto k_broadcast =
      strided<const T>(k.data(), 0, {1, 2, 5, 4}, {std::size_t(H) * Sk * D, 0, D, 1});
  EXPECT_NO_THROW(at::fused_attention_forward(Space(), q, k_broadcast, v, o, lse));
}

}  // namespace
