import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyro_ext.models.bsts import (
    THESIS_MODEL,
    NoiseScales,
    PolarTransform,
    RetailBSTS,
    SpikeSlabNormal,
    allocate_budget,
    goodwill_offset,
    simulate_retail,
)
from pyro_ext.timeseries.dlm import DLM, LinearGaussian

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def short_data():
    return simulate_retail(num_weeks=60, seed=1, noise="gaussian")


@pytest.fixture(scope="module")
def fitted(short_data):
    d = short_data
    m = RetailBSTS(**THESIS_MODEL, variant="RF", noise="gaussian", seasonal_harmonics=1)
    m.fit(
        d.sales,
        d.spend,
        d.covariates,
        method="sgld",
        num_samples=20,
        warmup_steps=30,
        num_particles=4,
        map_init_steps=50,
        seed=0,
    )
    return m


def quick_fit(model, data, **options):
    """``model`` fitted on ``data`` by a few steps without an R-hat target (for tests of
    arithmetic and wiring, not of mixing); ``options`` override the budget."""
    budget = dict(num_samples=4, warmup_steps=4, num_particles=2, map_init_steps=10)
    return model.fit(
        data.sales, data.spend, data.covariates, rhat_target=None, **{**budget, **options}
    )


def test_simulator_shapes_determinism():
    d = simulate_retail()
    assert d.sales.shape == (234,) and d.spend.shape == (234, 5) and d.covariates.shape == (234, 7)
    assert len(d.channel_names) == 5 and len(d.covariate_names) == 7
    assert (d.spend >= 0).all() and torch.isfinite(d.sales).all()
    assert {"delta", "q", "beta", "inclusion", "goodwill", "level"} <= set(d.truth)
    assert d.truth["inclusion"].dtype == torch.bool and not d.truth["inclusion"].all()
    d2 = simulate_retail(seed=0)
    assert torch.equal(d.sales, d2.sales) and torch.equal(d.spend, d2.spend)
    assert not torch.equal(d.sales, simulate_retail(seed=1).sales)
    t = simulate_retail(num_weeks=50, noise="student_t")
    assert t.sales.shape == (50,)


def test_goodwill_offset_recursion():
    phi, x = torch.tensor(0.7, dtype=torch.float64), torch.randn(10, dtype=torch.float64)
    D, ref = goodwill_offset(phi, x), [0.0]
    for t in range(1, 10):
        ref.append(phi.item() * ref[-1] + x[t - 1].item())
    assert torch.allclose(D, torch.tensor(ref, dtype=torch.float64))


def _goodwill_before_the_data(params, u, weeks=52):
    """D_1 by the recursion over 52 weeks before the data, each with the mean spend of the
    first min(T, 52) weeks (lag 1: the last of them enters D_1)."""
    phi = 1 - params["delta"]
    inflow = (u[:weeks].mean(0) * params["q"]).sum()
    D = torch.zeros((), dtype=torch.float64)
    for _ in range(52):
        D = phi * D + inflow
    return D


def _dense_loglik(model, params, y, u, X, T):
    """Dense Gaussian of y under the thesis' eq. (1.4) form: build the joint covariance of
    the states x_t = [A_t, level_t, season_t] by the exact moment recursion with the input
    as a known mean term."""
    dlm = model.state_space(params)
    G, F, W, V, m0, P0 = dlm.matrices(T)
    S = G.shape[-1]
    inflow = (u * params["q"]).sum(-1)
    # means: A_1 = m0 + the goodwill from before the data, A_t = phi A_{t-1} + inflow_{t-1};
    # the level's prior is on mu_1 + D_1 (D_1 = that start at lag 1): its mean is -D_1.
    means, m = [], m0.clone()
    m[0] = m[0] + _goodwill_before_the_data(params, u)
    m[1] = m[1] - _goodwill_before_the_data(params, u)
    Acov = torch.zeros(T * S, T * S, dtype=torch.float64)
    for t in range(T):
        if t > 0:
            m = G @ m
            m[0] = m[0] + inflow[t - 1]
        means.append(F[0] @ m)
    # covariance of states by x_t = G^{t} x_0 + sum G^{t-s} w_s
    covs = [P0]
    for _ in range(1, T):
        covs.append(G @ covs[-1] @ G.T + W)
    for t in range(T):
        for s in range(t + 1):
            c = torch.linalg.matrix_power(G, t - s) @ covs[s]
            Acov[t * S : (t + 1) * S, s * S : (s + 1) * S] = c
            Acov[s * S : (s + 1) * S, t * S : (t + 1) * S] = c.T
    Fbig = torch.block_diag(*[F] * T)
    cov = Fbig @ Acov @ Fbig.T + V[0, 0] * torch.eye(T, dtype=torch.float64)
    mean = torch.stack(means) + (X * params["beta"]).sum(-1)
    return torch.distributions.MultivariateNormal(mean, cov).log_prob(y)


def test_likelihood_exact_dense_and_time_varying():
    T = 25
    d = simulate_retail(num_weeks=T, seed=3)
    m = RetailBSTS(**THESIS_MODEL, variant="RF", noise="gaussian", seasonal_harmonics=1)
    y, u, X = m._prepare(d.sales, d.spend, d.covariates, True)
    m._p, m._holiday_idx = X.shape[1], []
    f = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    params = dict(
        delta=f(d.truth["delta"]),
        q=(d.truth["q"].double() * m._u_scale / m._y_scale),
        beta=d.truth["beta"].double() * m._x_scale / m._y_scale,
        sigma_obs=f(0.3),
        sigma_goodwill=f(0.1),
        sigma_level=f(0.05),
        sigma_season=f(0.02),
    )
    dlm = m.state_space(params)
    ll = dlm.log_likelihood(y - m._mean_offset(params, u, X))
    dense = _dense_loglik(m, params, y, u, X, T)
    assert torch.allclose(ll, dense, rtol=1e-8, atol=1e-6)
    # Thesis form: augmented constant state c_t = 1 with time-varying G_t carrying the
    # input sum_i q_i u_{i,t-1}; regression as a mean term.
    phi = 1 - params["delta"]
    inflow = (u * params["q"]).sum(-1)
    Gt = torch.zeros(T, 2, 2, dtype=torch.float64)
    Gt[:, 0, 0], Gt[:, 1, 1] = phi, 1.0
    Gt[1:, 0, 1] = inflow[:-1]
    Wt = torch.diag(torch.stack([params["sigma_goodwill"] ** 2, f(0.0)]))
    start = float(_goodwill_before_the_data(params, u))
    na = LinearGaussian(
        Gt, f([[1.0, 0.0]]), Wt, f([start, 1.0]), torch.diag(f([1.0, 0.0])), time_varying=True
    )
    rest = dlm.components[1:]
    dlm2 = DLM([na] + rest, params["sigma_obs"])
    # The level's prior mean -D_1 as a shift of the data: y + D_1 has the level mu + D_1.
    ll2 = dlm2.log_likelihood(y + start - (X * params["beta"]).sum(-1))
    assert torch.allclose(ll, ll2, rtol=1e-8, atol=1e-6)


@pytest.mark.parametrize("spend_lag", [0, 1])
@pytest.mark.parametrize("num_weeks", [30, 52])
def test_goodwill_starts_as_the_simulator_does(spend_lag, num_weeks):
    # Noise-free goodwill of the simulator (which starts at the steady state of the series'
    # mean inflow) against the model's deterministic goodwill at the true delta and q: equal
    # when the series is at most 52 weeks long (the model's start uses the mean spend of the
    # first 52 weeks), up to (1 - delta)^52 (steady state against a year of history).
    d = simulate_retail(
        num_weeks=num_weeks, seed=5, goodwill_scale=0.0, spend_lag=spend_lag, delta=0.3
    )
    m = RetailBSTS(
        carryover="shared", effects="real", variant="RF", noise="gaussian", spend_lag=spend_lag
    )
    y, u, X = m._prepare(d.sales, d.spend, d.covariates, True)
    params = dict(
        delta=torch.tensor(0.3, dtype=torch.float64),
        q=d.truth["q"].double() * m._u_scale / m._y_scale,
    )
    D = m._goodwill(params, u)
    truth = d.truth["goodwill"].double()
    assert torch.allclose(D * m._y_scale, truth, rtol=1e-7)
    # The point mass's design carries the same start (linear in q).
    assert torch.allclose(m._adstock(params, u) @ params["q"], D, rtol=1e-12)
    # goodwill_start="zero" (D = 0 before the data) misses the steady state of the mean
    # inflow, decaying: phi^(t + 1 - lag) mean(q'u) / delta in week t (0-based).
    zero = RetailBSTS(
        carryover="shared",
        effects="real",
        variant="RF",
        noise="gaussian",
        spend_lag=spend_lag,
        goodwill_start="zero",
    )
    zero._prepare(d.sales, d.spend, d.covariates, True)
    D0 = zero._goodwill(params, u)
    steady = float(d.spend.double().mean(0) @ d.truth["q"].double()) / 0.3
    t = torch.arange(num_weeks, dtype=torch.float64)
    missed = steady * 0.7 ** (t + 1 - spend_lag)
    assert torch.allclose((D - D0) * m._y_scale, missed, rtol=1e-7)
    with pytest.raises(ValueError, match="goodwill_start"):
        RetailBSTS(**THESIS_MODEL, goodwill_start="steady-state")


def test_goodwill_start_stays_finite_as_delta_vanishes():
    # delta -> 0: a year of undecayed spend (52 x the mean inflow), not a diverging steady
    # state; delta = 1: only the last pre-sample week's spend (lag 1).
    d = simulate_retail(num_weeks=60, seed=2)
    m = RetailBSTS(**THESIS_MODEL, variant="RF", noise="gaussian")
    _, u, _ = m._prepare(d.sales, d.spend, d.covariates, True)
    ubar = u[:52].mean(0)
    delta = torch.tensor([0.0, 1e-12, 1.0], dtype=torch.float64, requires_grad=True)
    start = m._start({"delta": delta}, u)
    assert torch.allclose(start[0, 0], 52 * ubar) and torch.allclose(start[1, 5], 52 * ubar)
    assert torch.allclose(start[2, 0], ubar) and float(start[2, 1:].abs().max()) < 1e-300
    start.sum().backward()
    assert torch.isfinite(delta.grad).all()


@settings(max_examples=30, deadline=None)
@given(
    u1=st.floats(-8.0, 3.0),
    u2=st.floats(-12.0, 12.0),
)
def test_polar_transform_roundtrip_and_jacobian(u1, u2):
    t = PolarTransform()
    u = torch.tensor([u1, u2], dtype=torch.float64)
    x = t(u)
    assert (x > 0).all()
    assert torch.allclose(torch.hypot(x[0], x[1]), u[0].exp(), rtol=1e-12)
    assert torch.allclose(t.inv(x), u, rtol=1e-9, atol=1e-9)
    jac = torch.autograd.functional.jacobian(t, u)
    assert torch.allclose(t.log_abs_det_jacobian(u, x), jac.det().abs().log(), atol=1e-9)


def test_noise_scales_is_two_halfnormals_in_polar_coordinates():
    scale = torch.tensor([0.5, 0.2], dtype=torch.float64)
    d = NoiseScales(scale)
    assert isinstance(torch.distributions.biject_to(d.support), PolarTransform)
    x = torch.tensor([[0.3, 0.1], [1e-4, 2.0]], dtype=torch.float64)
    expected = dist.HalfNormal(scale).log_prob(x).sum(-1)
    assert torch.allclose(d.log_prob(x), expected)
    torch.manual_seed(0)
    draws = d.expand([4000]).sample()
    assert draws.shape == (4000, 2) and (draws > 0).all()
    # E|N(0, s^2)| = s sqrt(2 / pi), Monte Carlo sd ~ 0.6 s / sqrt(4000)
    assert torch.allclose(draws.mean(0), scale * math.sqrt(2 / math.pi), rtol=0.05)
    # The density of the unconstrained pair integrates to one (grid over R^2).
    g = torch.linspace(-12, 4, 801, dtype=torch.float64)
    h = torch.linspace(-25, 25, 1001, dtype=torch.float64)
    U = torch.stack(torch.meshgrid(g, h, indexing="ij"), -1)
    t = PolarTransform()
    X = t(U)
    dens = (d.log_prob(X) + t.log_abs_det_jacobian(U, X)).exp()
    mass = torch.trapezoid(torch.trapezoid(dens, h, dim=1), g)
    assert abs(float(mass) - 1.0) < 1e-3
    with pytest.raises(ValueError, match="scale"):
        NoiseScales(torch.ones(3))


def test_spike_slab_distribution():
    d = SpikeSlabNormal(torch.tensor([0.3, 1.0], dtype=torch.float64), 0.01, 1.0)
    v = torch.tensor([0.5, 0.5], dtype=torch.float64, requires_grad=True)
    lp = d.log_prob(v)
    ref0 = math.log(
        0.3 * math.exp(torch.distributions.Normal(0, 1.0).log_prob(torch.tensor(0.5)).item())
        + 0.7 * math.exp(torch.distributions.Normal(0, 0.01).log_prob(torch.tensor(0.5)).item())
    )
    assert abs(lp[0].item() - ref0) < 1e-6
    lp.sum().backward()
    assert torch.isfinite(v.grad).all()
    r = d.responsibility(torch.tensor([0.0, 0.0], dtype=torch.float64))
    assert r[0] < 0.1 and r[1] == 1.0


def test_fit_summaries_forecast(fitted, short_data):
    m, d = fitted, short_data
    assert set(m.rhat()) >= {"delta", "q", "beta", "sigma_obs"}
    c = m.coefficients()
    assert c["q"]["mean"].shape == (5,) and c["beta"]["mean"].shape == (7,)
    assert torch.allclose(c["ar"]["mean"], 1 - c["delta"]["mean"])
    assert m.inclusion_probabilities().shape == (7,)
    assert torch.equal(m.channel_inclusion_probabilities(), torch.ones(5, dtype=torch.float64))
    h = 4
    sf, xf = d.spend[-h:], d.covariates[-h:]
    fc = m.forecast(sf, xf)
    assert fc.shape == (m.samples["delta"].shape[0], h) and torch.isfinite(fc).all()
    assert m.num_channels == 5 and len(m.channel_names) == 5


def test_sales_moments_match_monte_carlo(fitted, short_data):
    m, d = fitted, short_data
    h = 3
    sf = d.spend[-h:].double().clone().requires_grad_(True)
    means, variances = m.sales_moments(sf, d.covariates[-h:], max_draws=20)
    assert means.shape == variances.shape == (20,)
    means.sum().backward()
    assert sf.grad is not None and sf.grad.abs().sum() > 0
    torch.manual_seed(0)
    draws = m.sample_sales(sf.detach(), d.covariates[-h:], num_samples=4000, max_draws=20)
    draws = draws.reshape(4000, 20)
    se = variances.detach().sqrt() / math.sqrt(4000)
    assert ((draws.mean(0) - means.detach()).abs() < 5 * se).all()
    assert torch.allclose(draws.var(0), variances.detach(), rtol=0.15)


def test_variants_and_pi():
    d = simulate_retail(num_weeks=30, seed=2)
    m = RetailBSTS(**THESIS_MODEL, variant="RA", expected_model_size=6)
    m.fit(
        d.sales,
        d.spend,
        d.covariates,
        method="sgld",
        num_samples=4,
        warmup_steps=2,
        num_particles=2,
        map_init_steps=0,
    )
    assert torch.allclose(m._pi_q, torch.full((5,), 0.5, dtype=torch.float64))
    assert "obs_precision" in m.samples and "obs_precision" not in m.rhat()
    assert m.channel_inclusion_probabilities().shape == (5,)
    b = RetailBSTS(
        **THESIS_MODEL,
        variant="B",
        noise="gaussian",
        trend="local_linear_trend",
        seasonal_harmonics=0,
    )
    b.fit(
        d.sales,
        d.spend,
        d.covariates,
        num_samples=4,
        warmup_steps=2,
        num_particles=2,
        map_init_steps=0,
    )
    assert "beta" not in b.samples and "sigma_slope" in b.samples
    assert torch.equal(b.inclusion_probabilities(), torch.zeros(7, dtype=torch.float64))
    rf = RetailBSTS(**THESIS_MODEL, variant="RF", holidays=["x5"])
    rf.fit(
        d.sales,
        d.spend,
        d.covariates,
        num_samples=4,
        warmup_steps=2,
        num_particles=2,
        map_init_steps=0,
    )
    assert rf._pi_b[5] == 1.0 and rf.inclusion_probabilities()[5] == 1.0


def test_errors():
    d = simulate_retail(num_weeks=20)
    for kw, name in [
        (dict(variant="X"), "variant"),
        (dict(noise="cauchy"), "noise"),
        (dict(trend="x"), "trend"),
        (dict(delta_range=(0.5, 1.5)), "delta_range"),
        (dict(delta_prior=(0.0, 1.0)), "delta_prior"),
        (dict(df=1.5), "df"),
    ]:
        with pytest.raises(ValueError, match=name):
            RetailBSTS(**kw)
    for kw, name in [
        (dict(variant=None), "variant must be a string"),
        (dict(seasonal_harmonics=1.5), "seasonal_harmonics must be an integer >= 0"),
        (dict(seasonal_period="52"), "seasonal_period must be a finite number > 2"),
        (dict(spend_lag=True), r"spend_lag must be an integer in \[0, 1\]"),
        (dict(carryover=1), "carryover must be a string"),
        (dict(delta_prior=(2.0, "2")), r"delta_prior\[1\] \(a Beta concentration\) must be"),
        (dict(q_scale=None), "q_scale must be a finite number > 0"),
    ]:
        with pytest.raises(TypeError, match=name):
            RetailBSTS(**kw)
    for kw, name in [
        (dict(num_weeks=20.0), TypeError),
        (dict(num_weeks=1), ValueError),
        (dict(noise=1), TypeError),
        (dict(delta=1.0), ValueError),
        (dict(spend_lag=2), ValueError),
    ]:
        with pytest.raises(name, match=next(iter(kw))):
            simulate_retail(**kw)
    m = RetailBSTS(**THESIS_MODEL)
    bad = d.spend.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="spend"):
        m.fit(d.sales, bad, d.covariates)
    with pytest.raises(ValueError, match="spend"):
        m.fit(d.sales, -d.spend, d.covariates)
    with pytest.raises(ValueError, match="spend"):
        m.fit(d.sales, d.spend[:-1], d.covariates)
    with pytest.raises(ValueError, match="covariates"):
        m.fit(d.sales, d.spend, d.covariates[:-1])
    with pytest.raises(ValueError, match="method"):
        m.fit(d.sales, d.spend, d.covariates, method="gibbs")
    with pytest.raises(ValueError, match="fit"):
        m.coefficients()


def _sales_with(weeks, values):
    sales = simulate_retail(num_weeks=20).sales.clone()
    sales[weeks] = torch.tensor(values, dtype=sales.dtype)
    return sales


@pytest.mark.parametrize(
    "sales, standardize, match",
    [
        (_sales_with([7], [math.inf]), True, r"sales must be finite.*sales\[7\] is inf"),
        (_sales_with([3, 9], [-math.inf, math.inf]), True, r"sales\[3\] is -inf \(first of 2"),
        (_sales_with(slice(None), [math.nan]), True, "sales has 0 observed"),
        (_sales_with(slice(None), [math.nan]), False, "sales has 0 observed"),
        (_sales_with(slice(1, None), [math.nan]), True, "sales has 1 observed .* at least 2"),
    ],
)
def test_fit_refuses_sales_it_cannot_handle(sales, standardize, match):
    d = simulate_retail(num_weeks=20)
    with pytest.raises(ValueError, match=match):
        RetailBSTS(**THESIS_MODEL).fit(sales, d.spend, d.covariates, standardize=standardize)


def test_fit_with_missing_sales_stays_finite():
    # NaN marks a missing week, marginalised by the Kalman filter: it must still fit.
    d = simulate_retail(num_weeks=30, seed=1, noise="gaussian")
    sales = d.sales.clone()
    sales[::3] = math.nan
    m = RetailBSTS(**THESIS_MODEL, variant="B", noise="gaussian", seasonal_harmonics=0)
    m.fit(
        sales,
        d.spend,
        d.covariates,
        num_samples=4,
        warmup_steps=4,
        num_particles=2,
        map_init_steps=0,
        rhat_target=None,
    )
    assert torch.isfinite(m.coefficients()["q"]["mean"]).all()


def test_one_step_predictions_refuse_infinite_sales(fitted, short_data):
    d = short_data
    sales = d.sales.clone()
    sales[5] = math.inf
    with pytest.raises(ValueError, match=r"sales\[5\] is inf"):
        fitted.one_step_predictions(sales, d.spend, d.covariates, max_draws=1)


@pytest.mark.slow
def test_recovery_sgld():
    d = simulate_retail(num_weeks=234, seed=0, noise="gaussian")
    m = RetailBSTS(**THESIS_MODEL, variant="RF", noise="gaussian")
    m.fit(d.sales, d.spend, d.covariates, method="sgld", seed=0)
    c = m.coefficients()
    assert abs(c["delta"]["mean"] - d.truth["delta"]) < 3 * c["delta"]["sd"] + 0.05
    z = (c["q"]["mean"] - d.truth["q"].double()).abs() / c["q"]["sd"]
    assert (z < 3.5).all()
    inc = dict(zip(d.covariate_names, m.inclusion_probabilities().tolist()))
    # Strong true effects are selected and a stationary null covariate is not. The random-walk
    # null covariates (unemployment, price and confidence indices) are not asserted on: a
    # random-walk regressor can stand in for part of the local level (spurious regression),
    # and the well-mixed posterior does include some of them for this seed.
    assert inc["avg_temp"] > 0.9 and inc["hols"] > 0.9
    assert inc["avg_rain"] < 0.3


# In the integration run (`make test-integration`, CI): a recovery on the full 234-week
# simulation, 300 SVI steps of 4 particles (about a minute). The default run keeps
# test_vis_fit_reports_its_draws_as_pseudo_chains, the same fit path on a short series.
@pytest.mark.integration
def test_recovery_vis():
    # fit(method="vis"): an AutoNormal refined by 5 Adam-preconditioned Langevin steps
    # (on the narrow spike: a guide cannot hold the point mass's indicators).
    d = simulate_retail(num_weeks=234, seed=0, noise="gaussian")
    m = RetailBSTS(**THESIS_MODEL, variant="RF", selection="ssvs", noise="gaussian")
    m.fit(
        d.sales,
        d.spend,
        d.covariates,
        method="vis",
        seed=0,
        num_steps=300,
        num_samples=50,
        num_particles=4,
    )
    c = m.coefficients()
    assert c["q"]["mean"].shape == (5,) and m.samples["delta"].shape == (200,)
    assert abs(c["delta"]["mean"] - d.truth["delta"]) < 3 * c["delta"]["sd"] + 0.05
    z = (c["q"]["mean"] - d.truth["q"].double()).abs() / c["q"]["sd"]
    assert (z < 3.5).all()


def test_vis_fit_reports_its_draws_as_pseudo_chains(short_data):
    # The default run's check of fit(method="vis") (test_recovery_vis, in the integration
    # run, checks what it recovers): the refined guide's draws come back as num_particles
    # pseudo-chains of num_samples draws each, in every summary.
    d = short_data
    m = RetailBSTS(
        **THESIS_MODEL, variant="RF", selection="ssvs", noise="gaussian", seasonal_harmonics=1
    )
    m.fit(
        d.sales,
        d.spend,
        d.covariates,
        method="vis",
        seed=0,
        num_steps=20,
        num_samples=5,
        num_particles=2,
    )
    assert m._chains["delta"].shape == (2, 5) and m.samples["delta"].shape == (10,)
    assert m.samples["q"].shape == (10, 5) and m.samples["beta"].shape == (10, 7)
    c = m.coefficients()
    assert c["q"]["mean"].shape == (5,) and c["beta"]["mean"].shape == (7,)
    assert all(torch.isfinite(c[n]["mean"]).all() for n in ("delta", "q", "beta", "sigma_obs"))
    assert set(m.rhat()) == set(m.static_sites())


def test_vis_divergence_is_reported(short_data):
    d = short_data
    m = RetailBSTS(
        **THESIS_MODEL, variant="RF", selection="ssvs", noise="gaussian", seasonal_harmonics=1
    )
    with pytest.raises(RuntimeError, match="diverged at SVI iteration"):
        m.fit(
            d.sales,
            d.spend,
            d.covariates,
            method="vis",
            seed=0,
            num_steps=50,
            sampler="sgld",
            step_size=1.0,
        )


def test_allocation_integration(fitted):
    from pyro_ext.models.bsts import allocate_budget, evaluate_strategies

    # With spend_lag=1 the allocator counts the sales of the week the plan's spend reaches.
    budget = 100.0
    res = allocate_budget(fitted, budget=budget)
    assert float(res.spend.sum()) <= budget * (1 + 1e-6) and (res.spend >= 0).all()
    uniform = torch.full((1, fitted.num_channels), budget / fitted.num_channels)
    corners = budget * torch.eye(fitted.num_channels)
    others = evaluate_strategies(fitted, torch.cat([uniform, corners]))
    assert res.mean >= float(others.mean.max()) - 1e-6 * abs(res.mean)


def test_allocation_with_saturation_spreads_the_budget_to_equal_marginal_returns(short_data):
    # With diminishing returns the expected sales are concave in the spend, so the best
    # split equalises the marginal return of every channel it spends on (KKT); without
    # the curve, at the same draws, one channel takes the whole budget.
    from pyro_ext.models.bsts import allocate_budget

    d = short_data
    m = RetailBSTS(
        variant="RF", noise="gaussian", seasonal_harmonics=0, spend_lag=0, saturation="hill"
    )
    quick_fit(m, d, num_samples=10, warmup_steps=20, map_init_steps=30)
    budget = float(d.spend.double().sum(1).mean())
    bent = dict(m.samples, saturation=torch.full_like(m.samples["saturation"], 3.0))
    flat = dict(m.samples, saturation=torch.zeros_like(m.samples["saturation"]))

    def marginal_returns(spend):
        spend = spend.detach().clone().reshape(1, -1).requires_grad_(True)
        means, _ = m.sales_moments(spend)
        (grad,) = torch.autograd.grad(means.mean(), spend)
        return grad[0]

    m.samples = flat
    linear = allocate_budget(m, budget=budget)
    assert int((linear.spend > 1e-3 * budget).sum()) == 1
    m.samples = bent
    res = allocate_budget(m, budget=budget)
    spent = res.spend > 1e-3 * budget
    assert int(spent.sum()) >= 2
    returns = marginal_returns(res.spend)
    best = returns[spent].max()
    assert torch.allclose(returns[spent], best.expand(int(spent.sum())), rtol=0.02)
    assert bool((returns[~spent] <= best * 1.02).all())
    assert float(res.spend.sum()) == pytest.approx(budget, rel=1e-4)


def test_fit_is_seeded_by_its_seed_and_leaves_the_callers_random_stream(short_data):
    def fit(seed):
        m = RetailBSTS(variant="RF", noise="gaussian", seasonal_harmonics=0)
        return quick_fit(m, short_data, seed=seed).samples["q"]

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    first = fit(seed=5)
    assert torch.equal(torch.rand(3), expected)  # as if fit had not run
    torch.manual_seed(999)
    assert torch.equal(fit(seed=5), first)  # whatever the global state
    assert not torch.equal(fit(seed=6), first)


def test_goodwill_offset_batched_and_extremes():
    # FFT convolution == the recursion, per draw, for phi in [0, 1] and a long series.
    T = 300
    phi = torch.tensor([0.0, 1e-3, 0.5, 0.97, 1.0], dtype=torch.float64)
    x = torch.randn(5, T, dtype=torch.float64)
    D = goodwill_offset(phi, x)
    ref = torch.zeros(5, T, dtype=torch.float64)
    for t in range(1, T):
        ref[:, t] = phi * ref[:, t - 1] + x[:, t - 1]
    assert torch.allclose(D, ref, rtol=1e-10, atol=1e-9)
    p = torch.tensor(0.6, dtype=torch.float64, requires_grad=True)
    goodwill_offset(p, x[2]).sum().backward()
    assert torch.isfinite(p.grad)


@pytest.mark.slow
def test_delta_and_q_interval_coverage_over_seeds():
    # Issue 5: the true decay and spend effects lie in their central 90 % posterior intervals
    # at about the nominal rate over simulator seeds (two training years, the default fit).
    # beta is left out: the simulator's Christmas and Easter bumps, which a 2-harmonic
    # seasonal cannot follow, load on the holiday dummy (see benchmarks/bsts.py).
    covered = total = 0
    for seed in range(4):
        d = simulate_retail(num_weeks=104, seed=seed, noise="gaussian")
        m = RetailBSTS(**THESIS_MODEL, variant="RF", noise="gaussian")
        m.fit(d.sales, d.spend, d.covariates, method="sgld", seed=seed)
        draws = torch.cat([m.samples["delta"][:, None], m._orig_q(m.samples["q"])], -1)
        truth = torch.tensor([d.truth["delta"], *d.truth["q"].tolist()], dtype=torch.float64)
        lo, hi = torch.quantile(draws, torch.tensor([0.05, 0.95], dtype=torch.float64), 0)
        covered += int(((lo <= truth) & (truth <= hi)).sum())
        total += truth.numel()
    # Binomial(24, 0.9): P(covered < 19) = 0.03; a miscalibrated posterior (e.g. a wrong
    # Jacobian or a stuck chain) covers far less.
    assert covered >= 19, (covered, total)


@pytest.mark.slow
def test_default_fit_converges():
    # Issue 5: the default SG-MCMC fit (preconditioned SGHMC, 8 particles) reaches
    # split-R-hat < 1.05 on every static parameter.
    d = simulate_retail(num_weeks=208, seed=0, noise="gaussian")
    m = RetailBSTS(**THESIS_MODEL, variant="RF", noise="gaussian")
    m.fit(d.sales, d.spend, d.covariates, method="sgld", seed=0)
    worst = max(float(r.max()) for r in m.rhat().values())
    assert worst < 1.05, m.rhat()
    c = m.coefficients()
    assert abs(c["delta"]["mean"] - d.truth["delta"]) < 3 * c["delta"]["sd"] + 0.05


def test_one_step_predictions_decompose_the_likelihood(fitted, short_data):
    # Prediction-error decomposition: for a single posterior draw, the one-step-ahead
    # Gaussian densities multiply to the Kalman likelihood of the whole series.
    d = short_data
    mean, sd = fitted.one_step_predictions(d.sales, d.spend, d.covariates, max_draws=1)
    one_step = torch.distributions.Normal(mean, sd).log_prob(d.sales.double()).sum()
    draw = {n: v[:1] for n, v in fitted._draw_subset(1).items()}
    y = (d.sales.double() - fitted._y_loc) / fitted._y_scale
    u = d.spend.double() / fitted._u_scale
    X = (d.covariates.double() - fitted._x_loc) / fitted._x_scale
    dlm = fitted.state_space(draw)
    log_lik = dlm.log_likelihood(y - fitted._mean_offset(draw, u, X))
    expected = float(log_lik) - y.shape[0] * math.log(float(fitted._y_scale))
    assert abs(float(one_step) - expected) < 1e-6 * abs(expected)


def test_simulator_random_truth_deterministic_and_varies():
    d = simulate_retail(num_weeks=80, seed=100, random_truth=True)
    again = simulate_retail(num_weeks=80, seed=100, random_truth=True)
    assert torch.equal(d.sales, again.sales)
    for key, value in d.truth.items():
        other = again.truth[key]
        assert torch.equal(value, other) if torch.is_tensor(value) else value == other, key
    assert d.truth["random_truth"] is True
    assert {"channel_inclusion", "channel_effect", "covariate_effect"} <= set(d.truth)
    # Same spend, covariates and state noise as the fixed truth; only the truth differs.
    fixed = simulate_retail(num_weeks=80, seed=100)
    assert torch.equal(d.spend, fixed.spend) and torch.equal(d.covariates, fixed.covariates)
    assert "random_truth" not in fixed.truth
    # The truths vary across seeds.
    truths = [simulate_retail(num_weeks=40, seed=s, random_truth=True).truth for s in range(10)]
    assert len({t["delta"] for t in truths}) == 10
    assert len({tuple(t["inclusion"].tolist()) for t in truths}) >= 5
    assert len({tuple(t["channel_inclusion"].tolist()) for t in truths}) >= 3
    # The discrete truth and the effect sizes do not depend on the series length.
    longer = simulate_retail(num_weeks=200, seed=100, random_truth=True).truth
    assert longer["delta"] == d.truth["delta"]
    assert torch.equal(longer["inclusion"], d.truth["inclusion"])
    assert torch.equal(longer["covariate_effect"], d.truth["covariate_effect"])
    assert torch.equal(longer["channel_effect"], d.truth["channel_effect"])


def test_simulator_random_truth_constraints():
    f64 = torch.float64
    included_count, null_count, signs = torch.zeros(7), torch.zeros(7), []
    for seed in range(50):
        d = simulate_retail(num_weeks=120, seed=seed, random_truth=True, dtype=f64)
        t = d.truth
        assert 0.15 < t["delta"] < 0.6 and t["ar"] == 1 - t["delta"]
        on = t["channel_inclusion"]
        assert int(on.sum()) >= 2
        assert torch.equal(on, t["q"] != 0) and (t["q"][~on] == 0).all()
        assert (t["q"][on] > 0).all()
        effect = t["channel_effect"]
        assert ((effect[on] >= 0.75) & (effect[on] <= 2.0)).all() and (effect[~on] == 0).all()
        inc = t["inclusion"]
        assert 1 <= int(inc.sum()) <= 4 and torch.equal(inc, t["beta"] != 0)
        assert (t["beta"][~inc] == 0).all()
        # One sd of a true covariate moves sales by 0.5-1.5 noise sds.
        moved = (t["beta"] * d.covariates.std(0)).abs() / t["noise_scale"]
        assert ((moved[inc] >= 0.5 - 1e-9) & (moved[inc] <= 1.5 + 1e-9)).all()
        assert torch.allclose(t["beta"] * d.covariates.std(0), t["covariate_effect"])
        assert torch.isfinite(d.sales).all()
        included_count += inc
        null_count += ~inc
        signs += t["beta"][inc].sign().tolist()
    # Each covariate, the random walks included, is sometimes true and sometimes null; about
    # 40 % of them are true (Bernoulli(0.4) conditioned on 1-4 of 7: about 0.37); both signs.
    assert (included_count > 0).all() and (null_count > 0).all()
    assert 0.25 < float(included_count.sum()) / (50 * 7) < 0.5
    assert 1.0 in signs and -1.0 in signs


def test_simulator_random_truth_refuses_a_given_truth():
    for kw in (dict(delta=0.3), dict(q=(0.1,) * 5), dict(beta=(0.0,) * 7)):
        with pytest.raises(ValueError, match="random_truth"):
            simulate_retail(num_weeks=20, random_truth=True, **kw)
    with pytest.raises(TypeError, match="random_truth"):
        simulate_retail(num_weeks=20, random_truth="yes")
    # Explicit values still work without random_truth, and the defaults are today's.
    d = simulate_retail(num_weeks=20, delta=0.5, q=(0.0,) * 5)
    assert d.truth["delta"] == 0.5 and (d.truth["q"] == 0).all()
    d = simulate_retail(num_weeks=20)
    assert d.truth["delta"] == 0.3
    assert torch.allclose(d.truth["beta"], torch.tensor([0.4, 0, 0, 0, 0, 2.5, -1.5]))


def test_simulator_without_seasonal_spend_keeps_the_draws_and_flattens_the_spend():
    seasonal = simulate_retail(num_weeks=104, seed=3, random_truth=True)
    even = simulate_retail(num_weeks=104, seed=3, random_truth=True, seasonal_spend=False)
    online, search = 2, 3  # their spend rises with the Christmas / summer peaks in demand
    others = [0, 1, 4]
    assert torch.equal(seasonal.spend[:, others], even.spend[:, others])
    assert torch.equal(seasonal.covariates, even.covariates)
    assert seasonal.truth["delta"] == even.truth["delta"]
    assert torch.equal(seasonal.truth["channel_inclusion"], even.truth["channel_inclusion"])
    # The same noise draws, without the seasonal factor: the ratio is that factor, >= 1,
    # up to 1.3 at Christmas and 1.5 in the summer, and 1 away from the peaks.
    for channel, peak in ((online, 1.3), (search, 1.5)):
        ratio = seasonal.spend[:, channel] / even.spend[:, channel]
        assert float(ratio.min()) == pytest.approx(1.0, abs=1e-6)
        assert 0.95 * peak < float(ratio.max()) <= peak + 1e-9
    with pytest.raises(TypeError, match="seasonal_spend must be a bool"):
        simulate_retail(num_weeks=20, seasonal_spend="no")


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="issue 17, blocked: no method reaches both targets on this simulator. "
    "benchmarks/results/bsts_selection.md measures 0.75 (true) and 0.40 (null) for RF at the "
    "default prior, next to 0.79 and 0.42 for the exact oracle of the model's form (the "
    "level unknown, a 2-harmonic seasonal), which meets both targets at none of 24 priors",
)
def test_point_mass_selection_on_random_truths():
    # Variable selection on truths the model has not seen (benchmarks/bsts_selection.py,
    # whose seeds are 100-109; these are others): with the point-mass prior, variant RF,
    # Gaussian noise as simulated and the default fit, the true covariates get a mean
    # posterior inclusion probability of at least 0.8 and the null ones (random walks and
    # the rest) at most 0.2.
    true_p, null_p = [], []
    for seed in range(200, 210):
        d = simulate_retail(num_weeks=234, seed=seed, random_truth=True)
        m = RetailBSTS(**THESIS_MODEL, variant="RF", selection="point_mass", noise="gaussian")
        m.fit(
            d.sales[:104],
            d.spend[:104],
            d.covariates[:104],
            method="sgld",
            seed=seed,
            covariate_names=d.covariate_names,
        )
        p, truth = m.inclusion_probabilities(), d.truth["inclusion"]
        true_p += p[truth].tolist()
        null_p += p[~truth].tolist()
    assert sum(true_p) / len(true_p) >= 0.8, true_p
    assert sum(null_p) / len(null_p) <= 0.2, null_p


# ---------------------------------------------------------------- per-channel carry-over
def _channel_goodwill_by_hand(delta, q, u, lag, weeks=52):
    """D_{i,t} = phi_i D_{i,t-1} + q_i u_{i,t-lag}, started by 52 weeks of each channel's
    mean spend over the first min(T, 52) weeks (thesis eq. (1.4) per channel)."""
    T, k = u.shape
    out = torch.zeros(T, k, dtype=torch.float64)
    for i in range(k):
        phi, ubar = 1 - float(delta[i]), float(u[:weeks, i].mean())
        D = 0.0
        for _ in range(52):  # the year before the data
            D = phi * D + q[i] * ubar
        if lag == 1:
            out[0, i] = D
            for t in range(1, T):
                out[t, i] = phi * out[t - 1, i] + q[i] * u[t - 1, i]
        else:
            for t in range(T):
                D = phi * D + q[i] * u[t, i]
                out[t, i] = D
    return out


@pytest.mark.parametrize("spend_lag", [0, 1])
def test_per_channel_goodwill_is_the_recursion_written_out(spend_lag):
    d = simulate_retail(num_weeks=40, seed=4)
    m = RetailBSTS(variant="RF", noise="gaussian", spend_lag=spend_lag)
    assert m.carryover == "per_channel"
    y, u, X = m._prepare(d.sales, d.spend, d.covariates, True)
    delta = torch.tensor([0.1, 0.3, 0.5, 0.7, 0.9], dtype=torch.float64)
    q = torch.tensor([0.2, -0.1, 0.3, 0.05, 0.4], dtype=torch.float64)
    params = dict(delta=delta, q=q)
    expected = _channel_goodwill_by_hand(delta, q.tolist(), u, spend_lag)
    assert torch.allclose(m._channel_goodwill(params, u), expected, rtol=1e-10, atol=1e-12)
    assert torch.allclose(m._goodwill(params, u), expected.sum(-1), rtol=1e-10)
    # The point mass's design is the same goodwill per unit of q, batched over draws.
    batch = dict(delta=torch.stack([delta, delta.flip(0)]), q=q)
    design = m._adstock(batch, u)
    assert design.shape == (2, 40, 5)
    assert torch.allclose(design[0] * q, expected, rtol=1e-10, atol=1e-12)
    flipped = _channel_goodwill_by_hand(delta.flip(0), q.tolist(), u, spend_lag)
    assert torch.allclose(design[1] * q, flipped, rtol=1e-10, atol=1e-12)
    # The unexplained goodwill (the AR(1) state) decays at the channels' mean rate.
    params.update(
        noise_scales=torch.tensor([0.3, 0.1], dtype=torch.float64),
        sigma_level=torch.tensor(0.05, dtype=torch.float64),
        sigma_season=torch.tensor(0.02, dtype=torch.float64),
    )
    G = m.state_space(m._params_of(params)).matrices(1).transition_matrix
    assert float(G[..., 0, 0].reshape(-1)[0]) == pytest.approx(1 - 0.5)
    # The shared decay is the thesis' eq. (1.4): every channel at the same rate.
    shared = RetailBSTS(variant="RF", noise="gaussian", spend_lag=spend_lag, carryover="shared")
    shared._prepare(d.sales, d.spend, d.covariates, True)
    same = dict(delta=torch.tensor(0.3, dtype=torch.float64), q=q)
    expected = _channel_goodwill_by_hand(
        torch.full((5,), 0.3, dtype=torch.float64), q.tolist(), u, spend_lag
    )
    assert torch.allclose(shared._goodwill(same, u), expected.sum(-1), rtol=1e-10)


@pytest.mark.parametrize(
    "spend_lag, carryover, saturation",
    [
        (0, "per_channel", None),
        (1, "per_channel", None),
        (0, "shared", None),
        (1, "shared", None),
        (0, "per_channel", "hill"),
        (1, "shared", "hill"),
    ],
)
def test_forecast_goodwill_continues_the_training_recursion(spend_lag, carryover, saturation):
    # The goodwill the forecast adds after the training weeks is the training recursion run
    # on over the future spend, per draw and channel (through the same saturation curve,
    # whose mean stock stays the training weeks').
    d = simulate_retail(num_weeks=50, seed=6, noise="gaussian")
    m = RetailBSTS(
        variant="RF",
        noise="gaussian",
        seasonal_harmonics=0,
        spend_lag=spend_lag,
        carryover=carryover,
        saturation=saturation,
    )
    m.fit(
        d.sales[:40],
        d.spend[:40],
        d.covariates[:40],
        num_samples=4,
        warmup_steps=4,
        num_particles=2,
        map_init_steps=10,
        rhat_target=None,
    )
    uf = d.spend[40:].double() / m._u_scale
    Xf = torch.zeros(10, m._p, dtype=torch.float64)
    draws = m._draw_subset(8)
    state = m._end_state(draws)
    params, D_1 = state[-1], state[-2]
    future = m._future_offset(params, state[-3], D_1, uf, Xf)
    _, u, _ = m._data
    whole = m._goodwill(params, torch.cat([u, uf]))
    assert torch.allclose(whole[:, 0], D_1, rtol=1e-12)
    # The filtered level holds mu + D_1, so the future offset is taken from D_1.
    assert torch.allclose(future, whole[:, 40:] - D_1[:, None], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("spend_lag", [0, 1])
def test_saturation_is_the_hill_curve_of_each_stock_written_out(spend_lag):
    # D_{i,t} = q_i S_{i,t} / (1 + lambda_i S_{i,t} / mean_t S_{i,t}), S the recursion of
    # eq. (1.4) on the channel's own spend, written out by hand (no goodwill before the data).
    d = simulate_retail(num_weeks=30, seed=3, noise="gaussian")
    m = RetailBSTS(
        variant="RF",
        noise="gaussian",
        spend_lag=spend_lag,
        goodwill_start="zero",
        saturation="hill",
    )
    m._data = m._prepare(d.sales, d.spend, d.covariates, True)
    _, u, _ = m._data
    k = u.shape[1]
    params = dict(
        delta=torch.linspace(0.2, 0.6, k, dtype=torch.float64),
        q=torch.linspace(0.5, 1.5, k, dtype=torch.float64),
        saturation=torch.linspace(0.0, 2.0, k, dtype=torch.float64),
    )
    expected = torch.zeros(u.shape[0], k, dtype=torch.float64)
    for i in range(k):
        phi, stock, stocks = 1 - float(params["delta"][i]), 0.0, []
        for t in range(u.shape[0]):
            stock = phi * stock + (float(u[t - spend_lag, i]) if t >= spend_lag else 0.0)
            stocks.append(stock)
        mean, bend = sum(stocks) / len(stocks), float(params["saturation"][i])
        for t, s in enumerate(stocks):
            expected[t, i] = float(params["q"][i]) * s / (1 + bend * s / mean)
    assert torch.allclose(m._channel_goodwill(params, u), expected, rtol=1e-10, atol=1e-12)
    # lambda = 0 is the linear model, and the bend only lowers the goodwill.
    linear = RetailBSTS(variant="RF", noise="gaussian", spend_lag=spend_lag, goodwill_start="zero")
    linear._data = m._data
    flat = dict(params, saturation=torch.zeros(k, dtype=torch.float64))
    assert torch.allclose(m._goodwill(flat, u), linear._goodwill(params, u), rtol=1e-12)
    assert bool((m._goodwill(params, u) <= linear._goodwill(params, u) + 1e-12).all())


@pytest.mark.parametrize("saturation", [None, "hill"])
def test_roas_prior_is_the_elicited_log_normal_whatever_the_decay(short_data, saturation):
    # Prior draws of (delta, q) under roas_prior={"tv": (2, 0.5)}: the ROAS over the training
    # weeks that they imply (through the model's own roas()) is LogNormal with mean 2 and
    # sd 0.5, independent of delta; the other channels keep q ~ HalfNormal(q_scale).
    d = short_data
    m = RetailBSTS(
        variant="RF",
        noise="gaussian",
        seasonal_harmonics=0,
        spend_lag=1,
        saturation=saturation,
        roas_prior={"tv": (2.0, 0.5), 3: (0.4, 0.2)},
    )
    quick_fit(m, d, channel_names=d.channel_names, num_samples=2, warmup_steps=2, map_init_steps=0)
    k, n = len(d.channel_names), 20000
    pyro.set_rng_seed(0)
    with pyro.plate("draws", n):
        params = m._sample_params(k, m._p)
    m.samples = dict(
        delta=params["delta"],
        q=params["q"],
        sigma_obs=params["sigma_obs"],
        **({"saturation": params["saturation"]} if saturation else {}),
    )
    roas = m.roas()  # (n, k)
    for i, (mean, sd) in ((0, (2.0, 0.5)), (3, (0.4, 0.2))):
        var = math.log1p((sd / mean) ** 2)
        log_roas = roas[:, i].log()
        assert float(log_roas.mean()) == pytest.approx(math.log(mean) - var / 2, abs=0.01)
        assert float(log_roas.std()) == pytest.approx(math.sqrt(var), rel=0.02)
        decay = params["delta"][:, i]
        assert abs(float(torch.corrcoef(torch.stack([log_roas, decay]))[0, 1])) < 0.03
    q = m._orig_q(params["q"]) * m._u_scale / m._y_scale  # standardised again
    for i in (1, 2, 4):
        assert float(q[:, i].mean()) == pytest.approx(m.q_scale * math.sqrt(2 / math.pi), rel=0.03)


# 10-30 s: in the integration run (`make test-integration`, CI), not the default one.
@pytest.mark.integration
def test_a_tight_roas_prior_moves_the_posterior_there(short_data):
    # A lift test that says TV returns 3x what the data do: with a tight prior, TV's
    # posterior ROAS sits at the prior's mean; without it, near the simulator's truth.
    d = short_data
    truth = d.truth["channel_contribution"].double().sum(0) / d.spend.double().sum(0)
    options = dict(num_samples=40, warmup_steps=60, num_particles=4, map_init_steps=50)
    target = 3 * float(truth[0])
    roas = {}
    for prior in (None, {"tv": (target, 0.03 * target)}):
        m = RetailBSTS(variant="RF", noise="gaussian", seasonal_harmonics=1, roas_prior=prior)
        quick_fit(m, d, channel_names=d.channel_names, **options)
        roas[prior is None] = float(m.roas()[:, 0].mean())
    assert roas[False] == pytest.approx(target, rel=0.1)
    assert abs(roas[True] - float(truth[0])) < abs(roas[True] - target)


# A fit that only reads the data in (the model's set-up), for tests of the model's terms.
SET_UP_ONLY = dict(
    num_samples=2, warmup_steps=2, num_particles=2, map_init_steps=1, rhat_target=None
)


def _start_log_joint(m, start):
    """The log joint (every indicator on) at a start ``{site: value}``."""
    model = m._all_indicators_on(m.model)
    with pyro.poutine.block(), torch.no_grad():
        conditioned = pyro.poutine.condition(model, start)
        return float(pyro.poutine.trace(conditioned).get_trace(*m._data).log_prob_sum())


def test_the_start_scales_q_to_the_data():
    # q's prior median puts every channel's goodwill at several sales sds: the start scales
    # it down to where the data put it, and the log joint there beats the prior median's.
    d = simulate_retail(num_weeks=104, seed=7, random_truth=True)
    m = RetailBSTS(spend_lag=1)
    m.fit(d.sales, d.spend, d.covariates, **SET_UP_ONLY)
    start = m._start_values()
    prior_median = m.q_scale * dist.HalfNormal(1.0).icdf(torch.tensor(0.5)).item()
    # (Pyro's init_to_median is the median of a few prior draws: near, not at, the exact.)
    assert float((start["q"] / prior_median).max()) < 0.5
    at_median = dict(start, q=torch.full_like(start["q"], prior_median))
    assert _start_log_joint(m, start) > _start_log_joint(m, at_median) + 100


@pytest.mark.integration
def test_the_default_lag_choice_compares_nearly_converged_bounds(monkeypatch):
    # 25 s: in the integration run (`make test-integration`, CI), not the default one.
    # From q's prior median the 150-step AutoNormal of lag 1 ended 100 nats below its
    # converged ELBO (-78 after 2000 steps) on this series; from the scaled start, within a
    # few nats, so the lag's bounds compare models, not optimisation lags.
    import pyro_ext.models.bsts.fit as fitting

    d = simulate_retail(num_weeks=104, seed=7, random_truth=True)
    options = dict(num_samples=2, warmup_steps=2, num_particles=2, rhat_target=None, seed=7)
    elbo, scaled = {}, fitting.INIT_Q_FACTORS
    for factors in [scaled, (1.0,)]:
        monkeypatch.setattr(fitting, "INIT_Q_FACTORS", factors)
        m = RetailBSTS().fit(d.sales, d.spend, d.covariates, **options)
        assert m.spend_lag == 1
        elbo[factors] = m.spend_lag_evidence[1][0]
    assert elbo[scaled] > -90
    assert elbo[scaled] > elbo[(1.0,)] + 50


@pytest.mark.parametrize("truth", [0, 1])
def test_spend_lag_auto_chooses_the_simulated_lag(truth):
    d = simulate_retail(num_weeks=104, seed=2, noise="gaussian", spend_lag=truth)
    m = RetailBSTS(variant="RF", noise="gaussian", seasonal_harmonics=1)
    assert m.spend_lag_requested == "auto" and m.spend_lag is None
    with pytest.raises(ValueError, match="spend_lag='auto' is chosen by fit"):
        m._adstock({"delta": torch.full((5,), 0.3)}, torch.ones(10, 5))
    m.fit(
        d.sales,
        d.spend,
        d.covariates,
        num_samples=4,
        warmup_steps=4,
        num_particles=2,
        map_init_steps=60,
        rhat_target=None,
    )
    assert m.spend_lag == truth
    (elbo0, sd0), (elbo1, sd1) = m.spend_lag_evidence[0], m.spend_lag_evidence[1]
    gap = elbo1 - elbo0 if truth else elbo0 - elbo1
    assert gap > 5 * (sd0**2 + sd1**2) ** 0.5
    with pytest.raises(ValueError, match="spend_lag must be 0, 1 or 'auto'"):
        RetailBSTS(spend_lag="automatic")


def test_retail_bsts_fits_and_answers_on_the_data_device(device):
    # The whole marketer's path (fit, contributions, ROAS, response curves, forecast,
    # allocation) with the saturation curve and a ROAS prior, on the device the data live
    # on: every answer stays there and is finite, and the goodwill (the curve on each
    # channel's stock) equals the CPU's at the same parameters.
    d = simulate_retail(num_weeks=40, seed=3, noise="gaussian")
    on_device = d._replace(
        sales=d.sales.to(device), spend=d.spend.to(device), covariates=d.covariates.to(device)
    )
    options = dict(variant="RF", noise="gaussian", seasonal_harmonics=1, saturation="hill")
    m = RetailBSTS(**options, roas_prior={"tv": (2.0, 0.5)})
    quick_fit(m, on_device, channel_names=d.channel_names)
    k = d.spend.shape[1]
    answers = {
        "contributions": m.channel_contributions(),
        "roas": m.roas(),
        "response_curves": m.response_curves(torch.tensor([5.0, 10.0], device=device)),
        "forecast": m.forecast(d.spend[-4:].to(device), d.covariates[-4:].to(device)),
    }
    for name, value in answers.items():
        assert value.device == device, name
        assert bool(torch.isfinite(value).all()), name
    allocation = allocate_budget(m, budget=float(d.spend[-10:].sum(1).mean()))
    assert allocation.spend.device == device, allocation.spend.device
    assert float(allocation.spend.sum()) <= float(d.spend[-10:].sum(1).mean()) * (1 + 1e-6)

    params = dict(
        delta=torch.linspace(0.2, 0.6, k, dtype=torch.float64),
        q=torch.linspace(0.5, 1.5, k, dtype=torch.float64),
        saturation=torch.linspace(0.0, 2.0, k, dtype=torch.float64),
    )
    cpu = RetailBSTS(**options, spend_lag=0)
    cpu._data = cpu._prepare(d.sales, d.spend, d.covariates, True)
    dev = RetailBSTS(**options, spend_lag=0)
    dev._data = dev._prepare(on_device.sales, on_device.spend, on_device.covariates, True)
    expected = cpu._channel_goodwill(params, cpu._data[1])
    got = dev._channel_goodwill({n: v.to(device) for n, v in params.items()}, dev._data[1])
    assert got.device == device
    assert torch.allclose(got.cpu(), expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    "options",
    [
        {},  # the defaults: Student-t noise, point-mass selection, spend_lag="auto"
        dict(
            noise="gaussian",
            selection="ssvs",
            trend="local_linear_trend",
            carryover="shared",
            saturation="hill",
            roas_prior={"tv": (2.0, 0.5)},
        ),
    ],
    ids=["defaults", "saturation"],
)
def test_retail_bsts_makes_every_tensor_where_its_data_are(options, no_stray_tensors):
    # The CPU stand-in for a CUDA run (test_retail_bsts_fits_and_answers_on_the_data_device
    # runs on a GPU only where one is lent): no tensor of the marketer's path is made on the
    # default device rather than the data's.
    d = simulate_retail(num_weeks=40, seed=3)
    budget = float(d.spend[-10:].sum(1).mean())
    m = RetailBSTS(**options)
    with no_stray_tensors():
        quick_fit(m, d, channel_names=d.channel_names)
        answers = [
            m.channel_contributions(),
            m.roas(),
            m.response_curves([5.0, 10.0]),
            m.forecast(d.spend[-4:], d.covariates[-4:]),
            m.inclusion_probabilities(),
            m.channel_inclusion_probabilities(),
            allocate_budget(m, budget=budget).spend,
        ]
        if m.noise == "gaussian":
            answers += list(m.one_step_predictions(d.sales, d.spend, d.covariates, max_draws=4))
        m.contribution_summary(weeks=[1, 2, 3])
        m.coefficients()
        m.sales_components(max_draws=4)
    assert all(a.device.type == "cpu" and bool(torch.isfinite(a).all()) for a in answers)


def _obs_log_prob(m, values):
    """The likelihood's term (the ``obs`` site, every indicator on) at ``values``."""
    model = m._all_indicators_on(m.model)
    with pyro.poutine.block(), torch.no_grad():
        trace = pyro.poutine.trace(pyro.poutine.condition(model, values)).get_trace(*m._data)
        trace.compute_log_prob()
        return float(trace.nodes["obs"]["log_prob_sum"])


@pytest.mark.parametrize("spend_lag", [0, 1])
@pytest.mark.parametrize("saturation", [None, "hill"])
def test_an_always_on_channel_costs_nothing_in_the_level_prior(spend_lag, saturation):
    # A channel whose spend never changes builds the same goodwill every week (its start is
    # the steady state): the data cannot tell it from the level, so the likelihood must not
    # depend on its q. It did when the level's prior N(0, 2^2) was on mu_1 alone, which then
    # had to sit at -D_1: a penalty growing with the goodwill, which shrank always-on
    # channels' contributions (by half on simulated series) and pushed delta up.
    d = simulate_retail(num_weeks=60, seed=3, noise="gaussian")
    spend = d.spend.clone()
    spend[:, 2] = 25.0
    m = RetailBSTS(spend_lag=spend_lag, noise="gaussian", saturation=saturation)
    m.fit(d.sales, spend, d.covariates, **SET_UP_ONLY)
    start = m._start_values()
    delta = start["delta"].clone()
    delta[2] = 0.5  # (1 - delta)^52 below round-off: the start is the steady state
    values = dict(start, delta=delta)
    logs = []
    for scale in (0.1, 1.0, 10.0):
        q = start["q"].clone()
        q[2] = scale * 3.0  # up to 30 sales sds of goodwill per unit of mean spend
        logs.append(_obs_log_prob(m, dict(values, q=q)))
    assert logs == pytest.approx([logs[1]] * 3, abs=1e-6)
    # ... while a channel whose spend moves is seen.
    q = start["q"].clone()
    q[0] = 10 * q[0] + 1.0
    assert abs(_obs_log_prob(m, dict(values, q=q)) - logs[1]) > 1.0
