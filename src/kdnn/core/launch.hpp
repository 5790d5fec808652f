#pragma once
// kdnn::Launch: how a caller may pin the launch shape of an operator's team
// kernel. Zero everywhere means "chosen per backend and problem size"; the
// chosen shape only changes speed, never results (each operator documents
// what it guarantees).

namespace kdnn {

struct Launch {
  int tile = 0;           ///< systems per team (kernels with one thread per system)
  int team_size = 0;      ///< team threads
  int vector_length = 0;  ///< vector lanes per team thread (a power of two)
};

}  // namespace kdnn
