// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include "cli.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <limits>
#include <sstream>

#include <unistd.h>

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

/// The name of the validator not_an_option() returns.
constexpr const char* kNotAnOption = "not_an_option";

/// Whether `opt` was declared with ->check(not_an_option()).
bool refuses_dash_values(CLI::Option& opt) {
  try {
    opt.get_validator(kNotAnOption);
    return true;
  } catch (const CLI::OptionNotFound&) {
    return false;
  }
}

/// "--in --out DIR": an option of not_an_option() given alone, followed by
/// an argument that starts with '-' (CLI11 would take it as the value). The
/// `=` form ("--out=-dir") is unambiguous and not refused: CLI11 gives the
/// validator no way to tell the two forms apart, so the check is here.
void reject_swallowed_options(CLI::App& app, const Args& args) {
  for (std::size_t i = 0; i + 1 < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind('-', 0) != 0 || arg.find('=') != std::string::npos) continue;
    CLI::Option* opt = app.get_option_no_throw(arg);
    if (opt == nullptr || !refuses_dash_values(*opt)) continue;
    if (args[i + 1].rfind('-', 0) == 0) {
      usage_fail(opt->get_name(), ": requires a value, got '", args[i + 1], "'");
    }
  }
}

}  // namespace

bool parse(CLI::App& app, const Args& args, const char* help) {
  app.allow_extras();
  reject_swallowed_options(app, args);
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

namespace {

/// min <= x <= max (x < max when `open_max`), finite.
CLI::Validator finite_range(double min, double max, bool open_max) {
  const auto check = [min, max, open_max](std::string& text) {
    const auto value = parse_number<double>(text);
    if (value && std::isfinite(*value) && *value >= min &&
        (open_max ? *value < max : *value <= max)) {
      return std::string();
    }
    std::ostringstream os;
    os << "expected a finite number";
    if (min > -std::numeric_limits<double>::infinity()) os << " >= " << min;
    if (max < std::numeric_limits<double>::infinity()) {
      os << (min > -std::numeric_limits<double>::infinity() ? " and " : " ")
         << (open_max ? "< " : "<= ") << max;
    }
    os << ", got '" << text << "'";
    return os.str();
  };
  return CLI::Validator(check, "");
}

}  // namespace

CLI::Validator finite_in(double min, double max) { return finite_range(min, max, false); }

CLI::Validator finite_in_half_open(double min, double max) { return finite_range(min, max, true); }

CLI::Validator finite_at_least(double min) {
  return finite_in(min, std::numeric_limits<double>::infinity());
}

CLI::Validator finite() {
  return finite_in(-std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::infinity());
}

CLI::Validator unsigned_64() {
  const auto check = [](std::string& text) {
    if (parse_number<std::uint64_t>(text)) return std::string();
    return "expected an integer >= 0 (at most " +
           std::to_string(std::numeric_limits<std::uint64_t>::max()) + "), got '" + text + "'";
  };
  return CLI::Validator(check, "");
}

CLI::Validator not_an_option() {
  // A value starting with '-' given as a separate argument is refused by
  // parse() (reject_swallowed_options), which sees the arguments' form;
  // here it came from the `=` form.
  const auto check = [](std::string& text) {
    if (!text.empty()) return std::string();
    return std::string("requires a value, got ''");
  };
  return CLI::Validator(check, "", kNotAnOption);
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

std::vector<int> read_sequence_ids(const std::string& dir, const std::vector<std::size_t>& shape) {
  const auto ids = read_input(dir, "seq_idx.npy", true);
  if (!ids) return {};
  if (ids->shape != shape) {
    fail("seq_idx.npy has shape ", io::format_shape(ids->shape), ", expected ",
         io::format_shape(shape));
  }
  return io::read_int_vector(*ids, "seq_idx.npy");
}

std::string format_index(const std::vector<std::size_t>& shape, std::size_t flat) {
  std::vector<std::size_t> index(shape.size());
  for (std::size_t axis = shape.size(); axis-- > 0;) {
    index[axis] = shape[axis] == 0 ? 0 : flat % shape[axis];
    flat = shape[axis] == 0 ? 0 : flat / shape[axis];
  }
  std::string text = "[";
  for (std::size_t axis = 0; axis < index.size(); ++axis) {
    text += (axis > 0 ? ", " : "") + std::to_string(index[axis]);
  }
  return text + "]";
}

namespace {

template <class T>
void require_finite_elements(const io::NpyArray& array, const std::string& name,
                             const std::string& why) {
  const T* data = array.data<T>();
  for (std::size_t k = 0; k < array.size(); ++k) {
    const T x = data[k];
    if (std::isfinite(x)) continue;
    const char* what = std::isnan(x) ? "NaN" : x > 0 ? "+inf" : "-inf";
    fail(name, ": ", what, " at ", format_index(array.shape, k), " (", why, ")");
  }
}

}  // namespace

void require_finite(const io::NpyArray& array, const std::string& name, const std::string& why) {
  io::require_floating(array, name);
  if (array.dtype == io::DType::f32) {
    require_finite_elements<float>(array, name, why);
  } else {
    require_finite_elements<double>(array, name, why);
  }
}

std::string round_trip(double x) {
  std::ostringstream os;
  for (int digits = 6;; ++digits) {  // 17 significant digits always read back
    os.str("");
    os.precision(digits);
    os << x;
    if (digits >= std::numeric_limits<double>::max_digits10 || std::stod(os.str()) == x) break;
  }
  return os.str();
}

void Dims::check(const io::NpyArray& array, const std::string& file,
                 std::initializer_list<const char*> axes) {
  const auto& shape = array.shape;
  const auto layout = [&] {
    std::string text = "[";
    for (const char* axis : axes) text += (text.size() > 1 ? ", " : "") + std::string(axis);
    return text + "]";
  };
  if (shape.size() != axes.size()) {
    fail(file, ": shape ", io::format_shape(shape), ", expected ", axes.size(),
         axes.size() == 1 ? " axis " : " axes ", layout());
  }
  std::size_t axis = 0;
  for (const char* name : axes) {
    const std::size_t size = shape[axis];
    if (size > std::size_t(std::numeric_limits<int>::max())) {
      fail(file, ": shape ", io::format_shape(shape), ", expected ", name, " at most ",
           std::numeric_limits<int>::max(), " at axis ", axis);
    }
    const auto known =
        std::find_if(dims_.begin(), dims_.end(), [&](const Dim& d) { return d.name == name; });
    if (known == dims_.end()) {
      dims_.push_back({name, size, file});
    } else if (known->value != size) {
      fail(file, ": shape ", io::format_shape(shape), ", expected ", name, " ", known->value,
           " (from ", known->file, ") at axis ", axis);
    }
    ++axis;
  }
}

std::size_t Dims::operator[](const std::string& name) const {
  for (const Dim& d : dims_) {
    if (d.name == name) return d.value;
  }
  fail("internal error: size ", name, " not checked yet");
}

namespace {

/// The machine's physical memory in bytes (0 when unknown).
std::uint64_t physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? std::uint64_t(pages) * std::uint64_t(page) : 0;
}

}  // namespace

void require_output_sizes(const std::vector<OutputShape>& outputs) {
  constexpr std::uint64_t kMax = std::uint64_t(std::numeric_limits<std::int64_t>::max());
  const std::uint64_t memory = physical_memory();
  std::uint64_t total = 0;
  for (const OutputShape& out : outputs) {
    const auto shape = [&] {
      return out.name + ": shape " + io::format_shape(out.shape) + " " + io::dtype_name(out.dtype);
    };
    // The product of the extents, stopping before it passes kMax.
    std::uint64_t bytes = io::element_size(out.dtype);
    bool empty = false;
    for (std::size_t n : out.shape) empty = empty || n == 0;
    for (std::size_t n : out.shape) {
      if (empty) break;
      if (bytes > kMax / n) fail(shape(), " is more than 2^63 bytes");
      bytes *= n;
    }
    if (empty) bytes = 0;
    total += bytes;  // no overflow: each term is at most `memory` when it is used
    if (memory != 0 && bytes > memory) {
      fail(shape(), " is ", bytes, " bytes, more than the ", memory / 1000000000,
           " GB of memory of this machine");
    }
    if (memory != 0 && total > memory) {
      fail("the outputs up to ", out.name, " are ", total, " bytes, more than the ",
           memory / 1000000000, " GB of memory of this machine");
    }
  }
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
