#include "cli.hpp"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <limits>
#include <sstream>

#include "kdnn/core/error.hpp"

namespace kdnn::cli {

namespace fs = std::filesystem;

namespace {

/// `text` as a T when it is exactly one (no spaces, signs of other types, hex).
template <class T>
std::optional<T> parse_number(const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

/// Extra arguments, left by CLI11 (allow_extras) so that they get our words.
void reject_extras(const Args& extras) {
  if (extras.empty()) return;
  const std::string& arg = extras.front();
  if (arg.rfind('-', 0) == 0) usage_fail("unknown option '", arg.substr(0, arg.find('=')), "'");
  usage_fail("unexpected argument '", arg, "'");
}

}  // namespace

bool parse(CLI::App& app, const Args& args, const char* help) {
  app.allow_extras();
  Args reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::cout << help;
    return false;
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  reject_extras(app.remaining());
  return true;
}

CLI::Validator integer_at_least(int min) {
  const auto check = [min](std::string& text) {
    const auto value = parse_number<int>(text);
    if (value && *value >= min) return std::string();
    return "expected an integer >= " + std::to_string(min) + " (at most " +
           std::to_string(std::numeric_limits<int>::max()) + "), got '" + text + "'";
  };
  return CLI::Validator(check, "");
}

CLI::Validator finite_in(double min, double max) {
  const auto check = [min, max](std::string& text) {
    const auto value = parse_number<double>(text);
    if (value && std::isfinite(*value) && *value >= min && *value <= max) return std::string();
    std::ostringstream os;
    os << "expected a finite number >= " << min;
    if (max < std::numeric_limits<double>::infinity()) os << " and <= " << max;
    os << ", got '" << text << "'";
    return os.str();
  };
  return CLI::Validator(check, "");
}

CLI::Validator finite_at_least(double min) {
  return finite_in(min, std::numeric_limits<double>::infinity());
}

CLI::Validator not_an_option() {
  const auto check = [](std::string& text) {
    if (!text.empty() && text[0] != '-') return std::string();
    return "requires a value, got '" + text + "'";
  };
  return CLI::Validator(check, "");
}

void require_directory(const std::string& option, const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail(option, " '", dir, "' is not an existing directory");
}

std::optional<io::NpyArray> read_input(const std::string& dir, const std::string& name,
                                       bool optional) {
  const fs::path path = fs::path(dir) / name;
  // Absent only when there is no directory entry at all: anything under the
  // name (a dangling link, a FIFO, ...) goes to read_npy, which says why it
  // cannot be read.
  std::error_code ec;
  if (fs::symlink_status(path, ec).type() == fs::file_type::not_found) {
    if (optional) return std::nullopt;
    fail("missing input ", path.string());
  }
  return io::read_npy(path.string());
}

void write_outputs(const std::string& dir, const std::vector<Output>& outputs) {
  std::vector<io::NpyFile> files;
  for (const Output& out : outputs) {
    files.push_back({(fs::path(dir) / out.name).string(), out.array});
    // rename() cannot replace a directory: refuse before writing anything.
    std::error_code ec;
    if (fs::is_directory(files.back().path, ec)) {
      fail(files.back().path, ": cannot replace a directory with the output");
    }
  }
  io::write_npy_files(files);
}

}  // namespace kdnn::cli
