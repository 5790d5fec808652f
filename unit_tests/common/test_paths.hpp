// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Where the tests find their files. The build directory's paths are compiled
// in; the environment can point elsewhere, for binaries run from a copy of
// the repository on another machine (scripts/gpu-check.sh).
#include <cstdlib>
#include <string>

namespace kdnn_test {

inline std::string env_or(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value && *value ? value : fallback;
}

#ifdef KDNN_TEST_DATA_DIR
/// unit_tests/data (KDNN_TEST_DATA_DIR).
inline std::string data_dir() { return env_or("KDNN_TEST_DATA_DIR", KDNN_TEST_DATA_DIR); }
#endif

}  // namespace kdnn_test
