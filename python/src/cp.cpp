// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// kdnn::cp's context-parallel operators (kdnn.cp): the Mamba-2 conv1d + dt
// softplus with its halo exchange, the SSD with its state passing and the
// fused attention, each rank holding its steps of a SequenceLayout (bound
// as _kdnn.SequenceLayout), over the MPI communicator whose Fortran handle
// Python passes (mpi4py's comm.py2f()); and the gather of a sequence.
// Built when kdnn has kdnn::cp.
#include <mpi.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kdnn/cp/cp.hpp"
#include "mamba2_arguments.hpp"
#include "options.hpp"
#include "tensors.hpp"

namespace kdnn_python {

namespace ssm = kdnn::ssm;
namespace cp = kdnn::cp;
using namespace nb::literals;

namespace {

template <class T, class Space>
using Vec = kdnn::Vector<T, Space>;

/// The communicator of a Fortran handle (mpi4py: comm.py2f()), checked: a
/// handle that names no live communicator (out of range, freed, or
/// MPI_COMM_NULL's), an intercommunicator, or MPI not running is a
/// kdnn::Error naming comm, never a call into MPI with it.
MPI_Comm comm_of(std::int64_t handle) {
  const char* op = "kdnn.cp";
  cp::check_mpi_running(op);
  const auto fortran = MPI_Fint(handle);
  if (std::int64_t(fortran) != handle) {
    kdnn::fail(op, ": comm has the handle ", handle, ", expected a Fortran integer (comm.py2f())");
  }
  const MPI_Comm comm = MPI_Comm_f2c(fortran);
  if (comm == MPI_Comm() || MPI_Comm_c2f(comm) != fortran) {
    kdnn::fail(op, ": comm has the handle ", handle,
               ", which names no communicator (a freed or invalid one), expected a live "
               "communicator");
  }
  cp::check_communicator(op, comm);
  return comm;
}

/// Python's own checks of a kdnn.cp call made collective: `message` (this
/// rank's error, or none) becomes on every rank the kdnn::Error of the
/// lowest rank that has one, before anything else is exchanged.
void agree(const std::optional<std::string>& message, std::int64_t handle) {
  const MPI_Comm comm = comm_of(handle);
  const nb::gil_scoped_release unlocked;  // the other ranks may take a while
  cp::agree(comm, [&] {
    if (message) throw kdnn::Error(*message);
  });
}

void conv_dt_forward(const Array& x, const Array& w, const Optional& bias, const Array& dt,
                     const Array& dt_bias, const Array& y, const Array& halo, const Array& dt_out,
                     const Optional& seq_idx, const cp::ConvDtOptions& options,
                     const std::optional<cp::SequenceLayout>& layout, std::int64_t comm,
                     std::uintptr_t stream) {
  dispatch(x, "cp.conv_dt: x", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    cp::ConvDtForward<T, Space> f;
    f.conv =
        conv_forward_arguments<T, Space>("cp.conv_dt", x, w, bias, std::nullopt, y, std::nullopt);
    f.conv.seq_idx = view_of<kdnn::Matrix<const int, Space>>(seq_idx, "cp.conv_dt: seq_idx");
    f.halo = view_of<kdnn::Tensor3<T, Space>>(halo, "cp.conv_dt: halo");
    f.dt = view_of<In3<T, Space>>(dt, "cp.conv_dt: dt");
    f.dt_bias = view_of<Vec<const T, Space>>(dt_bias, "cp.conv_dt: dt_bias");
    f.dt_out = view_of<kdnn::Tensor3<T, Space>>(dt_out, "cp.conv_dt: dt_out");
    if (layout) {
      const cp::HaloPlan plan(comm_of(comm), *layout, int(w.shape(1)));
      cp::conv_dt_forward(space, plan, f, options);
    } else {
      cp::conv_dt_forward(space, comm_of(comm), f, options);
    }
  });
}

void conv_dt_backward(const Array& x, const Array& w, const Optional& bias, const Array& halo,
                      const Array& dy, const Array& dx, const Array& dw, const Optional& dbias,
                      const Array& dt, const Array& dt_bias, const Array& ddt_out, const Array& ddt,
                      const Array& ddt_bias, const Optional& seq_idx,
                      const cp::ConvDtOptions& options,
                      const std::optional<cp::SequenceLayout>& layout, std::int64_t comm,
                      std::uintptr_t stream) {
  dispatch(x, "cp.conv_dt backward: x", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    cp::ConvDtBackward<T, Space> b;
    // The forward's halo is the conv's initial state on this rank.
    b.conv = conv_backward_arguments<T, Space>("cp.conv_dt", x, w, bias, halo, dy, std::nullopt, dx,
                                               dw, dbias, std::nullopt);
    b.conv.seq_idx =
        view_of<kdnn::Matrix<const int, Space>>(seq_idx, "cp.conv_dt backward: seq_idx");
    b.dt = view_of<In3<T, Space>>(dt, "cp.conv_dt backward: dt");
    b.dt_bias = view_of<Vec<const T, Space>>(dt_bias, "cp.conv_dt backward: dt_bias");
    b.ddt_out = view_of<In3<T, Space>>(ddt_out, "cp.conv_dt backward: grad of dt_out");
    b.ddt = view_of<kdnn::Tensor3<T, Space>>(ddt, "cp.conv_dt backward: ddt");
    b.ddt_bias = view_of<Vec<T, Space>>(ddt_bias, "cp.conv_dt backward: ddt_bias");
    if (layout) {
      const cp::HaloPlan plan(comm_of(comm), *layout, int(w.shape(1)));
      cp::conv_dt_backward(space, plan, b, options);
    } else {
      cp::conv_dt_backward(space, comm_of(comm), b, options);
    }
  });
}

void ssd_forward(const Array& x, const Array& dt, const Array& A, const Array& B, const Array& C,
                 const Optional& D, const Optional& init, const Optional& dt_bias,
                 const Optional& z, const Array& y, const Array& final_state,
                 const Optional& y_ungated, const Optional& seq_idx, const Optional& cu_seqlens,
                 const Optional& sequence_states, const ssm::SsdOptions& options,
                 const std::optional<cp::SequenceLayout>& layout, std::int64_t comm,
                 std::uintptr_t stream) {
  dispatch(x, "cp.ssd: x", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    const SsdInputs in{x, dt, A, B, C, D, init, dt_bias, z};
    auto f = ssd_forward_arguments<T, Space>("cp.ssd", in, y, final_state, y_ungated);
    f.seq_idx = view_of<kdnn::Matrix<const int, Space>>(seq_idx, "cp.ssd: seq_idx");
    f.cu_seqlens = view_of<kdnn::Vector<const int, Space>>(cu_seqlens, "cp.ssd: cu_seqlens");
    f.sequence_states =
        view_of<kdnn::Tensor4<T, Space>>(sequence_states, "cp.ssd: sequence_states");
    if (layout) {
      cp::ssd_forward(space, comm_of(comm), *layout, f, options);
    } else {
      cp::ssd_forward(space, comm_of(comm), f, options);
    }
  });
}

void ssd_backward(const Array& x, const Array& dt, const Array& A, const Array& B, const Array& C,
                  const Optional& D, const Optional& init, const Optional& dt_bias,
                  const Optional& z, const Optional& y_ungated, const Array& dy,
                  const Optional& dfinal, const Array& dx, const Array& ddt, const Array& dA,
                  const Array& dB, const Array& dC, const Optional& dD, const Optional& dinit,
                  const Optional& ddt_bias, const Optional& dz, const Optional& seq_idx,
                  const ssm::SsdOptions& options, const std::optional<cp::SequenceLayout>& layout,
                  std::int64_t comm, std::uintptr_t stream) {
  dispatch(x, "cp.ssd backward: x", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    const SsdInputs in{x, dt, A, B, C, D, init, dt_bias, z};
    const SsdGradients out{dx, ddt, dA, dB, dC, dD, dinit, ddt_bias, dz};
    auto g = ssd_backward_arguments<T, Space>("cp.ssd", in, y_ungated, dy, dfinal, out);
    g.seq_idx = view_of<kdnn::Matrix<const int, Space>>(seq_idx, "cp.ssd backward: seq_idx");
    if (layout) {
      cp::ssd_backward(space, comm_of(comm), *layout, g, options);
    } else {
      cp::ssd_backward(space, comm_of(comm), g, options);
    }
  });
}

/// The options of a cp attention call as Python passes them.
cp::CpAttentionOptions attention_options(int comm_type, int gather_kv_heads,
                                         std::optional<std::int64_t> heads_comm,
                                         const std::optional<std::vector<std::int64_t>>& cu) {
  cp::CpAttentionOptions o;
  o.comm = cp::AttentionComm(comm_type);
  o.gather_kv_heads = gather_kv_heads;
  if (heads_comm) o.heads_comm = comm_of(*heads_comm);
  if (cu) o.cu_seqlens = *cu;
  return o;
}

void attention_forward(const StridedArray& q, const StridedArray& k, const StridedArray& v,
                       const StridedArray& o, const Array& lse, const Optional& sinks,
                       const kdnn::attention::FusedAttentionOptions& options,
                       const AttentionMaskArrays& mask, const cp::SequenceLayout& layout,
                       int comm_type, int gather_kv_heads, std::optional<std::int64_t> heads_comm,
                       const std::optional<std::vector<std::int64_t>>& cu_seqlens,
                       std::int64_t comm, std::uintptr_t stream) {
  constexpr const char* op = "cp.flash_attention";
  dispatch(q, "cp.flash_attention: q", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    using In = kdnn::StridedTensor4<const T, Space>;
    const auto name = [&](const char* array) { return std::string(op) + ": " + array; };
    const kdnn::attention::FusedAttentionForward<T, Space> f{
        view_of<In>(q, name("q")),
        view_of<In>(k, name("k")),
        view_of<In>(v, name("v")),
        view_of<kdnn::StridedTensor4<T, Space>>(o, name("out")),
        view_of<kdnn::Tensor3<T, Space>>(lse, name("lse")),
        mask.views<Space>(op),
        view_of<kdnn::Vector<const T, Space>>(sinks, name("sinks"))};
    const auto how = attention_options(comm_type, gather_kv_heads, heads_comm, cu_seqlens);
    const MPI_Comm c = comm_of(comm);
    cp::fused_attention_forward(space, c, layout, f, options, how);
  });
}

void attention_backward(const StridedArray& q, const StridedArray& k, const StridedArray& v,
                        const StridedArray& o, const Array& lse, const StridedArray& dout,
                        const StridedArray& dq, const StridedArray& dk, const StridedArray& dv,
                        const Optional& sinks, const Optional& dsinks,
                        const kdnn::attention::FusedAttentionOptions& options,
                        const AttentionMaskArrays& mask, const cp::SequenceLayout& layout,
                        int comm_type, int gather_kv_heads, std::optional<std::int64_t> heads_comm,
                        const std::optional<std::vector<std::int64_t>>& cu_seqlens,
                        std::int64_t comm, std::uintptr_t stream) {
  constexpr const char* op = "cp.flash_attention backward";
  dispatch(q, "cp.flash_attention backward: q", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    using In = kdnn::StridedTensor4<const T, Space>;
    using Out = kdnn::StridedTensor4<T, Space>;
    const auto name = [&](const char* array) { return std::string(op) + ": " + array; };
    const kdnn::attention::FusedAttentionBackward<T, Space> b{
        view_of<In>(q, name("q")),
        view_of<In>(k, name("k")),
        view_of<In>(v, name("v")),
        view_of<In>(o, name("out")),
        view_of<kdnn::Tensor3<const T, Space>>(lse, name("lse")),
        view_of<In>(dout, name("grad")),
        view_of<Out>(dq, name("dq")),
        view_of<Out>(dk, name("dk")),
        view_of<Out>(dv, name("dv")),
        mask.views<Space>(op),
        view_of<kdnn::Vector<const T, Space>>(sinks, name("sinks")),
        view_of<kdnn::Vector<T, Space>>(dsinks, name("dsinks"))};
    const auto how = attention_options(comm_type, gather_kv_heads, heads_comm, cu_seqlens);
    const MPI_Comm c = comm_of(comm);
    cp::fused_attention_backward(space, c, layout, b, options, how);
  });
}

/// whole [1, S, E] ← every rank's local [1, L_r, E] (its steps of `layout`).
void gather(const Array& local, const Array& whole, const cp::SequenceLayout& layout,
            std::int64_t comm, std::uintptr_t stream) {
  dispatch(local, "cp.gather: x", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    const auto from = view_of<kdnn::Tensor3<const T, Space>>(local, "cp.gather: x");
    const auto to = view_of<kdnn::Tensor3<T, Space>>(whole, "cp.gather: out");
    const MPI_Comm c = comm_of(comm);
    cp::gather(space, c, layout, from, to);
  });
}

}  // namespace

/// _kdnn.SequenceLayout: kdnn::cp::SequenceLayout, each segment a pair
/// (begin, end) of global steps.
void bind_sequence_layout(nb::module_& m) {
  using Pairs = std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>>;
  nb::class_<cp::SequenceLayout>(m, "SequenceLayout")
      .def(
          "__init__",
          [](cp::SequenceLayout* self, const Pairs& per_rank) {
            std::vector<std::vector<cp::Segment>> segments;
            for (const auto& list : per_rank) {
              segments.emplace_back();
              for (const auto& [b, e] : list) segments.back().push_back({b, e});
            }
            new (self) cp::SequenceLayout(std::move(segments));
          },
          "segments"_a)
      .def_static("contiguous", &cp::SequenceLayout::contiguous, "lengths"_a)
      .def_static("load_balanced", &cp::SequenceLayout::load_balanced, "length"_a, "ranks"_a)
      .def_prop_ro("ranks", &cp::SequenceLayout::ranks)
      .def_prop_ro("length", &cp::SequenceLayout::length)
      .def("local_steps", &cp::SequenceLayout::local_steps, "rank"_a)
      .def(
          "segments",
          [](const cp::SequenceLayout& l, int rank) {
            if (rank < 0 || rank >= l.ranks()) {
              kdnn::fail("SequenceLayout.segments: rank=", rank, ", expected 0 <= rank < ",
                         l.ranks());
            }
            std::vector<std::pair<std::int64_t, std::int64_t>> out;
            for (const cp::Segment& s : l.segments(rank)) out.emplace_back(s.begin, s.end);
            return out;
          },
          "rank"_a)
      .def("__eq__",
           [](const cp::SequenceLayout& a, const cp::SequenceLayout& b) { return a == b; });
}

// Tensors positionally (None for an optional one), then the options
// (_kdnn.ConvDtOptions, SsdOptions), the communicator's Fortran handle and
// PyTorch's stream.
void bind_cp(nb::module_& m) {
  bind_sequence_layout(m);
  m.def("cp_agree", &agree, "message"_a.none(), "comm"_a);
  m.def("cp_flash_attention_forward", &attention_forward, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a,
        "sinks"_a.none(), "options"_a, "mask"_a, "layout"_a, "comm_type"_a, "gather_kv_heads"_a,
        "heads_comm"_a.none(), "cu_seqlens"_a.none(), "comm"_a, "stream"_a);
  m.def("cp_flash_attention_backward", &attention_backward, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a,
        "dout"_a, "dq"_a, "dk"_a, "dv"_a, "sinks"_a.none(), "dsinks"_a.none(), "options"_a,
        "mask"_a, "layout"_a, "comm_type"_a, "gather_kv_heads"_a, "heads_comm"_a.none(),
        "cu_seqlens"_a.none(), "comm"_a, "stream"_a);
  m.def("cp_gather", &gather, "x"_a, "out"_a, "layout"_a, "comm"_a, "stream"_a);
  m.def("cp_conv_dt_forward", &conv_dt_forward, "x"_a, "w"_a, "bias"_a.none(), "dt"_a, "dt_bias"_a,
        "y"_a, "halo"_a, "dt_out"_a, "seq_idx"_a.none(), "options"_a, "layout"_a.none(), "comm"_a,
        "stream"_a);
  m.def("cp_conv_dt_backward", &conv_dt_backward, "x"_a, "w"_a, "bias"_a.none(), "halo"_a, "dy"_a,
        "dx"_a, "dw"_a, "dbias"_a.none(), "dt"_a, "dt_bias"_a, "ddt_out"_a, "ddt"_a, "ddt_bias"_a,
        "seq_idx"_a.none(), "options"_a, "layout"_a.none(), "comm"_a, "stream"_a);
  m.def("cp_ssd_forward", &ssd_forward, "x"_a, "dt"_a, "A"_a, "B"_a, "C"_a, "D"_a.none(),
        "init"_a.none(), "dt_bias"_a.none(), "z"_a.none(), "y"_a, "final_state"_a,
        "y_ungated"_a.none(), "seq_idx"_a.none(), "cu_seqlens"_a.none(), "sequence_states"_a.none(),
        "options"_a, "layout"_a.none(), "comm"_a, "stream"_a);
  m.def("cp_ssd_backward", &ssd_backward, "x"_a, "dt"_a, "A"_a, "B"_a, "C"_a, "D"_a.none(),
        "init"_a.none(), "dt_bias"_a.none(), "z"_a.none(), "y_ungated"_a.none(), "dy"_a,
        "dfinal"_a.none(), "dx"_a, "ddt"_a, "dA"_a, "dB"_a, "dC"_a, "dD"_a.none(), "dinit"_a.none(),
        "ddt_bias"_a.none(), "dz"_a.none(), "seq_idx"_a.none(), "options"_a, "layout"_a.none(),
        "comm"_a, "stream"_a);
}

}  // namespace kdnn_python
