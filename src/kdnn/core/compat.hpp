#pragma once
// The few spellings that differ between Kokkos 3.4 (the distribution's) and
// Kokkos 4.x. Kernels use kdnn::compat::exp etc., never the namespaced
// Kokkos functions directly.
#include <Kokkos_Core.hpp>

namespace kdnn::compat {

#if KOKKOS_VERSION >= 40000
using Kokkos::exp;
using Kokkos::fabs;
using Kokkos::log;
using Kokkos::sqrt;
#else
using Kokkos::Experimental::exp;
using Kokkos::Experimental::fabs;
using Kokkos::Experimental::log;
using Kokkos::Experimental::sqrt;
#endif

}  // namespace kdnn::compat
