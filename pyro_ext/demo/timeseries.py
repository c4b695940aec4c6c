"""Chapter ``timeseries``: exact HMM and dynamic linear model inference (thesis 2.4.2, 1.2.2)."""

import time

import pyro
import pyro.distributions as dist
import torch

FIGURES = ("timeseries_casino", "timeseries_co2_forecast")


def run(quick=False, figures=None):
    """Exact HMM and DLM inference: the dishonest casino and a Kalman-filtered CO2 forecast."""
    from pyro.infer import SVI, Trace_ELBO
    from pyro.infer.autoguide import AutoDelta

    from pyro_ext.datasets import load_co2
    from pyro_ext.timeseries import (
        DLM,
        DLMDistribution,
        LocalLinearTrend,
        Seasonal,
        forecast_interval,
        hmm_log_likelihood,
        hmm_viterbi,
    )

    print("== Chapter: exact state-space inference, HMMs and DLMs (thesis 2.4.2, 1.2.2) ==")
    trans = torch.tensor([[0.95, 0.05], [0.10, 0.90]], dtype=torch.float64)
    emission = torch.tensor([[1 / 6] * 6, [0.1] * 5 + [0.5]], dtype=torch.float64)
    generator = torch.Generator().manual_seed(0)
    num_rolls = 2000
    states = [0]
    for _ in range(num_rolls - 1):
        states.append(int(torch.multinomial(trans[states[-1]], 1, generator=generator)))
    states = torch.tensor(states)
    rolls = torch.multinomial(emission[states], 1, generator=generator)[:, 0]
    init = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
    obs_log_probs = emission.log().T[rolls]
    path, _ = hmm_viterbi(init, trans.log(), obs_log_probs)
    log_lik = hmm_log_likelihood(init, trans.log(), obs_log_probs)
    print(
        f"  dishonest casino, {num_rolls} rolls: log p(rolls) = {log_lik:.1f}; the Viterbi path "
        f"names the die correctly on {(path == states).double().mean():.1%} of the rolls"
    )
    if figures is not None:
        with figures.figure("timeseries_casino", panel_size=(9.0, 3.2)) as ax:
            shown = 400
            roll = torch.arange(1, shown + 1)
            ax.fill_between(
                roll, 0, states[:shown], step="mid", alpha=0.3, label="true die (1 = loaded)"
            )
            ax.step(roll, path[:shown] * 0.9 + 0.05, where="mid", color="C3", label="Viterbi path")
            sixes = roll[rolls[:shown] == 5]
            ax.plot(sixes, torch.full_like(sixes, 1.08, dtype=torch.float64), "|k", ms=6)
            ax.set_yticks([0, 1], ["fair", "loaded"])
            ax.set_ylim(-0.1, 1.15)
            ax.set_xlabel(f"roll (the first {shown} of {num_rolls}; ticks on top: a six)")
            ax.set_title(
                f"dishonest casino: the Viterbi path names the die on "
                f"{(path == states).double().mean():.1%} of the rolls"
            )
            ax.legend(loc="lower right", fontsize="small")

    co2 = load_co2("vis", dtype=torch.float64)[-264:]  # the last 22 years
    train, test = co2[:-24], co2[-24:]
    mean, sd = train.mean(), train.std()
    y = (train - mean) / sd
    sites = ("obs_scale", "level_scale", "slope_scale", "seasonal_scale")

    def build(scales):
        trend = LocalLinearTrend(scales["level_scale"], scales["slope_scale"], init_scale=2.0)
        return DLM(
            [trend, Seasonal(12, scales["seasonal_scale"], init_scale=2.0)], scales["obs_scale"]
        )

    def model(y):
        scales = {
            name: pyro.sample(name, dist.LogNormal(y.new_tensor(-3.0), 2.0)) for name in sites
        }
        pyro.sample("obs", DLMDistribution(build(scales), y.shape[-1]), obs=y)

    pyro.clear_param_store()
    guide = AutoDelta(model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    start = time.perf_counter()
    for _ in range(100 if quick else 300):
        svi.step(y)
    scales = {k: v.detach() for k, v in guide.median(y).items()}
    forecast = build(scales).forecast(y, num_steps=len(test))
    lower, upper = forecast_interval(
        forecast.observation_means, forecast.observation_covs, level=0.95
    )
    pred = forecast.observation_means[:, 0] * sd + mean
    covered = (
        ((test >= lower[:, 0] * sd + mean) & (test <= upper[:, 0] * sd + mean)).double().mean()
    )
    print(
        f"  Mauna Loa CO2, local linear trend + seasonal(12), MAP noise scales by SVI through the "
        f"Kalman likelihood ({time.perf_counter() - start:.1f} s):"
    )
    print(
        f"    2-year forecast MAE {(pred - test).abs().mean():.2f} ppm, "
        f"95% interval coverage {covered:.0%}"
    )
    if figures is None:
        return
    with figures.figure("timeseries_co2_forecast", panel_size=(8.0, 4.0)) as ax:
        history = 72  # the last 6 years of training data
        months = torch.arange(len(co2))
        ahead = months[len(train) :]
        ax.plot(months[-history - len(test) : len(train)], train[-history:], "k", label="training")
        ax.plot(ahead, test, "k.", label="held out")
        ax.plot(ahead, pred, "C0", label="forecast mean")
        ax.fill_between(
            ahead,
            lower[:, 0] * sd + mean,
            upper[:, 0] * sd + mean,
            color="C0",
            alpha=0.25,
            label="95% interval",
        )
        ax.set_xlabel("month (of the last 22 years)")
        ax.set_ylabel("CO2 (ppm)")
        ax.set_title(
            f"Mauna Loa CO2, 2-year Kalman forecast: MAE {(pred - test).abs().mean():.2f} ppm, "
            f"coverage {covered:.0%}"
        )
        ax.legend()
