# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The extension's options objects (kdnn._kdnn's bindings of kdnn's C++
options structs) and the records the operators make them from (kdnn._options)."""
import math

import pytest
import torch

import kdnn
from kdnn import _kdnn
from kdnn._options import Options


def test_bound_structs_hold_the_cpp_defaults():
    ssd = _kdnn.SsdOptions()
    assert (ssd.chunk, ssd.dt_softplus, ssd.dt_min, ssd.dt_max) == (64, False, 0.0, math.inf)
    assert not ssd.check_parameters and not ssd.check_dt and not ssd.check_finite
    assert ssd.launch.form == _kdnn.KernelForm.automatic and not ssd.launch.allow_tf32
    attention = _kdnn.FusedAttentionOptions()
    assert (attention.scale, attention.softcap, attention.dropout.p) == (1.0, 0.0, 0.0)
    assert attention.backward == _kdnn.FusedBackwardSchedule.automatic
    mha = _kdnn.MhaOptions()
    assert (mha.heads, mha.kv_heads, mha.sm_scaler, mha.algo) == (1, 0, None,
                                                                  _kdnn.AttentionAlgo.fused)
    forward = _kdnn.SinkhornForwardOptions()
    assert (forward.iters, forward.order) == (20, _kdnn.SinkhornOrder.columns_first)
    assert _kdnn.SinkhornBackwardOptions().method == _kdnn.SinkhornMethod.implicit
    assert _kdnn.CausalConv1dOptions().silu
    assert _kdnn.DtSoftplusOptions().dt_max == math.inf
    mask = _kdnn.AttentionMask()
    assert (mask.causal, mask.band_left, mask.band_right, mask.lo_win) == (False, -1, -1, None)


def test_a_record_binds_its_fields_nested_ones_included():
    record = Options("FusedAttentionOptions", scale=0.5, check_finite=True,
                     dropout=Options("DropoutOptions", p=0.25, seed=2**64 - 1, offset=3),
                     launch=Options("Launch", allow_tf32=True))
    bound = record.bound()
    assert (bound.scale, bound.softcap, bound.check_finite) == (0.5, 0.0, True)
    assert (bound.dropout.p, bound.dropout.seed, bound.dropout.offset) == (0.25, 2**64 - 1, 3)
    assert bound.launch.allow_tf32 and bound.launch.team_size == 0
    assert record.dropout.seed == 2**64 - 1


def test_a_record_is_read_only_and_names_only_its_structs_fields():
    record = Options("DtSoftplusOptions", dt_min=0.5)
    with pytest.raises(AttributeError, match="read-only"):
        record.dt_min = 1.0
    with pytest.raises(AttributeError, match="no field 'dt_max'"):
        record.dt_max
    with pytest.raises(AttributeError):
        Options("DtSoftplusOptions", dt_maximum=1.0).bound()
    with pytest.raises(TypeError):
        Options("SsdOptions", chunk="64").bound()
    with pytest.raises(TypeError):
        Options("FusedAttentionOptions", dropout=0.1).bound()


def _extension_objects(value):
    """The nanobind instances in `value` (an Options record's fields, a
    tuple's items, recursively)."""
    if isinstance(value, Options):
        return [o for field in value._fields.values() for o in _extension_objects(field)]
    if isinstance(value, (tuple, list)):
        return [o for item in value for o in _extension_objects(item)]
    return [value] if type(type(value)).__name__.startswith("nb_type") else []


def _outputs():
    """An output of each differentiable operator, its graph alive."""
    def x(*shape):
        return torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    q = x(1, 2, 4, 8)
    cu = torch.tensor([0, 1, 4], dtype=torch.int32)
    w = [x(8, 8) for _ in range(4)]
    yield kdnn.sinkhorn(x(2, 3, 3), backward="unrolled")
    yield kdnn.flash_attention(q, q, q, causal=True, window=([0] * 4, [4] * 4), dropout_p=0.5)
    yield kdnn.flash_attention_varlen(x(4, 2, 8), x(4, 2, 8), x(4, 2, 8), cu, cu, band=(1, 0))
    yield kdnn.multi_head_attention(x(1, 4, 8), x(1, 4, 8), x(1, 4, 8), *w, heads=2,
                                    cu_seqlens=(cu, cu))
    yield kdnn.causal_conv1d(x(1, 5, 3), x(3, 4), activation="silu")
    yield kdnn.dt_softplus(x(1, 5, 2), x(2))
    yield kdnn.ssd(x(1, 5, 2, 3), torch.rand(1, 5, 2, dtype=torch.float64), -torch.rand(2).double(),
                   x(1, 5, 1, 4), x(1, 5, 1, 4), chunk_size=2)


def test_autograd_contexts_keep_records_not_extension_objects():
    # An extension object kept in an autograd graph alive at interpreter
    # exit is reported leaked by nanobind: the contexts keep records.
    for out in _outputs():
        ctx = out.grad_fn
        assert isinstance(ctx.options, Options)
        kept = [o for v in vars(ctx).values() for o in _extension_objects(v)]
        assert not kept, (type(ctx).__name__, kept)
        out.sum().backward()
