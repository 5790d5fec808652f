// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What the subcommands of the `kdnn` tool share: the subcommand record, usage
// errors and exit codes, CLI11 parsing with the tool's messages, .npy inputs
// and outputs as Views of the execution space, and the one output writer.
#include <Kokkos_Core.hpp>

#include <CLI/CLI.hpp>

#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kdnn/core/error.hpp"
#include "kdnn/io/npy.hpp"
#include "kdnn/io/npy_files.hpp"
#include "kdnn/io/npy_view.hpp"

namespace kdnn::cli {

using Args = std::vector<std::string>;
using Space = Kokkos::DefaultExecutionSpace;

constexpr int kExitData = 1;   ///< bad input data, a failed computation or write
constexpr int kExitUsage = 2;  ///< a command-line mistake

/// One subcommand; each is defined in its own file.
struct Subcommand {
  const char* name;
  const char* summary;           ///< one line for `kdnn --help`
  bool context_parallel;         ///< runs on every MPI rank (otherwise on rank 0 only)
  int (*run)(const Args& args);  ///< returns the exit status or throws
};

/// A command-line mistake (exit status 2); everything else is kdnn::Error.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& what) : std::runtime_error(what) {}
};

/// Throws UsageError with the streamed concatenation of the parts (as
/// kdnn::fail does kdnn::Error).
template <class... Parts>
[[noreturn]] void usage_fail(const Parts&... parts) {
  throw UsageError(kdnn::concat(parts...));
}

// ---- options ----

/// Parses `args` into `app`'s options. Returns false when -h/--help was given,
/// after printing `help` to stdout. Throws UsageError for any mistake.
bool parse(CLI::App& app, const Args& args, const char* help);

/// CLI11 checks whose failures read "--NAME: expected ..., got '...'".
CLI::Validator integer_at_least(int min);
CLI::Validator finite_at_least(double min);
CLI::Validator finite_in(double min, double max);
/// min <= x < max (e.g. a probability that must stay below 1).
CLI::Validator finite_in_half_open(double min, double max);
/// Any finite number.
CLI::Validator finite();
/// An integer in [0, 2^64 - 1], parsed by the caller as std::uint64_t.
CLI::Validator unsigned_64();
/// A value, not the next option swallowed ("--in --out DIR").
CLI::Validator not_an_option();

// ---- files ----

/// Fails (exit status 1) unless `dir` is an existing directory.
void require_directory(const std::string& option, const std::string& dir);

/// Reads DIR/name, a regular file (or a link to one). No entry under the name
/// is an error, or nothing when `optional`; an entry that cannot be read (a
/// dangling link, a FIFO, a directory, ...) is always an error. The array may
/// have any dtype read_npy accepts, float or integer: the caller says which it
/// takes (io::require_floating, io::read_int_vector, input_view).
std::optional<io::NpyArray> read_input(const std::string& dir, const std::string& name,
                                       bool optional = false);

/// The optional seq_idx.npy of `dir` (packed sequences: int32 or int64 ids
/// of `shape`, e.g. [B, L]) as int; empty when absent. Throws naming the
/// file for another dtype or shape, or an id outside int32.
std::vector<int> read_sequence_ids(const std::string& dir, const std::vector<std::size_t>& shape);

/// The flat index `flat` of an array of `shape` as "[i, j, k]".
std::string format_index(const std::vector<std::size_t>& shape, std::size_t flat);

/// Fails at the first NaN or infinity of a float32 or float64 array, naming
/// the file and the element: "k.npy: NaN at [1, 2, 0] (expected finite values)"
/// (`why` replaces what the parentheses say).
void require_finite(const io::NpyArray& array, const std::string& name,
                    const std::string& why = "expected finite values");

/// The shortest decimal form of x that reads back as x ("0.3", "1e+39",
/// "0.9999999999999999"): what a summary line prints for an option.
std::string round_trip(double x);

/// The sizes named in several files' shapes (B, S, E_q, ...), each fixed by
/// the first file checked that has it and required of every later one:
///   dims.check(q, "q.npy", {"B", "S", "E_q"});
///   dims.check(k, "k.npy", {"B", "Sk", "E_k"});  // "k.npy: shape (3, 5, 4),
///                             // expected batch 2 (from q.npy) at axis 0"
/// Every size must fit in an int (the kernels' index type).
class Dims {
 public:
  /// Checks `array`'s rank against `axes` and each axis against the size of
  /// that name, recording the sizes not seen before.
  void check(const io::NpyArray& array, const std::string& file,
             std::initializer_list<const char*> axes);
  /// The size `name` (checked before).
  std::size_t operator[](const std::string& name) const;

 private:
  struct Dim {
    std::string name;
    std::size_t value;
    std::string file;
  };
  std::vector<Dim> dims_;
};

/// An output file and its contents.
struct Output {
  std::string name;
  io::NpyArray array;
};

/// An output's name, dtype and shape, known before it is allocated.
struct OutputShape {
  std::string name;
  io::DType dtype;
  std::vector<std::size_t> shape;
};

/// Fails (kdnn::Error) unless each output's size in bytes fits 63 bits and
/// the outputs together fit in this machine's physical memory: "final.npy:
/// shape (2147483647, 1, 3, 3) float64 is 154618822584 bytes, more than the
/// 24 GB of memory of this machine". Call it before allocating any of them.
void require_output_sizes(const std::vector<OutputShape>& outputs);

/// Writes the outputs into `dir` all or nothing (io::write_npy_files), after
/// refusing any that would replace a directory.
void write_outputs(const std::string& dir, const std::vector<Output>& outputs);

// ---- arrays as Views of the execution space ----
// On a host backend these are the arrays' own buffers (no copy, no extra
// memory); on a device backend, device copies.

/// An input array as a read-only View, e.g. input_view<const float***>(x, "x.npy").
template <class DataType>
auto input_view(const io::NpyArray& array, const std::string& name) {
  return Kokkos::create_mirror_view_and_copy(Space::memory_space(),
                                             io::view_of<DataType>(array, name));
}

/// A View to compute the output `array` (from io::allocate_npy) into; call
/// copy_to_output(array, view) when done.
template <class DataType>
auto output_view(io::NpyArray& array, const std::string& name) {
  return Kokkos::create_mirror_view(Space::memory_space(), io::view_of<DataType>(array, name));
}

template <class View>
void copy_to_output(io::NpyArray& array, const View& view) {
  Kokkos::deep_copy(io::view_of<typename View::data_type>(array, "output"), view);
}

}  // namespace kdnn::cli
