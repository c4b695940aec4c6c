"""Maximum-likelihood scales of a DLM: the Nile's published estimates, statsmodels' on the
same data, restarts, devices and the argument contract."""

import functools
import math
import warnings

import numpy as np
import pytest
import torch

from pyro_ext.datasets import load_nile
from pyro_ext.timeseries import (
    DLM,
    Autoregressive,
    DLMFit,
    LocalLevel,
    LocalLinearTrend,
    Regression,
    Seasonal,
    fit_dlm,
    sequential_kernels,
)


def local_level(scales):
    return DLM(LocalLevel(scales["level"], init_scale=1e4), scales["observation"])


@pytest.fixture(scope="module")
def nile():
    return load_nile(dtype=torch.float64)[1]


def test_the_nile_gives_durbin_and_koopmans_estimates(nile):
    # Durbin & Koopman (2012), section 2.10: maximum-likelihood variances 15099 and 1469.1.
    fit = fit_dlm(local_level, nile, {"level": 10.0, "observation": 100.0})
    assert isinstance(fit, DLMFit) and fit.converged
    assert fit.scales["observation"] ** 2 == pytest.approx(15099, rel=1e-3)
    assert fit.scales["level"] ** 2 == pytest.approx(1469.1, rel=1e-3)
    assert fit.log_likelihood == pytest.approx(float(fit.dlm.log_likelihood(nile)))


def test_it_is_at_least_as_high_as_statsmodels_mle(nile):
    # The same likelihood at statsmodels' own maximum (a numerical BFGS) is not higher.
    sm = pytest.importorskip("statsmodels.api")
    result = sm.tsa.UnobservedComponents(nile.numpy(), "local level").fit(disp=False)
    irregular, level = result.params
    theirs = local_level(
        {"level": torch.tensor(level**0.5), "observation": torch.tensor(irregular**0.5)}
    ).log_likelihood(nile)
    fit = fit_dlm(local_level, nile, {"level": 10.0, "observation": 100.0})
    assert fit.log_likelihood >= float(theirs) - 1e-9
    assert fit.scales["observation"] ** 2 == pytest.approx(irregular, rel=0.01)
    assert fit.scales["level"] ** 2 == pytest.approx(level, rel=0.02)


def test_restarts_recover_from_a_poor_start_and_are_seeded(nile):
    poor = {"level": 1e-3, "observation": 1e4}
    one = fit_dlm(local_level, nile, poor, num_restarts=1, max_iterations=3)
    many = fit_dlm(local_level, nile, poor, num_restarts=4, seed=1)
    assert len(many.restart_log_likelihoods) == 4
    assert many.log_likelihood == max(many.restart_log_likelihoods)
    assert many.log_likelihood >= one.log_likelihood
    again = fit_dlm(local_level, nile, poor, num_restarts=4, seed=1)
    assert again.scales == many.scales


def test_a_local_linear_trend_on_the_data_device(device):
    # Simulated from known scales: the fit's likelihood beats the truth's, on the device.
    g = torch.Generator().manual_seed(0)
    T = 200
    slope = torch.cumsum(0.05 * torch.randn(T, generator=g, dtype=torch.float64), 0)
    level = torch.cumsum(slope + 0.3 * torch.randn(T, generator=g, dtype=torch.float64), 0)
    y = (level + 1.0 * torch.randn(T, generator=g, dtype=torch.float64)).to(device)

    def trend(s):
        return DLM(LocalLinearTrend(s["level"], s["slope"], init_scale=100.0), s["obs"])

    truth = {"level": 0.3, "slope": 0.05, "obs": 1.0}
    fit = fit_dlm(trend, y, truth, num_restarts=2)
    at_truth = trend({k: torch.tensor(v, device=device, dtype=y.dtype) for k, v in truth.items()})
    assert fit.log_likelihood >= float(at_truth.log_likelihood(y)) - 1e-9
    assert fit.dlm.observation_scale.device == y.device
    assert fit.scales["obs"] == pytest.approx(1.0, rel=0.3)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(make_dlm=None), TypeError, "make_dlm must be callable"),
        (dict(y=[1.0, 2.0]), TypeError, "y must be a floating-point tensor"),
        (dict(init={}), TypeError, "init must be a non-empty dict"),
        (dict(init={"level": -1.0, "observation": 1.0}), ValueError, r"init\['level'\]"),
        (dict(init={"level": 1.0, "observation": math.nan}), ValueError, "observation"),
        (dict(num_restarts=0), ValueError, "num_restarts"),
        (dict(max_iterations=1.5), TypeError, "max_iterations"),
        (dict(make_dlm=lambda s: 3), TypeError, "make_dlm must return a DLM, got int"),
        (dict(method="newton"), ValueError, "method"),
        # The model's values are checked once, at set-up, by either method.
        (dict(y=torch.tensor([1.0, math.inf, 2.0], dtype=torch.float64)), ValueError, "infinite"),
        (
            dict(y=torch.tensor([1.0, math.inf, 2.0], dtype=torch.float64), method="em"),
            ValueError,
            "infinite",
        ),
    ],
)
def test_bad_arguments_name_themselves(nile, kwargs, error, match):
    arguments = dict(make_dlm=local_level, y=nile, init={"level": 10.0, "observation": 100.0})
    arguments.update(kwargs)
    make_dlm, y, init = arguments.pop("make_dlm"), arguments.pop("y"), arguments.pop("init")
    with pytest.raises(error, match=match):
        fit_dlm(make_dlm, y, init, **arguments)


# -- EM --------------------------------------------------------------------------------------
def test_em_reaches_the_nile_maximum_likelihood(nile):
    # The same optimum as L-BFGS (Durbin & Koopman's 15099 / 1469.1) from EM's closed-form
    # M-steps, to EM's linear convergence.
    em = fit_dlm(local_level, nile, {"level": 10.0, "observation": 100.0}, method="em")
    lbfgs = fit_dlm(local_level, nile, {"level": 10.0, "observation": 100.0})
    assert em.converged
    assert em.log_likelihood == pytest.approx(lbfgs.log_likelihood, abs=1e-4)
    assert em.log_likelihood <= lbfgs.log_likelihood + 1e-9
    assert em.scales["observation"] ** 2 == pytest.approx(15099, rel=2e-3)
    assert em.scales["level"] ** 2 == pytest.approx(1469.1, rel=5e-3)
    assert em.log_likelihood == pytest.approx(float(em.dlm.log_likelihood(nile)))


def test_every_em_iteration_raises_the_likelihood(nile):
    # EM's defining property, from a poor start: the log-likelihood after k iterations
    # never falls as k grows (the fit itself raises if one iteration lowers it).
    poor = {"level": 1.0, "observation": 1000.0}
    values = [
        fit_dlm(
            local_level, nile, poor, method="em", num_restarts=1, max_iterations=k
        ).log_likelihood
        for k in (1, 2, 4, 8, 16, 32)
    ]
    assert all(later >= earlier - 1e-9 for earlier, later in zip(values, values[1:]))
    assert values[-1] > values[0] + 1.0


def trend_and_season_for_em(s, trend_init_scale=100.0):
    """A trend with its slope and a season of period 4, each with a scale of its own, and
    the observation noise: the model EM fits (each scale owns its states)."""
    return DLM(
        [
            LocalLinearTrend(s["level"], s["slope"], init_scale=trend_init_scale),
            Seasonal(4, s["season"], init_scale=10.0),
        ],
        s["obs"],
    )


# 10-30 s: in the integration run (`make test-integration`, CI), not the default one.
@pytest.mark.integration
def test_em_fits_a_trend_and_a_season_with_missing_values_as_lbfgs_does():
    # Three scales owning disjoint states (level, slope, season) and the observation noise;
    # missing observations are marginalised in both fits.
    g = torch.Generator().manual_seed(3)
    T, period = 60, 4
    slope = torch.cumsum(0.02 * torch.randn(T, generator=g, dtype=torch.float64), 0)
    level = torch.cumsum(slope + 0.2 * torch.randn(T, generator=g, dtype=torch.float64), 0)
    season = 2 * torch.sin(2 * math.pi * torch.arange(T, dtype=torch.float64) / period)
    y = level + season + 0.5 * torch.randn(T, generator=g, dtype=torch.float64)
    y[[10, 30, 31]] = math.nan
    start = {"level": 0.5, "slope": 0.1, "season": 0.1, "obs": 1.0}
    em = fit_dlm(trend_and_season_for_em, y, start, method="em", num_restarts=1)
    lbfgs = fit_dlm(trend_and_season_for_em, y, start, num_restarts=1)
    assert math.isfinite(em.log_likelihood)
    assert em.log_likelihood == pytest.approx(lbfgs.log_likelihood, abs=0.05)
    assert em.scales["obs"] == pytest.approx(lbfgs.scales["obs"], rel=0.05)


def test_em_on_the_kernels_and_on_the_torch_scans_are_the_same_fit():
    # EM's two paths: the compiled E- and M-steps (CPU, numba) and the torch scans with the
    # torch M-step (CUDA, or with the kernels switched off), on a trend and a season with
    # gaps, from the same start and with the same number of passes: the same iterates.
    g = torch.Generator().manual_seed(5)
    T, period = 40, 4
    level = torch.cumsum(0.3 * torch.randn(T, generator=g, dtype=torch.float64), 0)
    season = torch.sin(2 * math.pi * torch.arange(T, dtype=torch.float64) / period)
    y = level + season + 0.4 * torch.randn(T, generator=g, dtype=torch.float64)
    y[[3, 17, 18]] = math.nan
    start = {"level": 0.5, "slope": 0.1, "season": 0.2, "obs": 1.0}
    options = dict(method="em", num_restarts=2, max_iterations=25)
    # A prior of scale 10 on the trend: with a diffuse one (100) the two engines' round-off
    # differs by 2e-9 of the log-likelihood after 25 extrapolated passes.
    model = functools.partial(trend_and_season_for_em, trend_init_scale=10.0)
    on_kernels = fit_dlm(model, y, start, **options)
    with sequential_kernels(False):
        on_scans = fit_dlm(model, y, start, **options)
    assert on_kernels.log_likelihood == pytest.approx(on_scans.log_likelihood, rel=1e-9)
    for name, value in on_kernels.scales.items():
        assert value == pytest.approx(on_scans.scales[name], rel=1e-6)
    assert on_kernels.restart_log_likelihoods == pytest.approx(
        on_scans.restart_log_likelihoods, rel=1e-9
    )


def test_em_refuses_models_it_cannot_fit_and_says_what_to_use(nile):
    x = torch.randn(nile.shape[0], 1, dtype=torch.float64)
    regression = lambda s: DLM(  # noqa: E731
        [LocalLevel(s["level"], init_scale=1e4), Regression(x, s["coef"])], s["observation"]
    )
    start = {"level": 10.0, "observation": 100.0, "coef": 1.0}
    with pytest.raises(ValueError, match="vary over time.*method='lbfgs'"):
        fit_dlm(regression, nile, start, method="em")
    # A scale used as an autoregressive coefficient changes G, not a variance.
    ar = lambda s: DLM(Autoregressive(s["phi"].reshape(1), s["noise"]), s["observation"])  # noqa: E731
    with pytest.raises(ValueError, match="changes G, F or the first state's prior"):
        fit_dlm(ar, nile, {"phi": 0.5, "noise": 10.0, "observation": 100.0}, method="em")
    with pytest.raises(ValueError, match=r"one series y of shape \(T,\)"):
        fit_dlm(local_level, nile.expand(2, -1), {"level": 10.0, "observation": 100.0}, method="em")


def _trend_and_season(s):
    # Two scales tied (level and season share one), so the structure is linear but not EM's.
    return DLM(
        [
            LocalLinearTrend(s["level"], s["slope"], init_scale=100.0),
            Seasonal(4, s["level"], init_scale=10.0),
        ],
        s["obs"],
    )


def trend_and_season_series(seed, length, missing):
    """A random walk of ``length`` steps with NaN at ``missing``, and ``log-scales ->
    _trend_and_season model``; the generator goes on from the series."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(length, generator=g, dtype=torch.float64).cumsum(0)
    y[missing] = math.nan
    names = ["level", "slope", "obs"]

    def build(log_scales):
        return _trend_and_season({n: log_scales[i].exp() for i, n in enumerate(names)})

    return g, y, build


def assert_scored_is_the_model(scored, build, y, point):
    """The kernels' value and gradient at ``point`` equal the model's own log_likelihood
    and its autograd gradient."""
    value, gradient = scored(point.numpy())
    leaf = point.clone().requires_grad_()
    expected = build(leaf).log_likelihood(y)
    (expected_gradient,) = torch.autograd.grad(expected, leaf)
    assert value == pytest.approx(float(expected.detach()), rel=1e-12)
    torch.testing.assert_close(torch.from_numpy(gradient), expected_gradient, rtol=1e-8, atol=1e-10)


def test_lbfgs_takes_value_and_gradient_from_the_kernels_when_w_and_v_are_linear():
    # W and V linear in the squared scales: each evaluation assembles only W and V and
    # takes the log-likelihood and its gradient from the kernels' score. Both equal the
    # model's own log_likelihood and its autograd gradient at random points, with missing
    # values and two scales tied to one.
    from pyro_ext.timeseries import dlm_fit

    g, y, build = trend_and_season_series(5, 50, [7, 20])
    base = torch.tensor([-1.0, -2.0, 0.0], dtype=torch.float64)
    scored = dlm_fit._kernel_score(build, base, y)
    assert scored is not None
    for _ in range(3):
        assert_scored_is_the_model(
            scored, build, y, base + torch.randn(3, generator=g, dtype=torch.float64)
        )
    # A line search's step that overflows: a non-finite value, quietly, as on the model's
    # own path (numpy would warn of the overflow).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = scored(np.array([400.0, -2.0, 0.0]))
    assert out is None or not math.isfinite(out[0])
    # A regression puts a time axis on the matrices: the model's own path, same optimum.
    x = torch.randn(50, 1, generator=g, dtype=torch.float64)
    regression = lambda s: DLM(  # noqa: E731
        [LocalLevel(s["level"], init_scale=100.0), Regression(x, s["coef"])], s["obs"]
    )
    start = torch.zeros(3, dtype=torch.float64)
    assert (
        dlm_fit._kernel_score(
            lambda v: regression(dict(zip(["level", "coef", "obs"], v.exp()))), start, y
        )
        is None
    )


def test_the_one_pass_gradient_holds_through_the_steady_state_and_a_gap_after_it():
    # The forward-mode filter switches to the steady state once the predicted covariance and
    # its derivatives stop moving, and leaves it at a missing value. A long series with
    # gaps before and after convergence: the value and the gradient equal the model's own
    # log_likelihood and its autograd gradient, and the steady state was reached.
    from pyro_ext.timeseries import _sequential, dlm_fit

    _, y, build = trend_and_season_series(11, 600, [5, 6, 300, 450, 451, 452])
    base = torch.tensor([-1.0, -2.0, 0.5], dtype=torch.float64)
    scored = dlm_fit._kernel_score(build, base, y)
    assert scored is not None
    for shift in (0.0, 0.7):
        assert_scored_is_the_model(scored, build, y, base + shift)
    # The kernel itself reached the steady state (after the gap at 450, with this slow
    # trend: 92 steps), later than the filter does (116 steps): it waits for the
    # derivatives of the covariance, which settle after the covariance itself.
    linear, _ = dlm_fit._linear_in_squared_scales(build, base, y.shape[0])
    inputs = dlm_fit._KernelInputs.of(linear, y)
    inputs.at(base.numpy())
    kernels = _sequential.kernels("_kalman_kernels")
    out = inputs.tangent_out
    V = inputs.run.arrays[4]
    assert kernels.tangent_filter(*inputs.tangent_inputs, V[0, 0, 0, 0], *inputs.initial, out) < 0
    assert inputs.run.filter()
    assert 50 < out[-1] < inputs.run.steady_steps[0]


@pytest.mark.parametrize("method", ["lbfgs", "em"])
def test_the_kernel_path_and_the_model_path_reach_the_same_fit(nile, monkeypatch, method):
    # L-BFGS's evaluations and EM's E-steps from the kernels' inputs with W and V replaced,
    # against the same fits through the model's own functions.
    from pyro_ext.timeseries import dlm_fit

    nile = nile.clone()
    nile[[20, 21, 60]] = math.nan
    start = {"level": 10.0, "observation": 100.0}
    fast = fit_dlm(local_level, nile, start, method=method)
    monkeypatch.setattr(dlm_fit._KernelInputs, "of", staticmethod(lambda *args: None))
    slow = fit_dlm(local_level, nile, start, method=method)
    assert fast.log_likelihood == pytest.approx(slow.log_likelihood, abs=1e-8)
    for name in fast.scales:
        assert fast.scales[name] == pytest.approx(slow.scales[name], rel=1e-5)
    assert fast.restart_log_likelihoods == pytest.approx(slow.restart_log_likelihoods, abs=1e-8)


def test_every_start_reaches_the_co2_maximum():
    # On the standardised CO2 series a line search can step to a log-scale of thousands,
    # where the likelihood is not finite (torch's L-BFGS ended a start there); every start
    # reaches the maximum.
    from pyro_ext.datasets import load_co2

    train = load_co2("vis")[:-60].double()
    y = (train - train.mean()) / train.std()

    def model(s):
        return DLM(
            [
                LocalLinearTrend(s["level"], s["slope"], init_scale=2.0),
                Seasonal(12, s["season"], init_scale=2.0),
            ],
            s["obs"],
        )

    fit = fit_dlm(model, y, {"level": 0.1, "slope": 0.1, "season": 0.1, "obs": 0.1})
    assert fit.converged
    assert fit.restart_log_likelihoods == pytest.approx([fit.log_likelihood] * 3, abs=1e-6)
    assert fit.log_likelihood == pytest.approx(1585.886, abs=1e-3)


def test_the_line_search_backs_off_a_point_where_the_likelihood_is_not_finite(nile):
    # A model whose likelihood is not finite above a level scale of 50 (its make_dlm gives
    # an infinite scale there, which only the unchecked evaluations accept): L-BFGS's line
    # search steps there and backs off, and the fit reaches the Nile's maximum (below the
    # wall). An infinite value handed to L-BFGS-B would end the run as if it had converged.
    searched = []  # the level scales L-BFGS evaluated (with a gradient; not the set-up's)

    def walled(s):
        level = s["level"]
        if level.requires_grad:
            searched.append(float(level.detach()))
        if float(level.detach()) > 50:
            level = torch.full_like(level, math.inf)
        return DLM(LocalLevel(level, init_scale=1e4), s["observation"])

    fit = fit_dlm(walled, nile, {"level": 45.0, "observation": 50.0}, num_restarts=1)
    assert any(level > 50 for level in searched)
    assert fit.converged
    assert fit.log_likelihood == pytest.approx(-642.6811, abs=1e-4)
    assert fit.scales["level"] ** 2 == pytest.approx(1469.1, rel=1e-3)


def test_a_model_that_refuses_a_doubled_scale_keeps_the_model_path(nile):
    # Reading how the scales enter doubles each squared scale in turn; a model that refuses
    # the doubled value (an AR coefficient kept below 1) is fitted through its own
    # log_likelihood, and EM says why it does not apply.
    y = nile - nile.mean()

    def ar(s):
        if float(s["phi"]) >= 1:
            raise ValueError("phi must be below 1")
        return DLM(Autoregressive(s["phi"].reshape(1), s["noise"]), s["observation"])

    start = {"phi": 0.8, "noise": 100.0, "observation": 100.0}
    fit = fit_dlm(ar, y, start, num_restarts=1, max_iterations=5)
    assert math.isfinite(fit.log_likelihood) and fit.scales["phi"] < 1
    with pytest.raises(ValueError, match="make_dlm refused scale 0 doubled.*method='lbfgs'"):
        fit_dlm(ar, y, start, method="em")


def test_a_start_far_below_the_data_scale_reaches_ems_maximum(nile):
    # LocalLevel's default prior scale and starting scales of 1 on a series in the
    # thousands: torch's L-BFGS line search failed here (an IndexError in its strong-Wolfe
    # bracketing). Every start now reaches the maximum that EM, an independent algorithm,
    # finds for the same model.
    def model(s):
        return DLM(LocalLevel(s["level"]), s["observation"])

    fit = fit_dlm(model, nile, {"level": 1.0, "observation": 1.0})
    em = fit_dlm(model, nile, {"level": 1.0, "observation": 1.0}, method="em")
    assert fit.converged and em.converged
    assert fit.restart_log_likelihoods == pytest.approx([fit.log_likelihood] * 3, abs=1e-6)
    assert fit.log_likelihood == pytest.approx(em.log_likelihood, abs=1e-6)
    for name in ("level", "observation"):
        assert fit.scales[name] == pytest.approx(em.scales[name], rel=1e-4)


def test_a_float32_series_fits_by_em_as_a_float64_one():
    # W and V are read as linear in the squared scales to the model dtype's round-off: a
    # float32 series was refused by EM (its rebuilt W off by 1e-7) with a misleading message.
    y64 = load_nile(dtype=torch.float64)[1]
    start = {"level": 10.0, "observation": 100.0}
    fits = [
        fit_dlm(local_level, y64.to(dtype), start, method="em")
        for dtype in (torch.float32, torch.float64)
    ]
    for name in start:
        assert fits[0].scales[name] == pytest.approx(fits[1].scales[name], rel=1e-4)
    assert fits[0].log_likelihood == pytest.approx(-642.6811, abs=1e-3)


def test_a_first_state_prior_far_from_the_data_is_named_with_what_to_change(nile):
    # LocalLevel's default init_scale (10) on the Nile (about 1,000): the fit makes up with
    # variances ten times the maximum-likelihood ones; the warning names init_scale.
    def narrow(s):
        return DLM(LocalLevel(s["level"]), s["observation"])

    start = {"level": 1.0, "observation": 1.0}
    with pytest.warns(UserWarning, match="init_scale"):
        fit_dlm(narrow, nile, start, num_restarts=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit_dlm(local_level, nile, start, num_restarts=1)
