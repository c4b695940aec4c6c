"""``pyro_ext.ops.random.rng_preserved``: a side computation leaves every generator as found."""

import random

import numpy as np
import pyro
import pytest
import torch

from pyro_ext.ops import rng_preserved


def _draws(device):
    return (
        torch.randn(3, device=device).tolist(),
        torch.randn(2).tolist(),
        random.random(),
        float(np.random.rand()),
    )


def test_the_draws_after_are_those_without_the_body(device):
    torch.zeros((), device=device)  # a CUDA generator exists once CUDA is initialised
    pyro.set_rng_seed(5)
    expected = _draws(device)
    pyro.set_rng_seed(5)
    with rng_preserved():
        inside = _draws(device)
    assert inside == expected  # the body drew from the same state
    assert _draws(device) == expected  # and left it as it found it


def test_the_state_is_restored_when_the_body_raises(device):
    torch.zeros((), device=device)
    pyro.set_rng_seed(6)
    expected = _draws(device)
    pyro.set_rng_seed(6)
    with pytest.raises(RuntimeError, match="inside"):
        with rng_preserved():
            _draws(device)
            raise RuntimeError("inside")
    assert _draws(device) == expected


def test_torch_only_mode_restores_torch_and_leaves_python_alone(device):
    torch.zeros((), device=device)
    pyro.set_rng_seed(7)
    expected = _draws(device)[:2]
    pyro.set_rng_seed(7)
    before = random.getstate()
    with rng_preserved(python_and_numpy=False):
        _draws(device)
    assert _draws(device)[:2] == expected  # torch's generators put back
    assert random.getstate() != before  # Python's advanced, as the body left it
