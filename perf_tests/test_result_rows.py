# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Checks of result_rows.py and collect_results.py (no PyTorch needed)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import result_rows  # noqa: E402


class ResultRows(unittest.TestCase):
    def test_fraction_of_copy(self):
        # 201 MB in 0.1 ms is 2010 GB/s; of a 2680 GB/s copy that is 75 %.
        r = result_rows.row("sinkhorn", "implicit backward", (65536, 16, 100), 0.1,
                            "triton implicit", 0.2, traffic_bytes=201e6, copy_gbps=2680)
        self.assertEqual(r["size"], "65536x16x100")
        self.assertAlmostEqual(r["fraction_of_copy"], 0.75)
        self.assertEqual(set(r), set(result_rows.FIELDS))

    def test_device_and_call_times(self):
        import device_timing
        r = result_rows.row("ssd", "forward", (2, 4096), device_timing.Times(1.0, 1.5),
                            "mamba Triton", device_timing.Times(2.0, 4.0), bench_ms=0.9)
        self.assertEqual((r["kdnn_ms"], r["kdnn_call_ms"]), (1.0, 1.5))
        self.assertEqual((r["reference_ms"], r["reference_call_ms"]), (2.0, 4.0))
        self.assertEqual((r["timing"], r["kdnn_bench_ms"]), ("device+call", 0.9))
        single = result_rows.row("ssd", "forward", (2, 4096), 1.0, "x",
                                 device_timing.Times(2.0, 4.0))
        self.assertEqual((single["timing"], single["kdnn_call_ms"]), ("single", None))

    def test_compute_bound_rows_have_no_fraction(self):
        r = result_rows.row("attention", "fused forward", (1, 8, 2048, 2048, 64), 1.0,
                            "PyTorch SDPA float32", 0.5)
        self.assertIsNone(r["fraction_of_copy"])

    def test_collect_merges_and_stamps(self):
        with tempfile.TemporaryDirectory() as d:
            a, b, out = (os.path.join(d, n) for n in ("a.json", "b.json", "out.json"))
            result_rows.write(a, [result_rows.row("ssd", "forward", (2, 4096), 3.0, "x", 4.0)])
            result_rows.write(b, [result_rows.row("mha", "step", (8, 4), 1.0, "y", 2.0)])
            subprocess.run([sys.executable, os.path.join(HERE, "collect_results.py"), a, b,
                            os.path.join(d, "missing.json"), "--out", out, "--commit", "abc",
                            "--kokkos-version", "4.6.1", "--device", "dev", "--date",
                            "2026-11-24"], check=True, capture_output=True)
            rows = json.load(open(out))
            self.assertEqual([r["family"] for r in rows], ["ssd", "mha"])
            self.assertTrue(all(r["commit"] == "abc" and r["device"] == "dev"
                                and r["kokkos_version"] == "4.6.1"
                                and r["date"] == "2026-11-24" for r in rows))

    def test_collect_refuses_incomplete_rows(self):
        with tempfile.TemporaryDirectory() as d:
            a, out = os.path.join(d, "a.json"), os.path.join(d, "out.json")
            json.dump([{"family": "ssd"}], open(a, "w"))
            p = subprocess.run([sys.executable, os.path.join(HERE, "collect_results.py"), a,
                                "--out", out, "--commit", "c", "--kokkos-version", "v",
                                "--device", "d"], capture_output=True, text=True)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("a row without op", p.stderr)
            self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main()
