# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The packings of perf_tests/packed_lengths.hpp in Python, the same lengths
for the same arguments, so that a compare_*.py script and the C++ benchmark
beside it run the same sequences. No dependencies."""


class Mt19937:
    """std::mt19937 (32-bit Mersenne Twister, seeded as its constructor
    seeds it): each call returns the next 32-bit output."""
    N, M = 624, 397

    def __init__(self, seed):
        self.state = [seed & 0xFFFFFFFF]
        for i in range(1, self.N):
            prev = self.state[-1]
            self.state.append((1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFFFFFF)
        self.index = self.N

    def __call__(self):
        if self.index == self.N:
            self._twist()
        y = self.state[self.index]
        self.index += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        return y ^ (y >> 18)

    def _twist(self):
        s = self.state
        for i in range(self.N):
            y = (s[i] & 0x80000000) | (s[(i + 1) % self.N] & 0x7FFFFFFF)
            s[i] = s[(i + self.M) % self.N] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
        self.index = 0


def uniform(gen, lo, hi):
    """An integer of [lo, hi] from gen's 32-bit outputs by Lemire's
    multiply-and-reject (packed_lengths.hpp's uniform())."""
    span = hi - lo + 1
    threshold = (2**32 - span) % span  # the low words that would bias the draw
    product = gen() * span
    while product % 2**32 < threshold:
        product = gen() * span
    return lo + (product >> 32)


def packed_lengths(total, lo, hi):
    """Lengths drawn from [lo, hi] (seed 7) until they total `total`, the
    last one cut to fit."""
    gen = Mt19937(7)
    lengths, used = [], 0
    while used < total:
        lengths.append(min(uniform(gen, lo, hi), total - used))
        used += lengths[-1]
    return lengths
