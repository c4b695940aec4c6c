r"""Simulated weekly retail data for the Nerlove-Arrow BSTS of Gallego (2021), sec. 1.2.

The generative process mirrors the case study: weekly sales of a restaurant chain driven by

* a goodwill stock (discrete Nerlove-Arrow, eqs. (1.4)-(1.5))
  ``A_t = (1 - delta) A_{t-1} + sum_i q_i u_{i,t-lag} + eps_t``, ``eps_t ~ N(0, s_A^2)``;
* a local linear trend (level random walk with a small drift);
* yearly seasonality (period 52.18 weeks) with Christmas, Easter and summer peaks;
* a static regression on seven ambient covariates of the thesis' kinds (temperature,
  rainfall, unemployment, a price index, consumer confidence, holidays, sporting events),
  several of which have a zero coefficient;
* Gaussian or Student-t observation noise.

Spend is non-negative, spiky (flighted TV / OOH / radio bursts) or evenly spread (online,
search), as in the thesis' Figure 1.2.
"""

import math
from typing import NamedTuple

import torch

from ...ops.validation import check_choice, check_int, check_real

__all__ = ["RetailData", "simulate_retail"]

PERIOD = 365.25 / 7  # 52.18 weeks


class RetailData(NamedTuple):
    """Output of :func:`simulate_retail`.

    :ivar sales: ``(T,)`` weekly sales.
    :ivar spend: ``(T, k)`` non-negative advertising spend per channel.
    :ivar covariates: ``(T, p)`` ambient covariates.
    :ivar channel_names: ``k`` names.
    :ivar covariate_names: ``p`` names.
    :ivar truth: true values: ``delta``, ``ar`` (``1 - delta``), ``q`` ``(k,)``, ``beta``
        ``(p,)``, ``inclusion`` (bool ``(p,)``), ``goodwill`` ``(T,)``, ``level`` ``(T,)``,
        ``seasonal`` ``(T,)``, ``noise_scale``, ``goodwill_scale``, ``level_scale``,
        ``df`` (``None`` for Gaussian noise), ``spend_lag``.
    """

    sales: torch.Tensor
    spend: torch.Tensor
    covariates: torch.Tensor
    channel_names: list[str]
    covariate_names: list[str]
    truth: dict[str, object]


def _bump(week, centre, width):
    """Periodic Gaussian bump of the week-of-year (period 52.18)."""
    d = torch.remainder(week - centre + PERIOD / 2, PERIOD) - PERIOD / 2
    return torch.exp(-0.5 * (d / width) ** 2)


def simulate_retail(
    num_weeks=234,
    seed=0,
    noise="gaussian",
    df=5.0,
    delta=0.3,
    q=(0.02, 0.03, 0.05, 0.04, 0.0),
    beta=(0.4, 0.0, 0.0, 0.0, 0.0, 2.5, -1.5),
    noise_scale=1.0,
    goodwill_scale=0.2,
    level_scale=0.15,
    spend_lag=1,
    dtype=None,
):
    """Simulate ``num_weeks`` weeks of retail sales, spend and covariates.

    Deterministic given ``seed`` (a private :class:`torch.Generator` is used; the global RNG
    is untouched).

    Channels: ``tv`` (flighted bursts), ``ooh`` (bursts), ``online`` (even),
    ``search`` (even, seasonal), ``radio`` (bursts, zero effect by default).
    Covariates: ``avg_temp`` (deg C), ``avg_rain`` (mm), ``unemp_ix`` (%), ``price_ix``,
    ``cc_ix``, ``hols`` (0/1), ``sport_ev`` (0/1).  Spend is in thousands per week, so
    ``q`` is sales per thousand spent.

    :param str noise: ``"gaussian"`` or ``"student_t"`` (``df`` degrees of freedom).
    :param float delta: goodwill decay rate in (0, 1); the AR coefficient is ``1 - delta``.
    :param q: ``k = 5`` channel effectiveness coefficients.
    :param beta: ``p = 7`` covariate coefficients (zeros mark null regressors).
    :param int spend_lag: spend of week ``t - spend_lag`` enters the goodwill of week ``t``
        (1 as in eq. (1.4)).
    :returns: :class:`RetailData`.
    """
    num_weeks = check_int(num_weeks, "num_weeks", low=2)
    check_choice(noise, "noise", ("gaussian", "student_t"))
    delta = check_real(delta, "delta", 0, 1, low_open=True, high_open=True)
    spend_lag = check_int(spend_lag, "spend_lag", 0, 1)
    T = int(num_weeks)
    dtype = dtype or torch.get_default_dtype()
    g = torch.Generator().manual_seed(int(seed))

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    def rand(*shape):
        return torch.rand(*shape, generator=g, dtype=torch.float64)

    t = torch.arange(T, dtype=torch.float64)
    week = torch.remainder(t + 47.0, PERIOD)  # series starts late November
    christmas, easter, summer = (
        _bump(week, 51.5, 0.8),
        _bump(week, 14.0, 0.8),
        _bump(week, 31.0, 3.0),
    )

    # --- spend (thousands / week) -------------------------------------------------------
    def flighted(prob, mean, length):
        on = torch.zeros(T, dtype=torch.float64)
        i = 0
        starts = rand(T)
        while i < T:
            if starts[i] < prob:
                on[i : i + length] = 1.0
                i += length
            else:
                i += 1
        return on * mean * (0.6 + 0.8 * rand(T))

    tv = flighted(0.12, 120.0, 3)
    ooh = flighted(0.08, 80.0, 4)
    online = 25.0 * (1 + 0.2 * randn(T)).clamp(min=0.2) * (1 + 0.3 * christmas)
    search = 15.0 * (1 + 0.15 * randn(T)).clamp(min=0.2) * (1 + 0.5 * summer)
    radio = flighted(0.15, 30.0, 2)
    spend = torch.stack([tv, ooh, online, search, radio], -1).clamp(min=0.0)
    channel_names = ["tv", "ooh", "online", "search", "radio"]

    # --- ambient covariates --------------------------------------------------------------
    temp = 15 - 9 * torch.cos(2 * math.pi * (week - 3) / PERIOD) + 2.0 * randn(T)
    rain = (4 + 2 * torch.cos(2 * math.pi * week / PERIOD) + 2 * randn(T)).clamp(min=0.0)
    unemp = 12 + torch.cumsum(0.08 * randn(T), 0)
    price = 100 + torch.cumsum(0.03 + 0.1 * randn(T), 0)
    cc = torch.cumsum(0.3 * randn(T), 0) - 5
    hols = ((christmas > 0.5) | (easter > 0.5) | (rand(T) < 0.04)).to(torch.float64)
    sport = (rand(T) < 0.08).to(torch.float64)
    covariates = torch.stack([temp, rain, unemp, price, cc, hols, sport], -1)
    covariate_names = ["avg_temp", "avg_rain", "unemp_ix", "price_ix", "cc_ix", "hols", "sport_ev"]

    q = torch.as_tensor(q, dtype=torch.float64)
    beta = torch.as_tensor(beta, dtype=torch.float64)
    if q.shape != (5,) or beta.shape != (7,):
        raise ValueError("q must have 5 entries and beta 7 entries")

    # --- states -------------------------------------------------------------------------
    phi = 1.0 - float(delta)
    inflow = spend @ q
    goodwill = torch.zeros(T, dtype=torch.float64)
    a = inflow.mean().item() / float(delta) + goodwill_scale * randn(1).item()
    for s in range(T):
        u = inflow[s - spend_lag] if s - spend_lag >= 0 else inflow.mean()
        a = phi * a + u.item() + goodwill_scale * randn(1).item()
        goodwill[s] = a
    level = 100 + torch.cumsum(0.02 + level_scale * randn(T), 0)
    seasonal = 6 * christmas + 3 * easter + 4 * summer
    seasonal = seasonal - seasonal.mean()
    if noise == "gaussian":
        eps = noise_scale * randn(T)
    else:
        # Student-t as a scale mixture, z / sqrt(chi2_df / df), driven by the private
        # generator (chi2_df as a sum of df squared normals needs integer df: use Gamma).
        z = randn(T)
        w = (
            torch._standard_gamma(torch.full((T,), float(df) / 2, dtype=torch.float64), generator=g)
            * 2
        )
        eps = noise_scale * z / torch.sqrt(w / float(df))
    sales = level + goodwill + seasonal + covariates @ beta + eps
    truth = {
        "delta": float(delta),
        "ar": phi,
        "q": q.to(dtype),
        "beta": beta.to(dtype),
        "inclusion": beta != 0,
        "goodwill": goodwill.to(dtype),
        "level": level.to(dtype),
        "seasonal": seasonal.to(dtype),
        "noise_scale": float(noise_scale),
        "goodwill_scale": float(goodwill_scale),
        "level_scale": float(level_scale),
        "df": float(df) if noise == "student_t" else None,
        "spend_lag": spend_lag,
    }
    return RetailData(
        sales.to(dtype),
        spend.to(dtype),
        covariates.to(dtype),
        channel_names,
        covariate_names,
        truth,
    )
