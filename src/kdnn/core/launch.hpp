// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::Launch: how a caller may pin the form and the team sizes of an
// operator's kernel. Zero and `automatic` everywhere mean "chosen per backend
// and problem size"; the choice only changes speed, never results (each
// operator documents what it guarantees).

namespace kdnn {

/// Which form of an operator's kernels runs. Operators with a GPU form keep
/// their host form beside it; both are portable Kokkos code, so either runs
/// on any backend (the GPU form slowly on a CPU, which is how the tests check
/// it on the host). An operator with one form ignores the choice of form,
/// but `gpu` still launches it as on a GPU: scratch past on-chip size goes to
/// a bounded team workspace rather than Kokkos' level 1 (see CONTRIBUTING).
enum class KernelForm {
  automatic,  ///< the GPU form on a GPU backend, the host form on a host
  host,       ///< the form written for CPU caches and SIMD
  gpu,        ///< the form written for warps, registers and on-chip scratch
  /// the GPU form whose products run on tensor cores (mma.sync on CUDA
  /// devices of compute capability 8.0 and later; emulated, slowly, on a
  /// host); `automatic` takes it on such a device. An operator without one
  /// runs its GPU form.
  tensor_cores,
};

struct Launch {
  int tile = 0;           ///< systems per team (kernels with one thread per system)
  int team_size = 0;      ///< team threads
  int vector_length = 0;  ///< vector lanes per team thread (a power of two)
  KernelForm form = KernelForm::automatic;  ///< which form runs
  /// float products on tensor cores in one TF32 pass (about 10 mantissa
  /// bits, PyTorch's allow_tf32) instead of three (3×TF32, float32
  /// accuracy): faster, less accurate, never the default. Ignored in double
  /// and by forms without tensor cores.
  bool allow_tf32 = false;
};

}  // namespace kdnn
