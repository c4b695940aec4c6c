r"""
What each channel brought, per unit spent: the attribution of a fitted
:class:`~pyro_ext.models.bsts.RetailBSTS`.

**Definition (counterfactual "channel switched off").** The contribution of channel
:math:`i` over a set of weeks :math:`W` of the training period is the expected sales it
accounts for there: the model's mean sales minus its mean sales had channel :math:`i`
spent nothing in the training weeks, everything else (the other channels, the covariates,
the local level and the seasonality) unchanged,

.. math:: C_i(W) = \sum_{t \in W} \bigl(\mathbb E[y_t] - \mathbb E[y_t \mid u_{i,\cdot} = 0]\bigr)
   = q_i \sum_{t \in W} A_{i,t},

where :math:`A_{i,t}` is the goodwill one unit of :math:`q_i` builds from channel
:math:`i`'s own spend by the Nerlove-Arrow recursion of thesis eq. (1.4), :math:`A_{i,t} =
(1 - \delta) A_{i,t-1} + u_{i,t-\ell}` with the model's lag :math:`\ell` (``spend_lag``, 1
in the thesis, 0 for spend that acts within the week) and :math:`A_{i,0} = 0`. The
equality holds because the mean is linear in each channel's goodwill. The goodwill carried
in from before the data (``goodwill_start="steady"``) is not switched off: it was bought
before the training weeks. Each posterior draw of :math:`(\delta, q)` gives one draw of
:math:`C_i(W)`, in the sales' original units.

With a saturation curve (``saturation="hill"``) the same counterfactual reads
:math:`C_i(W) = q_i \sum_{t \in W} \bigl(f_i(S_{i,t}) - f_i(S^{\mathrm{before}}_{i,t})\bigr)`,
with :math:`S_{i,t}` the channel's whole stock (the goodwill from before the data
included) and :math:`S^{\mathrm{before}}_{i,t}` what is left of the goodwill from before the
data alone; :math:`A_{i,t}` is that difference. The channels stay additive, so switching one
off leaves the others' parts unchanged.

**Return on ad spend.** :math:`\mathrm{ROAS}_i(W) = C_i(W) / \sum_{t \in W} u_{i,t}`:
sales per unit of spend, as PyMC-Marketing reports it. Over a window that starts late,
the numerator includes goodwill bought before the window; over the whole training period
only the goodwill still unspent at its end is left out.
"""

import torch

from ...ops.validation import as_real_tensor
from .model import RetailBSTS

__all__ = [
    "channel_contributions",
    "contribution_summary",
    "plot_contributions",
    "response_curves",
    "roas",
    "sales_components",
]


def _check_model(model):
    if not isinstance(model, RetailBSTS):
        raise TypeError(f"model must be a fitted RetailBSTS, got {type(model).__name__}")
    model._check_fitted()


def _weeks(weeks, num_weeks, device=None):
    """Boolean mask ``(T,)`` on ``device`` of the training weeks ``weeks`` selects (all by
    default); checked on the host."""
    mask = torch.zeros(num_weeks, dtype=torch.bool, device="cpu")
    if weeks is None:
        return mask.fill_(True)
    if isinstance(weeks, slice):
        mask[weeks] = True
    else:
        if isinstance(weeks, bool) or not hasattr(weeks, "__iter__"):
            raise TypeError(
                "weeks must be None, a slice or a sequence of week indices of the training "
                f"period, got {type(weeks).__name__}"
            )
        index = torch.as_tensor(list(weeks), device="cpu")
        if index.dtype == torch.bool:
            raise TypeError("weeks must be week indices or a slice, not a boolean mask")
        if index.numel() and (index.min() < -num_weeks or index.max() >= num_weeks):
            raise ValueError(
                f"weeks must index the {num_weeks} training weeks (0 to {num_weeks - 1}), "
                f"got indices from {int(index.min())} to {int(index.max())}"
            )
        mask[index] = True
    if not bool(mask.any()):
        raise ValueError("weeks selects no training week")
    return mask.to(device)


def channel_goodwill(model) -> torch.Tensor:
    """The goodwill each channel's own training spend builds per unit of ``q``, per
    posterior draw: ``A`` ``(draws, T, k)`` in spend units (thesis eq. 1.4 with the
    model's ``spend_lag`` and carry-over, through the saturation curve if the model has
    one; the goodwill from before the data is not the training spend's)."""
    _check_model(model)
    _, u, _ = model._data
    params = {
        name: model.samples[name].to(torch.float64)
        for name in ("delta", "saturation")
        if name in model.samples
    }
    return model._attributable_stock(params, u) * model._u_scale


def channel_contributions(model, weeks=None) -> torch.Tensor:
    """
    Posterior draws of each channel's contribution to sales over ``weeks`` of the
    training period (all by default), ``(draws, k)``, in the sales' original units: the
    counterfactual "channel switched off" of the module docstring.

    :param RetailBSTS model: a fitted model.
    :param weeks: ``None`` (every training week), a ``slice`` or a sequence of week
        indices of the training period.
    """
    _check_model(model)
    goodwill = channel_goodwill(model)  # (draws, T, k)
    mask = _weeks(weeks, goodwill.shape[-2], goodwill.device)
    q = model.coefficient_draws()["q"].to(torch.float64)  # (draws, k), sales per spend unit
    return q * goodwill[:, mask].sum(-2)


def roas(model, weeks=None) -> torch.Tensor:
    """
    Posterior draws of each channel's return on ad spend over ``weeks`` (all training
    weeks by default), ``(draws, k)``: its contribution (:func:`channel_contributions`)
    divided by its spend over those weeks. A channel that spent nothing there gets NaN.
    """
    _check_model(model)
    contributions = channel_contributions(model, weeks)
    _, u, _ = model._data
    spend = (u * model._u_scale).to(torch.float64)
    mask = _weeks(weeks, spend.shape[0], spend.device)
    total = spend[mask].sum(0)
    return torch.where(total > 0, contributions / total, torch.full_like(contributions, torch.nan))


def sales_components(model, max_draws: int = 100) -> dict:
    r"""
    The training weeks' sales split into the model's additive parts, each ``(T,)``: the
    posterior mean, in the sales' original units, of

    * ``"goodwill"``: :math:`A_t = D_t + a_t`, the recursion of thesis eq. (1.4) on the spend
      (all channels, with the goodwill carried in from before the data) plus its
      disturbance :math:`a_t`;
    * ``"trend"``: the local level (and slope), the sales' mean included;
    * ``"seasonal"``: the seasonal harmonics (zeros without them);
    * ``"regression"``: :math:`x_t^\top \beta` (zeros without covariates).

    For each of ``max_draws`` posterior draws (evenly spaced), the stochastic states are the
    Kalman-smoothed means :math:`E[x_t \mid y_{1:T}]` of the residual DLM
    (:meth:`~pyro_ext.timeseries.DLM.decompose`); the parts are averaged over the draws. They
    sum to the posterior mean of the noise-free sales. Only the sum is identified: a
    constant, or a slow drift, can move between the trend and the goodwill, so compare the
    parts' shapes, not their levels. With Student-t noise (the default) each draw's smoother
    is conditioned on that draw's weekly precisions (the scale mixture's ``obs_precision``),
    so it is exact there too.
    """
    _check_model(model)
    params = model._draw_subset(max_draws)
    precision = params.get("obs_precision")
    if model.noise != "gaussian" and precision is None:
        raise ValueError(
            "sales_components needs the weekly precisions of the Student-t noise "
            "(posterior draws of 'obs_precision'), which this fit did not keep; fit with "
            "noise='gaussian' or with a method that samples them"
        )
    y, u, X = model._data
    with torch.no_grad():
        goodwill = model._goodwill(params, u)  # (n, T), D_t
        start = goodwill[..., :1]  # D_1, which the DLM's level holds
        regression = torch.zeros_like(goodwill)
        if "beta" in params:
            regression = (X * params["beta"].unsqueeze(-2)).sum(-1)
        dlm = model.state_space(params)
        # The residual's smoothed parts: goodwill disturbance, trend, then the seasonal.
        parts = list(dlm.decompose(y - (goodwill - start) - regression, precision).values())
    scale = model._y_scale
    seasonal = parts[2] if len(parts) > 2 else torch.zeros_like(goodwill)
    return {
        "goodwill": scale * (goodwill + parts[0]).mean(0),
        "trend": model._y_loc + scale * (parts[1] - start).mean(0),
        "seasonal": scale * seasonal.mean(0),
        "regression": scale * regression.mean(0),
    }


def contribution_summary(model, weeks=None, interval: float = 0.9) -> dict:
    """
    Per channel: the posterior mean and the central ``interval`` credible interval of its
    contribution and of its ROAS over ``weeks``, the spend there, and the posterior
    probability that the contribution is positive, as ``{channel: {...}}`` in the
    channels' order.
    """
    if isinstance(interval, bool) or not isinstance(interval, (int, float)):
        raise TypeError(f"interval must be a number in (0, 1), got {type(interval).__name__}")
    if not 0 < interval < 1:
        raise ValueError(f"interval must be in (0, 1), got {interval}")
    # A summary of host numbers: the draws come to the CPU once, wherever the model lives.
    contributions = channel_contributions(model, weeks).cpu()
    returns = roas(model, weeks).cpu()
    _, u, _ = model._data
    spend = (u * model._u_scale).to(torch.float64)[_weeks(weeks, u.shape[0], u.device)].sum(0)
    spend = spend.cpu()
    tails = torch.tensor(
        [(1 - interval) / 2, (1 + interval) / 2], dtype=torch.float64, device="cpu"
    )
    names = getattr(model, "channel_names", None) or [
        f"channel {i}" for i in range(contributions.shape[-1])
    ]
    summary = {}
    for i, name in enumerate(names):
        low, high = torch.quantile(contributions[:, i], tails).tolist()
        roas_low, roas_high = torch.nanquantile(returns[:, i], tails).tolist()
        summary[name] = {
            "contribution": float(contributions[:, i].mean()),
            "contribution_interval": (low, high),
            "roas": float(returns[:, i].nanmean()),
            "roas_interval": (roas_low, roas_high),
            "spend": float(spend[i]),
            "probability_positive": float((contributions[:, i] > 0).double().mean()),
        }
    return summary


def response_curves(model, spend) -> torch.Tensor:
    r"""
    Posterior draws of each channel's long-run response curve: the extra weekly sales,
    once the goodwill has settled, from spending ``spend`` every week in that channel,
    ``(draws, len(spend), k)`` in the sales' original units.

    A constant weekly spend :math:`s` settles channel :math:`i`'s goodwill stock at
    :math:`s / \delta_i` (thesis eq. 1.4 at its steady state, whatever the lag), so the
    response is :math:`q_i f_i(s / \delta_i)`: a straight line of slope :math:`q_i /
    \delta_i` (the long-run return per unit of weekly spend) for the linear goodwill, bending
    with ``saturation="hill"``, where :math:`f_i` is the channel's curve with its mean
    training stock. Where a curve flattens, more spend there buys little; comparing the
    channels' slopes at a planned spend says where the next unit of budget goes.

    :param RetailBSTS model: a fitted model.
    :param spend: ``(L,)`` non-negative weekly spend levels, in the spend's original units
        (the same levels for every channel).
    """
    _check_model(model)
    levels = as_real_tensor(spend, "spend", model.device).detach().to(torch.float64)
    if levels.dim() != 1 or levels.numel() == 0:
        raise ValueError(
            f"spend must be a 1-D sequence of weekly spend levels, got shape {tuple(levels.shape)}"
        )
    if not bool(torch.isfinite(levels).all()) or bool((levels < 0).any()):
        raise ValueError("spend must be finite and non-negative (weekly spend levels)")
    params = {
        name: model.samples[name].to(torch.float64)
        for name in ("delta", "saturation", "q")
        if name in model.samples
    }
    phi = model._channel_phi(params)  # (draws, k) or (draws, 1)
    delta = (1 - phi).clamp(min=torch.finfo(torch.float64).tiny)
    # Standardised steady stock per level and channel: (draws, L, k).
    stock = (levels[:, None] / model._u_scale) / delta.unsqueeze(-2)
    response = model._saturate(params, stock) * params["q"].unsqueeze(-2)
    return response * model._y_scale


PLOT_KINDS = ("contribution", "roas")


def plot_contributions(
    model, weeks=None, interval: float = 0.9, kind: str = "contribution", truth=None, ax=None
):
    """
    Each channel's posterior mean (dot) and central ``interval`` credible interval (bar)
    of its contribution (``kind="contribution"``, sales units) or its ROAS (``"roas"``)
    over ``weeks``, one row per channel, with ``truth`` (a sequence of ``k`` known values,
    e.g. a simulator's ``channel_contribution`` summed over the weeks) marked where given.
    Needs matplotlib, the ``plot`` extra (``pip install "pyro-ext[plot]"``).

    :returns: the matplotlib axes (a new figure's unless ``ax`` is given).
    """
    if not isinstance(kind, str) or kind not in PLOT_KINDS:
        raise ValueError(f"kind must be one of {PLOT_KINDS}, got {kind!r}")
    summary = contribution_summary(model, weeks, interval)
    names = list(summary)
    if truth is not None:
        truth = torch.as_tensor(truth, dtype=torch.float64).detach().cpu().flatten()
        if truth.numel() != len(names):
            raise ValueError(
                f"truth must have one value per channel ({len(names)}: {names}), got "
                f"{truth.numel()}"
            )
    try:
        import matplotlib.pyplot as plt
    except ImportError as error:  # the plot extra
        raise ImportError(
            'plot_contributions needs matplotlib: pip install "pyro-ext[plot]"'
        ) from error
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 0.5 * len(names) + 1.5))
    key = "contribution" if kind == "contribution" else "roas"
    means = [summary[name][key] for name in names]
    lows = [summary[name][f"{key}_interval"][0] for name in names]
    highs = [summary[name][f"{key}_interval"][1] for name in names]
    rows = list(range(len(names)))[::-1]  # the first channel on top
    errors = [[m - lo for m, lo in zip(means, lows)], [hi - m for m, hi in zip(means, highs)]]
    ax.errorbar(
        means,
        rows,
        xerr=errors,
        fmt="o",
        capsize=3,
        label=f"posterior mean, {interval:.0%} interval",
    )
    if truth is not None:
        ax.scatter(truth.tolist(), rows, marker="x", color="black", zorder=3, label="truth")
    ax.axvline(0.0, color="grey", linewidth=0.8)
    ax.set_yticks(rows)
    ax.set_yticklabels(names)
    ax.set_xlabel(
        "contribution (sales units)" if kind == "contribution" else "ROAS (sales per unit spent)"
    )
    ax.legend(loc="best")
    return ax
