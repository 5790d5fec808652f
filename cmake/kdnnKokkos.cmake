# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# Finds Kokkos (and, when present, Kokkos Kernels) and makes `Kokkos::kokkos`
# usable whichever way it was installed: a CMake-built Kokkos 3.x/4.x exports
# a correct target; Debian's TriBITS-built libtrilinos-kokkos-dev exports
# `Kokkos::kokkos` with a non-existent include directory (<prefix>/lib/include)
# while the headers live in Kokkos_INCLUDE_DIRS (/usr/include/trilinos).
# This file is installed with kdnn and included by kdnnConfig.cmake, so
# consumers get the same repair. Kokkos Kernels (kdnn's GEMMs) is required
# and must come from the same installation; `kdnn_kokkoskernels_target` names
# its library target.
include_guard(GLOBAL)

find_package(Kokkos REQUIRED)

if(TARGET Kokkos::kokkos)
  get_target_property(_kdnn_kokkos_inc Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
  set(_kdnn_kokkos_fixed_inc "")
  set(_kdnn_kokkos_needs_fix OFF)
  foreach(_dir IN LISTS _kdnn_kokkos_inc)
    if(_dir MATCHES "^\\$<" OR EXISTS "${_dir}")
      list(APPEND _kdnn_kokkos_fixed_inc "${_dir}")
    else()
      set(_kdnn_kokkos_needs_fix ON)
    endif()
  endforeach()
  if(_kdnn_kokkos_needs_fix)
    foreach(_dir IN LISTS Kokkos_INCLUDE_DIRS)
      if(EXISTS "${_dir}")
        list(APPEND _kdnn_kokkos_fixed_inc "${_dir}")
      endif()
    endforeach()
    set_target_properties(Kokkos::kokkos PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${_kdnn_kokkos_fixed_inc}")
    message(STATUS "kdnn: repaired Kokkos::kokkos include dirs -> ${_kdnn_kokkos_fixed_inc}")
  endif()
else()
  message(FATAL_ERROR "kdnn: Kokkos was found but exports no Kokkos::kokkos target")
endif()

# Kokkos Kernels, from the installation Kokkos came from and nowhere else: a
# search with default paths would fall back to another installation (say the
# distribution's 3.4 Kernels under a user's Kokkos 4) and mix the two
# versions' headers silently. Defines `kdnn_kokkoskernels_target`, which
# kdnn links publicly.
set(kdnn_kokkoskernels_target "")
get_filename_component(_kdnn_kokkos_prefix "${Kokkos_DIR}/../../.." ABSOLUTE)
# Its package directory sits beside Kokkos' (<libdir>/cmake/KokkosKernels, also
# on multiarch Debian, where <libdir> is lib/x86_64-linux-gnu), or under the
# same prefix.
find_package(KokkosKernels QUIET PATHS "${Kokkos_DIR}/.." "${_kdnn_kokkos_prefix}"
  NO_DEFAULT_PATH)
if(KokkosKernels_FOUND)
  if(KokkosKernels_VERSION AND Kokkos_VERSION)
    string(REGEX MATCH "^[0-9]+\\.[0-9]+" _kdnn_kk_mm "${KokkosKernels_VERSION}")
    string(REGEX MATCH "^[0-9]+\\.[0-9]+" _kdnn_kokkos_mm "${Kokkos_VERSION}")
    if(NOT _kdnn_kk_mm STREQUAL _kdnn_kokkos_mm)
      message(FATAL_ERROR "kdnn: Kokkos Kernels ${KokkosKernels_VERSION} (${KokkosKernels_DIR}) "
        "does not match Kokkos ${Kokkos_VERSION} (${Kokkos_DIR}); install both from one release")
    endif()
  endif()
  if(TARGET Kokkos::kokkoskernels)
    set(kdnn_kokkoskernels_target Kokkos::kokkoskernels)
  elseif(TARGET trilinos_kokkoskernels)
    # Debian's TriBITS export: the library target carries no include dirs.
    set_property(TARGET trilinos_kokkoskernels APPEND PROPERTY
      INTERFACE_INCLUDE_DIRECTORIES "${KokkosKernels_INCLUDE_DIRS}")
    set(kdnn_kokkoskernels_target trilinos_kokkoskernels)
  endif()
endif()
if(NOT kdnn_kokkoskernels_target)
  message(FATAL_ERROR "kdnn: Kokkos Kernels not found in the Kokkos installation "
    "${_kdnn_kokkos_prefix} (Kokkos_DIR=${Kokkos_DIR}); kdnn's GEMMs need it. Install it "
    "from the same release as Kokkos (Debian: libtrilinos-kokkos-kernels-dev)")
endif()
