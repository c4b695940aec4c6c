"""
Fitting :class:`~pyro_ext.models.bsts.RetailBSTS`: data preparation and standardisation,
the choice of the spend's lag by the evidence, the Gaussian start (an AutoNormal fit), and
the samplers (the point mass's exact draws, SG-MCMC with Gibbs moves on the indicators,
VIS). The inference machinery itself is :mod:`pyro_ext.infer`'s; this mixin wires the model
to it.
"""

import math
import time
import warnings

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.autoguide.initialization import InitMessenger

from ...infer.errors import SamplerDivergenceError
from ...infer.evidence import elbo_estimate
from ...ops.random import rng_preserved
from ...ops.stats import split_rhat
from ...ops.validation import check_choice, check_int
from .distributions import NoiseScales
from .goodwill import START_WEEKS

METHODS = ("sgld", "vis", "nuts")
# spend_lag="auto": the SVI steps of each lag's Gaussian approximation whose ELBOs compare.
EVIDENCE_STEPS = 150
# The factors of q's prior median the start is chosen among (`_start_values`).
INIT_Q_FACTORS = (1.0, 0.3, 0.1, 0.03, 0.01)


def _split_rhat(draws):
    """Split-R-hat, 1 where it is 0 / 0: an indicator that no chain ever moved."""
    rhat = split_rhat(draws)
    return torch.where(torch.isnan(rhat), torch.ones_like(rhat), rhat)


def _max_rhat(chains):
    """Largest split-R-hat over the static sites of ``{site: (chains, draws, ...)}`` (the
    point mass's indicators included: their frequencies are the inclusion probabilities)."""
    return max(float(_split_rhat(v).max()) for n, v in chains.items() if n != "obs_precision")


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


class Fitting:
    """The fitting methods of :class:`~pyro_ext.models.bsts.RetailBSTS`."""

    def _prepare(self, sales, spend, covariates, standardize):
        y = self._tensor(sales, "sales", 1)
        # Every tensor the model makes lives where the sales do (spend and covariates must
        # be there too: the contract refuses a mix).
        self._device = y.device
        u = self._tensor(spend, "spend", 2, y.device)
        if u.shape[0] != y.shape[0]:
            raise ValueError(f"spend has {u.shape[0]} weeks but sales has {y.shape[0]}")
        if u.shape[1] == 0:
            raise ValueError(
                "spend has 0 columns: the model needs at least one advertising channel "
                "(one column per channel)"
            )
        self._check_spend(u)
        if covariates is None:
            X = y.new_zeros(y.shape[0], 0)
        else:
            X = self._tensor(covariates, "covariates", 2, y.device)
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
            self._y_loc, self._y_scale = y.new_tensor(0.0), y.new_tensor(1.0)
            self._u_scale = u.new_ones(u.shape[1])
            self._x_loc, self._x_scale = X.new_zeros(X.shape[1]), X.new_ones(X.shape[1])
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

        ``seed`` seeds torch's, Python's and NumPy's generators for the fit alone: the same
        seed gives the same draws, and the generators are put back as they were afterwards,
        so fitting does not move the caller's random stream.

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
        if self._roas_prior_given:
            self._resolve_roas_prior()
        if self.discrete_sites and method != "sgld":
            raise ValueError(
                f"method={method!r} cannot move the point mass's indicators "
                f"{self.discrete_sites}: use method='sgld' (SG-MCMC with Gibbs moves), or "
                "selection='ssvs', whose indicators are summed out"
            )
        if kwargs.get("moves") is not None:
            self._check_moves(kwargs["moves"], method)
        t0 = time.perf_counter()
        # Seeded on torch's, Python's and NumPy's generators, which are put back afterwards:
        # the same seed gives the same fit, and the caller's random stream is untouched.
        with rng_preserved():
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
                    init_strategy=self._init_strategy(),
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
        scale = torch.tensor(
            [ps["sigma_obs"], ps["sigma_goodwill"]], dtype=torch.float64, device=self.device
        )
        return NoiseScales(scale)

    def _init_strategy(self):
        """The start of every fit (the AutoNormal's locations, NUTS' first point), as a Pyro
        init strategy: :meth:`_start_values`, and Pyro's ``init_to_median`` for any site
        they lack."""
        return pyro.infer.autoguide.init_to_value(
            values=self._start_values(), fallback=pyro.infer.autoguide.init_to_median
        )

    def _start_values(self):
        """Each site at its prior median, except a sampled ``q``, scaled down by the factor
        in ``INIT_Q_FACTORS`` whose point has the largest log joint on the data.

        ``q``'s prior, HalfNormal(``q_scale``) on standardised sales per unit of mean spend,
        is wide: at its median every channel's goodwill is several sales sds, and the noise
        scales the fit then needs to absorb it keep the AutoNormal far from the mode after
        its 150 steps (on a simulated series its ELBO was 105 nats below the converged one,
        and 5 nats with the scaled start).  One log joint per factor is cheap."""
        # init_to_median skips multivariate sites; NoiseScales' median is elementwise.
        scale = self._noise_scales_prior().scale
        median = dist.HalfNormal(scale).icdf(scale.new_tensor(0.5))
        if not self._q_sampled:
            return {"noise_scales": median}
        at_median = pyro.infer.autoguide.init_to_value(
            values={"noise_scales": median}, fallback=pyro.infer.autoguide.init_to_median
        )
        model = self._all_indicators_on(self.model)
        poutine = pyro.poutine
        with poutine.block(), InitMessenger(at_median):
            trace = poutine.trace(model).get_trace(*self._data)
        values = {
            name: site["value"].detach()
            for name, site in trace.nodes.items()
            if site["type"] == "sample" and not site["is_observed"]
        }
        best, best_log_joint = values, -math.inf
        # Value checks would refuse a start (not the fit) over a log density's domain.
        with poutine.block(), pyro.validation_enabled(False), torch.no_grad():
            for factor in INIT_Q_FACTORS:
                start = dict(values, q=values["q"] * factor)
                log_joint = poutine.trace(poutine.condition(model, start)).get_trace(*self._data)
                log_joint = float(log_joint.log_prob_sum())
                if log_joint > best_log_joint:  # NaN never wins
                    best, best_log_joint = start, log_joint
        return best

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
                # Drawn on the CPU: the same seed gives the same draws on every device.
                noise = torch.randn(
                    *mean.shape, 1, generator=generator, dtype=mean.dtype, device="cpu"
                ).to(mean.device)
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
        ones = {"gamma": X.new_ones(X.shape[1]), "gamma_q": u.new_ones(u.shape[1])}
        return pyro.poutine.condition(model, data=ones)

    def _map_init(self, num_steps, lr=0.05):
        """Median of a short AutoNormal SVI fit, to start the particles near the mode (with
        every indicator of a point mass at 1: a guide cannot hold discrete sites)."""
        model = self._all_indicators_on(self.model)
        guide = pyro.infer.autoguide.AutoNormal(
            model, init_scale=0.05, init_loc_fn=self._init_strategy()
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
            self.model, init_scale=0.05, init_loc_fn=self._init_strategy()
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
