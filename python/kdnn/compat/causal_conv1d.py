# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""causal-conv1d's causal_conv1d_fn and causal_conv1d_update on kdnn's
kernels (x channel first, [batch, dim, seqlen], as the peer's).

Both of the peer's memory layouts of x are read in place: channel-last
(x = x_bld.transpose(1, 2), stride(1) == 1: what Mamba's blocks pass) and
contiguous ([batch, dim, seqlen], stride(2) == 1); the output and x's
gradient are written in x's layout, as the peer's: no copy. The final
states are channel-last.
"""
import torch

from .. import mamba2
from .._tensors import Error, writable

ACTIVATIONS = (None, "silu", "swish")


def _activation(op, activation):
    if activation not in ACTIVATIONS:
        raise Error(f"{op}: activation={activation!r}, expected one of {ACTIVATIONS}")
    return activation


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None,
                     return_final_states=False, final_states_out=None, activation=None):
    """x (batch, dim, seqlen), weight (dim, width), bias (dim,),
    initial_states (batch, dim, width - 1), final_states_out (batch, dim,
    width - 1), written when given; activation None, "silu" or "swish".
    Returns out (batch, dim, seqlen), and with return_final_states also the
    final states (batch, dim, width - 1), channel-last. seq_idx (batch,
    seqlen), integers: packed sequences, each convolved alone (a step's
    window reads only steps of equal seq_idx), in either layout of x. Where
    the peer refuses initial_states or final states beside seq_idx, kdnn
    gives them: the initial states continue each row's first sequence, the
    final states hold its last sequence's steps (zeros for the others)."""
    op = "compat.causal_conv1d.causal_conv1d_fn"
    activation = _activation(op, activation)
    if getattr(x, "dim", lambda: 0)() != 3:
        raise Error(f"{op}: x has shape {list(getattr(x, 'shape', []))}, expected (batch, dim, "
                    "seqlen)")
    if initial_states is not None:  # checked here, so that errors name it as the caller does
        width = list(getattr(weight, "shape", [0, 0]))[-1]
        want = [x.shape[0], x.shape[1], width - 1]
        if not isinstance(initial_states, torch.Tensor) or list(initial_states.shape) != want:
            raise Error(f"{op}: initial_states has shape "
                        f"{list(getattr(initial_states, 'shape', []))}, expected (batch, dim, "
                        f"width - 1) = {want}")
    init = None if initial_states is None else initial_states.transpose(1, 2)
    y, final = mamba2.causal_conv1d(x.transpose(1, 2), weight, bias, init, activation=activation,
                                    return_final_states=True, seq_idx=seq_idx)
    out = y.transpose(1, 2)  # in x's memory layout
    if not return_final_states:
        return out
    final = final.transpose(1, 2)
    if final_states_out is not None:
        _check_final_states_out(op, final_states_out, final)
        final_states_out.copy_(final)
        final = final_states_out
    return out, final


def _check_final_states_out(op, out, final):
    """final_states_out must take the final states as they are: a tensor of
    their shape, dtype and device that can be written in place (no
    broadcast, no cast, no leaf that requires grad, no expanded memory)."""
    what = f"a torch.Tensor {list(final.shape)} (batch, dim, width - 1) of dtype {final.dtype}"
    if not isinstance(out, torch.Tensor):
        raise Error(f"{op}: final_states_out is a {type(out).__name__}, expected {what}")
    for name, have, want in (("shape", list(out.shape), list(final.shape)),
                             ("dtype", out.dtype, final.dtype),
                             ("device", out.device, final.device)):
        if have != want:
            raise Error(f"{op}: final_states_out has {name} {have}, expected {want} (as the final "
                        "states)")
    if out.requires_grad and out.is_leaf and torch.is_grad_enabled():
        raise Error(f"{op}: final_states_out is a leaf that requires grad, expected a tensor kdnn "
                    "can write in place (detach it, or call under torch.no_grad())")
    writable(op, "final_states_out", out)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None):
    """x (batch, dim) or (batch, dim, seqlen), conv_state (batch, dim,
    state_len) with state_len >= width - 1, updated in place; weight (dim,
    width), bias (dim,); activation None, "silu" or "swish" (True: "silu").
    Returns out of x's shape. cache_seqlens (batch,): the state is a
    circular buffer written from slot cache_seqlens % state_len;
    conv_state_indices (batch,): the state rows of a larger conv_state
    (continuous batching), distinct and in range."""
    op = "compat.causal_conv1d.causal_conv1d_update"
    if activation is True:
        activation = "silu"
    elif activation is False:
        activation = None
    return mamba2.causal_conv1d_update(x, conv_state, weight, bias,
                                       activation=_activation(op, activation),
                                       cache_seqlens=cache_seqlens,
                                       conv_state_indices=conv_state_indices)
