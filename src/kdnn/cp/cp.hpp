// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::cp — context-parallel operators: the sequence split across the ranks
// of an MPI communicator. Link kdnn::cp (kdnn + MPI).
#include "kdnn/cp/agree.hpp"
#include "kdnn/cp/attention.hpp"
#include "kdnn/cp/conv_dt.hpp"
#include "kdnn/cp/halo_plan.hpp"
#include "kdnn/cp/sequence_layout.hpp"
#include "kdnn/cp/sequence_shards.hpp"
#include "kdnn/cp/sequence_split.hpp"
#include "kdnn/cp/ssd.hpp"
