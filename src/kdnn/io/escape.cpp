// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include "kdnn/io/escape.hpp"

namespace kdnn::io {

std::string escape_bytes(std::string_view bytes) {
  constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size());
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    if (b == '\\') {
      out += "\\\\";
    } else if (b >= 0x20 && b <= 0x7e) {
      out += c;
    } else {
      out += {'\\', 'x', kHex[b >> 4], kHex[b & 0xf]};
    }
  }
  return out;
}

}  // namespace kdnn::io
