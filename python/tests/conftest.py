# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The installed kdnn package is tested against the repository's pure-PyTorch
reference formulations (unit_tests/reference/kdnn_reference); the tests' dtypes
and tolerances and the comparison with a reference are in common.py."""
import pathlib
import sys

import pytest
import torch

REFERENCE = pathlib.Path(__file__).resolve().parents[2] / "unit_tests" / "reference"
sys.path.insert(0, str(REFERENCE))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
