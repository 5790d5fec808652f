// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The per-backend locks of core/impl/space_mutex.hpp, defined once so that
// every piece of a program that calls kdnn shares them.
#include "kdnn/core/impl/space_mutex.hpp"

#include <map>
#include <mutex>
#include <string>

namespace kdnn::impl {

std::recursive_mutex& space_mutex(const char* space_name) {
  static std::mutex guard;
  // Never destroyed: a thread may still run a kdnn call while static objects
  // are destroyed at exit.
  static auto* const locks = new std::map<std::string, std::recursive_mutex>();
  const std::lock_guard<std::mutex> hold(guard);
  return (*locks)[space_name];
}

}  // namespace kdnn::impl
