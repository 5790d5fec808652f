# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.cp.flash_attention and the sequence layouts on any number of ranks:
each rank's rows of the output, lse and input gradients equal the
single-rank kdnn.flash_attention's (and flash_attention_varlen's for packed
sequences) on the whole sequence, and the sinks' gradient summed over the
ranks equals theirs, for every layout and communication type; shard and
gather move a sequence to the ranks and back; the conv, the SSD and the
attention of a hybrid model share the load-balanced layout; a bad argument
on one rank is the same kdnn.Error on every rank."""
import pytest
import torch
from ranks import comm, leaves, rank, size, summed

import kdnn

f64 = dict(dtype=torch.float64)


def layouts(S):
    """Every layout the tests use for S steps, by name."""
    uneven = [S * (r + 1) // (size * (size + 1) // 2) for r in range(size)]
    uneven[-1] += S - sum(uneven)
    empty = [S // max(size - 1, 1)] * size
    empty[-1] = 0
    empty[0] += S - sum(empty)
    out = {"uneven": kdnn.cp.SequenceLayout.contiguous(uneven),
           "empty last rank": kdnn.cp.SequenceLayout.contiguous(empty),
           "load balanced": kdnn.cp.SequenceLayout.load_balanced(S, size)}
    return out


def groups():
    """mpi4py splits of the ranks into groups of each size that divides them."""
    return [comm.Split(rank // g, rank) for g in range(1, size + 1) if size % g == 0]


def comm_types():
    out = [("ring", {}), ("all_gather", {}), ("all_gather", {"gather_kv_heads": 1}),
           ("all_to_all", {})]
    return out + [("all_to_all_ring", {"heads_comm": g}) for g in groups()]


@pytest.mark.parametrize("layout_name", ["uneven", "empty last rank", "load balanced"])
@pytest.mark.parametrize("options", [dict(causal=True),
                                     dict(band=(3, 0), softcap=2.0),
                                     dict(causal=True, dropout_p=0.2, seed=7,
                                          alibi_slopes=[0.5, 0.25, 0.125, 0.0625])])
def test_flash_attention_equals_the_single_rank_call(layout_name, options):
    torch.manual_seed(0)  # the same inputs on every rank
    B, H, Hkv, S, D = 2, 4, 2, 19, 8
    q, k, v = (torch.randn(B, h, S, D, **f64) for h in (H, Hkv, Hkv))
    sinks, grad = torch.randn(H, **f64), torch.randn(B, H, S, D, **f64)
    layout = layouts(S)[layout_name]

    whole = leaves(q, k, v, sinks)
    o, lse = kdnn.flash_attention(*whole[:3], sinks=whole[3], return_lse=True, **options)
    (o * grad).sum().backward()

    for comm_type, extra in comm_types():
        part = [kdnn.cp.shard(t, layout=layout, rank=rank, dim=2) for t in (q, k, v)]
        part = leaves(*part, sinks)
        op, lsep = kdnn.cp.flash_attention(*part[:3], sinks=part[3], comm=comm, layout=layout,
                                           comm_type=comm_type, return_lse=True, **extra,
                                           **options)
        (op * kdnn.cp.shard(grad, layout=layout, rank=rank, dim=2)).sum().backward()
        mine = [kdnn.cp.shard(t, layout=layout, rank=rank, dim=2) for t in (o, lse.unsqueeze(-1))]
        torch.testing.assert_close(op, mine[0], msg=lambda m: f"{comm_type}: {m}")
        torch.testing.assert_close(lsep, mine[1][..., 0], msg=lambda m: f"{comm_type}: {m}")
        for p, w in zip(part[:3], whole[:3]):
            torch.testing.assert_close(p.grad, kdnn.cp.shard(w.grad, layout=layout, rank=rank,
                                                             dim=2))
        torch.testing.assert_close(summed(part[3].grad), whole[3].grad)
        # The whole sequence's output, gathered on every rank.
        torch.testing.assert_close(kdnn.cp.gather(op.detach(), comm=comm, layout=layout, dim=2),
                                   o.detach())


@pytest.mark.parametrize("comm_type", ["ring", "all_gather", "all_to_all"])
def test_packed_sequences_equal_the_varlen_call(comm_type):
    torch.manual_seed(2)
    S, H, Hkv, D = 26, 2, 1, 8
    cu = [0, 5, 6, 13, 13, 26]
    q, k, v = (torch.randn(S, h, D, **f64) for h in (H, Hkv, Hkv))
    grad = torch.randn(S, H, D, **f64)
    layout = layouts(S)["load balanced"]

    whole = leaves(q, k, v)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    o = kdnn.flash_attention_varlen(*whole, cu_t, cu_t, causal=True)
    (o * grad).sum().backward()

    part = leaves(*(kdnn.cp.shard(t, layout=layout, rank=rank, dim=0) for t in (q, k, v)))
    op = kdnn.cp.flash_attention_varlen(*part, cu, comm=comm, layout=layout,
                                        comm_type=comm_type, causal=True)
    (op * kdnn.cp.shard(grad, layout=layout, rank=rank, dim=0)).sum().backward()
    torch.testing.assert_close(op, kdnn.cp.shard(o, layout=layout, rank=rank, dim=0))
    for p, w in zip(part, whole):
        torch.testing.assert_close(p.grad, kdnn.cp.shard(w.grad, layout=layout, rank=rank, dim=0))


def test_default_layout_is_every_rank_in_order():
    torch.manual_seed(3)
    S = 11
    x = torch.randn(2, S, 3, **f64)
    layout = layouts(S)["uneven"]
    mine = kdnn.cp.shard(x, layout=layout, rank=rank)
    torch.testing.assert_close(kdnn.cp.gather(mine, comm=comm), x)
    balanced = layouts(S)["load balanced"]
    torch.testing.assert_close(
        kdnn.cp.gather(kdnn.cp.shard(x, layout=balanced, rank=rank), comm=comm, layout=balanced),
        x)


def test_hybrid_layers_share_the_load_balanced_layout():
    """The conv, the SSD and attention of one hybrid block on the
    load-balanced layout equal one rank's, forward and backward."""
    torch.manual_seed(4)
    b, L, h, p, g, n, K = 1, 24, 2, 4, 1, 4, 4
    C = h * p
    x = torch.randn(b, L, C, **f64)
    w, dt, dt_bias = torch.randn(C, K, **f64), torch.randn(b, L, h, **f64), torch.randn(h, **f64)
    A, Bm, Cm = -torch.rand(h, **f64) - 0.1, torch.randn(b, L, g, n, **f64), torch.randn(b, L, g, n, **f64)
    layout = kdnn.cp.SequenceLayout.load_balanced(L, size)

    def block(x, w, dt, dt_bias, A, Bm, Cm, cp):
        if cp:
            y, dto = kdnn.cp.conv_dt(x, w, dt, dt_bias, comm=comm, layout=layout)
            s = kdnn.cp.ssd(y.view(b, -1, h, p), dto, A, Bm, Cm, chunk_size=4, comm=comm,
                            layout=layout)
        else:
            y = kdnn.causal_conv1d(x, w, activation="silu")
            dto = kdnn.dt_softplus(dt, dt_bias)
            s = kdnn.ssd(y.view(b, -1, h, p), dto, A, Bm, Cm, chunk_size=4)
        qkv = s.reshape(b, -1, h, p).transpose(1, 2)  # heads as attention's
        if cp:
            return kdnn.cp.flash_attention(qkv, qkv, qkv, comm=comm, layout=layout, causal=True)
        return kdnn.flash_attention(qkv, qkv, qkv, causal=True)

    whole = leaves(x, w, dt, dt_bias, A, Bm, Cm)
    out = block(*whole, cp=False)
    grad = torch.randn_like(out)
    (out * grad).sum().backward()
    part = leaves(*(kdnn.cp.shard(t, layout=layout, rank=rank) for t in (x,)), w,
                  kdnn.cp.shard(dt, layout=layout, rank=rank), dt_bias, A,
                  *(kdnn.cp.shard(t, layout=layout, rank=rank) for t in (Bm, Cm)))
    outp = block(*part, cp=True)
    (outp * kdnn.cp.shard(grad, layout=layout, rank=rank, dim=2)).sum().backward()
    torch.testing.assert_close(outp, kdnn.cp.shard(out, layout=layout, rank=rank, dim=2))
    for i in (0, 2, 5, 6):  # this rank's steps
        torch.testing.assert_close(part[i].grad,
                                   kdnn.cp.shard(whole[i].grad, layout=layout, rank=rank))
    for i in (1, 3, 4):  # parameters: partial sums
        torch.testing.assert_close(summed(part[i].grad), whole[i].grad)


def test_a_bad_argument_on_one_rank_is_the_same_error_on_every_rank():
    S = 4 * size
    layout = kdnn.cp.SequenceLayout.load_balanced(S, size)
    n = layout.local_steps(rank)
    q = torch.randn(1, 2, n, 4, **f64)
    odd = size - 1
    with pytest.raises(kdnn.Error) as e:
        kdnn.cp.flash_attention(q, q, q, comm=comm, layout=layout,
                                comm_type="spiral" if rank == odd else "ring")
    assert str(e.value) == (f"cp.flash_attention: comm_type='spiral', expected one of "
                            f"'ring', 'all_gather', 'all_to_all', 'all_to_all_ring' (on rank "
                            f"{odd} of {size})")
    with pytest.raises(kdnn.Error) as e:
        kdnn.cp.flash_attention(q, q, q, comm=comm, layout=[[(0, S)]] if rank == odd else layout)
    assert str(e.value) == (f"cp.flash_attention: layout is a list on rank {odd}, expected a "
                            "kdnn.cp.SequenceLayout or None")
    if size > 1:
        with pytest.raises(kdnn.Error) as e:
            kdnn.cp.ssd(q.view(1, n, 2, 4), q[0, 0], -torch.ones(2, **f64), q.view(1, n, 1, 8),
                        q.view(1, n, 1, 8), chunk_size=4, comm=comm,
                        layout=None if rank == odd else layout)
        assert str(e.value) == (f"cp.ssd: layout is None on rank {odd} and given on rank 0, "
                                "expected the same on every rank")
    # After the errors, a good call on every rank works.
    kdnn.cp.flash_attention(q, q, q, comm=comm, layout=layout, causal=True)


@pytest.mark.parametrize("layout_name", ["load balanced", "uneven"])
def test_the_hybrid_example_trains_across_ranks_as_on_one(layout_name):
    """python/examples/train_hybrid.py --cp: the model's losses over a few
    Adam steps, context parallel, equal the single-rank run's."""
    import pathlib
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
    import train_hybrid as example

    S = 24
    layout = layouts(S)[layout_name]
    runs = []
    for ops in (example.KdnnOps, example.CpOps(comm, layout)):
        torch.manual_seed(0)
        teacher = example.Model(ops=example.TorchOps, **f64)
        model = example.Model(ops=ops, **f64)
        x = torch.randn(2, S, 32, **f64)
        with torch.no_grad():
            target = teacher(x)
        if ops is example.KdnnOps:
            runs.append(example.train(model, x, target, 3, 3e-3))
        else:
            x, target = (kdnn.cp.shard(t, layout=layout, rank=rank) for t in (x, target))
            runs.append(example.train(model, x, target, 3, 3e-3, comm))
    assert runs[1] == pytest.approx(runs[0], rel=1e-10)
    assert runs[0][-1] < runs[0][0]
