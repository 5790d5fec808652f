// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Sinkhorn with the semantics of two production mHC kernels, against golden
// data from PyTorch autograd through formulations of their references
// (unit_tests/reference/gen_sinkhorn_peers_golden.py, kdnn_reference/mhc_peers.py):
//  * te: TransformerEngine's log-domain mhc_sinkhorn_ref, 20 iterations:
//        order = rows_first, eps = 0, iters = 20;
//  * tk: TileKernels' sinkhorn_normalize_ref(repeat=10, eps=1e-6):
//        order = rows_first, eps = 1e-6, iters = 10.
// Each case is held to the peers' own tolerance (allclose, atol = rtol =
// 5e-3) and to a norm-wise relative error near the working precision.
#include <string>
#include <utility>
#include <vector>

#include "golden_data.hpp"
#include "sinkhorn_test_util.hpp"

namespace {

using namespace kdnn_test;
namespace sk = kdnn::sinkhorn;

sk::ForwardOptions peer_options(const std::string& peer) {
  sk::ForwardOptions o;
  o.order = sk::Order::rows_first;
  o.iters = peer == "te" ? 20 : 10;
  o.eps = peer == "te" ? 0 : 1e-6;
  return o;
}

/// The generator's cases for scalar type T: {peer, case name}.
template <class T>
std::vector<std::pair<std::string, std::string>> peer_cases() {
  std::vector<std::pair<std::string, std::string>> cases;
  for (std::string peer : {"te", "tk"}) {
    const std::string prefix = "peers_" + peer + "_n";
    for (int n : {4, 8})
      for (int b : {1, 64})
        cases.push_back({peer, prefix + std::to_string(n) + "_b" + std::to_string(b)});
    if (sizeof(T) == 4) cases.push_back({peer, prefix + "4_b4096"});
  }
  cases.push_back({"te", "peers_te_n8_b64_s3"});
  return cases;
}

/// kdnn's R and dX on a golden case's X and G, with `opts`.
template <class T>
std::pair<std::vector<double>, std::vector<double>> run(const Golden& d,
                                                        const sk::ForwardOptions& opts) {
  auto X = batch_of<T>(d.x, d.batch, d.n);
  Batch<T> R("R", d.batch, d.n, d.n), dX("dX", d.batch, d.n, d.n);
  sk::forward(Space(), X, R, opts);
  sk::backward_unrolled(Space(), X, batch_of<T>(d.g, d.batch, d.n), dX, opts);
  return {to_host(R), to_host(dX)};
}

template <class T>
void check_peers() {
  for (const auto& [peer, name] : peer_cases<T>()) {
    SCOPED_TRACE(name + "_" + dtype_suffix<T>());
    Golden d;
    ASSERT_NO_FATAL_FAILURE(load_golden<T>(name, d));
    const auto [r, dx] = run<T>(d, peer_options(peer));
    EXPECT_ALLCLOSE(r, d.r, 5e-3, 5e-3);  // the peers' own tolerance
    EXPECT_ALLCLOSE(dx, d.dx, 5e-3, 5e-3);
    // Measured (Serial): at most 3e-16 (R) and 7e-16 (dX) in double,
    // 1.6e-7 (R) and 3.3e-7 (dX) in float.
    EXPECT_LT(rel_error(r, d.r), tol<T>(1e-14, 1e-6));
    EXPECT_LT(rel_error(dx, d.dx), tol<T>(1e-14, 1e-6));
  }
}

TEST(SinkhornPeers, Float64) { check_peers<double>(); }

TEST(SinkhornPeers, Float32) { check_peers<float>(); }

// 20 iterations from X ~ 3 N(0, 1) are far from converged, so the order of
// the normalisations matters: kdnn's default (columns first) is another map.
TEST(SinkhornPeers, ColumnsFirstDoesNotMatchTransformerEngine) {
  Golden d;
  ASSERT_NO_FATAL_FAILURE(load_golden<double>("peers_te_n8_b64_s3", d));
  auto opts = peer_options("te");
  opts.order = sk::Order::columns_first;
  const auto [r, dx] = run<double>(d, opts);  // measured: 5.8e-3 (R), 1.4e-2 (dX)
  EXPECT_GT(rel_error(r, d.r), 1e-3);
  EXPECT_GT(rel_error(dx, d.dx), 1e-3);
}

}  // namespace
