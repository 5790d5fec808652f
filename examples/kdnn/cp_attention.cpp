// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// `kdnn cp-attention`: the fused attention with the sequence split across the
// MPI ranks (kdnn/cp/attention.hpp). Rank 0 reads the whole-sequence arrays
// (flash-attn's [B, S, H, D] layout), puts their steps in the layout's order
// (each rank's segments one after another), scatters each rank's steps,
// gathers the results, puts them back in sequence order and writes them;
// every rank computes. Runs with one rank as well.
#include <mpi.h>

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
    R"(usage: mpiexec -n P kdnn cp-attention --in DIR --out DIR [--causal]
                     [--band LEFT,RIGHT] [--scale S] [--softcap C]
                     [--comm ring|all_gather|all_to_all]
                     [--layout contiguous|load_balanced] [--split L0,L1,...]

Fused (flash) attention over a sequence split across the P ranks, forward,
and backward when a gradient is given; the results equal a single-rank
run. Rank 0 reads and writes.

  --in DIR     reads from DIR (float32 or float64, all one dtype; flash-attn's
               layout): q.npy [B, S, H, D], k.npy [B, S, Hkv, D], v.npy
               [B, S, Hkv, Dv] (Hkv divides H); optional sinks.npy [H] (a
               logit per head that joins every softmax) and dout.npy
               [B, S, H, Dv] (the gradient of o; starts the backward)
  --out DIR    existing directory; receives o.npy [B, S, H, Dv] and lse.npy
               [B, H, S]; with the backward also dq.npy, dk.npy, dv.npy and
               dsinks.npy when sinks.npy was given
  --causal     query i sees keys j <= i
  --band L,R   query i sees keys i - L <= j <= i + R (-1: no bound that side)
  --scale S    the scores' scale (default 1/sqrt(D))
  --softcap C  scores capped as C·tanh(s/C) (default 0: none)
  --comm T     how the ranks exchange: ring (default; K/V blocks around the
               ranks), all_gather (K/V gathered), all_to_all (heads
               scattered, the sequence gathered)
  --layout L   contiguous (default; --split or as even as possible) or
               load_balanced (2P chunks, rank r holding r and 2P-1-r)
  --split L..  contiguous: the steps of each rank, P comma-separated counts
               summing to S (zeros allowed)
  -h, --help   print this help

Prints one line: the sizes, the ranks, the layout and communication, and the
bytes each rank sent at most.
)";

struct Options {
  std::string in, out, split, band, comm = "ring", layout = "contiguous";
  bool causal = false;
  double scale = 0, softcap = 0;
};

std::optional<Options> parse_options(const Args& args) {
  Options o;
  CLI::App app{"", "kdnn cp-attention"};
  app.add_option("--in", o.in)->required()->check(not_an_option());
  app.add_option("--out", o.out)->required()->check(not_an_option());
  app.add_flag("--causal", o.causal);
  app.add_option("--band", o.band)->check(not_an_option());
  app.add_option("--scale", o.scale)->check(finite());
  app.add_option("--softcap", o.softcap)->check(finite());
  app.add_option("--comm", o.comm)->check(CLI::IsMember({"ring", "all_gather", "all_to_all"}));
  app.add_option("--layout", o.layout)->check(CLI::IsMember({"contiguous", "load_balanced"}));
  app.add_option("--split", o.split)->check(not_an_option());
  if (!parse(app, args, kHelp)) return std::nullopt;
  if (o.layout == "load_balanced" && !o.split.empty()) {
    usage_fail("--split is for --layout contiguous, not load_balanced");
  }
  if (o.softcap < 0) usage_fail("--softcap ", o.softcap, " is negative, expected C >= 0");
  if (o.scale < 0) usage_fail("--scale ", o.scale, " is negative, expected S > 0");
  return o;
}

/// --band "L,R" as the mask's band (none: no band).
std::pair<int, int> parse_band(const std::string& text) {
  if (text.empty()) return {-1, -1};
  const auto comma = text.find(',');
  const auto bound = [&](const std::string& s) {
    std::size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != s.size() || s.empty() || v < -1) {
      usage_fail("--band: expected LEFT,RIGHT, integers >= -1, got '", text, "'");
    }
    return v;
  };
  if (comma == std::string::npos) usage_fail("--band: expected LEFT,RIGHT, got '", text, "'");
  return {bound(text.substr(0, comma)), bound(text.substr(comma + 1))};
}

/// The whole-sequence inputs (on rank 0).
struct Inputs {
  NpyArray q, k, v;
  std::optional<NpyArray> sinks, dout;
};

Inputs read_inputs(const std::string& dir) {
  require_directory("--in", dir);
  Inputs in{*read_input(dir, "q.npy"), *read_input(dir, "k.npy"), *read_input(dir, "v.npy"),
            read_input(dir, "sinks.npy", true), read_input(dir, "dout.npy", true)};
  io::require_floating(in.q, "q.npy");
  Dims dims;
  dims.check(in.q, "q.npy", {"B", "S", "H", "D"});
  dims.check(in.k, "k.npy", {"B", "S", "Hkv", "D"});
  dims.check(in.v, "v.npy", {"B", "S", "Hkv", "Dv"});
  if (dims["Hkv"] == 0 || dims["H"] % dims["Hkv"] != 0) {
    fail("k.npy has Hkv=", dims["Hkv"], " heads, expected a divisor of q.npy's H=", dims["H"]);
  }
  const auto same_dtype = [&](const NpyArray& a, const char* name) {
    if (a.dtype != in.q.dtype) {
      fail(name, " has dtype ", io::dtype_name(a.dtype), ", expected ", io::dtype_name(in.q.dtype),
           " (same as q.npy)");
    }
    require_finite(a, name);
  };
  same_dtype(in.q, "q.npy");
  same_dtype(in.k, "k.npy");
  same_dtype(in.v, "v.npy");
  if (in.sinks) {
    dims.check(*in.sinks, "sinks.npy", {"H"});
    if (in.sinks->dtype != in.q.dtype) same_dtype(*in.sinks, "sinks.npy");
  }
  if (in.dout) {
    dims.check(*in.dout, "dout.npy", {"B", "S", "H", "Dv"});
    same_dtype(*in.dout, "dout.npy");
  }
  return in;
}

/// The sizes and flags rank 0 broadcasts.
struct Header {
  std::int64_t f64 = 0, B = 0, L = 0, H = 0, Hkv = 0, D = 0, Dv = 0;
  std::int64_t sinks = 0, backward = 0;
};

/// The files the run writes, with their shapes.
std::vector<OutputShape> output_shapes(const Header& h, DType dtype) {
  using S = std::vector<std::size_t>;
  const std::size_t B = h.B, L = h.L, H = h.H, Hkv = h.Hkv, D = h.D, Dv = h.Dv;
  std::vector<OutputShape> out = {{"o.npy", dtype, S{B, L, H, Dv}}, {"lse.npy", dtype, S{B, H, L}}};
  if (!h.backward) return out;
  out.push_back({"dq.npy", dtype, S{B, L, H, D}});
  out.push_back({"dk.npy", dtype, S{B, L, Hkv, D}});
  out.push_back({"dv.npy", dtype, S{B, L, Hkv, Dv}});
  if (h.sinks) out.push_back({"dsinks.npy", dtype, S{H}});
  return out;
}

/// The global steps in the layout's order: rank 0's segments, then rank 1's, ….
std::vector<std::int64_t> layout_order(const cp::SequenceLayout& layout) {
  std::vector<std::int64_t> order;
  for (int r = 0; r < layout.ranks(); ++r) {
    for (const cp::Segment& s : layout.segments(r)) {
      for (std::int64_t t = s.begin; t < s.end; ++t) order.push_back(t);
    }
  }
  return order;
}

/// a [B, L, E] (rank 0's whole array): step i ← step order[i] (`to_layout`),
/// or the inverse.
template <class T>
void reorder_steps(T* a, std::int64_t B, std::int64_t L, std::int64_t E,
                   const std::vector<std::int64_t>& order, bool to_layout) {
  std::vector<T> row(std::size_t(L * E));
  for (std::int64_t b = 0; b < B; ++b) {
    T* base = a + b * L * E;
    std::copy(base, base + L * E, row.begin());
    for (std::int64_t i = 0; i < L; ++i) {
      const std::int64_t from = to_layout ? order[std::size_t(i)] : i;
      const std::int64_t to = to_layout ? i : order[std::size_t(i)];
      std::copy(row.begin() + from * E, row.begin() + (from + 1) * E, base + to * E);
    }
  }
}

/// A [B, n, H, E] View (flash-attn's layout) as the [B, H, n, E] the
/// operator takes, over the same memory.
template <class View>
auto heads_first(const View& v) {
  using T = typename View::value_type;
  return Kokkos::View<T****, Kokkos::LayoutStride, typename View::memory_space>(
      v.data(), Kokkos::LayoutStride(v.extent(0), v.stride(0), v.extent(2), v.stride(2),
                                     v.extent(1), v.stride(1), v.extent(3), v.stride(3)));
}

template <class T>
int compute(const Options& o, Inputs* in, const Header& h, const cp::SequenceLayout& layout,
            int rank, MPI_Comm comm) {
  const int P = layout.ranks();
  std::vector<std::int64_t> lengths;
  for (int r = 0; r < P; ++r) lengths.push_back(layout.local_steps(r));
  const std::int64_t B = h.B, H = h.H, Hkv = h.Hkv, D = h.D, Dv = h.Dv, n = lengths[rank];
  const auto order = layout_order(layout);
  const bool reordered = !layout.is_contiguous();
  if (rank == 0 && reordered) {  // the steps in the order the ranks hold them
    reorder_steps(in->q.data<T>(), B, h.L, H * D, order, true);
    reorder_steps(in->k.data<T>(), B, h.L, Hkv * D, order, true);
    reorder_steps(in->v.data<T>(), B, h.L, Hkv * Dv, order, true);
    if (in->dout) reorder_steps(in->dout->data<T>(), B, h.L, H * Dv, order, true);
  }
  const Sharding sh{lengths, B, h.L, rank, comm, "cp-attention"};
  auto q = sh.scatter<T>(rank ? nullptr : in->q.data<T>(), H * D);
  auto k = sh.scatter<T>(rank ? nullptr : in->k.data<T>(), Hkv * D);
  auto v = sh.scatter<T>(rank ? nullptr : in->v.data<T>(), Hkv * Dv);
  std::vector<T> sinks =
      h.sinks ? broadcast<T>(rank ? nullptr : &*in->sinks, std::size_t(H), rank, comm)
              : std::vector<T>();

  attention::FusedAttentionOptions opts;
  opts.scale = o.scale > 0 ? o.scale : 1.0 / std::sqrt(double(D));
  opts.softcap = o.softcap;
  cp::CpAttentionOptions how;
  how.comm = o.comm == "all_gather"   ? cp::AttentionComm::all_gather
             : o.comm == "all_to_all" ? cp::AttentionComm::all_to_all
                                      : cp::AttentionComm::ring;
  attention::FusedAttentionForward<T, Space> f;
  const auto q_dev = device_view<T****>(q, B, n, H, D);
  const auto k_dev = device_view<T****>(k, B, n, Hkv, D);
  const auto v_dev = device_view<T****>(v, B, n, Hkv, Dv);
  f.q = heads_first(q_dev), f.k = heads_first(k_dev), f.v = heads_first(v_dev);
  Collector<T> out{sh, {}};
  const auto o_dev = out.template per_step<T****>("o.npy", H, Dv);
  Tensor3<T, Space> lse("lse", B, H, n);
  f.o = heads_first(o_dev), f.lse = lse;
  f.mask.causal = o.causal;
  std::tie(f.mask.band_left, f.mask.band_right) = parse_band(o.band);
  if (h.sinks) f.sinks = device_view<T*>(sinks, H);
  const cp::ExchangeStats sf = cp::fused_attention_forward(Space(), comm, layout, f, opts, how);

  // lse [B, H, n] → [B, n, H] to gather by steps; rank 0 turns it back.
  const auto lse_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), lse);
  Kokkos::View<T***, Kokkos::LayoutRight, Kokkos::HostSpace> lse_steps("lse_steps", B, n, H);
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t hh = 0; hh < H; ++hh) {
      for (std::int64_t t = 0; t < n; ++t) lse_steps(b, t, hh) = lse_host(b, hh, t);
    }
  }
  out.gathered("o.npy", o_dev);
  out.gathered("lse.npy", lse_steps);

  cp::ExchangeStats sb;
  if (h.backward) {
    auto dout = sh.scatter<T>(rank ? nullptr : in->dout->data<T>(), H * Dv);
    attention::FusedAttentionBackward<T, Space> g;
    g.q = f.q, g.k = f.k, g.v = f.v, g.o = f.o, g.lse = lse, g.mask = f.mask, g.sinks = f.sinks;
    const auto dout_dev = device_view<T****>(dout, B, n, H, Dv);
    g.dout = heads_first(dout_dev);
    const auto dq = out.template per_step<T****>("dq.npy", H, D);
    const auto dk = out.template per_step<T****>("dk.npy", Hkv, D);
    const auto dv = out.template per_step<T****>("dv.npy", Hkv, Dv);
    g.dq = heads_first(dq), g.dk = heads_first(dk), g.dv = heads_first(dv);
    Vector<T, Space> dsinks;
    if (h.sinks) g.dsinks = dsinks = Vector<T, Space>("dsinks", H);
    sb = cp::fused_attention_backward(Space(), comm, layout, g, opts, how);
    if (h.sinks) cp::allreduce_sum(comm, dsinks);
    out.gathered("dq.npy", dq);
    out.gathered("dk.npy", dk);
    out.gathered("dv.npy", dv);
    if (h.sinks) out.from_rank("dsinks.npy", dsinks, 0);
  }

  std::int64_t sent[2] = {sf.bytes_sent, sb.bytes_sent}, most[2] = {0, 0};
  MPI_Reduce(sent, most, 2, MPI_INT64_T, MPI_MAX, 0, comm);
  cp::agree(comm, [&] {
    if (rank != 0) return;
    for (Output& file : out.outputs) {  // back in sequence order
      const auto& s = file.array.shape;
      if (file.name == "lse.npy") {  // gathered [B, S, H]: to [B, H, S]
        NpyArray t = io::allocate_npy(file.array.dtype, {s[0], s[2], s[1]});
        const T* from = file.array.template data<T>();
        T* to = t.template data<T>();
        for (std::size_t b = 0; b < s[0]; ++b) {
          for (std::size_t i = 0; i < s[1]; ++i) {
            const std::size_t step = reordered ? std::size_t(order[i]) : i;
            for (std::size_t x = 0; x < s[2]; ++x) {
              to[(b * s[2] + x) * s[1] + step] = from[(b * s[1] + i) * s[2] + x];
            }
          }
        }
        file.array = std::move(t);
      } else if (reordered && s.size() == 4) {
        reorder_steps(file.array.template data<T>(), std::int64_t(s[0]), std::int64_t(s[1]),
                      std::int64_t(s[2] * s[3]), order, false);
      }
    }
    write_outputs(o.out, out.outputs);
  });
  if (rank == 0) {
    std::cout << "cp-attention: B=" << B << " S=" << h.L << " H=" << H << " Hkv=" << Hkv
              << " D=" << D << " Dv=" << Dv << " " << (h.f64 ? "float64" : "float32") << ", " << P
              << " rank(s), " << o.layout << " layout, " << o.comm << ", bytes sent per rank at "
              << "most " << most[0] << " (forward)";
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
  parse_band(o->band);  // a usage error before anything is read
  auto loaded = load_on_rank0<Header>(comm, o->out, parse_split(o->split, size_of(comm)), "q.npy",
                                      [&](Header& h) {
                                        Inputs in = read_inputs(o->in);
                                        h.f64 = in.q.dtype == DType::f64;
                                        h.B = std::int64_t(in.q.shape[0]);
                                        h.L = std::int64_t(in.q.shape[1]);
                                        h.H = std::int64_t(in.q.shape[2]);
                                        h.D = std::int64_t(in.q.shape[3]);
                                        h.Hkv = std::int64_t(in.k.shape[2]);
                                        h.Dv = std::int64_t(in.v.shape[3]);
                                        h.sinks = bool(in.sinks);
                                        h.backward = bool(in.dout);
                                        require_output_sizes(output_shapes(h, in.q.dtype));
                                        return in;
                                      });
  const int rank = rank_in(comm);
  const auto& h = loaded.header;
  const auto layout = o->layout == "load_balanced"
                          ? cp::SequenceLayout::load_balanced(h.L, size_of(comm))
                          : cp::SequenceLayout::contiguous(loaded.lengths);
  Inputs* in = loaded.inputs ? &*loaded.inputs : nullptr;
  return h.f64 ? compute<double>(*o, in, h, layout, rank, comm)
               : compute<float>(*o, in, h, layout, rank, comm);
}

}  // namespace

extern const Subcommand cp_attention_command = {
    "cp-attention", "fused attention, sequence split over MPI ranks (ring, all-gather, all-to-all)",
    true, run};

}  // namespace kdnn::cli
