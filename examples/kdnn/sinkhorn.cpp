// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// `kdnn sinkhorn`: Sinkhorn-Knopp normalisation of x.npy, and its backward
// when g.npy (dL/dR) is given.
#include <cmath>
#include <iostream>
#include <limits>
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
                     [--order columns-first|rows-first] [--eps E]
                     [--method implicit|block|unrolled]
                     [--marginals measured|unit]

Sinkhorn-Knopp normalisation R = Sinkhorn(exp(X)) of a batch of n x n
matrices, and its backward when a gradient is given.

  --in DIR       reads DIR/x.npy, shape [B, n, n] (n >= 1), float32 or
                 float64, finite or -inf (a mask; no row or column entirely
                 -inf), and DIR/g.npy (dL/dR, same shape and dtype, finite)
                 if it exists
  --out DIR      existing directory; receives r.npy, and dx.npy when g.npy
                 was given, in the input dtype
  --iters N      forward iterations (two normalisations each), N >= 1
  --tol T        stop a matrix early once the marginal the next iteration
                 fixes is within T of 1 (T >= 0; default 0 = all N)
  --order O      columns-first (default: divide by the column sums, then the
                 row sums) or rows-first (TransformerEngine, TileKernels)
  --eps E        TileKernels' eps: added to the first (softmax)
                 normalisation's output and to every later sum (0 <= E <= 1;
                 default 0)
  --method M     backward: implicit (default; implicit differentiation, CG),
                 block (CG on the 2n x 2n system) or unrolled (reverse mode
                 through the N iterations, autograd's gradient; needs T = 0)
  --marginals A  implicit/block: measured (default; balance to R's actual
                 row and column sums, well posed for any R) or unit (assume
                 R is doubly stochastic, the reference's formulation)
  -h, --help     print this help

Which gradient: unrolled is exactly what autograd returns through the N
iterations as run (the gradient mHC training uses). implicit and block
return the gradient of the converged normalisation; they equal unrolled only
once R has converged. When R's marginal error or the CG residual shows that
the gradient written is not the converged one, one "kdnn: warning:" line on
stderr says so and names the remedy.

Prints one summary line: batch, n, dtype, options, the largest forward
iteration count and marginal error, and (implicit/block) the largest CG
iteration count and relative residual.
)";

struct Options {
  std::string in, out, method = "implicit", marginals = "measured", order = "columns-first";
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
  app.add_option("--order", o.order)->check(CLI::IsMember({"columns-first", "rows-first"}));
  app.add_option("--eps", o.forward.eps)->check(finite_in(0, 1));
  app.add_option("--method", o.method)->check(CLI::IsMember({"implicit", "block", "unrolled"}));
  auto* marginals =
      app.add_option("--marginals", o.marginals)->check(CLI::IsMember({"measured", "unit"}));
  if (!parse(app, args, kHelp)) return std::nullopt;
  if (o.method == "unrolled" && o.forward.tol != 0) {
    usage_fail(
        "--method unrolled needs --tol 0 (reverse mode differentiates a fixed "
        "iteration count), got --tol ",
        o.forward.tol);
  }
  if (o.method == "unrolled" && marginals->count() > 0) {
    usage_fail("--marginals applies to --method implicit or block, got --method unrolled");
  }
  o.forward.order = o.order == "rows-first" ? sk::Order::rows_first : sk::Order::columns_first;
  return o;
}

struct Inputs {
  NpyArray x;
  std::optional<NpyArray> g;
};

/// The first element of x.npy (a [B, n, n] array) that the operator cannot
/// take, as "NaN at [b, i, j]"; empty if none. X may hold −inf (a mask) but
/// no NaN, no +inf and no row or column entirely −inf. (G must be finite:
/// require_finite.)
template <class T>
std::string first_bad_value(const NpyArray& a) {
  const std::size_t batch = a.shape[0], n = a.shape[1];
  const T* data = a.data<T>();
  const auto at = [&](std::size_t b, std::size_t i, std::size_t j) {
    return format_index(a.shape, (b * n + i) * n + j);
  };
  for (std::size_t b = 0; b < batch; ++b) {
    const T* m = data + b * n * n;
    for (std::size_t k = 0; k < n * n; ++k) {
      const T v = m[k];
      if (std::isnan(v)) return "NaN at " + at(b, k / n, k % n);
      if (std::isinf(v) && v > 0) return "+inf at " + at(b, k / n, k % n);
    }
    const T minus_inf = -std::numeric_limits<T>::infinity();
    for (std::size_t i = 0; i < n; ++i) {
      bool all = true;
      for (std::size_t j = 0; j < n && all; ++j) all = m[i * n + j] == minus_inf;
      if (all) return "row " + std::to_string(i) + " entirely -inf at " + at(b, i, 0);
    }
    for (std::size_t j = 0; j < n; ++j) {
      bool all = true;
      for (std::size_t i = 0; i < n && all; ++i) all = m[i * n + j] == minus_inf;
      if (all) return "column " + std::to_string(j) + " entirely -inf at " + at(b, 0, j);
    }
  }
  return "";
}

void check_x_values(const NpyArray& x) {
  const std::string bad =
      x.dtype == DType::f32 ? first_bad_value<float>(x) : first_bad_value<double>(x);
  if (bad.empty()) return;
  fail("x.npy: ", bad, " (expected finite values or -inf masks, no row or column entirely -inf)");
}

Inputs read_inputs(const std::string& dir) {
  Inputs in{*read_input(dir, "x.npy"), read_input(dir, "g.npy", true)};
  // Every use below takes a float32 array as float and anything else as
  // double: an int32/int64 file stops here.
  io::require_floating(in.x, "x.npy");
  if (in.g) io::require_floating(*in.g, "g.npy");
  const auto& shape = in.x.shape;
  if (shape.size() != 3) {
    fail("x.npy has shape ", io::format_shape(shape), ", expected a 3-d array [B, n, n]");
  }
  if (shape[1] != shape[2]) {
    fail("x.npy has shape ", io::format_shape(shape),
         ", expected [B, n, n] (a batch of square matrices)");
  }
  // Before anything is allocated for the outputs: with n >= 1 they are no
  // larger than x.npy itself.
  constexpr std::size_t max_n = std::numeric_limits<int>::max() / 2;
  if (shape[1] < 1 || shape[1] > max_n) {
    fail("x.npy has shape ", io::format_shape(shape),
         ", expected [B, n, n] with 1 <= n <= ", max_n);
  }
  if (shape[0] > std::size_t(std::numeric_limits<int>::max())) {
    fail("x.npy has shape ", io::format_shape(shape), ", expected a batch B < 2^31");
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
  check_x_values(in.x);
  if (in.g) require_finite(*in.g, "g.npy");
  return in;
}

struct Result {
  NpyArray r;
  std::optional<NpyArray> dx;
  sk::ReportSummary forward, backward;
  double rtol = 0;  ///< the CG tolerance used (implicit/block)
};

template <class T>
Result compute(const Options& o, const Inputs& in) {
  const Space space;
  const std::size_t batch = in.x.shape[0];
  Result result;

  const auto X = input_view<const T***>(in.x, "x.npy");
  result.r = io::allocate_npy(in.x.dtype, in.x.shape);
  const auto R = output_view<T***>(result.r, "r.npy");
  const auto forward_report = sk::Report<Space>::allocate(batch);
  sk::forward(space, X, R, o.forward, forward_report);
  copy_to_output(result.r, R);
  result.forward = sk::summarize(forward_report);
  if (!in.g) return result;

  const auto G = input_view<const T***>(*in.g, "g.npy");
  result.dx = io::allocate_npy(in.x.dtype, in.x.shape);
  const auto dX = output_view<T***>(*result.dx, "dx.npy");
  if (o.method == "unrolled") {
    sk::backward_unrolled(space, X, G, dX, o.forward);
  } else {
    sk::BackwardOptions options;
    options.method = o.method == "block" ? sk::Method::block : sk::Method::implicit;
    options.marginals = o.marginals == "unit" ? sk::Marginals::unit : sk::Marginals::measured;
    const auto backward_report = sk::Report<Space>::allocate(batch);
    sk::backward(space, R, G, dX, options, backward_report);
    result.backward = sk::summarize(backward_report);
    result.rtol = sk::default_rtol<T>();
  }
  copy_to_output(*result.dx, dX);
  return result;
}

/// Marginal error above which R is "not converged" for the warning: the
/// square root of the working precision, where the implicit gradient has lost
/// about half of its digits to the difference.
double convergence_threshold(DType dtype) {
  return dtype == DType::f32 ? std::sqrt(double(std::numeric_limits<float>::epsilon()))
                             : std::sqrt(std::numeric_limits<double>::epsilon());
}

/// One line when the implicit or block gradient written is not the gradient
/// of the converged normalisation; nothing otherwise.
void warn_if_not_converged(const Options& o, const Inputs& in, const Result& r) {
  if (!in.g || o.method == "unrolled") return;
  const double threshold = convergence_threshold(in.x.dtype);
  const double marginal = r.backward.max_marginal_error, residual = r.backward.max_residual;
  const bool unconverged_r = !(marginal <= threshold);
  const bool unconverged_cg = !(residual <= r.rtol);
  if (!unconverged_r && !unconverged_cg) return;
  std::ostringstream os;
  os << "kdnn: warning: dx.npy is not the converged gradient: ";
  if (unconverged_r) {
    os << "R's max marginal error " << marginal << " > " << threshold << " after --iters "
       << o.forward.iters;
  }
  if (unconverged_r && unconverged_cg) os << ", and ";
  if (unconverged_cg) {
    os << "CG stopped at max relative residual " << residual << " > rtol " << r.rtol;
  }
  os << "; use --method unrolled for autograd's gradient through the " << o.forward.iters
     << " iterations, or more --iters for the converged one\n";
  std::cerr << os.str();
}

void print_summary(const Options& o, const Inputs& in, const Result& r) {
  std::ostringstream os;
  os << "sinkhorn: B=" << in.x.shape[0] << " n=" << in.x.shape[1]
     << " dtype=" << io::dtype_name(in.x.dtype) << " iters=" << o.forward.iters
     << " tol=" << o.forward.tol << " order=" << o.order << " eps=" << o.forward.eps
     << " method=" << (in.g ? o.method : "none");
  if (in.g && o.method != "unrolled") os << " marginals=" << o.marginals;
  os << " max_forward_iters=" << r.forward.max_iterations
     << " max_marginal_error=" << r.forward.max_marginal_error;
  if (in.g && o.method != "unrolled") {
    os << " max_cg_iters=" << r.backward.max_iterations
       << " max_cg_residual=" << r.backward.max_residual;
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
  warn_if_not_converged(*o, in, result);
  print_summary(*o, in, result);
  return 0;
}

}  // namespace

extern const Subcommand sinkhorn_command{
    "sinkhorn", "Sinkhorn-Knopp normalisation (forward, and backward given dL/dR)", false, run};

}  // namespace kdnn::cli
