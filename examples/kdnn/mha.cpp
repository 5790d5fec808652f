// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// `kdnn mha`: the multi-head attention layer (kdnn/attention/mha.hpp) on the
// .npy files of --in DIR: its forward, and its backward when do.npy (dL/dO)
// is given.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <sstream>

#include "cli.hpp"
#include "kdnn/attention/mha.hpp"
#include "kdnn/core/error.hpp"

namespace kdnn::cli {

namespace {

namespace at = kdnn::attention;
using io::DType;
using io::NpyArray;

constexpr const char* kHelp =
    R"(usage: kdnn mha --in DIR --out DIR --heads H [--causal] [--scale S]
                [--dropout P --seed N] [--attention fused|unfused]

Multi-head attention (kdnn::attention::mha_forward), and its gradients when
dL/dO is given:
  Q = q W_q^T + b_q,  K = k W_k^T + b_k,  V = v W_v^T + b_v   (biases optional)
  P_h = softmax(s Q_h K_h^T) over the keys the mask leaves query i
  O = [dropout(P_0) V_0, ..., dropout(P_{H-1}) V_{H-1}] W_o^T + b_o (+ residual)
Head h takes rows h*D ... (h+1)*D-1 of w_q and w_k and rows h*Dv ... of w_v.

  --in DIR       reads DIR/NAME.npy; the float files are float32 or float64,
                 all of one dtype (the computation's), finite:
                   q.npy [B, S, E_q]    k.npy [B, Sk, E_k]    v.npy [B, Sk, E_v]
                   w_q.npy [H*D, E_q]   w_k.npy [H*D, E_k]    w_v.npy [H*Dv, E_v]
                   w_o.npy [E_o, H*Dv]
                 and, if they exist:
                   b_q.npy [H*D]  b_k.npy [H*D]  b_v.npy [H*Dv]  b_o.npy [E_o]
                   residual.npy [B, S, E_o]  added to O
                   do.npy [B, S, E_o]        dL/dO: the backward runs
                 and the mask, int32 or int64:
                   lo_win.npy, hi_win.npy [S]  query i sees keys lo[i] ... hi[i]-1
                                               (0 <= lo <= hi <= Sk)
                   seq_q.npy [B]  queries i >= seq_q[b] are padding (<= S)
                   seq_k.npy [B]  keys j >= seq_k[b] are padding (<= Sk)
                 and packed sequences (flash-attn's varlen layout), both or
                 neither, int32 or int64, with batch B = 1:
                   cu_seqlens_q.npy [N+1]  sequence n's queries are rows
                                           cu_seqlens_q[n] ... cu_seqlens_q[n+1]-1
                   cu_seqlens_k.npy [N+1]  its keys, likewise (0 first, never
                                           decreasing, S and Sk last); a query
                                           sees only its own sequence's keys
  --out DIR      existing directory; receives o.npy [B, S, E_o] and, with
                 do.npy, dq.npy dk.npy dv.npy dw_q.npy dw_k.npy dw_v.npy
                 dw_o.npy, db_q.npy db_k.npy db_v.npy db_o.npy for each bias
                 given, and dresidual.npy when residual.npy is given; in the
                 input dtype, shaped as what they are the gradient of
  --heads H      the number of heads, H >= 1, dividing the rows of w_q.npy
                 (H*D) and of w_v.npy (H*Dv)
  --causal       query i sees only keys j <= i
  --scale S      the softmax scale s (finite in the files' dtype: |S| <=
                 3.40282e+38 in float32; default 1/sqrt(D))
  --dropout P    dropout on the attention probabilities, 0 <= P < 1 (default:
                 none); needs --seed
  --seed N       the dropout mask's key, 0 <= N < 2^64 (Philox-4x32-10,
                 offset 0: the same N gives the same mask on every backend);
                 an error without --dropout
  --attention A  how the heads are computed: fused (default; the fused
                 attention kernel, which never stores the [B, H, S, Sk]
                 probabilities) or unfused (batched GEMM, softmax, dropout,
                 batched GEMM); the same results to rounding, the same mask
  -h, --help     print this help

A query that sees no key gets O = b_o (+ residual) and passes no gradient; a
padded query (i >= seq_q[b]) gets a zero row in o.npy and zero gradients,
dresidual included. Window and length values are checked by the layer
(errors name them mask.lo_win, mask.seq_q, ..., seqs.cu_seqlens_q).

Prints one summary line: the sizes, dtype, options (numbers in the shortest
form that reads back exactly) and the files written.
)";

struct Options {
  std::string in, out, attention = "fused";
  at::MhaOptions layer;
  bool causal = false;
};

/// Returns nothing when --help was given.
std::optional<Options> parse_options(const Args& args) {
  Options o;
  double scale = 0;
  CLI::App app{"", "kdnn mha"};
  app.add_option("--in", o.in)->required()->check(not_an_option());
  app.add_option("--out", o.out)->required()->check(not_an_option());
  app.add_option("--heads", o.layer.heads)->required()->check(integer_at_least(1));
  app.add_flag("--causal", o.causal);
  auto* scale_option = app.add_option("--scale", scale)->check(finite());
  auto* dropout = app.add_option("--dropout", o.layer.dropout.p)->check(finite_in_half_open(0, 1));
  auto* seed = app.add_option("--seed", o.layer.dropout.seed)->check(unsigned_64());
  app.add_option("--attention", o.attention)->check(CLI::IsMember({"fused", "unfused"}));
  if (!parse(app, args, kHelp)) return std::nullopt;
  if (seed->count() > 0 && dropout->count() == 0) {
    usage_fail("--seed needs --dropout P (without dropout there is no mask to seed)");
  }
  if (dropout->count() > 0 && seed->count() == 0) {
    usage_fail("--dropout needs --seed N (the key of the dropout mask)");
  }
  if (scale_option->count() > 0) o.layer.sm_scaler = scale;
  o.layer.algo = o.attention == "unfused" ? at::AttentionAlgo::unfused : at::AttentionAlgo::fused;
  return o;
}

// The float files, in the order they are checked.
enum FloatFile { q, k, v, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, residual, dout, kFloatFiles };
constexpr const char* kFloatNames[kFloatFiles] = {
    "q.npy",   "k.npy",   "v.npy",   "w_q.npy", "w_k.npy",      "w_v.npy", "w_o.npy",
    "b_q.npy", "b_k.npy", "b_v.npy", "b_o.npy", "residual.npy", "do.npy"};
constexpr bool is_optional(FloatFile f) { return f >= b_q; }

// The mask's files.
enum IntFile { lo_win, hi_win, seq_q, seq_k, cu_seqlens_q, cu_seqlens_k, kIntFiles };
constexpr const char* kIntNames[kIntFiles] = {"lo_win.npy", "hi_win.npy",       "seq_q.npy",
                                              "seq_k.npy",  "cu_seqlens_q.npy", "cu_seqlens_k.npy"};
/// The axis an int file's one dimension shares with the others.
constexpr const char* int_axis(IntFile f) {
  return f == lo_win || f == hi_win ? "S" : f == seq_q || f == seq_k ? "batch" : "N+1";
}

struct Inputs {
  std::array<std::optional<NpyArray>, kFloatFiles> f;
  std::array<std::optional<std::vector<int>>, kIntFiles> mask;
  at::MhaShape shape;
  DType dtype = DType::f32;

  const NpyArray& operator[](FloatFile file) const { return *f[file]; }
  bool has(FloatFile file) const { return f[file].has_value(); }
};

/// Requires the rows of `file` (H*D or H*Dv) to split into --heads heads.
std::size_t per_head(const NpyArray& array, const char* file, const char* rows, int heads) {
  const std::size_t n = array.shape[0], h = std::size_t(heads);
  if (n == 0 || n % h != 0) {
    fail(file, ": shape ", io::format_shape(array.shape), ", expected ", rows,
         ", a positive multiple of --heads ", heads, " at axis 0");
  }
  return n / h;
}

/// Fails unless the layer's buffers (the largest, unfused, being the B*H*S*Sk
/// probabilities) can be counted in size_t bytes, before anything is
/// allocated for them.
void require_countable(const at::MhaShape& s) {
  const long double B = s.batch, H = s.heads, S = s.seq_q, Sk = s.seq_k;
  const long double widest =
      std::max({(long double)s.q_size, (long double)s.k_size, (long double)s.v_size, H * s.head_dim,
                H * s.v_head_dim, (long double)s.o_size,
                s.algo == at::AttentionAlgo::unfused ? H * Sk : 0.0L});
  // Each buffer is a sum of fewer than 16 tensors of at most B*max(S,Sk)*widest.
  const long double elements = 16 * B * std::max(S, Sk) * widest;
  if (elements * sizeof(double) > (long double)(std::numeric_limits<std::int64_t>::max())) {
    fail("the layer's buffers for B=", s.batch, " S=", s.seq_q, " Sk=", s.seq_k, " H=", s.heads,
         " would exceed 2^63 bytes");
  }
}

Inputs read_inputs(const std::string& dir, const at::MhaOptions& layer) {
  const int heads = layer.heads;
  Inputs in;
  for (int f = 0; f < kFloatFiles; ++f) {
    in.f[f] = read_input(dir, kFloatNames[f], is_optional(FloatFile(f)));
  }
  std::array<std::optional<NpyArray>, kIntFiles> ints;
  for (int m = 0; m < kIntFiles; ++m) ints[m] = read_input(dir, kIntNames[m], true);

  // One float dtype, q.npy's.
  in.dtype = in[q].dtype;
  for (int f = 0; f < kFloatFiles; ++f) {
    if (!in.f[f]) continue;
    io::require_floating(*in.f[f], kFloatNames[f]);
    if (in.f[f]->dtype != in.dtype) {
      fail(kFloatNames[f], ": dtype ", io::dtype_name(in.f[f]->dtype), ", expected ",
           io::dtype_name(in.dtype), " (from q.npy; the float files share one dtype)");
    }
  }

  // Every shape against the others.
  Dims dims;
  const auto check = [&](FloatFile f, std::initializer_list<const char*> axes) {
    if (in.has(f)) dims.check(in[f], kFloatNames[f], axes);
  };
  check(q, {"batch", "S", "E_q"});
  check(k, {"batch", "Sk", "E_k"});
  check(v, {"batch", "Sk", "E_v"});
  check(w_q, {"H*D", "E_q"});
  const std::size_t D = per_head(in[w_q], "w_q.npy", "H*D", heads);
  check(w_k, {"H*D", "E_k"});
  check(w_v, {"H*Dv", "E_v"});
  const std::size_t Dv = per_head(in[w_v], "w_v.npy", "H*Dv", heads);
  check(w_o, {"E_o", "H*Dv"});
  check(b_q, {"H*D"});
  check(b_k, {"H*D"});
  check(b_v, {"H*Dv"});
  check(b_o, {"E_o"});
  check(residual, {"batch", "S", "E_o"});
  check(dout, {"batch", "S", "E_o"});
  for (int m = 0; m < kIntFiles; ++m) {
    if (!ints[m]) continue;
    in.mask[m] = io::read_int_vector(*ints[m], kIntNames[m]);  // int32 or int64
    dims.check(*ints[m], kIntNames[m], {int_axis(IntFile(m))});
  }
  if (ints[cu_seqlens_q].has_value() != ints[cu_seqlens_k].has_value()) {
    fail(ints[cu_seqlens_q] ? "cu_seqlens_q.npy" : "cu_seqlens_k.npy", " is given without ",
         ints[cu_seqlens_q] ? "cu_seqlens_k.npy" : "cu_seqlens_q.npy",
         ", expected both (packed sequences) or neither");
  }

  at::MhaShape& s = in.shape;
  s.batch = dims["batch"], s.seq_q = dims["S"], s.seq_k = dims["Sk"];
  s.q_size = dims["E_q"], s.k_size = dims["E_k"], s.v_size = dims["E_v"];
  s.heads = std::size_t(heads), s.head_dim = D, s.v_head_dim = Dv, s.o_size = dims["E_o"];
  s.algo = layer.algo;
  require_countable(s);

  for (int f = 0; f < kFloatFiles; ++f) {
    if (in.f[f]) require_finite(*in.f[f], kFloatNames[f]);
  }
  return in;
}

struct Result {
  std::vector<Output> outputs;  ///< o.npy first
};

/// The gradients the backward writes: one per float input but do.npy, each
/// shaped as its input, biases and dresidual only when given.
constexpr const char* kGradientNames[dout] = {"dq.npy",   "dk.npy",   "dv.npy",   "dw_q.npy",
                                              "dw_k.npy", "dw_v.npy", "dw_o.npy", "db_q.npy",
                                              "db_k.npy", "db_v.npy", "db_o.npy", "dresidual.npy"};

at::Vector<const int, Space> mask_view(const std::optional<std::vector<int>>& values,
                                       const char* label) {
  if (!values) return {};
  Kokkos::View<int*, Space::memory_space> view(std::string(label), values->size());
  Kokkos::deep_copy(view, io::HostView<const int*>(values->data(), values->size()));
  return view;
}

template <class T>
Result compute(const Options& o, const Inputs& in) {
  const Space space;
  const at::MhaShape& s = in.shape;
  const auto input3 = [&](FloatFile f) {
    return in.has(f) ? at::Tensor3<const T, Space>(input_view<const T***>(in[f], kFloatNames[f]))
                     : at::Tensor3<const T, Space>();
  };
  const auto input1 = [&](FloatFile f) {
    return in.has(f) ? at::Vector<const T, Space>(input_view<const T*>(in[f], kFloatNames[f]))
                     : at::Vector<const T, Space>();
  };
  at::MhaParams<const T, Space> w;
  w.w_q = input_view<const T**>(in[w_q], "w_q.npy");
  w.w_k = input_view<const T**>(in[w_k], "w_k.npy");
  w.w_v = input_view<const T**>(in[w_v], "w_v.npy");
  w.w_o = input_view<const T**>(in[w_o], "w_o.npy");
  w.b_q = input1(b_q), w.b_k = input1(b_k), w.b_v = input1(b_v), w.b_o = input1(b_o);
  const auto Q = input3(q), K = input3(k), V = input3(v), R = input3(residual);

  at::AttentionMask<Space> mask;
  mask.causal = o.causal;
  mask.lo_win = mask_view(in.mask[lo_win], "lo_win");
  mask.hi_win = mask_view(in.mask[hi_win], "hi_win");
  mask.seq_q = mask_view(in.mask[seq_q], "seq_q");
  mask.seq_k = mask_view(in.mask[seq_k], "seq_k");
  const at::PackedSequences<Space> seqs{mask_view(in.mask[cu_seqlens_q], "cu_seqlens_q"),
                                        mask_view(in.mask[cu_seqlens_k], "cu_seqlens_k")};

  const auto sizes = at::mha_buffer_sizes(s);
  const at::Vector<T, Space> reserve("reserve", sizes.reserve);
  const at::Vector<T, Space> workspace("workspace", sizes.workspace);

  Result result;
  result.outputs.push_back({"o.npy", io::allocate_npy(in.dtype, {s.batch, s.seq_q, s.o_size})});
  const auto O = output_view<T***>(result.outputs[0].array, "o.npy");
  at::mha_forward(space, o.layer, mask, w, Q, K, V, R, O, reserve, workspace, seqs);
  copy_to_output(result.outputs[0].array, O);
  if (!in.has(dout)) return result;

  // Each gradient computed into an array shaped as its input.
  std::array<std::optional<NpyArray>, dout> grads;
  for (int f = 0; f < dout; ++f) {
    if (in.has(FloatFile(f))) grads[f] = io::allocate_npy(in.dtype, in[FloatFile(f)].shape);
  }
  const auto grad3 = [&](FloatFile f) {
    return grads[f] ? at::Tensor3<T, Space>(output_view<T***>(*grads[f], kGradientNames[f]))
                    : at::Tensor3<T, Space>();
  };
  const auto grad1 = [&](FloatFile f) {
    return grads[f] ? at::Vector<T, Space>(output_view<T*>(*grads[f], kGradientNames[f]))
                    : at::Vector<T, Space>();
  };
  const auto dQ = grad3(q), dK = grad3(k), dV = grad3(v), dR = grad3(residual);
  at::MhaParams<T, Space> dw;
  dw.w_q = output_view<T**>(*grads[w_q], "dw_q.npy");
  dw.w_k = output_view<T**>(*grads[w_k], "dw_k.npy");
  dw.w_v = output_view<T**>(*grads[w_v], "dw_v.npy");
  dw.w_o = output_view<T**>(*grads[w_o], "dw_o.npy");
  dw.b_q = grad1(b_q), dw.b_k = grad1(b_k), dw.b_v = grad1(b_v), dw.b_o = grad1(b_o);
  const auto dO = input3(dout);
  at::mha_backward_data(space, o.layer, mask, w, dO, dQ, dK, dV, dR, reserve, workspace, seqs);
  at::mha_backward_weights(space, o.layer, w, Q, K, V, dw, at::WgradMode::set, reserve);

  const auto copy = [&](FloatFile f, const auto& view) {
    if (grads[f]) copy_to_output(*grads[f], view);
  };
  copy(q, dQ), copy(k, dK), copy(v, dV), copy(residual, dR);
  copy(w_q, dw.w_q), copy(w_k, dw.w_k), copy(w_v, dw.w_v), copy(w_o, dw.w_o);
  copy(b_q, dw.b_q), copy(b_k, dw.b_k), copy(b_v, dw.b_v), copy(b_o, dw.b_o);
  for (int f = 0; f < dout; ++f) {
    if (grads[f]) result.outputs.push_back({kGradientNames[f], std::move(*grads[f])});
  }
  return result;
}

void print_summary(const Options& o, const Inputs& in, const Result& r) {
  const at::MhaShape& s = in.shape;
  std::ostringstream os;
  os << "mha: B=" << s.batch << " S=" << s.seq_q << " Sk=" << s.seq_k << " E_q=" << s.q_size
     << " E_k=" << s.k_size << " E_v=" << s.v_size << " H=" << s.heads << " D=" << s.head_dim
     << " Dv=" << s.v_head_dim << " E_o=" << s.o_size << " dtype=" << io::dtype_name(in.dtype)
     << " causal=" << (o.causal ? "yes" : "no") << " scale="
     << round_trip(o.layer.sm_scaler ? *o.layer.sm_scaler : 1.0 / std::sqrt(double(s.head_dim)))
     << " dropout=" << round_trip(o.layer.dropout.p);  // 0.9999999999999999, not 1
  if (o.layer.dropout.p > 0) os << " seed=" << o.layer.dropout.seed;
  os << " attention=" << o.attention << " mask=";
  bool any = false;
  for (int m = 0; m < kIntFiles; ++m) {
    if (!in.mask[m]) continue;
    const std::string name = kIntNames[m];
    os << (any ? "," : "") << name.substr(0, name.size() - 4);
    any = true;
  }
  if (!any) os << "none";
  os << " wrote=";
  for (std::size_t i = 0; i < r.outputs.size(); ++i) os << (i ? "," : "") << r.outputs[i].name;
  std::cout << os.str() << '\n';
}

int run(const Args& args) {
  const std::optional<Options> o = parse_options(args);
  if (!o) return 0;
  require_directory("--in", o->in);
  require_directory("--out", o->out);
  const Inputs in = read_inputs(o->in, o->layer);
  // --scale is checked as a double when parsed; the layer computes in the
  // files' dtype, where 1e39 would be +inf.
  const double max = in.dtype == DType::f32 ? double(std::numeric_limits<float>::max())
                                            : std::numeric_limits<double>::max();
  if (o->layer.sm_scaler && !(std::abs(*o->layer.sm_scaler) <= max)) {
    usage_fail("--scale: ", round_trip(*o->layer.sm_scaler), " is not finite in ",
               io::dtype_name(in.dtype), " (expected |scale| <= ", max, ")");
  }
  const Result result = in.dtype == DType::f32 ? compute<float>(*o, in) : compute<double>(*o, in);
  // Finite inputs can still overflow (--scale times the scores Q·K^T past the
  // dtype's range): an error, not a file of NaN.
  for (const Output& out : result.outputs) {
    require_finite(out.array, out.name,
                   std::string("the computation overflowed ") + io::dtype_name(in.dtype) +
                       "; is --scale times the scores Q·K^T out of its range?");
  }
  write_outputs(o->out, result.outputs);
  print_summary(*o, in, result);
  return 0;
}

}  // namespace

extern const Subcommand mha_command{
    "mha", "multi-head attention layer (forward, and backward given dL/dO)", false, run};

}  // namespace kdnn::cli
