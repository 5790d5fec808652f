// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::Error: the one exception type kdnn throws for invalid arguments and
// unsupported configurations. Messages name the operation, the argument, the
// expected and the actual value, e.g.
//   "sinkhorn::backward: G has extent(1)=5, expected 4 (same as R)".
#include <sstream>
#include <stdexcept>
#include <string>

namespace kdnn {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
inline void append(std::ostringstream&) {}
template <class Head, class... Tail>
void append(std::ostringstream& os, const Head& head, const Tail&... tail) {
  os << head;
  append(os, tail...);
}
}  // namespace detail

/// The streamed concatenation of the parts: the message of kdnn::fail, and
/// of any other exception built the same way.
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  detail::append(os, parts...);
  return os.str();
}

/// Throws kdnn::Error with the streamed concatenation of the parts.
template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw Error(concat(parts...));
}

}  // namespace kdnn
