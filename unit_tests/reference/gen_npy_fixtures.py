#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Writes the small .npy files in ../data/npy (relative to this script) with
NumPy's own writer (np.save, np.lib.format.write_array), for the tests of the
kdnn::io reader in unit_tests/io/test_npy.cpp. Needs only NumPy (the files
committed were written by NumPy 1.24; the script reproduces them byte for
byte):

    python3 unit_tests/reference/gen_npy_fixtures.py [OUT_DIR]

Accepted by read_npy: float32, float64, int32, int64, float16 and bfloat16
(raw bits under the structured dtype [('bfloat16', '<u2')]), C order, little
endian, format versions 1.0 to 3.0. Rejected: Fortran order, big endian,
unsigned and other integer widths, other structured dtypes.
"""
import os
import sys

import numpy as np

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


def save(out_dir, name, a, version=None):
    with open(os.path.join(out_dir, name), "wb") as f:
        if version is None:
            np.save(f, a)
        else:
            np.lib.format.write_array(f, a, version=version)


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.normpath(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "npy"))
    os.makedirs(out_dir, exist_ok=True)
    # Accepted.
    save(out_dir, "f32_2x3.npy", np.array([[1.5, -2.25, 0.1], [3.0, 1e30, -0.0]], dtype="<f4"))
    save(out_dir, "f64_4.npy", np.array([0.1, -2.5, 1e300, 3.141592653589793], dtype="<f8"))
    save(out_dir, "f64_scalar.npy", np.array(42.5, dtype="<f8"))
    save(out_dir, "f64_2x2_v2.npy", np.array([[1, 2], [3, 4]], dtype="<f8"), version=(2, 0))
    save(out_dir, "f32_3_v3.npy", np.array([0.25, 0.5, 0.75], dtype="<f4"), version=(3, 0))
    save(out_dir, "i32_3.npy", np.array([1, 2, 3], dtype="<i4"))
    save(out_dir, "i32_2x3.npy", np.array([[INT32_MIN, -1, 0], [1, 7, INT32_MAX]], dtype="<i4"))
    save(out_dir, "i64_5.npy", np.array([0, -5, INT32_MAX, INT32_MIN, 12], dtype="<i8"))
    save(out_dir, "f16_4.npy", np.array([1.5, -2.0, 65504.0, 2.0**-24], dtype="<f2"))
    # bfloat16 1.0, -2.5, 3.0e38 (rounded: 0x7f62), the smallest subnormal.
    bf16 = np.array([0x3F80, 0xC020, 0x7F62, 0x0001], dtype="<u2").view([("bfloat16", "<u2")])
    save(out_dir, "bf16_2x2.npy", bf16.reshape(2, 2))
    # Read, but read_int_vector refuses index 2 (beyond int).
    save(out_dir, "i64_beyond_int_3.npy", np.array([7, -2, INT32_MAX + 1], dtype="<i8"))
    # Rejected.
    save(out_dir, "f64_2x3_fortran.npy",
         np.asfortranarray(np.arange(6, dtype="<f8").reshape(2, 3)))
    save(out_dir, "f8_bigendian_3.npy", np.array([1, 2, 3], dtype=">f8"))
    save(out_dir, "i4_bigendian_3.npy", np.array([1, 2, 3], dtype=">i4"))
    save(out_dir, "u4_3.npy", np.array([1, 2, 3], dtype="<u4"))
    save(out_dir, "i2_3.npy", np.array([1, 2, 3], dtype="<i2"))
    save(out_dir, "structured_2.npy", np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]))


if __name__ == "__main__":
    main()
