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

std::vector<double> load(const std::string& file, kdnn::io::DType dtype, int& batch, int& n) {
  const auto a = kdnn::io::read_npy(data_dir() + "/sinkhorn/" + file);
  EXPECT_EQ(a.dtype, dtype) << file;
  EXPECT_EQ(a.shape.size(), 3u) << file;
  batch = int(a.shape[0]);
  n = int(a.shape[1]);
  std::vector<double> out(a.size());
  for (std::size_t k = 0; k < a.size(); ++k)
    out[k] = a.dtype == kdnn::io::DType::f32 ? double(a.data<float>()[k]) : a.data<double>()[k];
  return out;
}

template <class T>
void check_case(const GoldenCase& c) {
  const bool single = sizeof(T) == 4;
  const std::string prefix = c.name + (single ? "_f32_" : "_f64_");
  const auto dtype = single ? kdnn::io::DType::f32 : kdnn::io::DType::f64;
  int batch = 0, n = 0;
  const auto x = load(prefix + "x.npy", dtype, batch, n);
  const auto g = load(prefix + "g.npy", dtype, batch, n);
  const auto r_ref = load(prefix + "r.npy", dtype, batch, n);
  const auto dx_ref = load(prefix + "dx.npy", dtype, batch, n);
  ASSERT_GT(batch, 0);

  auto X = to_device<T>(x, batch, n);
  auto G = to_device<T>(g, batch, n);
  auto Rg = to_device<T>(r_ref, batch, n);
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
  for (const auto& c : cases) check_case<double>(c);
}

TEST(SinkhornGolden, Float32) {
  for (const auto& c : cases) check_case<float>(c);
}

}  // namespace
