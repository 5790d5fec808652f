#pragma once
// Umbrella header of kdnn.
#include "kdnn/core/error.hpp"
#include "kdnn/io/npy.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"
