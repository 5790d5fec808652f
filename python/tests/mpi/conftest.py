# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The context-parallel tests run only under mpiexec (every rank runs the
same tests in the same order: each call is collective), e.g.
    mpiexec -n 2 build/venv/bin/python -m pytest python/tests/mpi"""
import os
import pathlib

import pytest

import kdnn

launched = any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


def pytest_collection_modifyitems(config, items):
    reason = None
    if not launched:
        reason = "context-parallel tests run under mpiexec"
    elif not kdnn.cp.available:
        reason = "kdnn was built without MPI"
    else:
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            reason = "mpi4py is not installed"
    if reason:
        here = pathlib.Path(__file__).parent
        for item in items:  # the hook sees the whole session's tests: only ours
            if here in pathlib.Path(str(item.fspath)).parents:
                item.add_marker(pytest.mark.skip(reason=reason))
