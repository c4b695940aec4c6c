"""
The compiled Kalman filter and RTS smoother (:mod:`pyro_ext.timeseries._kalman_kernels`, the
CPU default for calls without gradients) against the per-step scan, and the cases that go
back to the scans: a gradient wanted, a covariance that is not positive definite.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyro_ext.timeseries import (
    StateSpaceMatrices,
    kalman_filter,
    kalman_log_likelihood,
    kalman_smoother,
    sequential_kernels,
)
from pyro_ext.timeseries import kalman as kalman_module

D = torch.float64


def _model(seed, T, S, p, time_varying, batch, missing, dtype=D):
    g = torch.Generator().manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, generator=g, dtype=D)

    steps = (T,) if time_varying else ()
    G = 0.7 * rn(*batch, *steps, S, S) / S**0.5 + 0.5 * torch.eye(S, dtype=D)
    F = rn(*batch, *steps, p, S)
    A = rn(*batch, *steps, S, S)
    W = A @ A.mT + 0.05 * torch.eye(S, dtype=D)
    B = rn(*batch, *steps, p, p)
    V = B @ B.mT + 0.1 * torch.eye(p, dtype=D)
    m0, C = rn(*batch, S), rn(*batch, S, S)
    P0 = C @ C.mT + 0.1 * torch.eye(S, dtype=D)
    y = rn(*batch, T, p)
    for k in missing:  # rows and single coordinates missing
        y.view(*batch, -1)[..., k % (T * p)] = math.nan
    args = [x.to(dtype) for x in (y, G, F, W, V, m0, P0)]
    return args[0], StateSpaceMatrices(*args[1:])


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    T=st.sampled_from([1, 2, 9, 120]),
    S=st.integers(1, 5),
    p=st.integers(1, 3),
    time_varying=st.booleans(),
    batch=st.sampled_from([(), (3,), (2, 2)]),
    missing=st.lists(st.integers(0, 10**4), max_size=6),
)
def test_compiled_filter_and_smoother_equal_the_scan(seed, T, S, p, time_varying, batch, missing):
    y, matrices = _model(seed, T, S, p, time_varying, batch, missing)
    args = kalman_module._validate(y, matrices)
    ours = kalman_module._sequential_filter(args)
    assert ours is not None  # the kernels ran: every covariance here is positive definite
    ssm = kalman_module._build(args)
    scan = kalman_module._run_filter(ssm)
    for a, b in zip(ours, scan):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    ll, ms, Ps, gains = kalman_module._sequential_smoother(args)
    expected = kalman_module._run_smoother(ssm, *scan[1:], gains=True)
    for a, b in zip((ms, Ps, gains), expected):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-8)
    # The public functions take the kernels by default and agree with the scans' results
    # (the log-likelihood with the per-step scan's: the blocked one, which the scans' engine
    # uses for static matrices, loses digits to its blocks' conditioning, up to ~1e-5
    # relative on some of these models).
    with sequential_kernels(False):
        reference = kalman_smoother(y, matrices)
    torch.testing.assert_close(kalman_smoother(y, matrices), reference, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(kalman_log_likelihood(y, matrices), scan[0], rtol=1e-9, atol=1e-9)


def test_float32_in_float32_out():
    y, matrices = _model(1, 300, 4, 2, False, (), [5, 17], dtype=torch.float32)
    ours = kalman_filter(y, matrices)
    y64, matrices64 = _model(1, 300, 4, 2, False, (), [5, 17])
    exact = kalman_filter(y64, matrices64)
    assert all(x.dtype == torch.float32 for x in ours)
    for a, b in zip(ours, exact):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-4)


def test_a_wanted_gradient_goes_to_the_scans():
    y, matrices = _model(2, 30, 3, 1, False, (), [])
    scale = torch.tensor(1.5, dtype=D, requires_grad=True)
    matrices = matrices._replace(transition_cov=matrices.transition_cov * scale)
    ll = kalman_log_likelihood(y, matrices)
    (grad,) = torch.autograd.grad(ll, scale)
    with torch.no_grad():
        eps = 1e-6
        up = kalman_log_likelihood(
            y, matrices._replace(transition_cov=matrices.transition_cov * (1 + eps / 1.5))
        )
        down = kalman_log_likelihood(
            y, matrices._replace(transition_cov=matrices.transition_cov * (1 - eps / 1.5))
        )
    assert abs(float(grad) - float(up - down) / (2 * eps)) < 1e-5 * max(1.0, abs(float(grad)))


def test_a_covariance_not_positive_definite_goes_to_the_scans():
    # F = 0 and V = 0: the innovation covariance is 0. The kernels stop at the first such
    # step; the scans then name it (validation on), as before.
    y, matrices = _model(3, 5, 2, 1, False, (), [])
    matrices = matrices._replace(
        observation_matrix=torch.zeros_like(matrices.observation_matrix),
        observation_cov=torch.zeros_like(matrices.observation_cov),
    )
    args = kalman_module._validate(y, matrices)
    assert kalman_module._sequential_filter(args) is None
    with pytest.raises(ValueError, match="observation_cov"):
        kalman_filter(y, matrices)
