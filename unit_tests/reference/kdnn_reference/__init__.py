# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""PyTorch reference formulations of the kdnn operators, one module per family.

Shared by the golden-data generators in unit_tests/reference/ and the PyTorch
comparison scripts in perf_tests/, so each formulation is written once:
    kdnn_reference.sinkhorn   Sinkhorn-Knopp forward and backwards
    kdnn_reference.mhc_peers  TransformerEngine's and TileKernels' mHC Sinkhorn
    kdnn_reference.mha        the multi-head attention layer (torch.nn.functional)
    kdnn_reference.philox     Philox-4x32-10 (NumPy) and kdnn's dropout keep mask
    kdnn_reference.ssd        Mamba-2's SSD, chunked (after the paper's minimal SSD)
Scripts put unit_tests/reference on sys.path and `from kdnn_reference import sinkhorn`.
"""
