// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The options of the extension's calls. options.cpp binds kdnn's C++ options
// structs (FusedAttentionOptions, MhaOptions, the Sinkhorn's, SsdOptions,
// ...) as classes of kdnn._kdnn, one def_rw per member, in one place; the
// bindings take them as they are. The attention mask, whose vectors are
// arrays from Python, is AttentionMaskArrays here (_kdnn.AttentionMask),
// made into kdnn's AttentionMask on the call's space.
#include <nanobind/nanobind.h>

#include <string>

#include "kdnn/attention/softmax.hpp"
#include "tensors.hpp"

namespace kdnn_python {

/// An attention mask as Python passes it: AttentionMask's flags and band,
/// and its vectors as arrays (None: none).
struct AttentionMaskArrays {
  bool causal = false;
  int band_left = -1, band_right = -1;  ///< −1: no bound on that side
  Optional lo_win, hi_win;              ///< int32 [S] each: the windows
  Optional seq_q, seq_k;                ///< int32 [B] each: the entries' lengths
  Optional alibi_slopes;                ///< float64 [1 or B, H]

  /// The mask with Views on `Space`; `op` names the operator in errors, the
  /// arrays as the Python API names them.
  template <class Space>
  kdnn::attention::AttentionMask<Space> views(const std::string& op) const {
    using Ints = kdnn::Vector<const int, Space>;
    kdnn::attention::AttentionMask<Space> m;
    m.causal = causal;
    m.band_left = band_left, m.band_right = band_right;
    m.lo_win = view_of<Ints>(lo_win, op + ": window[0]");
    m.hi_win = view_of<Ints>(hi_win, op + ": window[1]");
    m.seq_q = view_of<Ints>(seq_q, op + ": seq_lengths[0]");
    m.seq_k = view_of<Ints>(seq_k, op + ": seq_lengths[1]");
    m.alibi_slopes =
        view_of<kdnn::Matrix<const double, Space>>(alibi_slopes, op + ": alibi_slopes");
    return m;
  }
};

/// Binds the options structs, their enums and AttentionMaskArrays in `m`
/// (before the functions that take them).
void bind_options(nb::module_& m);

}  // namespace kdnn_python
