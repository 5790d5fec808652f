# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Writing golden data, shared by the gen_*golden.py scripts.

save(name, t, np_dtype, out_dir) writes one tensor or array as
{out_dir}/{name}.npy (C order, little-endian, np_dtype); out_dir defaults to
OUT_DIR = unit_tests/data/sinkhorn.
write_case(prefix, x, g, r, dx, np_dtype) saves the four [B, n, n] tensors of
a Sinkhorn case as {prefix}_{x,g,r,dx}.npy in OUT_DIR, and prints R's
marginal errors and ||dX||.
"""
import os

import numpy as np

OUT_DIR = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "sinkhorn"))


def save(name, t, np_dtype, out_dir=OUT_DIR):
    """Writes t (a tensor or a NumPy array) as {out_dir}/{name}.npy and returns
    it as saved (NumPy)."""
    if hasattr(t, "detach"):
        t = t.detach().cpu().numpy()
    a = np.ascontiguousarray(np.asarray(t).astype(np_dtype))
    np.save(os.path.join(out_dir, name + ".npy"), a)
    return a


def write_case(prefix, x, g, r, dx, np_dtype):
    """Saves a case's X, G, R and dX and prints a summary line."""
    os.makedirs(OUT_DIR, exist_ok=True)
    save(prefix + "_x", x, np_dtype)
    save(prefix + "_g", g, np_dtype)
    r_np = save(prefix + "_r", r, np_dtype).astype(np.float64)
    dx_np = save(prefix + "_dx", dx, np_dtype).astype(np.float64)
    row_err = np.abs(r_np.sum(-1) - 1.0).max()
    col_err = np.abs(r_np.sum(-2) - 1.0).max()
    print(f"{prefix}: shape={r_np.shape} max|rowsum-1|={row_err:.3e} "
          f"max|colsum-1|={col_err:.3e} ||dx||={np.linalg.norm(dx_np):.6e}")
