// kdnn: the command-line front end of the kdnn operators. One subcommand per
// operator family; each reads its inputs from .npy files in --in DIR and
// writes its outputs to --out DIR. Everything is validated and computed before
// the first output is written, so a failing run leaves --out untouched.
//
// Exit status: 0 on success, 1 for bad input data or a failed computation or
// write, 2 for command-line usage errors. Errors print one line
// "kdnn: error: <message>" to stderr.
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kdnn/core/error.hpp"
#include "kdnn/io/npy.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"

namespace {

namespace fs = std::filesystem;
using kdnn::io::DType;
using kdnn::io::NpyArray;
using Args = std::vector<std::string>;

constexpr int kExitInput = 1;
constexpr int kExitUsage = 2;

/// A command-line mistake (exit status 2); everything else is kdnn::Error.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& what) : std::runtime_error(what) {}
};

template <class... Parts>
[[noreturn]] void usage_fail(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  throw UsageError(os.str());
}

// ---- command-line parsing ------------------------------------------------

/// An option of a subcommand; all options take a value.
struct OptionSpec {
  const char* name;  // with the leading "--"
  bool required;
};

using Options = std::map<std::string, std::string>;

bool is_help(const std::string& arg) { return arg == "--help" || arg == "-h"; }

/// Parses "--name VALUE" and "--name=VALUE" pairs.
Options parse_options(const Args& args, const std::vector<OptionSpec>& specs) {
  Options options;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0) usage_fail("unexpected argument '", arg, "'");
    const std::size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const auto spec = std::find_if(specs.begin(), specs.end(),
                                   [&](const OptionSpec& s) { return name == s.name; });
    if (spec == specs.end()) usage_fail("unknown option '", name, "'");
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else {
      if (i + 1 == args.size() || args[i + 1].rfind("--", 0) == 0) {
        usage_fail("option ", name, " requires a value");
      }
      value = args[++i];
    }
    if (value.empty()) usage_fail("option ", name, " requires a value");
    if (!options.emplace(name, value).second) {
      usage_fail("option ", name, " given more than once");
    }
  }
  for (const OptionSpec& spec : specs) {
    if (spec.required && options.count(spec.name) == 0) {
      usage_fail("missing required option ", spec.name);
    }
  }
  return options;
}

int parse_int(const std::string& name, const std::string& text, int min) {
  int value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || value < min) {
    usage_fail(name, ": expected an integer >= ", min, " (at most ",
               std::numeric_limits<int>::max(), "), got '", text, "'");
  }
  return value;
}

double parse_nonnegative(const std::string& name, const std::string& text) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || !std::isfinite(value) || value < 0) {
    usage_fail(name, ": expected a finite number >= 0, got '", text, "'");
  }
  return value;
}

// ---- files ---------------------------------------------------------------

void require_directory(const char* option, const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    kdnn::fail(option, " '", dir, "' is not an existing directory");
  }
}

/// Reads DIR/name, or returns nothing when `optional` and it does not exist.
std::optional<NpyArray> load(const std::string& dir, const char* name, bool optional) {
  const fs::path path = fs::path(dir) / name;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    if (optional) return std::nullopt;
    kdnn::fail("missing input ", path.string());
  }
  return kdnn::io::read_npy(path.string());
}

/// Writes all outputs into `dir`; if one fails, removes those already written.
void write_outputs(const std::string& dir,
                   const std::vector<std::pair<std::string, NpyArray>>& outputs) {
  std::vector<fs::path> written;
  try {
    for (const auto& [name, array] : outputs) {
      const fs::path path = fs::path(dir) / name;
      kdnn::io::write_npy(path.string(), array.dtype, array.shape, array.bytes.data());
      written.push_back(path);
    }
  } catch (...) {
    for (const fs::path& path : written) {
      std::error_code ec;
      fs::remove(path, ec);
    }
    throw;
  }
}

// ---- Kokkos --------------------------------------------------------------

using Space = Kokkos::DefaultExecutionSpace;
template <class T>
using Batch = kdnn::sinkhorn::Batch<T, Space>;

std::string g_program = "kdnn";

/// Runs `f` with Kokkos initialised, passing it no command-line arguments.
template <class F>
auto with_kokkos(F&& f) {
  std::vector<char> argv0(g_program.begin(), g_program.end());
  argv0.push_back('\0');
  char* argv[] = {argv0.data(), nullptr};
  int argc = 1;
  Kokkos::ScopeGuard guard(argc, argv);
  return f();
}

template <class T>
Batch<T> upload(const NpyArray& array, const std::string& label) {
  Batch<T> view(label, array.shape[0], array.shape[1], array.shape[2]);
  auto host = Kokkos::create_mirror_view(view);
  std::copy_n(array.data<T>(), array.size(), host.data());
  Kokkos::deep_copy(view, host);
  return view;
}

template <class T>
NpyArray download(const Batch<T>& view) {
  NpyArray array;
  array.dtype = sizeof(T) == 4 ? DType::f32 : DType::f64;
  array.shape = {view.extent(0), view.extent(1), view.extent(2)};
  array.bytes.resize(view.size() * sizeof(T));
  auto host = Kokkos::create_mirror_view(view);
  Kokkos::deep_copy(host, view);
  if (view.size() > 0) std::memcpy(array.bytes.data(), host.data(), array.bytes.size());
  return array;
}

template <class View>
double max_of(const View& view) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  double m = 0;
  for (std::size_t i = 0; i < host.extent(0); ++i) m = std::max(m, double(host(i)));
  return m;
}

// ---- sinkhorn ------------------------------------------------------------

constexpr const char* kSinkhornHelp =
    R"(usage: kdnn sinkhorn --in DIR --out DIR --iters N [--tol T]
                     [--method implicit|block|unrolled]

Sinkhorn-Knopp normalisation R = Sinkhorn(exp(X)) of a batch of n x n
matrices, and its backward when a gradient is given.

  --in DIR       reads DIR/x.npy, shape [B, n, n], float32 or float64, and
                 DIR/g.npy (dL/dR, same shape and dtype) if it exists
  --out DIR      existing directory; receives r.npy, and dx.npy when g.npy
                 was given, in the input dtype
  --iters N      forward iterations (column then row normalisation), N >= 1
  --tol T        stop a matrix early once max_j |colsum_j - 1| <= T
                 (T >= 0; default 0 = run all N iterations)
  --method M     backward method: implicit (default; implicit
                 differentiation, CG), block (CG on the 2n x 2n system) or
                 unrolled (reverse mode through the N iterations; needs T = 0)
  -h, --help     print this help

Prints one summary line: batch, n, dtype, method, the largest forward
iteration count and marginal error, and (implicit/block) the largest CG
iteration count and relative residual.
)";

enum class SinkhornMethod { implicit, block, unrolled };

const char* method_name(SinkhornMethod m) {
  switch (m) {
    case SinkhornMethod::implicit: return "implicit";
    case SinkhornMethod::block: return "block";
    case SinkhornMethod::unrolled: return "unrolled";
  }
  return "?";
}

struct SinkhornArgs {
  std::string in, out;
  kdnn::sinkhorn::ForwardOptions forward;
  SinkhornMethod method = SinkhornMethod::implicit;
};

SinkhornArgs parse_sinkhorn_args(const Args& args) {
  const Options options = parse_options(args, {{"--in", true},
                                               {"--out", true},
                                               {"--iters", true},
                                               {"--tol", false},
                                               {"--method", false}});
  SinkhornArgs a;
  a.in = options.at("--in");
  a.out = options.at("--out");
  a.forward.iters = parse_int("--iters", options.at("--iters"), 1);
  if (options.count("--tol")) a.forward.tol = parse_nonnegative("--tol", options.at("--tol"));
  if (options.count("--method")) {
    const std::string& m = options.at("--method");
    if (m == "implicit") {
      a.method = SinkhornMethod::implicit;
    } else if (m == "block") {
      a.method = SinkhornMethod::block;
    } else if (m == "unrolled") {
      a.method = SinkhornMethod::unrolled;
    } else {
      usage_fail("--method: unknown method '", m, "', expected implicit, block or unrolled");
    }
  }
  if (a.method == SinkhornMethod::unrolled && a.forward.tol != 0) {
    usage_fail("--method unrolled needs --tol 0 (reverse mode differentiates a fixed "
               "iteration count), got --tol ",
               options.at("--tol"));
  }
  return a;
}

struct SinkhornInputs {
  NpyArray x;
  std::optional<NpyArray> g;
};

SinkhornInputs load_sinkhorn_inputs(const std::string& dir) {
  SinkhornInputs in{*load(dir, "x.npy", false), load(dir, "g.npy", true)};
  const auto& shape = in.x.shape;
  if (shape.size() != 3) {
    kdnn::fail("x.npy has shape ", kdnn::io::format_shape(shape), ", expected a 3-d array [B, n, n]");
  }
  if (shape[1] != shape[2]) {
    kdnn::fail("x.npy has shape ", kdnn::io::format_shape(shape),
               ", expected [B, n, n] (a batch of square matrices)");
  }
  if (in.g) {
    if (in.g->shape != shape) {
      kdnn::fail("g.npy has shape ", kdnn::io::format_shape(in.g->shape), ", expected ",
                 kdnn::io::format_shape(shape), " (same as x.npy)");
    }
    if (in.g->dtype != in.x.dtype) {
      kdnn::fail("g.npy has dtype ", kdnn::io::dtype_name(in.g->dtype), ", expected ",
                 kdnn::io::dtype_name(in.x.dtype), " (same as x.npy)");
    }
  }
  return in;
}

struct SinkhornResult {
  NpyArray r;
  std::optional<NpyArray> dx;
  int max_forward_iters = 0, max_cg_iters = 0;
  double max_marginal_error = 0, max_cg_residual = 0;
};

template <class T>
SinkhornResult compute_sinkhorn(const SinkhornArgs& a, const SinkhornInputs& in) {
  namespace sk = kdnn::sinkhorn;
  const Space space;
  const std::size_t batch = in.x.shape[0], n = in.x.shape[1];
  using Stats = sk::Report<Space>;
  const auto new_stats = [&] {
    return Stats{Kokkos::View<int*, Space::memory_space>("kdnn_cli::iterations", batch),
                 Kokkos::View<double*, Space::memory_space>("kdnn_cli::error", batch)};
  };

  SinkhornResult result;
  const Batch<T> X = upload<T>(in.x, "kdnn_cli::X");
  Batch<T> R("kdnn_cli::R", batch, n, n);
  const Stats fwd = new_stats();
  sk::forward(space, X, R, a.forward, fwd);
  result.r = download(R);
  result.max_forward_iters = int(max_of(fwd.iterations));
  result.max_marginal_error = max_of(fwd.error);
  if (!in.g) return result;

  const Batch<T> G = upload<T>(*in.g, "kdnn_cli::G");
  Batch<T> dX("kdnn_cli::dX", batch, n, n);
  if (a.method == SinkhornMethod::unrolled) {
    sk::backward_unrolled(space, X, G, dX, a.forward);
  } else {
    sk::BackwardOptions opts;
    opts.method = a.method == SinkhornMethod::block ? sk::Method::block : sk::Method::implicit;
    const Stats bwd = new_stats();
    sk::backward(space, R, G, dX, opts, bwd);
    result.max_cg_iters = int(max_of(bwd.iterations));
    result.max_cg_residual = max_of(bwd.error);
  }
  result.dx = download(dX);
  return result;
}

void print_sinkhorn_summary(const SinkhornArgs& a, const SinkhornInputs& in,
                            const SinkhornResult& r) {
  std::ostringstream os;
  os << "sinkhorn: B=" << in.x.shape[0] << " n=" << in.x.shape[1]
     << " dtype=" << kdnn::io::dtype_name(in.x.dtype) << " iters=" << a.forward.iters
     << " tol=" << a.forward.tol << " method=" << (in.g ? method_name(a.method) : "none")
     << " max_forward_iters=" << r.max_forward_iters
     << " max_marginal_error=" << r.max_marginal_error;
  if (in.g && a.method != SinkhornMethod::unrolled) {
    os << " max_cg_iters=" << r.max_cg_iters << " max_cg_residual=" << r.max_cg_residual;
  }
  os << " wrote=r.npy" << (r.dx ? ",dx.npy" : "");
  std::cout << os.str() << '\n';
}

int run_sinkhorn(const Args& args) {
  const SinkhornArgs a = parse_sinkhorn_args(args);
  require_directory("--in", a.in);
  require_directory("--out", a.out);
  const SinkhornInputs in = load_sinkhorn_inputs(a.in);
  const SinkhornResult result = with_kokkos([&] {
    return in.x.dtype == DType::f32 ? compute_sinkhorn<float>(a, in)
                                    : compute_sinkhorn<double>(a, in);
  });
  std::vector<std::pair<std::string, NpyArray>> outputs{{"r.npy", result.r}};
  if (result.dx) outputs.emplace_back("dx.npy", *result.dx);
  write_outputs(a.out, outputs);
  print_sinkhorn_summary(a, in, result);
  return 0;
}

// ---- subcommand table ----------------------------------------------------

struct Subcommand {
  const char* name;
  const char* summary;  // one line for `kdnn --help`
  const char* help;     // full text for `kdnn NAME --help`
  int (*run)(const Args& args);
};

const Subcommand kSubcommands[] = {
    {"sinkhorn", "Sinkhorn-Knopp normalisation (forward, and backward given dL/dR)",
     kSinkhornHelp, run_sinkhorn},
};

void print_help() {
  std::cout << "usage: kdnn <subcommand> [options]\n"
               "       kdnn <subcommand> --help\n\n"
               "Runs a kdnn operator on .npy files.\n\nsubcommands:\n";
  for (const Subcommand& s : kSubcommands) {
    std::cout << "  " << std::left << std::setw(12) << s.name << s.summary << '\n';
  }
  std::cout << "\nExit status: 0 on success, 1 for bad input data or a failed\n"
               "computation or write, 2 for command-line usage errors. Errors print\n"
               "one line 'kdnn: error: <message>' to stderr and write nothing to --out.\n";
}

int dispatch(const Args& args) {
  if (args.empty()) usage_fail("missing subcommand (try 'kdnn --help')");
  if (is_help(args[0])) {
    print_help();
    return 0;
  }
  if (args[0].rfind("-", 0) == 0) usage_fail("unknown option '", args[0], "' (try 'kdnn --help')");
  for (const Subcommand& s : kSubcommands) {
    if (args[0] != s.name) continue;
    const Args rest(args.begin() + 1, args.end());
    if (std::any_of(rest.begin(), rest.end(), is_help)) {
      std::cout << s.help;
      return 0;
    }
    return s.run(rest);
  }
  usage_fail("unknown subcommand '", args[0], "' (try 'kdnn --help')");
}

/// Prints the one-line error message (newlines inside it flattened).
void report_error(const char* what) {
  std::string message = what;
  std::replace_if(message.begin(), message.end(),
                  [](char c) { return c == '\n' || c == '\r'; }, ' ');
  std::cerr << "kdnn: error: " << message << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 0 && argv[0] != nullptr) g_program = argv[0];
  try {
    return dispatch(Args(argv + std::min(argc, 1), argv + argc));
  } catch (const UsageError& e) {
    report_error(e.what());
    return kExitUsage;
  } catch (const std::exception& e) {  // kdnn::Error and anything else
    report_error(e.what());
    return kExitInput;
  } catch (...) {
    report_error("unknown error");
    return kExitInput;
  }
}
