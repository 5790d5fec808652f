// `kdnn sinkhorn`: Sinkhorn-Knopp normalisation of x.npy, and its backward
// when g.npy (dL/dR) is given.
#include <algorithm>
#include <iostream>
#include <sstream>

#include "cli.hpp"
#include "kdnn/core/error.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"

namespace kdnn::cli {

namespace {

namespace sk = kdnn::sinkhorn;
using io::DType;
using io::NpyArray;

constexpr const char* kHelp =
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

struct Options {
  std::string in, out, method = "implicit";
  sk::ForwardOptions forward;
};

/// Returns nothing when --help was given.
std::optional<Options> parse_options(const Args& args) {
  Options o;
  CLI::App app{"", "kdnn sinkhorn"};
  app.add_option("--in", o.in)->required()->check(not_an_option());
  app.add_option("--out", o.out)->required()->check(not_an_option());
  app.add_option("--iters", o.forward.iters)->required()->check(integer_at_least(1));
  app.add_option("--tol", o.forward.tol)->check(finite_at_least(0));
  app.add_option("--method", o.method)->check(CLI::IsMember({"implicit", "block", "unrolled"}));
  if (!parse(app, args, kHelp)) return std::nullopt;
  if (o.method == "unrolled" && o.forward.tol != 0) {
    usage_fail("--method unrolled needs --tol 0 (reverse mode differentiates a fixed "
               "iteration count), got --tol ", o.forward.tol);
  }
  return o;
}

struct Inputs {
  NpyArray x;
  std::optional<NpyArray> g;
};

Inputs read_inputs(const std::string& dir) {
  Inputs in{*read_input(dir, "x.npy"), read_input(dir, "g.npy", true)};
  const auto& shape = in.x.shape;
  if (shape.size() != 3) {
    fail("x.npy has shape ", io::format_shape(shape), ", expected a 3-d array [B, n, n]");
  }
  if (shape[1] != shape[2]) {
    fail("x.npy has shape ", io::format_shape(shape),
         ", expected [B, n, n] (a batch of square matrices)");
  }
  if (in.g) {
    if (in.g->shape != shape) {
      fail("g.npy has shape ", io::format_shape(in.g->shape), ", expected ",
           io::format_shape(shape), " (same as x.npy)");
    }
    if (in.g->dtype != in.x.dtype) {
      fail("g.npy has dtype ", io::dtype_name(in.g->dtype), ", expected ",
           io::dtype_name(in.x.dtype), " (same as x.npy)");
    }
  }
  return in;
}

struct Result {
  NpyArray r;
  std::optional<NpyArray> dx;
  int max_forward_iters = 0, max_cg_iters = 0;
  double max_marginal_error = 0, max_cg_residual = 0;
};

template <class View>
double max_of(const View& view) {
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  double m = 0;
  for (std::size_t i = 0; i < host.extent(0); ++i) m = std::max(m, double(host(i)));
  return m;
}

template <class T>
Result compute(const Options& o, const Inputs& in) {
  const Space space;
  const std::size_t batch = in.x.shape[0];
  const auto new_report = [&] {
    return sk::Report<Space>{Kokkos::View<int*, Space::memory_space>("kdnn::iterations", batch),
                             Kokkos::View<double*, Space::memory_space>("kdnn::error", batch)};
  };
  Result result;

  const auto X = input_view<const T***>(in.x, "x.npy");
  result.r = io::allocate_npy(in.x.dtype, in.x.shape);
  const auto R = output_view<T***>(result.r, "r.npy");
  const auto forward_report = new_report();
  sk::forward(space, X, R, o.forward, forward_report);
  copy_to_output(result.r, R);
  result.max_forward_iters = int(max_of(forward_report.iterations));
  result.max_marginal_error = max_of(forward_report.error);
  if (!in.g) return result;

  const auto G = input_view<const T***>(*in.g, "g.npy");
  result.dx = io::allocate_npy(in.x.dtype, in.x.shape);
  const auto dX = output_view<T***>(*result.dx, "dx.npy");
  if (o.method == "unrolled") {
    sk::backward_unrolled(space, X, G, dX, o.forward);
  } else {
    sk::BackwardOptions options;
    options.method = o.method == "block" ? sk::Method::block : sk::Method::implicit;
    const auto backward_report = new_report();
    sk::backward(space, R, G, dX, options, backward_report);
    result.max_cg_iters = int(max_of(backward_report.iterations));
    result.max_cg_residual = max_of(backward_report.error);
  }
  copy_to_output(*result.dx, dX);
  return result;
}

void print_summary(const Options& o, const Inputs& in, const Result& r) {
  std::ostringstream os;
  os << "sinkhorn: B=" << in.x.shape[0] << " n=" << in.x.shape[1]
     << " dtype=" << io::dtype_name(in.x.dtype) << " iters=" << o.forward.iters
     << " tol=" << o.forward.tol << " method=" << (in.g ? o.method : "none")
     << " max_forward_iters=" << r.max_forward_iters
     << " max_marginal_error=" << r.max_marginal_error;
  if (in.g && o.method != "unrolled") {
    os << " max_cg_iters=" << r.max_cg_iters << " max_cg_residual=" << r.max_cg_residual;
  }
  os << " wrote=r.npy" << (in.g ? ",dx.npy" : "");
  std::cout << os.str() << '\n';
}

int run(const Args& args) {
  const std::optional<Options> o = parse_options(args);
  if (!o) return 0;
  require_directory("--in", o->in);
  require_directory("--out", o->out);
  const Inputs in = read_inputs(o->in);
  Result result = in.x.dtype == DType::f32 ? compute<float>(*o, in) : compute<double>(*o, in);
  std::vector<Output> outputs;
  outputs.push_back({"r.npy", std::move(result.r)});
  if (result.dx) outputs.push_back({"dx.npy", std::move(*result.dx)});
  write_outputs(o->out, outputs);
  print_summary(*o, in, result);
  return 0;
}

}  // namespace

extern const Subcommand sinkhorn_command{
    "sinkhorn", "Sinkhorn-Knopp normalisation (forward, and backward given dL/dR)", false, run};

}  // namespace kdnn::cli
