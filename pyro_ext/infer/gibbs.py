r"""
A compound kernel: a stochastic-gradient kernel moves the continuous latent sites, and
Gibbs or Metropolis-Hastings moves update the discrete ones from their exact full
conditionals (the scheme of NumPyro's ``HMCGibbs`` / ``DiscreteHMCGibbs``; Pyro has
neither). It is how the thesis' BSTS sampler moves the spike-and-slab indicators
(section 1.2.2, after Scott & Varian 2014): ``p(gamma_j | gamma_{-j}, theta, y)`` from the
exact marginal likelihood with the coefficients integrated out.

Every move is vectorised: all ``L`` particles, and all values of the element being moved,
are evaluated in one pass of the model's potential (:class:`~.potential.ParticlePotential`,
the same layer the gradient step runs on). The elements of a site that are conditionally
independent given everything else (mixture assignments in a data plate) are all drawn in
that one pass.
"""

import contextlib
import math
import warnings
from collections.abc import Mapping

import pyro
import torch
from pyro.distributions.util import scale_and_mask
from pyro.poutine.util import site_is_subsample

from ..ops.validation import check_choice, check_int
from .errors import SamplerDivergenceError
from .potential import LogJointMessenger
from .sgmcmc.kernels import ParticleKernel, SGMCMCKernel

__all__ = ["MOVES", "Gibbs"]

#: the discrete moves :class:`Gibbs` offers
MOVES = ("gibbs", "mh-flip", "mh-swap")


class _GibbsParams(Mapping):
    """The inner kernel's (unconstrained) continuous values and the discrete values."""

    def __init__(self, continuous, discrete):
        self.continuous, self.discrete = continuous, discrete

    def __getitem__(self, name):
        if name in self.discrete:
            return self.discrete[name]
        return self.continuous[name]

    def __iter__(self):
        yield from self.continuous
        yield from self.discrete

    def __len__(self):
        return len(self.continuous) + len(self.discrete)


class _SiteLogProbs(LogJointMessenger):
    """:class:`~pyro_ext.infer.potential.LogJointMessenger`'s conditioning, keeping each site's
    scaled, masked log density as a tensor over its batch (plate) dimensions instead of
    summing them: the factors a Gibbs move splits into per-element conditionals."""

    def __init__(self, values):
        super().__init__(values, {})
        self.log_probs = {}

    def _postprocess_message(self, msg):
        if msg["type"] != "sample" or site_is_subsample(msg) or msg["infer"].get("_deterministic"):
            return
        log_prob = msg["fn"].log_prob(msg["value"], *msg["args"], **msg["kwargs"])
        self.log_probs[msg["name"]] = scale_and_mask(log_prob, msg["scale"], msg["mask"])


class Gibbs(ParticleKernel):
    r"""
    Alternate a stochastic-gradient kernel on the continuous sites with moves on the
    discrete sites ``discrete_sites`` (enumerable: Bernoulli, Categorical, Binomial;
    batched or ``.to_event()``-ed, outside subsampled plates)::

        kernel = Gibbs(SGLD(model, step_size=1e-3, num_particles=8), discrete_sites=["gamma"])
        mcmc = MCMC(kernel, num_samples=1000, warmup_steps=500)
        mcmc.run(X, y)
        mcmc.get_samples()["gamma"].mean(0)   # posterior inclusion probabilities

    Each particle carries its own discrete values, so the particles stay independent
    chains (R-hat across them, as for the gradient kernels). Every ``every`` steps, before
    the gradient step, the discrete sites are updated one element at a time, given the
    continuous sites and all other elements, by ``moves``:

    * ``"gibbs"`` (default): the element is drawn from its exact full conditional, which
      is computed by enumerating its values (the model is run once per value, vectorised
      with the particles): ``V`` evaluations per element for ``V`` values. When the
      site's elements are conditionally independent given the rest (mixture assignments
      in a data plate, indicators in a plate whose downstream sites each read their own
      element), all of them are drawn at once from their exact full conditionals
      (blocked Gibbs; Ishwaran & James 2001 for mixtures): the model runs once per value
      with every element at that value, as Pyro's parallel enumeration broadcasts a value
      along a plate (``TraceEnum_ELBO``, ``infer_discrete``), each factor's log density is
      read element by element, and element ``i`` is drawn with probabilities
      ``softmax_v`` of the sum of its factors at ``v``: ``V + 2`` evaluations per sweep,
      whatever the number of elements. The split is checked in the same pass at every
      sweep: every factor that changes with the value must be batched over the site's
      elements, and the log joint at the current values and at uniformly drawn values must
      equal the per-element sum. A site that fails (its elements interact: a factor outside
      its plate, a ``.to_event()`` site, a sum or shift along the plate) is swept one
      element at a time from then on, with a ``RuntimeWarning`` that says why;
      :attr:`vectorised_sites` tells which sites are drawn at once. A model that
      subsamples a plate is always swept.
    * ``"mh-flip"``: Metropolis-Hastings, proposing another value of the element
      uniformly (a flip for a binary site): one evaluation per element. Cheaper than
      ``"gibbs"`` for many-valued sites; it mixes less per sweep.
    * ``"mh-swap"`` (binary sites): as many Metropolis-Hastings proposals as the site has
      elements, each either a flip of a random element or, with probability 1/2, a swap
      of a random included (1) and a random excluded (0) element, which keeps the model
      size (the move that helps when correlated covariates compete for one slot). Both
      proposals are symmetric.

    The conditionals are exact: they use the full data, also when the gradient kernel
    subsamples a plate (one plate, whose size a multiple of its ``subsample_size``: the
    full data is evaluated as its consecutive minibatches, so a sweep costs a full-data
    pass per value and element; ``every`` spaces the sweeps). They are drawn at temperature 1, whatever the
    inner kernel's ``temperature``. The log joint includes the discrete sites' own prior
    (their log probability), so a site whose prior depends on continuous sites (a mixture
    weight, an inclusion probability) feeds back into the gradient step.

    :param kernel: the :class:`~pyro_ext.infer.SGMCMCKernel` for the continuous sites
        (eager or ``jit_compile``: its compiled step takes the discrete values as inputs,
        so it is not recompiled when they change; each compiled step is then verified
        before the next move reads it).
    :param discrete_sites: a site name or a list of them.
    :param moves: ``"gibbs"``, ``"mh-flip"`` or ``"mh-swap"`` for every site, or a dict
        ``{site: move}`` (sites left out get ``"gibbs"``) whose moves may also be callables
        ``move(values, *model_args, **model_kwargs) -> new value`` of the site ``(L, ...)``,
        given every site's current values ``values`` (constrained, ``(L, ...)``): a
        model-specific update that must leave the site's full conditional invariant, as
        NumPyro's ``HMCGibbs(gibbs_fn=...)`` takes (e.g. a collapsed Gibbs scan on
        sufficient statistics, far cheaper than running the model per value).
    :param int every: steps between discrete sweeps (1: every step).
    :param int max_support_size: the most values an element may take (default 64): a
        Gibbs sweep costs that many model evaluations per element, so a site with more
        values is refused with an error.
    :param float divergence_threshold: the largest energy error (nats) of a step of the
        inner kernel before it counts as a divergence (default 1000, the threshold of
        Stan's and Pyro's NUTS); ``None`` turns the check off. After each step ``z -> z'``
        the log density ``log p`` (unconstrained, discrete sites at their values) and its
        gradient ``g`` are evaluated at both ends on the step's data, and the step's energy
        error ``|log p(z') - log p(z) - (g(z) + g(z')) . (z' - z) / 2|`` is the error of the
        trapezoidal rule along the step: zero on a Gaussian target whatever the dimension
        and the step, and huge when one step jumps across the posterior (a noise scale
        thrown from 0.1 to 1e25 by a gradient of 1e6). A step whose error is above the
        threshold and above the step's change of ``log p`` itself (far from the posterior a
        sound step may gain thousands of nats with a trapezoid off by a fifth of that; a
        jump gets even the change's size wrong), or one whose log density or gradient is
        not finite, raises
        :class:`~pyro_ext.infer.SamplerDivergenceError` with the step and the sites that
        carry the error; the draws before it are kept (:meth:`MCMC.get_samples`). It costs
        one gradient evaluation of the ``L`` particles per step (of ``2 L`` after a
        compiled inner step, whose gradient at the step's start is not kept).
    """

    def __init__(
        self,
        kernel: SGMCMCKernel,
        discrete_sites,
        moves: str = "gibbs",
        every: int = 1,
        max_support_size: int = 64,
        divergence_threshold: float | None = 1000.0,
    ):
        if not isinstance(kernel, SGMCMCKernel):
            raise TypeError(
                "kernel must be a pyro_ext.infer.SGMCMCKernel (SGLD, SGHMC, AdamSGLD), got "
                f"{type(kernel).__name__}"
            )
        if isinstance(discrete_sites, str):
            discrete_sites = [discrete_sites]
        if not isinstance(discrete_sites, list | tuple) or not all(
            isinstance(name, str) for name in discrete_sites
        ):
            raise TypeError(
                f"discrete_sites must be a site name or a list of them, got {discrete_sites!r}"
            )
        if not discrete_sites:
            raise ValueError("discrete_sites must name at least one discrete site")
        if len(set(discrete_sites)) != len(discrete_sites):
            raise ValueError(f"discrete_sites names a site twice: {list(discrete_sites)}")
        self._moves = self._check_moves(moves, discrete_sites)
        self.every = check_int(every, "every", low=1)
        self.max_support_size = check_int(max_support_size, "max_support_size", low=2)
        if divergence_threshold is not None:
            if isinstance(divergence_threshold, bool) or not isinstance(
                divergence_threshold, int | float
            ):
                raise TypeError(
                    "divergence_threshold must be a positive number of nats or None, got "
                    f"{type(divergence_threshold).__name__}"
                )
            if not (math.isfinite(divergence_threshold) and divergence_threshold > 0):
                raise ValueError(
                    "divergence_threshold must be a positive, finite number of nats or None, "
                    f"got {divergence_threshold}"
                )
        self.divergence_threshold = divergence_threshold
        self.kernel = kernel
        self.discrete_sites = tuple(discrete_sites)
        self.moves = moves
        if kernel.divergence_check_every not in (None, 1):
            raise ValueError(
                f"the inner kernel has divergence_check_every={kernel.divergence_check_every}; "
                "inside Gibbs every compiled step is verified before the discrete move reads "
                "the particles (a rewind would leave the discrete values ahead of the "
                "continuous ones). Leave it at None or 1."
            )
        kernel.discrete_sites = self.discrete_sites
        kernel.max_support_size = self.max_support_size
        kernel.divergence_check_every = 1
        self.num_particles = kernel.num_particles
        self._initial_discrete = None
        self._discrete = None
        self._step = 0
        self._last_params = None
        self._full_subsamples = None
        #: Metropolis-Hastings acceptance rate of the discrete proposals so far (MH moves)
        self.acceptance_rate = None
        self._proposals = 0
        self._accepted = 0
        self._vectorised = {}
        self._why_swept = {}

    @property
    def vectorised_sites(self) -> tuple:
        """The ``"gibbs"`` sites whose elements are drawn at once (conditionally
        independent given the rest, as checked at every sweep); the others are swept one
        element at a time. Known after the first sweep of a run."""
        return tuple(name for name, ok in self._vectorised.items() if ok)

    @property
    def swept_sites(self) -> dict:
        """``{site: why}`` for the ``"gibbs"`` sites swept one element at a time because
        their elements are not conditionally independent given the rest (or the model
        subsamples a plate)."""
        return dict(self._why_swept)

    @staticmethod
    def _check_moves(moves, discrete_sites):
        if isinstance(moves, str):
            check_choice(moves, "moves", MOVES)
            return {name: moves for name in discrete_sites}
        if not isinstance(moves, dict):
            raise TypeError(f"moves must be one of {MOVES} or a dict {{site: move}}, got {moves!r}")
        unknown = set(moves) - set(discrete_sites)
        if unknown:
            raise ValueError(f"moves names sites not in discrete_sites: {sorted(unknown)}")
        out = {}
        for name in discrete_sites:
            move = moves.get(name, "gibbs")
            if not callable(move):
                check_choice(move, f"moves[{name!r}]", MOVES)
            out[name] = move
        return out

    # -- what MCMC reads, delegated to the inner kernel ---------------------------------
    @property
    def potential(self):
        return self.kernel.potential

    @property
    def transforms(self):
        return self.kernel.transforms

    @property
    def compile_seconds(self) -> float:
        """Seconds the inner kernel spent tracing and compiling its step."""
        return self.kernel.compile_seconds

    @property
    def rewound_to(self):
        return self.kernel.rewound_to

    @rewound_to.setter
    def rewound_to(self, value):
        self.kernel.rewound_to = value

    @property
    def divergence(self):
        return self.kernel.divergence

    @property
    def verified_steps(self) -> int:
        return self.kernel.verified_steps

    def relaxation_steps(self):
        return self.kernel.relaxation_steps()

    @property
    def kept_steps(self):
        """The inner kernel's :attr:`~pyro_ext.infer.SGMCMCKernel.kept_steps`."""
        return self.kernel.kept_steps

    @kept_steps.setter
    def kept_steps(self, value):
        self.kernel.kept_steps = value

    def mixing_advice(self, kept_steps: int):
        return self.kernel.mixing_advice(kept_steps)

    def escaped_particles(self):
        """The inner kernel's escaped particles (their log density over the kept steps is
        at the discrete sites' values of each step)."""
        return self.kernel.escaped_particles()

    def verify(self) -> bool:
        return self.kernel.verify()

    def cleanup(self):
        self.kernel.cleanup()

    def set_data(self, *args, **kwargs) -> None:
        """Run the next steps on new model arguments (see :meth:`SGMCMCKernel.set_data`)."""
        self.kernel.set_data(*args, **kwargs)
        self._full_subsamples = self._all_indices()
        if self._full_subsamples:
            self._vectorised = {name: False for name in self._vectorised}
            self._why_swept = {name: "the model subsamples a plate" for name in self._vectorised}

    def diagnostics(self):
        diagnostics = dict(self.kernel.diagnostics())
        if self.acceptance_rate is not None:
            diagnostics["discrete_acceptance_rate"] = self.acceptance_rate
        return diagnostics

    def logging(self):
        info = dict(self.kernel.logging())
        if self.acceptance_rate is not None:
            info["discrete accept"] = f"{self.acceptance_rate:.2f}"
        return info

    # -- draws -------------------------------------------------------------------------
    @property
    def particles(self) -> torch.Tensor:
        """Continuous (unconstrained) and discrete values side by side, ``(L, draw_dim)``."""
        z = self.kernel.particles
        columns = [z] + [
            self._discrete[name].reshape(self.num_particles, -1).to(z.dtype)
            for name in self.discrete_sites
        ]
        return torch.cat(columns, -1)

    @property
    def draw_dim(self) -> int:
        layout = self.potential.discrete_layout
        return self.potential.dim + sum(
            int(torch.Size(layout[name].shape).numel()) for name in self.discrete_sites
        )

    def constrain_draws(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        potential = self.potential
        values = potential.constrain(flat[..., : potential.dim])
        start, batch = potential.dim, flat.shape[:-1]
        for name in self.discrete_sites:
            site = potential.discrete_layout[name]
            size = int(torch.Size(site.shape).numel())
            column = flat[..., start : start + size]
            values[name] = column.reshape(batch + site.shape).to(site.dtype)
            start += size
        return values

    def site_shapes(self) -> list:
        layout = self.potential.discrete_layout
        return self.kernel.site_shapes() + [
            (name, list(layout[name].shape)) for name in self.discrete_sites
        ]

    # -- set-up ------------------------------------------------------------------------
    @property
    def initial_params(self):
        if self._discrete is not None:
            return self._params(self.kernel.initial_params)
        return self.kernel.initial_params

    @initial_params.setter
    def initial_params(self, params):
        if params is None:
            self.kernel.initial_params, self._initial_discrete = None, None
            return
        self._initial_discrete = {n: v for n, v in params.items() if n in self.discrete_sites}
        self.kernel.initial_params = {
            n: v for n, v in params.items() if n not in self.discrete_sites
        }

    def _all_indices(self):
        """The full data as minibatches: a subsampled plate of size ``N`` and subsample size
        ``B`` is cut into the ``N / B`` consecutive chunks, whose scaled log joints average
        to the full-data log joint exactly."""
        sizes = self.potential.subsample_sizes
        if not sizes:
            return []
        if len(sizes) > 1:
            raise ValueError(
                f"the model subsamples {len(sizes)} plates ({sorted(sizes)}); a Gibbs move "
                "evaluates the full data, which it can split into minibatches for one "
                "subsampled plate only. Subsample one plate, or none."
            )
        ((name, (size, subsample_size)),) = sizes.items()
        if size % subsample_size:
            raise ValueError(
                f"the subsampled plate {name!r} has size {size}, not a multiple of its "
                f"subsample_size={subsample_size}; a Gibbs move evaluates the full data as "
                "equal minibatches. Pick a subsample_size that divides the plate size."
            )
        device = self.kernel.particles.device
        indices = torch.arange(size, device=device)
        return [{name: chunk} for chunk in indices.split(subsample_size)]

    def setup(self, warmup_steps: int, *args, **kwargs) -> None:
        kernel = self.kernel
        kernel.setup(warmup_steps, *args, **kwargs)
        potential = kernel.potential
        for name in self.discrete_sites:
            if self._moves[name] == "mh-swap":
                support = potential.discrete_layout[name].support
                if support.numel() != 2:
                    raise ValueError(
                        f"moves='mh-swap' swaps included and excluded elements of binary "
                        f"sites, but discrete site {name!r} takes {support.numel()} values; "
                        "use moves='gibbs' or 'mh-flip'"
                    )
        self._full_subsamples = self._all_indices()
        self._discrete = self._start_values()
        self._step = 0
        self._last_params = None
        self._proposals = self._accepted = 0
        self.acceptance_rate = None
        # Drawn at once until a sweep shows that the elements interact; a model that
        # subsamples a plate is swept (its full-data log joint is a mean over minibatches).
        self._vectorised = {
            name: not self._full_subsamples
            for name in self.discrete_sites
            if self._moves[name] == "gibbs"
        }
        self._why_swept = {
            name: "the model subsamples a plate" for name, ok in self._vectorised.items() if not ok
        }

    def _start_values(self):
        """The given initial values, else each particle's draw from the model given its
        continuous sites (the discrete prior, or the conditional prior of a hierarchy)."""
        potential, num_particles = self.potential, self.num_particles
        given = self._initial_discrete or {}
        values = {}
        for name in self.discrete_sites:
            if name not in given:
                continue
            site = potential.discrete_layout[name]
            value = torch.as_tensor(given[name], dtype=site.dtype)
            if tuple(value.shape) == site.shape:
                value = value.expand((num_particles,) + site.shape)
            if tuple(value.shape) != (num_particles,) + site.shape:
                raise ValueError(
                    f"initial_params[{name!r}] has shape {tuple(value.shape)}; expected "
                    f"{site.shape} or {(num_particles,) + site.shape}"
                )
            values[name] = value.clone()
        missing = [name for name in self.discrete_sites if name not in values]
        if missing:
            continuous = potential.constrain(self.kernel.particles.detach())
            draws = {name: [] for name in missing}
            for particle in range(num_particles):
                data = {name: value[particle] for name, value in continuous.items()}
                with (
                    pyro.poutine.block(),
                    pyro.poutine.trace() as tracer,
                    pyro.poutine.condition(data=data),
                ):
                    potential.run_model()
                for name in missing:
                    draws[name].append(tracer.trace.nodes[name]["value"].detach())
            values.update({name: torch.stack(draws[name]) for name in missing})
        return {name: values[name] for name in self.discrete_sites}

    # -- the step ----------------------------------------------------------------------
    def _params(self, continuous):
        self._last_params = _GibbsParams(continuous, dict(self._discrete))
        return self._last_params

    def sample(self, params):
        if params is self._last_params:
            continuous = params.continuous
        else:
            # A caller (e.g. a hook) replaced the values: continue from them.
            continuous = {n: v for n, v in params.items() if n not in self.discrete_sites}
            for name in self.discrete_sites:
                if name in params:
                    site = self.potential.discrete_layout[name]
                    value = torch.as_tensor(params[name], dtype=site.dtype)
                    self._discrete[name] = value.expand((self.num_particles,) + site.shape)
            if isinstance(params, _GibbsParams):
                continuous = params.continuous
        if self._step % self.every == 0:
            try:
                self._sweep(self.kernel.particles.detach())
            except torch.linalg.LinAlgError as error:
                self.kernel.divergence = SamplerDivergenceError.from_model_error(
                    self._step, self.num_particles, error
                )
                raise self.kernel.divergence from error
        # Where the gradient step starts: the kernel's particles, or the values a caller
        # put in their place (which the kernel continues from).
        if continuous is self.kernel.last_params:
            z = self.kernel.particles.detach()
        else:
            z = self.potential.flatten(continuous, self.kernel.num_local_particles).detach()
        continuous = self.kernel.sample(continuous, conditioned=self._discrete)
        if self.divergence_threshold is not None and self.kernel.rewound_to is None:
            self._check_step(z, self.kernel.particles.detach())
        self._step += 1
        return self._params(continuous)

    def _check_step(self, z, new_z):
        """Raise :class:`SamplerDivergenceError` if the inner kernel's step ``z -> new_z``
        has a non-finite or an exploding energy error (see ``divergence_threshold``)."""
        potential = self.potential
        # The inner kernel's own evaluation at the step's start (an eager step keeps it).
        last = self.kernel.step_start
        if last is not None and last.z.shape == z.shape and torch.equal(last.z, z):
            # The step's start as the kernel evaluated it; its end on the same minibatch.
            _, subsamples, start_log_density, start_grad = last
            ends = [new_z]
        else:
            # Both ends on one minibatch (none is drawn, so no randomness, without one).
            subsamples = potential.draw_subsamples(z.device)
            ends = [z, new_z]
        conditioned = {
            name: value.repeat((len(ends),) + (1,) * (value.dim() - 1))
            for name, value in self._discrete.items()
        }
        points = torch.cat(ends).requires_grad_(True)
        with torch.enable_grad(), pyro.validation_enabled(False):
            log_density = potential.log_density_all(points, subsamples, conditioned=conditioned)
            (grad,) = torch.autograd.grad(log_density.sum(), points)
        log_density, grad = log_density.detach(), grad.detach()
        if len(ends) == 1:
            log_density = torch.cat([start_log_density, log_density])
            grad = torch.cat([start_grad, grad])
        old, new = log_density.chunk(2), grad.chunk(2)
        terms = 0.5 * (new[0] + new[1]) * (new_z - z)  # (L, D): the trapezoid, per coordinate
        change = old[1] - old[0]
        error = (change - terms.sum(-1)).abs()
        finite = torch.isfinite(error) & torch.isfinite(new[1]).all(-1)
        # Far from the posterior a sound step can change the log density by thousands of
        # nats (a scale started at 0.1 under data of spread 5: 1e4 nats in one step) and
        # its trapezoid be off by a fifth of that. A step that jumped across the posterior
        # gets even the size of the change wrong: its error exceeds the change itself.
        bad = ~finite | ((error > self.divergence_threshold) & (error > change.abs()))
        if not bool(bad.any()):
            return
        particles = bad.nonzero().flatten().tolist()
        # The sites that carry the error: those holding at least a tenth of its terms.
        weight = torch.nan_to_num(terms[particles].abs(), nan=torch.inf).sum(0)
        per_site = {}
        for column, value in enumerate(weight.tolist()):
            site = potential.site_of(column)
            per_site[site] = per_site.get(site, 0.0) + value
        largest = max(per_site.values())
        sites = sorted(
            site
            for site, value in per_site.items()
            if value >= 0.1 * largest or not math.isfinite(value)
        )
        worst = error[particles].max()
        what = (
            f"an energy error of {float(worst):.3g} nats (above divergence_threshold="
            f"{self.divergence_threshold:g}): one step jumped across the posterior"
            if bool(finite[particles].all())
            else "a non-finite log density or gradient after the step"
        )
        step = self.kernel.num_steps - 1
        self.kernel.divergence = SamplerDivergenceError(
            step, sites, particles, reason=f"{what}, in site(s) {', '.join(map(repr, sites))},"
        )
        raise self.kernel.divergence

    def log_joint(self, z: torch.Tensor, conditioned: dict) -> torch.Tensor:
        """The full-data log joint ``(L,)`` of flat particles ``z`` ``(L, D)`` with the
        discrete sites at ``conditioned`` ``{site: (L, ...)}``: the mean of the
        minibatches' scaled log joints when the model subsamples (what every move targets).
        """
        log_density_all = self.potential.log_density_all
        if not self._full_subsamples:
            return log_density_all(z, {}, conditioned=conditioned)
        total = 0.0
        for chunk in self._full_subsamples:
            total = total + log_density_all(z, chunk, conditioned=conditioned)
        return total / len(self._full_subsamples)

    @property
    def discrete_values(self) -> dict[str, torch.Tensor]:
        """The discrete sites' current per-particle values ``{site: (L, ...)}`` (a copy)."""
        return dict(self._discrete)

    @contextlib.contextmanager
    def _values_at(self, discrete):
        # The moves read and write self._discrete: run them on other values, then restore.
        saved = self._discrete
        self._discrete = dict(saved if discrete is None else discrete)
        try:
            yield
        finally:
            self._discrete = saved

    def sweep(self, z: torch.Tensor, discrete: dict | None = None) -> dict[str, torch.Tensor]:
        """
        One sweep of the discrete moves at flat continuous particles ``z`` ``(B, D)`` from
        the discrete values ``discrete`` ``{site: (B, ...)}`` (default: the current ones);
        returns the new values and leaves the kernel's own untouched (what :meth:`sample`
        does before each gradient step, for a caller who checks or reuses the moves).
        """
        with self._values_at(discrete):
            self._sweep(z.detach())
            return dict(self._discrete)

    def full_conditionals(self, name: str, z: torch.Tensor, discrete: dict | None = None):
        """
        The exact full conditionals of every element of discrete site ``name`` at flat
        particles ``z`` ``(B, D)``, the other sites at ``discrete`` (default: the current
        values), as unnormalised log probabilities ``(B, E, V)`` over the site's support
        (elements flattened); ``None`` when the elements are not conditionally independent
        (the site is then swept element by element).
        """
        with self._values_at(discrete), torch.no_grad(), pyro.validation_enabled(False):
            return self._block_logits(name, z.detach())

    def _sweep(self, z):
        with torch.no_grad(), pyro.validation_enabled(False):
            current = None
            for name in self.discrete_sites:
                move = self._moves[name]
                if callable(move):
                    self._custom_move(name, move, z)
                    current = None
                elif move == "gibbs":
                    if not (self._vectorised[name] and self._gibbs_block(name, z)):
                        self._gibbs_site(name, z)
                    current = None
                else:
                    current = self._metropolis_site(name, move, z, current)
        if self._proposals:
            self.acceptance_rate = self._accepted / self._proposals

    def _others(self, name, repeats):
        """The other discrete sites' values, repeated ``repeats`` times along particles."""
        return {
            other: value.repeat((repeats,) + (1,) * (value.dim() - 1))
            for other, value in self._discrete.items()
            if other != name
        }

    def _site_log_probs(self, z, conditioned):
        """Every site's log density over its batch dimensions, ``{site: (B, *batch)}``, at
        flat particles ``z`` ``(B, D)`` with the discrete sites at ``conditioned``
        ``{site: (B, ...)}``: one pass of the model under :func:`torch.func.vmap`."""
        potential = self.potential

        def one(particle, values):
            values = {**potential.constrain(particle), **values}
            with _SiteLogProbs(values) as messenger:
                potential.run_model()
            return messenger.log_probs

        return torch.func.vmap(one, randomness="different")(z, conditioned)

    def _gibbs_block(self, name, z):
        """Draw every element of site ``name`` at once from its exact full conditional, if
        the elements are conditionally independent given the rest; returns whether it did
        (otherwise the site is marked for the element-by-element sweep)."""
        logits = self._block_logits(name, z)
        if logits is None:
            return False
        site = self.potential.discrete_layout[name]
        support = site.support.to(device=z.device, dtype=site.dtype)
        stuck = ~torch.isfinite(logits).any(-1).all(-1)  # an element with no possible value
        if bool(stuck.any()):
            raise SamplerDivergenceError(
                self.kernel.num_steps, [name], stuck.nonzero().flatten().tolist()
            )
        choice = torch.distributions.Categorical(logits=logits).sample()  # (L, E)
        self._discrete[name] = support[choice].reshape((z.shape[0],) + site.shape)
        return True

    def _block_logits(self, name, z):
        """
        The full conditionals of all elements of site ``name`` at particles ``z``, as
        unnormalised log probabilities ``(L, E, V)`` over the site's support (elements
        flattened), when the elements are conditionally independent given the rest (see
        ``moves``); ``None`` (and the site marked for the sweep) otherwise.
        """
        site = self.potential.discrete_layout[name]
        support = site.support.to(device=z.device, dtype=site.dtype)
        num_values, num_particles = support.numel(), z.shape[0]
        shape = site.shape
        if tuple(site.batch_shape) != tuple(shape):
            return self._not_independent(name, "its elements are a .to_event() event", warn=False)
        current = self._discrete[name]
        # Configurations, each for all particles: every element at value v (for each v),
        # the current values, and uniformly drawn values (the last two check the split).
        uniform = support[torch.randint(0, num_values, (num_particles,) + shape, device=z.device)]
        candidates = torch.cat(
            [
                support.reshape((num_values, 1) + (1,) * len(shape)).expand(
                    (num_values, num_particles) + shape
                ),
                current.unsqueeze(0),
                uniform.unsqueeze(0),
            ]
        )  # (V + 2, L, *shape)
        num_configs = num_values + 2
        conditioned = self._others(name, num_configs)
        conditioned[name] = candidates.reshape((num_configs * num_particles,) + shape)
        if self.potential.vectorize == "plate":
            # The potential already found that vmap cannot batch this model (and said so).
            return self._not_independent(name, "vmap cannot run the model", warn=False)
        try:
            log_probs = self._site_log_probs(z.repeat(num_configs, 1), conditioned)
        except RuntimeError as error:
            # torch.func.vmap's refusal of an operation it cannot batch, as the potential
            # meets it: the sweep then runs the potential's own way, said aloud.
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
            return self._not_independent(name, f"vmap cannot run the model ({first_line})")
        num_batch = len(shape)
        table = 0.0  # (V, L, *shape): each element's factors at each value
        totals = 0.0  # (V + 2, L): the log joint of each configuration
        for other, log_prob in log_probs.items():
            log_prob = log_prob.reshape((num_configs, num_particles) + log_prob.shape[1:])
            totals = totals + log_prob.reshape(num_configs, num_particles, -1).sum(-1)
            at_values = log_prob[:num_values]
            if torch.equal(at_values, at_values[:1].expand_as(at_values)):
                continue  # does not change with the value: cancels from the conditional
            batch = at_values.shape[2:]
            if len(batch) < num_batch or tuple(batch[len(batch) - num_batch :]) != shape:
                return self._not_independent(
                    name,
                    f"site {other!r} changes with it but is not batched over its elements "
                    f"(batch shape {tuple(batch)}, the elements' {tuple(shape)})",
                    warn=False,
                )
            extra = tuple(range(2, 2 + len(batch) - num_batch))
            table = table + (at_values.sum(extra) if extra else at_values)
        if not isinstance(table, torch.Tensor):  # nothing depends on the site: its prior is flat
            table = z.new_zeros((num_values, num_particles) + shape)
        table = table.reshape(num_values, num_particles, -1)  # (V, L, E)
        # The split's check, against the current values c: every configuration x of the
        # pass (each value everywhere, and the uniform draw) must have
        # log p(x) = log p(c) + sum_i [T(x_i, i) - T(c_i, i)].
        index = candidates.reshape(num_configs, num_particles, -1).unsqueeze(-1) == support
        index = index.to(torch.long).argmax(-1)  # (V + 2, L, E): each element's value index
        at_current = table.gather(0, index[num_values : num_values + 1]).squeeze(0)  # (L, E)
        at_uniform = table.gather(0, index[num_values + 1 :]).squeeze(0)
        current_total = totals[num_values]
        predicted = current_total + torch.cat(
            [(table - at_current).sum(-1), (at_uniform - at_current).sum(-1).unsqueeze(0)]
        )  # (V + 1, L)
        actual = torch.cat([totals[:num_values], totals[num_values + 1 :]])
        magnitude = sum(
            log_prob.detach().abs().reshape(num_configs, num_particles, -1).sum(-1)
            for log_prob in log_probs.values()
        )  # (V + 2, L): the scale of each sum's rounding error
        magnitude = (
            torch.cat([magnitude[:num_values], magnitude[num_values + 1 :]])
            + magnitude[num_values]
            + 1.0
        )
        tolerance = 256 * torch.finfo(z.dtype).eps * magnitude
        agree = ((predicted - actual).abs() <= tolerance) | (
            ~torch.isfinite(predicted) & (predicted == actual)
        )
        checkable = torch.isfinite(current_total) & (
            torch.isfinite(actual) | torch.isfinite(predicted)
        )
        if not bool((agree | ~checkable).all()):
            gap = float(torch.nan_to_num((predicted - actual).abs(), nan=torch.inf).max())
            return self._not_independent(
                name,
                "its log joint is not the sum of per-element terms (off by "
                f"{gap:.3g} nats between the current values and another configuration)",
            )
        return torch.nan_to_num(table.permute(1, 2, 0), nan=-torch.inf, posinf=-torch.inf)

    def _not_independent(self, name, why, warn=True):
        # A structure the docstring names (a .to_event() site, a factor outside the plate)
        # is swept quietly; a split that looked right but failed the check is said aloud.
        self._why_swept[name] = why
        self._vectorised[name] = False
        if not warn:
            return None
        warnings.warn(
            f"Gibbs: the elements of discrete site {name!r} are not conditionally "
            f"independent given the rest ({why}); they are swept one element at a time "
            "(V model evaluations per element).",
            RuntimeWarning,
            stacklevel=5,
        )
        return None

    def _gibbs_site(self, name, z):
        site = self.potential.discrete_layout[name]
        support = site.support.to(device=z.device, dtype=site.dtype)
        num_values, num_particles = support.numel(), z.shape[0]
        elements = self._discrete[name].reshape(num_particles, -1)
        z_all = z.repeat(num_values, 1)
        conditioned = self._others(name, num_values)
        particles = torch.arange(num_particles, device=z.device)
        for element in range(elements.shape[1]):
            candidates = elements.unsqueeze(0).repeat(num_values, 1, 1)  # (V, L, E)
            candidates[:, :, element] = support.unsqueeze(-1)
            conditioned[name] = candidates.reshape((num_values * num_particles,) + site.shape)
            log_joint = self.log_joint(z_all, conditioned).reshape(num_values, num_particles).T
            log_joint = torch.nan_to_num(log_joint, nan=-torch.inf, posinf=-torch.inf)
            stuck = ~torch.isfinite(log_joint).any(-1)
            if bool(stuck.any()):
                raise SamplerDivergenceError(
                    self.kernel.num_steps, [name], stuck.nonzero().flatten().tolist()
                )
            choice = torch.distributions.Categorical(logits=log_joint).sample()
            elements = candidates[choice, particles]
        self._discrete[name] = elements.reshape((num_particles,) + site.shape)

    def _custom_move(self, name, move, z):
        potential = self.potential
        site = potential.discrete_layout[name]
        values = potential.constrain(z)
        values.update(self._discrete)
        new = move(values, *potential.model_args, **potential.model_kwargs)
        expected = (z.shape[0],) + site.shape
        if not isinstance(new, torch.Tensor) or tuple(new.shape) != expected:
            got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
            raise ValueError(
                f"the move of discrete site {name!r} returned {got}; expected a tensor of "
                f"shape {expected} (one value per particle)"
            )
        self._discrete[name] = new.to(site.dtype)

    def _metropolis_site(self, name, move, z, current):
        site = self.potential.discrete_layout[name]
        support = site.support.to(device=z.device, dtype=site.dtype)
        num_values, num_particles = support.numel(), z.shape[0]
        elements = self._discrete[name].reshape(num_particles, -1)
        num_elements = elements.shape[1]
        if current is None:
            current = self.log_joint(z, self._discrete)
        particles = torch.arange(num_particles, device=z.device)
        for proposal_index in range(num_elements):
            index = (elements.unsqueeze(-1) == support).to(torch.long).argmax(-1)  # (L, E)
            if move == "mh-flip":
                # Element by element; another value, uniformly.
                element = torch.full((num_particles,), proposal_index, device=z.device)
                shift = torch.randint(1, num_values, (num_particles,), device=z.device)
                new_index = (index[particles, element] + shift) % num_values
                proposal = elements.clone()
                proposal[particles, element] = support[new_index]
            else:
                proposal = support[self._flip_or_swap(index)]
            conditioned = dict(self._discrete)
            conditioned[name] = proposal.reshape((num_particles,) + site.shape)
            proposed = self.log_joint(z, conditioned)
            log_ratio = torch.nan_to_num(proposed - current, nan=-torch.inf)
            accept = torch.rand_like(current).log() < log_ratio
            elements = torch.where(accept.unsqueeze(-1), proposal, elements)
            current = torch.where(accept, proposed, current)
            self._discrete[name] = elements.reshape((num_particles,) + site.shape)
            self._proposals += num_particles
            self._accepted += int(accept.sum())
        return current

    @staticmethod
    def _flip_or_swap(index):
        """Per particle (a row of value indices ``(L, E)`` in ``{0, 1}``): flip one random
        element, or with probability 1/2 swap a random 1 with a random 0 (a row without
        both proposes to stay). Returns the proposed indices."""
        num_particles, num_elements = index.shape
        device = index.device
        rows = torch.arange(num_particles, device=device)
        ones = (index == 1).to(torch.float)
        zeros = 1.0 - ones
        can_swap = (ones.sum(-1) > 0) & (zeros.sum(-1) > 0)
        uniform = torch.ones_like(ones)
        one_at = torch.multinomial(torch.where(can_swap[:, None], ones, uniform), 1).squeeze(-1)
        zero_at = torch.multinomial(torch.where(can_swap[:, None], zeros, uniform), 1).squeeze(-1)
        flip_at = torch.randint(0, num_elements, (num_particles,), device=device)
        swap = torch.rand(num_particles, device=device) < 0.5
        proposal = index.clone()
        flipped = torch.where(swap, proposal[rows, flip_at], 1 - proposal[rows, flip_at])
        proposal[rows, flip_at] = flipped
        do_swap = swap & can_swap
        proposal[rows, one_at] = torch.where(do_swap, 0, proposal[rows, one_at])
        proposal[rows, zero_at] = torch.where(do_swap, 1, proposal[rows, zero_at])
        return proposal

    # -- checkpointing -----------------------------------------------------------------
    def state_dict(self):
        """The inner kernel's state, the discrete values, the step count and which sites
        are drawn at once."""
        return {
            "step": self._step,
            "kernel": self.kernel.state_dict(),
            "discrete": dict(self._discrete),
            "proposals": self._proposals,
            "accepted": self._accepted,
            # which sites are drawn at once: a resumed run makes the draws of an
            # uninterrupted one, without re-detecting (and drawing for the check) again
            "vectorised": dict(self._vectorised),
            "why_swept": dict(self._why_swept),
        }

    def load_state_dict(self, state_dict):
        """Restore a state saved by :meth:`state_dict`; call after :meth:`setup`."""
        self.kernel.load_state_dict(state_dict["kernel"])
        self._step = state_dict["step"]
        self._discrete = dict(state_dict["discrete"])
        self._proposals, self._accepted = state_dict["proposals"], state_dict["accepted"]
        self._vectorised.update(state_dict.get("vectorised", {}))
        self._why_swept.update(state_dict.get("why_swept", {}))
        self.acceptance_rate = self._accepted / self._proposals if self._proposals else None
        self._last_params = None
