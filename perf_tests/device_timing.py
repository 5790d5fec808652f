# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""How every compare_*.py times an implementation, kdnn's (through `import
kdnn`) and its peers' alike, in the same process:

- device time: what the phase keeps the GPU busy. A GPU sleep is queued
  first, long enough for the host to queue the whole phase behind it, and
  CUDA events on the phase's stream (PyTorch's current stream, where kdnn's
  and the peers' kernels run) bracket the phase. So launches that the host
  makes faster than the GPU runs them cost nothing, as in a training step
  where the host runs ahead; a phase that waits for the GPU inside (a
  synchronisation, a host read of a device value) pays for it.
- call time: the wall time of one call as a user sees it, the device
  synchronised before and after; host launch costs included.

Both are medians over `repeats` (at least 10) runs after `warmup` runs. On the
CPU the two are the same wall time of the synchronous call. The device time
is the figure the targets use; the call time is reported beside it.

    timer = PhaseTimer("cuda")
    def one_run(phase):
        with phase("forward"):
            y = f(x)
        with phase("backward"):
            y.backward(dy)
    times = timer.run(one_run)   # {"forward": Times(device_ms, call_ms), ...}
"""
import contextlib
import statistics
import time
from collections import namedtuple

Times = namedtuple("Times", "device_ms call_ms")

MIN_REPEATS = 10


class PhaseTimer:
    def __init__(self, device, repeats=MIN_REPEATS, warmup=2):
        if repeats < MIN_REPEATS:
            raise ValueError(f"repeats={repeats}, expected at least {MIN_REPEATS}")
        self.device, self.repeats, self.warmup = str(device), repeats, warmup
        self.cuda = self.device.startswith("cuda")
        self._cycles_per_ms = None

    def run(self, one_run):
        """{phase: Times} of one_run(phase), which runs each phase of one
        call inside `with phase(name):`."""
        call = self._collect(one_run, self._call_phase)
        if not self.cuda:
            return {p: Times(ms, ms) for p, ms in call.items()}
        # The sleep before a phase outlasts the host's part of it with room to spare.
        self._ahead_ms = {p: 2.0 * ms + 0.5 for p, ms in call.items()}
        device = self._collect(one_run, self._device_phase)
        return {p: Times(device[p], call[p]) for p in call}

    def _collect(self, one_run, make_phase):
        samples = {}
        for rep in range(self.warmup + self.repeats):
            record = rep >= self.warmup

            @contextlib.contextmanager
            def phase(name):
                with make_phase(name) as elapsed_ms:
                    yield
                if record:
                    samples.setdefault(name, []).append(elapsed_ms())

            one_run(phase)
        return {p: statistics.median(t) for p, t in samples.items()}

    def _sync(self):
        if self.cuda:
            import torch
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def _call_phase(self, name):
        self._sync()
        t0 = time.perf_counter()
        result = []
        yield lambda: result[0]
        self._sync()
        result.append((time.perf_counter() - t0) * 1e3)

    @contextlib.contextmanager
    def _device_phase(self, name):
        import torch
        self._sync()
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        torch.cuda._sleep(int(self._ahead_ms.get(name, 1.0) * self.cycles_per_ms()))
        start.record()
        yield lambda: start.elapsed_time(end)
        end.record()
        end.synchronize()

    def cycles_per_ms(self):
        """GPU clock cycles per millisecond of torch.cuda._sleep, measured once."""
        if self._cycles_per_ms is None:
            import torch
            cycles = 20_000_000
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            torch.cuda._sleep(cycles)  # warm-up
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            self._cycles_per_ms = cycles / start.elapsed_time(end)
        return self._cycles_per_ms


def device_and_call(t):
    """(device ms, call ms or None) of a Times, or of one time in ms (kdnn's
    C++ benchmark time where the package is not importable; None stays None)."""
    if t is None or isinstance(t, (int, float)):
        return t, None
    return t.device_ms, t.call_ms


def call_cell(t):
    """A table cell for t's call time: "-" where t is one time."""
    call = device_and_call(t)[1]
    return "-" if call is None else f"{call:.3f}"


def forward_backward(device, repeats, forward, grad, leaves):
    """{"forward": Times, "backward": Times} of `forward()` (returning one
    tensor) and of that output's backward with gradient `grad`, each phase
    alone; the `leaves`' gradients are cleared after each run, so every run
    does the same work."""
    held = {}

    def one_run(phase):
        with phase("forward"):
            held["out"] = forward()
        with phase("backward"):
            held.pop("out").backward(grad)
        for t in leaves:
            t.grad = None

    return PhaseTimer(device, repeats).run(one_run)


def kdnn_package():
    """The kdnn package (timed through its Python calls, as its peers are),
    or None where it is not importable (then a script falls back to kdnn's
    C++ benchmark time)."""
    try:
        import kdnn
    except ImportError:
        return None
    return kdnn


def method_line(kdnn, reference="reference", bench_only=""):
    """The line a comparison's table starts with: how each time was taken.
    `bench_only` names the rows that have kdnn's C++ benchmark time alone."""
    via = "the kdnn package" if kdnn else "its C++ benchmark (package not importable)"
    alone = f" ({bench_only}: that alone)" if bench_only else ""
    return ("Device time (ms, CUDA events with the host queued ahead; on the CPU the wall time), "
            f"call time (ms, synchronised wall time) and the ratio {reference} / kdnn by device "
            f"time (> 1: kdnn faster); kdnn through {via}, its C++ benchmark time beside as a "
            f"cross-check{alone}.\n")


def ratio(reference, kdnn):
    """reference / kdnn of two Times, by device time (> 1: kdnn faster)."""
    return reference.device_ms / kdnn.device_ms
