// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Umbrella header of kdnn.
#include "kdnn/attention/attention.hpp"
#include "kdnn/core/error.hpp"
#include "kdnn/io/npy.hpp"
#include "kdnn/io/npy_files.hpp"
#include "kdnn/io/npy_view.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"
#include "kdnn/ssm/ssm.hpp"
