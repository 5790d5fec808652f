# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The installed kdnn package is tested against the repository's pure-PyTorch
reference formulations (unit_tests/reference/kdnn_reference)."""
import pathlib
import sys

import pytest
import torch

REFERENCE = pathlib.Path(__file__).resolve().parents[2] / "unit_tests" / "reference"
sys.path.insert(0, str(REFERENCE))

DTYPES = [torch.float32, torch.float64]
# Agreement with a reference computed in the same dtype (float32: a few
# thousand ulps over the sums involved; float64: round-off).
TOLERANCE = {torch.float32: dict(rtol=2e-4, atol=2e-5), torch.float64: dict(rtol=1e-10, atol=1e-11)}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
