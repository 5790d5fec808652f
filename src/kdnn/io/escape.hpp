// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Text read from a file, made safe to show in a message: a NUL byte would end
// what() (a C string) and cut the message short, and control bytes (ESC
// sequences, newlines) from a crafted file would reach the user's terminal.
#include <string>
#include <string_view>

namespace kdnn::io {

/// `bytes` with printable ASCII (0x20 to 0x7e) as is, except the backslash,
/// which becomes "\\"; every other byte becomes "\xNN" in lowercase hex
/// (NUL "\x00", ESC "\x1b", newline "\x0a", 0xff "\xff"). The result is
/// printable ASCII, and the escaping can be undone.
std::string escape_bytes(std::string_view bytes);

}  // namespace kdnn::io
