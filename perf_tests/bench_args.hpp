// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The benchmarks' own argument, --kdnn_sizes=AxBx...,AxBx...: taken out of
// argv before Kokkos and Google Benchmark see it, parsed into size tuples.
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace kdnn_bench {

struct Args {
  std::vector<std::vector<std::int64_t>> sizes;
  std::vector<char*> rest;  ///< argv without --kdnn_sizes (no terminating null)
};

/// Splits argv; each size must have `rank` numbers (`format` names them in
/// the error, e.g. "BxHxSxSkxD"); `fallback` when --kdnn_sizes is absent.
inline Args parse_args(int argc, char** argv, const std::string& fallback, std::size_t rank,
                       const char* format) {
  Args args;
  std::string text = fallback;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--kdnn_sizes=", 0) == 0) {
      text = arg.substr(13);
    } else {
      args.rest.push_back(argv[i]);
    }
  }
  std::stringstream list(text);
  std::string item;
  while (std::getline(list, item, ',')) {
    std::vector<std::int64_t> size;
    std::stringstream parts(item);
    std::string part;
    while (std::getline(parts, part, 'x')) size.push_back(std::stoll(part));
    if (size.size() != rank) {
      throw std::invalid_argument(std::string("--kdnn_sizes: expected ") + format + ", got " +
                                  item);
    }
    args.sizes.push_back(size);
  }
  return args;
}

}  // namespace kdnn_bench
