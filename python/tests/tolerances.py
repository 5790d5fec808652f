# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The dtypes every operator is tested in, and the agreement expected with a
reference (float32: a few thousand ulps over the sums involved; float64:
round-off)."""
import torch

DTYPES = [torch.float32, torch.float64]
TOLERANCE = {torch.float32: dict(rtol=2e-4, atol=2e-5), torch.float64: dict(rtol=1e-10, atol=1e-11)}
