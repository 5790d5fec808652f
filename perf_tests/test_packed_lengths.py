#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""packed_lengths.py against what packed_lengths.hpp computes: the
generator is std::mt19937 (the standard fixes its 10000th output from the
default seed, 5489), uniform() keeps to [lo, hi], and the benchmarks'
default packing is the one the C++ benchmark runs (its 19 lengths, as
packed_lengths.hpp gives them)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from packed_lengths import Mt19937, packed_lengths, uniform  # noqa: E402


class PackedLengthsTest(unittest.TestCase):
    def test_generator_is_the_standards_mt19937(self):
        gen = Mt19937(5489)
        for _ in range(9999):
            gen()
        self.assertEqual(gen(), 4123659995)  # [rand.predef]

    def test_uniform_keeps_to_its_range(self):
        gen = Mt19937(1)
        draws = [uniform(gen, 3, 9) for _ in range(2000)]
        self.assertEqual(set(draws), set(range(3, 10)))
        self.assertEqual({uniform(gen, 5, 5) for _ in range(10)}, {5})
        self.assertTrue(all(0 <= uniform(gen, 0, 2**31 - 1) < 2**31 for _ in range(100)))

    def test_lengths_total_and_bounds(self):
        for total, lo, hi in ((32768, 64, 4096), (100, 1, 7), (5, 64, 4096)):
            lengths = packed_lengths(total, lo, hi)
            self.assertEqual(sum(lengths), total)
            self.assertTrue(all(lo <= n <= hi for n in lengths[:-1]))
            self.assertTrue(1 <= lengths[-1] <= hi)

    def test_default_packing_is_the_cpp_benchmarks(self):
        self.assertEqual(packed_lengths(32768, 64, 4096),
                         [371, 980, 3209, 1350, 1832, 4009, 2981, 1901, 4008, 1306, 2235, 1128,
                          2085, 413, 354, 1755, 1146, 128, 1577])


if __name__ == "__main__":
    unittest.main()
