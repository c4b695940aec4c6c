"""
The compiled Kalman filter and RTS smoother (:mod:`pyro_ext.timeseries._kalman_kernels`, the
CPU default for calls without gradients) against the per-step scan; the log-likelihood's
gradient from the kernels' score (Fisher's identity) against autograd through the scan; and
the cases that go back to the scans: a covariance that is not positive definite, a singular
observation covariance under a gradient, long static models with many states.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pyro_ext.timeseries import (
    StateSpaceMatrices,
    _sequential,
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


def _models(lengths, max_states):
    """Hypothesis strategies of :func:`_model`'s arguments."""
    return dict(
        seed=st.integers(0, 10**6),
        T=st.sampled_from(lengths),
        S=st.integers(1, max_states),
        p=st.integers(1, 3),
        time_varying=st.booleans(),
        batch=st.sampled_from([(), (3,), (2, 2)]),
        missing=st.lists(st.integers(0, 10**4), max_size=6),
    )


@settings(max_examples=30, deadline=None)
@given(**_models([1, 2, 9, 120], 5))
def test_compiled_filter_and_smoother_equal_the_scan(seed, T, S, p, time_varying, batch, missing):
    y, matrices = _model(seed, T, S, p, time_varying, batch, missing)
    # On explosive dynamics the parallel scan, the reference here, itself loses digits
    # (seed 7630, T = 120, S = 3, spectral radius 1.09: 1e-8 relative off a long-double
    # textbook filter, where the kernels are within 3e-10); the kernels are checked there
    # against that filter instead (test_the_kernels_equal_a_long_double_filter_when_explosive).
    assume(bool(torch.linalg.eigvals(matrices.transition_matrix).abs().max() < 1))
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


def _per_step_scan_log_likelihood(y, matrices):
    """The reference: the per-step associative scan, differentiated by autograd."""
    args = kalman_module._validate(y, matrices)
    return kalman_module._run_filter(kalman_module._build(args))[0]


def _gradients(fn, y, matrices, weights):
    inputs = [x.detach().clone().requires_grad_() for x in (y, *matrices)]
    value = fn(inputs[0], StateSpaceMatrices(*inputs[1:]))
    grads = torch.autograd.grad((value * weights).sum(), inputs)
    # W, V and P0 enter only through their symmetric part: compare that.
    return value, [g + g.mT if k in (3, 4, 6) else g for k, g in enumerate(grads)]


@settings(max_examples=25, deadline=None)
@given(**_models([1, 2, 9, 60], 4))
def test_the_kernels_score_is_the_gradient(seed, T, S, p, time_varying, batch, missing):
    # A gradient wanted: the kernels' filter and smoother give it by Fisher's identity
    # (_score_terms). Against autograd through the per-step scan, for y and all six
    # matrices, with missing rows and single coordinates, batches and time-varying ones.
    y, matrices = _model(seed, T, S, p, time_varying, batch, missing)
    args = kalman_module._validate(y, matrices)
    assert kalman_module._score_terms(args) is not None  # the kernels ran
    weights = torch.rand(batch, generator=torch.Generator().manual_seed(seed), dtype=D) + 0.5
    ours, ours_grads = _gradients(kalman_log_likelihood, y, matrices, weights)
    assert ours.grad_fn.name() == "_ScoredLogLikelihoodBackward"
    reference, reference_grads = _gradients(_per_step_scan_log_likelihood, y, matrices, weights)
    torch.testing.assert_close(ours, reference, rtol=1e-9, atol=1e-9)
    for a, b in zip(ours_grads, reference_grads):
        torch.testing.assert_close(torch.nan_to_num(a), torch.nan_to_num(b), rtol=1e-7, atol=1e-8)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    T=st.sampled_from([1, 2, 9, 400]),
    S=st.integers(1, 4),
    K=st.integers(1, 3),
    missing=st.lists(st.integers(0, 10**4), max_size=6),
)
def test_the_forward_mode_filter_is_the_score_along_its_directions(seed, T, S, K, missing):
    # fit_dlm's one-pass kernel (tangent_filter: one series, scalar observations, static
    # matrices) against the score by Fisher's identity: its log-likelihood, and its
    # derivatives along K directions that move W's diagonal and V, equal the filter's value
    # and the score's gradient contracted with them. T = 400 reaches the steady state.
    y, matrices = _model(seed, T, S, 1, False, (), missing)
    arrays = kalman_module._sequential_inputs(kalman_module._validate(y, matrices))
    run = kalman_module._KernelRun(arrays)
    assert run.score()
    rng = np.random.default_rng(seed)
    dW, dV = rng.normal(size=(K, S)), rng.normal(size=K)
    expected = dW @ run.grads[3][0, 0].diagonal() + dV * run.grads[4][0, 0, 0, 0]
    y_, G, F, W, V, m0, P0 = arrays
    out = np.empty(K + 2)
    kernels = _sequential.kernels("_kalman_kernels")
    ran = kernels.tangent_filter(
        y_[0, :, 0], G[0, 0], F[0, 0, 0], W[0, 0], V[0, 0, 0, 0], m0[0], P0[0], dW, dV, out
    )
    assert ran < 0
    assert out[0] == pytest.approx(run.ll[0], rel=1e-10, abs=1e-10)
    scale = 1.0 + np.abs(expected).max()
    np.testing.assert_allclose(out[1 : K + 1], expected, rtol=1e-7, atol=1e-9 * scale)


def test_the_score_reduces_to_broadcast_and_static_inputs():
    # y batched (2, 3); G static and unbatched, F and W batched (3,), V time-varying with a
    # singleton batch dim, init_mean unbatched: each gradient summed back to its shape.
    y, matrices = _model(5, 25, 3, 2, False, (3,), [4, 9, 30])
    y = torch.stack([y, y + 0.3])
    G, F, W, V, m0, P0 = matrices
    matrices = StateSpaceMatrices(G[0], F, W, V[None, :, None].expand(1, 3, 25, 2, 2), m0[0], P0)
    weights = torch.arange(1.0, 7.0, dtype=D).reshape(2, 3)
    ours, ours_grads = _gradients(kalman_log_likelihood, y, matrices, weights)
    assert ours.grad_fn.name() == "_ScoredLogLikelihoodBackward"
    reference, reference_grads = _gradients(_per_step_scan_log_likelihood, y, matrices, weights)
    for a, b, x in zip(ours_grads, reference_grads, (y, *matrices)):
        assert a.shape == x.shape
        torch.testing.assert_close(torch.nan_to_num(a), torch.nan_to_num(b), rtol=1e-8, atol=1e-8)


def test_the_score_matches_finite_differences_and_has_second_derivatives():
    y, matrices = _model(2, 40, 2, 1, False, (), [5, 6])

    def log_likelihood(x):
        return kalman_log_likelihood(
            y,
            matrices._replace(
                transition_cov=torch.diag(x[:2].exp()), observation_cov=x[2:].exp().reshape(1, 1)
            ),
        )

    x = torch.tensor([0.1, -0.5, 0.3], dtype=D, requires_grad=True)
    assert log_likelihood(x).grad_fn.name() == "_ScoredLogLikelihoodBackward"
    assert torch.autograd.gradcheck(log_likelihood, (x,))
    # create_graph=True differentiates the scans on the same inputs.
    assert torch.autograd.gradgradcheck(log_likelihood, (x,))


def test_a_singular_observation_covariance_goes_to_the_scans():
    # V = 0 with F of full rank: the filter runs (the innovation covariance is F P F^T), but
    # the score needs V^-1; the scans then give the gradient.
    y, matrices = _model(4, 12, 2, 1, False, (), [])
    matrices = matrices._replace(observation_cov=torch.zeros_like(matrices.observation_cov))
    args = kalman_module._validate(y, matrices)
    assert kalman_module._sequential_filter(args) is not None
    assert kalman_module._score_terms(args) is None
    weights = torch.ones(())
    ours, ours_grads = _gradients(kalman_log_likelihood, y, matrices, weights)
    assert ours.grad_fn.name() != "_ScoredLogLikelihoodBackward"
    _, reference_grads = _gradients(_per_step_scan_log_likelihood, y, matrices, weights)
    for a, b in zip(ours_grads, reference_grads):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-8)


def test_long_static_models_with_many_states_keep_the_blocked_scan():
    # Where the kernels' T S^3 work exceeds the blocked scan's (the measured break-even,
    # _SCORE_WORK_LIMIT), a static model's gradient stays with the blocked scan; a
    # time-varying one takes the score at any size.
    y, matrices = _model(6, 600, 20, 1, False, (), [])
    leaf = matrices.transition_cov.clone().requires_grad_()
    ll = kalman_log_likelihood(y, matrices._replace(transition_cov=leaf))
    assert ll.grad_fn.name() != "_ScoredLogLikelihoodBackward"
    y, matrices = _model(6, 600, 20, 1, True, (), [])
    leaf = matrices.transition_cov.clone().requires_grad_()
    ll = kalman_log_likelihood(y, matrices._replace(transition_cov=leaf))
    assert ll.grad_fn.name() == "_ScoredLogLikelihoodBackward"


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


def _steady_steps(args):
    """Run the kernels' filter on validated ``args``: ``(ll, steady steps)`` per series."""
    arrays = kalman_module._sequential_inputs(args)
    size, S = arrays[0].shape[0], arrays[5].shape[-1]
    ll, steady = np.empty(size), np.empty(size, dtype=np.int64)
    outputs = [np.empty((size, 0) + core) for core in ((S,), (S, S), (S,), (S, S))]
    assert _sequential.kernels("_kalman_kernels").filter(*arrays, ll, steady, *outputs) < 0
    return ll, steady


@pytest.mark.parametrize("p", [1, 2])
def test_the_steady_state_switch_equals_the_full_recursion(p):
    # A static model converges within a few dozen steps; the kernels' filter then updates
    # the mean only. Missing stretches (a whole row, a single coordinate) leave the steady state and
    # it is found again. Against the per-step scan, which never switches, for the
    # log-likelihood and every moment; the switch must really have happened.
    T = 600
    y, matrices = _model(11, T, 4, p, False, (2,), [])
    y[0, 200:205] = math.nan
    y[1, 300, 0] = math.nan
    args = kalman_module._validate(y, matrices)
    ll, steady = _steady_steps(args)
    assert (steady > T - 200).all() and (steady < T - 5).all()
    ours = kalman_module._sequential_filter(args)
    scan = kalman_module._run_filter(kalman_module._build(args))
    for a, b in zip(ours, scan):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(torch.from_numpy(ll), scan[0], rtol=1e-12, atol=1e-9)
    # The smoother copies the gain across the steady stretch rather than factorising again.
    _, ms, Ps, gains = kalman_module._sequential_smoother(args)
    expected = kalman_module._run_smoother(kalman_module._build(args), *scan[1:], gains=True)
    for a, b in zip((ms, Ps, gains), expected):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-8)
    # Time-varying matrices never switch.
    y, matrices = _model(11, T, 4, p, True, (2,), [])
    assert (_steady_steps(kalman_module._validate(y, matrices))[1] == 0).all()


def _long_double_filter(y, matrices):
    """The textbook covariance-form filter in numpy's long double, one observed coordinate:
    ``(log-likelihood, filtered means (T, S), filtered covariances (T, S, S))``."""
    G, F, W, V, m0, P0 = (x.numpy().astype(np.longdouble) for x in matrices)
    ys = y.numpy().astype(np.longdouble)
    total, means, covs = np.longdouble(0), [], []
    mp, Pp = m0, P0
    for t in range(ys.shape[0]):
        s = (F @ Pp @ F.T + V)[0, 0]
        gain = Pp @ F.T / s
        e = ys[t] - F @ mp
        total += -0.5 * (e[0] ** 2 / s + np.log(s) + np.log(2 * np.pi))
        m = mp + gain @ e
        P = Pp - gain @ (F @ Pp)
        P = (P + P.T) / 2
        means.append(m)
        covs.append(P)
        mp, Pp = G @ m, G @ P @ G.T + W
    return total, np.array(means), np.array(covs)


@pytest.mark.parametrize("seed", [7630, 1, 2])
def test_the_kernels_equal_a_long_double_filter_when_explosive(seed):
    # Transition matrices scaled to a spectral radius of 1.15: the covariance of a poorly
    # observed growing mode reaches about 4e6 over 120 steps. Relative to that scale, the
    # kernels stay within float64 round-off amplified by the growth (measured up to 4e-10).
    y, matrices = _model(seed, 120, 3, 1, False, (), [])
    G = matrices.transition_matrix
    matrices = matrices._replace(transition_matrix=G * 1.15 / torch.linalg.eigvals(G).abs().max())
    ll, means, covs, _, _ = kalman_module._sequential_filter(kalman_module._validate(y, matrices))
    ref_ll, ref_means, ref_covs = _long_double_filter(y, matrices)
    assert abs(float(ll) - float(ref_ll)) <= 1e-8 * max(1.0, abs(float(ref_ll)))
    assert np.abs(means.numpy() - ref_means).max() <= 1e-8 * np.abs(ref_means).max()
    assert np.abs(covs.numpy() - ref_covs).max() <= 1e-8 * np.abs(ref_covs).max()


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    T=st.sampled_from([2, 9, 60]),
    S=st.integers(1, 4),
    missing=st.lists(st.integers(0, 10**4), max_size=6),
)
def test_the_em_statistics_kernel_is_the_torch_m_step(seed, T, S, missing):
    # fit_dlm's EM on the kernels (em_statistics: one series, scalar observations, static G
    # and F) against the torch M-step (_em_step) on the same smoothed moments, gaps
    # included: the disturbances' second moments summed per state, and the observations'.
    from pyro_ext.timeseries.dlm_fit import _em_step, _Patterns

    y, matrices = _model(seed, T, S, 1, False, (), missing)
    arrays = kalman_module._sequential_inputs(kalman_module._validate(y, matrices))
    run = kalman_module._KernelRun(arrays)
    assert run.smoother()
    means, covs, gains = (x[0] for x in run.smoothed)
    state_totals = np.empty(S)
    kernels = _sequential.kernels("_kalman_kernels")
    observation_total, observed = kernels.em_statistics(
        arrays[0][0, :, 0], arrays[1][0, 0], arrays[2][0, 0, 0], means, covs, gains, state_totals
    )
    present = ~torch.isnan(y[:, 0])
    assert observed == int(present.sum())
    moments = kalman_module.smoothed_second_moments(y, matrices)
    G, F = matrices.transition_matrix, matrices.observation_matrix
    eye, zeros = torch.eye(S, dtype=D), torch.zeros(S, dtype=D)
    # One scale per state (its total over the T - 1 transitions), then one for y alone.
    per_state = _Patterns(eye, zeros, torch.ones(S, dtype=D), zeros)
    squared, _ = _em_step(y[:, 0], moments, per_state, G, F, present)
    np.testing.assert_allclose(state_totals, squared.numpy() * (T - 1), rtol=1e-10, atol=1e-10)
    if observed:
        one = torch.ones(1, dtype=D)
        on_y = _Patterns(torch.zeros(1, S, dtype=D), one, torch.zeros(1, dtype=D), one)
        squared, _ = _em_step(y[:, 0], moments, on_y, G, F, present)
        assert observation_total == pytest.approx(float(squared) * observed, rel=1e-10)
