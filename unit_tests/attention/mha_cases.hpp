// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The layers the multi-head attention tests run (test_mha.cpp,
// test_mha_errors.cpp): each feature on its own and mixed.
#include <vector>

#include "mha_reference.hpp"

namespace kdnn_test {

/// The layers every accuracy test runs: each feature on its own and mixed.
inline std::vector<MhaCase> mha_cases() {
  std::vector<MhaCase> all;
  MhaCase c;
  c.name = "plain (S != Sk, E_o != E, D != Dv, all biases)";
  all.push_back(c);
  c.name = "no biases";
  c.bias_q = c.bias_k = c.bias_v = c.bias_o = false;
  all.push_back(c);
  c = MhaCase();
  c.name = "only the key and output biases, one head, scaler 0.3";
  c.bias_q = c.bias_v = false;
  c.H = 1, c.D = 4, c.Dv = 5;
  c.scaler = 0.3;
  all.push_back(c);
  c = MhaCase();
  c.name = "causal with residual";
  c.S = c.Sk = 5;
  c.causal = true;
  c.residual = true;
  all.push_back(c);
  c = MhaCase();
  c.name = "windows, one row fully masked (lo == hi)";
  c.S = 4, c.Sk = 5;
  c.lo = {0, 1, 3, 2};
  c.hi = {2, 4, 3, 5};
  all.push_back(c);
  c = MhaCase();
  c.name = "sequence lengths: a padded query, an entry with no keys, residual";
  c.B = 3, c.S = 4, c.Sk = 3;
  c.seq_q = {4, 2, 3};
  c.seq_k = {3, 1, 0};
  c.residual = true;
  all.push_back(c);
  c = MhaCase();
  c.name = "dropout 0.3";
  c.p = 0.3, c.seed = 1234, c.offset = 5;
  all.push_back(c);
  c = mha_case_with_everything();
  c.name = "everything: causal, windows, lengths, residual, dropout";
  all.push_back(c);
  c = mha_case_with_everything();
  c.name = "grouped-query (H = 4, Hkv = 2) with everything";
  c.H = 4, c.Hkv = 2;
  all.push_back(c);
  c = MhaCase();
  c.name = "multi-query (H = 3, Hkv = 1), dropout 0.25";
  c.H = 3, c.Hkv = 1;
  c.p = 0.25, c.seed = 77;
  all.push_back(c);
  return all;
}

}  // namespace kdnn_test
