"""DLM components, superposition and the Pyro observation helper."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoDelta

from pyro_ext.timeseries.dlm import (
    DLM,
    Autoregressive,
    DLMDistribution,
    LinearGaussian,
    LocalLevel,
    LocalLinearTrend,
    Regression,
    Seasonal,
    dlm_observe,
)
from pyro_ext.timeseries.kalman import kalman_filter, kalman_smoother

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


def test_dummy_seasonal_matrix_structure():
    b = Seasonal(12, t(0.3)).block(5)
    assert b.G.shape == (11, 11)
    assert (b.G[0] == -1).all()  # appendix 2.B.1 / statsmodels dummy form
    assert torch.equal(b.G[1:, :-1], torch.eye(10, dtype=D)) and (b.G[1:, -1] == 0).all()
    assert torch.equal(b.F, torch.eye(11, dtype=D)[:1])
    assert torch.allclose(b.W, torch.diag(torch.cat([t([0.09]), torch.zeros(10, dtype=D)])))
    # Twelve consecutive seasonal effects sum to zero without noise.
    x, total = torch.randn(11, dtype=D), 0.0
    for _ in range(12):
        x = b.G @ x
        total += x[0]
    assert abs(float(total)) < 1e-10
    cyc = Seasonal(4, t(0.1), form="cyclic").block(3).G
    assert torch.equal(torch.linalg.matrix_power(cyc, 4), torch.eye(4, dtype=D))


def test_trigonometric_seasonal_and_ar_companion():
    b = Seasonal(12, t(0.2), harmonics=6).block(3)
    assert b.G.shape == (11, 11)  # 5 two-state harmonics + the 1-state Nyquist one
    lam = 2 * math.pi / 12
    assert torch.allclose(
        b.G[:2, :2], t([[math.cos(lam), math.sin(lam)], [-math.sin(lam), math.cos(lam)]])
    )
    assert b.G[-1, -1] == -1
    assert torch.allclose(torch.linalg.matrix_power(b.G, 12), torch.eye(11, dtype=D))
    assert torch.equal(b.F[0, :4], t([1.0, 0.0, 1.0, 0.0]))
    coefs = t([0.5, -0.2, 0.1]).requires_grad_()
    ar = Autoregressive(coefs, t(1.0)).block(3)
    assert torch.equal(ar.G.detach(), t([[0.5, -0.2, 0.1], [1, 0, 0], [0, 1, 0]]))
    ar.G.sum().backward()
    assert torch.equal(coefs.grad, torch.ones(3, dtype=D))


def make_dlm(T, scale=0.5, X=None):
    X = torch.randn(T, 2, dtype=D) if X is None else X
    comps = (
        LocalLinearTrend(t(0.3), t(0.05))
        + Seasonal(4, t(0.2))
        + Regression(X, coef_scale=t(0.1))
        + Autoregressive(t([0.6]), t(0.4))
    )
    return DLM(comps, observation_scale=t(scale)), X


def test_superposition_matches_floor_and_decompose_sums():
    T = 20
    model, _ = make_dlm(T)
    y = torch.randn(T, dtype=D).cumsum(0)
    y[5] = math.nan
    m = model.matrices(T)
    assert m.transition_matrix.shape == (T, 8, 8)  # 2 + 3 + 2 + 1 states, time-varying F
    ll = kalman_filter(y[:, None], m).log_likelihood
    assert torch.allclose(model.log_likelihood(y), ll)
    parts = model.decompose(y)
    assert list(parts) == ["trend", "seasonal", "regression", "ar"]
    sm = kalman_smoother(y[:, None], m)
    signal = (m.observation_matrix @ sm.smoothed_means[..., None])[..., 0, 0]
    assert torch.allclose(sum(parts.values()), signal)
    # Stacking is block diagonal: the trend block of G is the component's own G.
    assert torch.equal(m.transition_matrix[3, :2, :2], t([[1.0, 1.0], [0.0, 1.0]]))
    assert (m.transition_matrix[3, :2, 2:] == 0).all()


def test_forecast_with_future_covariates_and_errors():
    T, h = 15, 4
    model, X = make_dlm(T)
    y = torch.randn(T, dtype=D)
    with pytest.raises(ValueError, match="future covariates"):
        model.forecast(y, h)
    Xf = torch.randn(h, 2, dtype=D)
    fc = model.forecast(y, h, covariates={"regression": Xf})
    assert fc.observation_means.shape == (h, 1) and fc.state_covs.shape == (h, 8, 8)
    # Closed form: filtering the series extended by h missing values with the future X.
    ext, _ = make_dlm(T + h, X=torch.cat([X, Xf]))
    res = ext.filter(torch.cat([y, torch.full((h,), math.nan, dtype=D)]))
    assert torch.allclose(fc.state_means, res.predicted_means[T:])
    assert torch.allclose(fc.state_covs, res.predicted_covs[T:])
    with pytest.raises(ValueError, match="unknown component"):
        model.forecast(y, h, covariates={"nope": Xf})


def test_linear_gaussian_time_varying_matches_local_level():
    T = 10
    y = torch.randn(T, dtype=D)
    G = torch.ones(T, 1, 1, dtype=D)
    lg = LinearGaussian(
        G,
        torch.ones(1, 1, dtype=D),
        t([[0.25]]),
        torch.zeros(1, dtype=D),
        t([[100.0]]),
        time_varying=True,
    )
    a = DLM(lg, t(1.0)).log_likelihood(y)
    b = DLM(LocalLevel(t(0.5)), t(1.0)).log_likelihood(y)
    assert torch.allclose(a, b)


def test_batched_scales_and_distribution_shapes():
    T = 12
    comps = [LocalLevel(t([0.1, 0.5, 1.0]))]
    model = DLM(comps, observation_scale=t(1.0))
    y = torch.randn(T, dtype=D)
    ll = model.log_likelihood(y)
    assert ll.shape == (3,)
    d = DLMDistribution(model, T)
    assert d.batch_shape == (3,) and d.event_shape == (T,)
    assert torch.allclose(d.log_prob(y), ll)
    assert d.sample((5,)).shape == (5, 3, T)


def test_svi_recovers_observation_scale():
    pyro.set_rng_seed(1)
    T, true_scale = 300, 0.8
    level = (0.1 * torch.randn(T, dtype=D)).cumsum(0)
    y = level + true_scale * torch.randn(T, dtype=D)

    def model(y):
        obs_scale = pyro.sample("obs_scale", dist.LogNormal(t(0.0), t(1.0)))
        dlm = DLM(LocalLevel(t(0.1)), observation_scale=obs_scale)
        dlm_observe("y", dlm, y)

    guide = AutoDelta(model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    losses = [svi.step(y) for _ in range(150)]
    assert losses[-1] < losses[0]
    est = guide.median()["obs_scale"].item()
    # MLE of a scale from T=300 residuals has relative sd ~ 1/sqrt(2T) ~ 4%; 20% is ample
    # for the estimate plus the weak LogNormal prior and the level noise.
    assert abs(est - true_scale) / true_scale < 0.2


def test_student_t_augmentation_sites():
    T = 8
    y = torch.randn(T, dtype=D)
    dlm = DLM(LocalLevel(t(0.3)), observation_scale=t(1.0), observation_df=4.0)
    tr = pyro.poutine.trace(lambda: dlm_observe("y", dlm, y)).get_trace()
    lam = tr.nodes["y_precision"]["value"]
    assert lam.shape == (T,)
    # Conditional on lambda the likelihood is the Kalman one with V / lambda_t.
    m = dlm.matrices(T, observation_precision=lam)
    expected = kalman_filter(y[:, None], m).log_likelihood
    assert torch.allclose(tr.nodes["y"]["fn"].log_prob(y), expected)
    assert torch.allclose(m.observation_cov[:, 0, 0], 1.0 / lam)


def test_student_t_precisions_are_drawn_on_the_data_device(device):
    T = 8
    y = torch.randn(T, dtype=D).to(device)
    dlm = DLM(LocalLevel(t(0.3).to(device)), t(1.0).to(device), observation_df=4.0)
    tr = pyro.poutine.trace(lambda: dlm_observe("y", dlm, y)).get_trace()
    lam = tr.nodes["y_precision"]["value"]
    assert lam.device == y.device and lam.dtype == y.dtype and bool((lam > 0).all())
    log_prob = tr.nodes["y"]["fn"].log_prob(y)
    assert log_prob.device == y.device
    m = dlm.matrices(T, observation_precision=lam)
    assert torch.allclose(log_prob, kalman_filter(y[:, None], m).log_likelihood)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: LocalLevel(t(-1.0)), "level_scale"),
        (lambda: LocalLinearTrend(t(1.0), t(math.nan)), "slope_scale"),
        (lambda: Seasonal(1, t(1.0)), "period"),
        (lambda: Seasonal(12, t(1.0), harmonics=7), "harmonics"),
        (lambda: Regression(torch.ones(3, dtype=D)), "X must have shape"),
        (lambda: Autoregressive(t(0.5), t(1.0)), "coefs"),
        (lambda: DLM([LocalLevel(t(1.0))], t(0.0)), "observation_scale"),
        (lambda: DLM([], t(1.0)), "components"),
        (lambda: DLM(LocalLevel(t(1.0)), t(1.0), observation_df=-1.0), "observation_df"),
        (
            lambda: DLM(Regression(torch.ones(4, 1, dtype=D)), t(1.0)).log_likelihood(
                torch.ones(5, dtype=D)
            ),
            "X has 4 steps",
        ),
    ],
)
def test_dlm_errors(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_distribution_samples_have_the_model_covariance():
    # log p(y) is Gaussian in y: its Hessian is minus the exact precision of the draws.
    pyro.set_rng_seed(3)
    T = 5
    model = DLM(LocalLevel(t(0.05)), observation_scale=t(0.02))
    d = DLMDistribution(model, T)
    precision = -torch.func.hessian(lambda y: model.log_likelihood(y))(torch.zeros(T, dtype=D))
    exact = torch.linalg.inv(precision)
    draws = d.sample((20000,))
    empirical = torch.cov(draws.T)
    # Relative error of a sample covariance from 20000 draws: about sqrt(2 / 20000) = 1%.
    assert torch.allclose(empirical, exact, rtol=0.06, atol=0.06 * exact.diagonal().min())


@pytest.mark.parametrize("trend", ["level", "linear"])
def test_signal_covariance_is_the_kalman_likelihoods_gaussian(trend):
    # The dense covariance (powers of G by doubling, no loop over steps) plus the
    # observation noise gives the same log-density as the Kalman filter.
    from pyro_ext.timeseries.dlm import Autoregressive, LocalLinearTrend

    f64 = torch.float64
    level = (
        LocalLevel(torch.tensor(0.1, dtype=f64), init_scale=2.0)
        if trend == "level"
        else LocalLinearTrend(torch.tensor(0.1, dtype=f64), torch.tensor(0.02, dtype=f64), 2.0)
    )
    components = [
        Autoregressive(torch.tensor([0.7], dtype=f64), torch.tensor(0.2, dtype=f64), 1.0),
        level,
        Seasonal(12, torch.tensor(0.05, dtype=f64), harmonics=2, form="cyclic", init_scale=1.0),
    ]
    dlm = DLM(components, torch.tensor(0.5, dtype=f64))
    for T in (1, 37, 64):
        y = torch.randn(T, dtype=f64)
        cov = dlm.signal_covariance(T) + 0.25 * torch.eye(T, dtype=f64)
        dense = torch.distributions.MultivariateNormal(torch.zeros(T, dtype=f64), cov)
        assert torch.allclose(dense.log_prob(y), dlm.log_likelihood(y), rtol=1e-10)
    with pytest.raises(ValueError, match="time-invariant"):
        DLM([Regression(torch.randn(10, 2, dtype=f64))], 1.0).signal_covariance(10)
