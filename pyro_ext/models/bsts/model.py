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
spend gives the same intervals: the rest of the bias is not the start's).  By default
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
"""

import math
import time
import warnings

import pyro
import pyro.distributions as dist
import torch

from ...infer.errors import SamplerDivergenceError
from ...infer.evidence import elbo_estimate
from ...ops.stats import split_rhat
from ...ops.validation import check_choice, check_int, check_positive, check_real
from ...timeseries.dlm import (
    DLM,
    Autoregressive,
    LinearGaussian,
    LocalLevel,
    LocalLinearTrend,
    Regression,
    dlm_observe,
)
from ...timeseries.kalman import kalman_filter
from .distributions import NoiseScales, PolarTransform, SpikeSlabNormal
from .goodwill import _seasonal_matrices, goodwill_offset

__all__ = [
    "THESIS_MODEL",
    "NoiseScales",
    "PolarTransform",
    "RetailBSTS",
    "SpikeSlabNormal",
    "goodwill_offset",
]

VARIANTS = ("B", "RA", "RF")
NOISES = ("gaussian", "student_t")
TRENDS = ("local_level", "local_linear_trend")
METHODS = ("sgld", "vis", "nuts")
SELECTIONS = ("point_mass", "ssvs")
GOODWILL_STARTS = ("steady", "zero")
CARRYOVERS = ("per_channel", "shared")
EFFECTS = ("non_negative", "real")
# The thesis' model: the goodwill of eq. (1.4) (one decay rate, last week's spend) and
# real-valued channel effects.
THESIS_MODEL = {"spend_lag": 1, "carryover": "shared", "effects": "real"}
PERIOD = 365.25 / 7
# goodwill_start="steady": the weeks of spend before the data, at the mean spend of the
# first (at most) START_WEEKS weeks of the data.
START_WEEKS = 52
# expected_model_size=None: min(DEFAULT_MODEL_SIZE, n / 2) of the n candidates.
DEFAULT_MODEL_SIZE = 5.0
# spend_lag="auto": the SVI steps of each lag's Gaussian approximation whose ELBOs compare.
EVIDENCE_STEPS = 150


def _split_rhat(draws):
    """Split-R-hat, 1 where it is 0 / 0: an indicator that no chain ever moved."""
    rhat = split_rhat(draws)
    return torch.where(torch.isnan(rhat), torch.ones_like(rhat), rhat)


def _max_rhat(chains):
    """Largest split-R-hat over the static sites of ``{site: (chains, draws, ...)}`` (the
    point mass's indicators included: their frequencies are the inclusion probabilities)."""
    return max(float(_split_rhat(v).max()) for n, v in chains.items() if n != "obs_precision")


def _as_real_tensor(x, name):
    """``x`` as a real tensor, or a :class:`TypeError` naming the argument (torch's own
    error for a string or a ragged list names neither)."""
    if isinstance(x, (str, bytes)):
        raise TypeError(f"{name} must be a real tensor or array of numbers, got a string")
    try:
        x = torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(
            f"{name} must be a real tensor or array of numbers, got {type(x).__name__} ({error})"
        ) from None
    if x.is_complex():
        raise TypeError(f"{name} must be real, got dtype {x.dtype}")
    return x


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


def _check_names(names, name, count, what):
    """``channel_names`` / ``covariate_names``: ``None`` or ``count`` strings."""
    if names is None:
        return None
    if isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):
        raise TypeError(f"{name} must be a list of {count} strings (one per {what}), got {names!r}")
    names = list(names)
    if len(names) != count:
        raise ValueError(f"{name} has {len(names)} names for {count} {what}s")
    return [str(n) for n in names]


def _hn(scale, dtype):
    return dist.HalfNormal(torch.tensor(float(scale), dtype=dtype))


class RetailBSTS:
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
    def _tensor(x, name, dim):
        if x is None:
            return None
        x = _as_real_tensor(x, name)
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
        pi_q = torch.ones(k, dtype=torch.float64)
        pi_b = torch.ones(p, dtype=torch.float64)
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
        """The :class:`~pyro_ext.timeseries.DLM` of the residual ``y - D - X beta`` for
        parameter values ``params`` (a dict of posterior draws or of scalars; keys other
        than the DLM's are ignored). With ``regression`` ``(..., T, p)`` (the included
        covariates, ``X * gamma``), static regression states with prior
        ``N(0, slab_scale^2)`` come last: the DLM of ``y - D`` with ``beta`` integrated."""
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
            G, F = _seasonal_matrices(self.seasonal_period, self.seasonal_harmonics, torch.float64)
            n = G.shape[-1]
            eye = torch.eye(n, dtype=torch.float64)
            W = sigma_season.pow(2)[..., None, None] * eye
            comps.append(LinearGaussian(G, F, W, torch.zeros(n, dtype=torch.float64), eye.clone()))
        if regression is not None:
            comps.append(Regression(regression, init_scale=self.slab_scale))
        return DLM(comps, sigma_obs, self.df if self.noise == "student_t" else None)

    def _sample_params(self, k, p):
        f64 = torch.float64
        a, b = self.delta_prior
        lo, hi = self.delta_range
        base = dist.Beta(torch.tensor(a, dtype=f64), torch.tensor(b, dtype=f64))
        if (lo, hi) != (0.0, 1.0):
            base = dist.TransformedDistribution(
                base,
                [
                    dist.transforms.AffineTransform(
                        torch.tensor(lo, dtype=f64), torch.tensor(hi - lo, dtype=f64)
                    )
                ],
            )
        if self._per_channel:
            base = base.expand([k]).to_event(1)
        out = {"delta": pyro.sample("delta", base)}
        pi_q, pi_b = self._pi_q, self._pi_b
        if self.selection == "point_mass":
            # beta, and q unless it is non-negative, are integrated out (the model, below);
            # only the indicators are sampled.
            if self._q_sampled:
                prior = self._coef_prior(pi_q, self.q_scale, True, non_negative=True)
                out["q"] = pyro.sample("q", prior.to_event(1))
            elif not self._q_forced:
                out["gamma_q"] = pyro.sample("gamma_q", dist.Bernoulli(pi_q).to_event(1))
            if self.uses_covariates and not self._beta_forced:
                out["gamma"] = pyro.sample("gamma", dist.Bernoulli(pi_b).to_event(1))
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
        out["sigma_level"] = pyro.sample("sigma_level", _hn(ps["sigma_level"], f64))
        if self.trend == "local_linear_trend":
            out["sigma_slope"] = pyro.sample("sigma_slope", _hn(ps["sigma_slope"], f64))
        if self.seasonal_harmonics:
            out["sigma_season"] = pyro.sample("sigma_season", _hn(ps["sigma_season"], f64))
        return out

    def _coef_prior(self, pi, slab, forced, non_negative=False):
        # forced: every pi is 1 (read once at fit, not from the tensor at every call).
        if non_negative:
            # Only forced-in channels are non-negative (RA's spike and slab is refused).
            return dist.HalfNormal(torch.full_like(pi, slab))
        if forced:
            return dist.Normal(torch.zeros_like(pi), torch.full_like(pi, slab))
        return SpikeSlabNormal(pi, torch.full_like(pi, self.spike_scale), torch.full_like(pi, slab))

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
        """What the point mass regresses on its design: ``y``, or ``y - D`` when ``q`` is
        sampled (its goodwill is then known given the draw)."""
        if self._q_sampled:
            return y - self._goodwill(params, u)[0]
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
        """Each channel's deterministic goodwill ``D_{i,t} = q_i U_{i,t}`` (standardised),
        ``(..., T, k)``."""
        return self._adstock(params, u) * params["q"].unsqueeze(-2)

    def _goodwill(self, params, u):
        """Deterministic goodwill ``D_t`` (standardised), ``(..., T)``, and the inflow."""
        inflow = (u * params["q"].unsqueeze(-2)).sum(-1)  # (..., T)
        return self._channel_goodwill(params, u).sum(-1), inflow

    def _mean_offset(self, params, u, X):
        """``D_t + x_t' beta`` (standardised), ``(..., T)``."""
        offset = self._goodwill(params, u)[0]
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
                half = torch.as_tensor(dlm.observation_df / 2, dtype=y.dtype)
                precision = pyro.sample(
                    "obs_precision", dist.Gamma(half, half).expand([y.shape[-1]]).to_event(1)
                )
            design = self._design(params, u, X)
            stats = self._whitened_statistics(dlm, self._response(params, y, u), design, precision)
            pyro.factor("obs", self._collapsed_log_likelihood(stats, self._indicators(params)))
            return
        resid = y - self._mean_offset(params, u, X)
        dlm_observe("obs", self.state_space(params), resid)

    def _adstock(self, params, u, with_start=True):
        """The goodwill each channel's unit spend builds, ``(..., T, k)``: ``D = U q``
        (with the goodwill from before the data, :meth:`_start`, unless ``with_start`` is
        false), each channel decaying at its own rate (``carryover="per_channel"``) or at
        the shared one."""
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

    def _design(self, params, u, X):
        """The point mass's regression: adstocked spend and the covariates, ``(T, k + p)``;
        only the covariates, ``(T, p)``, when ``q`` is sampled."""
        if self._q_sampled:
            return X if self.uses_covariates else X[..., :0]
        adstock = self._adstock(params, u)
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
        if cached is None or cached[0] != (k, p, self.q_scale, self.slab_scale):
            values = [self.q_scale**2] * k + [self.slab_scale**2] * p
            cached = (
                (k, p, self.q_scale, self.slab_scale),
                torch.tensor(values, dtype=torch.float64),
            )
            self._slab_variance_cache = cached
        return cached[1]

    def _whitened_statistics(self, dlm, resid, X, precision=None):
        """
        Whiten the residual ``r = y - D`` and the design ``X`` by the DLM's covariance
        ``Sigma = L L'`` (signal plus observation noise, with ``obs_precision`` if given):
        the log-likelihood of ``r`` under the DLM without regression, ``M = Z' Z`` and
        ``b = Z' L^{-1} r`` with ``Z = L^{-1} X``. ``L^{-1}`` comes from one Kalman filter
        pass over the ``1 + p`` series at once (:meth:`~pyro_ext.timeseries.DLM.whiten`:
        the gains do not depend on the data; blocks of steps, so ``O(T)`` rather than the
        dense ``O(T^3)``). Missing weeks drop out. For one draw of the parameters:
        ``resid`` ``(T,)``, ``X`` ``(T, p)``.
        """
        batch = torch.broadcast_shapes(resid.shape[:-1], X.shape[:-2])
        T, p = X.shape[-2:]
        series = torch.cat([resid.expand(*batch, T).unsqueeze(-1), X.expand(*batch, T, p)], -1)
        white = dlm.whiten(series, precision)
        z = white.whitened  # (T, 1 + p)
        log_likelihood = -0.5 * (
            z[..., 0].pow(2).sum(-1) + white.log_det + white.num_observed * math.log(2 * math.pi)
        )
        Z = z[..., 1:]
        return log_likelihood, Z.mT @ Z, (Z.mT @ z[..., :1]).squeeze(-1)

    def _collapsed_log_likelihood(self, stats, gamma=None):
        """``log p(y | gamma, theta)`` with ``beta_gamma ~ N(0, slab^2 I)`` integrated out:
        ``l_r - log det(A) / 2 + b_g' A^{-1} b_g / 2`` with ``A = I + S M S``, ``b_g = S b``,
        ``S = diag(prior sd * gamma)`` (Sylvester and Woodbury on the whitened model
        ``W r = Z beta + N(0, I)``). Batched over leading dims of ``stats`` and ``gamma``."""
        log_likelihood, M, b = stats
        if M.shape[-1] == 0:
            return log_likelihood  # nothing to integrate out
        scale = self._slab_variances().to(M).sqrt()  # the prior sd of each coefficient
        if gamma is not None:
            scale = scale * gamma
        # With S = diag(scale * gamma): A = I + S M S, and b_g = S b.
        M = M * scale.unsqueeze(-1) * scale.unsqueeze(-2)
        b = b * scale
        eye = torch.eye(M.shape[-1], dtype=M.dtype, device=M.device)
        chol = torch.linalg.cholesky(eye + M)
        log_det = 2 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        solved = torch.linalg.solve_triangular(chol, b.unsqueeze(-1), upper=False)
        return log_likelihood - 0.5 * log_det + 0.5 * solved.pow(2).sum((-2, -1))

    def _params_of(self, values):
        """The model's parameters from site values (``(..., ...)``), as the model has them."""
        params = dict(values)
        scales = params["noise_scales"]
        params["sigma_obs"], params["sigma_goodwill"] = scales[..., 0], scales[..., 1]
        return params

    def _statistics_of(self, values, y, u, X):
        """Whitened statistics of the point mass's regression for one draw of the values."""
        params = self._params_of(values)
        return self._whitened_statistics(
            self.state_space(params),
            self._response(params, y, u),
            self._design(params, u, X),
            params.get("obs_precision"),
        )

    def _indicator_move(self, site):
        """The collapsed Gibbs scan over the indicator site ``site`` (``"gamma_q"`` or
        ``"gamma"``), as :class:`~pyro_ext.infer.Gibbs` takes a move."""
        return lambda values, y, u, X: self._collapsed_scan(values, y, u, X, site)[site]

    def _collapsed_scan(self, values, y, u, X, site=None):
        """
        The collapsed Gibbs scan of R's ``bsts`` over the indicators ``[gamma_q, gamma]``:
        one Kalman whitening per particle gives ``M`` and ``b`` of the regression on
        ``[adstocked spend, covariates]``; each indicator is then drawn from its exact full
        conditional, ``logit p(gamma_j = 1 | ...) = logit pi_j + l(gamma_j = 1) -
        l(gamma_j = 0)``, with ``(k + p)``-square algebra (no further filtering). Returns
        the new values of both sites (the other site's indicators are left as they are).
        """
        sites = [n for n in ("gamma_q", "gamma") if n in values]
        stats = torch.func.vmap(lambda v: self._statistics_of(v, y, u, X))(
            {n: v for n, v in values.items() if n not in sites}
        )
        gamma = self._indicators(values).clone()
        k = self._design_channels
        pi = torch.cat([self._pi_q[:k], self._pi_b[: gamma.shape[-1] - k]]).to(gamma)
        movable = (pi < 1).nonzero().flatten().tolist()
        if site is not None:
            movable = [j for j in movable if (j < k) == (site == "gamma_q")]
        prior_logit = torch.log(pi) - torch.log1p(-pi)
        for j in movable:
            with_j, without_j = gamma.clone(), gamma.clone()
            with_j[:, j], without_j[:, j] = 1.0, 0.0
            logit = (
                prior_logit[j]
                + self._collapsed_log_likelihood(stats, with_j)
                - self._collapsed_log_likelihood(stats, without_j)
            )
            gamma[:, j] = (torch.rand_like(logit) < torch.sigmoid(logit)).to(gamma.dtype)
        return {"gamma_q": gamma[:, :k], "gamma": gamma[:, k:]}

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

    # ------------------------------------------------------------------ fitting
    def _prepare(self, sales, spend, covariates, standardize):
        y = self._tensor(sales, "sales", 1)
        u = self._tensor(spend, "spend", 2)
        if u.shape[0] != y.shape[0]:
            raise ValueError(f"spend has {u.shape[0]} weeks but sales has {y.shape[0]}")
        if u.shape[1] == 0:
            raise ValueError(
                "spend has 0 columns: the model needs at least one advertising channel "
                "(one column per channel)"
            )
        self._check_spend(u)
        if covariates is None:
            X = torch.zeros(y.shape[0], 0, dtype=torch.float64)
        else:
            X = self._tensor(covariates, "covariates", 2)
            if X.shape[0] != y.shape[0]:
                raise ValueError(f"covariates has {X.shape[0]} weeks but sales has {y.shape[0]}")
            self._check_covariates(X)
        if y.shape[0] < 4:
            raise ValueError("sales needs at least 4 weeks")
        self._start_weeks = min(y.shape[0], START_WEEKS)
        self._check_sales(y)
        obs = y[~torch.isnan(y)]
        # Missing weeks (NaN) are marginalised, but the fit needs observed ones, and the
        # standardisation their mean and sd.
        needed = 2 if standardize else 1
        if obs.numel() < needed:
            raise ValueError(
                f"sales has {obs.numel()} observed (non-NaN) weeks out of {y.shape[0]}; "
                f"fitting needs at least {needed}"
                + (" (standardize=True estimates their mean and sd)" if standardize else "")
            )
        if standardize:
            self._y_loc, self._y_scale = obs.mean(), obs.std().clamp(min=1e-12)
            self._u_scale = u.mean(0).where(u.mean(0) > 0, torch.ones_like(u[0]))
            self._x_loc = X.mean(0)
            self._x_scale = (
                X.std(0).where(X.std(0) > 0, torch.ones_like(X[0]))
                if X.shape[0] > 1 and X.shape[1] > 0  # no std of an empty column set
                else torch.ones_like(X[0])
            )
        else:
            self._y_loc, self._y_scale = (
                torch.tensor(0.0, dtype=torch.float64),
                torch.tensor(1.0, dtype=torch.float64),
            )
            self._u_scale = torch.ones(u.shape[1], dtype=torch.float64)
            self._x_loc, self._x_scale = (
                torch.zeros(X.shape[1], dtype=torch.float64),
                torch.ones(X.shape[1], dtype=torch.float64),
            )
        return (
            (y - self._y_loc) / self._y_scale,
            u / self._u_scale,
            (X - self._x_loc) / self._x_scale,
        )

    def fit(
        self,
        sales,
        spend,
        covariates=None,
        method="sgld",
        num_samples=200,
        warmup_steps=200,
        num_particles=8,
        seed=0,
        standardize=True,
        channel_names=None,
        covariate_names=None,
        **kwargs,
    ):
        r"""Fit the posterior of the static parameters.

        Standardisation (``standardize=True``, as in the thesis): sales are centred and
        scaled to unit variance, covariates likewise (per column), spend is divided by
        each channel's mean (not centred, so it stays non-negative and the goodwill
        recursion is unchanged).  Coefficients are reported back in original units.

        With ``spend_lag="auto"`` (the default) the lag is chosen first, on these data:
        each lag's AutoNormal approximation is fitted
        (``map_init_steps`` SVI steps) and the one with the larger ELBO wins;
        ``spend_lag`` and ``spend_lag_evidence`` say which and by how much.

        :param str method: ``"sgld"`` (:class:`pyro_ext.infer.MCMC` with a particle
            kernel, particles as chains), ``"vis"`` (:class:`pyro_ext.infer.VIS` over an
            AutoNormal base guide trained by SVI for ``num_steps`` iterations, then
            ``sample_posterior``) or ``"nuts"`` (reference :class:`pyro.infer.NUTS`,
            ``num_chains`` via ``kwargs``).

        ``"sgld"`` options via ``kwargs``: ``map_init_steps`` (150 AutoNormal SVI steps
        whose draws start the particles), ``kernel``, ``step_size``, ``thinning`` (2),
        ``rhat_target`` (1.05) and ``max_samples`` (``4 * num_samples``): while the largest
        split-R-hat over the static sites is ``>= rhat_target``, the chains continue
        (:meth:`pyro_ext.infer.MCMC.extend`) by ``num_samples / 2`` draws per particle, up
        to ``max_samples``; ``rhat_target=None`` runs exactly ``num_samples``.  The number
        of extensions is ``self.sampling_extensions``.  With ``selection="point_mass"`` the
        kernel is compounded with moves on the indicators (:class:`~pyro_ext.infer.Gibbs`):
        ``moves="gibbs"`` (default) is the collapsed scan of R's ``bsts``, each ``gamma_j``
        from its exact conditional given the others and the continuous parameters, ``beta``
        integrated out (one Kalman whitening per particle and sweep, then ``p x p``
        algebra); ``"mh-flip"`` / ``"mh-swap"`` run the model per proposal instead.  The
        stopping rule's R-hat covers the indicators too.
        ``kernel="preconditioned"`` (the default when ``map_init_steps > 0``) is SGHMC
        with a constant diagonal mass equal to the inverse posterior variance of each
        unconstrained coordinate: started from the AutoNormal scales, re-estimated once
        from the particles (pooled) over the last 70 % of warmup and then frozen
        (``step_size`` 0.05: about ``sqrt(0.05) = 0.22`` radians per step for every
        coordinate; larger steps bias the skewed ``log sigma_goodwill`` posterior
        downwards, 0.07 by ~0.4 posterior sd).
        ``"adam"`` (:class:`AdamSGLD`, mass ``sqrt(E[grad^2])`` frozen after warmup; the
        default when ``map_init_steps=0``) scales the steps by ``1 / sqrt(sd)`` rather
        than ``1 / sd`` and mixes several times slower on the weakly identified
        ``delta`` and noise scales; ``"sgld"`` and ``"sghmc"`` are unpreconditioned.
        The defaults (8 particles, 200 + 2 x 200 steps) give split-R-hat <= 1.03 on every
        static site for the 208-week Robyn data (``benchmarks/bsts.py`` has the times).  The two white-noise scales sit on a curved
        ridge (observation noise against a fast-decaying goodwill AR(1)); the
        :class:`NoiseScales` site samples them in polar coordinates, which straightens it
        (max R-hat 1.15 -> 1.01 at 400 + 2 x 400 steps, and no more divergences on its
        stiff flank).  Student-t noise adds 208 precision latents; with
        ``selection="ssvs"`` it also needs the per-step Kalman scan (about 4x the time of
        Gaussian noise), while the point mass's blocked Kalman whitening takes it at no
        extra cost.  The mass is floored at
        ``adam_floor = 0.6`` times Adam's ``sqrt(E[grad^2])`` (a lower floor mixes faster
        but diverged on a simulated series).

        ``"vis"`` options via ``kwargs``: ``num_steps`` (1000 SVI iterations), ``lr``
        (0.02), ``vis_steps`` (5 refinement steps), ``sampler`` (``"adam"``), ``step_size``
        (1e-3) and any other :class:`~pyro_ext.infer.VIS` argument. The refinement steps
        run on the unconstrained log joint, whose gradients differ by orders of magnitude
        between sites (spend effects in sales per unit of spend against log noise
        scales): the Adam-preconditioned sampler takes the same step in every coordinate,
        while ``"sgld"`` needs ``step_size`` of about 1e-5 here. A non-finite loss stops
        the fit with an error naming the iteration.

        :returns: ``self``.
        """
        from ...infer import MCMC, VIS
        from ...infer.sgmcmc import KERNELS

        check_choice(method, "method", METHODS)
        seed = check_int(seed, "seed", 0, 2**32 - 1)
        num_samples = check_int(num_samples, "num_samples", low=1)
        warmup_steps = check_int(warmup_steps, "warmup_steps", low=0)
        num_particles = check_int(num_particles, "num_particles", low=1)
        if not isinstance(standardize, bool):
            raise TypeError(f"standardize must be a bool, got {standardize!r}")
        y, u, X = self._prepare(sales, spend, covariates, standardize)
        k, p = u.shape[1], X.shape[1]
        channel_names = _check_names(channel_names, "channel_names", k, "channel")
        covariate_names = _check_names(covariate_names, "covariate_names", p, "covariate")
        self.channel_names = channel_names or [f"channel{i}" for i in range(k)]
        self.covariate_names = covariate_names or [f"x{j}" for j in range(p)]
        self._holiday_idx = []
        for h in self.holidays:
            if isinstance(h, str):
                if h not in self.covariate_names:
                    raise ValueError(f"holidays names unknown covariate {h!r}")
                h = self.covariate_names.index(h)
            if not 0 <= int(h) < p:
                raise ValueError(
                    f"holidays index {h} is out of range for {p} covariates (0 to {p - 1})"
                )
            self._holiday_idx.append(int(h))
        self._check_expected_model_size(k, p)
        self._p = p
        self._pi_q, self._pi_b = self._priors_pi(k, p)
        self._q_forced, self._beta_forced = (
            bool((pi >= 1).all()) for pi in (self._pi_q, self._pi_b)
        )
        self._data = (y, u, X)
        if self.discrete_sites and method != "sgld":
            raise ValueError(
                f"method={method!r} cannot move the point mass's indicators "
                f"{self.discrete_sites}: use method='sgld' (SG-MCMC with Gibbs moves), or "
                "selection='ssvs', whose indicators are summed out"
            )
        if kwargs.get("moves") is not None:
            self._check_moves(kwargs["moves"], method)
        t0 = time.perf_counter()
        self._selected_guide = None
        # A model pickled before spend_lag="auto" existed has no spend_lag_requested.
        if getattr(self, "spend_lag_requested", self.spend_lag) == "auto":
            self.spend_lag = None
            self._select_spend_lag(seed, kwargs.get("map_init_steps", 150))
        pyro.set_rng_seed(seed)
        pyro.clear_param_store()
        if self._selected_guide is not None:
            # The chosen lag's Gaussian starts the particles (method="sgld").
            pyro.get_param_store().set_state(self._selected_guide[1])
        if method == "sgld":
            self._fit_sgld(
                MCMC,
                KERNELS,
                num_samples,
                warmup_steps,
                num_particles,
                **kwargs,
            )
        elif method == "nuts":
            nuts = pyro.infer.NUTS(
                self.model,
                jit_compile=kwargs.pop("jit_compile", False),
                max_tree_depth=kwargs.pop("max_tree_depth", 8),
                init_strategy=self._init_to_median(),
            )
            mcmc = pyro.infer.MCMC(
                nuts,
                num_samples=num_samples,
                warmup_steps=warmup_steps,
                num_chains=kwargs.pop("num_chains", 1),
                disable_progbar=kwargs.pop("disable_progbar", True),
                **kwargs,
            )
            # Without value checks an extreme trajectory gets a NaN potential, which NUTS
            # treats as a divergence, instead of raising from the Kalman filter.
            with pyro.validation_enabled(False):
                mcmc.run(y, u, X)
            self._mcmc = mcmc
            self._chains = mcmc.get_samples(group_by_chain=True)
        else:
            self._fit_vis(VIS, num_samples, num_particles, **kwargs)
        if self.selection == "point_mass":
            self._point_mass_draws(seed)
        self.fit_seconds = time.perf_counter() - t0
        scales = self._chains["noise_scales"]
        self._chains["sigma_obs"], self._chains["sigma_goodwill"] = scales[..., 0], scales[..., 1]
        self.samples = {n: v.reshape(-1, *v.shape[2:]) for n, v in self._chains.items()}
        self._method = method
        return self

    def _select_spend_lag(self, seed, map_init_steps, num_particles=32):
        r"""``spend_lag="auto"``: the lag whose model has the larger evidence lower bound.

        For each lag the :meth:`_map_init` Gaussian (AutoNormal, ``map_init_steps`` SVI
        steps, or ``EVIDENCE_STEPS`` where that is 0; every indicator on) is fitted in its
        own parameter store, and its ELBO estimated with ``num_particles`` draws; the
        chosen lag's Gaussian then starts the particles of ``method="sgld"``.  Whatever the
        point mass integrates out (``beta``, and ``q`` with ``effects="real"``) is integrated
        out by the Kalman filter and the rest is sampled, the same way for both lags, and
        the two models have the same parameters, so the larger bound picks the lag the
        data support;
        ``spend_lag_evidence`` keeps both estimates (nats, with their Monte Carlo sd)."""
        evidence, guides = {}, {}
        steps = int(map_init_steps) or EVIDENCE_STEPS
        for lag in (0, 1):
            self.spend_lag = lag
            with pyro.get_param_store().scope() as state:
                pyro.set_rng_seed(seed)
                guide = self._map_init(steps)
                model = self._all_indicators_on(self.model)
                estimate = elbo_estimate(model, guide, *self._data, num_particles=num_particles)
            evidence[lag] = tuple(estimate)
            guides[lag] = (guide, state)
        self.spend_lag = max(evidence, key=lambda lag: evidence[lag][0])
        self.spend_lag_evidence = evidence
        if map_init_steps:
            self._selected_guide = guides[self.spend_lag]

    def _check_expected_model_size(self, k, p):
        """``expected_model_size / n`` is the prior inclusion probability of the ``n``
        regressors the variant selects among: one asked for above ``n`` would be capped at
        1, every regressor forced in without a word.  (The default, 5, is capped.)"""
        if self.variant == "B" or not getattr(self, "_expected_model_size_given", False):
            return
        n, among = (p, "covariates") if self.variant == "RF" else (k + p, "channels and covariates")
        if n and self.expected_model_size > n:
            raise ValueError(
                f"expected_model_size={self.expected_model_size:g} exceeds the {n} {among} "
                f"that variant {self.variant!r} selects among: the prior inclusion probability "
                f"expected_model_size / {n} must be in (0, 1] (1 forces every one in), so "
                f"expected_model_size must be in (0, {n}]"
            )

    def _check_moves(self, moves, method):
        """``moves`` are the point mass's indicator moves; refuse them where there are none
        (they would be ignored)."""
        if method != "sgld":
            raise ValueError(
                f"moves={moves!r} moves the point mass's indicators within method='sgld'; "
                f"method={method!r} has none: drop moves"
            )
        if not self.discrete_sites:
            why = (
                "selection='ssvs' sums the indicators out"
                if self.selection == "ssvs"
                else "every coefficient is forced in (no indicator to move)"
            )
            raise ValueError(
                f"moves={moves!r} has nothing to move with selection={self.selection!r} and "
                f"variant={self.variant!r}: {why}. Drop moves, or use selection='point_mass' "
                "with a variant and expected_model_size that select"
            )
        from ...infer.gibbs import MOVES

        if not isinstance(moves, str) and not callable(moves):
            raise TypeError(f"moves must be one of {MOVES} or a move function, got {moves!r}")
        if isinstance(moves, str):
            check_choice(moves, "moves", MOVES)

    def _noise_scales_prior(self):
        ps = self.prior_scales
        scale = torch.tensor([ps["sigma_obs"], ps["sigma_goodwill"]], dtype=torch.float64)
        return NoiseScales(scale)

    def _init_to_median(self):
        # init_to_median skips multivariate sites; NoiseScales' median is elementwise.
        median = dist.HalfNormal(self._noise_scales_prior().scale).icdf(torch.tensor(0.5))
        return pyro.infer.autoguide.init_to_value(
            values={"noise_scales": median}, fallback=pyro.infer.autoguide.init_to_median
        )

    def _point_mass_draws(self, seed, chunk=256):
        """Draws of ``q`` and ``beta`` from their exact conditional posterior given each
        draw of ``(gamma, theta)``: with the whitened statistics, ``N(Q^{-1} G b, Q^{-1})``,
        ``Q = G M G + diag(1 / prior variances)``, ``G = diag(gamma)``; exactly 0 where an
        indicator is 0."""
        chains = self._chains
        y, u, X = self._data
        k = self._design_channels
        p = X.shape[1] if self.uses_covariates else 0
        if k + p == 0:
            return  # q sampled and no covariates: nothing integrated out
        shape = chains["noise_scales"].shape[:2]  # (chains, draws)
        flat = {n: v.reshape(-1, *v.shape[2:]) for n, v in chains.items()}
        indicator_sites = [n for n in ("gamma_q", "gamma") if n in flat]
        gamma = self._indicators(flat)
        prior_precision = 1.0 / self._slab_variances()
        generator = torch.Generator().manual_seed(int(seed))
        statistics = torch.func.vmap(lambda v: self._statistics_of(v, y, u, X))
        draws = []
        # Value checks branch on tensor values, which vmap cannot batch.
        with torch.no_grad(), pyro.validation_enabled(False):
            for start in range(0, shape.numel(), chunk):
                values = {
                    n: v[start : start + chunk] for n, v in flat.items() if n not in indicator_sites
                }
                _, M, b = statistics(values)
                if gamma is not None:
                    g = gamma[start : start + chunk]
                    M = M * g.unsqueeze(-1) * g.unsqueeze(-2)
                    b = b * g
                chol = torch.linalg.cholesky(M + torch.diag(prior_precision).to(M))
                mean = torch.cholesky_solve(b.unsqueeze(-1), chol).squeeze(-1)
                noise = torch.randn(*mean.shape, 1, generator=generator, dtype=mean.dtype)
                # chol^{-T} noise has covariance Q^{-1}.
                coef = mean + torch.linalg.solve_triangular(chol.mT, noise, upper=True).squeeze(-1)
                if gamma is not None:
                    coef = coef * g
                draws.append(coef)
        coef = torch.cat(draws).reshape(*shape, k + p)
        if k:
            chains["q"] = coef[..., :k]
        if self.uses_covariates:
            chains["beta"] = coef[..., k:]

    def _all_indicators_on(self, model):
        """``model`` with every indicator of a point mass at 1 (a guide cannot hold
        discrete sites)."""
        if not self.discrete_sites:
            return model
        y, u, X = self._data
        ones = {"gamma": torch.ones(X.shape[1], dtype=torch.float64)}
        ones["gamma_q"] = torch.ones(u.shape[1], dtype=torch.float64)
        return pyro.poutine.condition(model, data=ones)

    def _map_init(self, num_steps, lr=0.05):
        """Median of a short AutoNormal SVI fit, to start the particles near the mode (with
        every indicator of a point mass at 1: a guide cannot hold discrete sites)."""
        model = self._all_indicators_on(self.model)
        guide = pyro.infer.autoguide.AutoNormal(
            model, init_scale=0.05, init_loc_fn=self._init_to_median()
        )
        svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": lr}), pyro.infer.Trace_ELBO())
        for _ in range(num_steps):
            svi.step(*self._data)
        return guide

    def _fit_sgld(
        self,
        MCMC,
        kernels,
        num_samples,
        warmup_steps,
        num_particles,
        kernel=None,
        step_size=None,
        thinning=2,
        map_init_steps=150,
        disable_progbar=True,
        rhat_target=1.05,
        max_samples=None,
        moves=None,
        **kernel_kwargs,
    ):
        from ...infer import Gibbs

        # "preconditioned": the registered PreconditionedSGHMC, its mass re-estimated over
        # the last 70 % of warm-up (the step is given, so the window may reach its end).
        kernels = dict(kernels, preconditioned=kernels["preconditioned_sghmc"])
        if kernel == "preconditioned_sghmc":
            kernel = "preconditioned"
        if kernel is None:
            # The preconditioned kernel takes its initial mass from the AutoNormal scales;
            # without that fit, Adam's gradient-based mass is the safer start.
            kernel = "preconditioned" if map_init_steps else "adam"
        if kernel not in kernels:
            raise ValueError(f"kernel must be one of {sorted(kernels)}, got {kernel!r}")
        init = None
        if map_init_steps:
            selected = getattr(self, "_selected_guide", None)
            guide = self._map_init(map_init_steps) if selected is None else selected[0]
            self._selected_guide = None
            # Start every particle from a draw of the fitted Gaussian (overdispersed by the
            # guide's width, so R-hat across particles is meaningful).
            with torch.no_grad():
                draws = [guide() for _ in range(num_particles)]
            init = {n: torch.stack([d[n] for d in draws]) for n in draws[0]}
            self._guide = guide
            if kernel == "preconditioned" and "init_scale" not in kernel_kwargs:
                kernel_kwargs["init_scale"] = {
                    n: guide._get_loc_and_scale(n)[1].detach() for n in init
                }
        if kernel == "preconditioned":
            kernel_kwargs.setdefault("adapt_window", (0.3, 1.0))
            kernel_kwargs.setdefault("adam_floor", 0.6)
        if step_size is None:
            step_size = {"sgld": 2e-4, "adam": 2e-3, "sghmc": 5e-4, "preconditioned": 0.05}[kernel]
        initial_params = None if init is None else self._unconstrain(init)
        self.divergence_retries = 0
        while True:
            kern = kernels[kernel](
                self.model,
                step_size=step_size,
                num_particles=num_particles,
                # The fit runs in one process, also in a torch.distributed job.
                shard=None,
                **kernel_kwargs,
            )
            if self.discrete_sites:
                moves = "gibbs" if moves is None else moves
                site_moves = {name: moves for name in self.discrete_sites}
                if moves == "gibbs":
                    site_moves = {name: self._indicator_move(name) for name in site_moves}
                kern = Gibbs(kern, self.discrete_sites, moves=site_moves)
            mcmc = MCMC(
                kern,
                num_samples=num_samples,
                warmup_steps=warmup_steps,
                thinning=thinning,
                disable_progbar=disable_progbar,
                initial_params=initial_params,
            )
            try:
                mcmc.run(*self._data)
                break
            except SamplerDivergenceError as error:
                # A particle left the region where the step size is stable: halve it and
                # start again from the same initial particles (at most twice).
                if self.divergence_retries == 2:
                    raise
                self.divergence_retries += 1
                step_size = step_size / 2
                warnings.warn(
                    f"{error}; retrying with step_size={step_size:g}", RuntimeWarning, stacklevel=2
                )
        # Continue the chains, num_samples / 2 draws at a time, while some static site's
        # split-R-hat is above rhat_target (at most max_samples draws per particle).
        max_samples = 4 * num_samples if max_samples is None else int(max_samples)
        self.sampling_extensions = 0
        chains = mcmc.get_samples(group_by_chain=True)
        while (
            rhat_target is not None
            and mcmc.num_samples < max_samples
            and _max_rhat(chains) >= rhat_target
        ):
            try:
                mcmc.extend(min(max(num_samples // 2, 1), max_samples - mcmc.num_samples))
            except SamplerDivergenceError as error:
                # The last draws before a divergence may already be far out: drop the
                # whole extension and keep the chains as they were.
                warnings.warn(
                    f"{error}; the extension is dropped, keeping {chains['delta'].shape[1]} "
                    "draws per particle",
                    RuntimeWarning,
                    stacklevel=2,
                )
                break
            chains = mcmc.get_samples(group_by_chain=True)
            self.sampling_extensions += 1
        if rhat_target is not None:
            worst = _max_rhat(chains)
            if worst >= rhat_target:
                warnings.warn(
                    f"the chains have not converged: the largest split-R-hat is {worst:.3f} "
                    f"(rhat_target={rhat_target}) after {mcmc.num_samples} draws per particle "
                    f"(max_samples={max_samples}). Raise max_samples or warmup_steps, or "
                    "check rhat() for the site concerned before using the posterior.",
                    RuntimeWarning,
                    stacklevel=3,
                )
        self._mcmc = mcmc
        self._chains = dict(chains)

    def _unconstrain(self, values):
        trace = pyro.poutine.trace(self.model).get_trace(*self._data)
        out = {}
        for name, v in values.items():
            site = trace.nodes[name]
            out[name] = torch.distributions.biject_to(site["fn"].support).inv(v)
        return out

    def _fit_vis(
        self,
        VIS,
        num_samples,
        num_particles,
        num_steps=1000,
        lr=0.02,
        vis_steps=5,
        sampler="adam",
        step_size=1e-3,
        **vis_kwargs,
    ):
        guide = pyro.infer.autoguide.AutoNormal(
            self.model, init_scale=0.05, init_loc_fn=self._init_to_median()
        )
        vis = VIS(
            self.model,
            guide,
            sampler=sampler,
            num_steps=vis_steps,
            step_size=step_size,
            gradient="fast",
            # The particle entropy (VIS-P) this fit was validated with; VIS-MC, VIS's
            # default, is defined for SGLD only.
            **{"entropy": "particle", **vis_kwargs},
        )
        svi = pyro.infer.SVI(self.model, vis, pyro.optim.Adam({"lr": lr}), pyro.infer.Trace_ELBO())
        # Without value checks a refinement step that leaves the support (e.g. a noise scale
        # underflowing to 0) gives a non-finite loss, reported below, not a model error.
        with pyro.validation_enabled(False):
            for iteration in range(num_steps):
                loss = svi.step(*self._data)
                if not math.isfinite(loss):
                    raise RuntimeError(
                        f"the VIS fit diverged at SVI iteration {iteration}: the loss is "
                        f"{loss}; lower step_size (now {step_size}) or use sampler='adam'"
                    )
        draws = vis.sample_posterior(*self._data, num_samples=num_samples * num_particles)
        # Reported as ``num_particles`` pseudo-chains so that rhat() has something to split.
        self._chains = {
            n: v.reshape(num_particles, num_samples, *v.shape[1:]) for n, v in draws.items()
        }
        self._vis = vis

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
        ``(k,)`` (sales per unit of spend), ``beta`` ``(p,)`` (zeros for variant B) and
        ``sigma_obs`` (sales units)."""
        self._check_fitted()
        s = self.samples

        def ms(x):
            return {"mean": x.mean(0), "sd": x.std(0)}

        out = {"delta": ms(s["delta"]), "ar": ms(1 - s["delta"]), "q": ms(self._orig_q(s["q"]))}
        if "beta" in s:
            out["beta"] = ms(self._orig_beta(s["beta"]))
        else:
            z = torch.zeros(self._p, dtype=torch.float64)
            out["beta"] = {"mean": z, "sd": z.clone()}
        out["sigma_obs"] = ms(s["sigma_obs"] * self._y_scale)
        return out

    def coefficient_draws(self) -> dict[str, torch.Tensor]:
        """Posterior draws in original units: ``delta`` ``(n,)`` (``(n, k)`` with
        ``carryover="per_channel"``), ``q`` ``(n, k)`` (sales per
        unit of spend), ``beta`` ``(n, p)`` (zeros for variant B, and for the draws that
        exclude a covariate) and ``sigma_obs`` ``(n,)`` (sales units), for intervals and
        coverage checks (:meth:`coefficients` gives their mean and sd)."""
        self._check_fitted()
        s = self.samples
        n = s["delta"].shape[0]
        beta = s.get("beta")
        if beta is None:
            beta = torch.zeros(n, self._p, dtype=torch.float64)
        return {
            "delta": s["delta"],
            "q": self._orig_q(s["q"]),
            "beta": self._orig_beta(beta),
            "sigma_obs": s["sigma_obs"] * self._y_scale,
        }

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
            return torch.zeros(self._p, dtype=torch.float64)
        if self.selection == "point_mass":
            if "gamma" not in self.samples:
                return torch.ones(self._p, dtype=torch.float64)
            return self.samples["gamma"].mean(0)
        return self._responsibility(self.samples["beta"], self._pi_b, self.slab_scale)

    def channel_inclusion_probabilities(self):
        """Posterior inclusion probabilities of the channels, ``(k,)`` (1 unless RA)."""
        self._check_fitted()
        if self.selection == "point_mass":
            if "gamma_q" not in self.samples:
                return torch.ones(self.num_channels, dtype=torch.float64)
            return self.samples["gamma_q"].mean(0)
        return self._responsibility(self.samples["q"], self._pi_q, self.q_scale)

    # ------------------------------------------------------------------ prediction
    def _draw_subset(self, max_draws):
        max_draws = check_int(max_draws, "max_draws", low=1)
        n = self.samples["delta"].shape[0]
        idx = torch.linspace(0, n - 1, min(n, max_draws)).round().long()
        return {k: v[idx] for k, v in self.samples.items()}

    def _future_inputs(self, spend_future, covariates_future, max_draws=1):
        """The standardised future inputs, checked once per call (before any draw)."""
        # max_draws first: it is cheap, and a call with two bad arguments names the first.
        check_int(max_draws, "max_draws", low=1)
        if not torch.is_tensor(spend_future):
            spend_future = _as_real_tensor(spend_future, "spend_future").to(torch.float64)
        elif spend_future.is_complex():
            raise TypeError(f"spend_future must be real, got dtype {spend_future.dtype}")
        if spend_future.dim() != 2 or spend_future.shape[1] != self.num_channels:
            raise ValueError(
                f"spend_future must have shape (h, {self.num_channels}): h weeks (the horizon) "
                f"by the {self.num_channels} channels, got {tuple(spend_future.shape)}"
            )
        h = spend_future.shape[0]
        if h == 0:
            raise ValueError(
                "spend_future has 0 rows: the horizon (its number of rows, the weeks to "
                "predict) must be a positive int"
            )
        with torch.no_grad():
            self._check_spend(spend_future, "spend_future")
        uf = spend_future.to(torch.float64) / self._u_scale
        if covariates_future is None:
            Xf = torch.zeros(h, self._p, dtype=torch.float64)
        else:
            Xf = _as_real_tensor(covariates_future, "covariates_future").to(torch.float64)
            if Xf.shape != (h, self._p):
                raise ValueError(
                    f"covariates_future must have shape ({h}, {self._p}): the {h} weeks of "
                    f"spend_future by the {self._p} covariates of the fit, got {tuple(Xf.shape)}"
                )
            self._check_covariates(Xf, "covariates_future")
            Xf = (Xf - self._x_loc) / self._x_scale
        return uf, Xf

    def _cached_end_state(self, max_draws):
        """Draws and their filtered end-of-training state; the allocator asks for these at
        every candidate spend, and they do not depend on it."""
        cache = getattr(self, "_end_state_cache", None)
        if cache is None or cache[0] is not self.samples or cache[1] != max_draws:
            draws = self._draw_subset(max_draws)
            with torch.no_grad():
                state = self._end_state(draws)
            self._end_state_cache = cache = (self.samples, max_draws, draws, state)
        return cache[2], cache[3]

    def _end_state(self, draws):
        """Per draw: filtered ``x_T`` moments, ``D_T``, last inflow and the DLM."""
        y, u, X = self._data
        params = {n: v for n, v in draws.items() if n != "obs_precision"}
        offset = self._mean_offset(params, u, X)
        dlm = self.state_space(params)
        prec = draws.get("obs_precision")
        res = kalman_filter(*dlm._args(y - offset, prec))
        mT, PT = res.filtered_means[..., -1, :], res.filtered_covs[..., -1, :, :]
        G, F, W, V, _, _ = dlm.matrices(1)
        D = self._channel_goodwill(params, u)  # (..., T, k)
        if self._lag():
            # D_{T+1} per channel
            D_T = self._channel_phi(params) * D[..., -1, :] + u[-1] * params["q"]
        else:
            D_T = D[..., -1, :]
        var_obs = params["sigma_obs"] ** 2
        if self.noise == "student_t":
            var_obs = var_obs * self.df / (self.df - 2)
        return mT, PT, G, F[0], W, var_obs, D_T, params

    def _future_offset(self, params, D_T, uf, Xf):
        """``D_{T+j} + x_{T+j}' beta`` for ``j = 1..h`` (standardised), ``(n, h)``, from
        each channel's goodwill ``D_T`` ``(n, k)`` (``D_{T+1}`` for ``spend_lag=1``)."""
        phi = self._channel_phi(params)  # (n, k) or (n, 1)
        inflow = uf * params["q"].unsqueeze(-2)  # (n, h, k)
        h = uf.shape[0]
        out = []
        if self._lag():
            d = D_T  # D_{T+1}
            for j in range(h):
                out.append(d)
                d = phi * d + inflow[..., j, :]
        else:
            d = D_T  # D_T
            for j in range(h):
                d = phi * d + inflow[..., j, :]
                out.append(d)
        off = torch.stack(out, -2).sum(-1)
        if "beta" in params:
            off = off + (Xf * params["beta"].unsqueeze(-2)).sum(-1)
        return off

    def sales_moments(self, spend_future, covariates_future=None, max_draws=500):
        r"""Per-draw predictive mean and variance of TOTAL sales over ``h`` weeks.

        Exact Gaussian moments given each posterior draw (states integrated by the Kalman
        filter to the end of training, then propagated).  With Student-t noise the
        observation variance is moment-matched, ``nu / (nu - 2) sigma^2`` (and the
        filtering is conditional on the draw's precisions).  Differentiable w.r.t.
        ``spend_future`` (which enters the mean linearly through ``q`` and ``delta``).
        With ``spend_lag=1`` the last week's spend of the horizon does not affect the
        horizon's sales.

        :param spend_future: ``(h, k)`` non-negative spend, original units.
        :param covariates_future: ``(h, p)`` or ``None`` (the training means).
        :returns: ``(means, variances)``, each ``(num_draws,)``, original units.
        """
        self._check_fitted()
        uf, Xf = self._future_inputs(spend_future, covariates_future, max_draws)
        draws, (mT, PT, G, F, W, var_obs, D_T, params) = self._cached_end_state(max_draws)
        h = uf.shape[0]
        n, S = mT.shape
        Gb = G.expand(n, S, S)
        Fb = F.expand(n, 1, S) if F.dim() == 2 else F
        a = [Fb]  # a_0 = F
        for _ in range(h):
            a.append(a[-1] @ Gb)
        # total = sum_{k=1..h} F x_{T+k} + noise; x_{T+k} = G^k x_T + sum_{l<=k} G^{k-l} w_l
        c = torch.stack(a[1:], 0).sum(0)  # (n, 1, S)
        mean_state = (c @ mT.unsqueeze(-1)).reshape(n)
        var = (c @ PT @ c.mT).reshape(n)
        Wb = W.expand(n, S, S)
        cum = torch.cumsum(torch.stack(a[:h], 0), 0)  # b_l = sum_{j=0}^{h-l} a_j
        for lag in range(1, h + 1):
            b = cum[h - lag]
            var = var + (b @ Wb @ b.mT).reshape(n)
        var = var + h * var_obs.reshape(n)
        off = self._future_offset(params, D_T, uf, Xf).sum(-1)
        means = h * self._y_loc + self._y_scale * (mean_state + off)
        return means, self._y_scale**2 * var

    def _simulate_future(self, uf, Xf, max_draws, num_samples=1):
        draws, (mT, PT, G, F, W, var_obs, D_T, params) = self._cached_end_state(max_draws)
        with torch.no_grad():
            off = self._future_offset(params, D_T, uf, Xf)  # (n, h)
            n, S = mT.shape
            h = uf.shape[0]

            def sqrtm(P):
                e, v = torch.linalg.eigh(P)
                return v * e.clamp(min=0).sqrt().unsqueeze(-2)

            LP, LW = sqrtm(PT), sqrtm(W.expand(n, S, S))
            x = mT + (LP @ torch.randn(num_samples, n, S, 1, dtype=mT.dtype)).squeeze(-1)
            F = F.reshape(S)
            paths = []
            sig = draws["sigma_obs"]
            for j in range(h):
                x = (G @ x.unsqueeze(-1)).squeeze(-1) + (
                    LW @ torch.randn(num_samples, n, S, 1, dtype=mT.dtype)
                ).squeeze(-1)
                if self.noise == "student_t":
                    eps = dist.StudentT(self.df, 0.0, sig).sample((num_samples,))
                else:
                    eps = sig * torch.randn(num_samples, n, dtype=mT.dtype)
                paths.append(x @ F + off[:, j] + eps)
            paths = torch.stack(paths, -1)  # (num_samples, n, h)
        return self._y_loc + self._y_scale * paths

    def one_step_predictions(self, sales, spend, covariates=None, max_draws=200):
        """Mean and sd of the one-step-ahead predictive ``y_t | y_{1:t-1}`` for every week
        of ``sales`` (the training weeks and any weeks after them), original units, with the
        static parameters from the fitted posterior: a mixture over ``max_draws`` draws of
        the Kalman filter's predictive densities (the MAPE of thesis section 1.2.4).
        Gaussian noise only (for Student-t noise the filter needs the future precisions).

        :returns: ``(mean, sd)``, each ``(T,)``.
        """
        self._check_fitted()
        if self.noise != "gaussian":
            raise ValueError("one_step_predictions needs noise='gaussian'")
        check_int(max_draws, "max_draws", low=1)
        sales = self._tensor(sales, "sales", 1)
        self._check_sales(sales)
        T = sales.shape[0]
        # One row per week of sales, one column per channel / covariate of the fit.
        columns = {"spend": (spend, self.num_channels, "channels")}
        if covariates is not None:
            columns["covariates"] = (covariates, self._p, "covariates")
        for name, (value, width, what) in columns.items():
            value = self._tensor(value, name, 2)
            if value.shape != (T, width):
                raise ValueError(
                    f"{name} must have shape ({T}, {width}): the {T} weeks of sales by the "
                    f"{width} {what} of the fit, got {tuple(value.shape)}"
                )
            columns[name] = value
        spend = columns["spend"]
        self._check_spend(spend)
        if covariates is not None:
            covariates = columns["covariates"]
            self._check_covariates(covariates)
        draws = self._draw_subset(max_draws)
        params = {n: v for n, v in draws.items() if n != "obs_precision"}
        y = (sales - self._y_loc) / self._y_scale
        u = spend / self._u_scale
        X = torch.zeros(y.shape[0], self._p, dtype=torch.float64)
        if covariates is not None:
            X = (covariates - self._x_loc) / self._x_scale
        with torch.no_grad():
            offset = self._mean_offset(params, u, X)  # (n, T)
            dlm = self.state_space(params)
            filtered = kalman_filter(*dlm._args(y - offset))
            F = dlm.matrices(1).observation_matrix[..., 0, :]
            F = F.expand(offset.shape[0], F.shape[-1])
            means = (filtered.predicted_means * F[:, None, :]).sum(-1) + offset
            variances = torch.einsum("ns,ntsr,nr->nt", F, filtered.predicted_covs, F)
            variances = variances + params["sigma_obs"].pow(2)[:, None]
        mean = means.mean(0)
        # Moments of the mixture over draws (law of total variance).
        variance = variances.mean(0) + (means - mean).pow(2).mean(0)
        return self._y_loc + self._y_scale * mean, self._y_scale * variance.sqrt()

    def forecast(self, spend_future, covariates_future=None, max_draws=500):
        """Posterior predictive draws ``(num_draws, h)`` of weekly sales, original units
        (one path per posterior draw, observation noise included)."""
        self._check_fitted()
        uf, Xf = self._future_inputs(spend_future, covariates_future, max_draws)
        return self._simulate_future(uf.detach(), Xf, max_draws)[0]

    def sample_sales(self, spend_future, covariates_future=None, num_samples=1, max_draws=500):
        """Monte Carlo draws of TOTAL sales over the horizon, ``(num_draws * num_samples,)``
        (``num_samples`` paths per posterior draw; not differentiable)."""
        self._check_fitted()
        num_samples = check_int(num_samples, "num_samples", low=1)
        uf, Xf = self._future_inputs(spend_future, covariates_future, max_draws)
        return self._simulate_future(uf.detach(), Xf, max_draws, num_samples).sum(-1).reshape(-1)
