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

``random_truth=True`` draws the truth (decay rate, which channels and covariates matter and
by how much) from the seed as well, for benchmarks of variable selection and interval
coverage over many different truths rather than one.
"""

import math
from typing import NamedTuple

import torch

from ...ops.validation import check_choice, check_int, check_real

__all__ = ["RetailData", "simulate_retail"]

PERIOD = 365.25 / 7  # 52.18 weeks

# Today's fixed truth (``random_truth=False``).
DEFAULT_DELTA = 0.3
DEFAULT_Q = (0.02, 0.03, 0.05, 0.04, 0.0)
DEFAULT_BETA = (0.4, 0.0, 0.0, 0.0, 0.0, 2.5, -1.5)

# ``random_truth=True``: the ranges the truth is drawn from.
RANDOM_DELTA = (0.15, 0.6)
RANDOM_CHANNEL_PROB = 0.7  # each channel effective with this probability ...
RANDOM_MIN_CHANNELS = 2  # ... conditioned on at least this many effective channels
RANDOM_CHANNEL_EFFECT = (0.75, 2.0)  # sd of an effective channel's goodwill, in noise sds
RANDOM_COVARIATE_PROB = 0.4  # each covariate matters with this probability ...
RANDOM_COVARIATES = (1, 4)  # ... conditioned on this many (inclusive) mattering
RANDOM_COVARIATE_EFFECT = (0.5, 1.5)  # |beta| x sd of its covariate, in noise sds
RANDOM_WALK_COVARIATES = ("unemp_ix", "price_ix", "cc_ix")


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
        ``df`` (``None`` for Gaussian noise), ``spend_lag``, ``channel_contribution``
        ``(T, k)`` (what each channel's spend within the simulated weeks adds to each
        week's sales: the sales minus those with that spend switched off, the goodwill
        from before the data kept; the truth of
        :func:`~pyro_ext.models.bsts.channel_contributions`); with ``random_truth=True`` also
        ``random_truth`` (``True``), ``channel_inclusion`` (bool ``(k,)``, ``q != 0``),
        ``channel_effect`` ``(k,)`` (sd of each channel's goodwill contribution over the
        simulated weeks, in noise sds; 0 for an ineffective channel) and
        ``covariate_effect`` ``(p,)`` (``beta_j`` times the sd of covariate ``j``, in noise
        sds, signed; 0 for a null covariate).
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


def _truth_generator(seed):
    """The generator of ``random_truth``: seeded by ``seed`` but not the data's stream."""
    return torch.Generator().manual_seed((int(seed) * 0x9E3779B97F4A7C15 + 0x5EED) % 2**63)


def _bernoulli_subset(g, n, prob, low, high):
    """``n`` independent Bernoulli(``prob``) flags conditioned on ``low <= sum <= high``
    (rejection)."""
    while True:
        flags = torch.rand(n, generator=g, dtype=torch.float64) < prob
        if low <= int(flags.sum()) <= high:
            return flags


def _random_truth(seed, spend, covariates, spend_lag, noise_scale):
    """Draw ``delta``, ``q``, ``beta`` for ``random_truth=True`` (see :func:`simulate_retail`).

    All draws come first and in a fixed order, so they do not depend on the series length;
    only the conversion of effect sizes into ``q`` and ``beta`` reads the simulated spend
    and covariates.
    """
    g = _truth_generator(seed)

    def uniform(lo, hi, n=None):
        u = torch.rand(n or 1, generator=g, dtype=torch.float64)
        return lo + (hi - lo) * (u if n else u[0])

    k, p = spend.shape[1], covariates.shape[1]
    delta = float(uniform(*RANDOM_DELTA))
    channels = _bernoulli_subset(g, k, RANDOM_CHANNEL_PROB, RANDOM_MIN_CHANNELS, k)
    channel_effect = torch.where(
        channels, uniform(*RANDOM_CHANNEL_EFFECT, k), torch.zeros(k, dtype=torch.float64)
    )
    included = _bernoulli_subset(g, p, RANDOM_COVARIATE_PROB, *RANDOM_COVARIATES)
    sign = torch.where(torch.rand(p, generator=g, dtype=torch.float64) < 0.5, -1.0, 1.0)
    magnitude = uniform(*RANDOM_COVARIATE_EFFECT, p)
    covariate_effect = torch.where(included, sign * magnitude, torch.zeros(p, dtype=torch.float64))

    # Goodwill contribution of each channel with q_i = 1 (the states' recursion, noise-free).
    phi, T = 1.0 - delta, spend.shape[0]
    unit = torch.zeros(T, k, dtype=torch.float64)
    a = spend.mean(0) / delta
    for s in range(T):
        u = spend[s - spend_lag] if s - spend_lag >= 0 else spend.mean(0)
        a = phi * a + u
        unit[s] = a
    unit_sd = unit.std(0) if T > 1 else torch.zeros(k, dtype=torch.float64)
    # A channel that never varies over a (very short) series has no scale to set q by: it
    # gets q = effect x 0.03 x noise_scale, today's typical magnitude; likewise a constant
    # covariate's beta is its effect (in noise sds) as if its sd were 1.
    ones = torch.ones(k, dtype=torch.float64)
    usable = torch.isfinite(unit_sd) & (unit_sd > 0)
    q = noise_scale * torch.where(
        usable, channel_effect / unit_sd.where(usable, ones), 0.03 * channel_effect
    )
    x_sd = covariates.std(0) if T > 1 else torch.zeros(p, dtype=torch.float64)
    usable = torch.isfinite(x_sd) & (x_sd > 0)
    beta = noise_scale * covariate_effect / x_sd.where(usable, torch.ones(p, dtype=torch.float64))
    return {
        "delta": delta,
        "q": q,
        "beta": beta,
        "channel_effect": channel_effect,
        "covariate_effect": covariate_effect,
    }


def _coefficients(value, name, size, what):
    """``q`` / ``beta`` as a finite ``(size,)`` float64 tensor, or an error naming it."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be {size} numbers (one per {what[:-1]}), got a string")
    try:
        value = torch.as_tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(f"{name} must be {size} numbers (one per {what[:-1]}): {error}") from None
    if value.shape != (size,):
        raise ValueError(
            f"{name} must have {size} entries (one per {what[:-1]}; the simulator has {size} "
            f"{what}), got shape {tuple(value.shape)}"
        )
    bad = ~torch.isfinite(value)
    if bool(bad.any()):
        j = int(bad.nonzero()[0, 0])
        raise ValueError(f"{name} must be finite: {name}[{j}] is {float(value[j])}")
    return value


def simulate_retail(
    num_weeks=234,
    seed=0,
    noise="gaussian",
    df=5.0,
    delta=None,
    q=None,
    beta=None,
    noise_scale=1.0,
    goodwill_scale=0.2,
    level_scale=0.15,
    spend_lag=1,
    dtype=None,
    random_truth=False,
    seasonal_spend=True,
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
    :param float delta: goodwill decay rate in (0, 1); the AR coefficient is ``1 - delta``
        (default 0.3).
    :param q: ``k = 5`` channel effectiveness coefficients (default
        ``(0.02, 0.03, 0.05, 0.04, 0.0)``).
    :param beta: ``p = 7`` covariate coefficients (zeros mark null regressors; default
        ``(0.4, 0.0, 0.0, 0.0, 0.0, 2.5, -1.5)``).
    :param int spend_lag: spend of week ``t - spend_lag`` enters the goodwill of week ``t``
        (1 as in eq. (1.4)).
    :param bool random_truth: draw ``delta``, ``q`` and ``beta`` from the seed too (then
        they must not be given: a :class:`ValueError` otherwise).  The spend, covariates
        and noise are the same as with ``random_truth=False`` and the same seed; the truth
        comes from a second generator seeded by ``seed``, and its discrete part (which
        channels and covariates matter, their effect sizes in noise sds, ``delta``) does
        not depend on ``num_weeks``:

        * ``delta ~ Uniform(0.15, 0.6)``;
        * each channel is effective with probability 0.7, conditioned on at least 2 being
          so; an effective channel's ``q_i > 0`` is set so that the sd over the simulated
          weeks of its goodwill contribution (spend filtered by the true decay, with
          ``q_i = 1`` and the spend lag) equals ``Uniform(0.75, 2.0)`` noise sds (today's
          defaults give about 2 for ``tv`` and ``ooh`` and 0.3-0.7 for the evenly spread
          ``online`` and ``search``); the others are exactly 0;
        * each covariate matters with probability 0.4, conditioned on 1 to 4 mattering; a
          mattering covariate gets a random sign and ``|beta_j| = Uniform(0.5, 1.5) x
          noise_scale / sd(x_j)`` (the sd over the simulated weeks), so that one sd of it
          moves sales by 0.5-1.5 noise sds; the others are exactly 0.  ``unemp_ix``,
          ``price_ix`` and ``cc_ix`` are random walks, the hardest nulls (a random-walk
          regressor can stand in for part of the local level).

        Everything drawn is recorded in ``truth``.
    :param bool seasonal_spend: ``online`` spend rises with the Christmas peak in demand
        (by up to 30 %) and ``search`` with the summer one (50 %), as a marketer's would;
        ``False`` keeps both flat around their means, with the same random draws, so that
        a channel's spend is not confounded with the seasonal demand.
    :returns: :class:`RetailData`.
    """
    num_weeks = check_int(num_weeks, "num_weeks", low=2)
    check_choice(noise, "noise", ("gaussian", "student_t"))
    if not isinstance(random_truth, bool):
        raise TypeError(f"random_truth must be a bool, got {type(random_truth).__name__}")
    if not isinstance(seasonal_spend, bool):
        raise TypeError(f"seasonal_spend must be a bool, got {type(seasonal_spend).__name__}")
    if random_truth:
        given = [n for n, v in (("delta", delta), ("q", q), ("beta", beta)) if v is not None]
        if given:
            raise ValueError(
                f"random_truth=True draws delta, q and beta from the seed: do not give "
                f"{', '.join(given)}"
            )
    else:
        delta = DEFAULT_DELTA if delta is None else delta
        q = DEFAULT_Q if q is None else q
        beta = DEFAULT_BETA if beta is None else beta
        delta = check_real(delta, "delta", 0, 1, low_open=True, high_open=True)
    spend_lag = check_int(spend_lag, "spend_lag", 0, 1)
    seed = check_int(seed, "seed")
    noise_scale = check_real(noise_scale, "noise_scale", low=0)
    goodwill_scale = check_real(goodwill_scale, "goodwill_scale", low=0)
    level_scale = check_real(level_scale, "level_scale", low=0)
    if noise == "student_t":
        df = check_real(df, "df", low=0, low_open=True)
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be None or a torch.dtype such as torch.float64, got {dtype!r}")
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating point torch.dtype, got {dtype}")
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
    online = 25.0 * (1 + 0.2 * randn(T)).clamp(min=0.2)
    search = 15.0 * (1 + 0.15 * randn(T)).clamp(min=0.2)
    if seasonal_spend:
        online, search = online * (1 + 0.3 * christmas), search * (1 + 0.5 * summer)
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

    if random_truth:
        drawn = _random_truth(int(seed), spend, covariates, spend_lag, float(noise_scale))
        delta, q, beta = drawn["delta"], drawn["q"], drawn["beta"]
    q = _coefficients(q, "q", 5, "channels")
    beta = _coefficients(beta, "beta", 7, "covariates")

    # --- states -------------------------------------------------------------------------
    phi = 1.0 - float(delta)
    inflow = spend @ q
    goodwill = torch.zeros(T, dtype=torch.float64)
    a = inflow.mean().item() / float(delta) + goodwill_scale * randn(1).item()
    for s in range(T):
        u = inflow[s - spend_lag] if s - spend_lag >= 0 else inflow.mean()
        a = phi * a + u.item() + goodwill_scale * randn(1).item()
        goodwill[s] = a
    # What each channel's own spend in the data adds to sales, week by week: the sales
    # minus those with that spend switched off (the goodwill from before the data stays).
    lagged = torch.cat([torch.zeros(spend_lag, spend.shape[1], dtype=spend.dtype), spend])[:T]
    own = torch.zeros(T, spend.shape[1], dtype=torch.float64)
    for s in range(T):
        own[s] = (phi * own[s - 1] if s else 0.0) + lagged[s]
    channel_contribution = own * q
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
        "channel_contribution": channel_contribution.to(dtype),
        "level": level.to(dtype),
        "seasonal": seasonal.to(dtype),
        "noise_scale": float(noise_scale),
        "goodwill_scale": float(goodwill_scale),
        "level_scale": float(level_scale),
        "df": float(df) if noise == "student_t" else None,
        "spend_lag": spend_lag,
    }
    if random_truth:
        truth["random_truth"] = True
        truth["channel_inclusion"] = q != 0
        truth["channel_effect"] = drawn["channel_effect"].to(dtype)
        truth["covariate_effect"] = drawn["covariate_effect"].to(dtype)
    return RetailData(
        sales.to(dtype),
        spend.to(dtype),
        covariates.to(dtype),
        channel_names,
        covariate_names,
        truth,
    )
