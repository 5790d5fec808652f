# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Checks of the tensors handed to kdnn's operators, and the stream they run on.

Every operator takes float32 or float64 tensors on one device, and those
that store 16-bit activations also bfloat16 and float16 (computing in
float32: their parameters, e.g. a conv's weight, are float32 or of the
activations' dtype, converted to float32 exactly); a tensor that is not
contiguous is made contiguous (one copy) before kdnn sees it,
a contiguous one is passed as it is (kdnn views its memory). The operators
that take strides read a transposed or sliced tensor in place:
flash_attention any whose last dimension is contiguous, causal_conv1d any
at all. Errors are kdnn.Error, a ValueError.
"""
import functools
import numbers
import operator

import torch

from . import _kdnn
from ._options import Options

Error = _kdnn.Error
FLOATS = (torch.float32, torch.float64)
HALVES = (torch.bfloat16, torch.float16)
# Every storage dtype of the operators that take 16-bit activations.
STORAGE = FLOATS + HALVES


def compute_dtype(dtype):
    """The dtype kdnn computes a storage dtype in (and keeps parameters,
    states and statistics in): float32 for the 16-bit dtypes."""
    return torch.float32 if dtype in HALVES else dtype


def _names(dtypes):
    """"torch.float32 or torch.float64": the dtypes, joined."""
    names = [str(d) for d in dtypes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


# The devices whose tensors this build of kdnn computes on.
DEVICES = ("cpu", "cuda") if _kdnn.backend() == "Cuda" else ("cpu",)


def stream_of(t):
    """The CUDA stream PyTorch runs on for t's device (0 for a CPU tensor)."""
    if t.is_cuda:
        return torch.cuda.current_stream(t.device).cuda_stream
    return 0


class Operands:
    """The tensors of one call, checked against its first: the first fixes
    the dtype (one of `dtypes`: FLOATS, or STORAGE for the operators that
    take 16-bit activations) and the device, each later tensor must match
    them (a parameter: see __call__)."""

    def __init__(self, op, dtypes=FLOATS):
        self.op = op
        self.dtypes = dtypes
        self.dtype = None
        self.device = None
        self.first = None

    def __call__(self, t, name, dims, layout, optional=False, strides="contiguous",
                 parameter=False):
        """t (a tensor with `dims` dimensions, or at least -dims when dims is
        negative, described by `layout`, e.g. "[B, L, C]") with its values
        as they read (PyTorch's lazy negation applied) and, as the operator
        takes `strides`, contiguous ("contiguous"), with its last dimension
        contiguous ("rows": rows_contiguous) or as it is ("any"). None stays
        None where the tensor is optional. A `parameter` (not the first) is
        kept in the compute dtype: of the first's dtype or of its compute
        dtype, and returned in the compute dtype (a differentiable cast,
        exact; as mixed-precision training keeps parameters in float32)."""
        where = f"{self.op}: {name}"
        if t is None and optional:
            return None
        if not isinstance(t, torch.Tensor):
            raise Error(f"{where} is {'None' if t is None else 'a ' + type(t).__name__}, expected "
                        f"a torch.Tensor {layout}")
        if t.layout != torch.strided:
            raise Error(f"{where} has layout {t.layout}, expected torch.strided (a dense tensor)")
        if t.dtype not in self.dtypes:
            raise Error(f"{where} has dtype {t.dtype}, expected {_names(self.dtypes)}")
        if t.device.type not in DEVICES:
            raise Error(f"{where} is on {t.device}, expected a tensor on {' or '.join(DEVICES)} "
                        "(the devices this kdnn was built for)")
        if self.dtype is None:
            self.dtype, self.device, self.first = t.dtype, t.device, name
        elif parameter and t.dtype in (self.dtype, compute_dtype(self.dtype)):
            t = t.to(compute_dtype(self.dtype))
        elif t.dtype != self.dtype:
            want = (_names(dict.fromkeys((self.dtype, compute_dtype(self.dtype))))
                    if parameter else str(self.dtype))
            raise Error(f"{where} has dtype {t.dtype}, expected {want} (as {self.first} has "
                        f"{self.dtype})")
        if t.device != self.device:
            raise Error(f"{where} is on {t.device}, expected {self.device} (as {self.first})")
        if t.dim() != dims and not (dims < 0 and t.dim() >= -dims):
            count = f"{dims}" if dims >= 0 else f"at least {-dims}"
            raise Error(f"{where} has shape {list(t.shape)}, expected {count} dimensions {layout}")
        if strides == "rows":
            return rows_contiguous(t)
        return t.resolve_neg() if strides == "any" else t.resolve_neg().contiguous()


def rows_contiguous(t):
    """t with its values as they read (PyTorch's lazy negation applied) and
    its last dimension contiguous: t itself (any other strides) where it is,
    else a contiguous copy."""
    t = t.resolve_neg()
    return t if t.dim() == 0 or t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def empty_in_order_of(t, shape, last_inner=True):
    """An empty tensor of `shape` (t's rank, on t's device and dtype) whose
    dimensions lie in memory in the order of t's (outermost first, by
    stride; with last_inner, the last one contiguous whatever t's strides),
    e.g. [B, S, H, Dv] memory seen as [B, H, S, Dv] when t is a [B, S, H, D]
    tensor seen as [B, H, S, D]."""
    n = len(shape)
    order = sorted(range(n - 1 if last_inner else n), key=lambda d: (-t.stride(d), d))
    if last_inner:
        order.append(n - 1)
    inverse = sorted(range(len(shape)), key=order.__getitem__)
    return t.new_empty([shape[d] for d in order]).permute(inverse)


def dropout_options(op, dropout_p, seed, offset):
    """The DropoutOptions record of (p, seed, offset), checked for operator
    `op`; seed None draws a seed from PyTorch's generator when p > 0
    (torch.manual_seed reproduces it)."""
    dropout_p = number(op, "dropout_p", dropout_p)
    require(0.0 <= dropout_p < 1.0, f"{op}: dropout_p={dropout_p!r}, expected in [0, 1)")
    if seed is None:
        seed = int(torch.randint(0, 2**62, (), dtype=torch.int64)) if dropout_p > 0 else 0
    seed = integer(op, "seed", seed, 0, 2**64 - 1)
    offset = integer(op, "offset", offset, 0, 2**64 - 1)
    return Options("DropoutOptions", p=dropout_p, seed=seed, offset=offset)


def flag(op, name, value):
    """A boolean option of operator `op`: True or False, nothing that is
    merely truthy (a positional 0.1 or the string "false" is an error)."""
    require(isinstance(value, bool), f"{op}: {name}={value!r}, expected True or False")
    return value


def integer(op, name, value, lo, hi):
    """An integer option in [lo, hi] (a Python or NumPy integer, or an
    integer tensor of one element that does not require grad)."""
    value = _scalar(op, name, value)
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise Error(f"{op}: {name}={value!r}, expected an integer in [{lo}, {hi}]") from None
    require(lo <= value <= hi, f"{op}: {name}={value!r}, expected an integer in [{lo}, {hi}]")
    return value


def number(op, name, value):
    """A real option as a float (a Python or NumPy number, or a tensor of
    one element that does not require grad: kdnn does not differentiate its
    options)."""
    value = _scalar(op, name, value)
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, numbers.Real):
        raise Error(f"{op}: {name}={value!r}, expected a real number")
    return float(value)


def _scalar(op, name, value):
    """A one-element tensor option as its Python value; one that requires
    grad is refused (its gradient would be lost)."""
    if not isinstance(value, torch.Tensor):
        return value
    require(value.numel() == 1 and not value.is_complex(),
            f"{op}: {name} is a tensor of shape {list(value.shape)} and dtype {value.dtype}, "
            "expected a real scalar")
    require(not value.requires_grad,
            f"{op}: {name} is a tensor that requires grad; kdnn does not differentiate {name}: "
            f"pass {name}.item() (or a detached tensor) to use its value without a gradient")
    return value.item()


def int32_vector(op, name, t, count, device):
    """An integer vector option as the int32 tensor [count] (int32_array)."""
    return int32_array(op, name, t, [count], device)


def int32_array(op, name, t, shape, device):
    """An integer option (a tensor or a sequence) as the contiguous int32
    tensor of `shape` (a list) kdnn reads on `device`: a copy (editing the
    caller's tensor after the forward changes nothing), its values checked
    to fit."""
    _on_a_kdnn_device(op, name, t)
    t = torch.as_tensor(t, device=device)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise Error(f"{op}: {name} has dtype {t.dtype}, expected integers")
    require(list(t.shape) == list(shape),
            f"{op}: {name} has shape {list(t.shape)}, expected {list(shape)}")
    if t.numel() > 0:
        lo, hi = int(t.min()), int(t.max())
        require(-2**31 <= lo and hi < 2**31,
                f"{op}: {name} holds values in [{lo}, {hi}], expected int32 values")
    return t.to(torch.int32, copy=True).contiguous()


def _on_a_kdnn_device(op, name, t):
    """An index tensor must hold values kdnn can read: one on a device this
    kdnn does not compute on (the meta device's hold none) is refused."""
    if isinstance(t, torch.Tensor) and t.device.type not in DEVICES:
        raise Error(f"{op}: {name} is on {t.device}, expected a tensor on "
                    f"{' or '.join(DEVICES)} (the devices this kdnn was built for)")


def offsets(op, name, t, device):
    """Packed sequences' offsets (cu_seqlens: an integer vector [S + 1]) as
    an int32 copy on `device`; kdnn checks the values (0 first, never
    decreasing, the number of steps last)."""
    _on_a_kdnn_device(op, name, t)
    t = torch.as_tensor(t, device=device)
    require(t.dim() == 1, f"{op}: {name} has shape {list(t.shape)}, expected [S + 1] (a vector)")
    return int32_array(op, name, t, list(t.shape), device)


def windows(op, window, count, device):
    """window = (lo, hi), each an integer vector [count], as two int32
    tensors; None as (None, None)."""
    if window is None:
        return None, None
    require(isinstance(window, (tuple, list)) and len(window) == 2,
            f"{op}: window is a {type(window).__name__}, expected (lo, hi)")
    return (int32_vector(op, "window[0]", window[0], count, device),
            int32_vector(op, "window[1]", window[1], count, device))


def finite_parameter(op, name, t):
    """A small parameter (dt_bias [H]: always checked, as kdnn's policy on
    non-finite data says) with no NaN or infinity, naming the first."""
    bad = (~torch.isfinite(t)).nonzero()
    if bad.shape[0]:
        index = ", ".join(str(int(i)) for i in bad[0])
        raise Error(f"{op}: {name}[{index}]={t[tuple(bad[0])].item()}, expected finite values "
                    "(a parameter)")
    return t


def writable(op, name, t):
    """Refuses a tensor that kdnn would write in place but whose elements
    share memory (an expanded tensor: a stride of 0 across an extent > 1),
    naming it."""
    shared = [d for d in range(t.dim()) if t.stride(d) == 0 and t.shape[d] > 1]
    require(not shared,
            f"{op}: {name} is expanded (stride 0 in dimension {shared[0] if shared else 0}, shape "
            f"{list(t.shape)}), expected a tensor whose elements kdnn can write in place "
            f"(e.g. {name}.clone())")


def require(condition, message):
    if not condition:
        raise Error(message)


def first_order(op):
    """Decorator of the backward of an autograd Function whose gradients
    kdnn computes, for operator `op`: the backward runs without recording a
    graph; under create_graph=True its gradients carry an error that a
    second differentiation through them raises, naming `op` (kdnn has no
    double backward), rather than PyTorch's "appears to not have been used
    in the graph" or a silently wrong gradgradcheck."""
    message = (f"kdnn.{op}: its backward is not differentiable (kdnn has no double backward); "
               "a gradient through kdnn's gradients, e.g. after create_graph=True, cannot be "
               "computed").encode()

    def decorate(backward):
        @functools.wraps(backward)
        def wrapper(ctx, *grads):
            with torch.no_grad():
                outputs = backward(ctx, *grads)
            if not torch.is_grad_enabled():  # create_graph=False: nothing to guard
                return outputs
            # The error's node takes the operator's saved tensors and incoming
            # gradients too, so that it lies on the path from a gradient back
            # to the operator's inputs (autograd runs only the nodes on such
            # paths); its outputs past the gradients are dropped.
            links = [t for t in (*ctx.saved_tensors, *grads)
                     if isinstance(t, torch.Tensor) and t.requires_grad]
            grads_out = [None if g is None else g.detach().requires_grad_() for g in outputs]
            error = torch._C._functions.DelayedError(message, len(grads_out) + len(links))
            return tuple(error(*grads_out, *links)[:len(outputs)])
        return wrapper
    return decorate


def contiguous(t):
    """A gradient as kdnn reads it (None stays None)."""
    return None if t is None else t.contiguous()
