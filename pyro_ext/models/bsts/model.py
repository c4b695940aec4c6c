r"""Retail Bayesian structural time series with Nerlove-Arrow goodwill (Gallego 2021, 1.2).

Model (all on the standardised scale, see :meth:`RetailBSTS.fit`)::

    y_t = A_t + mu_t + s_t + x_t' beta + v_t,                       v_t ~ N(0, sigma^2) or t_nu
    A_t = (1 - delta) A_{t-1} + sum_i q_i u_{i,t-lag} + e_t,        e_t ~ N(0, sigma_A^2)
    mu_t: local level (or local linear trend);  s_t: trigonometric seasonal, period 52.18

That is the thesis' eq. (1.4) (``THESIS_MODEL``: ``spend_lag=1``,
``carryover="shared"``, and real-valued ``q``: ``effects="real"``).  By default each
channel's goodwill decays at its own rate, ``q >= 0`` (``effects="non_negative"``),
``D_{i,t} = (1 - delta_i) D_{i,t-1} + q_i u_{i,t-lag}`` with ``A_t = sum_i D_{i,t} + a_t``
(``carryover="per_channel"``), and the lag (0: this week's spend is in this week's
goodwill; 1: last week's) is chosen by :meth:`RetailBSTS.fit` from the evidence
(``spend_lag="auto"``).

**How spend enters, exactly.**  The goodwill recursion is linear, so ``A_t = D_t + a_t`` with
the deterministic distributed lag (Koyck) ``D_t = (1 - delta) D_{t-1} + sum_i q_i u_{i,t-lag}``
and the zero-input AR(1) ``a_t = (1 - delta) a_{t-1} + e_t`` whose initial value carries the
prior of ``A_1`` around ``D_1``.  ``D`` is a known function of ``(delta, q, u)``, so
``y_t - D_t - x_t' beta`` is an ordinary time-invariant :class:`~pyro_ext.timeseries.DLM`
(AR(1) goodwill + trend + seasonal) and the Kalman log-likelihood of the residual equals the
likelihood of the thesis' eq. (1.4) form with time-varying ``G_t`` (an augmented constant
state carrying the input) *exactly*; the test suite checks both against a dense Gaussian.
The gain: static matrices use the fast blocked likelihood of
:func:`~pyro_ext.timeseries.kalman.kalman_log_likelihood` instead of the per-step scan.

**Where the goodwill starts.**  A series rarely starts with the first advertising: the spend
before the data has built goodwill too.  Starting the recursion at ``D = 0`` makes the model
see too little goodwill over the first ``~1 / delta`` weeks, which a larger decay explains
best, so ``delta`` was biased upwards: on the ten random simulated truths of
``benchmarks/bsts_selection.py`` (variant RF, point mass) its posterior mean by +0.11 on
average, and the 90 % interval covered the truth in 5 of them; with the start below, +0.06
and 7 of 10 (on three of the seeds it still misses, starting from the simulator's own mean
spend gives the same intervals: the rest of the bias is not the start's; in the model's own form,
sales rebuilt from the simulator's spend and truth without its holiday bumps and level drift,
the intervals held ``delta`` on 9 of 10 seeds, mean error +0.025 +- 0.012; with the
level's prior below, 8 of 10 and -0.010 +- 0.014, and 8 of 10 of the simulator's own series,
+0.036 +- 0.025: ``benchmarks/bsts_delta_bias.py``, ``results/bsts_selection.md``).  By default
(``goodwill_start="steady"``) each channel is taken to have spent, in each of the
``START_WEEKS = 52`` weeks before the data, its mean spend ``ubar_i`` over the first
``min(T, 52)`` weeks of the data (the training spend): the goodwill then starts at
``sum_i q_i ubar_i sum_{j<52} (1 - delta)^j``, the steady state ``sum_i q_i ubar_i / delta``
of that spend up to ``(1 - delta)^52`` (under 0.4 % for ``delta > 0.1``), and stays finite
as ``delta -> 0`` (a year of spend that never decays) where the steady state does not exist.
This is how :func:`simulate_retail` starts its goodwill (the steady state of the series'
mean inflow).  A year of spend averages over flighting bursts and over the seasonality of
the budget; the AR(1) part's prior on ``A_1`` (sd 1 on the standardised scale) takes up the
difference between the true start and this one.  The start is linear in ``q``
(``phi^{t + 1 - lag}`` times the geometric sum times ``ubar_i``, added to each channel's
adstocked spend), so the point mass's regression on ``q`` stays exact.
``goodwill_start="zero"`` keeps ``D = 0`` before the data (a brand whose advertising starts
with the series).

**Where the level starts.**  The sales are centred, so the media's share of them is taken
from the level: ``mu_1`` sits near ``-D_1``, and ``D_1`` (a channel's steady state, its
mean spend times ``q / delta``) is 6-9 sales sds on the project's simulator.  The level's
prior ``N(0, 2^2)`` is therefore put on ``mu_1 + D_1``, the first week's sales without the
noise, seasonal and regression, and not on ``mu_1``: the likelihood sees the goodwill as
``D_t - D_1`` and the level as ``mu_t + D_1`` (the same likelihood; only that prior
moves).  On ``mu_1`` alone the prior charged ``D_1^2 / 8`` nats for the media's
existence: a channel whose spend is always on, whose size only its spend's small
variations tell, came out at half its contribution with an interval that missed the
truth, and ``delta``, whose rise shrinks ``D_1``, was pulled upwards (``CHANGELOG``,
issue 33; the test ``test_an_always_on_channel_costs_nothing_in_the_level_prior``).

**Spike and slab, point mass** (``selection="point_mass"``, the default, as R's ``bsts``
of Scott & Varian 2014 that the thesis used).  Indicators ``gamma_j ~ Bernoulli(pi_j)``;
``beta_j = 0`` exactly where ``gamma_j = 0``, ``beta_j ~ N(0, slab^2)`` where it is 1.  Given
``delta`` the goodwill is linear in ``q`` (``D = U_delta q`` with the adstocked spend
``U_delta``), so ``[q, beta]`` are the coefficients of one Gaussian regression of ``y`` on
``[U_delta, X]`` with the DLM's noise, and both are integrated out exactly: the likelihood
``p(y | gamma, theta)`` comes from one whitening of the data and of the design by the DLM's
covariance (:meth:`~pyro_ext.timeseries.DLM.whiten`: one blocked Kalman filter pass over all
the columns at once, whose standardised prediction errors are the dense Cholesky
whitening; the same value as the Kalman filter with static regression states,
:class:`~pyro_ext.timeseries.Regression`, which the tests check).  The indicators move by
the collapsed Gibbs scan of ``bsts`` inside
:class:`~pyro_ext.infer.Gibbs`, the remaining continuous parameters (``delta``, the noise
scales) by SG-MCMC.  ``inclusion_probabilities()`` is the posterior frequency of
``gamma_j = 1``; the ``q`` and ``beta`` draws come from their exact conditional posterior
given each draw of ``(gamma, theta)`` (exactly 0 where excluded).  In variant ``"RA"`` the
channels have indicators ``gamma_q`` too.

**Spike and slab, narrow Gaussian spike** (``selection="ssvs"``, stochastic search
variable selection).  The discrete indicators are summed out
in closed form: with a narrow Gaussian spike, ``beta_i ~ pi_i N(0, slab^2) +
(1 - pi_i) N(0, spike^2)`` (:class:`SpikeSlabNormal`), which is the exact marginal of the
"narrow spike" spike-and-slab prior and is differentiable, so gradient samplers apply.  As
``gamma`` is independent of the data given ``beta``, the posterior inclusion probability
``p(gamma_i = 1 | y) = E[r_i(beta_i) | y]`` with the responsibility
``r_i = pi_i N(beta_i; 0, slab^2) / p(beta_i)`` averaged over posterior draws (exact, no
relaxation).  ``pi_i = 1`` (forced inclusion) gives a plain Gaussian slab and ``r_i = 1``.
The thesis' slab is conditional on sigma^2; here it is a fixed ``slab_scale`` on the
standardised scale, which avoids a sigma-beta funnel for gradient samplers.  Here
"included" means "``|beta_j|`` larger than about ``spike_scale``": the spike width is a
threshold of practical significance (in standardised units: sd of sales per sd of the
covariate), and the answer moves with it.  A covariate that soaks up a little of the
trend (a random walk, say) counts as included; the point mass does not have that problem
(``benchmarks/bsts_selection.py`` compares the two over simulated truths).

**Noise scales in polar coordinates.**  ``sigma_obs`` and ``sigma_goodwill`` are one site,
``noise_scales`` (:class:`NoiseScales`: the two HalfNormal priors unchanged), whose
unconstrained coordinates are the log of ``sqrt(sigma_obs^2 + sigma_goodwill^2)`` and the
logit of the angle between them (:class:`PolarTransform`).  When the goodwill decays fast
the two are nearly interchangeable white noise, so the data pin their total and leave
the split loose; in log-scales that is a curved ridge whose stiff flank made
unadjusted gradient samplers diverge.  Both scales are also reported as the draws
``sigma_obs`` and ``sigma_goodwill``.

**Variants** (thesis sec. 1.2.3, read as configurations of the priors):

* ``"B"``  baseline: goodwill + trend (+ seasonal); covariates are ignored; ``q`` Gaussian.
* ``"RA"`` all investment and ambient variables enter one spike-and-slab regression with
  ``pi = expected_model_size / (k + p)``: ``q_i`` *and* ``beta_j`` can be switched off.
* ``"RF"`` as RA but investment channels are forced in (``pi = 1`` for ``q``) and the
  ambient variables get ``pi = expected_model_size / p`` (a value above ``p`` is refused;
  by default ``pi = min(5, p / 2) / p``).

``q`` is non-negative by default (``effects="non_negative"``: a HalfNormal site that the
sampler moves, so the point mass then integrates out only ``beta``; the regression of the
point mass above is on the covariates alone, its response ``y - D``).  With
``effects="real"`` it is the thesis' real-valued ``q`` (the thesis reports negative
RADIO / TV coefficients), integrated out with ``beta``.
``holidays`` names (or indexes) covariates that are calendar effects: always included
(``pi = 1``).

**Saturation** (``saturation="hill"``; off by default, the thesis' linear goodwill).  A
channel whose spend varies widely meets diminishing returns: each channel's stock of
goodwill ``S_{i,t}`` (the recursion above on its spend, before ``q``) reaches sales through
a Hill curve of shape 1 (Michaelis-Menten), ``D_{i,t} = q_i f_i(S_{i,t})`` with

.. math:: f_i(S) = \frac{S}{1 + \lambda_i S / \bar S_i},

``\bar S_i`` the channel's mean stock over the training weeks and ``\lambda_i >= 0`` (the
site ``saturation``, HalfNormal(``saturation_scale``)) how far the curve has bent there: at
the mean stock the response is ``1 / (1 + lambda_i)`` of the linear one; ``lambda = 0`` is
the linear model.  The slope at zero is 1, so ``q_i`` stays the effect of the first unit of
spend (sales per unit of spend at low spend) and ROAS falls as spend grows.  Saturating the
stock (adstock, then saturation) is the order of Robyn's and PyMC-Marketing's defaults.  The
curve is concave: an S-shaped Hill curve (shape > 1) has zero slope at zero spend, which
weekly observational data rarely pin down.  The goodwill stays linear in ``q`` given
``(delta, lambda)``, so the point mass's collapse stays exact; forecasts, contributions
(switching a channel off keeps the goodwill from before the data:
``q_i [f_i(S_{i,t}) - f_i(S^{before}_{i,t})]``) and budget allocation, which then spreads
the budget over the channels, use the curve.  On the adstock-with-saturation simulator of
``benchmarks/bsts_attribution.py`` (seeds 0-9) it brings the median absolute error of the
large channels' contributions from 21 % to 18 % and the 90 % intervals' coverage from 92 % to
96 %; on the linear simulator it costs a little (14 % against 11 %, coverage 97 % against
88 %).  The evidence lower bound does not pick it there (larger than the linear model's on 2
of the 10 series): a mild curve shows in the contributions before it shows in the marginal
likelihood, so choose it for what you know of your spend, not by ELBO.
"""

import math

import pyro
import pyro.distributions as dist
import torch

from ...ops.validation import (
    as_real_tensor,
    check_choice,
    check_int,
    check_positive,
    check_real,
)
from ...timeseries.dlm import (
    DLM,
    Autoregressive,
    LinearGaussian,
    LocalLevel,
    LocalLinearTrend,
    Regression,
    dlm_observe,
)
from .collapsed import CollapsedLikelihood
from .distributions import ChannelEffectPrior, NoiseScales, PolarTransform, SpikeSlabNormal
from .fit import Fitting, _split_rhat
from .forecast import Forecasting
from .goodwill import START_WEEKS, _seasonal_matrices, goodwill_offset

__all__ = [
    "THESIS_MODEL",
    "ChannelEffectPrior",
    "NoiseScales",
    "PolarTransform",
    "RetailBSTS",
    "SpikeSlabNormal",
    "goodwill_offset",
]

VARIANTS = ("B", "RA", "RF")
NOISES = ("gaussian", "student_t")
TRENDS = ("local_level", "local_linear_trend")
SELECTIONS = ("point_mass", "ssvs")
GOODWILL_STARTS = ("steady", "zero")
CARRYOVERS = ("per_channel", "shared")
EFFECTS = ("non_negative", "real")
SATURATIONS = ("hill",)
# The thesis' model: the goodwill of eq. (1.4) (one decay rate, last week's spend) and
# real-valued channel effects.
THESIS_MODEL = {"spend_lag": 1, "carryover": "shared", "effects": "real"}
PERIOD = 365.25 / 7
# expected_model_size=None: min(DEFAULT_MODEL_SIZE, n / 2) of the n candidates.
DEFAULT_MODEL_SIZE = 5.0


def _check_pair(value, name, what):
    """``value`` must be a pair of numbers (checked one by one by the caller)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(f"{name} must be a pair {what}, got {value!r}")
    if len(value) != 2:
        raise ValueError(f"{name} must be a pair {what}, got {len(value)} values {value!r}")


def _check_holidays(holidays):
    """``holidays``: ``None`` or a list of covariate names (``str``) or indices (``int``);
    whether each names a covariate is checked by :meth:`RetailBSTS.fit`."""
    if holidays is None:
        return []
    if isinstance(holidays, (str, bytes)) or not hasattr(holidays, "__iter__"):
        raise TypeError(
            "holidays must be a list of covariate names or indices (e.g. ['hols'] or [5]), "
            f"got {holidays!r}"
        )
    out = []
    for h in holidays:
        out.append(h if isinstance(h, str) else check_int(h, "holidays (each index)", low=0))
    return out


def _check_roas_prior(roas_prior):
    """``roas_prior``: ``None`` or ``{channel name or index: (mean, sd)}`` with positive
    finite numbers; whether each key names a channel is checked by :meth:`RetailBSTS.fit`."""
    if roas_prior is None:
        return None
    if not isinstance(roas_prior, dict):
        raise TypeError(
            "roas_prior must be a dict {channel name or index: (mean, sd)} of returns on ad "
            f"spend, e.g. {{'tv': (2.0, 0.5)}}; got {type(roas_prior).__name__}"
        )
    out = {}
    for key, value in roas_prior.items():
        if not isinstance(key, str):
            key = check_int(key, "roas_prior (each channel index)", low=0)
        name = f"roas_prior[{key!r}]"
        _check_pair(value, name, "(mean, sd) of the channel's return on ad spend")
        mean = check_positive(value[0], f"{name}[0] (the mean ROAS)")
        sd = check_positive(value[1], f"{name}[1] (the sd of the ROAS)")
        out[key] = (float(mean), float(sd))
    return out


def _hn(scale, dtype, device=None):
    return dist.HalfNormal(torch.tensor(float(scale), dtype=dtype, device=device))


class RetailBSTS(Fitting, CollapsedLikelihood, Forecasting):
    r"""Nerlove-Arrow Bayesian structural time series for weekly retail sales.

    See the module docstring for the model, the exact treatment of spend and the
    spike-and-slab prior.  Example::

        data = simulate_retail()
        model = RetailBSTS(variant="RF", noise="gaussian")
        model.fit(data.sales, data.spend, data.covariates, method="sgld")
        model.coefficients()["q"]["mean"], model.inclusion_probabilities(), model.rhat()
        draws = model.forecast(spend_future, covariates_future)       # (num_draws, h)
        means, variances = model.sales_moments(spend_future)          # total sales

    :param str variant: ``"B"``, ``"RA"`` or ``"RF"``.
    :param float expected_model_size: expected number of included regressors, at most the
        number of regressors that the variant selects among (``p`` covariates for ``"RF"``,
        ``k + p`` channels and covariates for ``"RA"``; checked by :meth:`fit`): the prior
        inclusion probability is ``expected_model_size / that number``, and equal to it
        forces every one in.  ``None`` (default): ``min(5, n / 2)`` of the ``n``
        candidates, i.e. a prior inclusion probability of 1/2 for up to ten candidates and
        ``5 / n`` above (a fixed 5 would force every candidate in when there are at most
        five).
    :param str selection: ``"point_mass"`` (default: ``beta_j`` exactly 0 or drawn from
        the slab, ``beta`` integrated out by the Kalman filter, indicators moved by Gibbs)
        or ``"ssvs"`` (narrow Gaussian spike of sd ``spike_scale``, indicators summed
        out); see the module docstring.
    :param str noise: ``"gaussian"`` or ``"student_t"`` (scale mixture; ``df`` fixed).
    :param str trend: ``"local_level"`` or ``"local_linear_trend"``.
    :param int seasonal_harmonics: harmonics of the yearly trigonometric seasonal
        (``0``: none).
    :param float seasonal_period: in weeks (52.18 by default; need not be an integer).
    :param holidays: covariate names or indices always included (calendar effects).
    :param float df: Student-t degrees of freedom (> 2).
    :param spend_lag: ``"auto"`` (default: :meth:`fit` chooses 0 or 1 by the evidence,
        the larger ELBO of the two models' Gaussian approximations, and sets
        ``spend_lag`` to it; ``spend_lag_evidence`` keeps both), 1 (eq. (1.4): spend of
        week ``t-1`` builds goodwill of week ``t``) or 0 (contemporaneous: this week's
        spend is in this week's goodwill, as geometric adstock and a bsts regression on
        spend have it).  On the marketing-mix data of ``benchmarks/bsts_peers.py`` lag 0
        forecast the holdout better on both data sets, and a lag the data do not have
        turns contributions' signs (see ``benchmarks/results/bsts_attribution.md``).
    :param str carryover: ``"per_channel"`` (default: each channel's goodwill decays at
        its own rate ``delta_i``, a ``(k,)`` site with the ``delta_prior`` each; TV's and
        search's carry-over differ) or ``"shared"`` (one ``delta``, eq. (1.4)).  The part
        of the goodwill the spend does not explain (the AR(1) state) decays at the
        channels' mean rate.  ``THESIS_MODEL`` (``spend_lag=1``,
        ``carryover="shared"``, ``effects="real"``) is the thesis' model.
    :param effects: ``"non_negative"`` (the default, except with variant ``"RA"``): each
        channel's ``q_i >= 0`` with a HalfNormal(``q_scale``) prior, a site of its own that
        the sampler moves with ``delta`` and the noise scales (the covariates' ``beta``
        stay integrated out); spend cannot lower sales.  ``"real"``: the thesis' Gaussian
        ``q`` (``N(0, q_scale^2)``, integrated out by the point mass), which the thesis
        needed for its negative RADIO / TV estimates; variant RA's spike and slab on ``q``
        needs it.
    :param str goodwill_start: ``"steady"`` (default: the goodwill starts where a year of
        spend at the mean of the first weeks would have brought it, about its steady
        state) or ``"zero"`` (no goodwill before the data); see the module docstring.
    :param delta_prior: Beta ``(a, b)`` concentrations of the decay rate (both > 0; each
        channel's with ``carryover="per_channel"``).
    :param delta_range: ``(lo, hi)`` within ``[0, 1]``; ``delta = lo + (hi - lo) Beta(a, b)``.
    :param float slab_scale: slab sd (standardised units).
    :param float spike_scale: with ``selection="ssvs"``, the spike sd (standardised
        units), ``< slab_scale``: coefficients smaller than about this count as excluded,
        so it is a threshold of practical significance.
    :param float q_scale: prior sd of forced-in ``q`` (standardised units).
    :param saturation: ``None`` (default: the goodwill is linear in spend, as in the
        thesis) or ``"hill"``: each channel's goodwill stock reaches sales through a
        concave Hill curve whose bend ``lambda_i`` (site ``saturation``) is sampled; see
        the module docstring.
    :param float saturation_scale: with ``saturation="hill"``, the HalfNormal scale of each
        ``lambda_i`` (the response at the channel's mean stock is ``1 / (1 + lambda_i)`` of
        the linear one; the default 1 puts the prior median of that ratio at 0.6).
    :param roas_prior: ``None`` (default) or ``{channel: (mean, sd)}`` for channels whose
        return on ad spend a lift test (or experience) has measured: the ROAS over the
        training weeks (:meth:`roas`, sales per unit of spend) gets a log-normal prior of
        that mean and sd, the other channels keep the HalfNormal(``q_scale``) prior on
        ``q``.  A channel is named as in ``channel_names`` or by its column index.  Needs
        non-negative effects (the default).  The ROAS is ``q`` times the goodwill the
        channel's spend built (which depends on ``delta`` and the saturation), so the prior
        on ``q`` given those is the log-normal shifted by it: exact, not a penalty.
    :param prior_scales: dict overriding the HalfNormal scales of ``sigma_obs``,
        ``sigma_goodwill``, ``sigma_level``, ``sigma_slope``, ``sigma_season``.
    """

    def __init__(
        self,
        variant="RF",
        expected_model_size=None,
        selection="point_mass",
        noise="student_t",
        trend="local_level",
        seasonal_harmonics=2,
        seasonal_period=PERIOD,
        holidays=None,
        df=5.0,
        spend_lag="auto",
        carryover="per_channel",
        effects=None,
        goodwill_start="steady",
        delta_prior=(2.0, 2.0),
        delta_range=(0.0, 1.0),
        slab_scale=1.0,
        spike_scale=0.02,
        q_scale=1.0,
        saturation=None,
        saturation_scale=1.0,
        roas_prior=None,
        prior_scales=None,
    ):
        check_choice(variant, "variant", VARIANTS)
        check_choice(selection, "selection", SELECTIONS)
        check_choice(noise, "noise", NOISES)
        check_choice(trend, "trend", TRENDS)
        # None: min(5, n / 2) of the n candidates, set by fit (which refuses an asked-for
        # value above n: it would force every one in).
        self._expected_model_size_given = expected_model_size is not None
        expected_model_size = check_positive(
            DEFAULT_MODEL_SIZE if expected_model_size is None else expected_model_size,
            "expected_model_size",
        )
        seasonal_period = check_real(seasonal_period, "seasonal_period", low=2, low_open=True)
        seasonal_harmonics = check_int(seasonal_harmonics, "seasonal_harmonics", low=0)
        if seasonal_harmonics > seasonal_period / 2:
            raise ValueError(
                f"seasonal_harmonics must be an integer in [0, period/2], "
                f"got {seasonal_harmonics!r}"
            )
        df = check_real(df, "df", finite=False)
        if noise == "student_t" and not df > 2:
            raise ValueError(f"df must exceed 2 (finite variance), got {df!r}")
        if isinstance(spend_lag, str):
            if spend_lag != "auto":
                raise ValueError(f"spend_lag must be 0, 1 or 'auto', got {spend_lag!r}")
        else:
            spend_lag = check_int(spend_lag, "spend_lag", 0, 1)
        check_choice(carryover, "carryover", CARRYOVERS)
        check_choice(effects, "effects", EFFECTS, allow_none=True)
        if effects == "non_negative" and variant == "RA":
            raise ValueError(
                "effects='non_negative' cannot be combined with variant='RA': RA's spike and "
                "slab on the channels' q is Gaussian (the thesis' prior). Pass effects='real' "
                "(or None) with RA, or use variant='RF' for non-negative effects"
            )
        check_choice(goodwill_start, "goodwill_start", GOODWILL_STARTS)
        roas_prior = _check_roas_prior(roas_prior)
        if roas_prior and (effects == "real" or (effects is None and variant == "RA")):
            raise ValueError(
                "roas_prior needs non-negative channel effects (effects='non_negative', the "
                "default with variants B and RF): a return on ad spend is positive"
            )
        _check_pair(delta_prior, "delta_prior", "(a, b), the Beta concentrations")
        _check_pair(delta_range, "delta_range", "(lo, hi) within [0, 1]")
        a, b = delta_prior
        a = check_positive(a, "delta_prior[0] (a Beta concentration)")
        b = check_positive(b, "delta_prior[1] (a Beta concentration)")
        lo, hi = delta_range
        lo, hi = check_real(lo, "delta_range[0]", 0, 1), check_real(hi, "delta_range[1]", 0, 1)
        if not lo < hi:
            raise ValueError(f"delta_range must satisfy 0 <= lo < hi <= 1, got {delta_range!r}")
        spike_scale = check_positive(spike_scale, "spike_scale")
        slab_scale = check_positive(slab_scale, "slab_scale")
        if not spike_scale < slab_scale:
            raise ValueError("spike_scale and slab_scale must satisfy 0 < spike_scale < slab_scale")
        q_scale = check_positive(q_scale, "q_scale")
        check_choice(saturation, "saturation", SATURATIONS, allow_none=True)
        saturation_scale = check_positive(saturation_scale, "saturation_scale")
        self.variant, self.noise, self.trend = variant, noise, trend
        self.selection = selection
        self.expected_model_size = float(expected_model_size)
        self.seasonal_harmonics, self.seasonal_period = (
            int(seasonal_harmonics),
            float(seasonal_period),
        )
        self.holidays = _check_holidays(holidays)
        self.df = float(df)
        # spend_lag="auto": fit() chooses 0 or 1 by the evidence (its ELBO) and sets
        # spend_lag to the lag it chose; spend_lag_requested keeps what was asked for.
        self.spend_lag_requested = spend_lag
        self.spend_lag = None if spend_lag == "auto" else int(spend_lag)
        self.spend_lag_evidence = None
        self.carryover = carryover
        # None: non-negative effects, except for RA, whose spike and slab on q is Gaussian.
        self.effects = effects or ("real" if variant == "RA" else "non_negative")
        self.goodwill_start = goodwill_start
        self.saturation, self.saturation_scale = saturation, float(saturation_scale)
        self.roas_prior = roas_prior
        self._start_weeks = None  # set by fit: min(T, START_WEEKS) training weeks
        self.delta_prior, self.delta_range = (float(a), float(b)), (float(lo), float(hi))
        self.slab_scale, self.spike_scale, self.q_scale = (
            float(slab_scale),
            float(spike_scale),
            float(q_scale),
        )
        self.prior_scales = dict(
            sigma_obs=0.5, sigma_goodwill=0.2, sigma_level=0.1, sigma_slope=0.01, sigma_season=0.02
        )
        if prior_scales is not None and not isinstance(prior_scales, dict):
            raise TypeError(
                f"prior_scales must be a dict {{scale name: HalfNormal scale}} or None, got "
                f"{type(prior_scales).__name__}"
            )
        unknown = set(prior_scales or {}) - set(self.prior_scales)
        if unknown:
            raise ValueError(
                f"prior_scales has unknown keys {sorted(unknown, key=repr)}: the keys are "
                f"{sorted(self.prior_scales)}"
            )
        for key, value in (prior_scales or {}).items():
            self.prior_scales[key] = check_positive(value, f"prior_scales[{key!r}]")
        self.samples = None
        self.channel_names = None
        self.covariate_names = None
        self._mcmc = None
        self._chains = None

    # ------------------------------------------------------------------ data handling
    @staticmethod
    def _tensor(x, name, dim, device=None):
        if x is None:
            return None
        x = as_real_tensor(x, name, device)
        if not x.is_floating_point():
            x = x.to(torch.get_default_dtype())
        if x.dim() != dim:
            raise ValueError(f"{name} must have {dim} dims, got shape {tuple(x.shape)}")
        return x.detach().to(torch.float64)

    @staticmethod
    def _check_covariates(X, name="covariates"):
        """Covariates enter the mean at every week: NaN or +-inf there cannot be marginalised."""
        bad = ~torch.isfinite(X)
        if bool(bad.any()):
            t, j = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"{name} must be finite: {name}[{t}, {j}] is {float(X[t, j])} (first of "
                f"{int(bad.sum())} non-finite values); impute or drop those weeks"
            )

    @staticmethod
    def _check_sales(y, name="sales"):
        """NaN marks a missing week (the Kalman filter marginalises it); +-inf cannot be."""
        infinite = torch.isinf(y)
        if bool(infinite.any()):
            t = int(infinite.nonzero()[0, 0])
            raise ValueError(
                f"{name} must be finite, with NaN for missing weeks: {name}[{t}] is "
                f"{float(y[t])} (first of {int(infinite.sum())} infinite values)"
            )

    def _check_spend(self, spend, name="spend"):
        bad = ~torch.isfinite(spend)
        if bool(bad.any()):
            t, i = (int(j) for j in bad.nonzero()[0])
            raise ValueError(
                f"{name} must be finite (no NaN): {name}[{t}, {i}] is {float(spend[t, i])} "
                f"(first of {int(bad.sum())} non-finite values)"
            )
        negative = spend < 0
        if bool(negative.any()):
            t, i = (int(j) for j in negative.nonzero()[0])
            raise ValueError(
                f"{name} must be non-negative: {name}[{t}, {i}] is {float(spend[t, i])}"
            )

    @property
    def device(self):
        """The device of the data :meth:`fit` saw (forecasts, allocations and every other
        answer are computed there); ``None`` before :meth:`fit`."""
        return getattr(self, "_device", None)

    @property
    def dtype(self):
        """The floating dtype the model computes in (float64) once :meth:`fit` has seen the
        data; ``None`` before."""
        data = getattr(self, "_data", None)
        return None if data is None else data[0].dtype

    @property
    def model_data(self):
        """The ``(sales, spend, covariates)`` tensors of the last :meth:`fit`, as it prepared
        them for :meth:`model` (float64, on :attr:`device`, standardised where ``fit`` was
        asked to): ``pyro.poutine.trace(m.model).get_trace(*m.model_data)`` runs the fitted
        model. ``None`` before :meth:`fit`."""
        return getattr(self, "_data", None)

    @property
    def num_channels(self):
        return None if self.channel_names is None else len(self.channel_names)

    def _check_data_seen(self, what):
        if getattr(self, "_p", None) is None:
            raise ValueError(f"{what} is known once fit() has seen the data: call fit() first")

    @property
    def uses_covariates(self):
        """Whether the fitted model regresses on covariates (after :meth:`fit`)."""
        self._check_data_seen("uses_covariates")
        return self.variant != "B" and self._p > 0

    def _prior_inclusion(self, n):
        """The prior inclusion probability of each of ``n`` candidates: the asked-for
        ``expected_model_size / n``, or by default ``min(DEFAULT_MODEL_SIZE, n / 2) / n``
        (a half for up to ten candidates, so that a model with few candidates still
        selects)."""
        if getattr(self, "_expected_model_size_given", True):
            return min(1.0, self.expected_model_size / n)
        return min(DEFAULT_MODEL_SIZE, n / 2) / n

    def _priors_pi(self, k, p):
        pi_q = torch.ones(k, dtype=torch.float64, device=self.device)
        pi_b = torch.ones(p, dtype=torch.float64, device=self.device)
        if self.variant == "RA":
            pi = self._prior_inclusion(k + p)
            pi_q[:], pi_b[:] = pi, pi
        elif self.variant == "RF" and p:
            pi_b[:] = self._prior_inclusion(p)
        for h in self._holiday_idx:
            pi_b[h] = 1.0
        return pi_q, pi_b

    # ------------------------------------------------------------------ Pyro program
    def state_space(self, params, regression=None):
        """The :class:`~pyro_ext.timeseries.DLM` of the residual ``y - (D - D_1) - X beta``
        (its level holds ``mu + D_1``: "Where the level starts" in the module docstring) for
        parameter values ``params`` (a dict of posterior draws or of scalars; keys other
        than the DLM's are ignored). With ``regression`` ``(..., T, p)`` (the included
        covariates, ``X * gamma``), static regression states with prior
        ``N(0, slab_scale^2)`` come last: the DLM of ``y - (D - D_1)`` with ``beta``
        integrated."""
        sigma_obs, sigma_goodwill = params["sigma_obs"], params["sigma_goodwill"]
        sigma_level, sigma_season = params["sigma_level"], params.get("sigma_season")
        sigma_slope = params.get("sigma_slope")
        phi = 1.0 - params["delta"]
        if self._per_channel:
            # The goodwill the spend does not explain (its shocks, and the start's error)
            # decays at the channels' mean rate.
            phi = phi.mean(-1)
        comps = [Autoregressive(phi.unsqueeze(-1), sigma_goodwill, init_scale=1.0)]
        if self.trend == "local_level":
            comps.append(LocalLevel(sigma_level, init_scale=2.0))
        else:
            comps.append(LocalLinearTrend(sigma_level, sigma_slope, init_scale=2.0))
        if self.seasonal_harmonics:
            device = torch.as_tensor(sigma_season).device
            G, F = _seasonal_matrices(
                self.seasonal_period, self.seasonal_harmonics, torch.float64, device
            )
            n = G.shape[-1]
            eye = torch.eye(n, dtype=torch.float64, device=device)
            W = sigma_season.pow(2)[..., None, None] * eye
            comps.append(LinearGaussian(G, F, W, eye.new_zeros(n), eye.clone()))
        if regression is not None:
            comps.append(Regression(regression, init_scale=self.slab_scale))
        return DLM(comps, sigma_obs, self.df if self.noise == "student_t" else None)

    def _sample_params(self, k, p):
        f64, device = torch.float64, self.device
        a, b = self.delta_prior
        lo, hi = self.delta_range

        def scalar(value):
            return torch.tensor(value, dtype=f64, device=device)

        base = dist.Beta(scalar(a), scalar(b))
        if (lo, hi) != (0.0, 1.0):
            base = dist.TransformedDistribution(
                base,
                [dist.transforms.AffineTransform(scalar(lo), scalar(hi - lo))],
            )
        if self._per_channel:
            base = base.expand([k]).to_event(1)
        out = {"delta": pyro.sample("delta", base)}
        if self._saturated:
            bend = _hn(self.saturation_scale, f64, device).expand([k]).to_event(1)
            out["saturation"] = pyro.sample("saturation", bend)
        pi_q, pi_b = self._pi_q, self._pi_b
        if self.selection == "point_mass":
            # beta, and q unless it is non-negative, are integrated out (the model, below);
            # only the indicators are sampled.
            if self._q_sampled:
                if self._roas_prior_given:
                    prior = self._roas_effect_prior(out)
                else:
                    prior = self._coef_prior(pi_q, self.q_scale, True, non_negative=True)
                out["q"] = pyro.sample("q", prior.to_event(1))
            elif not self._q_forced:
                out["gamma_q"] = pyro.sample("gamma_q", dist.Bernoulli(pi_q).to_event(1))
            if self.uses_covariates and not self._beta_forced:
                out["gamma"] = pyro.sample("gamma", dist.Bernoulli(pi_b).to_event(1))
        else:
            if self._roas_prior_given:
                prior = self._roas_effect_prior(out)
            else:
                prior = self._coef_prior(pi_q, self.q_scale, self._q_forced, self._non_negative)
            out["q"] = pyro.sample("q", prior.to_event(1))
        if self.uses_covariates and self.selection == "ssvs":
            prior = self._coef_prior(pi_b, self.slab_scale, self._beta_forced)
            out["beta"] = pyro.sample("beta", prior.to_event(1))
        ps = self.prior_scales
        scales = pyro.sample("noise_scales", self._noise_scales_prior())
        out["noise_scales"] = scales
        out["sigma_obs"], out["sigma_goodwill"] = scales[..., 0], scales[..., 1]
        out["sigma_level"] = pyro.sample("sigma_level", _hn(ps["sigma_level"], f64, device))
        if self.trend == "local_linear_trend":
            out["sigma_slope"] = pyro.sample("sigma_slope", _hn(ps["sigma_slope"], f64, device))
        if self.seasonal_harmonics:
            out["sigma_season"] = pyro.sample("sigma_season", _hn(ps["sigma_season"], f64, device))
        return out

    def _coef_prior(self, pi, slab, forced, non_negative=False):
        # forced: every pi is 1 (read once at fit, not from the tensor at every call).
        if non_negative:
            # Only forced-in channels are non-negative (RA's spike and slab is refused).
            return dist.HalfNormal(torch.full_like(pi, slab))
        if forced:
            return dist.Normal(torch.zeros_like(pi), torch.full_like(pi, slab))
        return SpikeSlabNormal(pi, torch.full_like(pi, self.spike_scale), torch.full_like(pi, slab))

    @property
    def _roas_prior_given(self):
        # A model pickled before roas_prior existed has none.
        return bool(getattr(self, "roas_prior", None))

    def _resolve_roas_prior(self):
        """``roas_prior``'s channels as indices, and the log-normal's ``(mu, sigma)`` of each
        ``(k,)`` (``mask`` true where a ROAS prior is given); called by :meth:`fit` once the
        channel names and the training spend are known."""
        k = len(self.channel_names)
        _, u, _ = self._data
        spend = (u * self._u_scale).sum(-2)
        mu, sigma, mask = [0.0] * k, [1.0] * k, [False] * k
        for key, (mean, sd) in self.roas_prior.items():
            if isinstance(key, str):
                if key not in self.channel_names:
                    raise ValueError(
                        f"roas_prior names unknown channel {key!r}: the channels are "
                        f"{self.channel_names}"
                    )
                i = self.channel_names.index(key)
            else:
                if key >= k:
                    raise ValueError(
                        f"roas_prior index {key} is out of range for {k} channels (0 to {k - 1})"
                    )
                i = key
            if mask[i]:
                raise ValueError(f"roas_prior gives channel {self.channel_names[i]!r} twice")
            if not float(spend[i]) > 0:
                raise ValueError(
                    f"roas_prior gives channel {self.channel_names[i]!r} a ROAS, but it spent "
                    "nothing in the training weeks, where its ROAS is not defined"
                )
            # The log-normal with this mean and sd.
            var = math.log1p((sd / mean) ** 2)
            mu[i], sigma[i], mask[i] = math.log(mean) - var / 2, math.sqrt(var), True
        self._roas_lognormal = (
            u.new_tensor(mu),
            u.new_tensor(sigma),
            torch.tensor(mask, device=u.device),
        )

    def _roas_effect_prior(self, params):
        """The prior of ``q`` (standardised) given ``delta`` (and the saturation) under
        ``roas_prior``: ``ROAS_i = c_i q_i`` with ``c_i`` the training goodwill of the
        channel's spend per unit of ``q`` over its training spend (sales units per spend
        unit), so ``ROAS_i ~ LogNormal(mu_i, sigma_i)`` is ``q_i ~ LogNormal(mu_i - log c_i,
        sigma_i)``; HalfNormal(``q_scale``) for the other channels."""
        mu, sigma, mask = self._roas_lognormal
        _, u, _ = self._data
        per_unit = self._attributable_stock(params, u).sum(-2)  # (..., k)
        spend = (u * self._u_scale).sum(-2)
        tiny = torch.finfo(per_unit.dtype).tiny
        roas_per_q = per_unit.clamp(min=tiny) * self._y_scale / spend.clamp(min=tiny)
        loc = torch.where(mask, mu - roas_per_q.log(), torch.zeros_like(roas_per_q))
        return ChannelEffectPrior(loc, sigma, torch.full_like(sigma, self.q_scale), mask)

    def _start(self, params, u):
        """The goodwill from the spend before the data per unit of each channel's ``q``,
        ``(..., T, k)`` (``None`` for ``goodwill_start="zero"``): week ``t`` (0-based) holds
        ``phi^{t + 1 - lag} ubar_i sum_{j < START_WEEKS} phi^j`` with ``ubar_i`` the mean
        spend of the first ``min(T_train, START_WEEKS)`` weeks of ``u`` (the training
        weeks come first in every ``u`` the model sees)."""
        # A model pickled before goodwill_start existed keeps its start at 0.
        if getattr(self, "goodwill_start", "zero") == "zero":
            return None
        T = u.shape[-2]
        weeks = getattr(self, "_start_weeks", None) or min(T, START_WEEKS)
        ubar = u[..., :weeks, :].mean(-2)  # (..., k)
        phi = self._channel_phi(params).to(u.dtype)  # (..., k) or (..., 1)
        logphi = torch.log(phi.clamp(min=torch.finfo(u.dtype).tiny))
        j = torch.arange(max(T + 1, START_WEEKS), dtype=u.dtype, device=u.device)
        powers = torch.exp(logphi.unsqueeze(-1) * j)  # phi^0, phi^1, ...: (..., k | 1, J)
        history = powers[..., :START_WEEKS].sum(-1, keepdim=True)  # D before the data
        lag = self._lag()
        decay = powers[..., 1 - lag : T + 1 - lag] * history  # (..., k | 1, T)
        return decay.mT * ubar.unsqueeze(-2)

    @property
    def _non_negative(self):
        # A model pickled before effects existed had Gaussian q.
        return getattr(self, "effects", "real") == "non_negative"

    @property
    def _q_sampled(self):
        """Whether ``q`` is a sampled site (``ssvs``, or non-negative effects) rather than
        integrated out with ``beta`` by the point mass."""
        return self.selection == "ssvs" or self._non_negative

    def _response(self, params, y, u):
        """What the point mass regresses on its design: ``y``, or ``y - (D - D_1)`` when
        ``q`` is sampled (its goodwill is then known given the draw)."""
        if self._q_sampled:
            return y - self._goodwill_since_start(params, u)
        return y

    @property
    def _per_channel(self):
        # A model pickled before carryover existed had one decay rate.
        return getattr(self, "carryover", "shared") == "per_channel"

    def _lag(self):
        if self.spend_lag is None:
            raise ValueError(
                "spend_lag='auto' is chosen by fit() from the data: call fit() first, or pass "
                "spend_lag=0 or 1"
            )
        return self.spend_lag

    def _channel_phi(self, params):
        """Each channel's AR coefficient ``1 - delta_i``: ``(..., k)``, or ``(..., 1)`` with
        a shared decay rate (eq. (1.4))."""
        phi = 1.0 - params["delta"]
        return phi if self._per_channel else phi.unsqueeze(-1)

    def _channel_goodwill(self, params, u):
        """Each channel's deterministic goodwill ``D_{i,t} = q_i f_i(S_{i,t})``
        (standardised), ``(..., T, k)``."""
        return self._adstock(params, u) * params["q"].unsqueeze(-2)

    def _goodwill(self, params, u):
        """Deterministic goodwill ``D_t`` (standardised), ``(..., T)``."""
        return self._channel_goodwill(params, u).sum(-1)

    def _adstock_since_start(self, params, u):
        """:meth:`_adstock` less its first week's, ``f(S_t) - f(S_1)`` ``(..., T, k)``: how
        the spend enters the likelihood, the level taking ``D_1`` (module docstring,
        "Where the level starts")."""
        adstock = self._adstock(params, u)
        return adstock - adstock[..., :1, :]

    def _goodwill_since_start(self, params, u):
        """``D_t - D_1`` (standardised), ``(..., T)``: the goodwill as the likelihood sees
        it (the level's prior is on ``mu_1 + D_1``, not on ``mu_1``)."""
        q = params["q"].unsqueeze(-2)
        return (self._adstock_since_start(params, u) * q).sum(-1)

    def _mean_offset(self, params, u, X):
        """``D_t - D_1 + x_t' beta`` (standardised), ``(..., T)``: what the DLM's residual
        is taken from (its level starts at ``mu_1 + D_1``)."""
        offset = self._goodwill_since_start(params, u)
        if "beta" in params:
            offset = offset + (X * params["beta"].unsqueeze(-2)).sum(-1)
        return offset

    def model(self, y, u, X):
        """The Pyro program on standardised data ``y (T,)``, ``u (T, k)``, ``X (T, p)``."""
        params = self._sample_params(u.shape[-1], X.shape[-1])
        if self.selection == "point_mass":
            # q and beta integrated out: the goodwill is linear in q given delta (the
            # adstocked spend), so [q, beta] are the coefficients of one Gaussian regression
            # whose exact marginal likelihood comes from the Kalman whitening below.
            dlm = self.state_space(params)
            precision = None
            if dlm.observation_df is not None:
                half = torch.as_tensor(dlm.observation_df / 2, dtype=y.dtype, device=y.device)
                precision = pyro.sample(
                    "obs_precision", dist.Gamma(half, half).expand([y.shape[-1]]).to_event(1)
                )
            design = self._design(params, u, X)
            stats = self._whitened_statistics(dlm, self._response(params, y, u), design, precision)
            pyro.factor("obs", self._collapsed_log_likelihood(stats, self._indicators(params)))
            return
        resid = y - self._mean_offset(params, u, X)
        dlm_observe("obs", self.state_space(params), resid)

    def _stock(self, params, u, with_start=True):
        """Each channel's goodwill stock per unit of ``q``, ``S`` ``(..., T, k)``: the
        recursion of eq. (1.4) on its spend (with the goodwill from before the data,
        :meth:`_start`, unless ``with_start`` is false), each channel decaying at its own
        rate (``carryover="per_channel"``) or at the shared one."""
        phi = self._channel_phi(params)  # (..., k) or (..., 1)
        spend = u.mT  # (k, T)
        if self._lag() == 0:
            # D_t = phi D_{t-1} + u_t = (lag-1 recursion on u)_{t+1}
            pad = torch.zeros_like(spend[..., :1])
            adstock = goodwill_offset(phi, torch.cat([spend, pad], -1))[..., 1:].mT
        else:
            adstock = goodwill_offset(phi, spend).mT
        start = self._start(params, u) if with_start else None
        return adstock if start is None else adstock + start

    @property
    def _saturated(self):
        # A model pickled before saturation existed is linear.
        return getattr(self, "saturation", None) is not None

    def _saturate(self, params, stock, mean=None):
        """The Hill curve of shape 1, ``f_i(S) = S / (1 + lambda_i S / Sbar_i)``, applied
        to stocks ``(..., T, k)`` (the identity without saturation); ``mean`` is ``Sbar``,
        ``(..., 1, k)``, when the caller has it (:meth:`_mean_stock` otherwise)."""
        if not self._saturated:
            return stock
        bend = params["saturation"].unsqueeze(-2)  # (..., 1, k)
        mean = self._mean_stock(params) if mean is None else mean
        mean = mean.clamp(min=torch.finfo(mean.dtype).tiny)
        return stock / (1 + bend * stock / mean)

    def _mean_stock(self, params):
        """Each channel's mean stock over the training weeks, ``(..., 1, k)``: the curve's
        scale, fixed by the training spend whatever spend the curve is applied to."""
        _, u_train, _ = self._data
        return self._stock(params, u_train).mean(-2, keepdim=True)

    def _attributable_stock(self, params, u):
        """What each channel's spend in ``u`` itself brings per unit of ``q``, ``(..., T, k)``
        (standardised): ``f(S) - f(S from before the data alone)``, the stock without the
        goodwill from before the data when the goodwill is linear.  The counterfactual
        "channel switched off" of :mod:`~pyro_ext.models.bsts.attribution`."""
        inside = self._stock(params, u, with_start=False)
        if not self._saturated:
            return inside
        before = self._start(params, u)
        if before is None:  # goodwill_start="zero": nothing from before the data
            before = torch.zeros_like(inside)
        mean = self._mean_stock(params)
        return self._saturate(params, inside + before, mean) - self._saturate(params, before, mean)

    def _adstock(self, params, u):
        """What each channel's spend brings per unit of ``q``, ``f(S)`` ``(..., T, k)``
        (the stock :meth:`_stock`, through the saturation curve if there is one):
        ``D = f(S) q``."""
        stock = self._stock(params, u)
        if not self._saturated:
            return stock
        # On the training spend (every evaluation of the fit) the stock is its own mean's.
        training = getattr(self, "_data", None) is not None and u is self._data[1]
        mean = stock.mean(-2, keepdim=True) if training else None
        return self._saturate(params, stock, mean)

    def _design(self, params, u, X):
        """The point mass's regression: adstocked spend (less its first week's, as the
        likelihood sees it) and the covariates, ``(T, k + p)``; only the covariates,
        ``(T, p)``, when ``q`` is sampled."""
        if self._q_sampled:
            return X if self.uses_covariates else X[..., :0]
        adstock = self._adstock_since_start(params, u)
        if not self.uses_covariates:
            return adstock
        return torch.cat([adstock, X.expand(*adstock.shape[:-1], X.shape[-1])], -1)

    @property
    def _design_channels(self):
        """How many of the design's columns are channels (0 when ``q`` is sampled)."""
        return 0 if self._q_sampled else self._pi_q.shape[0]

    def _indicators(self, params):
        """``[gamma_q, gamma]`` with 1 for forced-in coefficients (the design's columns);
        ``None`` if all are."""
        k = self._design_channels
        p = self._p if self.uses_covariates else 0
        if "gamma_q" not in params and "gamma" not in params:
            return None
        ref = params.get("gamma_q", params.get("gamma"))
        gamma_q = params.get("gamma_q", ref.new_ones(ref.shape[:-1] + (k,)))
        gamma = params.get("gamma", ref.new_ones(ref.shape[:-1] + (p,)))
        return torch.cat([gamma_q, gamma[..., :p]], -1)

    def _slab_variances(self):
        """Prior variances of ``[q, beta]``, built once per fit (the collapsed likelihood
        reads them at every evaluation)."""
        k = self._design_channels
        p = self._p if self.uses_covariates else 0
        cached = getattr(self, "_slab_variance_cache", None)
        key = (k, p, self.q_scale, self.slab_scale, self.device)
        if cached is None or cached[0] != key:
            values = [self.q_scale**2] * k + [self.slab_scale**2] * p
            cached = (key, torch.tensor(values, dtype=torch.float64, device=self.device))
            self._slab_variance_cache = cached
        return cached[1]

    @property
    def discrete_sites(self) -> list[str]:
        """The indicator sites that the Gibbs moves update (point mass; after ``fit``)."""
        if self.selection != "point_mass":
            return []
        self._check_data_seen("discrete_sites")
        sites = []
        if self.uses_covariates and not self._beta_forced:
            sites.append("gamma")
        if not self._q_forced:
            sites.append("gamma_q")
        return sites

    # ------------------------------------------------------------------ summaries
    def _check_fitted(self):
        if self.samples is None:
            raise ValueError("the model is not fitted: call fit() first")

    def static_sites(self):
        """Names of the static-parameter sites (the Student-t precisions excluded)."""
        self._check_fitted()
        return [n for n in self.samples if n != "obs_precision"]

    def rhat(self) -> dict[str, torch.Tensor]:
        """Split-R-hat of every static site across chains / particles."""
        self._check_fitted()
        out = {}
        for n in self.static_sites():
            out[n] = _split_rhat(self._chains[n])
        return out

    def _orig_q(self, q):
        return q * self._y_scale / self._u_scale

    def _orig_beta(self, beta):
        return beta * self._y_scale / self._x_scale

    def coefficients(self):
        """Posterior mean / sd in original units: ``delta`` and ``ar`` (``1 - delta``; one
        per channel with ``carryover="per_channel"``), ``q``
        ``(k,)`` (sales per unit of spend; with ``saturation="hill"``, of the first unit),
        ``beta`` ``(p,)`` (zeros for variant B), ``sigma_obs`` (sales units) and, with
        saturation, each channel's bend ``saturation`` ``(k,)`` (``lambda_i``: the response
        at its mean training stock is ``1 / (1 + lambda_i)`` of the linear one)."""
        self._check_fitted()
        s = self.samples

        def ms(x):
            return {"mean": x.mean(0), "sd": x.std(0)}

        out = {"delta": ms(s["delta"]), "ar": ms(1 - s["delta"]), "q": ms(self._orig_q(s["q"]))}
        if "saturation" in s:
            out["saturation"] = ms(s["saturation"])
        if "beta" in s:
            out["beta"] = ms(self._orig_beta(s["beta"]))
        else:
            z = s["delta"].new_zeros(self._p)
            out["beta"] = {"mean": z, "sd": z.clone()}
        out["sigma_obs"] = ms(s["sigma_obs"] * self._y_scale)
        return out

    def coefficient_draws(self) -> dict[str, torch.Tensor]:
        """Posterior draws in original units: ``delta`` ``(n,)`` (``(n, k)`` with
        ``carryover="per_channel"``), ``q`` ``(n, k)`` (sales per
        unit of spend), ``beta`` ``(n, p)`` (zeros for variant B, and for the draws that
        exclude a covariate), ``sigma_obs`` ``(n,)`` (sales units) and, with saturation,
        ``saturation`` ``(n, k)``, for intervals and coverage checks (:meth:`coefficients`
        gives their mean and sd)."""
        self._check_fitted()
        s = self.samples
        n = s["delta"].shape[0]
        beta = s.get("beta")
        if beta is None:
            beta = s["delta"].new_zeros(n, self._p)
        out = {
            "delta": s["delta"],
            "q": self._orig_q(s["q"]),
            "beta": self._orig_beta(beta),
            "sigma_obs": s["sigma_obs"] * self._y_scale,
        }
        if "saturation" in s:
            out["saturation"] = s["saturation"]
        return out

    def sales_components(self, max_draws: int = 100) -> dict[str, torch.Tensor]:
        """The training weeks' sales split into goodwill, trend, seasonal and regression
        parts, posterior means ``(T,)`` in sales units that sum to the noise-free sales
        (:func:`~pyro_ext.models.bsts.attribution.sales_components`)."""
        from .attribution import sales_components

        return sales_components(self, max_draws)

    def channel_contributions(self, weeks=None) -> torch.Tensor:
        """Posterior draws ``(draws, k)`` of each channel's contribution to sales over
        ``weeks`` of the training period (all by default), in sales units: the
        counterfactual "channel switched off" of :mod:`~pyro_ext.models.bsts.attribution`."""
        from .attribution import channel_contributions

        return channel_contributions(self, weeks)

    def roas(self, weeks=None) -> torch.Tensor:
        """Posterior draws ``(draws, k)`` of each channel's return on ad spend over
        ``weeks``: its contribution divided by its spend there
        (:func:`~pyro_ext.models.bsts.attribution.roas`)."""
        from .attribution import roas

        return roas(self, weeks)

    def response_curves(self, spend) -> torch.Tensor:
        """Posterior draws ``(draws, L, k)`` of each channel's long-run extra weekly sales
        from spending each of the ``L`` levels ``spend`` every week
        (:func:`~pyro_ext.models.bsts.attribution.response_curves`)."""
        from .attribution import response_curves

        return response_curves(self, spend)

    def contribution_summary(self, weeks=None, interval=0.9) -> dict:
        """Per channel: mean and ``interval`` credible interval of the contribution and the
        ROAS over ``weeks``, the spend, and P(contribution > 0)
        (:func:`~pyro_ext.models.bsts.attribution.contribution_summary`)."""
        from .attribution import contribution_summary

        return contribution_summary(self, weeks, interval)

    def plot_contributions(
        self, weeks=None, interval=0.9, kind="contribution", truth=None, ax=None
    ):
        """Each channel's contribution (or ROAS, ``kind="roas"``) with its credible
        interval, and ``truth`` where known; needs the ``plot`` extra
        (:func:`~pyro_ext.models.bsts.attribution.plot_contributions`)."""
        from .attribution import plot_contributions

        return plot_contributions(self, weeks, interval, kind, truth, ax)

    def _responsibility(self, values, pi, slab):
        d = SpikeSlabNormal(pi, torch.full_like(pi, self.spike_scale), torch.full_like(pi, slab))
        return d.responsibility(values).mean(0)

    def inclusion_probabilities(self):
        """Posterior ``p(gamma_j = 1 | y)`` of the ambient covariates, ``(p,)`` (1 where
        forced in; 0 for variant B, which excludes them)."""
        self._check_fitted()
        if "beta" not in self.samples:
            return self._pi_b.new_zeros(self._p)
        if self.selection == "point_mass":
            if "gamma" not in self.samples:
                return self._pi_b.new_ones(self._p)
            return self.samples["gamma"].mean(0)
        return self._responsibility(self.samples["beta"], self._pi_b, self.slab_scale)

    def channel_inclusion_probabilities(self):
        """Posterior inclusion probabilities of the channels, ``(k,)`` (1 unless RA)."""
        self._check_fitted()
        if self.selection == "point_mass":
            if "gamma_q" not in self.samples:
                return self._pi_q.new_ones(self.num_channels)
            return self.samples["gamma_q"].mean(0)
        return self._responsibility(self.samples["q"], self._pi_q, self.q_scale)
