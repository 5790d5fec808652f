// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The extension module kdnn._kdnn: Kokkos' lifetime, kdnn::Error as the
// Python exception kdnn.Error (a ValueError), the options structs the
// operators take (options.cpp), and the operator families' bindings
// (sinkhorn.cpp, attention.cpp, mha.cpp, mamba2.cpp, and cp.cpp with MPI).
// The autograd functions that call them are Python (python/kdnn/).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <Kokkos_Core.hpp>
#include <string>

#include "kdnn/config.hpp"
#include "kdnn/core/error.hpp"
#include "lifetime.hpp"
#include "options.hpp"

namespace nb = nanobind;

namespace kdnn_python {
void bind_sinkhorn(nb::module_& m);
void bind_attention(nb::module_& m);
void bind_mha(nb::module_& m);
void bind_mamba2(nb::module_& m);
#ifdef KDNN_ENABLE_MPI
void bind_cp(nb::module_& m);
#endif
}  // namespace kdnn_python

NB_MODULE(_kdnn, m) {
  m.doc() = "kdnn's operators on DLPack arrays (use the kdnn package, not this module)";
  nb::exception<kdnn::Error>(m, "Error", PyExc_ValueError);

  // Kokkos starts with the module and ends at interpreter exit, after the
  // calls in flight (lifetime.hpp).
  kdnn_python::Lifetime::instance().start();
  m.def("finalize", [] {
    const nb::gil_scoped_release unlocked;
    kdnn_python::Lifetime::instance().finish();
  });
  m.def("backend", [] { return std::string(Kokkos::DefaultExecutionSpace::name()); });
  m.def("host_backend", [] { return std::string(Kokkos::DefaultHostExecutionSpace::name()); });
  m.attr("version") = KDNN_VERSION_STRING;

  kdnn_python::bind_options(m);  // first: the operators take its classes
  kdnn_python::bind_sinkhorn(m);
  kdnn_python::bind_attention(m);
  kdnn_python::bind_mha(m);
  kdnn_python::bind_mamba2(m);
#ifdef KDNN_ENABLE_MPI
  kdnn_python::bind_cp(m);
  m.attr("has_cp") = true;
#else
  m.attr("has_cp") = false;
#endif
}
