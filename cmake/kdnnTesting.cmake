# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# kdnn_add_mpi_test(NAME <name> [RANKS <n>...] COMMAND <program> [<arg>...])
# Registers one ctest test per rank count, <name>.np<n> (default ranks 1 2 3 4),
# run by mpiexec with oversubscription allowed (more ranks than cores) and one
# OpenMP thread per rank. Does nothing when kdnn is built without MPI.
include_guard(GLOBAL)

function(kdnn_add_mpi_test)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "NAME" "RANKS;COMMAND")
  if(NOT KDNN_ENABLE_MPI)
    return()
  endif()
  if(NOT arg_NAME OR NOT arg_COMMAND)
    message(FATAL_ERROR "kdnn_add_mpi_test: NAME and COMMAND are required")
  endif()
  if(NOT arg_RANKS)
    set(arg_RANKS 1 2 3 4)
  endif()
  foreach(ranks IN LISTS arg_RANKS)
    set(test ${arg_NAME}.np${ranks})
    add_test(NAME ${test}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${MPIEXEC_PREFLAGS}
              ${arg_COMMAND} ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${test} PROPERTIES ENVIRONMENT
      "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMP_NUM_THREADS=1")
  endforeach()
endfunction()
