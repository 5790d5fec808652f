// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// KDNN_TEST_NEEDS_ALL_SIZES(): the first statement of a test that states a
// form's full size lists (which sizes dispatch to which compiled kernel) or
// runs a form at sizes only those lists hold. A build with
// kdnn_COMPILED_SIZES=corners compiles two tuples per form
// (core/impl/forms.hpp: the CI's CUDA compile and its OpenMP suite, whose
// subject is the threads, not the lists) and skips such a test; the serial
// preset, which compiles every size, runs it.
#include <gtest/gtest.h>

#include "kdnn/config.hpp"

#define KDNN_TEST_NEEDS_ALL_SIZES()                                                             \
  do {                                                                                          \
    if (KDNN_COMPILED_SIZE_CORNERS)                                                             \
      GTEST_SKIP() << "states or runs sizes that kdnn_COMPILED_SIZES=corners does not compile"; \
  } while (0)
