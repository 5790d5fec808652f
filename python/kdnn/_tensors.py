# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Checks of the tensors handed to kdnn's operators, and the stream they run on.

Every operator takes float32 or float64 tensors on one device; a tensor
that is not contiguous is made contiguous (one copy) before kdnn sees it,
a contiguous one is passed as it is (kdnn views its memory). Errors are
kdnn.Error, a ValueError.
"""
import torch

from . import _kdnn

Error = _kdnn.Error
FLOATS = (torch.float32, torch.float64)
# The devices whose tensors this build of kdnn computes on.
DEVICES = ("cpu", "cuda") if _kdnn.backend() == "Cuda" else ("cpu",)


def stream_of(t):
    """The CUDA stream PyTorch runs on for t's device (0 for a CPU tensor)."""
    if t.is_cuda:
        return torch.cuda.current_stream(t.device).cuda_stream
    return 0


class Operands:
    """The tensors of one call, checked against its first: `first` fixes
    the dtype and the device, each later tensor must match them."""

    def __init__(self, op):
        self.op = op
        self.dtype = None
        self.device = None

    def __call__(self, t, name, dims, layout):
        """t (a tensor with `dims` dimensions, or at least -dims when dims is
        negative, described by `layout`, e.g. "[B, L, C]"), contiguous. None
        stays None."""
        if t is None:
            return None
        where = f"{self.op}: {name}"
        if not isinstance(t, torch.Tensor):
            raise Error(f"{where} is a {type(t).__name__}, expected a torch.Tensor {layout}")
        if t.dtype not in FLOATS:
            raise Error(f"{where} has dtype {t.dtype}, expected torch.float32 or torch.float64")
        if t.device.type not in DEVICES:
            raise Error(f"{where} is on {t.device}, expected a tensor on {' or '.join(DEVICES)} "
                        "(the devices this kdnn was built for)")
        if self.dtype is None:
            self.dtype, self.device = t.dtype, t.device
        elif t.dtype != self.dtype:
            raise Error(f"{where} has dtype {t.dtype}, expected {self.dtype} (as the first tensor)")
        elif t.device != self.device:
            raise Error(f"{where} is on {t.device}, expected {self.device} (as the first tensor)")
        if t.dim() != dims and not (dims < 0 and t.dim() >= -dims):
            count = f"{dims}" if dims >= 0 else f"at least {-dims}"
            raise Error(f"{where} has shape {list(t.shape)}, expected {count} dimensions {layout}")
        return t.contiguous()


def dropout_options(op, dropout_p, seed, offset):
    """(p, seed, offset) checked for operator `op`; seed None draws a seed
    from PyTorch's generator when p > 0 (torch.manual_seed reproduces it)."""
    require(0.0 <= dropout_p < 1.0, f"{op}: dropout_p={dropout_p!r}, expected in [0, 1)")
    if seed is None:
        seed = int(torch.randint(0, 2**62, (), dtype=torch.int64)) if dropout_p > 0 else 0
    require(0 <= seed < 2**64 and 0 <= offset < 2**64,
            f"{op}: seed={seed!r}, offset={offset!r}, expected integers in [0, 2^64)")
    return float(dropout_p), int(seed), int(offset)


def require(condition, message):
    if not condition:
        raise Error(message)


def contiguous(t):
    """A gradient as kdnn reads it (None stays None)."""
    return None if t is None else t.contiguous()
