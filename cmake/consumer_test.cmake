# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# ctest driver: install the kdnn build tree into a scratch prefix, then
# configure, build and run examples/consumer against it with find_package.
# Variables: KDNN_BUILD_DIR, KDNN_SOURCE_DIR, WORK_DIR, WITH_CP (ON/OFF).
file(REMOVE_RECURSE "${WORK_DIR}")
foreach(step
    "${CMAKE_COMMAND};--install;${KDNN_BUILD_DIR};--prefix;${WORK_DIR}/prefix"
    "${CMAKE_COMMAND};-S;${KDNN_SOURCE_DIR}/examples/consumer;-B;${WORK_DIR}/build;-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix;-DCMAKE_BUILD_TYPE=Release;-DWITH_CP=${WITH_CP}"
    "${CMAKE_COMMAND};--build;${WORK_DIR}/build"
    "${WORK_DIR}/build/kdnn_consumer")
  execute_process(COMMAND ${step} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer test: step failed (${rc}): ${step}")
  endif()
endforeach()
