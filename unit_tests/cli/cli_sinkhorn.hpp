// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The fixture of the tests of `kdnn sinkhorn` and of the tool's common
// handling (test_cli.cpp, test_cli_sinkhorn.cpp, test_cli_inputs.cpp): the
// subcommand's arguments and a random [batch, n, n] problem in --in.
#include <cstddef>
#include <vector>

#include "cli_fixture.hpp"
#include "kdnn/io/npy.hpp"
#include "random.hpp"

namespace kdnn_test {

/// CliTest with `kdnn sinkhorn`'s arguments and the last problem written
/// (x_, g_, as double).
class Cli : public CliTest {
 protected:
  /// "sinkhorn --in IN --out OUT" followed by `extra`.
  Strings sinkhorn(const Strings& extra, const fs::path& out = {}) const {
    Strings args{"sinkhorn", "--in", in_.string(), "--out", (out.empty() ? out_ : out).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  /// Writes x.npy (and g.npy when `with_g`) for a [batch, n, n] problem.
  void write_problem(kdnn::io::DType dtype, std::size_t batch, std::size_t n, bool with_g) {
    x_ = uniform(batch * n * n, 0.0, 4.0, 7);
    g_ = uniform(batch * n * n, -1.0, 1.0, 8);
    write("x.npy", dtype, {batch, n, n}, x_);
    if (with_g) write("g.npy", dtype, {batch, n, n}, g_);
  }

  std::vector<double> x_, g_;
};

}  // namespace kdnn_test
