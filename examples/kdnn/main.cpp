// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// kdnn: the command-line front end of the kdnn operators. One subcommand per
// operator family, each in its own file; each reads its inputs from .npy
// files in --in DIR and writes its outputs to --out DIR, all or nothing.
//
// Exit status: 0 on success, 1 for bad input data or a failed computation or
// write (of the outputs, or of stdout, after the outputs were written), 2 for
// command-line usage errors. Errors print one line
// "kdnn: error: <message>" to stderr; on success stderr stays empty.
//
// Kokkos is initialised once, with its warnings off; --kokkos-* arguments,
// anywhere on the command line, go to Kokkos and not to the subcommand. MPI
// is initialised only when an MPI launcher started the process or the
// subcommand is context parallel (a singleton MPI_Init costs a noticeable
// fraction of a second). With MPI, rank 0 reads, writes and prints; a
// subcommand that is not context parallel runs on rank 0 only, and every
// rank exits with its status.
#include <Kokkos_Core.hpp>
#ifdef KDNN_ENABLE_MPI
#include <mpi.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <iomanip>
#include <iostream>
#include <string>

#include "cli.hpp"
#include "kdnn/core/compat.hpp"
#include "kokkos_args.hpp"

namespace kdnn::cli {
extern const Subcommand sinkhorn_command;  // sinkhorn.cpp
extern const Subcommand mha_command;       // mha.cpp
#ifdef KDNN_ENABLE_MPI
extern const Subcommand cp_conv_command;       // cp_conv.cpp
extern const Subcommand ssd_command;           // ssd.cpp
extern const Subcommand cp_attention_command;  // cp_attention.cpp
#endif
}  // namespace kdnn::cli

namespace {

using namespace kdnn::cli;

const Subcommand* const kSubcommands[] = {&sinkhorn_command, &mha_command
#ifdef KDNN_ENABLE_MPI
                                          ,
                                          &cp_conv_command, &ssd_command, &cp_attention_command
#endif
};

void print_help() {
  std::cout << "usage: kdnn <subcommand> [options] [--kokkos-...]\n"
               "       kdnn <subcommand> --help\n\n"
               "Runs a kdnn operator on .npy files.\n\nsubcommands:\n";
  for (const Subcommand* s : kSubcommands) {
    std::cout << "  " << std::left << std::setw(14) << s->name << s->summary << '\n';
  }
  std::cout << "\nArguments --kokkos-* (e.g. --kokkos-num-threads=N with Kokkos 4,\n"
               "--kokkos-threads=N with Kokkos 3) go to Kokkos; the integer ones\n"
               "(threads, numa, devices) must be given as --kokkos-NAME=N with N an\n"
               "int in range, or it is a usage error. MPI is initialised\n"
               "under an MPI launcher (mpiexec, srun) and for cp-conv, ssd and\n"
               "cp-attention.\n"
               "\nExit status: 0 on success, 1 for bad input data or a failed\n"
               "computation or write, 2 for command-line usage errors. Errors print\n"
               "one line 'kdnn: error: <message>' to stderr and write nothing to --out,\n"
               "except a failed write of stdout, which comes after the outputs.\n";
}

#ifdef KDNN_ENABLE_MPI
/// Whether an MPI launcher (mpiexec, mpirun, srun, ...) started this process,
/// by the variables the launchers of Open MPI, PMIx, MPICH / Intel MPI (PMI),
/// MVAPICH and Intel MPI set in the environment of each process they start.
bool started_by_mpi_launcher() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                           "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}
#endif

bool is_kokkos_arg(const std::string& arg) { return arg.rfind("--kokkos-", 0) == 0; }

bool is_help(const Args& args) { return !args.empty() && (args[0] == "--help" || args[0] == "-h"); }

/// The subcommand called `name`, or null.
const Subcommand* lookup(const std::string& name) {
  for (const Subcommand* s : kSubcommands) {
    if (name == s->name) return s;
  }
  return nullptr;
}

/// The subcommand named by args[0].
const Subcommand& find_subcommand(const Args& args) {
  if (args.empty()) usage_fail("missing subcommand (try 'kdnn --help')");
  if (args[0].rfind('-', 0) == 0) usage_fail("unknown option '", args[0], "' (try 'kdnn --help')");
  if (const Subcommand* s = lookup(args[0])) return *s;
  usage_fail("unknown subcommand '", args[0], "' (try 'kdnn --help')");
}

#ifdef KDNN_ENABLE_MPI
/// Whether this run needs MPI: under a launcher (every rank takes part, as
/// today), or for a context-parallel subcommand, which needs it as one
/// process too.
bool needs_mpi(const Args& args) {
  if (started_by_mpi_launcher()) return true;
  const Subcommand* s = args.empty() ? nullptr : lookup(args[0]);
  return s != nullptr && s->context_parallel;
}
#endif

/// Prints the one-line error message (newlines inside it flattened).
void report_error(const char* what) {
  std::string message = what;
  std::replace_if(
      message.begin(), message.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
  std::cerr << "kdnn: error: " << message << std::endl;
}

/// Runs `f` and returns its exit status; errors are reported by rank 0.
template <class F>
int exit_status(int rank, F&& f) {
  try {
    return f();
  } catch (const UsageError& e) {
    if (rank == 0) report_error(e.what());
    return kExitUsage;
  } catch (const std::exception& e) {  // kdnn::Error and anything else
    if (rank == 0) report_error(e.what());
    return kExitData;
  } catch (...) {
    if (rank == 0) report_error("unknown error");
    return kExitData;
  }
}

/// `status` after flushing stdout: a summary line or help that could not be
/// written (a full disk) is an error, reported by the rank that failed,
/// unless an error was reported already. The outputs are written by then.
int flush_stdout(int status) {
  std::cout.flush();
  if (std::cout.good() || status != 0) return status;
  report_error("cannot write the standard output");
  return kExitData;
}

int run(const Args& args, int rank, bool mpi) {
  if (is_help(args)) {
    if (rank == 0) print_help();
    return 0;
  }
  // Every rank sees the same arguments, so they all agree on this.
  const Subcommand* s = nullptr;
  const int status = exit_status(rank, [&] {
    s = &find_subcommand(args);
    return 0;
  });
  if (status != 0) return status;
  const Args rest(args.begin() + 1, args.end());
  if (s->context_parallel) return exit_status(rank, [&] { return s->run(rest); });
  int result = rank == 0 ? exit_status(rank, [&] { return s->run(rest); }) : 0;
#ifdef KDNN_ENABLE_MPI
  if (mpi) MPI_Bcast(&result, 1, MPI_INT, 0, MPI_COMM_WORLD);
#else
  (void)mpi;
#endif
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  Args kokkos_args, args;
  for (int i = 1; i < argc; ++i) (is_kokkos_arg(argv[i]) ? kokkos_args : args).push_back(argv[i]);
  int rank = 0;
#ifdef KDNN_ENABLE_MPI
  const bool mpi = needs_mpi(args);
  if (mpi) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
#else
  const bool mpi = false;
#endif
  // Every rank checks the same arguments: all exit 2, rank 0 says why.
  int status = exit_status(rank, [&] {
    for (const std::string& arg : kokkos_args) check_kokkos_arg(arg);
    return 0;
  });
  if (status == 0) {
    kdnn::compat::initialize_without_warnings(argc > 0 ? argv[0] : "kdnn", kokkos_args);
    status = run(args, rank, mpi);
    Kokkos::finalize();
  }
  status = flush_stdout(status);
#ifdef KDNN_ENABLE_MPI
  if (mpi) MPI_Finalize();
#endif
  return status;
}
