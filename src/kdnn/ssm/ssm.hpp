// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::ssm — Mamba-2's operators on one rank: the causal depthwise conv1d
// (+ SiLU), the dt softplus and the SSD chunked scan, forward and backward. Their context-parallel
// versions (the sequence split across MPI ranks) are in kdnn/cp/.
#include "kdnn/ssm/causal_conv1d.hpp"
#include "kdnn/ssm/causal_conv1d_update.hpp"
#include "kdnn/ssm/dt_softplus.hpp"
#include "kdnn/ssm/ssd.hpp"
