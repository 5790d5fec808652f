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


@pytest.fixture
def copies(monkeypatch):
    """The shapes of the tensors that .contiguous() copies while the test
    runs (those not contiguous already)."""
    copied = []
    contiguous = torch.Tensor.contiguous

    def counting(self, *args, **kwargs):
        if not self.is_contiguous(*args, **kwargs):
            copied.append(tuple(self.shape))
        return contiguous(self, *args, **kwargs)
    monkeypatch.setattr(torch.Tensor, "contiguous", counting)
    return copied
