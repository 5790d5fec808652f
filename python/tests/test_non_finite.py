# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn's policy on non-finite data (docs/api.md): a NaN or an infinity in a
tensor gives NaN in the outputs that depend on it, as in PyTorch, never an
error, a crash or a hang; check_finite=True refuses it instead, naming the
first bad element; the small parameters are checked always."""
import math

import pytest
import torch
import torch.nn.functional as F

import kdnn

NAN, INF = float("nan"), float("inf")


def raises(fragment):
    return pytest.raises(kdnn.Error, match=fragment)


def attention_inputs():
    torch.manual_seed(0)
    return [torch.randn(1, 2, 6, 4, dtype=torch.float64) for _ in range(3)]


def attention_reference(q, k, v, causal):
    """PyTorch's attention, as a user would write it (float64)."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        S = q.shape[2]
        scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), -INF)
    return torch.softmax(scores, -1) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_attention_propagates_a_nan_where_pytorch_does(where, causal):
    q, k, v = attention_inputs()
    {"q": q, "k": k, "v": v}[where][0, 1, 3, 2] = NAN
    want = attention_reference(q, k, v, causal)
    got = kdnn.flash_attention(q, k, v, causal=causal)
    assert torch.isnan(want).any()
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    finite = ~torch.isnan(want)
    torch.testing.assert_close(got[finite], want[finite])


def test_attention_check_finite_names_the_first_bad_element():
    q, k, v = attention_inputs()
    v[0, 1, 4, 0], v[0, 0, 5, 3] = INF, NAN
    with raises(r"v\[0, 0, 5, 3\]=nan, expected finite values \(check_finite\)"):
        kdnn.flash_attention(q, k, v, check_finite=True)
    q[0, 0, 0, 0] = -INF
    with raises(r"q\[0, 0, 0, 0\]=-inf, expected finite values \(check_finite\)"):
        kdnn.flash_attention(q, k, v, check_finite=True)


def test_attention_check_finite_covers_the_incoming_gradient():
    q, k, v = (t.requires_grad_() for t in attention_inputs())
    out = kdnn.flash_attention(q, k, v, check_finite=True)
    grad = torch.ones_like(out)
    grad[0, 1, 2, 3] = NAN
    with raises(r"dout\[0, 1, 2, 3\]=nan, expected finite values"):
        out.backward(grad)


def sinkhorn_reference(x, iters):
    """PyTorch's loop (columns first), as the users' autograd baseline."""
    p = torch.exp(x)
    for _ in range(iters):
        p = p / p.sum(-2, keepdim=True)
        p = p / p.sum(-1, keepdim=True)
    return p


@pytest.mark.parametrize("bad", ["nan", "+inf", "row of -inf"])
def test_sinkhorn_gives_nan_for_the_matrix_that_holds_a_bad_value(bad):
    torch.manual_seed(1)
    x = torch.randn(3, 4, 4, dtype=torch.float64)
    if bad == "row of -inf":
        x[1, 2, :] = -INF
    else:
        x[1, 0, 2] = NAN if bad == "nan" else INF
    x.requires_grad_()
    r = kdnn.sinkhorn(x, iters=10)
    assert torch.isnan(r[1]).all()
    torch.testing.assert_close(r[[0, 2]], sinkhorn_reference(x.detach()[[0, 2]], 10))
    assert torch.isnan(sinkhorn_reference(x.detach()[1], 10)).all()  # as PyTorch's
    r.sum().backward()  # the implicit backward's CG stops at its cap: no hang
    assert torch.isfinite(x.grad[[0, 2]]).all()
    with raises(r"sinkhorn::forward: X\[1, "):
        kdnn.sinkhorn(x.detach(), iters=10, check_finite=True)


def test_sinkhorn_backward_check_finite_covers_the_gradient():
    x = torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True)
    for backward in ("implicit", "unrolled", "block"):
        r = kdnn.sinkhorn(x, iters=30, backward=backward, check_finite=True)
        g = torch.ones_like(r)
        g[1, 2, 0] = NAN
        with raises(r"G\[1, 2, 0\]=nan, expected finite values"):
            r.backward(g)


def test_conv_propagates_a_nan_to_the_windows_that_hold_it():
    torch.manual_seed(2)
    x, w = torch.randn(2, 9, 3, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    x[1, 4, 2] = NAN
    y = kdnn.causal_conv1d(x, w, activation="silu")
    want = F.silu(F.conv1d(F.pad(x.transpose(1, 2), (3, 0)), w.unsqueeze(1), groups=3))
    want = want.transpose(1, 2)
    assert torch.equal(torch.isnan(y), torch.isnan(want))
    assert torch.isnan(y[1, 4:8, 2]).all() and torch.isnan(y).sum() == 4
    with raises(r"ssm::causal_conv1d_forward: x\[1, 4, 2\]=nan, expected finite values"):
        kdnn.causal_conv1d(x, w, check_finite=True)
    state = torch.zeros(2, 3, 3, dtype=torch.float64)
    with raises(r"ssm::causal_conv1d_update: x\[1, 2, 0\]=nan"):
        kdnn.causal_conv1d_update(x[:, 4].unsqueeze(-1).transpose(1, 2).reshape(2, 3), state, w,
                                  check_finite=True)


def ssd_inputs():
    torch.manual_seed(3)
    f64 = dict(dtype=torch.float64)
    return dict(x=torch.randn(1, 12, 2, 3, **f64), dt=F.softplus(torch.randn(1, 12, 2, **f64)),
                A=-torch.rand(2, **f64) - 0.1, B=torch.randn(1, 12, 1, 4, **f64),
                C=torch.randn(1, 12, 1, 4, **f64))


def test_ssd_propagates_a_nan_through_the_state():
    a = ssd_inputs()
    a["x"][0, 5, 1, 2] = NAN
    y = kdnn.ssd(**a, chunk_size=4)
    assert torch.isnan(y[0, 5:, 1, 2]).all()   # the step and every later one, that channel
    assert torch.isfinite(y[0, :, 0]).all()    # the other head never sees it
    assert torch.isfinite(y[0, :4]).all()      # nor the chunks before it
    with raises(r"ssm::ssd_forward: x\[0, 5, 1, 2\]=nan, expected finite values"):
        kdnn.ssd(**a, chunk_size=4, check_finite=True)


def test_ssd_step_sizes_propagate_under_the_transform():
    a = ssd_inputs()
    a["dt"][0, 7, 0] = NAN
    y = kdnn.ssd(**a, chunk_size=4, dt_softplus=True, dt_bias=torch.zeros(2, dtype=torch.float64))
    assert torch.isnan(y[0, 7:, 0]).all() and torch.isfinite(y[0, :4]).all()
    with raises(r"dt\[0, 7, 0\]=nan, expected finite values"):
        kdnn.ssd(**a, chunk_size=4, dt_softplus=True, check_finite=True)
    out = kdnn.dt_softplus(a["dt"], torch.zeros(2, dtype=torch.float64))
    assert torch.isnan(out[0, 7, 0]) and torch.isnan(out).sum() == 1
    with raises(r"ssm::dt_softplus_forward: dt\[0, 7, 0\]=nan"):
        kdnn.dt_softplus(a["dt"], torch.zeros(2, dtype=torch.float64), check_finite=True)


@pytest.mark.parametrize("name, index", [("D", 1), ("dt_bias", 0)])
def test_ssd_parameters_are_always_checked(name, index):
    a = ssd_inputs()
    value = torch.ones(2, dtype=torch.float64)
    value[index] = NAN
    with raises(rf"{name}\[{index}\]=nan, expected finite values"):
        kdnn.ssd(**a, chunk_size=4, **{name: value})
    if name == "dt_bias":
        with raises(r"dt_softplus: dt_bias\[0\]=nan, expected finite values \(a parameter\)"):
            kdnn.dt_softplus(a["dt"], value)


def test_the_attention_layer_checks_its_weights_with_check_finite():
    torch.manual_seed(4)
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    w = [torch.randn(8, 8, dtype=torch.float64) for _ in range(4)]
    w[2][3, 1] = NAN
    out = kdnn.multi_head_attention(x, x, x, *w, heads=2)
    assert torch.isnan(out).any()
    with raises(r"mha_forward: weights.w_v\[3, 1\]=nan, expected finite values"):
        kdnn.multi_head_attention(x, x, x, *w, heads=2, check_finite=True)


def test_a_negative_step_is_still_refused_and_named():
    a = ssd_inputs()
    a["dt"][0, 2, 1] = -0.5
    with raises(r"ssm::ssd_forward: dt\[0, 2, 1\]=-0.5, expected dt >= 0 \(check_dt\)"):
        kdnn.ssd(**a, chunk_size=4)
    assert math.isfinite(float(kdnn.ssd(**ssd_inputs(), chunk_size=4).sum()))
