// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include "kokkos_args.hpp"

#include <cctype>
#include <charconv>
#include <climits>
#include <optional>

namespace kdnn::cli {

namespace {

/// `text` as an int >= min, all of it (no sign other than a minus, no spaces).
std::optional<int> int_at_least(const std::string& text, int min) {
  int value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || value < min) return std::nullopt;
  return value;
}

struct IntegerArg {
  const char* name;
  int min;           ///< 1 for counts, 0 for device ids
  bool skip_device;  ///< N[,S]: a count then, optionally, a device id
};

constexpr IntegerArg kIntegerArgs[] = {
    {"--kokkos-threads", 1, false},    {"--kokkos-num-threads", 1, false},
    {"--kokkos-numa", 1, false},       {"--kokkos-device-id", 0, false},
    {"--kokkos-device", 0, false},     {"--kokkos-skip-device", 0, false},
    {"--kokkos-num-devices", 1, true}, {"--kokkos-ndevices", 1, true},
};

/// Whether Kokkos takes `arg` as the argument `name`: the name, then the end
/// or a character that cannot continue a name (as Kokkos' check_arg).
bool names(const std::string& arg, const std::string& name) {
  if (arg.compare(0, name.size(), name) != 0) return false;
  if (arg.size() == name.size()) return true;
  const unsigned char next = static_cast<unsigned char>(arg[name.size()]);
  return !(std::isalnum(next) || next == '-' || next == '_');
}

}  // namespace

void check_kokkos_arg(const std::string& arg) {
  for (const IntegerArg& a : kIntegerArgs) {
    const std::string name = a.name;
    if (!names(arg, name)) continue;
    bool ok = arg.size() > name.size() && arg[name.size()] == '=';
    if (ok) {
      const std::string value = arg.substr(name.size() + 1);
      const std::size_t comma = a.skip_device ? value.find(',') : std::string::npos;
      ok = int_at_least(value.substr(0, comma), a.min).has_value() &&
           (comma == std::string::npos || int_at_least(value.substr(comma + 1), 0).has_value());
    }
    if (!ok) {
      usage_fail(name, ": expected ", name, a.skip_device ? "=N[,S]" : "=N",
                 ", N an integer >= ", a.min, a.skip_device ? " and S >= 0" : "", " (at most ",
                 INT_MAX, "), got '", arg, "'");
    }
    return;
  }
}

}  // namespace kdnn::cli
