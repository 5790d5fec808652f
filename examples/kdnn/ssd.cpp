// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// `kdnn ssd`: Mamba-2's SSD chunked scan with the sequence split across the
// MPI ranks (kdnn/cp/ssd.hpp). Rank 0 reads the whole-sequence arrays,
// scatters each rank's steps, gathers the results and writes them; every
// rank computes. Runs with one rank as well.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "cli.hpp"
#include "cp_io.hpp"
#include "kdnn/core/error.hpp"
#include "kdnn/core/impl/sequence_offsets.hpp"
#include "kdnn/cp/cp.hpp"

namespace kdnn::cli {

namespace {

using io::DType;
using io::NpyArray;

constexpr const char* kHelp =
    R"(usage: mpiexec -n P kdnn ssd --in DIR --out DIR [--chunk Q] [--split L0,L1,...]

Mamba-2's SSD (h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t),
computed by chunks of Q steps over a sequence split across the P ranks, with
the states passed between ranks; forward, and backward when a gradient is
given. Rank 0 reads and writes; the results equal a single-rank run.

  --in DIR     reads from DIR (float32 or float64, all one dtype):
                 x.npy [B, L, H, P], dt.npy [B, L, H] (>= 0, checked), a.npy [H]
                 (A <= 0, checked), b.npy and c.npy [B, L, G, N] (G divides H);
                 optional d.npy [H], init.npy [B, H, P, N] (the initial state),
                 and the gradients dy.npy [B, L, H, P], dfinal.npy [B, H, P, N]
                 (either one starts the backward; a missing one is zero);
                 optional seq_idx.npy [B, L] (int32 or int64: packed
                 sequences, the state reset where the id changes) and, with
                 B = 1, cu_seqlens.npy [S + 1] (the S sequences' offsets: 0
                 first, never decreasing, L last; seq_idx.npy, when given,
                 changes its id exactly there, and is made from them when not)
  --out DIR    existing directory; receives y.npy and final.npy, and with
               cu_seqlens.npy varlen_states.npy [S, H, P, N] (each sequence's
               state after its last step, 0 for an empty one); with the
               backward also dx.npy, ddt.npy, da.npy, db.npy, dc.npy, and
               dd.npy / dinit.npy when d.npy / init.npy were given
               (parameter gradients summed over the ranks)
  --chunk Q    steps per chunk (default 64; L need not be a multiple, and
               a Q above L is one chunk of L steps)
  --split L..  the steps of each rank, P comma-separated counts summing to
               L (zeros allowed); default: as even as possible
  -h, --help   print this help

Prints one line: the sizes, the ranks, and the state bytes each rank sent.
)";

struct Options {
  std::string in, out, split;
  ssm::SsdOptions ssd{64, true};
};

std::optional<Options> parse_options(const Args& args) {
  Options o;
  CLI::App app{"", "kdnn ssd"};
  app.add_option("--in", o.in)->required()->check(not_an_option());
  app.add_option("--out", o.out)->required()->check(not_an_option());
  app.add_option("--chunk", o.ssd.chunk)->check(integer_at_least(1));
  app.add_option("--split", o.split)->check(not_an_option());
  if (!parse(app, args, kHelp)) return std::nullopt;
  return o;
}

/// The whole-sequence inputs (on rank 0).
struct Inputs {
  NpyArray x, dt, a, b, c;
  std::optional<NpyArray> d, init, dy, dfinal;
  std::vector<int> seq_idx;     ///< [B, L] from seq_idx.npy (or cu_seqlens.npy), or empty
  std::vector<int> cu_seqlens;  ///< [S + 1] from cu_seqlens.npy, or empty
};

/// Fails at the first negative element of a finite float array, naming it:
/// "dt.npy: -0.5 at [1, 3, 2] (expected dt >= 0)".
void require_non_negative(const NpyArray& a, const char* file, const char* what) {
  const auto first = [&](const auto* data) {
    std::size_t k = 0;
    while (k < a.size() && !(data[k] < 0)) ++k;
    if (k < a.size()) {
      fail(file, ": ", double(data[k]), " at ", format_index(a.shape, k), " (expected ", what,
           " >= 0)");
    }
  };
  if (a.dtype == DType::f64) {
    first(a.data<double>());
  } else {
    first(a.data<float>());
  }
}

/// cu_seqlens.npy, when `dir` has it, into in.cu_seqlens: checked (B = 1,
/// the offsets of L steps, seq_idx.npy's id changes exactly at them), and
/// in.seq_idx made from it when seq_idx.npy was not given (sequence s's
/// steps get id s).
void read_sequence_offsets(const std::string& dir, std::size_t B, std::size_t L, Inputs& in) {
  const auto file = read_input(dir, "cu_seqlens.npy", true);
  if (!file) return;
  if (file->shape.size() != 1) {
    fail("cu_seqlens.npy has shape ", io::format_shape(file->shape), ", expected [S + 1]");
  }
  if (B != 1) {
    fail("cu_seqlens.npy is given with B=", B,
         " (x.npy's axis 0), expected B=1 (the sequences are packed along L of one batch entry)");
  }
  std::vector<int> cu = io::read_int_vector(*file, "cu_seqlens.npy");
  using HostView = Kokkos::View<int*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  kdnn::impl::host_sequence_offsets("ssd", "cu_seqlens.npy", Kokkos::DefaultHostExecutionSpace(),
                                    HostView(cu.data(), cu.size()), L, "L, x.npy's axis 1");
  if (in.seq_idx.empty()) {
    in.seq_idx.resize(L);
    for (std::size_t s = 0; s + 1 < cu.size(); ++s) {
      std::fill(in.seq_idx.begin() + cu[s], in.seq_idx.begin() + cu[s + 1], int(s));
    }
  } else {
    for (std::size_t t = 1; t < L; ++t) {
      const bool start = std::binary_search(cu.begin(), cu.end(), int(t));
      if (start != (in.seq_idx[t] != in.seq_idx[t - 1])) {
        fail("seq_idx.npy[0, ", t - 1, "]=", in.seq_idx[t - 1], ", seq_idx.npy[0, ", t,
             "]=", in.seq_idx[t],
             start ? ", expected a new id: cu_seqlens.npy starts a sequence at step "
                   : ", expected the same id: cu_seqlens.npy starts no sequence at step ",
             t);
      }
    }
  }
  in.cu_seqlens = std::move(cu);
}

Inputs read_inputs(const std::string& dir) {
  require_directory("--in", dir);
  Inputs in{*read_input(dir, "x.npy"),          *read_input(dir, "dt.npy"),
            *read_input(dir, "a.npy"),          *read_input(dir, "b.npy"),
            *read_input(dir, "c.npy"),          read_input(dir, "d.npy", true),
            read_input(dir, "init.npy", true),  read_input(dir, "dy.npy", true),
            read_input(dir, "dfinal.npy", true)};
  io::require_floating(in.x, "x.npy");
  Dims dims;
  dims.check(in.x, "x.npy", {"B", "L", "H", "P"});
  dims.check(in.dt, "dt.npy", {"B", "L", "H"});
  dims.check(in.a, "a.npy", {"H"});
  dims.check(in.b, "b.npy", {"B", "L", "G", "N"});
  dims.check(in.c, "c.npy", {"B", "L", "G", "N"});
  const std::vector<std::size_t> state = {dims["B"], dims["H"], dims["P"], dims["N"]};
  const auto check = [&](const NpyArray& a, const char* name) {
    if (a.dtype != in.x.dtype) {
      fail(name, " has dtype ", io::dtype_name(a.dtype), ", expected ", io::dtype_name(in.x.dtype),
           " (same as x.npy)");
    }
    require_finite(a, name);
  };
  const auto optional = [&](const std::optional<NpyArray>& a, const char* name,
                            const std::vector<std::size_t>& shape) {
    if (!a) return;
    if (a->shape != shape) {
      fail(name, " has shape ", io::format_shape(a->shape), ", expected ", io::format_shape(shape));
    }
    check(*a, name);
  };
  check(in.x, "x.npy");
  check(in.dt, "dt.npy");
  require_non_negative(in.dt, "dt.npy", "dt");
  check(in.a, "a.npy");
  check(in.b, "b.npy");
  check(in.c, "c.npy");
  optional(in.d, "d.npy", {dims["H"]});
  optional(in.init, "init.npy", state);
  optional(in.dy, "dy.npy", in.x.shape);
  optional(in.dfinal, "dfinal.npy", state);
  in.seq_idx = read_sequence_ids(dir, {dims["B"], dims["L"]});
  read_sequence_offsets(dir, dims["B"], dims["L"], in);
  return in;
}

/// The sizes and flags rank 0 broadcasts.
struct Header {
  std::int64_t f64 = 0, B = 0, L = 0, H = 0, P = 0, G = 0, N = 0;
  std::int64_t d = 0, init = 0, dfinal = 0, backward = 0, seq_idx = 0;
  std::int64_t offsets = 0;  ///< S + 1 with cu_seqlens.npy, else 0
};

/// Where each packed sequence's final state is computed: the rank that
/// holds its last step, and the segment of that rank's own offsets
/// (cp::ssd_forward's cu_seqlens) that ends there; rank −1 for an empty
/// sequence, whose state is 0.
struct StateSource {
  int rank = -1, segment = 0;
};

/// Rank r's own offsets of the packed sequences `cu` (cp::ssd_forward's
/// cu_seqlens): 0, each distinct offset strictly inside its steps
/// [start, start + n), shifted by start, then n. Its segments are never
/// empty (for n > 0), so each is the part of one sequence on the rank.
std::vector<int> rank_offsets(const std::vector<int>& cu, std::int64_t start, std::int64_t n) {
  std::vector<int> own = {0};
  for (const int o : cu) {
    if (o > start && o < start + n && o - start != own.back()) own.push_back(int(o - start));
  }
  own.push_back(int(n));
  return own;
}

std::vector<StateSource> state_sources(const std::vector<int>& cu, const Sharding& sh) {
  std::vector<StateSource> sources(cu.empty() ? 0 : cu.size() - 1);
  // The ranks in order, each one's offsets made once; the sequences in
  // order, each taken by the rank where it ends.
  std::size_t s = 0;
  std::int64_t start = 0;
  for (int r = 0; r < sh.ranks(); start += sh.lengths[r], ++r) {
    const auto own = rank_offsets(cu, start, sh.lengths[r]);
    for (; s < sources.size() && cu[s + 1] <= start + sh.lengths[r]; ++s) {
      if (cu[s] == cu[s + 1]) continue;
      const auto end = std::upper_bound(own.begin(), own.end(), int(cu[s + 1] - 1 - start));
      sources[s] = {r, int(end - own.begin()) - 1};
    }
  }
  return sources;
}

/// The files the run writes, with their shapes, then the largest work
/// buffers of cp::ssd_forward / ssd_backward on R ranks: a summary of
/// B·H·(1 + P·N) values per rank (B·H·(1 + 2·P·N) in the backward), sent and
/// gathered from all R ranks, and the chunk decays (at least B·H values),
/// there even when the sequence is empty.
std::vector<OutputShape> output_shapes(const Header& h, DType dtype, int R) {
  using S = std::vector<std::size_t>;
  const std::size_t B = h.B, L = h.L, H = h.H, P = h.P, G = h.G, N = h.N;
  std::vector<OutputShape> out = {{"y.npy", dtype, S{B, L, H, P}},
                                  {"final.npy", dtype, S{B, H, P, N}}};
  if (h.backward) {
    out.push_back({"dx.npy", dtype, S{B, L, H, P}});
    out.push_back({"ddt.npy", dtype, S{B, L, H}});
    out.push_back({"da.npy", dtype, S{H}});
    out.push_back({"db.npy", dtype, S{B, L, G, N}});
    out.push_back({"dc.npy", dtype, S{B, L, G, N}});
    if (h.d) out.push_back({"dd.npy", dtype, S{H}});
    if (h.init) out.push_back({"dinit.npy", dtype, S{B, H, P, N}});
  }
  if (h.offsets)
    out.push_back({"varlen_states.npy", dtype, S{std::size_t(h.offsets) - 1, H, P, N}});
  // No overflow: B, H, P, N are at most 2^31 - 1.
  out.push_back({"the state passing's buffers", dtype,
                 S{std::size_t(R) + 2, B * H, 1 + (h.backward ? 2 : 1) * P * N}});
  return out;
}

/// varlen_states.npy [S, H, P, N] on rank 0: each rank sends the states of
/// the sequences that end on it (`sources`, in sequence order; `states` its
/// cp::ssd_forward sequence_states); an empty sequence's state is 0.
template <class T>
void gather_sequence_states(Collector<T>& out, const std::vector<StateSource>& sources,
                            const Tensor4<T, Space>& states, std::int64_t state_size) {
  const Sharding& sh = out.s;
  const std::size_t S = sources.size(), E = std::size_t(state_size);
  std::vector<T> mine;
  if (states.size() > 0) copy_back(states, mine);
  io::NpyArray whole;
  if (sh.rank == 0) {
    whole = io::allocate_npy(io::dtype_of<T>(),
                             {S, states.extent(1), states.extent(2), states.extent(3)});
    std::fill(whole.data<T>(), whole.data<T>() + whole.size(), T(0));
  }
  for (int r = 0; r < sh.ranks(); ++r) {
    std::vector<std::size_t> ends;  // the sequences whose state rank r holds
    for (std::size_t s = 0; s < S; ++s) {
      if (sources[s].rank == r) ends.push_back(s);
    }
    if (ends.empty() || (sh.rank != 0 && sh.rank != r)) continue;
    std::vector<T> part(ends.size() * E);
    if (sh.rank == r) {
      for (std::size_t i = 0; i < ends.size(); ++i) {
        const auto row = mine.begin() + std::ptrdiff_t(sources[ends[i]].segment * E);
        std::copy(row, row + std::ptrdiff_t(E), part.begin() + std::ptrdiff_t(i * E));
      }
      if (r != 0) MPI_Send(part.data(), int(part.size()), cp::impl::mpi_type<T>(), 0, 3, sh.comm);
    } else {
      MPI_Recv(part.data(), int(part.size()), cp::impl::mpi_type<T>(), r, 3, sh.comm,
               MPI_STATUS_IGNORE);
    }
    if (sh.rank != 0) continue;
    for (std::size_t i = 0; i < ends.size(); ++i) {
      std::copy(part.begin() + std::ptrdiff_t(i * E), part.begin() + std::ptrdiff_t((i + 1) * E),
                whole.data<T>() + ends[i] * E);
    }
  }
  if (sh.rank == 0) out.outputs.push_back({"varlen_states.npy", std::move(whole)});
}

/// The backward on this rank's steps of the forward `f`, its outputs
/// collected in `out`; the state passing's statistics.
template <class T>
cp::StateStats backward(const Options& o, const Inputs* in, const Header& h,
                        const ssm::SsdForward<T, Space>& f, Collector<T>& out) {
  const Sharding& sh = out.s;
  const int rank = sh.rank, R = sh.ranks();
  const MPI_Comm comm = sh.comm;
  const std::int64_t B = h.B, H = h.H, P = h.P, G = h.G, N = h.N, n = sh.mine();
  // A gradient file not given is zero (rank 0 scatters zeros).
  std::vector<T> zeros;
  if (rank == 0 && !in->dy) zeros.assign(std::size_t(B) * h.L * H * P, T(0));
  auto dy = sh.scatter<T>(rank ? nullptr : in->dy ? in->dy->data<T>() : zeros.data(), H * P);
  // d(final state) belongs to the last rank: rank 0 sends it there.
  std::vector<T> dfinal;
  if (h.dfinal) {
    dfinal = send_to_rank<T>(rank ? nullptr : &*in->dfinal, std::size_t(B * H * P * N), R - 1, rank,
                             comm);
  }
  ssm::SsdBackward<T, Space> g;
  g.x = f.x, g.dt = f.dt, g.A = f.A, g.B = f.B, g.C = f.C, g.D = f.D;
  g.initial_state = f.initial_state, g.seq_idx = f.seq_idx;
  g.dy = device_view<T****>(dy, B, n, H, P);
  if (h.dfinal && rank == R - 1) g.dfinal_state = device_view<T****>(dfinal, B, H, P, N);
  const auto dx = out.template per_step<T****>("dx.npy", H, P);
  const auto ddt = out.template per_step<T***>("ddt.npy", H);
  const auto db = out.template per_step<T****>("db.npy", G, N);
  const auto dc = out.template per_step<T****>("dc.npy", G, N);
  Tensor4<T, Space> dinit;
  Vector<T, Space> da("da", H), dd;
  if (h.d) dd = Vector<T, Space>("dd", H);
  if (rank == 0 && h.init) dinit = Tensor4<T, Space>("dinit", B, H, P, N);
  g.dx = dx, g.ddt = ddt, g.dA = da, g.dB = db, g.dC = dc, g.dD = dd, g.dinitial_state = dinit;
  const cp::StateStats sb = cp::ssd_backward(Space(), comm, g, o.ssd);
  cp::allreduce_sum(comm, da);
  if (h.d) cp::allreduce_sum(comm, dd);
  out.gathered("dx.npy", dx);
  out.gathered("ddt.npy", ddt);
  out.gathered("db.npy", db);
  out.gathered("dc.npy", dc);
  out.from_rank("da.npy", da, 0);
  if (h.d) out.from_rank("dd.npy", dd, 0);
  if (h.init && rank == 0) out.from_rank("dinit.npy", dinit, 0);
  return sb;
}

template <class T>
int compute(const Options& o, const Inputs* in, const Header& h,
            const std::vector<std::int64_t>& lengths, int rank, MPI_Comm comm) {
  const int R = int(lengths.size());
  const std::int64_t B = h.B, H = h.H, P = h.P, G = h.G, N = h.N, n = lengths[rank];
  const Sharding sh{lengths, B, h.L, rank, comm, "ssd"};
  auto x = sh.scatter<T>(rank ? nullptr : in->x.data<T>(), H * P);
  auto dt = sh.scatter<T>(rank ? nullptr : in->dt.data<T>(), H);
  auto b = sh.scatter<T>(rank ? nullptr : in->b.data<T>(), G * N);
  auto c = sh.scatter<T>(rank ? nullptr : in->c.data<T>(), G * N);
  auto a = broadcast<T>(rank ? nullptr : &in->a, H, rank, comm);
  std::vector<T> d = h.d ? broadcast<T>(rank ? nullptr : &*in->d, H, rank, comm) : std::vector<T>();
  std::vector<T> init;
  if (rank == 0 && h.init) init.assign(in->init->data<T>(), in->init->data<T>() + in->init->size());

  const Space space;
  ssm::SsdForward<T, Space> f;
  f.x = device_view<T****>(x, B, n, H, P);
  f.dt = device_view<T***>(dt, B, n, H);
  f.A = device_view<T*>(a, H);
  f.B = device_view<T****>(b, B, n, G, N);
  f.C = device_view<T****>(c, B, n, G, N);
  if (h.d) f.D = device_view<T*>(d, H);
  if (!init.empty()) f.initial_state = device_view<T****>(init, B, H, P, N);
  // Per-step outputs are computed into the output files' buffers when they
  // can be (Collector::per_step): no copy of them.
  Collector<T> out{sh, {}};
  const auto y = out.template per_step<T****>("y.npy", H, P);
  Tensor4<T, Space> fin("final", B, H, P, N);
  f.y = y;
  f.final_state = fin;
  Sharding::Steps<int> ids;  // as long as the calls: on a host the View is this memory
  if (h.seq_idx) {
    ids = sh.scatter<int>(rank ? nullptr : in->seq_idx.data(), 1);
    f.seq_idx = device_view<int**>(ids, B, n);
  }
  // Packed sequences' states: the offsets on every rank, and each rank's
  // own (kept alive with the call: on a host the View is this memory).
  std::vector<int> cu, own;
  if (h.offsets) {
    cu.resize(std::size_t(h.offsets));
    if (rank == 0) cu = in->cu_seqlens;
    MPI_Bcast(cu.data(), int(cu.size()), MPI_INT, 0, comm);
    const std::int64_t S = h.offsets - 1;  // S·H·P·N fits 63 bits: output_shapes checked it
    if (S * H * P * N > INT_MAX) {         // the same on every rank
      fail("cu_seqlens.npy: ", S, " sequences' states of H·P·N=", H * P * N,
           " values, expected at most 2^31 - 1 values in all (MPI counts are int)");
    }
    if (n > 0) {
      own = rank_offsets(cu, sh.offset(rank), n);
      f.cu_seqlens = device_view<int*>(own, own.size());
      f.sequence_states = Tensor4<T, Space>("sequence_states", own.size() - 1, H, P, N);
    }
  }
  const cp::StateStats sf = cp::ssd_forward(space, comm, f, o.ssd);

  out.gathered("y.npy", y);
  out.from_rank("final.npy", fin, R - 1);
  if (h.offsets) gather_sequence_states(out, state_sources(cu, sh), f.sequence_states, H * P * N);

  cp::StateStats sb;
  if (h.backward) sb = backward(o, in, h, f, out);

  cp::agree(comm, [&] {
    if (rank == 0) write_outputs(o.out, out.outputs);
  });
  if (rank == 0) {
    std::cout << "ssd: B=" << B << " L=" << h.L << " H=" << H << " P=" << P << " G=" << G
              << " N=" << N << " Q=" << o.ssd.chunk << " " << (h.f64 ? "float64" : "float32")
              << ", " << R << " rank(s), state bytes sent by rank 0 " << sf.bytes_sent
              << " (forward)";
    if (h.backward) std::cout << ", " << sb.bytes_sent << " (backward)";
    std::cout << std::endl;
  }
  return 0;
}

int run(const Args& args) {
  const MPI_Comm comm = MPI_COMM_WORLD;
  const int R = size_of(comm);
  const auto o = parse_options(args);  // the same arguments on every rank
  if (!o) return 0;
  const auto loaded =
      load_on_rank0<Header>(comm, o->out, parse_split(o->split, R), "x.npy", [&](Header& h) {
        Inputs in = read_inputs(o->in);
        h.f64 = in.x.dtype == DType::f64;
        h.B = std::int64_t(in.x.shape[0]);
        h.L = std::int64_t(in.x.shape[1]);
        h.H = std::int64_t(in.x.shape[2]);
        h.P = std::int64_t(in.x.shape[3]);
        h.G = std::int64_t(in.b.shape[2]);
        h.N = std::int64_t(in.b.shape[3]);
        h.d = bool(in.d);
        h.init = bool(in.init);
        h.dfinal = bool(in.dfinal);
        h.backward = in.dy || in.dfinal;
        h.seq_idx = !in.seq_idx.empty();
        h.offsets = std::int64_t(in.cu_seqlens.size());
        require_output_sizes(output_shapes(h, in.x.dtype, R));
        return in;
      });
  const int rank = rank_in(comm);
  const auto& h = loaded.header;
  return h.f64 ? compute<double>(*o, loaded.on_rank0(), h, loaded.lengths, rank, comm)
               : compute<float>(*o, loaded.on_rank0(), h, loaded.lengths, rank, comm);
}

}  // namespace

extern const Subcommand ssd_command = {
    "ssd", "Mamba-2 SSD chunked scan, sequence split over MPI ranks", true, run};

}  // namespace kdnn::cli
