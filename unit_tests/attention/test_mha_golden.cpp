// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Multi-head attention against golden data from PyTorch autograd in float64
// (unit_tests/reference/gen_mha_golden.py, an independent torch.nn.functional
// formulation, with dropout's keep mask from its own NumPy Philox): out and
// every gradient of L = Σ dout·out, for the float32 and the float64 layer run
// on the stored float32 inputs, with the fused (default) and the unfused
// attention. Cases: plain; causal with residual and no biases; windows and
// sequence lengths (a fully masked row, padded queries, an entry with no
// keys); dropout; an eigenMHA-sized layer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "allclose.hpp"
#include "golden_case.hpp"
#include "kdnn/io/npy.hpp"
#include "mha_layer.hpp"
#include "test_paths.hpp"

namespace {

using namespace kdnn_test;
using kdnn::io::DType;

/// The case's meta.json, whose keys must be known ones (ASSERTs).
void load_known_meta(const GoldenCase& f, std::map<std::string, std::string>& meta) {
  ASSERT_NO_FATAL_FAILURE(load_meta(f, meta));
  static const char* const known[] = {"H", "sm_scaler", "causal", "p", "seed", "offset"};
  for (const auto& item : meta) {
    ASSERT_TRUE(std::find(std::begin(known), std::end(known), item.first) != std::end(known))
        << "unknown meta key " << item.first;
  }
}

/// A golden case: the layer (sizes from the arrays' shapes, options from
/// meta.json, an optional input present iff its file is), its float32
/// inputs as double, and the expected out and gradients by file name.
struct Golden {
  MhaCase c;
  MhaData d;
  std::map<std::string, std::vector<double>> expected;
};

void load_golden(const std::string& name, Golden& g) {
  const GoldenCase f{data_dir() + "/attention/mha_" + name + "_"};
  MhaCase& c = g.c;
  MhaData& d = g.d;
  c = MhaCase();
  c.name = name;
  std::map<std::string, std::string> meta;
  ASSERT_NO_FATAL_FAILURE(load_known_meta(f, meta));
  c.H = std::stoi(meta.at("H"));
  c.causal = meta.at("causal") == "true";
  c.p = std::stod(meta.at("p"));
  c.seed = std::stoull(meta.at("seed"));
  c.offset = std::stoull(meta.at("offset"));
  if (meta.count("sm_scaler")) c.scaler = std::stod(meta.at("sm_scaler"));

  // The inputs with a gradient, by file name, with their shapes.
  using Shape = std::vector<std::size_t>;
  std::map<std::string, Shape> shapes;
  const auto input = [&](const std::string& array, Shape shape, std::vector<double>& out) {
    ASSERT_NO_FATAL_FAILURE(load(f, array, DType::f32, shape, out));
    shapes[array] = shape;
  };
  ASSERT_NO_FATAL_FAILURE(input("q", {0, 0, 0}, d.q));
  const Shape& q = shapes["q"];
  c.B = int(q[0]), c.S = int(q[1]), c.Eq = int(q[2]);
  ASSERT_NO_FATAL_FAILURE(input("k", {q[0], 0, 0}, d.k));
  c.Sk = int(shapes["k"][1]), c.Ek = int(shapes["k"][2]);
  ASSERT_NO_FATAL_FAILURE(input("v", {q[0], shapes["k"][1], 0}, d.v));
  c.Ev = int(shapes["v"][2]);
  ASSERT_NO_FATAL_FAILURE(input("w_q", {0, q[2]}, d.wq));
  ASSERT_NO_FATAL_FAILURE(input("w_v", {0, shapes["v"][2]}, d.wv));
  const std::size_t HD = shapes["w_q"][0], HDv = shapes["w_v"][0];
  ASSERT_EQ(HD % c.H, 0u) << name;
  ASSERT_EQ(HDv % c.H, 0u) << name;
  c.D = int(HD) / c.H, c.Dv = int(HDv) / c.H;
  ASSERT_NO_FATAL_FAILURE(input("w_k", {HD, shapes["k"][2]}, d.wk));
  ASSERT_NO_FATAL_FAILURE(input("w_o", {0, HDv}, d.wo));
  c.Eo = int(shapes["w_o"][0]);
  const Shape rows_out{q[0], q[1], shapes["w_o"][0]};
  Shape dout = rows_out;
  ASSERT_NO_FATAL_FAILURE(load(f, "dout", DType::f32, dout, d.dout));

  // Optional inputs: the biases, the residual and the mask's vectors.
  const std::tuple<const char*, std::size_t, bool*, std::vector<double> MhaData::*> optional[] = {
      {"b_q", HD, &c.bias_q, &MhaData::bq},
      {"b_k", HD, &c.bias_k, &MhaData::bk},
      {"b_v", HDv, &c.bias_v, &MhaData::bv},
      {"b_o", rows_out[2], &c.bias_o, &MhaData::bo}};
  for (const auto& [array, size, present, member] : optional) {
    *present = f.has(array);
    if (*present) {
      ASSERT_NO_FATAL_FAILURE(input(array, {size}, d.*member));
    }
  }
  c.residual = f.has("residual");
  if (c.residual) {
    ASSERT_NO_FATAL_FAILURE(input("residual", rows_out, d.residual));
  }
  const std::tuple<const char*, std::size_t, std::vector<int>*> ints[] = {
      {"lo_win", q[1], &c.lo},
      {"hi_win", q[1], &c.hi},  // [S]
      {"seq_q", q[0], &c.seq_q},
      {"seq_k", q[0], &c.seq_k}};  // [B]
  for (const auto& [array, size, values] : ints) {
    if (!f.has(array)) continue;
    Shape shape{size};
    std::vector<double> x;
    ASSERT_NO_FATAL_FAILURE(load(f, array, DType::i32, shape, x));
    values->assign(x.begin(), x.end());
  }

  // Expected: out, and the gradient of every input above with its shape.
  Shape out = rows_out;
  ASSERT_NO_FATAL_FAILURE(load(f, "out", DType::f64, out, g.expected["out"]));
  for (auto [array, shape] : shapes) {
    ASSERT_NO_FATAL_FAILURE(load(f, "d" + array, DType::f64, shape, g.expected["d" + array]));
  }
}

/// Runs the layer in T with `algo` on the golden inputs and compares out and
/// every gradient with the expected values.
template <class T>
void check_case(const std::string& name, kdnn::attention::AttentionAlgo algo) {
  Golden g;
  ASSERT_NO_FATAL_FAILURE(load_golden(name, g));
  DeviceLayer<T> layer(g.c, g.d, algo);
  layer.forward();
  layer.backward();
  auto results = layer.gradients();
  std::vector<std::pair<std::string, std::vector<double>>> actual = {{"out", to_host(layer.out)}};
  for (auto& [member, grad] : results) actual.push_back({name_of(member), std::move(grad)});
  EXPECT_EQ(actual.size(), g.expected.size()) << name;
  for (const auto& [array, a] : actual) {
    const std::vector<double>& e = g.expected.at(array);
    SCOPED_TRACE(name + " (" + name_of(algo) + "): " + array);
    if (array == "db_k") {
      // Softmax is shift invariant per row and b_k shifts row i's scores by
      // s·Q_i·b_k, so L does not depend on b_k: its exact gradient is zero
      // and both sides hold round-off, which has no relative error to bound.
      EXPECT_ALLCLOSE(a, e, 0.0, sizeof(T) == 8 ? 1e-13 : 1e-5);
    } else if (sizeof(T) == 8) {
      EXPECT_LT(rel_error(a, e), 1e-10);
    } else {
      EXPECT_ALLCLOSE(a, e, 1e-4, 1e-3);
      EXPECT_LT(rel_error(a, e), 1e-5);
    }
  }
}

const char* const cases[] = {"plain", "causal_residual", "masks", "dropout", "eigenmha"};

TEST(MhaGolden, Float32) {
  for (const auto algo : kAlgos) {
    for (const char* name : cases) ASSERT_NO_FATAL_FAILURE(check_case<float>(name, algo));
  }
}

TEST(MhaGolden, Float64) {
  for (const auto algo : kAlgos) {
    for (const char* name : cases) ASSERT_NO_FATAL_FAILURE(check_case<double>(name, algo));
  }
}

// The dropout case checks kdnn's generator only if its mask matters: with
// either 32-bit word of the seed or of the offset changed (another mask), or
// with no dropout, the output is far from the golden one.
TEST(MhaGolden, DropoutCaseDependsOnEveryWordOfSeedAndOffset) {
  Golden g;
  ASSERT_NO_FATAL_FAILURE(load_golden("dropout", g));
  ASSERT_GT(g.c.seed >> 32, 0u);
  ASSERT_GT(g.c.offset >> 32, 0u);
  MhaCase variants[5] = {g.c, g.c, g.c, g.c, g.c};
  variants[0].seed ^= 1;
  variants[1].seed &= 0xffffffffu;
  variants[2].offset ^= 1;
  variants[3].offset &= 0xffffffffu;
  variants[4].p = 0;
  for (const MhaCase& c : variants) {
    DeviceLayer<double> layer(c, g.d);
    layer.forward();
    EXPECT_GT(rel_error(to_host(layer.out), g.expected.at("out")), 1e-2)
        << "seed " << c.seed << ", offset " << c.offset << ", p " << c.p;
  }
}

}  // namespace
