// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The fixture of the tests of `kdnn mha` (test_cli_mha.cpp,
// test_cli_mha_errors.cpp): the files of a layer (mha_reference.hpp's
// MhaCase and MhaData) written to --in, the subcommand's arguments, the
// gradient files it writes, and the check of a run against the double-loop
// layer.
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "allclose.hpp"
#include "cli_fixture.hpp"
#include "kdnn/io/npy.hpp"
#include "mha_reference.hpp"

namespace kdnn_test {

/// One gradient file: its name, what it is the gradient of, its shape.
struct Gradient {
  std::string file;
  std::vector<double> MhaData::*of;
  Shape shape;
};

inline Shape dims(int a, int b, int c = -1) {
  return c < 0 ? Shape{std::size_t(a), std::size_t(b)}
               : Shape{std::size_t(a), std::size_t(b), std::size_t(c)};
}

/// The gradients the tool writes for the case given do.npy.
inline std::vector<Gradient> gradients(const MhaCase& c) {
  std::vector<Gradient> g = {{"dq.npy", &MhaData::q, dims(c.B, c.S, c.Eq)},
                             {"dk.npy", &MhaData::k, dims(c.B, c.Sk, c.Ek)},
                             {"dv.npy", &MhaData::v, dims(c.B, c.Sk, c.Ev)},
                             {"dw_q.npy", &MhaData::wq, dims(c.H * c.D, c.Eq)},
                             {"dw_k.npy", &MhaData::wk, dims(c.H * c.D, c.Ek)},
                             {"dw_v.npy", &MhaData::wv, dims(c.H * c.Dv, c.Ev)},
                             {"dw_o.npy", &MhaData::wo, dims(c.Eo, c.H * c.Dv)}};
  if (c.bias_q) g.push_back({"db_q.npy", &MhaData::bq, {std::size_t(c.H * c.D)}});
  if (c.bias_k) g.push_back({"db_k.npy", &MhaData::bk, {std::size_t(c.H * c.D)}});
  if (c.bias_v) g.push_back({"db_v.npy", &MhaData::bv, {std::size_t(c.H * c.Dv)}});
  if (c.bias_o) g.push_back({"db_o.npy", &MhaData::bo, {std::size_t(c.Eo)}});
  if (c.residual) g.push_back({"dresidual.npy", &MhaData::residual, dims(c.B, c.S, c.Eo)});
  return g;
}

/// CliTest with a layer's files and `kdnn mha`'s arguments.
class CliMha : public CliTest {
 protected:
  /// Writes an int32 or int64 vector to in_/name.
  void write_ints(const std::string& name, kdnn::io::DType dtype,
                  const std::vector<long long>& values, const Shape& shape = {}) const {
    const std::string path = (in_ / name).string();
    const Shape s = shape.empty() ? Shape{values.size()} : shape;
    if (dtype == kdnn::io::DType::i64) {
      const std::vector<std::int64_t> v(values.begin(), values.end());
      kdnn::io::write_npy<std::int64_t>(path, s, v.data());
    } else {
      const std::vector<std::int32_t> v(values.begin(), values.end());
      kdnn::io::write_npy<std::int32_t>(path, s, v.data());
    }
  }

  /// Writes the case's files: q k v and the weights, the biases and the
  /// residual it has, its mask in `int_dtype`, and do.npy when `with_do`.
  void write_case(const MhaCase& c, const MhaData& d, kdnn::io::DType dtype, bool with_do,
                  kdnn::io::DType int_dtype = kdnn::io::DType::i32) const {
    write("q.npy", dtype, dims(c.B, c.S, c.Eq), d.q);
    write("k.npy", dtype, dims(c.B, c.Sk, c.Ek), d.k);
    write("v.npy", dtype, dims(c.B, c.Sk, c.Ev), d.v);
    write("w_q.npy", dtype, dims(c.H * c.D, c.Eq), d.wq);
    write("w_k.npy", dtype, dims(c.H * c.D, c.Ek), d.wk);
    write("w_v.npy", dtype, dims(c.H * c.Dv, c.Ev), d.wv);
    write("w_o.npy", dtype, dims(c.Eo, c.H * c.Dv), d.wo);
    if (c.bias_q) write("b_q.npy", dtype, {std::size_t(c.H * c.D)}, d.bq);
    if (c.bias_k) write("b_k.npy", dtype, {std::size_t(c.H * c.D)}, d.bk);
    if (c.bias_v) write("b_v.npy", dtype, {std::size_t(c.H * c.Dv)}, d.bv);
    if (c.bias_o) write("b_o.npy", dtype, {std::size_t(c.Eo)}, d.bo);
    if (c.residual) write("residual.npy", dtype, dims(c.B, c.S, c.Eo), d.residual);
    if (with_do) write("do.npy", dtype, dims(c.B, c.S, c.Eo), d.dout);
    const auto ints = [&](const char* name, const std::vector<int>& v) {
      if (!v.empty()) write_ints(name, int_dtype, {v.begin(), v.end()});
    };
    ints("lo_win.npy", c.lo);
    ints("hi_win.npy", c.hi);
    ints("seq_q.npy", c.seq_q);
    ints("seq_k.npy", c.seq_k);
  }

  /// "mha --in IN --out OUT --heads H" with the case's options, then `extra`.
  Strings mha(const MhaCase& c, const Strings& extra = {}, const fs::path& out = {}) const {
    Strings args{"mha",
                 "--in",
                 in_.string(),
                 "--out",
                 (out.empty() ? out_ : out).string(),
                 "--heads",
                 std::to_string(c.H)};
    if (c.causal) args.push_back("--causal");
    if (c.scaler) args.insert(args.end(), {"--scale", std::to_string(*c.scaler)});
    if (c.p > 0) {
      args.insert(args.end(), {"--dropout", std::to_string(c.p), "--seed", std::to_string(c.seed)});
    }
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  /// Runs the case (written with do.npy when `with_do`) into `out` and checks
  /// the files written, o.npy and every gradient against the reference on
  /// `d` (the data as the tool read it).
  void expect_layer(const MhaCase& c, const MhaData& d, kdnn::io::DType dtype, bool with_do,
                    const fs::path& out, double rtol, double atol) const {
    const Result r = run(mha(c, {}, out));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err, "");
    std::set<std::string> expected_files{"o.npy"};
    if (with_do) {
      for (const Gradient& g : gradients(c)) expected_files.insert(g.file);
    }
    EXPECT_EQ(files(out), expected_files);
    const auto o = read(out / "o.npy", dtype, dims(c.B, c.S, c.Eo));
    EXPECT_ALLCLOSE(o, reference_mha_forward(c, d), rtol, atol) << "o.npy";
    if (!with_do) return;
    for (const Gradient& g : gradients(c)) {
      EXPECT_ALLCLOSE(read(out / g.file, dtype, g.shape), reference_gradient(c, d, g.of), rtol,
                      atol)
          << g.file;
    }
  }
};

}  // namespace kdnn_test
