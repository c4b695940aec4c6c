"""BONG / LoFi / WoLF filters against exact posteriors, Kalman filtering and hand-derived steps."""

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pyro.infer import Predictive
from pyro.infer.autoguide.initialization import init_to_mean, init_to_sample

from pyro_ext.online import BONG, IMQ, LoFi, OnlineDivergenceError, WoLF, updates
from pyro_ext.timeseries import StateSpaceMatrices, kalman_filter


def linear_model(dim, prior_scale, noise):
    def model(x, y=None):
        w = pyro.sample(
            "w", dist.Normal(torch.zeros(dim, device=x.device), prior_scale).to_event(1)
        )
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(x @ w, noise), obs=y)

    return model


def linear_data(n, dim, noise, device=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    w = torch.randn(dim, generator=g)
    y = x @ w + noise * torch.randn(n, generator=g)
    return x.to(device), y.to(device), w


def exact_posterior(x, y, prior_scale, noise):
    dim = x.shape[-1]
    eye = torch.eye(dim, dtype=x.dtype, device=x.device)
    cov = torch.linalg.inv(eye / prior_scale**2 + x.T @ x / noise**2)
    return cov @ (x.T @ y) / noise**2, cov


@pytest.mark.parametrize("family", ["full", "dlr"])
@pytest.mark.parametrize("batch", [1, 5])
def test_bong_lin_is_exact_conjugate_posterior(float64, device, family, batch):
    dim, prior_scale, noise = 4, 1.5, 0.5
    x, y, _ = linear_data(30, dim, noise, device)
    kwargs = {"rank": dim} if family == "dlr" else {}
    f = BONG(
        linear_model(dim, prior_scale, noise), family=family, init_strategy=init_to_mean, **kwargs
    )
    for start in range(0, 30, batch):
        f.update(x[start : start + batch], y[start : start + batch])
    mean, cov = exact_posterior(x, y, prior_scale, noise)
    assert f.mean.device.type == device.type
    torch.testing.assert_close(f.mean, mean, atol=1e-8, rtol=0)
    torch.testing.assert_close(f.covariance(), cov, atol=1e-8, rtol=0)
    loc, scale = f.site_posteriors()["w"]
    torch.testing.assert_close(scale, cov.diagonal().sqrt(), atol=1e-8, rtol=0)


def test_random_walk_dynamics_equal_kalman_filter(float64):
    dim, prior_scale, noise, q, n = 3, 1.0, 0.3, 0.05, 25
    x, y, _ = linear_data(n, dim, noise)
    f = BONG(
        linear_model(dim, prior_scale, noise),
        init_strategy=init_to_mean,
        dynamics=("random_walk", q),
    )
    means, covs = [], []
    for t in range(n):
        f.update(x[t : t + 1], y[t : t + 1])
        means.append(f.mean)
        covs.append(f.covariance())
    eye = torch.eye(dim)
    matrices = StateSpaceMatrices(
        transition_matrix=eye,
        observation_matrix=x.unsqueeze(-2),  # (T, 1, S): the observation matrix changes with t
        transition_cov=q * eye,
        observation_cov=torch.tensor([[noise**2]]),
        init_mean=torch.zeros(dim),
        init_cov=prior_scale**2 * eye + q * eye,  # the filter drifts before its first update too
    )
    result = kalman_filter(y.unsqueeze(-1), matrices)
    torch.testing.assert_close(torch.stack(means), result.filtered_means, atol=1e-8, rtol=0)
    torch.testing.assert_close(torch.stack(covs), result.filtered_covs, atol=1e-8, rtol=0)


def test_diag_equals_full_when_each_observation_sees_one_coordinate(float64):
    # Independent arms: the precision stays diagonal, so the diagonal family is exact.
    arms, noise = 4, 0.7

    def model(action, y=None):
        theta = pyro.sample("theta", dist.Normal(torch.zeros(arms), 2.0).to_event(1))
        with pyro.plate("data", action.shape[0]):
            pyro.sample("y", dist.Normal(theta[action], noise), obs=y)

    g = torch.Generator().manual_seed(1)
    actions = torch.randint(arms, (40,), generator=g)
    rewards = torch.randn(40, generator=g)
    beliefs = {}
    for family in ("full", "diag"):
        f = BONG(model, family=family, init_strategy=init_to_mean)
        for t in range(40):
            f.update(actions[t : t + 1], rewards[t : t + 1])
        beliefs[family] = f
    torch.testing.assert_close(beliefs["diag"].mean, beliefs["full"].mean, atol=1e-10, rtol=0)
    torch.testing.assert_close(
        beliefs["diag"].covariance(), beliefs["full"].covariance(), atol=1e-10, rtol=0
    )


def test_low_rank_projection_keeps_top_directions_and_the_diagonal(float64):
    g = torch.Generator().manual_seed(2)
    dim, rank = 12, 3
    diagonal = torch.rand(dim, generator=g) + 0.5
    columns = torch.randn(dim, 7, generator=g)
    new_diagonal, W = updates.project_low_rank(diagonal, columns, rank)
    # The low-rank part is the best rank-3 approximation of C C^T (its top eigenpairs).
    evals, evecs = torch.linalg.eigh(columns @ columns.T)
    top = evecs[:, -rank:] * evals[-rank:]
    torch.testing.assert_close(W @ W.T, top @ evecs[:, -rank:].T, atol=1e-10, rtol=0)
    # and the precision's diagonal is kept exactly.
    torch.testing.assert_close(
        new_diagonal + (W * W).sum(-1), diagonal + (columns * columns).sum(-1), atol=1e-10, rtol=0
    )


# float32 keeps the dominant column small: its round-off grows with the conditioning.
@pytest.mark.parametrize("dtype, dominant", [(torch.float64, 30.0), (torch.float32, 2.0)])
def test_low_rank_draws_have_the_belief_covariance_exactly(dtype, dominant):
    """The draw is linear in the noise: fed the identity's rows, it gives the rows of a
    matrix ``T^T`` with ``T T^T`` the belief's covariance ``(diag + W W^T)^-1`` exactly, a
    zero column of ``W`` (a rank not yet filled) and a dominant one included."""
    g = torch.Generator().manual_seed(4)
    dim = 9
    diagonal = (torch.rand(dim, generator=g) + 0.2).to(dtype)
    W = torch.randn(dim, 4, generator=g).to(dtype)
    W[:, 2] = 0
    W[:, 0] *= dominant
    mean = torch.randn(dim, generator=g).to(dtype)
    belief = updates.DLRBelief(mean, diagonal, W)
    eye = torch.eye(dim, dtype=dtype)
    draws = updates.sample(belief, dim, noise=eye)
    T = (draws - mean).T.double()
    precision = torch.diag(diagonal.double()) + W.double() @ W.double().T
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    torch.testing.assert_close(
        T @ T.T @ precision, torch.eye(dim, dtype=torch.float64), atol=tol, rtol=0
    )


@pytest.mark.parametrize("jit_compile", [False, True])
def test_float32_lofi_on_a_wide_model_equals_the_exact_posterior(device, jit_compile):
    """A 20,000-weight linear regression, three observations far from the prior's
    prediction, in float32: an observation's whitened Jacobian row has a^T a = 8e6, so the
    posterior mean is the prior's step shrunk by that much. LoFi of rank 3 is exact here;
    its mean, its predictive variance of an observed input and its marginal variances equal
    the float64 posterior's to float32 round-off. (Woodbury's form of the mean's solve
    subtracts nearly equal vectors: 14 times the mean's size off in float32, 0.34 in float64
    from a gradient rounded to float32; the predictive variance was 12 times too large.)"""
    dim, noise, n = 20_000, 0.05, 3
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, dim, generator=g).to(device)
    y = torch.tensor([50.0, -40.0, 30.0], device=device)
    f = LoFi(linear_model(dim, 1.0, noise), rank=n, jit_compile=jit_compile)  # defaults
    for t in range(n):
        f.update(x[t : t + 1], y[t : t + 1])
    X, Y = x.double(), y.double()
    gram = noise**2 * torch.eye(n, dtype=torch.float64, device=device) + X @ X.T
    mean = X.T @ torch.linalg.solve(gram, Y)
    scale = float(mean.abs().max())
    assert float((f.mean.double() - mean).abs().max()) < 1e-5 * scale
    # x_0^T Sigma x_0 and diag(Sigma), Sigma = I - X^T (noise^2 I + X X^T)^{-1} X.
    spread = X[0] - X.T @ torch.linalg.solve(gram, X @ X[0])
    exact = float(X[0] @ spread)
    assert updates.quadratic_diagonal(f.belief, x[:1]).item() == pytest.approx(exact, rel=1e-4)
    variances = 1 - (X * torch.linalg.solve(gram, X)).sum(0)
    assert float((updates.marginal_variance(f.belief).double() - variances).abs().max()) < 1e-6


@settings(max_examples=25, deadline=None)
@given(
    dim=st.integers(3, 12),
    rank=st.integers(1, 4),
    outputs=st.integers(1, 3),
    lr=st.sampled_from([1.0, 0.5, 0.1]),
    seed=st.integers(0, 2**16),
)
def test_the_low_rank_step_by_kalman_gain_is_woodburys(dim, rank, outputs, lr, seed):
    """The low-rank family's first step from the coefficients v of grad = A^T v (Kalman's
    gain, a combination of the precision's columns) equals the Woodbury solve of grad, in
    float64, for any prior low-rank part, number of outputs and step size."""
    g = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    prior = updates.DLRBelief(draw(dim), draw(dim).exp(), draw(dim, rank))
    factor, v = draw(outputs, dim), draw(outputs)
    grad = factor.T @ v
    by_gain = updates.natural_step(prior, prior, grad, factor, None, lr, rank, v)
    by_woodbury = updates.natural_step(prior, prior, grad, factor, None, lr, rank)
    for ours, theirs in zip(by_gain, by_woodbury):
        torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-10)


def nearly_parallel_columns(generator, dim, tiny=False):
    """A diagonal and low-rank columns with two large, nearly parallel columns (norm about
    900) beside one of norm about 3 (``tiny``: and one of about 0.03)."""
    diagonal = torch.rand(dim, generator=generator) + 0.2
    column = torch.randn(dim, generator=generator)
    columns = [
        300 * column,
        300 * column + 0.5 * torch.randn(dim, generator=generator),
        torch.randn(dim, generator=generator),
    ]
    if tiny:
        columns.append(0.01 * torch.randn(dim, generator=generator))
    return diagonal, torch.stack(columns, dim=-1)


def test_float32_low_rank_draws_keep_nearly_parallel_columns_accurate():
    """Two large, nearly parallel columns of ``W`` (a precision with a small eigenvalue
    between two large ones): a float32 draw equals the float64 draw of the same belief and
    noise to float32 round-off. (A draw through the eigendecomposition of the Gram matrix
    ``V^T V``, which avoids the SVD of ``V``, cancels terms of the columns' squared size
    and is off by 1e-3 here in float32.)"""
    g = torch.Generator().manual_seed(4)
    dim = 9
    diagonal, W = nearly_parallel_columns(g, dim)
    mean = torch.randn(dim, generator=g)
    noise = torch.randn(4, dim, generator=g)
    single = updates.sample(updates.DLRBelief(mean, diagonal, W), 4, noise=noise)
    double = updates.sample(
        updates.DLRBelief(mean.double(), diagonal.double(), W.double()), 4, noise=noise.double()
    )
    scale = (double - mean.double()).abs().max()
    assert ((single.double() - double).abs().max() / scale).item() < 2e-5


@settings(max_examples=40, deadline=None)
@given(
    dim=st.integers(1, 30),
    num_columns=st.integers(1, 8),
    rank=st.integers(1, 10),
    seed=st.integers(0, 2**16),
)
def test_the_low_rank_projection_is_the_truncated_svd(dim, num_columns, rank, seed):
    """LoFi's projection (through the Gram matrix's eigendecomposition) equals the
    truncated SVD written out by hand, in float64: the kept part U_r S_r^2 U_r^T and the
    diagonal plus the discarded directions' squares, for any D, number of columns (fewer
    than D or more) and rank (above the number of columns: zero-padded)."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(2, -2, num_columns, dtype=torch.float64)
    columns = torch.randn(dim, num_columns, generator=g, dtype=torch.float64) * scales
    diagonal = torch.rand(dim, generator=g, dtype=torch.float64) + 0.1
    new_diagonal, W = updates.project_low_rank(diagonal, columns, rank)
    assert W.shape == (dim, rank)
    u, s, _ = torch.linalg.svd(columns, full_matrices=False)
    kept = min(rank, s.shape[0])
    expected_kept = (u[:, :kept] * s[:kept].square()) @ u[:, :kept].T
    expected_diagonal = diagonal + (u[:, kept:] * s[kept:]).square().sum(-1)
    size = float(s[0].square())
    torch.testing.assert_close(W @ W.T, expected_kept, rtol=0, atol=1e-10 * size)
    torch.testing.assert_close(new_diagonal, expected_diagonal, rtol=0, atol=1e-10 * size)


def test_float32_low_rank_projection_is_as_accurate_as_float64_allows():
    """Two large, nearly parallel columns beside two small ones (the precision's squared
    singular values span 1e6): the float32 projection's diagonal is within 5e-6 of the
    float64 one's (measured 2e-6; a float32 SVD is 9e-6 off, a Gram matrix formed in
    float32 1.4e-4), and its kept part within float32 round-off of the largest entry."""
    diagonal, columns = nearly_parallel_columns(torch.Generator().manual_seed(4), 9, tiny=True)
    for rank in (1, 2, 3):
        d32, W32 = updates.project_low_rank(diagonal, columns, rank)
        d64, W64 = updates.project_low_rank(diagonal.double(), columns.double(), rank)
        assert W32.dtype == d32.dtype == torch.float32
        kept64 = W64 @ W64.T
        kept32 = W32.double() @ W32.double().T
        assert float((kept32 - kept64).abs().max() / kept64.abs().max()) < 2e-7
        assert float((d32.double() - d64).abs().max() / d64.abs().max()) < 5e-6


def test_a_non_finite_low_rank_projection_is_refused_or_flagged():
    """Columns with inf: the eager projection raises (an update reports it as a
    divergence); a traced one records a false flag and still runs (LAPACK's
    eigendecomposition would stop on inf), so the update is redone eagerly."""
    columns = torch.ones(5, 3)
    columns[2, 1] = float("inf")
    with pytest.raises(updates.NotPositiveDefiniteError, match="columns are not finite"):
        updates.project_low_rank(torch.ones(5), columns, 2)
    with updates.deferred_checks() as flags:
        updates.project_low_rank(torch.ones(5), columns, 2)
    assert len(flags) == 1 and not bool(flags[0])


def test_lofi_update_matches_svd_of_the_full_update(float64):
    dim, noise, rank = 6, 0.4, 2
    x, y, _ = linear_data(5, dim, noise)
    f = LoFi(linear_model(dim, 1.0, noise), rank=rank, init_strategy=init_to_mean)
    f.update(x, y)
    # Prior precision I, no low-rank part: [W, A^T] = x^T / noise.
    evals, evecs = torch.linalg.eigh(x.T @ x / noise**2)
    W = f.belief.low_rank
    torch.testing.assert_close(
        W @ W.T, (evecs[:, -rank:] * evals[-rank:]) @ evecs[:, -rank:].T, atol=1e-9, rtol=0
    )
    # The mean moved with the unprojected precision: the exact posterior mean.
    mean, _ = exact_posterior(x, y, 1.0, noise)
    torch.testing.assert_close(f.mean, mean, atol=1e-9, rtol=0)


def test_dlr_update_scales_linearly_in_dimension():
    # D = 100,000: a dense D x D matrix would need 40 GB; the low-rank family needs O(D L).
    dim = 100_000

    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(dim), 1.0).to_event(1))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(x @ w, 1.0), obs=y)

    f = LoFi(model, rank=5)
    x = torch.randn(2, dim) / math.sqrt(dim)
    for _ in range(3):
        f.update(x, torch.randn(2))
    assert f.belief.low_rank.shape == (dim, 5)
    assert torch.isfinite(f.mean).all()
    mean, variance = f.predictive(x)
    assert variance.shape == (2,) and (variance > 1).all()


def test_blr_iterations_reach_the_exact_posterior(float64):
    dim, prior_scale, noise = 3, 1.0, 0.5
    x, y, _ = linear_data(10, dim, noise)
    f = BONG(
        linear_model(dim, prior_scale, noise),
        method="blr",
        learning_rate=0.5,
        num_iters=40,
        init_strategy=init_to_mean,
    )
    f.update(x, y)
    mean, cov = exact_posterior(x, y, prior_scale, noise)
    torch.testing.assert_close(f.mean, mean, atol=1e-8, rtol=0)
    torch.testing.assert_close(f.covariance(), cov, atol=1e-8, rtol=0)


def logistic_model(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(2), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.Bernoulli(logits=x @ w), obs=y)


def test_bog_and_bbb_follow_the_published_formulas_on_logistic_regression(float64):
    x, y = torch.tensor([[0.8, -1.3]]), torch.tensor([1.0])
    m0, S0 = torch.tensor([0.3, -0.2]), torch.eye(2)
    alpha = 0.05

    def expectations(m):
        p = torch.sigmoid(x[0] @ m)
        return x[0] * (y[0] - p), -p * (1 - p) * torch.outer(x[0], x[0])

    start = {"w": m0}
    # BOG: mu = m0 + alpha g, Sigma = S0 + alpha/2 G (linearised at the prior mean).
    f = BONG(
        logistic_model,
        method="bog",
        learning_rate=alpha,
        init_strategy=lambda site: start[site["name"]],
    )
    f.update(x, y)
    g, G = expectations(m0)
    torch.testing.assert_close(f.mean, m0 + alpha * g, atol=1e-12, rtol=0)
    torch.testing.assert_close(f.covariance(), S0 + alpha / 2 * G, atol=1e-12, rtol=0)
    # BBB, two inner steps, with the KL gradient to the prior from the second on.
    f = BONG(
        logistic_model,
        method="bbb",
        learning_rate=alpha,
        num_iters=2,
        init_strategy=lambda site: start[site["name"]],
    )
    f.update(x, y)
    m1, S1 = m0 + alpha * g, S0 + alpha / 2 * G
    g1, G1 = expectations(m1)
    P0 = torch.linalg.inv(S0)
    m2 = m1 + alpha * (g1 - P0 @ (m1 - m0))
    S2 = S1 + alpha / 2 * (G1 + torch.linalg.inv(S1) - P0)
    torch.testing.assert_close(f.mean, m2, atol=1e-12, rtol=0)
    torch.testing.assert_close(f.covariance(), S2, atol=1e-12, rtol=0)


def test_bong_lin_on_logistic_regression_is_the_natural_step(float64):
    x, y = torch.tensor([[0.8, -1.3], [0.1, 0.4]]), torch.tensor([1.0, 0.0])
    m0 = torch.tensor([0.3, -0.2])
    f = BONG(logistic_model, family="diag", init_strategy=lambda site: {"w": m0}[site["name"]])
    f.update(x, y)
    p = torch.sigmoid(x @ m0)
    g = x.T @ (y - p)
    precision = 1 + (p * (1 - p)).unsqueeze(-1).mul(x * x).sum(0)
    torch.testing.assert_close(f.mean, m0 + g / precision, atol=1e-12, rtol=0)
    torch.testing.assert_close(f.covariance().diagonal(), 1 / precision, atol=1e-12, rtol=0)


def test_monte_carlo_hessian_on_linear_gaussian_is_exact_in_the_precision(float64):
    dim, noise = 3, 0.5
    x, y, _ = linear_data(8, dim, noise)
    f = BONG(
        linear_model(dim, 1.0, noise),
        linearize=False,
        hessian="mc",
        num_samples=4000,
        init_strategy=init_to_mean,
    )
    f.update(x, y)
    mean, cov = exact_posterior(x, y, 1.0, noise)
    # The Hessian of a linear-Gaussian likelihood is the same at every draw: exact.
    torch.testing.assert_close(f.covariance(), cov, atol=1e-10, rtol=0)
    # The gradient is a Monte Carlo mean: within a few standard errors.
    assert (f.mean - mean).abs().max() < 0.05


def test_wolf_with_infinite_threshold_is_the_plain_filter(float64):
    dim, noise = 3, 0.5
    x, y, _ = linear_data(20, dim, noise)
    plain = BONG(linear_model(dim, 1.0, noise), init_strategy=init_to_mean)
    robust = WoLF(linear_model(dim, 1.0, noise), c=math.inf, init_strategy=init_to_mean)
    for t in range(20):
        plain.update(x[t : t + 1], y[t : t + 1])
        robust.update(x[t : t + 1], y[t : t + 1])
    torch.testing.assert_close(robust.mean, plain.mean, atol=1e-12, rtol=0)
    torch.testing.assert_close(robust.covariance(), plain.covariance(), atol=1e-12, rtol=0)


def test_wolf_beats_the_plain_filter_on_a_stream_with_outliers():
    dim, noise, n = 5, 0.3, 400
    x, y, w = linear_data(n, dim, noise, seed=3)
    g = torch.Generator().manual_seed(4)
    corrupt = torch.rand(n, generator=g) < 0.15
    y = torch.where(corrupt, torch.rand(n, generator=g) * 100 - 50, y)
    errors = {}
    for name, f in {
        "plain": BONG(linear_model(dim, 1.0, noise)),
        "wolf": WoLF(linear_model(dim, 1.0, noise), c=4 * noise),
    }.items():
        for t in range(n):
            f.update(x[t : t + 1], y[t : t + 1])
        errors[name] = (f.mean - w).norm().item()
    assert errors["wolf"] < 0.25 * errors["plain"], errors
    assert errors["wolf"] < 0.2


def test_linearised_predictive_is_the_gaussian_predictive(float64):
    dim, noise = 3, 0.5
    x, y, _ = linear_data(10, dim, noise)
    f = BONG(linear_model(dim, 1.0, noise), init_strategy=init_to_mean)
    f.update(x, y)
    mean, cov = exact_posterior(x, y, 1.0, noise)
    x_new = torch.randn(4, dim)
    loc, variance = f.predictive(x_new)
    torch.testing.assert_close(loc, x_new @ mean, atol=1e-10, rtol=0)
    torch.testing.assert_close(
        variance, (x_new @ cov * x_new).sum(-1) + noise**2, atol=1e-10, rtol=0
    )
    pyro.set_rng_seed(0)
    loc_mc, variance_mc = f.predictive(x_new, num_samples=20000)
    assert (loc_mc - loc).abs().max() < 0.02
    assert ((variance_mc - variance) / variance).abs().max() < 0.05


def test_sample_feeds_pyro_predictive(device):
    dim, noise = 3, 0.5
    x, y, _ = linear_data(10, dim, noise, device)
    f = BONG(linear_model(dim, 1.0, noise), family="diag").update(x, y)
    draws = f.sample(50)
    assert draws["w"].shape == (50, dim) and draws["w"].device.type == device.type
    out = Predictive(linear_model(dim, 1.0, noise), posterior_samples=draws)(x)
    assert out["y"].shape == (50, 10)


@pytest.mark.parametrize("family", ["full", "diag", "dlr"])
def test_categorical_network_learns_and_is_reproducible(family):
    g = torch.Generator().manual_seed(0)
    centers = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.5]])
    labels = torch.randint(3, (300,), generator=g)
    x = centers[labels] + 0.6 * torch.randn(300, 2, generator=g)

    def model(x, y=None):
        w1 = pyro.sample("w1", dist.Normal(0.0, 1.0).expand([2, 8]).to_event(2))
        w2 = pyro.sample("w2", dist.Normal(0.0, 1.0).expand([8, 3]).to_event(2))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Categorical(logits=torch.tanh(x @ w1) @ w2), obs=y)

    means = []
    for _ in range(2):
        pyro.set_rng_seed(5)
        # A network learns from a start away from its zero prior mean (a saddle point).
        f = BONG(
            model,
            family=family,
            rank=5 if family == "dlr" else None,
            init_strategy=init_to_sample,
        )
        for t in range(0, 200, 2):
            f.update(x[t : t + 2], labels[t : t + 2])
        means.append(f.mean)
    torch.testing.assert_close(means[0], means[1], atol=0, rtol=0)
    probs, variance = f.predictive(x[200:])
    assert probs.shape == (100, 3) and torch.allclose(probs.sum(-1), torch.ones(100))
    assert (probs.argmax(-1) == labels[200:]).float().mean() > 0.9


def test_missing_observations_are_skipped(float64):
    dim, noise = 3, 0.5
    x, y, _ = linear_data(6, dim, noise)
    with_nan = y.clone()
    with_nan[[1, 4]] = float("nan")
    keep = torch.tensor([0, 2, 3, 5])
    a = BONG(linear_model(dim, 1.0, noise), init_strategy=init_to_mean).update(x, with_nan)
    b = BONG(linear_model(dim, 1.0, noise), init_strategy=init_to_mean).update(x[keep], y[keep])
    torch.testing.assert_close(a.mean, b.mean, atol=1e-12, rtol=0)
    torch.testing.assert_close(a.covariance(), b.covariance(), atol=1e-12, rtol=0)


def test_unconstrained_prior_for_a_positive_site():
    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        rate = pyro.sample("rate", dist.Gamma(2.0, 2.0))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Poisson(rate * torch.exp(w * x)), obs=y)

    with pytest.raises(ValueError, match="rate.*unconstrained_prior"):
        BONG(model).update(torch.zeros(3), torch.ones(3))
    # BLR re-linearises at each inner step: BONG's single linearisation at the prior
    # overshoots on the first batch of this non-linear model and keeps a bias.
    f = BONG(model, method="blr", unconstrained_prior={"rate": (0.0, 1.0)})
    x = torch.rand(200) * 2 - 1
    y = torch.poisson(3.0 * torch.exp(0.5 * x))
    for t in range(0, 200, 10):
        f.update(x[t : t + 10], y[t : t + 10])
    posterior = f.site_posteriors()
    assert abs(posterior["rate"][0].item() - 3.0) < 0.4
    assert abs(posterior["w"][0].item() - 0.5) < 0.15


def test_divergence_is_reported_with_the_step_and_keeps_the_belief(float64):
    x, y = torch.tensor([[3.0, -3.0]]), torch.tensor([1.0])
    f = BONG(logistic_model, method="bog", learning_rate=5.0, init_strategy=init_to_mean)
    with pytest.raises(OnlineDivergenceError, match="update 0") as info:
        f.update(x, y)
    assert info.value.step == 0 and f.num_updates == 0
    torch.testing.assert_close(f.mean, torch.zeros(2))  # the prior, kept


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"family": "banded"}, ValueError, "family"),
        ({"family": 3}, TypeError, "family"),
        ({"method": "sgd"}, ValueError, "method"),
        ({"family": "diag", "rank": 3}, ValueError, "rank applies"),
        ({"family": "dlr", "rank": 0}, ValueError, "rank must be an integer >= 1"),
        ({"family": "dlr", "rank": 2.5}, TypeError, "rank"),
        ({"family": "dlr", "method": "bog"}, ValueError, "'full' and 'diag'"),
        ({"hessian": "mc"}, ValueError, "linearize=False"),
        ({"linearize": False, "hessian": "lin"}, ValueError, "linearize=True"),
        ({"family": "dlr", "linearize": False, "hessian": "mc"}, ValueError, "low-rank"),
        ({"num_samples": 5}, ValueError, "linearize=False"),
        ({"linearize": False, "num_samples": 3}, ValueError, "even"),
        ({"family": "dlr", "linearize": False}, ValueError, "hessian='ef'"),
        ({"learning_rate": 0.0}, ValueError, "learning_rate"),
        ({"learning_rate": 1.5}, ValueError, "learning_rate"),
        ({"num_iters": 3}, ValueError, "num_iters"),
        ({"robust": 2.0}, TypeError, "IMQ"),
        ({"dynamics": ("random_walk", -1.0)}, ValueError, "q"),
        ({"dynamics": "random_walk"}, ValueError, "dynamics"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, error, match):
    with pytest.raises(error, match=match):
        BONG(logistic_model, **kwargs)


def test_bad_models_and_data_are_rejected():
    with pytest.raises(ValueError, match="c .*must be a number > 0"):
        IMQ(0.0)
    with pytest.raises(ValueError, match="rank must be at most"):
        LoFi(logistic_model, rank=3).update(torch.ones(1, 2), torch.ones(1))

    def discrete(x, y=None):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(z, 1.0), obs=y)

    with pytest.raises(ValueError, match="discrete"):
        BONG(discrete).update(None, torch.tensor(0.0))

    def subsampled(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", 10, subsample_size=2) as i:
            pyro.sample("y", dist.Normal(w * x[i], 1.0), obs=y[i])

    with pytest.raises(ValueError, match="subsample"):
        BONG(subsampled).update(torch.ones(10), torch.ones(10))

    def student(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        pyro.sample("y", dist.StudentT(1.5, w * x, 1.0), obs=y)

    with pytest.raises(ValueError, match="df > 2"):
        BONG(student).update(torch.ones(()), torch.ones(()))
    with pytest.raises(RuntimeError, match="update"):
        BONG(logistic_model).covariance()


def test_state_dict_resumes_a_stream(tmp_path, float64):
    dim, noise = 3, 0.5
    x, y, _ = linear_data(20, dim, noise)
    model = linear_model(dim, 1.0, noise)
    whole = BONG(model, family="dlr", rank=2, init_strategy=init_to_mean)
    first = BONG(model, family="dlr", rank=2, init_strategy=init_to_mean)
    for t in range(20):
        whole.update(x[t : t + 1], y[t : t + 1])
        if t < 10:
            first.update(x[t : t + 1], y[t : t + 1])
    torch.save(first.state_dict(), tmp_path / "belief.pt")
    resumed = BONG(model, family="dlr", rank=2).load_state_dict(torch.load(tmp_path / "belief.pt"))
    for t in range(10, 20):
        resumed.update(x[t : t + 1], y[t : t + 1])
    assert resumed.num_updates == 20
    torch.testing.assert_close(resumed.mean, whole.mean, atol=1e-12, rtol=0)
    torch.testing.assert_close(resumed.covariance(), whole.covariance(), atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="family"):
        BONG(model).load_state_dict(first.state_dict())


def test_nan_inputs_are_reported_with_the_step():
    f = BONG(logistic_model)
    f.update(torch.ones(1, 2), torch.ones(1))
    with pytest.raises(OnlineDivergenceError, match="update 1.*not finite"):
        f.update(torch.tensor([[float("nan"), 1.0]]), torch.ones(1))
    assert f.num_updates == 1 and torch.isfinite(f.mean).all()


@pytest.mark.parametrize("family", ["full", "diag", "dlr"])
def test_linearised_empirical_fisher_is_the_per_example_outer_product(float64, family):
    # EF: -G = sum_i g_i g_i^T with g_i = x_i (y_i - p_i) for logistic regression.
    x, y = torch.tensor([[0.8, -1.3], [0.1, 0.4], [-0.5, 0.9]]), torch.tensor([1.0, 0.0, 1.0])
    m0 = torch.tensor([0.3, -0.2])
    kwargs = {"rank": 2} if family == "dlr" else {}
    f = BONG(
        logistic_model,
        family=family,
        hessian="ef",
        init_strategy=lambda site: {"w": m0}[site["name"]],
        **kwargs,
    )
    f.update(x, y)
    g = x * (y - torch.sigmoid(x @ m0)).unsqueeze(-1)
    precision = torch.eye(2) + g.T @ g
    if family == "diag":
        precision = torch.diag(precision.diagonal())
    cov = torch.linalg.inv(precision)
    torch.testing.assert_close(f.mean, m0 + cov @ g.sum(0), atol=1e-12, rtol=0)
    torch.testing.assert_close(f.covariance(), cov, atol=1e-12, rtol=0)


# -- issue 30: filters equal to their papers, with default settings ---------------------------
def diagonal_ekf(x, y, prior_scale, noise):
    """The variational diagonal EKF (BONG's diagonal family, one natural step per point,
    linearised Hessian) written out: lambda += x^2 / s^2, mu += x (y - x mu) / s^2 / lambda."""
    mean = torch.zeros(x.shape[-1], dtype=x.dtype, device=x.device)
    precision = torch.full_like(mean, prior_scale**-2)
    for xt, yt in zip(x, y):
        precision = precision + xt.square() / noise**2
        mean = mean + xt * (yt - xt @ mean) / noise**2 / precision
    return mean, precision.reciprocal()


@pytest.mark.parametrize(
    "family, linearize",
    [("full", True), ("full", False), ("diag", True), ("diag", False), ("dlr", True)],
)
def test_default_settings_are_exact_on_the_conjugate_stream(float64, device, family, linearize):
    # Bayesian linear regression streamed one point at a time, every other setting left at
    # its default (the start, the Hessian, the Monte Carlo draws): the full and full-rank
    # LoFi beliefs are the closed-form posterior; the diagonal one is the diagonal EKF.
    dim, prior_scale, noise, n = 4, 1.5, 0.5, 30
    x, y, _ = linear_data(n, dim, noise, device)
    kwargs = {"rank": dim} if family == "dlr" else {}
    f = BONG(linear_model(dim, prior_scale, noise), family=family, linearize=linearize, **kwargs)
    pyro.set_rng_seed(0)
    for t in range(n):
        f.update(x[t : t + 1], y[t : t + 1])
        if t == 4:  # after 5 points, where a start away from the prior mean shows most
            mean, cov = exact_posterior(x[:5], y[:5], prior_scale, noise)
            if family == "diag":
                mean, variance = diagonal_ekf(x[:5], y[:5], prior_scale, noise)
                cov = torch.diag(variance)
            torch.testing.assert_close(f.mean, mean, atol=1e-10, rtol=0)
    mean, cov = exact_posterior(x, y, prior_scale, noise)
    if family == "diag":
        mean, variance = diagonal_ekf(x, y, prior_scale, noise)
        cov = torch.diag(variance)
    assert f.mean.device.type == device.type
    torch.testing.assert_close(f.mean, mean, atol=1e-10, rtol=0)
    torch.testing.assert_close(f.covariance(), cov, atol=1e-10, rtol=0)


def test_monte_carlo_low_rank_default_is_refused_with_what_to_pass():
    with pytest.raises(ValueError, match="hessian='ef'.*linearize=True"):
        BONG(linear_model(3, 1.0, 0.5), family="dlr", linearize=False)
    BONG(linear_model(3, 1.0, 0.5), family="dlr", linearize=False, hessian="ef")  # explicit


def test_antithetic_draws_are_exact_samples_reflected_about_the_mean(float64):
    g = torch.Generator().manual_seed(0)
    root = torch.randn(3, 3, generator=g)
    belief = updates.FullBelief(torch.tensor([1.0, -2.0, 0.5]), root @ root.T + torch.eye(3))
    draws = updates.sample(belief, 40000, torch.Generator().manual_seed(1), antithetic=True)
    first, second = draws.chunk(2)
    torch.testing.assert_close(first + second, 2 * belief.mean.expand_as(first))
    cov = belief.covariance
    assert (torch.cov(first.T) - cov).abs().max() < 0.05 * cov.abs().max()
    with pytest.raises(ValueError, match="even"):
        updates.sample(belief, 3, antithetic=True)


def test_predictive_with_drift_is_the_ekf_one_step_ahead_predictive(float64):
    # Predict-then-update EKF written out: before each observation the covariance grows by
    # q I, the one-step-ahead predictive is N(x mu, x (P + q I) x^T + s^2), then the update.
    # The filter's predictive must be that, before the first update too (the prior
    # predictive), and its filtered belief must not drift twice.
    dim, prior_scale, noise, q, n = 3, 1.0, 0.1, 1e-3, 40
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, dim, generator=g)
    w = torch.randn(dim, generator=g) + (q**0.5 * torch.randn(n, dim, generator=g)).cumsum(0)
    y = (x * w).sum(-1) + noise * torch.randn(n, generator=g)
    f = BONG(linear_model(dim, prior_scale, noise), dynamics=("random_walk", q))
    mu, P = torch.zeros(dim), prior_scale**2 * torch.eye(dim)
    total, total_ekf = 0.0, 0.0
    for t in range(n):
        xt, yt = x[t : t + 1], y[t : t + 1]
        P = P + q * torch.eye(dim)  # predict
        loc_ekf, var_ekf = xt @ mu, (xt @ P @ xt.T).reshape(1) + noise**2
        loc, var = f.predictive(xt)
        torch.testing.assert_close(loc, loc_ekf, atol=1e-10, rtol=0)
        torch.testing.assert_close(var, var_ekf, atol=1e-10, rtol=0)
        _, spread = f.predictive(xt, noise=False)
        torch.testing.assert_close(spread, var_ekf - noise**2, atol=1e-10, rtol=0)
        torch.testing.assert_close(f.predicted_belief().mean, mu, atol=1e-10, rtol=0)
        total += dist.Normal(loc, var.sqrt()).log_prob(yt).sum().item()
        total_ekf += dist.Normal(loc_ekf, var_ekf.sqrt()).log_prob(yt).sum().item()
        S = (xt @ P @ xt.T).reshape(()) + noise**2  # update
        K = (P @ xt.T).reshape(-1) / S
        mu, P = mu + K * (yt - xt @ mu), P - torch.outer(K, K) * S
        f.update(xt, yt)
        torch.testing.assert_close(f.mean, mu, atol=1e-10, rtol=0)
        torch.testing.assert_close(f.covariance(), P, atol=1e-10, rtol=0)
    assert abs(total - total_ekf) < 1e-8


def test_thompson_draws_come_from_the_predicted_belief(float64):
    from pyro_ext.online import ThompsonBandit, gaussian_arms_model

    agent = ThompsonBandit(
        lambda: BONG(gaussian_arms_model(2), family="diag", dynamics=("random_walk", 0.5)), 2
    )
    agent.observe(None, 0, 1.0)
    belief = agent.filter.predicted_belief()
    torch.testing.assert_close(
        belief.precision.reciprocal(), agent.filter.belief.precision.reciprocal() + 0.5
    )


def wolf_by_hand(x, y, prior_scale, noise, c, squared=True):
    """WoLF on a linear-Gaussian model as the paper's algorithm writes it (Duran-Martin et
    al. 2024; the authors' ExtendedKalmanFilterIMQ): the Kalman update with R / w, w = the
    IMQ weight of the residual against the predicted mean, c^2 / (c^2 + r^2)."""
    mean = torch.zeros(x.shape[-1], dtype=x.dtype)
    cov = prior_scale**2 * torch.eye(x.shape[-1], dtype=x.dtype)
    for xt, yt in zip(x, y):
        r = yt - xt @ mean
        w = c**2 / (c**2 + r**2)
        if not squared:
            w = w.sqrt()
        S = xt @ cov @ xt + noise**2 / w
        K = cov @ xt / S
        mean, cov = mean + K * r, cov - torch.outer(K, K) * S
    return mean, cov


@pytest.mark.parametrize("squared", [True, False])
def test_wolf_is_the_papers_algorithm_written_out(float64, squared):
    dim, noise, n, c = 3, 0.3, 60, 0.5
    x, y, _ = linear_data(n, dim, noise, seed=11)
    g = torch.Generator().manual_seed(12)
    outlier = torch.rand(n, generator=g) < 0.2
    y = torch.where(outlier, y + 5 * torch.randn(n, generator=g).sign(), y)
    f = WoLF(linear_model(dim, 1.0, noise), c=c, squared=squared)
    for t in range(n):
        f.update(x[t : t + 1], y[t : t + 1])
    mean, cov = wolf_by_hand(x, y, 1.0, noise, c, squared)
    torch.testing.assert_close(f.mean, mean, atol=1e-10, rtol=0)
    torch.testing.assert_close(f.covariance(), cov, atol=1e-10, rtol=0)
    assert repr(f.robust) == ("IMQ(c=0.5)" if squared else "IMQ(c=0.5, squared=False)")
    with pytest.raises(TypeError, match="squared must be a bool"):
        IMQ(1.0, squared="yes")


def test_prior_predictive_before_the_first_update(float64):
    dim, prior_scale, noise, q = 3, 1.5, 0.5, 0.2
    x, y, _ = linear_data(5, dim, noise)
    f = BONG(linear_model(dim, prior_scale, noise), dynamics=("random_walk", q))
    loc, var = f.predictive(x)
    torch.testing.assert_close(loc, torch.zeros(5), atol=1e-12, rtol=0)
    expected = (x.square().sum(-1)) * (prior_scale**2 + q) + noise**2
    torch.testing.assert_close(var, expected, atol=1e-10, rtol=0)
    # The belief it set up is the one the update starts from.
    f.update(x, y)
    g = BONG(linear_model(dim, prior_scale, noise), dynamics=("random_walk", q)).update(x, y)
    torch.testing.assert_close(f.mean, g.mean, atol=1e-12, rtol=0)
    torch.testing.assert_close(f.covariance(), g.covariance(), atol=1e-12, rtol=0)


def test_prior_predictive_keeps_a_declared_random_start():
    from pyro_ext.online import neural_contextual_model

    model = neural_contextual_model(3, 2, hidden=4)
    context, action, reward = torch.randn(4, 3), torch.tensor([0, 1, 1, 0]), torch.randn(4)
    means = []
    for predict_first in (False, True):
        pyro.set_rng_seed(3)
        f = LoFi(model, rank=2)
        if predict_first:
            loc, var = f.predictive(context, action)
            assert loc.shape == (4,) and bool((var > 1).all())  # the prior's spread + noise
        means.append(f.update(context, action, reward).mean)
    torch.testing.assert_close(means[0], means[1], atol=0, rtol=0)
    assert bool((means[0] != 0).all())  # a prior draw, not the zero prior mean


def test_network_at_its_zero_prior_mean_is_reported():
    def net(x, y=None):
        w1 = pyro.sample("w1", dist.Normal(0.0, 1.0).expand([2, 4]).to_event(2))
        w2 = pyro.sample("w2", dist.Normal(0.0, 1.0).expand([4]).to_event(1))
        b = pyro.sample("b", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(torch.tanh(x @ w1) @ w2 + b, 0.1), obs=y)

    x, y = torch.randn(3, 2), torch.randn(3)
    with pytest.warns(UserWarning, match=r"\['w1', 'w2'\].*init_to_sample"):
        BONG(net).update(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        BONG(net, init_strategy=init_to_sample).update(x, y)
        BONG(linear_model(2, 1.0, 0.5)).update(x, y)  # nonzero Jacobian at the prior mean


@pytest.mark.parametrize("linearize", [True, False])
def test_deterministic_sites_are_never_observations(float64, linearize):
    dim, noise = 3, 0.5
    x, y, _ = linear_data(10, dim, noise)

    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(dim), 1.0).to_event(1))
        f = pyro.deterministic("f", x @ w)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(f, noise), obs=y)

    filt = BONG(model, linearize=linearize)
    prior_loc, _ = filt.predictive(x)  # y is the output, not f
    assert prior_loc.shape == (10,)
    filt.update(x, y)
    assert filt.observed_sites == ("y",)
    mean, cov = exact_posterior(x, y, 1.0, noise)
    torch.testing.assert_close(filt.mean, mean, atol=1e-10, rtol=0)
    torch.testing.assert_close(filt.covariance(), cov, atol=1e-10, rtol=0)
