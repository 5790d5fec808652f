# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# The instruction set kdnn's host kernels are compiled for.
#
# kdnn's host kernels (the fused attention, the Sinkhorn sweeps, the conv and
# SSD loops) are written for the compiler's auto-vectoriser: built for the
# baseline x86-64 ISA they get 16-byte vectors and no FMA, and the attention
# layer runs about 2x slower than built for the node it runs on. HPC builds
# usually target the node's ISA, so kdnn does too unless told otherwise:
#
#   kdnn_HOST_ARCH=native   (default) -march=native: the ISA of the machine
#                           that builds kdnn. The library and everything
#                           compiled against it then need that ISA (or a
#                           superset) to run.
#   kdnn_HOST_ARCH=<name>   -march=<name>, e.g. x86-64-v3 or znver3, to build
#                           on one machine for another.
#   kdnn_HOST_ARCH=         (empty) no flag: the compiler's default, or the
#                           host architecture Kokkos was configured with.
#
# The default is empty when Kokkos already names an architecture
# (Kokkos_ARCH_*: its flags then reach kdnn through Kokkos::kokkos), when
# Kokkos has a GPU backend (host flags would have to pass through the device
# compiler), or when the compiler does not accept -march.
#
# The flag is a usage requirement of kdnn::kdnn (as Kokkos' own architecture
# flags are of Kokkos::kokkos): code that includes kdnn's headers is compiled
# for the same ISA, which config.hpp's host vector width assumes.
include_guard(GLOBAL)
include(CheckCXXCompilerFlag)

set(_kdnn_host_arch_default "")
set(_kdnn_kokkos_gpu OFF)
foreach(_dev IN LISTS Kokkos_DEVICES)
  if(_dev MATCHES "^(CUDA|HIP|SYCL|OPENMPTARGET|OPENACC)$")
    set(_kdnn_kokkos_gpu ON)
  endif()
endforeach()
if(NOT _kdnn_kokkos_gpu AND "${Kokkos_ARCH}" STREQUAL "")
  check_cxx_compiler_flag("-march=native" KDNN_COMPILER_ACCEPTS_MARCH_native)
  if(KDNN_COMPILER_ACCEPTS_MARCH_native)
    set(_kdnn_host_arch_default native)
  endif()
endif()
set(kdnn_HOST_ARCH "${_kdnn_host_arch_default}" CACHE STRING
  "Host ISA of kdnn's kernels: -march=<value> (native: the building machine), empty for none")

set(KDNN_HOST_ARCH_FLAGS "")
if(NOT "${kdnn_HOST_ARCH}" STREQUAL "")
  set(KDNN_HOST_ARCH_FLAGS "-march=${kdnn_HOST_ARCH}")
  string(MAKE_C_IDENTIFIER "KDNN_COMPILER_ACCEPTS_MARCH_${kdnn_HOST_ARCH}" _kdnn_accepts)
  check_cxx_compiler_flag("${KDNN_HOST_ARCH_FLAGS}" ${_kdnn_accepts})
  if(NOT ${_kdnn_accepts})
    message(FATAL_ERROR "kdnn: the compiler rejects ${KDNN_HOST_ARCH_FLAGS} "
      "(kdnn_HOST_ARCH=${kdnn_HOST_ARCH}); set kdnn_HOST_ARCH to an architecture it knows, "
      "or to an empty value for none")
  endif()
endif()
message(STATUS "kdnn: host ISA flags: ${KDNN_HOST_ARCH_FLAGS} (kdnn_HOST_ARCH=${kdnn_HOST_ARCH})")
