"""Kalman filter/smoother/sampler/forecast against dense Gaussian conditioning of the joint."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyro_ext.timeseries import kalman as kalman_module
from pyro_ext.timeseries.kalman import (
    StateSpaceMatrices,
    forecast_interval,
    kalman_filter,
    kalman_forecast,
    kalman_log_likelihood,
    kalman_sample,
    kalman_smoother,
    kalman_whiten,
)

D = torch.float64


def random_model(seed, T, S, p, time_varying, singular_w, batch=()):
    g = torch.Generator().manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, generator=g, dtype=D)

    tshape = (T,) if time_varying else ()
    G = 0.7 * rn(*batch, *tshape, S, S)
    F = rn(*batch, *tshape, p, S)
    A = rn(*batch, *tshape, S, S)
    W = A @ A.mT
    if singular_w and S > 1:  # zero noise on the last state, as in dummy seasonals
        W[..., -1, :] = 0
        W[..., :, -1] = 0
    B = rn(*batch, *tshape, p, p)
    V = B @ B.mT + 0.1 * torch.eye(p, dtype=D)
    m0 = rn(*batch, S)
    C = rn(*batch, S, S)
    P0 = C @ C.mT + 0.1 * torch.eye(S, dtype=D)
    y = rn(*batch, T, p)
    return y, G, F, W, V, m0, P0


def split(args):
    """``(y, StateSpaceMatrices)`` of a tuple ``(y, G, F, W, V, m0, P0)``."""
    return args[0], StateSpaceMatrices(*args[1:])


def dense_joint(y, G, F, W, V, m0, P0):
    """Mean/cov of x_{1:T} and y_{1:T} built explicitly (one unbatched series)."""
    T, p = y.shape
    S = m0.shape[-1]
    G, F, W, V = [x.expand(T, *x.shape[-2:]) for x in (G, F, W, V)]
    mean = [m0]
    for t in range(1, T):
        mean.append(G[t] @ mean[-1])
    mean = torch.cat(mean)
    Phi = torch.zeros(T * S, T * S, dtype=D)
    for t in range(T):
        M = torch.eye(S, dtype=D)
        for k in range(t, -1, -1):
            Phi[t * S : (t + 1) * S, k * S : (k + 1) * S] = M
            M = M @ G[k]
    Cx = Phi @ torch.block_diag(P0, *W[1:]) @ Phi.T
    Fb = torch.block_diag(*F)
    Cy = Fb @ Cx @ Fb.T + torch.block_diag(*V)
    return mean, Cx, Fb @ mean, Cy, Cx @ Fb.T, y.reshape(-1)


def condition(joint, idx):
    mean, Cx, my, Cy, Cxy, yv = joint
    if not idx:
        return mean, Cx, torch.zeros((), dtype=D)
    idx = torch.tensor(idx)
    Cyy = Cy[idx][:, idx]
    K = torch.linalg.solve(Cyy, Cxy[:, idx].T).T
    ll = torch.distributions.MultivariateNormal(my[idx], Cyy).log_prob(yv[idx])
    return mean + K @ (yv[idx] - my[idx]), Cx - K @ Cxy[:, idx].T, ll


def block(x, t, S):
    return x[t * S : (t + 1) * S] if x.dim() == 1 else x[t * S : (t + 1) * S, t * S : (t + 1) * S]


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    T=st.integers(1, 5),
    S=st.integers(1, 3),
    p=st.integers(1, 2),
    time_varying=st.booleans(),
    singular_w=st.booleans(),
    batch=st.sampled_from([(), (2,)]),
    missing=st.lists(st.integers(0, 9), max_size=4),
)
@pytest.mark.parametrize("engine", ["sequential", "scan"])
def test_filter_smoother_match_dense_conditioning(
    run_on, engine, seed, T, S, p, time_varying, singular_w, batch, missing
):
    y, G, F, W, V, m0, P0 = random_model(seed, T, S, p, time_varying, singular_w, batch)
    for k in missing:  # entries of y (rows and single coordinates) set missing
        y.view(*batch, -1)[..., k % (T * p)] = math.nan
    matrices = StateSpaceMatrices(G, F, W, V, m0, P0)
    with run_on(engine):
        filt = kalman_filter(y, matrices)
        smooth = kalman_smoother(y, matrices)
    for b in range(batch[0] if batch else 1):
        ix = (b,) if batch else ()
        args = [x[ix] for x in (y, G, F, W, V, m0, P0)]
        joint = dense_joint(*args)
        obs = [i for i in range(T * p) if not math.isnan(joint[-1][i])]
        ms, Ps, ll = condition(joint, obs)
        assert torch.allclose(filt.log_likelihood[ix], ll, atol=1e-8)
        assert torch.allclose(smooth.log_likelihood[ix], ll, atol=1e-8)
        assert torch.allclose(smooth.smoothed_means[ix].reshape(-1), ms, atol=1e-7)
        for t in range(T):
            assert torch.allclose(smooth.smoothed_covs[ix][t], block(Ps, t, S), atol=1e-7)
            mf, Pf, _ = condition(joint, [i for i in obs if i < (t + 1) * p])
            mp, Pp, _ = condition(joint, [i for i in obs if i < t * p])
            assert torch.allclose(filt.filtered_means[ix][t], block(mf, t, S), atol=1e-7)
            assert torch.allclose(filt.filtered_covs[ix][t], block(Pf, t, S), atol=1e-7)
            assert torch.allclose(filt.predicted_means[ix][t], block(mp, t, S), atol=1e-7)
            assert torch.allclose(filt.predicted_covs[ix][t], block(Pp, t, S), atol=1e-7)


def test_simulation_smoother_moments():
    y, G, F, W, V, m0, P0 = random_model(3, 4, 2, 1, True, True)
    y[2] = math.nan
    n = 20000
    matrices = StateSpaceMatrices(G, F, W, V, m0, P0)
    xs = kalman_sample(y, matrices, num_samples=n)
    assert xs.shape == (n, 4, 2)
    sm = kalman_smoother(y, matrices)
    sd = sm.smoothed_covs.diagonal(dim1=-2, dim2=-1).sqrt()
    # Standard error of a mean is sd / sqrt(n); 5 standard errors bounds all 8 entries.
    assert ((xs.mean(0) - sm.smoothed_means).abs() <= 5 * sd / n**0.5).all()
    # Joint (cross-time) covariance against the dense posterior; sample-cov error ~ var*sqrt(2/n).
    joint = dense_joint(y, G, F, W, V, m0, P0)
    _, Ps, _ = condition(joint, [0, 1, 3])
    emp = torch.cov(xs.reshape(n, -1).T)
    scale = Ps.diagonal().sqrt()
    assert ((emp - Ps).abs() <= 6 * (2 / n) ** 0.5 * scale[:, None] * scale).all()


def test_forecast_equals_filtering_with_missing_future():
    T, h = 4, 3
    y, G, F, W, V, m0, P0 = random_model(5, T, 3, 2, False, True)
    matrices = StateSpaceMatrices(G, F, W, V, m0, P0)
    res = kalman_filter(y, matrices)
    fc = kalman_forecast(res, h, matrices)
    # Closed form: with y_{T+1..T+h} missing, predicted moments are the forecast.
    y_ext = torch.cat([y, torch.full((h, 2), math.nan, dtype=D)])
    ext = kalman_filter(y_ext, matrices)
    assert torch.allclose(fc.state_means, ext.predicted_means[T:], atol=1e-10)
    assert torch.allclose(fc.state_covs, ext.predicted_covs[T:], atol=1e-10)
    assert torch.allclose(fc.observation_means, (F @ ext.predicted_means[T:, :, None])[..., 0])
    assert torch.allclose(fc.observation_covs, F @ ext.predicted_covs[T:] @ F.T + V)
    lo, hi = forecast_interval(fc.observation_means, fc.observation_covs, level=0.9)
    half = 1.6448536269514722 * fc.observation_covs.diagonal(dim1=-2, dim2=-1).sqrt()
    assert torch.allclose(hi - fc.observation_means, half)
    assert torch.allclose(fc.observation_means - lo, half)


def llt_seasonal(sig2, S=13):
    s2irr, s2lvl, s2tr, s2seas = sig2
    G = torch.zeros(S, S, dtype=D)
    G[0, 0] = G[0, 1] = G[1, 1] = 1
    G[2, 2:] = -1
    G[3:, 2:-1] = torch.eye(S - 3, dtype=D)
    F = torch.zeros(1, S, dtype=D)
    F[0, 0] = F[0, 2] = 1
    W = torch.diag(torch.cat([s2lvl[None], s2tr[None], s2seas[None], torch.zeros(S - 3, dtype=D)]))
    return G, F, W, s2irr.reshape(1, 1)


@pytest.mark.parametrize("T", [200, 500])
def test_statsmodels_unobserved_components_loglike(T):
    sm = pytest.importorskip("statsmodels.api")
    import numpy as np

    rng = np.random.default_rng(0)
    y = np.cumsum(rng.normal(size=T)) + 3 * np.sin(np.arange(T) * 2 * np.pi / 12)
    y[[17, 18, 90]] = np.nan
    params = np.array([1.0, 0.5, 0.1, 0.2])
    mod = sm.tsa.UnobservedComponents(y, level="local linear trend", seasonal=12)
    m0, P0 = np.linspace(-1, 1, 13), 4.0 * np.eye(13)
    mod.ssm.initialize_known(m0, P0)  # known prior on x_1, as in our model
    mod.loglikelihood_burn = 0
    expected = mod.loglike(params)
    G, F, W, V = llt_seasonal(torch.tensor(params))
    args = (torch.tensor(y)[:, None], G, F, W, V, torch.tensor(m0), torch.tensor(P0))
    ll = kalman_filter(*split(args))
    assert ll.log_likelihood.item() == pytest.approx(expected, abs=1e-8)
    for block_size in [None, 7, 32, 128]:  # missing values inside blocks, partial last block
        ll = kalman_log_likelihood(*split(args), block_size=block_size)
        assert ll.item() == pytest.approx(expected, abs=1e-8)


def test_gradient_matches_finite_differences():
    y, G, F, _, _, m0, P0 = random_model(1, 6, 2, 1, False, False)
    y[3] = math.nan

    def ll(log_var):
        W = torch.diag(log_var[:2].exp())
        V = log_var[2:].exp().reshape(1, 1)
        return kalman_filter(y, StateSpaceMatrices(G, F, W, V, m0, P0)).log_likelihood

    x = torch.tensor([-1.0, 0.5, -0.3], dtype=D, requires_grad=True)
    assert torch.autograd.gradcheck(ll, (x,))
    # Smoother moments and samples are differentiable too.
    W = torch.eye(2, dtype=D).requires_grad_()
    matrices = StateSpaceMatrices(G, F, W, torch.eye(1, dtype=D), m0, P0)
    kalman_smoother(y, matrices).smoothed_means.sum().backward()
    assert W.grad is not None and torch.isfinite(W.grad).all()


def test_float32_and_device(device):
    y, G, F, W, V, m0, P0 = [x.float().to(device) for x in random_model(2, 30, 3, 1, False, True)]
    res = kalman_smoother(y, StateSpaceMatrices(G, F, W, V, m0, P0))
    assert res.smoothed_means.dtype == torch.float32 and res.smoothed_means.device == y.device
    ref = kalman_smoother(*split([x.double().cpu() for x in (y, G, F, W, V, m0, P0)]))
    assert torch.allclose(res.log_likelihood.double().cpu(), ref.log_likelihood, rtol=1e-4)


def test_batched_parameters_broadcast_over_series():
    y, G, F, W, V, m0, P0 = random_model(4, 5, 2, 1, False, False)
    scales = torch.tensor([0.5, 1.0, 2.0], dtype=D)
    Vb = scales[:, None, None] * V
    yb = y.expand(3, 5, 1)
    ll = kalman_filter(yb, StateSpaceMatrices(G, F, W, Vb, m0, P0)).log_likelihood
    for k in range(3):
        expected = kalman_filter(y, StateSpaceMatrices(G, F, W, Vb[k], m0, P0)).log_likelihood
        assert torch.allclose(ll[k], expected)


@pytest.mark.parametrize(
    "index, value, match",
    [
        (0, torch.zeros(0, 1, dtype=D), "empty series"),
        (0, torch.zeros(5, dtype=D), "y must have shape"),
        (1, torch.eye(3, dtype=D), "transition_matrix"),
        (1, torch.eye(2, dtype=D).expand(4, 2, 2), "transition_matrix has a time axis"),
        (2, torch.ones(2, 2, dtype=D), "observation_matrix"),
        (3, -torch.eye(2, dtype=D), "transition_cov has negative"),
        (3, torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=D), "transition_cov is not positive"),
        (3, torch.tensor([[1.0, 0.5], [0.0, 1.0]], dtype=D), "transition_cov must be symmetric"),
        (4, -torch.eye(1, dtype=D), "observation_cov has negative"),
        (4, torch.eye(2, dtype=D), "observation_cov"),
        (5, torch.zeros(3, dtype=D), "transition_matrix"),
        (6, torch.zeros(2, 3, dtype=D), "init_cov"),
        (6, torch.diag(torch.tensor([1.0, -1.0], dtype=D)), "init_cov has negative"),
    ],
)
@pytest.mark.parametrize("fn", [kalman_filter, kalman_log_likelihood])
def test_errors_name_the_argument(fn, index, value, match):
    args = list(random_model(0, 5, 2, 1, False, False))
    args[index] = value
    with pytest.raises(ValueError, match=match):
        fn(*split(args))


# Every public function takes the model as one StateSpaceMatrices: the call for each, with
# ``y`` and the matrices of ``random_model(0, 5, 2, 1, False, False)`` (5 steps, S = 2, p = 1).
MATRIX_CALLS = {
    "kalman_filter": lambda y, m: kalman_filter(y, m),
    "kalman_log_likelihood": lambda y, m: kalman_log_likelihood(y, m, block_size=2),
    "kalman_smoother": lambda y, m: kalman_smoother(y, m),
    "kalman_sample": lambda y, m: kalman_sample(y, m, num_samples=2),
    "kalman_whiten": lambda y, m: kalman_whiten(y.unsqueeze(-1), m),
    "kalman_forecast": lambda y, m: kalman_forecast(
        kalman_filter(y, StateSpaceMatrices(*random_model(0, 5, 2, 1, False, False)[1:])), 3, m
    ),
}


@pytest.mark.parametrize("call", list(MATRIX_CALLS))
def test_matrices_of_the_wrong_type_raise_type_error(call):
    y, *loose = random_model(0, 5, 2, 1, False, False)
    MATRIX_CALLS[call](y, StateSpaceMatrices(*loose))  # the right type works
    for bad in [tuple(loose), list(loose), dict(zip(StateSpaceMatrices._fields, loose)), None]:
        with pytest.raises(TypeError, match="matrices must be a StateSpaceMatrices"):
            MATRIX_CALLS[call](y, bad)
    # The loose tensors of the former signatures no longer fit.
    with pytest.raises(TypeError):
        MATRIX_CALLS[call](y, loose[0])


@pytest.mark.parametrize(
    "field, value",
    [
        ("transition_matrix", torch.eye(3, dtype=D)),
        ("transition_matrix", torch.ones(2, 3, dtype=D)),
        ("observation_matrix", torch.ones(2, 2, dtype=D)),
        ("observation_matrix", torch.ones(1, 3, dtype=D)),
        ("transition_cov", torch.eye(3, dtype=D)),
        ("observation_cov", torch.eye(2, dtype=D)),
        ("init_mean", torch.zeros(2, 1, 2, dtype=D)),  # batch dims beyond y's
        ("init_cov", torch.eye(3, dtype=D)),
    ],
)
@pytest.mark.parametrize("call", list(MATRIX_CALLS))
def test_mismatched_field_shapes_raise_value_error_naming_the_field(call, field, value):
    y, *loose = random_model(0, 5, 2, 1, False, False)
    matrices = StateSpaceMatrices(*loose)._replace(**{field: value})
    if call == "kalman_whiten" and field == "init_mean":
        return  # kalman_whiten takes the initial mean to be 0 and does not read it
    if call == "kalman_forecast" and field.startswith("init"):
        return  # the last filtered moments take the place of the prior
    with pytest.raises(ValueError, match=field):
        MATRIX_CALLS[call](y, matrices)


@pytest.mark.parametrize("call", [c for c in MATRIX_CALLS if c != "kalman_forecast"])
@pytest.mark.parametrize("field", StateSpaceMatrices._fields)
def test_fields_that_are_not_tensors_raise_type_error_naming_the_field(call, field):
    y, *loose = random_model(0, 5, 2, 1, False, False)
    matrices = StateSpaceMatrices(*loose)._replace(**{field: [[1.0]]})
    if call == "kalman_whiten" and field == "init_mean":
        MATRIX_CALLS[call](y, matrices)  # not read
        return
    with pytest.raises(TypeError, match=f"{field} must be a torch.Tensor"):
        MATRIX_CALLS[call](y, matrices)


def test_degenerate_innovation_covariance_is_reported():
    y, G, F, W, V, m0, P0 = random_model(0, 5, 2, 1, False, False)
    with pytest.raises(ValueError, match="observation_cov"):
        kalman_filter(y, StateSpaceMatrices(G, torch.zeros_like(F), W, torch.zeros_like(V), m0, P0))
    matrices = StateSpaceMatrices(G, F, W, V, m0, P0)
    res = kalman_filter(y, matrices)
    with pytest.raises(ValueError, match="num_steps"):
        kalman_forecast(res, 0, matrices)
    with pytest.raises(ValueError, match="filter_result"):
        kalman_forecast((1, 2), 1, matrices)


# ---------------------------------------------------------------------------------------
# kalman_log_likelihood (blocked filter) against the per-step scan


def scan_log_likelihood(y, matrices):
    """The per-step parallel scan's log-likelihood (the path time-varying matrices take),
    which the blocked paths for static matrices must reproduce."""
    return kalman_module._run_filter(kalman_module.prepare_state_space(y, matrices))[0]


def stable(G):
    """Spectral norm at most 1: block powers G^B stay bounded (well-conditioned blocks)."""
    return G / torch.linalg.matrix_norm(G, 2).clamp(min=1.0)[..., None, None]


#: Models for the blocked paths against the scan: up to 40 steps (several blocks, a partial
#: last one), missing entries (single coordinates and whole steps), batches.
BLOCKED_CASES = dict(
    seed=st.integers(0, 10**6),
    T=st.integers(1, 40),
    S=st.integers(1, 4),
    p=st.integers(1, 2),
    singular_w=st.booleans(),
    batch=st.sampled_from([(), (2,), (2, 1)]),
    missing=st.lists(st.integers(0, 200), max_size=6),
)


@settings(max_examples=60, deadline=None)
@given(
    **BLOCKED_CASES,
    time_varying=st.booleans(),
    block_size=st.sampled_from([None, 1, 2, 3, 5, 8, 16, 64]),
)
def test_log_likelihood_matches_scan(
    seed, T, S, p, time_varying, singular_w, batch, missing, block_size
):
    y, G, F, W, V, m0, P0 = random_model(seed, T, S, p, time_varying, singular_w, batch)
    G = stable(G)
    for k in missing:  # entries of y (single coordinates, possibly whole steps) set missing
        y.view(*batch, -1)[..., k % (T * p)] = math.nan
    matrices = StateSpaceMatrices(G, F, W, V, m0, P0)
    expected = scan_log_likelihood(y, matrices)
    actual = kalman_log_likelihood(y, matrices, block_size=block_size)
    assert actual.shape == expected.shape
    assert torch.allclose(actual, expected, rtol=1e-10, atol=1e-8)


@pytest.mark.parametrize("block_size", [None, 4, 7])
def test_log_likelihood_broadcasts_batches(block_size):
    y, G, F, W, V, m0, P0 = random_model(6, 23, 3, 2, False, True)
    G = stable(G)
    y[[3, 9], 1] = math.nan
    scales = torch.tensor([0.5, 1.0, 2.0], dtype=D)[:, None, None]
    ys = torch.stack([y, y + 1, y.flip(0)])  # (3, T, p), different missing patterns
    cases = [  # (y, G, F, W, V, m0, P0) with batch dims on different arguments
        (y.expand(3, 23, 2), G, F, W, scales * V, m0, P0),
        (ys, G, F, W, V, m0, P0),
        (ys[:, None], G, F, scales * W, V, m0, P0),  # batch (3, 3)
        (y.expand(3, 23, 2), G, F, W, V, m0 + scales[..., 0], P0),
    ]
    for args in cases:
        expected = scan_log_likelihood(*split(args))
        actual = kalman_log_likelihood(*split(args), block_size=block_size)
        assert actual.shape == expected.shape
        assert torch.allclose(actual, expected, rtol=1e-10, atol=1e-8)


@pytest.mark.parametrize("missing", [False, True])
@pytest.mark.parametrize("block_size", [4, None])
def test_log_likelihood_gradients_match_scan(missing, block_size):
    y, G, F, W, V, m0, P0 = random_model(7, 18, 3, 2, False, True)
    G = stable(G)
    if missing:
        y[[2, 11], 0] = math.nan
        y[5] = math.nan
    grads = []
    for fn in (
        scan_log_likelihood,
        lambda y, m: kalman_log_likelihood(y, m, block_size=block_size),
    ):
        args = [x.clone().requires_grad_() for x in (G, F, W, V, m0, P0)]
        fn(y, StateSpaceMatrices(*args)).backward()
        grads.append([a.grad for a in args])
    for k, (g_scan, g_block) in enumerate(zip(*grads)):
        if k in (2, 3, 5):  # W, V, P0: only the symmetric part is defined (the two paths
            g_scan, g_block = g_scan + g_scan.mT, g_block + g_block.mT  # read other triangles)
        assert torch.allclose(g_block, g_scan, rtol=1e-8, atol=1e-8)


def test_log_likelihood_gradcheck_and_trend_seasonal_variances():
    y = torch.randn(30, 1, generator=torch.Generator().manual_seed(0), dtype=D).cumsum(0)
    y[[4, 17]] = math.nan
    m0, P0 = torch.zeros(13, dtype=D), 4.0 * torch.eye(13, dtype=D)

    def ll(log_var, fn):
        G, F, W, V = llt_seasonal(log_var.exp())
        return fn(y, StateSpaceMatrices(G, F, W, V, m0, P0))

    x = torch.tensor([0.0, -1.0, -2.0, -1.5], dtype=D, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: ll(v, kalman_log_likelihood), (x,))
    (g_block,) = torch.autograd.grad(
        ll(x, lambda y, m: kalman_log_likelihood(y, m, block_size=8)), x
    )
    (g_scan,) = torch.autograd.grad(ll(x, scan_log_likelihood), x)
    assert torch.allclose(g_block, g_scan, rtol=1e-9, atol=1e-9)


def test_log_likelihood_falls_back_when_block_noise_is_singular(run_on):
    # V = 0: the first observation of a block is noiseless given the block's first state,
    # so the block noise covariance is singular; the scan still works (F W F^T > 0).
    y, G, F, W, V, m0, P0 = random_model(8, 12, 2, 1, False, False)
    V = torch.zeros_like(V)
    matrices = StateSpaceMatrices(G, F, W, V, m0, P0)
    expected = scan_log_likelihood(y, matrices)
    with run_on("scan"):  # the blocked paths (the compiled kernels have no blocks)
        assert torch.allclose(kalman_log_likelihood(y, matrices, block_size=4), expected)
        # The blocked filter falls back the same way, to the same moments.
        filt = kalman_filter(y, matrices)
    assert torch.allclose(kalman_log_likelihood(y, matrices), expected)  # compiled kernels
    _, m, P, mp, Pp = kalman_module._run_filter(kalman_module.prepare_state_space(y, matrices))
    for actual, expected in zip(filt[1:], (m, P.movedim(0, -3), mp, Pp.movedim(0, -3))):
        assert torch.equal(actual, expected)


def test_log_likelihood_float32_and_device(device):
    T = 300
    g = torch.Generator().manual_seed(3)
    y = torch.randn(T, 1, generator=g, dtype=D).cumsum(0)
    y[[10, 200]] = math.nan
    G, F, W, V = llt_seasonal(torch.tensor([0.5, 0.1, 0.01, 0.05], dtype=D))
    args = (y, G, F, W, V, torch.zeros(13, dtype=D), 10 * torch.eye(13, dtype=D))
    ref = kalman_log_likelihood(*split(args))
    ll = kalman_log_likelihood(*split([x.float().to(device) for x in args]))
    assert ll.dtype == torch.float32 and ll.device == device
    assert torch.allclose(ll.double().cpu(), ref, rtol=1e-5)


@pytest.mark.parametrize("block_size", [0, -3, 2.5])
def test_log_likelihood_rejects_bad_block_size(block_size):
    args = random_model(0, 5, 2, 1, False, False)
    with pytest.raises(ValueError, match="block_size"):
        kalman_log_likelihood(*split(args), block_size=block_size)


# ---------------------------------------------------------------------------------------
# kalman_filter's blocked path (static matrices) against the per-step scan


@settings(max_examples=60, deadline=None)
@given(**BLOCKED_CASES, block_size=st.sampled_from([1, 2, 3, 5, 8, 16, 64]))
def test_blocked_filter_matches_scan(seed, T, S, p, singular_w, batch, missing, block_size):
    y, G, F, W, V, m0, P0 = random_model(seed, T, S, p, False, singular_w, batch)
    G = stable(G)
    for k in missing:  # single coordinates and whole steps missing, inside and across blocks
        y.view(*batch, -1)[..., k % (T * p)] = math.nan
    matrices = StateSpaceMatrices(G, F, W, V, m0, P0)
    args = kalman_module._validate(y, matrices)
    expected = kalman_module._run_filter(kalman_module._build(args))
    actual = kalman_module._blocked_filter(args, min(block_size, T))
    for name, a, e in zip(["log-likelihood", "m", "P", "m-", "P-"], actual, expected):
        assert a.shape == e.shape, name
        assert torch.allclose(a, e, rtol=1e-9, atol=1e-9), name


def test_filter_and_smoother_moments_match_scan_with_batches_and_gradients():
    # Batch dims on the series and on a matrix, a partial last block, missing values; the
    # moments' gradients agree with the scan's too.
    y, G, F, W, V, m0, P0 = random_model(9, 50, 3, 2, False, True)
    G = stable(G)
    y[[3, 20, 21, 49], 1] = math.nan
    y[30] = math.nan
    scales = torch.tensor([0.5, 2.0], dtype=D)[:, None, None]
    ys = torch.stack([y, y.flip(0)])
    results = []
    for blocked in (True, False):
        Wg = (scales * W).clone().requires_grad_()
        matrices = StateSpaceMatrices(G, F, Wg, V, m0, P0)
        if blocked:
            filt, smooth = kalman_filter(ys, matrices), kalman_smoother(ys, matrices)
        else:
            ssm = kalman_module.prepare_state_space(ys, matrices)
            ll, m, P, mp, Pp = kalman_module._run_filter(ssm)
            ms, Ps = kalman_module._run_smoother(ssm, m, P, mp, Pp, block_size=50)  # scan
            filt = (ll, m.movedim(0, -2), P.movedim(0, -3), mp.movedim(0, -2), Pp.movedim(0, -3))
            smooth = (ms.movedim(0, -2), Ps.movedim(0, -3))
        loss = filt[1].sum() + filt[2].sum() + smooth[0].pow(2).sum() + smooth[1].sum()
        (grad,) = torch.autograd.grad(loss, Wg)
        results.append((list(filt) + list(smooth[:2]), grad))
    (blocked, g_blocked), (scan, g_scan) = results
    assert blocked[1].shape == (2, 50, 3) and blocked[2].shape == (2, 50, 3, 3)
    for a, e in zip(blocked, scan):
        assert torch.allclose(a, e, rtol=1e-9, atol=1e-9)
    g_blocked, g_scan = g_blocked + g_blocked.mT, g_scan + g_scan.mT  # symmetric part
    assert torch.allclose(g_blocked, g_scan, rtol=1e-8, atol=1e-8)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    T=st.integers(1, 40),
    S=st.integers(1, 3),
    time_varying=st.booleans(),
    batch=st.sampled_from([(), (2,)]),
    block_size=st.sampled_from([1, 2, 3, 7, 16]),
)
def test_blocked_smoother_matches_scan(seed, T, S, time_varying, batch, block_size):
    y, G, F, W, V, m0, P0 = random_model(seed, T, S, 1, time_varying, False, batch)
    G = stable(G)
    y.view(*batch, -1)[..., seed % T] = math.nan
    ssm = kalman_module.prepare_state_space(y, StateSpaceMatrices(G, F, W, V, m0, P0))
    moments = kalman_module._run_filter(ssm)[1:]
    expected = kalman_module._run_smoother(ssm, *moments, gains=True, block_size=T)
    actual = kalman_module._run_smoother(ssm, *moments, gains=True, block_size=block_size)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape
        assert torch.allclose(a, e, rtol=1e-9, atol=1e-9)


def test_blocked_filter_float32_and_device(device):
    T = 500  # several blocks of ~sqrt(T) steps on an integrated trend with a seasonal
    g = torch.Generator().manual_seed(4)
    y = torch.randn(T, 1, generator=g, dtype=D).cumsum(0)
    y[[10, 200, 201]] = math.nan
    G, F, W, V = llt_seasonal(torch.tensor([0.5, 0.1, 0.01, 0.05], dtype=D))
    args = (y, G, F, W, V, torch.zeros(13, dtype=D), 10 * torch.eye(13, dtype=D))
    ref = kalman_filter(*split(args))
    res = kalman_filter(*split([x.float().to(device) for x in args]))
    assert res.filtered_means.dtype == torch.float32 and res.filtered_means.device == device
    assert torch.allclose(res.log_likelihood.double().cpu(), ref.log_likelihood, rtol=1e-5)
    level = res.filtered_means[:, 0].double().cpu()
    sd = ref.filtered_covs[:, 0, 0].sqrt()
    assert ((level - ref.filtered_means[:, 0]).abs() <= 1e-3 * sd).all()
