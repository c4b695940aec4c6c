import contextlib

import pytest

from pyro_ext.timeseries import _hmm_sequential, sequential_kernels


@contextlib.contextmanager
def _engine(name):
    if name == "sequential":
        # numba is in the test extra (test_hmm_sequential.py fails without it); a bare
        # device machine without it still runs the scan cases.
        if _hmm_sequential._kernels() is None:
            pytest.skip("numba is not installed (the fast extra)")
        yield
    elif name == "scan":
        with sequential_kernels(False):
            yield
    else:
        raise ValueError(name)


@pytest.fixture(scope="session")
def run_on():
    """``with run_on(name):`` runs the HMM and Kalman functions on ``"sequential"`` (the compiled
    CPU kernels, the default on CPU) or ``"scan"`` (the torch scans, as on CUDA or under
    ``torch.func``/``torch.compile``). Session-scoped, so hypothesis tests may take it."""
    return _engine
