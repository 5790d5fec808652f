# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Philox-4x32-10 in NumPy, and the dropout keep mask kdnn draws from it.

Written from the generator's definition (Salmon et al., SC 2011; Random123),
independently of kdnn's C++ (src/kdnn/core/impl/philox.hpp), so that golden
data made with it cross-checks kdnn's generator.

philox4x32_10(counter, key): the 10-round bijection of counters [..., 4]
    (uint32) under key (k0, k1); check_known_answers() runs it on Random123's
    known-answer vectors (the ones unit_tests/core/test_philox.cpp uses).
dropout_keep(shape, p, seed, offset): kdnn's mask (attention/dropout.hpp):
    element k of the row-major tensor uses word k % 4 of
    philox4x32_10(counter=(k/4 low 32 bits, k/4 high, offset low, offset high),
                  key=(seed low 32 bits, seed high))
    and is kept iff that word >= round(p * 2**32) (at most 2**32 - 1).
"""
import numpy as np

M0, M1 = 0xD2511F53, 0xCD9E8D57  # round multipliers
W0, W1 = 0x9E3779B9, 0xBB67AE85  # Weyl increments of the key
MASK32 = 0xFFFFFFFF

# (counter, key, expected words): Random123's kat_vectors for philox4x32_10.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((MASK32,) * 4, (MASK32, MASK32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def philox4x32_10(counter, key):
    """The words of Philox-4x32-10 for counters [..., 4] (uint32) and key (k0, k1)."""
    counter = np.asarray(counter, dtype=np.uint64)
    c = [counter[..., i] for i in range(4)]
    k0, k1 = int(key[0]) & MASK32, int(key[1]) & MASK32
    u32, mask = np.uint64(32), np.uint64(MASK32)  # uint64 operands: no float promotion
    for _ in range(10):
        p0 = np.uint64(M0) * c[0]  # exact: both factors < 2**32
        p1 = np.uint64(M1) * c[2]
        c = [(p1 >> u32) ^ c[1] ^ np.uint64(k0), p1 & mask,
             (p0 >> u32) ^ c[3] ^ np.uint64(k1), p0 & mask]
        k0, k1 = (k0 + W0) & MASK32, (k1 + W1) & MASK32
    return np.stack(c, axis=-1).astype(np.uint32)


def check_known_answers():
    """Raises AssertionError unless philox4x32_10 reproduces Random123's vectors."""
    for counter, key, expected in KNOWN_ANSWERS:
        got = philox4x32_10(np.array(counter, dtype=np.uint64), key)
        assert got.tolist() == list(expected), (counter, key, [hex(w) for w in got])


def dropout_keep(shape, p, seed, offset):
    """kdnn's keep mask (bool, `shape`) for drop probability p, seed and offset."""
    count = int(np.prod(shape))
    g = np.arange((count + 3) // 4, dtype=np.uint64)
    counter = np.stack([g & np.uint64(MASK32), g >> np.uint64(32),
                        np.full_like(g, offset & MASK32), np.full_like(g, offset >> 32)], -1)
    words = philox4x32_10(counter, (seed & MASK32, seed >> 32)).reshape(-1)[:count]
    threshold = min(np.rint(p * 2.0**32), float(MASK32))  # rint: round half to even
    return (words.astype(np.float64) >= threshold).reshape(shape)
