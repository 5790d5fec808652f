# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Checks of device_timing.py on the CPU (no PyTorch needed there): every
phase is timed, medians over the runs after the warm-up, and the device time
equals the call time where there is no device."""
import os
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import device_timing  # noqa: E402


class PhaseTimerOnTheCpu(unittest.TestCase):
    def test_each_phase_is_the_median_of_the_timed_runs(self):
        durations = iter([0.05, 0.05] + [0.001, 0.003, 0.002] * 4 + [0.5] * 3)
        calls = []

        def one_run(phase):
            calls.append("run")
            with phase("forward"):
                time.sleep(next(durations))
            with phase("backward"):
                time.sleep(0.001)

        times = device_timing.PhaseTimer("cpu", repeats=10, warmup=2).run(one_run)
        self.assertEqual(len(calls), 12)  # two warm-ups, ten timed runs
        self.assertEqual(set(times), {"forward", "backward"})
        # The timed forwards slept 1, 3, 2, 1, 3, 2, 1, 3, 2, 1 ms: median 2 ms, and
        # neither the 50 ms warm-ups nor the 500 ms sleeps after run 12 count.
        self.assertGreaterEqual(times["forward"].call_ms, 2.0)
        self.assertLess(times["forward"].call_ms, 10.0)
        self.assertEqual(times["forward"].device_ms, times["forward"].call_ms)
        self.assertGreaterEqual(times["backward"].device_ms, 1.0)

    def test_fewer_than_ten_repeats_are_refused(self):
        with self.assertRaisesRegex(ValueError, "repeats=3, expected at least 10"):
            device_timing.PhaseTimer("cpu", repeats=3)

    def test_the_ratio_is_by_device_time(self):
        kdnn, reference = device_timing.Times(2.0, 9.0), device_timing.Times(3.0, 3.0)
        self.assertEqual(device_timing.ratio(reference, kdnn), 1.5)


if __name__ == "__main__":
    unittest.main()
