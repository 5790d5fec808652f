// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// `kdnn cp-conv`: Mamba-2's causal conv1d (+ SiLU) and dt softplus with the
// sequence split across the MPI ranks (kdnn/cp/conv_dt.hpp). Rank 0 reads the
// whole-sequence arrays, scatters each rank's steps, gathers the results and
// writes them; every rank computes. Runs with one rank as well.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "cli.hpp"
#include "cp_io.hpp"
#include "kdnn/core/error.hpp"
#include "kdnn/cp/cp.hpp"

namespace kdnn::cli {

namespace {

using io::DType;
using io::NpyArray;

constexpr const char* kHelp =
    R"(usage: mpiexec -n P kdnn cp-conv --in DIR --out DIR [--no-silu]
                     [--dt-min A] [--dt-max B] [--split L0,L1,...]

Mamba-2's causal depthwise conv1d (+ SiLU) and dt = softplus(dt + dt_bias)
(clamped to [A, B]) over a sequence split across the P ranks, forward, and
backward when a gradient is given. Rank 0 reads and writes; the results
equal a single-rank run.

  --in DIR     reads from DIR (float32 or float64, all one dtype):
                 xbc.npy [B, L, C], dt.npy [B, L, H], conv_w.npy [C, K] (K >= 1),
                 dt_bias.npy [H]; optional conv_b.npy [C],
                 init.npy [B, K-1, C] (the initial state), and the gradients
                 dy.npy [B, L, C], ddt_out.npy [B, L, H], dfinal.npy
                 [B, K-1, C] (of final.npy; any one starts the backward, a
                 missing one is zero); optional seq_idx.npy [B, L] (int32
                 or int64: packed sequences, each step's sequence id; a
                 window reads only the steps of its own sequence)
  --out DIR    existing directory; receives y.npy, dt_out.npy, final.npy
               [B, K-1, C]; with the backward also dxbc.npy, ddt.npy,
               dconv_w.npy, ddt_bias.npy, and dconv_b.npy / dinit.npy when
               conv_b.npy / init.npy were given (parameter gradients summed
               over the ranks)
  --no-silu    no SiLU after the convolution
  --dt-min A   lower clamp of dt (default 0)
  --dt-max B   upper clamp of dt (default: none), B >= A
  --split L..  the steps of each rank, P comma-separated counts summing to
               L (zeros allowed); default: as even as possible
  -h, --help   print this help

Prints one line: the sizes, the ranks, and the halo bytes each rank sent.
)";

struct Options {
  std::string in, out, split;
  bool no_silu = false;
  cp::ConvDtOptions cp;
};

std::optional<Options> parse_options(const Args& args) {
  Options o;
  CLI::App app{"", "kdnn cp-conv"};
  app.add_option("--in", o.in)->required()->check(not_an_option());
  app.add_option("--out", o.out)->required()->check(not_an_option());
  app.add_flag("--no-silu", o.no_silu);
  app.add_option("--dt-min", o.cp.dt.dt_min)->check(finite());
  app.add_option("--dt-max", o.cp.dt.dt_max)->check(finite());
  app.add_option("--split", o.split)->check(not_an_option());
  if (!parse(app, args, kHelp)) return std::nullopt;
  if (!(o.cp.dt.dt_min <= o.cp.dt.dt_max)) {
    usage_fail("--dt-max ", o.cp.dt.dt_max, " is below --dt-min ", o.cp.dt.dt_min);
  }
  o.cp.conv.silu = !o.no_silu;
  return o;
}

/// The whole-sequence inputs (on rank 0).
struct Inputs {
  NpyArray x, dt, w, dt_bias;
  std::optional<NpyArray> bias, init, dy, ddt_out, dfinal;
  std::vector<int> seq_idx;  ///< [B, L] from seq_idx.npy, or empty
};

Inputs read_inputs(const std::string& dir) {
  require_directory("--in", dir);
  Inputs in{*read_input(dir, "xbc.npy"),         *read_input(dir, "dt.npy"),
            *read_input(dir, "conv_w.npy"),      *read_input(dir, "dt_bias.npy"),
            read_input(dir, "conv_b.npy", true), read_input(dir, "init.npy", true),
            read_input(dir, "dy.npy", true),     read_input(dir, "ddt_out.npy", true),
            read_input(dir, "dfinal.npy", true)};
  io::require_floating(in.x, "xbc.npy");
  const auto same_dtype = [&](const NpyArray& a, const char* name) {
    if (a.dtype != in.x.dtype) {
      fail(name, " has dtype ", io::dtype_name(a.dtype), ", expected ", io::dtype_name(in.x.dtype),
           " (same as xbc.npy)");
    }
  };
  Dims dims;
  dims.check(in.x, "xbc.npy", {"B", "L", "C"});
  dims.check(in.w, "conv_w.npy", {"C", "K"});
  dims.check(in.dt, "dt.npy", {"B", "L", "H"});
  dims.check(in.dt_bias, "dt_bias.npy", {"H"});
  if (dims["K"] < 1)
    fail("conv_w.npy has shape ", io::format_shape(in.w.shape), ", expected K >= 1");
  for (const NpyArray* a : {&in.w, &in.dt, &in.dt_bias}) {
    same_dtype(*a, a == &in.w ? "conv_w.npy" : a == &in.dt ? "dt.npy" : "dt_bias.npy");
  }
  const std::vector<std::size_t> state = {dims["B"], dims["K"] - 1, dims["C"]};
  const auto optional = [&](const std::optional<NpyArray>& a, const char* name,
                            const std::vector<std::size_t>& shape) {
    if (!a) return;
    same_dtype(*a, name);
    if (a->shape != shape) {
      fail(name, " has shape ", io::format_shape(a->shape), ", expected ", io::format_shape(shape));
    }
    require_finite(*a, name);
  };
  optional(in.bias, "conv_b.npy", {dims["C"]});
  optional(in.init, "init.npy", state);
  optional(in.dy, "dy.npy", in.x.shape);
  optional(in.ddt_out, "ddt_out.npy", in.dt.shape);
  optional(in.dfinal, "dfinal.npy", state);
  require_finite(in.x, "xbc.npy");
  require_finite(in.w, "conv_w.npy");
  require_finite(in.dt, "dt.npy");
  require_finite(in.dt_bias, "dt_bias.npy");
  in.seq_idx = read_sequence_ids(dir, {dims["B"], dims["L"]});
  return in;
}

/// The sizes and flags rank 0 broadcasts.
struct Header {
  std::int64_t f64 = 0, B = 0, L = 0, C = 0, K = 1, H = 0;
  std::int64_t bias = 0, init = 0, dfinal = 0, backward = 0, seq_idx = 0;
};

/// The files the run writes, with their shapes.
std::vector<OutputShape> output_shapes(const Header& h, DType dtype) {
  using S = std::vector<std::size_t>;
  const std::size_t B = h.B, L = h.L, C = h.C, K = h.K, H = h.H;
  std::vector<OutputShape> out = {{"y.npy", dtype, S{B, L, C}},
                                  {"dt_out.npy", dtype, S{B, L, H}},
                                  {"final.npy", dtype, S{B, K - 1, C}}};
  if (!h.backward) return out;
  out.push_back({"dxbc.npy", dtype, S{B, L, C}});
  out.push_back({"ddt.npy", dtype, S{B, L, H}});
  out.push_back({"dconv_w.npy", dtype, S{C, K}});
  out.push_back({"ddt_bias.npy", dtype, S{H}});
  if (h.bias) out.push_back({"dconv_b.npy", dtype, S{C}});
  if (h.init) out.push_back({"dinit.npy", dtype, S{B, K - 1, C}});
  return out;
}

/// The backward on this rank's steps of the forward `f` (its halo the
/// initial state), its outputs collected in `out`; the halo exchange's
/// statistics.
template <class T>
cp::HaloStats backward(const Options& o, const Inputs* in, const Header& h,
                       const cp::ConvDtForward<T, Space>& f, Collector<T>& out) {
  const Sharding& sh = out.s;
  const int rank = sh.rank, P = sh.ranks();
  const MPI_Comm comm = sh.comm;
  const std::int64_t B = h.B, C = h.C, K = h.K, H = h.H, n = sh.mine();
  // A gradient file not given is zero (rank 0 scatters zeros).
  std::vector<T> zeros;
  if (rank == 0 && !(in->dy && in->ddt_out)) {
    zeros.assign(std::size_t(B) * h.L * std::max(C, H), T(0));
  }
  const T* dy_all = rank ? nullptr : in->dy ? in->dy->data<T>() : zeros.data();
  const T* ddt_all = rank ? nullptr : in->ddt_out ? in->ddt_out->data<T>() : zeros.data();
  auto dy_mine = sh.scatter<T>(dy_all, C);
  auto ddt_mine = sh.scatter<T>(ddt_all, H);
  cp::ConvDtBackward<T, Space> g;
  g.conv.x = f.conv.x;
  g.conv.w = f.conv.w;
  g.conv.bias = f.conv.bias;
  g.conv.initial_state = f.halo;
  g.conv.seq_idx = f.conv.seq_idx;
  g.conv.dy = device_view<T***>(dy_mine, B, n, C);
  // d(final state) belongs to the last rank: rank 0 sends it there.
  std::vector<T> dfinal;
  if (h.dfinal) {
    dfinal = send_to_rank<T>(rank ? nullptr : &*in->dfinal, std::size_t(B * (K - 1) * C), P - 1,
                             rank, comm);
    if (rank == P - 1) g.conv.dfinal_state = device_view<T***>(dfinal, B, K - 1, C);
  }
  const auto dx = out.template per_step<T***>("dxbc.npy", C);
  const auto ddt = out.template per_step<T***>("ddt.npy", H);
  Tensor3<T, Space> dinit;
  Matrix<T, Space> dw("dw", C, K);
  Vector<T, Space> dbias, ddt_bias("ddt_bias", H);
  if (h.bias) dbias = Vector<T, Space>("dbias", C);
  if (rank == 0 && h.init) dinit = Tensor3<T, Space>("dinit", B, K - 1, C);
  g.conv.dx = dx;
  g.conv.dw = dw;
  g.conv.dbias = dbias;
  g.conv.dinitial_state = dinit;
  g.dt = f.dt;
  g.dt_bias = f.dt_bias;
  g.ddt_out = device_view<T***>(ddt_mine, B, n, H);
  g.ddt = ddt;
  g.ddt_bias = ddt_bias;
  const cp::HaloStats sb = cp::conv_dt_backward(Space(), comm, g, o.cp);
  cp::allreduce_sum(comm, dw);
  cp::allreduce_sum(comm, ddt_bias);
  if (h.bias) cp::allreduce_sum(comm, dbias);
  out.gathered("dxbc.npy", dx);
  out.gathered("ddt.npy", ddt);
  out.from_rank("dconv_w.npy", dw, 0);
  out.from_rank("ddt_bias.npy", ddt_bias, 0);
  if (h.bias) out.from_rank("dconv_b.npy", dbias, 0);
  if (h.init && rank == 0) out.from_rank("dinit.npy", dinit, 0);
  return sb;
}

template <class T>
int compute(const Options& o, const Inputs* in, const Header& h,
            const std::vector<std::int64_t>& lengths, int rank, MPI_Comm comm) {
  const int P = int(lengths.size());
  const std::int64_t B = h.B, C = h.C, K = h.K, H = h.H, n = lengths[rank];
  const Sharding sh{lengths, B, h.L, rank, comm, "cp-conv"};
  auto x = sh.scatter<T>(rank ? nullptr : in->x.data<T>(), C);
  auto dt = sh.scatter<T>(rank ? nullptr : in->dt.data<T>(), H);
  auto w = broadcast<T>(rank ? nullptr : &in->w, C * K, rank, comm);
  auto dt_bias = broadcast<T>(rank ? nullptr : &in->dt_bias, H, rank, comm);
  std::vector<T> bias =
      h.bias ? broadcast<T>(rank ? nullptr : &*in->bias, C, rank, comm) : std::vector<T>();
  std::vector<T> init;
  if (rank == 0 && h.init) init.assign(in->init->data<T>(), in->init->data<T>() + in->init->size());

  const Space space;
  cp::ConvDtForward<T, Space> f;
  f.conv.x = device_view<T***>(x, B, n, C);
  f.conv.w = device_view<T**>(w, C, K);
  if (h.bias) f.conv.bias = device_view<T*>(bias, C);
  if (!init.empty()) f.conv.initial_state = device_view<T***>(init, B, K - 1, C);
  // Per-step outputs are computed into the output files' buffers when they
  // can be (Collector::per_step): no copy of them.
  Collector<T> out{sh, {}};
  const auto y = out.template per_step<T***>("y.npy", C);
  const auto dt_out = out.template per_step<T***>("dt_out.npy", H);
  Tensor3<T, Space> fin("final", B, K - 1, C), halo("halo", B, K - 1, C);
  f.conv.y = y;
  f.conv.final_state = fin;
  f.halo = halo;
  f.dt = device_view<T***>(dt, B, n, H);
  f.dt_bias = device_view<T*>(dt_bias, H);
  f.dt_out = dt_out;
  Sharding::Steps<int> ids;  // as long as the calls: on a host the View is this memory
  if (h.seq_idx) {
    ids = sh.scatter<int>(rank ? nullptr : in->seq_idx.data(), 1);
    f.conv.seq_idx = device_view<int**>(ids, B, n);
  }
  const cp::HaloStats sf = cp::conv_dt_forward(space, comm, f, o.cp);

  out.gathered("y.npy", y);
  out.gathered("dt_out.npy", dt_out);
  out.from_rank("final.npy", fin, P - 1);

  cp::HaloStats sb;
  if (h.backward) sb = backward(o, in, h, f, out);

  std::int64_t sent[2] = {sf.bytes_sent, sb.bytes_sent}, most[2] = {0, 0};
  MPI_Reduce(sent, most, 2, MPI_INT64_T, MPI_MAX, 0, comm);
  cp::agree(comm, [&] {
    if (rank == 0) write_outputs(o.out, out.outputs);
  });
  if (rank == 0) {
    std::cout << "cp-conv: B=" << B << " L=" << h.L << " C=" << C << " K=" << K << " H=" << H << " "
              << (h.f64 ? "float64" : "float32") << ", " << P << " rank(s), halo bytes "
              << "sent per rank at most " << most[0] << " (forward)";
    if (h.backward) std::cout << ", " << most[1] << " (backward)";
    std::cout << std::endl;
  }
  return 0;
}

int run(const Args& args) {
  const MPI_Comm comm = MPI_COMM_WORLD;
  // Every rank parses the same arguments: usage errors agree by themselves.
  const auto o = parse_options(args);
  if (!o) return 0;
  const auto loaded = load_on_rank0<Header>(comm, o->out, parse_split(o->split, size_of(comm)),
                                            "xbc.npy", [&](Header& h) {
                                              Inputs in = read_inputs(o->in);
                                              h.f64 = in.x.dtype == DType::f64;
                                              h.B = std::int64_t(in.x.shape[0]);
                                              h.L = std::int64_t(in.x.shape[1]);
                                              h.C = std::int64_t(in.x.shape[2]);
                                              h.K = std::int64_t(in.w.shape[1]);
                                              h.H = std::int64_t(in.dt.shape[2]);
                                              h.bias = bool(in.bias);
                                              h.init = bool(in.init);
                                              h.dfinal = bool(in.dfinal);
                                              h.backward = in.dy || in.ddt_out || in.dfinal;
                                              h.seq_idx = !in.seq_idx.empty();
                                              require_output_sizes(output_shapes(h, in.x.dtype));
                                              return in;
                                            });
  const int rank = rank_in(comm);
  const auto& h = loaded.header;
  return h.f64 ? compute<double>(*o, loaded.on_rank0(), h, loaded.lengths, rank, comm)
               : compute<float>(*o, loaded.on_rank0(), h, loaded.lengths, rank, comm);
}

}  // namespace

extern const Subcommand cp_conv_command = {
    "cp-conv", "Mamba-2 conv1d + SiLU and dt softplus, sequence split over MPI ranks", true, run};

}  // namespace kdnn::cli
