"""Chapter ``bsts``: the retail structural time series and budget allocation (thesis 1.2)."""

import time

import torch

FIGURES = ("bsts_effects", "bsts_forecast", "bsts_frontier")


def run(quick=False, figures=None):
    """Thesis chapter 1.2: the retail structural model, its forecast and a budget frontier."""
    from pyro_ext.models.bsts import RetailBSTS, allocate_budget, pareto_frontier, simulate_retail

    print("== Chapter: retail Bayesian structural time series (thesis 1.2) ==")
    data = simulate_retail(num_weeks=156, seed=0)
    train = 104
    model = RetailBSTS(variant="RF", noise="gaussian")
    start = time.perf_counter()
    model.fit(
        data.sales[:train],
        data.spend[:train],
        data.covariates[:train],
        method="sgld",
        seed=0,
        channel_names=data.channel_names,
        covariate_names=data.covariate_names,
        **({"num_samples": 100, "warmup_steps": 200} if quick else {}),
    )
    elapsed = time.perf_counter() - start
    coefs = model.coefficients()
    rhat = max(float(r.max()) for r in model.rhat().values())
    print(
        f"  simulated retailer, 5 channels, 7 covariates, {train} training weeks: fitted by "
        f"SG-MCMC in {elapsed:.1f} s (max R-hat {rhat:.2f})"
    )
    (elbo0, _), (elbo1, _) = model.spend_lag_evidence[0], model.spend_lag_evidence[1]
    print(
        f"    spend lag chosen by the evidence: {model.spend_lag} (ELBO {elbo0:.1f} at lag 0, "
        f"{elbo1:.1f} at lag 1; truth {data.truth['spend_lag']})"
    )
    carry = ", ".join(
        f"{name} {float(m):.2f} +- {float(sd):.2f}"
        for name, m, sd in zip(data.channel_names, coefs["ar"]["mean"], coefs["ar"]["sd"])
    )
    print(f"    goodwill carry-over 1-delta per channel: {carry} (truth {data.truth['ar']:.2f})")
    q_true = ", ".join(f"{float(v):.3f}" for v in data.truth["q"])
    q_est = ", ".join(f"{float(v):.3f}" for v in coefs["q"]["mean"])
    print(f"    spend effects q: {q_est} (truth {q_true})")
    inclusion = model.inclusion_probabilities()
    selected = ", ".join(
        f"{name} {float(p):.2f}{'*' if true else ''}"
        for name, p, true in zip(data.covariate_names, inclusion, data.truth["inclusion"])
    )
    print(
        f"    P(covariate included), point-mass spike and Gibbs moves (* truly non-zero): {selected}"
    )
    # What each channel brought over the training weeks: the counterfactual "channel switched
    # off", against the simulator's own (the sales it adds with the true decay and q).
    summary = model.contribution_summary(interval=0.9)
    true_contribution = data.truth["channel_contribution"][:train].sum(0)
    rows = ", ".join(
        f"{name} {row['contribution']:.0f} [{row['contribution_interval'][0]:.0f}, "
        f"{row['contribution_interval'][1]:.0f}] (truth {float(t):.0f})"
        for (name, row), t in zip(summary.items(), true_contribution)
    )
    print(f"    contributions over the training weeks, mean [90 % interval]: {rows}")
    # The long-run response curve at 10 units a week, every week: with the linear goodwill a
    # line through 0, so this is 10 x the long-run return per unit of weekly spend, q / delta.
    curve = model.response_curves([10.0])[:, 0]  # (draws, channels)
    low, high = torch.quantile(curve, torch.tensor([0.05, 0.95], dtype=curve.dtype), dim=0)
    true_curve = 10.0 * data.truth["q"].double() / data.truth["delta"]
    settled = ", ".join(
        f"{name} {float(m):.1f} [{float(lo):.1f}, {float(hi):.1f}] (truth {float(t):.1f})"
        for name, m, lo, hi, t in zip(data.channel_names, curve.mean(0), low, high, true_curve)
    )
    print(f"    long-run extra weekly sales from 10 a week, every week [90 %]: {settled}")
    draws = model.forecast(data.spend[train:], data.covariates[train:])
    truth = data.sales[train:]
    mape = float(((draws.mean(0) - truth).abs() / truth.abs()).mean())
    print(f"    {len(truth)}-week forecast MAPE {mape:.1%}")
    budget = float(data.spend[:train].sum(-1).mean())
    best = allocate_budget(model, budget)
    best_channel = model.channel_names[int(best.spend.argmax())]
    top_channel = model.channel_names[int(data.truth["q"].argmax())]
    print(
        f"    next-week budget {budget:.0f}: the max-mean plan puts "
        f"{float(best.spend.max() / budget):.0%} on {best_channel} "
        f"(the channel with the largest true q: {top_channel})"
    )
    frontier = pareto_frontier(model, budget, num_points=4)
    points = "; ".join(
        f"sd {float(sd):.1f} -> mean {float(m):.1f}" for sd, m in zip(frontier.sd, frontier.mean)
    )
    print(f"    risk-return frontier of next-week sales: {points}")
    if figures is None:
        return

    with figures.figure("bsts_effects", 1, 2) as (effects, included):
        channels = torch.arange(len(data.channel_names)).numpy()
        effects.bar(channels - 0.2, data.truth["q"].numpy(), 0.4, color="0.6", label="truth")
        effects.bar(
            channels + 0.2,
            coefs["q"]["mean"].numpy(),
            0.4,
            yerr=2 * coefs["q"]["sd"].numpy(),
            capsize=3,
            label="posterior mean +- 2 sd",
        )
        effects.set_xticks(channels, data.channel_names, rotation=30)
        effects.set_ylabel("sales per unit of spend, q")
        effects.set_title("spend effect per channel")
        effects.legend(fontsize="small")
        covariates = torch.arange(len(data.covariate_names)).numpy()
        colors = ["C2" if true else "C3" for true in data.truth["inclusion"].tolist()]
        included.bar(covariates, inclusion.numpy(), color=colors)
        included.set_xticks(covariates, data.covariate_names, rotation=30)
        included.set_ylim(0, 1.05)
        included.set_ylabel("P(covariate included | sales)")
        included.set_title("variable selection (green: truly non-zero)")

    with figures.figure("bsts_forecast", panel_size=(8.0, 4.0)) as ax:
        weeks = torch.arange(len(data.sales))
        ahead = weeks[train:]
        low, high = torch.quantile(draws.double(), torch.tensor([0.05, 0.95]).double(), dim=0)
        ax.plot(weeks[:train], data.sales[:train], "k", lw=1, label="training sales")
        ax.plot(ahead, truth, "k.", ms=3, label="held-out sales")
        ax.plot(ahead, draws.mean(0), "C0", label="forecast mean")
        ax.fill_between(ahead, low, high, color="C0", alpha=0.25, label="90% predictive band")
        ax.axvline(train - 0.5, color="grey", ls="--", lw=1)
        ax.set_xlabel("week")
        ax.set_ylabel("weekly sales")
        ax.set_title(f"simulated retailer: {len(truth)}-week forecast, MAPE {mape:.1%}")
        ax.legend(fontsize="small")

    with figures.figure("bsts_frontier", 1, 2) as (curve, plans):
        curve.plot(frontier.sd, frontier.mean, "o-")
        curve.set_xlabel("sd of next-week sales")
        curve.set_ylabel("mean of next-week sales")
        curve.set_title(f"risk-return frontier, budget {budget:.0f}")
        bottom = torch.zeros(len(frontier.sd), dtype=torch.float64)
        rows = torch.arange(len(frontier.sd)).numpy()
        for j, name in enumerate(frontier.channel_names):
            share = frontier.spend[:, j].double() / budget
            plans.bar(rows, share.numpy(), bottom=bottom.numpy(), label=name)
            bottom = bottom + share
        plans.set_xticks(rows, [f"sd {float(sd):.1f}" for sd in frontier.sd])
        plans.set_ylabel("share of the budget (the rest unspent)")
        plans.set_title("the plan along the frontier")
        plans.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1, 1))
