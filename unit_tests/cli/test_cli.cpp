// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The `kdnn` command-line tool, run as a subprocess: the help, usage errors
// (of the tool and of `kdnn sinkhorn`), dash values given with `=`, a
// standard output that cannot be written, the --kokkos-* arguments, MPI
// (not initialised by the single-process subcommands; every rank's status
// under mpiexec) and peak memory. `kdnn sinkhorn`'s results:
// test_cli_sinkhorn.cpp; its inputs and outputs: test_cli_inputs.cpp;
// `kdnn mha`: test_cli_mha.cpp.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>

#include "cli_fixture.hpp"
#include "cli_sinkhorn.hpp"
#include "kdnn/io/npy.hpp"
#include "sinkhorn_reference.hpp"

namespace {

using namespace kdnn_test;
using kdnn::io::DType;

// ---- help ----------------------------------------------------------------

TEST_F(Cli, TopLevelHelp) {
  for (const char* flag : {"--help", "-h"}) {
    const Result r = run({flag});
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.err, "");
    EXPECT_NE(r.out.find("usage: kdnn <subcommand>"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("sinkhorn"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("Exit status"), std::string::npos) << r.out;
  }
}

TEST_F(Cli, SinkhornHelp) {
  write_problem(DType::f64, 2, 3, true);
  for (const Strings& args : {Strings{"sinkhorn", "--help"}, Strings{"sinkhorn", "-h"},
                              sinkhorn({"--iters", "3", "--help"})}) {
    const Result r = run(args);
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.err, "");
    for (const char* word :
         {"usage: kdnn sinkhorn", "--in", "--out", "--iters", "--tol", "--method", "unrolled"}) {
      EXPECT_NE(r.out.find(word), std::string::npos) << word;
    }
  }
  EXPECT_TRUE(files(out_).empty());
}

// ---- errors ----------------------------------------------------------------

TEST_F(Cli, UsageErrors) {
  write_problem(DType::f64, 2, 3, true);
  const std::string in = in_.string(), out = out_.string();
  struct Case {
    Strings args;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {{}, "missing subcommand"},
      {{"frobnicate"}, "unknown subcommand 'frobnicate'"},
      {{"--verbose"}, "unknown option '--verbose'"},
      {{"sinkhorn", "--out", out, "--iters", "3"}, "--in is required"},
      {{"sinkhorn", "--in", in, "--iters", "3"}, "--out is required"},
      {{"sinkhorn", "--in", in, "--out", out}, "--iters is required"},
      {sinkhorn({"--iters", "3", "--bogus", "1"}), "unknown option '--bogus'"},
      {sinkhorn({"--iters", "3", "--bogus=1"}), "unknown option '--bogus'"},
      {sinkhorn({"--iters", "3", "extra"}), "unexpected argument 'extra'"},
      {sinkhorn({"--iters", "3", "--iters", "4"}), "--iters: At Most 1 required but received 2"},
      {sinkhorn({"--iters"}), "--iters: 1 required INT missing"},
      {sinkhorn({"--iters="}), "--iters: 1 required INT missing"},
      {sinkhorn({"--iters", "3", "--tol"}), "--tol: 1 required FLOAT missing"},
      {{"sinkhorn", "--in", "--out", out, "--iters", "3"}, "--in: requires a value, got '--out'"},
      {sinkhorn({"--iters", "--tol", "1"}), "--iters: expected an integer >= 1"},
      {sinkhorn({"--iters", "abc"}), "--iters: expected an integer >= 1"},
      {sinkhorn({"--iters", "0"}), "--iters: expected an integer >= 1"},
      {sinkhorn({"--iters", "-3"}), "--iters: expected an integer >= 1"},
      {sinkhorn({"--iters", "2.5"}), "--iters: expected an integer >= 1"},
      {sinkhorn({"--iters", "3x"}), "--iters: expected an integer >= 1"},
      {sinkhorn({"--iters", " 3"}), "--iters: expected an integer >= 1"},
      {sinkhorn({"--iters", "99999999999"}), "--iters: expected an integer >= 1"},
      {sinkhorn({"--iters", "0x10"}), "--iters: expected an integer >= 1"},
      {sinkhorn({"--iters", "3", "--tol", "small"}), "--tol: expected a finite number >= 0"},
      {sinkhorn({"--iters", "3", "--tol", "-1e-6"}), "--tol: expected a finite number >= 0"},
      {sinkhorn({"--iters", "3", "--tol", "nan"}), "--tol: expected a finite number >= 0"},
      {sinkhorn({"--iters", "3", "--tol", "inf"}), "--tol: expected a finite number >= 0"},
      {sinkhorn({"--iters", "3", "--tol", "1e999"}), "--tol: expected a finite number >= 0"},
      {sinkhorn({"--iters", "3", "--tol", "1e-6x"}), "--tol: expected a finite number >= 0"},
      {sinkhorn({"--iters", "3", "--method", "newton"}),
       "--method: newton not in {implicit,block,unrolled}"},
      {sinkhorn({"--iters", "3", "--method", "unrolled", "--tol", "1e-6"}),
       "--method unrolled needs --tol 0"},
  };
  for (const Case& c : cases) expect_error(c.args, kUsage, c.fragment);
}

// A value given with `=` is the option's whatever it starts with (a
// directory named "-out"); the separate form still refuses a dash value, the
// next option swallowed ("--in --out DIR", in UsageErrors).
TEST_F(Cli, DashValuesGivenWithEqualsAreAccepted) {
  write_problem(DType::f64, 2, 4, true);
  fs::create_directories(root_ / "-out");
  fs::rename(in_, root_ / "-in");
  const std::string here = "cd " + quote(root_.string()) + " &&";
  const Result r =
      run({"sinkhorn", "--in=-in", "--out=-out", "--iters", "5", "--method", "unrolled"}, here);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(files(root_ / "-out"), (std::set<std::string>{"r.npy", "dx.npy"}));
  fs::rename(root_ / "-in", in_);
  // Every subcommand and option with a value that must not be an option.
  const std::string out = "--out=" + out_.string(), in = "--in=" + in_.string();
  const std::vector<Strings> commands = {{"sinkhorn", "--iters", "3"},
                                         {"mha", "--heads", "1"},
#ifdef KDNN_MPIEXEC
                                         {"cp-conv"},
                                         {"ssd"}
#endif
  };
  for (const Strings& command : commands) {
    Strings a = command;
    a.insert(a.end(), {"--in=-nope", out});
    expect_error(a, kInput, "--in '-nope' is not an existing directory");
    a = command;
    a.insert(a.end(), {in, "--out=-nope"});
    expect_error(a, kInput, "--out '-nope' is not an existing directory");
    a = command;
    a.insert(a.end(), {"--out", "-nope", in});
    expect_error(a, kUsage, "--out: requires a value, got '-nope'");
    if (command[0] == "cp-conv" || command[0] == "ssd") {
      a = command;
      a.insert(a.end(), {in, out, "--split=-1"});
      expect_error(a, kUsage,
                   "--split: expected counts >= 0 (at most 9223372036854775807), got '-1'");
      a = command;
      a.insert(a.end(), {in, out, "--split", "-1"});
      expect_error(a, kUsage, "--split: requires a value, got '-1'");
    }
  }
}

// The summary line (or the help) that cannot be written is an error, once;
// the outputs were written before it.
TEST_F(Cli, FailedWriteOfStdoutIsAnError) {
  write_problem(DType::f64, 2, 4, true);
  for (const Strings& args : {Strings{"--help"}, Strings{"sinkhorn", "--help"},
                              sinkhorn({"--iters", "5", "--method", "unrolled"})}) {
    SCOPED_TRACE(args[0] + " " + args[1 % args.size()]);
    const Result r = run_to("/dev/full", args);
    EXPECT_EQ(r.status, kInput);
    EXPECT_EQ(r.err, "kdnn: error: cannot write the standard output\n");
  }
  EXPECT_EQ(files(out_), (std::set<std::string>{"r.npy", "dx.npy"}));
  // An error already reported stays the only line.
  const Result bad = run_to("/dev/full", {"frobnicate"});
  EXPECT_EQ(bad.status, kUsage);
  EXPECT_EQ(bad.err, "kdnn: error: unknown subcommand 'frobnicate' (try 'kdnn --help')\n");
}

// ---- Kokkos, MPI, memory -----------------------------------------------------

TEST_F(Cli, KokkosArgumentsGoToKokkos) {
  const std::size_t batch = 2, n = 4;
  write_problem(DType::f64, batch, n, true);
  // Anywhere on the command line. Kokkos 4 takes the thread count, 3.4 knows
  // it as --kokkos-threads and ignores this spelling; both know the other.
  Strings args{"--kokkos-num-threads=1",
               "sinkhorn",
               "--in",
               in_.string(),
               "--kokkos-tune-internals",
               "--out",
               out_.string(),
               "--iters",
               "20"};
  const Result r = run(args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const auto rr = read(out_ / "r.npy", DType::f64, {batch, n, n});
  for (std::size_t b = 0; b < batch; ++b) {
    EXPECT_LT(rel_error(matrix(rr, b, n), kdnn_test::ref_forward(matrix(x_, b, n), n, 20)), 1e-13);
  }
}

// The integer-valued --kokkos-* arguments are checked before Kokkos sees them
// (Kokkos aborted with an uncaught std::invalid_argument): a usage error
// naming the argument, what it expects and what it got.
TEST_F(Cli, MalformedKokkosIntegersAreUsageErrors) {
  write_problem(DType::f64, 2, 4, true);
  const std::string at_most = " (at most 2147483647), got '";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--kokkos-threads=abc", "--kokkos-threads: expected --kokkos-threads=N, N an integer >= 1"},
      {"--kokkos-threads=-1", "--kokkos-threads: expected --kokkos-threads=N, N an integer >= 1"},
      {"--kokkos-threads=0", "N an integer >= 1" + at_most + "--kokkos-threads=0'"},
      {"--kokkos-threads=99999999999999", "N an integer >= 1" + at_most},
      {"--kokkos-threads=", "--kokkos-threads: expected --kokkos-threads=N"},
      {"--kokkos-threads", "N an integer >= 1" + at_most + "--kokkos-threads'"},
      {"--kokkos-threads=4x", "--kokkos-threads: expected"},
      {"--kokkos-num-threads=abc", "--kokkos-num-threads: expected --kokkos-num-threads=N"},
      {"--kokkos-num-threads", "--kokkos-num-threads: expected"},
      {"--kokkos-numa=x", "--kokkos-numa: expected --kokkos-numa=N, N an integer >= 1"},
      {"--kokkos-device-id=zz",
       "--kokkos-device-id: expected --kokkos-device-id=N, N an integer >= 0"},
      {"--kokkos-device-id=-1", "--kokkos-device-id: expected"},
      {"--kokkos-device=zz", "--kokkos-device: expected --kokkos-device=N, N an integer >= 0"},
      {"--kokkos-skip-device=zz", "--kokkos-skip-device: expected"},
      {"--kokkos-skip-device", "--kokkos-skip-device: expected"},
      {"--kokkos-num-devices=zz", "--kokkos-num-devices: expected --kokkos-num-devices=N[,S]"},
      {"--kokkos-num-devices=0", "--kokkos-num-devices: expected"},
      {"--kokkos-num-devices=2,x", "--kokkos-num-devices: expected"},
      {"--kokkos-ndevices=-3", "--kokkos-ndevices: expected --kokkos-ndevices=N[,S]"},
      {"--kokkos-ndevices", "--kokkos-ndevices: expected"},
  };
  for (const auto& [arg, fragment] : cases) {
    expect_error({arg, "--help"}, kUsage, fragment);
    expect_error(sinkhorn({"--iters", "3", arg}), kUsage, fragment);
  }
  // Well formed ones still go to Kokkos (a host backend ignores the devices),
  // in the spellings of the Kokkos the tool was built with: Kokkos 4 warns
  // about 3.x's --kokkos-threads, --kokkos-numa and --kokkos-num-devices.
#if KOKKOS_VERSION >= 40000
  const char* const well_formed[] = {"--kokkos-num-threads=1", "--kokkos-device-id=0"};
#else
  const char* const well_formed[] = {"--kokkos-threads=1", "--kokkos-num-threads=1",
                                     "--kokkos-numa=1", "--kokkos-device-id=0",
                                     "--kokkos-num-devices=1,0"};
#endif
  for (const char* arg : well_formed) {
    const Result r = run(sinkhorn({"--iters", "5", "--method", "unrolled", arg}));
    EXPECT_EQ(r.status, 0) << arg << ": " << r.err;
    EXPECT_EQ(r.err, "") << arg;
  }
}

#ifdef KDNN_MPIEXEC
TEST_F(Cli, MalformedKokkosIntegerUnderMpiIsOneErrorLine) {
  write_problem(DType::f64, 2, 4, true);
  const std::string mpiexec = kdnn_test::mpiexec(3);
  for (const Strings& args : {sinkhorn({"--iters", "3", "--kokkos-threads=abc"}),
                              Strings{"ssd", "--kokkos-threads=abc", "--help"}}) {
    const Result r = run(args, mpiexec);
    EXPECT_EQ(r.status, kUsage) << r.err;
    const std::string line =
        "kdnn: error: --kokkos-threads: expected --kokkos-threads=N, N an integer >= 1 (at most "
        "2147483647), got '--kokkos-threads=abc'\n";
    const auto first = r.err.find(line);
    EXPECT_NE(first, std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("kdnn: error:", first + 1), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
}
#endif

// Outside an MPI launcher the single-process subcommands do not initialise
// MPI (a singleton MPI_Init costs about 0.4 s). Observable with Open MPI,
// whose MPI_Init fails when told to use a component that does not exist;
// other MPI libraries ignore the variable and the test shows nothing.
TEST_F(Cli, SingleProcessSubcommandsDoNotInitialiseMpi) {
  write_problem(DType::f64, 2, 4, true);
  const std::string broken_mpi = "OMPI_MCA_pml=no_such_component";
  for (const Strings& args :
       {Strings{"--help"}, Strings{"sinkhorn", "--help"}, Strings{"mha", "--help"},
        sinkhorn({"--iters", "5", "--method", "unrolled"})}) {
    SCOPED_TRACE(args[0]);
    const Result r = run(args, broken_mpi);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err, "");
  }
  EXPECT_EQ(files(out_), (std::set<std::string>{"r.npy", "dx.npy"}));
  // The usage errors as well.
  const Result bad = run({"frobnicate"}, broken_mpi);
  EXPECT_EQ(bad.status, kUsage);
  EXPECT_EQ(bad.err, "kdnn: error: unknown subcommand 'frobnicate' (try 'kdnn --help')\n");
}

#ifdef KDNN_MPIEXEC
TEST_F(Cli, UnderMpiRankZeroWorksAndEveryRankExitsWithItsStatus) {
  write_problem(DType::f64, 2, 4, true);
  const std::string mpiexec = kdnn_test::mpiexec(3);
  const Result ok = run(sinkhorn({"--iters", "5", "--method", "unrolled"}), mpiexec);
  ASSERT_EQ(ok.status, 0) << ok.err;
  EXPECT_EQ(ok.err, "");
  EXPECT_EQ(ok.out.rfind("sinkhorn: B=2 n=4", 0), 0u) << ok.out;
  EXPECT_EQ(std::count(ok.out.begin(), ok.out.end(), '\n'), 1) << ok.out;
  EXPECT_EQ(files(out_), (std::set<std::string>{"r.npy", "dx.npy"}));

  fs::remove_all(out_);
  fs::create_directories(out_);
  const Result bad = run(sinkhorn({}), mpiexec);  // no --iters
  EXPECT_EQ(bad.status, kUsage);
  const std::string line = "kdnn: error: --iters is required\n";
  const auto first = bad.err.find(line);
  EXPECT_NE(first, std::string::npos) << bad.err;
  EXPECT_EQ(bad.err.find("kdnn: error:", first + 1), std::string::npos) << bad.err;
  EXPECT_EQ(bad.out, "");
  EXPECT_TRUE(files(out_).empty());
}
#endif

TEST_F(Cli, PeakMemoryIsInputsPlusOutputs) {
  if (!Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                  Kokkos::DefaultExecutionSpace::memory_space>::accessible) {
    GTEST_SKIP() << "device backend: the tool copies to and from the device";
  }
  // 4 arrays (x, g, r, dx) of 64 MiB; a copy of any of them would exceed the
  // margin left for the libraries and Kokkos (about 22 MiB measured).
  const std::size_t batch = 32768, n = 16;
  const double array_mib = double(batch * n * n * sizeof(double)) / (1 << 20);
  write_problem(DType::f64, batch, n, true);
  const Result r = run(sinkhorn({"--iters", "5"}));
  ASSERT_EQ(r.status, 0) << r.err;
  const double peak_mib = kdnn_test::peak_child_mib();
  EXPECT_LT(peak_mib, 4 * array_mib + 48) << "peak RSS " << peak_mib << " MiB";
}

}  // namespace
