// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// kdnn::cp's context-parallel Mamba-2 operators (kdnn.cp): the conv1d + dt
// softplus with its halo exchange and the SSD with its state passing, each
// rank holding its own steps, over the MPI communicator whose Fortran handle
// Python passes (mpi4py's comm.py2f()). Built when kdnn has kdnn::cp.
#include <mpi.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>

#include "kdnn/cp/cp.hpp"
#include "mamba2_arguments.hpp"
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
                     const Optional& seq_idx, const cp::ConvDtOptions& options, std::int64_t comm,
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
    cp::conv_dt_forward(space, comm_of(comm), f, options);
  });
}

void conv_dt_backward(const Array& x, const Array& w, const Optional& bias, const Array& halo,
                      const Array& dy, const Array& dx, const Array& dw, const Optional& dbias,
                      const Array& dt, const Array& dt_bias, const Array& ddt_out, const Array& ddt,
                      const Array& ddt_bias, const Optional& seq_idx,
                      const cp::ConvDtOptions& options, std::int64_t comm, std::uintptr_t stream) {
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
    cp::conv_dt_backward(space, comm_of(comm), b, options);
  });
}

void ssd_forward(const Array& x, const Array& dt, const Array& A, const Array& B, const Array& C,
                 const Optional& D, const Optional& init, const Optional& dt_bias,
                 const Optional& z, const Array& y, const Array& final_state,
                 const Optional& y_ungated, const Optional& seq_idx, const Optional& cu_seqlens,
                 const Optional& sequence_states, const ssm::SsdOptions& options, std::int64_t comm,
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
    cp::ssd_forward(space, comm_of(comm), f, options);
  });
}

void ssd_backward(const Array& x, const Array& dt, const Array& A, const Array& B, const Array& C,
                  const Optional& D, const Optional& init, const Optional& dt_bias,
                  const Optional& z, const Optional& y_ungated, const Array& dy,
                  const Optional& dfinal, const Array& dx, const Array& ddt, const Array& dA,
                  const Array& dB, const Array& dC, const Optional& dD, const Optional& dinit,
                  const Optional& ddt_bias, const Optional& dz, const Optional& seq_idx,
                  const ssm::SsdOptions& options, std::int64_t comm, std::uintptr_t stream) {
  dispatch(x, "cp.ssd backward: x", stream, [&](auto space, auto zero) {
    using Space = decltype(space);
    using T = decltype(zero);
    const SsdInputs in{x, dt, A, B, C, D, init, dt_bias, z};
    const SsdGradients out{dx, ddt, dA, dB, dC, dD, dinit, ddt_bias, dz};
    auto g = ssd_backward_arguments<T, Space>("cp.ssd", in, y_ungated, dy, dfinal, out);
    g.seq_idx = view_of<kdnn::Matrix<const int, Space>>(seq_idx, "cp.ssd backward: seq_idx");
    cp::ssd_backward(space, comm_of(comm), g, options);
  });
}

}  // namespace

// Tensors positionally (None for an optional one), then the options
// (_kdnn.ConvDtOptions, SsdOptions), the communicator's Fortran handle and
// PyTorch's stream.
void bind_cp(nb::module_& m) {
  m.def("cp_agree", &agree, "message"_a.none(), "comm"_a);
  m.def("cp_conv_dt_forward", &conv_dt_forward, "x"_a, "w"_a, "bias"_a.none(), "dt"_a, "dt_bias"_a,
        "y"_a, "halo"_a, "dt_out"_a, "seq_idx"_a.none(), "options"_a, "comm"_a, "stream"_a);
  m.def("cp_conv_dt_backward", &conv_dt_backward, "x"_a, "w"_a, "bias"_a.none(), "halo"_a, "dy"_a,
        "dx"_a, "dw"_a, "dbias"_a.none(), "dt"_a, "dt_bias"_a, "ddt_out"_a, "ddt"_a, "ddt_bias"_a,
        "seq_idx"_a.none(), "options"_a, "comm"_a, "stream"_a);
  m.def("cp_ssd_forward", &ssd_forward, "x"_a, "dt"_a, "A"_a, "B"_a, "C"_a, "D"_a.none(),
        "init"_a.none(), "dt_bias"_a.none(), "z"_a.none(), "y"_a, "final_state"_a,
        "y_ungated"_a.none(), "seq_idx"_a.none(), "cu_seqlens"_a.none(), "sequence_states"_a.none(),
        "options"_a, "comm"_a, "stream"_a);
  m.def("cp_ssd_backward", &ssd_backward, "x"_a, "dt"_a, "A"_a, "B"_a, "C"_a, "D"_a.none(),
        "init"_a.none(), "dt_bias"_a.none(), "z"_a.none(), "y_ungated"_a.none(), "dy"_a,
        "dfinal"_a.none(), "dx"_a, "ddt"_a, "dA"_a, "dB"_a, "dC"_a, "dD"_a.none(), "dinit"_a.none(),
        "ddt_bias"_a.none(), "dz"_a.none(), "seq_idx"_a.none(), "options"_a, "comm"_a, "stream"_a);
}

}  // namespace kdnn_python
