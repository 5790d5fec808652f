// Sinkhorn against golden data from PyTorch autograd through the reference
// forward (unit_tests/reference/gen_sinkhorn_golden.py): R from the forward,
// dX from autograd, in float64 and float32.
#include <string>

#include "kdnn/io/npy.hpp"
#include "sinkhorn_test_util.hpp"
#include "test_paths.hpp"

namespace {

using namespace kdnn_test;
namespace sk = kdnn::sinkhorn;

struct GoldenCase {
  std::string name;
  int iters;
};

/// Reads a [batch, n, n] golden array into `out` (ASSERTs: call through
/// ASSERT_NO_FATAL_FAILURE).
void load(const std::string& file, kdnn::io::DType dtype, int& batch, int& n,
          std::vector<double>& out) {
  const auto a = kdnn::io::read_npy(data_dir() + "/sinkhorn/" + file);
  ASSERT_EQ(a.dtype, dtype) << file;
  ASSERT_EQ(a.shape.size(), 3u) << file;
  ASSERT_EQ(a.shape[1], a.shape[2]) << file;
  batch = int(a.shape[0]);
  n = int(a.shape[1]);
  out.resize(a.size());
  for (std::size_t k = 0; k < a.size(); ++k)
    out[k] = a.dtype == kdnn::io::DType::f32 ? double(a.data<float>()[k]) : a.data<double>()[k];
}

template <class T>
void check_case(const GoldenCase& c) {
  const bool single = sizeof(T) == 4;
  const std::string prefix = c.name + (single ? "_f32_" : "_f64_");
  const auto dtype = single ? kdnn::io::DType::f32 : kdnn::io::DType::f64;
  int batch = 0, n = 0;
  std::vector<double> x, g, r_ref, dx_ref;
  ASSERT_NO_FATAL_FAILURE(load(prefix + "x.npy", dtype, batch, n, x));
  ASSERT_NO_FATAL_FAILURE(load(prefix + "g.npy", dtype, batch, n, g));
  ASSERT_NO_FATAL_FAILURE(load(prefix + "r.npy", dtype, batch, n, r_ref));
  ASSERT_NO_FATAL_FAILURE(load(prefix + "dx.npy", dtype, batch, n, dx_ref));
  ASSERT_GT(batch, 0);
  ASSERT_EQ(x.size(), std::size_t(batch) * n * n);

  auto X = batch_of<T>(x, batch, n);
  auto G = batch_of<T>(g, batch, n);
  auto Rg = batch_of<T>(r_ref, batch, n);
  Batch<T> R("R", batch, n, n), dX("dX", batch, n, n);
  sk::forward(Space(), X, R, {c.iters});
  EXPECT_LT(rel_error(to_host(R), r_ref), single ? 2e-6 : 1e-13) << prefix;

  sk::backward_unrolled(Space(), X, G, dX, {c.iters});
  EXPECT_LT(rel_error(to_host(dX), dx_ref), single ? 2e-6 : 1e-12) << prefix << " unrolled";

  // Implicit and block from PyTorch's own R: the golden forwards have
  // converged to the working precision, so these match autograd.
  for (auto method : {sk::Method::implicit, sk::Method::block}) {
    sk::BackwardOptions o;
    o.method = method;
    sk::backward(Space(), Rg, G, dX, o);
    EXPECT_LT(rel_error(to_host(dX), dx_ref), single ? 1e-5 : 1e-9)
        << prefix << (method == sk::Method::block ? " block" : " implicit");
  }
}

const GoldenCase cases[] = {{"n4_it48", 48}, {"n16_it100", 100}};

TEST(SinkhornGolden, Float64) {
  for (const auto& c : cases) ASSERT_NO_FATAL_FAILURE(check_case<double>(c));
}

TEST(SinkhornGolden, Float32) {
  for (const auto& c : cases) ASSERT_NO_FATAL_FAILURE(check_case<float>(c));
}

}  // namespace
