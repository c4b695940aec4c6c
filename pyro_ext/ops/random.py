"""
Random state that a side computation leaves as it found it.

``pyro.util.get_rng_state`` / ``set_rng_state`` cover Python's, NumPy's and torch's CPU
generators but not the CUDA generators, so on a GPU a model run only to read its structure
would still shift the draws that follow. :func:`rng_preserved` restores all of them.
"""

import contextlib

import pyro
import torch


@contextlib.contextmanager
def rng_preserved():
    """
    Run the body, then put back the random state it consumed: Python's, NumPy's and torch's
    CPU generators (as :func:`pyro.util.set_rng_state`) and every initialised CUDA device's
    generator (a model without tensor arguments can still draw on CUDA).
    """
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    state = pyro.util.get_rng_state()
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        pyro.util.set_rng_state(state)
