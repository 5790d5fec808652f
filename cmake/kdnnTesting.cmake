# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# How kdnn's tests, the CLI tests and the demo launch MPI programs, defined
# once:
#
#   KDNN_MPI_ENVIRONMENT  the environment of every launch: Open MPI may run as
#                         root and with more ranks than cores, and each rank
#                         uses one OpenMP thread (a CMake list of NAME=VALUE,
#                         read from cmake/mpi-test-environment, which
#                         scripts/check-python.sh reads too)
#   kdnn_mpi_command(<out> RANKS <n> COMMAND <program> [<arg>...])
#                         sets <out> to the command line (a list) that runs
#                         <program> on <n> ranks in that environment
#   kdnn_add_mpi_test(NAME <name> [RANKS <n>...] COMMAND <program> [<arg>...])
#                         registers one ctest test per rank count,
#                         <name>.np<n> (default ranks 1 2 3 4); does nothing
#                         when kdnn is built without MPI
include_guard(GLOBAL)

file(STRINGS "${CMAKE_CURRENT_LIST_DIR}/mpi-test-environment" KDNN_MPI_ENVIRONMENT REGEX "^[A-Za-z_]")

function(kdnn_mpi_command out)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "RANKS" "COMMAND")
  if(NOT arg_RANKS OR NOT arg_COMMAND)
    message(FATAL_ERROR "kdnn_mpi_command: RANKS and COMMAND are required")
  endif()
  set(${out} ${CMAKE_COMMAND} -E env ${KDNN_MPI_ENVIRONMENT}
      ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${arg_RANKS} ${MPIEXEC_PREFLAGS}
      ${arg_COMMAND} ${MPIEXEC_POSTFLAGS} PARENT_SCOPE)
endfunction()

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
    kdnn_mpi_command(command RANKS ${ranks} COMMAND ${arg_COMMAND})
    add_test(NAME ${arg_NAME}.np${ranks} COMMAND ${command})
    # A hang (a rank left waiting in a collective) fails the test instead of
    # stalling the run: every MPI test ends within five minutes.
    set_tests_properties(${arg_NAME}.np${ranks} PROPERTIES TIMEOUT 300)
  endforeach()
endfunction()
