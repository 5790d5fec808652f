# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""A small hybrid model trained with kdnn's operators from PyTorch.

Each layer holds n residual streams (mHC's hyper-connections): the streams
are mixed by a doubly stochastic matrix per token, Sinkhorn(exp(logits)), and
their mean feeds a causal attention block and then a Mamba-2 mixer (conv1d +
SiLU, dt softplus, SSD), whose outputs are added back to every stream. The
model learns to reproduce a teacher of the same shape with other random
weights (so the loss can fall towards zero), by Adam on an MSE loss.

    python train_hybrid.py [--steps 300] [--ops kdnn|torch] [--dtype float32|float64]
                           [--device cpu|cuda]
    mpiexec -n R python train_hybrid.py --cp [--layout load_balanced|contiguous] ...

--ops torch runs the same model on PyTorch's own formulations (an autograd
Sinkhorn loop, softmax attention or F.scaled_dot_product_attention, F.conv1d,
the chunked SSD) for comparison. Prints the loss as it falls and the time per
step and how much the peak memory grew while training (the process's
resident memory on the CPU, PyTorch's allocated device memory with
--device cuda, which needs a CUDA build of kdnn); exits 1 unless the loss
fell below a tenth of its start.

--cp trains context parallel under mpiexec: every rank holds its steps of
each sequence by one kdnn.cp.SequenceLayout (load-balanced by default), used
by every layer (kdnn.cp.flash_attention, conv_dt and ssd; the Sinkhorn and
the linear layers are per token). The loss is the whole sequence's (summed
over the ranks) and the parameters' gradients are summed over the ranks
before each step, so the losses equal the single-rank run's.
"""
import argparse
import math
import pathlib
import resource
import sys
import time

import torch
import torch.nn.functional as F

import kdnn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "unit_tests" / "reference"))
from kdnn_reference.ssd import ssd_chunked  # noqa: E402  (the torch formulation)


def status_kib(field):
    """A field of /proc/self/status in KiB (Linux), or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def start_peak_memory():
    """Resets the process's peak resident size where the kernel allows it
    and returns a function giving the growth of the peak since, in MiB.
    ru_maxrss alone is not enough: on Linux a child process starts from its
    parent's peak, so a run started by a large process would show no growth.
    Writing 5 to /proc/self/clear_refs resets VmHWM to the current size."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = status_kib("VmHWM")
    except OSError:
        before = None
    if before is not None:
        return lambda: (status_kib("VmHWM") - before) / 1024
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return lambda: (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024


class KdnnOps:
    """The model's operators from kdnn."""
    sinkhorn = staticmethod(lambda logits, iters: kdnn.sinkhorn(logits, iters=iters, backward="unrolled"))
    attention = staticmethod(lambda q, k, v: kdnn.flash_attention(q, k, v, causal=True))

    @staticmethod
    def conv_dt(x, w, b, dt, dt_bias):
        return kdnn.causal_conv1d(x, w, b, activation="silu"), kdnn.dt_softplus(dt, dt_bias)

    ssd = staticmethod(lambda x, dt, A, B, C, chunk, D: kdnn.ssd(x, dt, A, B, C, D, chunk_size=chunk))


class CpOps(KdnnOps):
    """kdnn's operators on this rank's steps of `layout` over `comm`."""

    def __init__(self, comm, layout):
        self.comm, self.layout = comm, layout

    def attention(self, q, k, v):
        return kdnn.cp.flash_attention(q, k, v, comm=self.comm, layout=self.layout, causal=True)

    def conv_dt(self, x, w, b, dt, dt_bias):
        return kdnn.cp.conv_dt(x, w, dt, dt_bias, b, comm=self.comm, layout=self.layout)

    def ssd(self, x, dt, A, B, C, chunk, D):
        return kdnn.cp.ssd(x, dt, A, B, C, D, chunk_size=chunk, comm=self.comm,
                           layout=self.layout)


class TorchOps:
    """The same operators written with PyTorch."""

    @staticmethod
    def sinkhorn(logits, iters):
        r = logits.exp()
        for _ in range(iters):
            r = r / r.sum(-2, keepdim=True)
            r = r / r.sum(-1, keepdim=True)
        return r

    @staticmethod
    def attention(q, k, v):
        if hasattr(F, "scaled_dot_product_attention"):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        S = s.shape[-1]
        s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool, device=s.device).tril(), -math.inf)
        return torch.softmax(s, -1) @ v

    @staticmethod
    def conv_dt(x, w, b, dt, dt_bias):
        K, C = w.shape[1], x.shape[-1]
        y = F.conv1d(F.pad(x.transpose(1, 2), (K - 1, 0)), w[:, None, :], b, groups=C)
        return F.silu(y.transpose(1, 2)), F.softplus(dt + dt_bias)

    @staticmethod
    def ssd(x, dt, A, B, C, chunk, D):
        return ssd_chunked(x, dt, A, B, C, chunk, D=D)[0]


class Layer(torch.nn.Module):
    def __init__(self, E, streams, heads, state, chunk, ops, **kw):
        super().__init__()
        self.ops, self.n, self.heads, self.chunk = ops, streams, heads, chunk
        self.H, self.P, self.N, self.K = heads, E // heads, state, 4
        self.mix = torch.nn.Linear(E, streams * streams, **kw)
        self.qkv = torch.nn.Linear(E, 3 * E, **kw)
        self.attn_out = torch.nn.Linear(E, E, **kw)
        channels = self.H * self.P + 2 * self.N
        self.in_proj = torch.nn.Linear(E, channels + self.H, **kw)
        self.conv_w = torch.nn.Parameter(torch.randn(channels, self.K, **kw) / 2)
        self.conv_b = torch.nn.Parameter(torch.zeros(channels, **kw))
        self.dt_bias = torch.nn.Parameter(torch.full((self.H,), -1.0, **kw))
        self.A_log = torch.nn.Parameter(torch.zeros(self.H, **kw))
        self.D = torch.nn.Parameter(torch.ones(self.H, **kw))
        self.out_proj = torch.nn.Linear(self.H * self.P, E, **kw)

    def forward(self, x):  # x [B, L, n, E]
        Bt, L, n, E = x.shape
        # mHC: mix the streams by a doubly stochastic matrix per token.
        r = self.ops.sinkhorn(self.mix(x.mean(2)).reshape(Bt, L, n, n), 10)
        x = r @ x
        # Causal attention on the streams' mean, added to every stream.
        q, k, v = self.qkv(x.mean(2)).reshape(Bt, L, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = self.ops.attention(q.contiguous(), k.contiguous(), v.contiguous())
        x = x + self.attn_out(a.transpose(1, 2).reshape(Bt, L, E))[:, :, None]
        # Mamba-2 mixer: conv1d + SiLU, dt softplus, SSD.
        zxbc = self.in_proj(x.mean(2))
        HP = self.H * self.P
        xbc, dt = self.ops.conv_dt(zxbc[..., :HP + 2 * self.N].contiguous(), self.conv_w,
                                   self.conv_b, zxbc[..., HP + 2 * self.N:].contiguous(),
                                   self.dt_bias)
        xs = xbc[..., :HP].reshape(Bt, L, self.H, self.P)
        Bm = xbc[..., HP:HP + self.N].reshape(Bt, L, 1, self.N)
        Cm = xbc[..., HP + self.N:].reshape(Bt, L, 1, self.N)
        y = self.ops.ssd(xs.contiguous(), dt, -self.A_log.exp(), Bm.contiguous(), Cm.contiguous(),
                         self.chunk, self.D)
        return x + self.out_proj(y.reshape(Bt, L, HP))[:, :, None]


class Model(torch.nn.Module):
    def __init__(self, E=32, streams=4, heads=4, state=16, chunk=16, layers=2, ops=KdnnOps, **kw):
        super().__init__()
        self.streams = streams
        self.layers = torch.nn.ModuleList(
            Layer(E, streams, heads, state, chunk, ops, **kw) for _ in range(layers))

    def forward(self, x):  # [B, L, E] -> [B, L, E]
        h = x[:, :, None].expand(-1, -1, self.streams, -1)
        for layer in self.layers:
            h = layer(h)
        return h.mean(2)


def train(model, x, target, steps, lr, comm=None, report=None):
    """Adam on the MSE loss of model(x) against target for `steps` steps;
    returns the losses (steps + 1 of them). With `comm`, x and target are
    this rank's steps of the whole sequences: the loss is the whole one
    (summed over the ranks) and the gradients are summed over the ranks
    before each step."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    count = torch.tensor(float(target.numel()))
    if comm is not None:
        count = torch.tensor(float(comm.allreduce(target.numel())))
    losses = []
    for step in range(steps + 1):
        loss = F.mse_loss(model(x), target, reduction="sum") / count.to(target.dtype)
        whole = loss.item() if comm is None else comm.allreduce(loss.item())
        losses.append(whole)
        if report:
            report(step, whole)
        if step == steps:
            break
        optimizer.zero_grad()
        loss.backward()
        if comm is not None:  # each rank's gradients are its steps' part
            from mpi4py import MPI
            for p in model.parameters():
                g = p.grad.detach().cpu().contiguous()
                comm.Allreduce(MPI.IN_PLACE, g.numpy())
                p.grad.copy_(g)
        optimizer.step()
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--ops", choices=["kdnn", "torch"], default="kdnn")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda with a CUDA build of kdnn")
    parser.add_argument("--cp", action="store_true",
                        help="context parallel over the ranks of mpiexec (kdnn.cp)")
    parser.add_argument("--layout", choices=["load_balanced", "contiguous"],
                        default="load_balanced", help="with --cp: the sequence's layout")
    a = parser.parse_args()
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    kw = {"dtype": getattr(torch, a.dtype), "device": device}
    ops, comm, rank = KdnnOps if a.ops == "kdnn" else TorchOps, None, 0
    if a.cp:
        from mpi4py import MPI
        comm, rank, size = MPI.COMM_WORLD, MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        if a.layout == "load_balanced":
            layout = kdnn.cp.SequenceLayout.load_balanced(a.length, size)
        else:
            layout = kdnn.cp.SequenceLayout.contiguous(
                [a.length // size + (r < a.length % size) for r in range(size)])
        ops = CpOps(comm, layout)
    torch.manual_seed(0)  # the same model and data on every rank
    teacher = Model(ops=TorchOps, **kw)
    model = Model(ops=ops, **kw)
    x = torch.randn(a.batch, a.length, 32, **kw)
    with torch.no_grad():  # a sequence at a time: the peak memory below is the training's
        target = torch.cat([teacher(x[i:i + 1]) for i in range(a.batch)])
    if comm is not None:
        x, target = (kdnn.cp.shard(t, layout=layout, rank=rank) for t in (x, target))
    say = print if rank == 0 else (lambda *args, **kwargs: None)
    where = f"{comm.Get_size()} ranks, {a.layout} layout, " if comm is not None else ""
    say(f"hybrid model (mHC Sinkhorn, attention, Mamba-2 conv + SSD), ops={a.ops}, {a.dtype}, "
        f"B={a.batch} L={a.length}, {where}on {device}, kdnn backend {kdnn.backend}")
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device) / 2**20
    else:
        peak_growth = start_peak_memory()
    start = time.perf_counter()

    def report(step, loss):
        if step % 50 == 0 or step == a.steps:
            say(f"  step {step:4d}  loss {loss:.4e}", flush=True)

    losses = train(model, x, target, a.steps, a.lr, comm, report)
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    if cuda:
        grown = torch.cuda.max_memory_allocated(device) / 2**20 - before
    else:
        grown = peak_growth()
    say(f"  {1e3 * seconds / max(a.steps, 1):.2f} ms per step; peak {'device ' if cuda else ''}"
        f"memory grew {grown:.0f} MiB while training" + (" (rank 0)" if comm else ""))
    if not losses[-1] < losses[0] / 10:
        say("train_hybrid: the loss did not fall below a tenth of its start", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
