# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# kdnn_host_only(<source>...): sources that include neither Kokkos nor
# device code. When the C++ compiler is Kokkos' nvcc_wrapper (a CUDA build),
# they are compiled by its host compiler alone (--host-only): nvcc would add
# its own front end and device passes to each, for nothing. Other compilers
# compile them as any source.
include_guard(GLOBAL)

if(NOT DEFINED KDNN_COMPILER_TAKES_HOST_ONLY)
  # nvcc_wrapper accepts --host-only; a plain host compiler refuses it.
  file(WRITE ${CMAKE_BINARY_DIR}/CMakeFiles/kdnn_host_only.cpp "int main() { return 0; }\n")
  execute_process(
    COMMAND ${CMAKE_CXX_COMPILER} --host-only -c ${CMAKE_BINARY_DIR}/CMakeFiles/kdnn_host_only.cpp
            -o ${CMAKE_BINARY_DIR}/CMakeFiles/kdnn_host_only.o
    RESULT_VARIABLE result OUTPUT_QUIET ERROR_QUIET)
  if(result EQUAL 0)
    set(KDNN_COMPILER_TAKES_HOST_ONLY ON CACHE INTERNAL "The C++ compiler is nvcc_wrapper")
  else()
    set(KDNN_COMPILER_TAKES_HOST_ONLY OFF CACHE INTERNAL "The C++ compiler is nvcc_wrapper")
  endif()
endif()

function(kdnn_host_only)
  if(KDNN_COMPILER_TAKES_HOST_ONLY)
    set_property(SOURCE ${ARGN} APPEND PROPERTY COMPILE_OPTIONS --host-only)
  endif()
endfunction()
