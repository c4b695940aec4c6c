"""Channel contributions and ROAS of a fitted RetailBSTS against the goodwill recursion of
thesis eq. (1.4) written out by hand."""

import pyro
import pytest
import torch

from pyro_ext.models.bsts import (
    RetailBSTS,
    channel_contributions,
    contribution_summary,
    plot_contributions,
    response_curves,
    roas,
    sales_components,
    simulate_retail,
)
from pyro_ext.timeseries import kalman_smoother

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def data():
    return simulate_retail(num_weeks=60, seed=1, noise="gaussian")


def short_fit(model, data, **options):
    """``model`` fitted on ``data`` by a short run (these tests check arithmetic, not mixing)."""
    options = {
        **dict(num_samples=10, warmup_steps=20, num_particles=2, map_init_steps=30),
        **options,
    }
    return model.fit(data.sales, data.spend, data.covariates, seed=0, **options)


@pytest.fixture(
    scope="module",
    params=[
        (1, "shared", "real", None),
        (0, "per_channel", "non_negative", None),
        (1, "per_channel", "non_negative", "hill"),
    ],
    ids=["lag1-shared-real", "lag0-per_channel-non_negative", "lag1-per_channel-hill"],
)
def fitted(data, request):
    lag, carryover, effects, saturation = request.param
    model = RetailBSTS(
        variant="RF",
        noise="gaussian",
        seasonal_harmonics=1,
        spend_lag=lag,
        carryover=carryover,
        effects=effects,
        saturation=saturation,
    )
    return short_fit(model, data)


def by_hand(delta, q, spend, lag, bend=None):
    """sum_t q A_t with A_t = (1 - delta) A_{t-1} + u_{t - lag}, A before the data 0.

    With a saturation bend lambda: sum_t q [f(S_t) - f(B_t)], f(S) = S / (1 + lambda S /
    mean_t S_t), where B_t is the goodwill from a year of spend before the data at the mean
    of the first (at most) 52 weeks, decayed to week t, and S_t = A_t + B_t."""
    T, phi = spend.shape[0], 1 - delta
    ubar = sum(float(spend[t]) for t in range(min(T, 52))) / min(T, 52)
    year = sum(phi**j for j in range(52))
    stocks, befores, goodwill = [], [], 0.0
    for t in range(T):
        inflow = float(spend[t - lag]) if t - lag >= 0 else 0.0
        goodwill = phi * goodwill + inflow
        before = phi ** (t + 1 - lag) * year * ubar
        stocks.append(goodwill + before)
        befores.append(before)
    if bend is None:
        return q * sum(s - b for s, b in zip(stocks, befores))
    mean = sum(stocks) / T

    def curve(s):
        return s / (1 + bend * s / mean)

    return q * sum(curve(s) - curve(b) for s, b in zip(stocks, befores))


def test_contributions_are_the_goodwill_recursion_written_out(fitted, data):
    draws = fitted.coefficient_draws()
    contributions = fitted.channel_contributions()
    assert contributions.shape == (draws["q"].shape[0], data.spend.shape[1])
    assert torch.equal(contributions, channel_contributions(fitted))
    for d in (0, 7):
        for i in range(data.spend.shape[1]):
            delta = draws["delta"][d]
            expected = by_hand(
                float(delta if fitted.carryover == "shared" else delta[i]),
                float(draws["q"][d, i]),
                data.spend[:, i].double(),
                fitted.spend_lag,
                None if fitted.saturation is None else float(draws["saturation"][d, i]),
            )
            assert float(contributions[d, i]) == pytest.approx(float(expected), rel=1e-6, abs=1e-6)


def test_windows_add_up_and_roas_divides_by_their_spend(fitted, data):
    total = fitted.channel_contributions()
    first, rest = (
        fitted.channel_contributions(slice(0, 25)),
        fitted.channel_contributions(range(25, 60)),
    )
    assert torch.allclose(first + rest, total, rtol=1e-9, atol=1e-6)
    returns = roas(fitted, slice(0, 25))
    spend = data.spend[:25].double().sum(0)
    spent = spend > 0
    assert not bool(spent.all())  # a channel that starts later: no ROAS there, not inf
    assert torch.allclose(returns[:, spent], (first / spend)[:, spent], rtol=1e-9)
    assert bool(returns[:, ~spent].isnan().all())
    assert torch.allclose(fitted.roas(), total / data.spend.double().sum(0), rtol=1e-9)


def test_summary_gives_means_intervals_and_the_sign(fitted):
    summary = contribution_summary(fitted, interval=0.8)
    assert list(summary) == fitted.channel_names
    contributions = fitted.channel_contributions()
    for i, row in enumerate(summary.values()):
        low, high = row["contribution_interval"]
        assert low <= row["contribution"] <= high
        assert row["contribution"] == pytest.approx(float(contributions[:, i].mean()))
        assert row["probability_positive"] == pytest.approx(
            float((contributions[:, i] > 0).double().mean())
        )
        assert row["roas"] == pytest.approx(row["contribution"] / row["spend"], rel=1e-9)
    assert fitted.contribution_summary(interval=0.8) == summary


def test_response_curves_are_where_a_constant_spend_settles(fitted):
    # The recursion run for 400 weeks of a constant spend in one channel from no goodwill
    # (the forecast's own future-goodwill path) ends at the curve's value.
    levels = torch.tensor([0.0, 5.0, 20.0, 80.0], dtype=torch.float64)
    curves = fitted.response_curves(levels)
    draws = fitted.samples
    assert curves.shape == (draws["q"].shape[0], 4, fitted.num_channels)
    assert torch.equal(curves, response_curves(fitted, levels.tolist()))
    params = {n: v for n, v in draws.items() if n != "obs_precision"}
    k, n = fitted.num_channels, draws["q"].shape[0]
    for i in (0, k - 1):
        for j, level in enumerate(levels.tolist()):
            spend = torch.zeros(400, k, dtype=torch.float64)
            spend[:, i] = level / fitted._u_scale[i]
            start = torch.zeros(n, k, dtype=torch.float64)
            no_start = torch.zeros(n, dtype=torch.float64)  # D_1 = 0: the goodwill itself
            path = fitted._future_offset(
                params, start, no_start, spend, torch.zeros(400, fitted._p)
            )
            settled = path[:, -1] * fitted._y_scale
            assert torch.allclose(curves[:, j, i], settled, rtol=1e-8, atol=1e-8)
    if fitted.saturation is None:  # a line of slope q / delta
        delta = draws["delta"] if fitted.carryover == "per_channel" else draws["delta"][:, None]
        slope = fitted.coefficient_draws()["q"] / delta
        assert torch.allclose(curves, levels[:, None] * slope[:, None, :], rtol=1e-9)
    else:  # concave: the return of the last unit falls
        gains = curves.diff(dim=1) / levels.diff()[:, None]
        assert bool((gains[:, 1:] <= gains[:, :-1] * (1 + 1e-9)).all())
    with pytest.raises(ValueError, match="non-negative"):
        fitted.response_curves([-1.0, 2.0])
    with pytest.raises(ValueError, match="1-D"):
        fitted.response_curves(torch.ones(2, 2))
    with pytest.raises(TypeError, match="spend"):
        fitted.response_curves("10")


def test_bad_arguments_are_refused(fitted, data):
    with pytest.raises(ValueError, match="60 training weeks"):
        fitted.channel_contributions([0, 60])
    with pytest.raises(ValueError, match="no training week"):
        fitted.channel_contributions(slice(70, 80))
    with pytest.raises(TypeError, match="weeks"):
        fitted.channel_contributions(3)
    with pytest.raises(TypeError, match="boolean mask"):
        fitted.channel_contributions([True, False])
    with pytest.raises(ValueError, match="interval"):
        fitted.contribution_summary(interval=1.5)
    with pytest.raises(TypeError, match="interval"):
        fitted.contribution_summary(interval="90%")
    with pytest.raises(TypeError, match="RetailBSTS"):
        channel_contributions(object())
    with pytest.raises((RuntimeError, ValueError), match="fit"):
        RetailBSTS().channel_contributions()


def test_plot_contributions_draws_the_summary_and_the_truth(fitted, data):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    truth = data.truth["channel_contribution"].sum(0)
    ax = fitted.plot_contributions(truth=truth)
    summary = fitted.contribution_summary()
    names = fitted.channel_names
    # One row per channel, the first on top; the dots are the posterior means.
    labels = {label.get_text(): label.get_position()[1] for label in ax.get_yticklabels()}
    assert sorted(labels, key=labels.get, reverse=True) == names
    dots = ax.lines[0].get_xdata()
    assert list(dots) == pytest.approx([summary[n]["contribution"] for n in names])
    crosses = ax.collections[-1].get_offsets()[:, 0]
    assert list(crosses) == pytest.approx(truth.tolist())
    roas_ax = plot_contributions(fitted, kind="roas", interval=0.5)
    assert list(roas_ax.lines[0].get_xdata()) == pytest.approx(
        [fitted.contribution_summary(interval=0.5)[n]["roas"] for n in names]
    )
    with pytest.raises(ValueError, match="kind must be one of"):
        fitted.plot_contributions(kind="profit")
    with pytest.raises(ValueError, match="one value per channel"):
        fitted.plot_contributions(truth=[1.0])
    plt.close("all")


def _components_by_hand(model, max_draws, with_precision=True):
    """y_loc + scale (D + X beta + F E[x | y_{1:T}]) averaged over the same draws, the smoother
    run on the whole residual DLM (not per component), given the draws' weekly precisions
    under Student-t noise."""
    params = model._draw_subset(max_draws)
    y, u, X = model._data
    offset = model._mean_offset(params, u, X)
    dlm = model.state_space(params)
    precision = params.get("obs_precision") if with_precision else None
    smoothed = kalman_smoother(*dlm._args(y - offset, precision))
    F = dlm.matrices(1).observation_matrix[..., 0, :]  # (n, S)
    signal = offset + (smoothed.smoothed_means * F.unsqueeze(-2)).sum(-1)
    return model._y_loc + model._y_scale * signal.mean(0)


def test_sales_components_sum_to_the_smoothed_noise_free_sales(fitted):
    components = fitted.sales_components(max_draws=4)
    assert list(components) == ["goodwill", "trend", "seasonal", "regression"]
    T = fitted._data[0].shape[0]
    assert all(v.shape == (T,) and bool(torch.isfinite(v).all()) for v in components.values())
    function = sales_components(fitted, max_draws=4)
    assert all(torch.equal(function[name], value) for name, value in components.items())
    expected = _components_by_hand(fitted, 4)
    assert torch.allclose(sum(components.values()), expected, rtol=1e-9, atol=1e-6)


def test_sales_components_of_the_default_student_t_noise(data):
    with pytest.raises(TypeError, match="fitted RetailBSTS"):
        sales_components(object())
    model = short_fit(
        RetailBSTS(noise="student_t"), data, num_samples=4, warmup_steps=4, map_init_steps=5
    )
    components = model.sales_components(max_draws=4)
    # The weekly precisions matter: the smoother given them, not the Gaussian one.
    expected = _components_by_hand(model, 4)
    assert torch.allclose(sum(components.values()), expected, rtol=1e-9, atol=1e-6)
    gaussian = _components_by_hand(model, 4, with_precision=False)
    assert not torch.allclose(sum(components.values()), gaussian, rtol=1e-6, atol=1e-6)
    del model.samples["obs_precision"]
    with pytest.raises(ValueError, match="weekly precisions"):
        model.sales_components()


def test_model_data_runs_the_fitted_model(fitted, data):
    assert RetailBSTS().model_data is None
    sales, spend, covariates = fitted.model_data
    assert sales.dtype == torch.float64 and spend.shape == data.spend.shape
    draw = {name: value[0] for name, value in fitted.samples.items()}
    conditioned = pyro.poutine.condition(fitted.model, data=draw)
    trace = pyro.poutine.trace(conditioned).get_trace(*fitted.model_data)
    assert torch.isfinite(trace.log_prob_sum())
