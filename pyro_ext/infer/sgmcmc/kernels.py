"""Stochastic-gradient MCMC kernels for :class:`pyro.infer.MCMC`."""

import math
import warnings
from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import NamedTuple

import torch
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from pyro.infer.svgd import SteinKernel

from ...ops.validation import check_choice, check_int, check_positive, check_real
from ..errors import SamplerDivergenceError
from ..potential import VECTORIZE, ParticlePotential
from ..potential.arguments import check_per_particle, has_per_particle
from ..tracing import check_jit_compile
from .adaptation import BIAS_BOUNDS, MIXING_RELAXATIONS, StepSizeAdaptation
from .compiled import CompiledStep
from .distributed import SHARD_MODES, resolve_shard
from .escape import Escape, KeptLogDensity, find_escaped
from .mass import rescale_momenta, windowed_mass
from .repulsion import RBFKernel
from .schedules import as_schedule
from .step import step
from .updates import SAMPLERS, lookup, rescale_velocity
from .verification import DeferredVerification


class StepStart(NamedTuple):
    """Where the last eager step started: the particles ``z`` (this rank's), the minibatch
    indices, and the log density and its gradient there (what a compound kernel's check of
    the step reads, e.g. :class:`~pyro_ext.infer.Gibbs`'s energy error)."""

    z: torch.Tensor
    subsamples: dict
    log_density: torch.Tensor
    grad: torch.Tensor


def _check_repulsion(repulsion, num_particles, temperature):
    if repulsion is None:
        return None
    if isinstance(repulsion, str):
        if repulsion != "rbf":
            raise ValueError(f"repulsion must be None, 'rbf' or a SteinKernel, got {repulsion!r}")
        repulsion = RBFKernel()
    elif not isinstance(repulsion, SteinKernel):
        raise TypeError(
            "repulsion must be None, 'rbf' or a pyro.infer.svgd.SteinKernel instance, "
            f"got {type(repulsion).__name__}"
        )
    if num_particles < 2:
        raise ValueError("repulsion acts between particles: it needs num_particles >= 2")
    if temperature != 0 and not isinstance(repulsion, RBFKernel):
        warnings.warn(
            f"repulsion={type(repulsion).__name__}(): the update holds its bandwidth constant "
            "within a step, so a bandwidth computed from the particles (as "
            "pyro.infer.RBFSteinKernel's median heuristic) biases the stationary law. "
            "repulsion='rbf' (pyro_ext.infer.RBFKernel) includes its median bandwidth's "
            "gradient exactly; a kernel of fixed bandwidth needs nothing more.",
            stacklevel=3,
        )
    return repulsion


class _ParticleParams(Mapping):
    """
    Unconstrained site values of the particles, as :meth:`SGMCMCKernel.sample` returns
    them. They are split out of the flat particles only when read: the sampler itself,
    and :class:`pyro_ext.infer.MCMC`, work on the flat tensor.
    """

    def __init__(self, potential, z, squeeze):
        self._potential, self._z, self._squeeze = potential, z, squeeze
        self._values = None

    def _unflattened(self):
        if self._values is None:
            values = self._potential.unflatten(self._z)
            if self._squeeze:
                values = {name: value[0] for name, value in values.items()}
            self._values = values
        return self._values

    def __getitem__(self, name):
        return self._unflattened()[name]

    def __iter__(self):
        return iter(self._potential.layout)

    def __len__(self):
        return len(self._potential.layout)


class ParticleKernel(MCMCKernel):
    """
    A kernel that moves ``L`` particles together, each a chain, as
    :class:`pyro_ext.infer.MCMC` runs it: the SG-MCMC kernels and the compound
    :class:`~pyro_ext.infer.Gibbs`. A draw is a flat tensor ``(L, draw_dim)``
    (:attr:`particles`) that :meth:`constrain_draws` turns into site values.
    """

    num_particles = 1
    #: set by a check that rewound the chain: the step count it went back to
    rewound_to = None
    #: the :class:`SamplerDivergenceError` that stopped the last run, if any
    divergence = None
    #: the :class:`~.distributed.Shard` of a run sharded over torch.distributed (set up by
    #: ``setup``); ``None`` in one process
    shard = None

    @property
    @abstractmethod
    def particles(self) -> torch.Tensor:
        """The current draw of every particle of this process, ``(L, draw_dim)``
        (``(L / R, draw_dim)`` when the particles are sharded over ``R`` ranks)."""

    @property
    def draw_dim(self) -> int:
        """The width of a flat draw."""
        return self.potential.dim

    def constrain_draws(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Site values of flat draws ``(..., draw_dim)``."""
        return self.potential.constrain(flat)

    def site_shapes(self) -> list:
        """``[(site, shape)]`` of what a draw holds, for checkpoint fingerprints."""
        return [(name, list(s.unconstrained_shape)) for name, s in self.potential.layout.items()]

    @property
    @abstractmethod
    def verified_steps(self) -> int:
        """Steps whose results are known to be finite."""

    def verify(self) -> bool:
        """Check the steps not yet checked; ``False`` when the chain was rewound."""
        return True


class SGMCMCKernel(ParticleKernel):
    """
    Base class of the stochastic-gradient kernels: ``L`` particles, optionally repelling
    one another, each a Markov chain on the model's latent sites.

    Particles live in unconstrained space. :meth:`sample` returns a dict of unconstrained
    site values with a leading particle dimension when ``num_particles > 1``;
    :attr:`transforms` maps them back, as for :class:`pyro.infer.HMC`. Use
    :class:`pyro_ext.infer.MCMC` to have particles reported as chains.

    A subclass names its sampler in the registry :data:`~.updates.SAMPLERS` (the pure
    ``(init_state, update)`` pair) and its hyper-parameters; this class wires them to Pyro.
    It keeps the sampler state, draws each step's minibatch and noise, sets the step size,
    and runs the pure :func:`~.step.step` (eagerly, or traced by
    :class:`~.compiled.CompiledStep`); the deferred checks of a compiled step's finiteness
    and the rewinds are :class:`~.verification.DeferredVerification`'s.

    :param callable model: a Pyro model; data may be subsampled with
        ``pyro.plate(..., subsample_size=...)``, in which case a fresh minibatch is drawn
        at every step and the likelihood is scaled by ``N / |batch|``.
    :param step_size: a positive float, a schedule ``t -> float`` (see
        :mod:`pyro_ext.infer.sgmcmc.schedules`), or ``None`` (default): the step size is
        set during warm-up from the posterior's local Gaussian approximation, minibatch
        noise and repulsion included (curvature and gradient noise estimated by power
        iteration at warm-up steps 1, 3, 7, 15, ... then every ``10``, and at the next step
        while the curvature grows, about four gradient evaluations each; see
        :mod:`~pyro_ext.infer.sgmcmc.adaptation`), as ``bias_bound`` says, and frozen when
        warm-up ends. When warm-up changes the step, a momentum sampler's velocity
        ``sqrt(step) m`` follows it, so that the momenta ``m`` keep their law
        (:func:`~pyro_ext.infer.sgmcmc.updates.rescale_velocity`). :meth:`diagnostics` and
        the progress bar show the step.
    :param float bias_tolerance: with ``step_size=None``, the relative error of the
        stationary variance the step may cause (``0.05``: the sampled variance of a
        Gaussian posterior is at most 5 % too large in the directions ``bias_bound``
        names). Smaller is less biased and mixes more slowly, in proportion.
    :param str bias_bound: with ``step_size=None``, where ``bias_tolerance`` holds.
        ``"stiffest"``: in every direction (the largest step whose error in the stiffest
        direction is ``bias_tolerance``). On a well-conditioned posterior that step mixes
        fast; on an ill-conditioned one with minibatch noise (a BNN: a few data-pinned
        weights thousands of times stiffer than a typical one) it is so small that a
        typical direction does not move within the run. ``"typical"``: on average over
        directions, the stiffest kept stable (its variance error is then larger:
        :meth:`diagnostics`' ``"stiffest_variance_error"``). ``"auto"`` (default):
        ``"stiffest"``'s step when a typical direction relaxes 100 times within the kept
        steps (``num_samples x thinning`` under :class:`~pyro_ext.infer.MCMC`,
        ``warmup_steps`` under Pyro's), else the smallest larger step at which it does, up
        to ``"typical"``'s: the least biased step whose kept draws mix. Measured in
        ``benchmarks/default_step_size.py``, ``uci.py`` and ``mnist_fgsm.py``.
    :param int num_particles: the number ``L`` of particles (chains).
    :param repulsion: ``None`` for independent particles, ``"rbf"`` for
        :class:`~pyro_ext.infer.RBFKernel` with the median heuristic (whose dependence on
        the particles enters the update exactly, so the chain keeps its stationary law), or
        any :class:`pyro.infer.svgd.SteinKernel` (its bandwidth is held constant within a
        step: exact for a fixed bandwidth, biased for one computed from the particles, which
        a warning says).
    :param float temperature: scales the injected noise variance; ``0`` turns the sampler
        into its optimiser (SGLD+R into SVGD), ``1`` samples the posterior.
    :param callable init_strategy: a Pyro initialisation strategy, applied to each
        particle independently. By default the model's own start when it declares one
        (``model.default_init_strategy(*args, **kwargs)``, or a site's
        ``infer={"default_init_strategy": factory}``: :class:`~pyro_ext.models.BayesianMLP`
        declares its start both ways, so ``SGLD(lambda x, y: net(x, y, subsample_size=64),
        ...)`` starts as ``SGLD(net, ...)`` does), otherwise a start scaled to the prior:
        each unconstrained coordinate uniformly in its prior median ± 2 prior scales
        (capped at ± 2, Pyro's :func:`~pyro.infer.autoguide.init_to_uniform`; see
        :meth:`~pyro_ext.infer.sgmcmc.ParticlePotential.initial_particles`).
    :param jit_compile: ``False`` (default) runs each step eagerly. ``True`` traces the
        whole step once (gradient of all particles, coupling, preconditioner, noise and
        update; see :mod:`~pyro_ext.infer.sgmcmc.compiled`) and compiles it with
        TorchInductor: the fastest per step, after a one-off compilation of a few seconds
        (about one when inductor's on-disk cache already holds the graph; logged, and shown
        in the progress bar), so worthwhile for runs of more than a few thousand steps. ``"trace"`` runs the traced graph op by op, without
        compiling it: no compiler needed and no wait beyond the trace (under a second for
        small models), about a third faster than eager on a small BNN (the Pyro handlers
        no longer run), far slower than compiled. Both
        give the eager step for the same inputs, up to float32 round-off (over many
        steps repulsion amplifies that round-off, so long repulsive chains part while
        their posteriors agree). Model structure: the compiled step runs the sites and
        shapes seen when it was traced. A model must not branch on latent values (tracing
        stops with a :class:`~pyro_ext.infer.ModelNotTraceableError`
        that says what to change). New data of the same shapes (:meth:`set_data`) reuses
        the compiled step; other shapes (or a new non-tensor argument) trace and compile
        it again, with a warning from the third shape on. A model whose sites change for
        any other reason (Python state) must run eagerly, where a site that was not there
        at setup raises a ValueError naming it.
    :param str compile_mode: the ``mode`` of :func:`torch.compile` (with
        ``jit_compile=True``); by default ``"reduce-overhead"`` on CUDA, which replays the
        whole step as one CUDA graph, and torch's default elsewhere.
    :param str vectorize: how the particles are evaluated together: ``"vmap"``,
        ``"plate"`` or ``"auto"`` (see :class:`~.potential.ParticlePotential`).
    :param int divergence_check_every: with a compiled step, how many steps pass between
        reads of its finiteness flags (each read synchronises with the device). ``None``
        (default): every step on the CPU, where a read is free, and every 32 steps on an
        accelerator. When a read finds a non-finite step, the chain is rewound to the last
        verified state and replayed eagerly from there with the random number generators
        restored, so the replay draws the same minibatches and noise: it either raises
        :class:`~pyro_ext.infer.SamplerDivergenceError` at the step where it happened,
        with the eager diagnosis, or goes on (a repulsive factorisation that needed a
        larger jitter). :class:`pyro_ext.infer.MCMC` keeps only verified draws, so a
        rewind never leaves a non-finite draw behind; a ``hook_fn`` sees the replayed
        steps again.
    :param str shard: how a run in a :mod:`torch.distributed` process group of ``R > 1``
        ranks shares its work (see :mod:`~pyro_ext.infer.sgmcmc.distributed`):
        ``"particles"`` (each rank holds ``L / R`` particles), ``"data"`` (each rank holds
        all particles and a share of the minibatch: the model's subsampled plate gives the
        per-rank minibatch size) or ``None`` (every rank runs the whole chain by itself).
        ``"auto"`` (default) is ``"particles"`` under a process group of more than one rank
        and ``None`` otherwise. Every rank draws the same random numbers, so a sharded run
        is the single-process run with the same seed, up to float32 round-off.
        :attr:`particles`, the ``params`` a ``hook_fn`` sees and :meth:`state_dict` are this
        rank's; :class:`pyro_ext.infer.MCMC` gathers the draws of all particles on every
        rank.
    """

    #: the name of the sampler in :data:`~.updates.SAMPLERS`
    sampler_name = None
    #: discrete latent sites that a compound kernel (:class:`~pyro_ext.infer.Gibbs`)
    #: moves; the potential conditions on their values instead of refusing them
    discrete_sites = ()
    #: the most values an element of such a site may take
    max_support_size = 64

    def __init__(
        self,
        model: Callable,
        step_size: float | Callable[[int], float] | None = None,
        num_particles: int = 1,
        repulsion: str | SteinKernel | None = None,
        temperature: float = 1.0,
        init_strategy: Callable | None = None,
        jit_compile: bool | str = False,
        compile_mode: str | None = None,
        vectorize: str = "auto",
        divergence_check_every: int | None = None,
        shard: str | None = "auto",
        bias_tolerance: float = 0.05,
        bias_bound: str = "auto",
    ):
        if not callable(model):
            raise TypeError("model must be a callable Pyro model")
        self.bias_tolerance = check_real(bias_tolerance, "bias_tolerance", 0, 1, low_open=True)
        self.bias_bound = check_choice(bias_bound, "bias_bound", BIAS_BOUNDS)
        #: the steps the run keeps after warm-up, which ``bias_bound="auto"`` lets mix
        #: (:class:`~pyro_ext.infer.MCMC` sets it; ``None``: as many as warm-up's)
        self.kept_steps = None
        num_particles = check_int(num_particles, "num_particles", low=1)
        temperature = check_real(temperature, "temperature", low=0)
        self.model = model
        self.step_size = None if step_size is None else as_schedule(step_size)
        #: the warm-up rule behind ``step_size=None`` (set up by :meth:`setup`), else ``None``
        self.step_size_adaptation = None
        self.num_particles = num_particles
        self.repulsion = _check_repulsion(repulsion, num_particles, temperature)
        self.temperature = temperature
        self.init_strategy = init_strategy
        check_choice(vectorize, "vectorize", VECTORIZE)
        self.jit_compile = check_jit_compile(jit_compile, compile_mode)
        self.divergence_check_every = check_int(
            divergence_check_every, "divergence_check_every", low=1, allow_none=True
        )
        self.compile_mode = compile_mode
        self.vectorize = vectorize
        self.shard_mode = check_choice(shard, "shard", SHARD_MODES[:-1], allow_none=True)
        self.shard = None
        self.sampler = SAMPLERS[self.sampler_name]
        self.potential = None
        self.transforms = None
        self._compiled = None
        self._initial_params = None
        self._state = None
        self._step = 0
        self._warmup_steps = 0
        self._last_params = None
        self._last_log_density = None
        # The discrete sites' per-particle values of the current step (from sample's
        # ``conditioned``: Gibbs passes them); empty without discrete sites.
        self._conditioned = {}
        #: :class:`StepStart` of the last step when it ran eagerly, else ``None`` (compiled)
        self.step_start = None
        self._current_step_size = None
        # The step the state's velocity is at equilibrium for (see rescale_velocity);
        # None: unknown (before the first step, after a rewind).
        self._velocity_step_size = None
        self._step_size_tensor = None
        self._flags = None
        self._verification = DeferredVerification()
        self._kept_log_density = KeptLogDensity()
        self._check_every = 1
        self.rewound_to = None
        self.divergence = None

    # -- framework wiring ------------------------------------------------------------
    def setup(self, warmup_steps: int, *args, **kwargs) -> None:
        self._warmup_steps = warmup_steps
        self._step = 0
        self.potential = ParticlePotential(
            self.model,
            args,
            kwargs,
            vectorize=self.vectorize,
            discrete_sites=self.discrete_sites,
            max_support_size=self.max_support_size,
        )
        self._check_per_particle(args, kwargs)
        self.transforms = self.potential.transforms
        if self._initial_params is None:
            z = self.potential.initial_particles(self.num_particles, self.init_strategy)
        else:
            z = self.potential.flatten(self._initial_params, self.num_particles)
        # Every rank of a sharded run draws all L particles (and momenta) from the shared
        # random stream, so that its rows are those of the single-process run.
        self.shard = resolve_shard(self.shard_mode, self.num_particles, z.device, self.potential)
        if self.shard is not None and has_per_particle(args, kwargs):
            raise ValueError(
                "PerParticle model arguments do not run sharded: pass shard=None (each rank "
                "would need its own particles' rows)"
            )
        # With step_size=None the first sample() estimates the step, at the discrete sites'
        # values a compound kernel (Gibbs) passes to it.
        self.step_size_adaptation = None if self.step_size is not None else self._adaptation()
        state = self._init_state(z.clone())
        if self.shard is not None:
            if self.discrete_sites:
                raise ValueError(
                    "Gibbs moves on discrete sites do not run sharded yet: pass shard=None to "
                    "the inner kernel (every rank then runs the whole chain)"
                )
            if type(self)._update is not SGMCMCKernel._update:
                raise ValueError(
                    f"{type(self).__name__} overrides the update with Python-level logic, "
                    f"which sees one rank's particles only: run it with shard=None"
                )
            self.shard.check_consistent(
                self.site_shapes(), z, self.potential._shapes(*self._data())
            )
            state = self.shard.local_state(state)
        self._state = state
        self._velocity_step_size = None
        self._last_params = None
        self._conditioned = {}
        self._compiled = None
        self._verification.reset()
        self._kept_log_density.reset()
        self.rewound_to = None
        self.divergence = None
        # Reads of the compiled step's finiteness flags: free on the CPU, a sync elsewhere.
        self._check_every = self.divergence_check_every or (1 if z.device.type == "cpu" else 32)
        if self.jit_compile:
            if type(self)._update is not SGMCMCKernel._update:
                raise ValueError(
                    f"{type(self).__name__} overrides the update with Python-level logic, which "
                    "a compiled step would skip: run it with jit_compile=False"
                )
            self._compiled = CompiledStep(
                self.potential,
                self.sampler,
                self.hyper,
                self.temperature,
                self.repulsion,
                self.jit_compile,
                self.compile_mode,
                shard=self.shard,
            )

    def _data(self):
        return self.potential.model_args, self.potential.model_kwargs

    @property
    def num_local_particles(self) -> int:
        """The particles this process holds: ``L``, or ``L / R`` when sharded over ``R`` ranks."""
        return self.num_particles if self.shard is None else self.shard.num_local_particles

    def set_data(self, *args, **kwargs) -> None:
        """
        Run the next steps on new model arguments (e.g. the next minibatch, or new data),
        without touching the particles or the sampler state. Call after :meth:`setup`.
        """
        if self.potential is None:
            raise RuntimeError("set_data() needs a set-up kernel: call setup() (or MCMC.run) first")
        self._check_per_particle(args, kwargs)
        if self.shard is not None and has_per_particle(args, kwargs):
            raise ValueError("PerParticle model arguments do not run sharded: pass shard=None")
        self.potential.set_data(*args, **kwargs)

    def _check_per_particle(self, args, kwargs):
        # A wrong leading size is named here, before the first step evaluates it.
        check_per_particle(args, kwargs, self.num_particles)

    def cleanup(self):
        self._last_log_density = None

    @property
    def hyper(self):
        """The sampler's hyper-parameters, as its registry entry takes them."""
        return {}

    @property
    def state(self):
        """The sampler state of this process's particles (a named tuple of the sampler's
        :data:`~.updates.SAMPLERS` entry, ``z`` first; read-only: :meth:`load_state_dict`
        sets it)."""
        return self._state

    @property
    def compiled_step(self) -> CompiledStep | None:
        """The traced (and compiled) step with ``jit_compile``, else ``None``."""
        return self._compiled

    @property
    def compile_seconds(self) -> float:
        """Seconds spent tracing and compiling the step so far (0 when eager)."""
        if self._compiled is None:
            return 0.0
        return self._compiled.trace_seconds + self._compiled.compile_seconds

    @property
    def initial_params(self):
        if self._state is not None:
            return self._to_params(self._state.z)
        return self._initial_params

    @initial_params.setter
    def initial_params(self, params):
        self._initial_params = params

    @property
    def num_steps(self) -> int:
        """Steps taken since :meth:`setup` (warm-up included)."""
        return self._step

    def relaxation_steps(self) -> float | None:
        """
        With the default step size (``step_size=None``), about how many steps a typical
        direction of the posterior's local Gaussian approximation takes to relax at the
        current step (a lower bound: :meth:`~.adaptation.StepSizeAdaptation.relaxation_steps`);
        ``None`` with a given step size. :class:`~pyro_ext.infer.MCMC` reads it when warm-up
        ends and warns (:class:`~pyro_ext.infer.SlowMixingWarning`) when the run keeps
        fewer than :data:`~.adaptation.MIXING_RELAXATIONS` (100) times as many steps.
        """
        if self.step_size_adaptation is None:
            return None
        return self.step_size_adaptation.relaxation_steps()

    def mixing_advice(self, kept_steps: int) -> str | None:
        """What to change when ``kept_steps`` are fewer than 100 relaxation times at the
        default step (``None`` when they are enough, or with a given step size)."""
        adaptation = self.step_size_adaptation
        relaxation = self.relaxation_steps()
        if relaxation is None or not math.isfinite(relaxation):
            return None
        needed = MIXING_RELAXATIONS * relaxation
        if kept_steps >= needed:
            return None
        # What a larger tolerance buys: the relaxation time scales as 1 / step. Where the
        # stiffest direction's stability already caps the step, it buys nothing.
        looser = max(1.0, self.bias_tolerance)
        looser_relaxation = relaxation * adaptation.step_size / adaptation.bounded_step_size(looser)
        remedies = [f"keep at least {needed:.0f} steps (num_samples x thinning)"]
        if looser_relaxation < relaxation / 1.5:
            remedies.append(
                f"pass bias_tolerance={looser:g} (a larger variance error; a typical direction "
                f"then relaxes in about {looser_relaxation:.0f} steps)"
            )
        if self.bias_bound == "stiffest":
            remedies.append(
                'pass bias_bound="auto" (a larger step where the stiffest direction alone '
                "holds it back)"
            )
        remedies.append("precondition (AdamSGLD) or enlarge the minibatch")
        advice = ", or ".join(remedies)
        return (
            f"the step size set during warm-up ({adaptation.step_size:.3g} with "
            f"bias_bound={self.bias_bound!r}: a stationary variance error of "
            f"{adaptation.stiffest_error():.3g} in the stiffest direction) relaxes a typical "
            f"direction of the posterior in at least {relaxation:.0f} steps, and the run keeps "
            f"{kept_steps} (num_samples x thinning): its draws will not have mixed (check "
            f"mcmc.summary()'s r_hat across particles). {advice[0].upper()}{advice[1:]}."
        )

    def escaped_particles(self) -> Escape:
        """
        The particles that escaped: finite, but whose mean log density over the kept steps
        (those after warm-up), and over their final quarter too, is far below the
        ensemble's median (the criterion and the evidence behind it:
        :mod:`pyro_ext.infer.sgmcmc.escape`). Their draws lie where the posterior has no
        mass and distort every average over the draws. Particles far below on average but
        not at the end are listed apart (:attr:`~.escape.Escape.rejoined`): late, not lost.
        :class:`~pyro_ext.infer.MCMC` calls this when a run ends and warns
        (:class:`~pyro_ext.infer.EscapedParticleWarning`, and
        :class:`~pyro_ext.infer.SlowMixingWarning` for the late ones); sharded, every rank
        must call it (it gathers the ranks' means) and all get the same answer.
        """
        kept = self._kept_log_density
        means, final, num_steps = kept.means(), kept.final_means(), kept.count
        if self.shard is not None:
            local = None if means is None else (means.tolist(), final.tolist())
            everyone = self.shard.gather_object((list(self.shard.particle_indices), local))
            if any(values is None for _, values in everyone):
                means = None
            else:
                means = torch.empty(self.num_particles, dtype=torch.float64)
                final = torch.empty(self.num_particles, dtype=torch.float64)
                for indices, (mean_values, final_values) in everyone:
                    means[indices] = torch.tensor(mean_values, dtype=torch.float64)
                    final[indices] = torch.tensor(final_values, dtype=torch.float64)
        if means is None:
            return Escape([], [], math.inf, num_steps)
        dim = self._state.z.shape[-1]
        return find_escaped(means, dim, self.temperature, num_steps, final)

    @property
    def last_params(self):
        """What the last :meth:`sample` returned (``None`` before the first step): a caller
        that passes it back continues the chain; other values replace the particles."""
        return self._last_params

    @property
    def particles(self) -> torch.Tensor:
        """This process's current flat unconstrained particles, ``(L, D)`` (``(L / R, D)``
        when sharded over ``R`` ranks)."""
        return self._state.z

    def _to_params(self, z):
        self._last_params = _ParticleParams(self.potential, z, squeeze=self.num_particles == 1)
        return self._last_params

    def _init_state(self, z):
        adaptation = self.step_size_adaptation
        if adaptation is not None and adaptation.step_size is None:
            # No step size yet: momenta start at rest (warm-up forgets the start anyway).
            return self.sampler.init_state(z, 0.0, self.temperature, at_rest=True, **self.hyper)
        return self.sampler.init_state(z, self._step_size_at(0), self.temperature, **self.hyper)

    # -- the default step size -------------------------------------------------------
    def _step_size_at(self, step: int) -> float:
        adaptation = self.step_size_adaptation
        if adaptation is None:
            return float(self.step_size(step))
        if step < self._warmup_steps // 2:
            return adaptation.early_step_size
        return adaptation.step_size

    #: how often the velocity passes through the repulsion's ``K / L`` (see
    #: :class:`~.adaptation.StepSizeAdaptation`)
    coupling_power = 1

    @property
    def adaptation_friction(self) -> float:
        """The friction of the sampler's linear recursion (1: SGLD, no momentum)."""
        return 1.0

    def adaptation_mass(self, state, z):
        """The diagonal mass whose coordinates the step is set in (``None``: identity)."""
        return None

    def _adaptation(self):
        return StepSizeAdaptation(
            self.bias_tolerance,
            self.adaptation_friction,
            self.coupling_power,
            bound=self.bias_bound,
            kept_steps=max(1, self.kept_steps or self._warmup_steps),
        )

    def _adapt_step_size(self):
        adaptation = self.step_size_adaptation
        if adaptation is None:
            return
        z = self._state.z
        if adaptation.step_size is None:
            mass = self.adaptation_mass(self._state, z)
            adaptation.start(self.potential, z, mass, self.repulsion, self.shard, self._conditioned)
            adaptation.next_estimate = self._step + adaptation.interval
        elif 0 < self._step < self._warmup_steps and adaptation.due(self._step):
            if self._step >= self._warmup_steps // 2 and not adaptation.settling:
                # The step that is kept rests on every estimate of warm-up's second half.
                adaptation.settle()
            mass = self.adaptation_mass(self._state, z)
            adaptation.observe(
                self.potential, z, mass, self.repulsion, self.shard, self._conditioned
            )
            adaptation.next_estimate = self._step + adaptation.interval

    def _update(self, state, grad, step_size, noise, coupling, adapt):
        """
        One eager transition. Subclasses that change it (with Python-level logic that a
        traced step cannot follow) run eagerly only.
        """
        return self.sampler.update(
            state, grad, step_size, noise, coupling, self.temperature, adapt, **self.hyper
        )

    def _adapting(self):
        """Whether a preconditioner adapts at this step (AdamSGLD; ignored by the others)."""
        return False

    def _after_step(self):
        """Between two steps, outside the (possibly compiled) step: a kernel whose state
        is set from the chain's history (:class:`PreconditionedSGHMC`'s mass) does it here."""

    def _discard_from(self, step):
        """Forget what the steps from ``step`` on recorded: the chain was rewound to it."""
        self._kept_log_density.discard_from(step)

    @property
    def verified_steps(self) -> int:
        """Steps whose results are known to be finite (all of them but unread compiled ones)."""
        return self._step - self._verification.unverified

    @property
    def _deferred_checks(self) -> bool:
        # A compiled step's finiteness flags are read every _check_every steps.
        return self._compiled is not None and self._check_every > 1

    def verify(self) -> bool:
        """
        Read the finiteness flags of the compiled steps not yet checked (one device
        synchronisation). Returns ``True`` when they were all finite. Otherwise the chain
        is rewound to the last verified state (see ``divergence_check_every``),
        :attr:`rewound_to` is set to its step count, and ``False`` is returned.
        """
        rewind = self._verification.check()
        if rewind is not None:
            self._discard_from(rewind.step)
            self._step, self._state = rewind.step, rewind.state
            self._velocity_step_size = None  # the snapshot's is not recorded: no rescale
            self._last_params = None
            self.rewound_to = rewind.step
            return False
        self._kept_log_density.commit(self._step)
        if self._deferred_checks:
            self._verification.take_snapshot(self._step, self._state)
        return True

    def _tensor_inputs(self, step_size, adapt, like):
        # Cached on the particles' device: a constant step size costs no transfer per step.
        if self._step_size_tensor is None or self._step_size_tensor[0] != step_size:
            self._step_size_tensor = (
                step_size,
                torch.tensor(step_size, dtype=like.dtype, device=like.device),
            )
        if self._flags is None or self._flags[0].device != like.device:
            self._flags = (
                torch.tensor(False, device=like.device),
                torch.tensor(True, device=like.device),
            )
        return self._step_size_tensor[1], self._flags[int(adapt)]

    def _draw(self, z):
        # The eager and the compiled step draw the same randomness in the same order; every
        # rank of a sharded run draws the noise of all L particles.
        shard = self.shard
        if shard is None:
            return self.potential.draw_subsamples(z.device), torch.randn_like(z)
        subsamples = shard.subsamples(self.potential, z.device)
        noise = torch.randn(self.num_particles, z.shape[-1], dtype=z.dtype, device=z.device)
        return subsamples, noise

    def _gradient(self, z, subsamples):
        """The eager step's gradient: the potential's, kept as :attr:`step_start`."""
        try:
            log_density, grad = self.potential.log_density_and_grad(
                z, subsamples, self._conditioned
            )
        except torch.linalg.LinAlgError as error:
            # A factorisation inside the model failed at the particles' values (a
            # covariance that lost positive definiteness as a scale ran to 0).
            self.divergence = SamplerDivergenceError.from_model_error(
                self._step, self.num_particles, error
            )
            raise self.divergence from error
        self.step_start = StepStart(z, subsamples, log_density, grad)
        return log_density, grad

    def _run_compiled(self, subsamples, noise, step_size, adapt):
        """The compiled step's output, or ``None`` when a factorisation in the model failed."""
        step_size_t, adapt_t = self._tensor_inputs(step_size, adapt, self._state.z)
        try:
            return self._compiled(
                self._state,
                noise,
                step_size_t,
                adapt_t,
                subsamples,
                self._conditioned,
                self.potential.model_args,
                self.potential.model_kwargs,
            )
        except torch.linalg.LinAlgError:
            # A factorisation inside the model failed at these particles: the eager step,
            # from the same inputs, reports it as a divergence at this step.
            return None

    def _run_eager(self, subsamples, noise, step_size, adapt):
        state, info = step(
            self._state,
            subsamples,
            noise,
            step_size,
            gradient=self._gradient,
            update=lambda s, g, e, n, c: self._update(s, g, e, n, c, adapt),
            repulsion=self.repulsion,
            shard=self.shard,
            bandwidth_gradient=self.temperature != 0,
        )
        self._check_finite(info.ok, info.log_density, info.grad, state.z, subsamples)
        return state, info.log_density

    def sample(self, params, conditioned=None):
        """
        One step from ``params`` (the last step's output, or values a caller put in their
        place). ``conditioned``: per-particle values ``{site: (L, ...)}`` of the model's
        discrete sites, which this step holds fixed (:class:`~pyro_ext.infer.Gibbs` passes
        its current ones); needed when the kernel was given ``discrete_sites``.
        """
        self._conditioned = self.potential.conditioning(conditioned)
        deferred_checks = self._deferred_checks
        verification = self._verification
        if params is not self._last_params:
            # A caller (e.g. a hook) replaced the particles: continue from its values, once
            # the steps before are verified (a rewind discards the replacement).
            if deferred_checks and not self.verify():
                return self._to_params(self._state.z)
            self._state = self._state._replace(
                z=self.potential.flatten(params, self.num_local_particles)
            )
            if deferred_checks:
                verification.take_snapshot(self._step, self._state)
        if deferred_checks and verification.snapshot is None:
            verification.take_snapshot(self._step, self._state)  # before this step's draws
        self._adapt_step_size()
        step_size = self._step_size_at(self._step)
        if not (math.isfinite(step_size) and step_size > 0):
            raise ValueError(
                f"step size schedule gave {step_size} at step {self._step}; expected > 0"
            )
        if self.step_size_adaptation is not None:
            # Warm-up changed the step: the momenta keep their law (the velocity follows).
            if self._velocity_step_size is not None:
                self._state = rescale_velocity(self._state, self._velocity_step_size, step_size)
            self._velocity_step_size = step_size
        subsamples, noise = self._draw(self._state.z)
        adapt = self._adapting()
        self.step_start = None
        output = None
        if self._compiled is not None and self._step >= verification.eager_until:
            output = self._run_compiled(subsamples, noise, step_size, adapt)
        deferred = output is not None and deferred_checks
        if deferred:
            verification.record(output.ok)
            state, log_density = output.state, output.log_density
        elif output is not None and bool(output.ok):
            state, log_density = output.state, output.log_density
        else:
            # Eager, or a compiled step that was not finite: the eager step from the same
            # inputs retries the repulsive factorisation or diagnoses the divergence.
            state, log_density = self._run_eager(subsamples, noise, step_size, adapt)
        self._state = state
        self._last_log_density = log_density
        self._current_step_size = step_size
        if self._step >= self._warmup_steps:
            self._kept_log_density.add(self._step, log_density)
            if not deferred:
                self._kept_log_density.commit(self._step + 1)
        self._step += 1
        self._after_step()
        if deferred_checks and (not deferred or verification.unverified >= self._check_every):
            self.verify()
        return self._to_params(self._state.z)

    def _check_finite(self, ok, log_density, grad, new_z, subsamples):
        # ``ok`` is the step's finiteness on every rank (see transition): one device sync
        # for a healthy step, and sharded ranks agree on it, so all of them stop at the
        # same step. A sum that overflows although every term is finite is ruled out by
        # the diagnosis below.
        if bool(ok):
            return
        finite_columns = torch.isfinite(grad) & torch.isfinite(new_z)
        finite = torch.isfinite(log_density) & finite_columns.all(-1)
        particles = (~finite).nonzero().flatten().tolist()
        sites = set()
        if particles:
            columns = (~finite_columns).any(0).nonzero().flatten().tolist()
            sites = {self.potential.site_of(c) for c in columns}
            sites.update(
                self.potential.nonfinite_sites(
                    self._state.z[particles[0]],
                    subsamples,
                    {name: value[particles[0]] for name, value in self._conditioned.items()},
                    particle=particles[0],
                )
            )
        if self.shard is not None:
            indices = self.shard.particle_indices
            verdicts = self.shard.gather_object(([indices[i] for i in particles], sorted(sites)))
            particles = sorted({i for ranked, _ in verdicts for i in ranked})
            sites = {site for _, ranked in verdicts for site in ranked}
        if not particles:
            return
        self.divergence = SamplerDivergenceError(self._step, sorted(sites), particles)
        raise self.divergence

    def logging(self):
        if self._last_log_density is None:
            return {}
        info = {
            "step size": f"{self._current_step_size:.2e}",
            "log density": f"{self._last_log_density.mean().item():.3g}",
        }
        if self._compiled is not None:
            info["compile"] = f"{self.compile_seconds:.1f}s"
        return info

    def diagnostics(self):
        # A non-finite state raises SamplerDivergenceError (kept in self.divergence), so a
        # finished chain has no divergent transitions; pyro_ext.infer.MCMC marks those of a
        # diverged run. The key keeps Pyro's and ArviZ's summaries working.
        diagnostics = {"divergences": []}
        if self._current_step_size is not None:
            diagnostics["step_size"] = self._current_step_size
        adaptation = self.step_size_adaptation
        if adaptation is not None and adaptation.step_size is not None:
            # What the default step costs where it is largest (bias_bound="auto" may raise
            # the step above the stiffest direction's bound for the draws to mix).
            diagnostics["stiffest_variance_error"] = adaptation.stiffest_error()
        return diagnostics

    # -- checkpointing ---------------------------------------------------------------
    def state_dict(self):
        """The sampler's full state, for checkpointing long runs (call :meth:`verify` first)."""
        if self._verification.unverified:
            raise RuntimeError("state_dict() of unverified steps: call verify() first")
        state = {"step": self._step, "state": self._state._asdict()}
        if self.step_size_adaptation is not None:
            state["step_size_adaptation"] = self.step_size_adaptation.state_dict()
            state["velocity_step_size"] = self._velocity_step_size
        # A resumed run's escape check covers the kept steps before the checkpoint too.
        state["kept_log_density"] = self._kept_log_density.state_dict(self._state.z)
        return state

    def load_state_dict(self, state_dict):
        """Restore a state saved by :meth:`state_dict`; call after :meth:`setup`."""
        self._step = state_dict["step"]
        if self.step_size_adaptation is not None and "step_size_adaptation" in state_dict:
            self.step_size_adaptation.load_state_dict(state_dict["step_size_adaptation"])
        state = dict(state_dict["state"])
        if "count" in state and not isinstance(state["count"], torch.Tensor):
            # Checkpoints written before the count became a tensor.
            state["count"] = self._state.z.new_tensor(state["count"], dtype=torch.long)
        self._state = type(self._state)(**state)
        self._velocity_step_size = state_dict.get("velocity_step_size")
        self._last_params = None
        self._verification.reset()
        self._kept_log_density.load_state_dict(state_dict.get("kept_log_density"))
        self.rewound_to = None


class SGLD(SGMCMCKernel):
    r"""
    Stochastic gradient Langevin dynamics (thesis eq. 2.1; Welling & Teh, 2011) and, with
    ``repulsion``, SGLD+R (Algorithm 2.1, eq. 2.7-2.8)::

        z_i <- z_i + eps/L sum_j [k(z_j, z_i) grad log p(z_j) + grad_{z_j} k(z_j, z_i)] + eta_i
        eta ~ N(0, 2 eps T K (x) I / L)

    With repulsion the drift averages over the particles (the factor ``K / L``), so each
    moves with an effective step of about ``step_size / L`` (measured with the median
    bandwidth for L = 10 to 200, ``benchmarks/results/calibration.md``); the default step
    size divides by the mean eigenvalue of ``K / L`` (``1 / L``), so each particle moves
    as a plain SGLD chain at its default step does, within the ensemble's mean mode's
    stability; a given one should be scaled up with ``L``. The median bandwidth's dependence on the particles enters the update exactly
    (:class:`~pyro_ext.infer.RBFKernel`), so the chain keeps its stationary law.

    Example (the same code runs on CUDA tensors)::

        kernel = SGLD(model, num_particles=20)  # the step size is set during warm-up
        mcmc = pyro_ext.infer.MCMC(kernel, num_samples=4000, warmup_steps=1000)
        mcmc.run(x, y)
        mcmc.get_samples()["w"].shape      # (4000 * 20, D)

    See :class:`SGMCMCKernel` for the parameters.
    """

    sampler_name = "sgld"


class SGHMC(SGMCMCKernel):
    r"""
    Stochastic gradient Hamiltonian Monte Carlo (Chen et al., 2014) in SGD-with-momentum
    form, the thesis' SGDm; with ``repulsion``, SGDm+R (Algorithm 2.2, made a valid sampler
    by friction and matching noise). See :func:`~pyro_ext.infer.sgmcmc.updates.sghmc_update`.

    With repulsion the velocity is built from the particle-averaged drift (``K / L``) and
    moves the particles through ``K / L`` again, so when the particles are far apart
    relative to the kernel bandwidth the effective per-particle step is about
    ``step_size / L^2``: the default step size accounts for it (it divides by the mean of
    the squared eigenvalues of ``K / L``), a given one should be scaled up with ``L^2``
    (``benchmarks/uci.py`` validates both on the UCI regressions).

    :param float friction: ``1 - momentum``, in ``(0, 1]``; ``1`` recovers SGLD with step
        size ``step_size``.

    Other parameters as in :class:`SGMCMCKernel`.
    """

    sampler_name = "sghmc"

    def __init__(
        self,
        model: Callable,
        step_size: float | Callable[[int], float] | None = None,
        friction: float = 0.1,
        **kwargs,
    ):
        self.friction = check_real(friction, "friction", 0, 1, low_open=True)
        super().__init__(model, step_size, **kwargs)

    coupling_power = 2

    @property
    def hyper(self):
        return {"friction": self.friction}

    @property
    def adaptation_friction(self) -> float:
        return self.friction


class AdamSGLD(SGMCMCKernel):
    r"""
    Adam-preconditioned Langevin dynamics, the thesis' Adam+N; with ``repulsion``, Adam+NR
    (section 2.3.2). See :func:`~pyro_ext.infer.sgmcmc.updates.adam_sgld_update`.

    As for :class:`SGHMC`, repulsion shrinks the effective per-particle step to about
    ``step_size / L^2``. The default step size is set in the coordinates of the mass
    matrix that warm-up adapts (the preconditioned curvature and gradient noise).

    :param tuple betas: Adam's ``(beta1, beta2)``; ``1 - beta1`` is the friction.
    :param float eps: added to ``sqrt(v)`` in the mass matrix.
    :param bool adapt_after_warmup: keep adapting the mass matrix after warmup (Adam
        behaviour, a small bias). By default it is frozen at the end of warmup, which
        makes the post-warmup chain a valid sampler.

    Other parameters as in :class:`SGMCMCKernel`.
    """

    sampler_name = "adam"

    def __init__(
        self,
        model: Callable,
        step_size: float | Callable[[int], float] | None = None,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        adapt_after_warmup: bool = False,
        **kwargs,
    ):
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise TypeError(f"betas must be a pair of numbers (beta1, beta2), got {betas!r}")
        self.betas = tuple(
            check_real(b, f"betas[{i}]", 0, 1, high_open=True) for i, b in enumerate(betas)
        )
        self.eps = check_positive(eps, "eps")
        self.adapt_after_warmup = adapt_after_warmup
        super().__init__(model, step_size, **kwargs)

    coupling_power = 2

    @property
    def hyper(self):
        return {"betas": self.betas, "eps": self.eps}

    @property
    def adaptation_friction(self) -> float:
        return 1.0 - self.betas[0]

    def adaptation_mass(self, state, z):
        # The mass M = sqrt(v) + eps of adam_sgld_update; before the first update, the one
        # the first gradient will set (v = grad^2 after bias correction).
        if int(state.count) == 0:
            shard = self.shard
            if shard is None:
                grad = self.potential.log_density_and_grad(z, None, self._conditioned)[1]
            else:
                subsamples = shard.subsamples(self.potential, z.device)
                grad = self.potential.log_density_and_grad(z, subsamples, self._conditioned)[1]
                if shard.mode == "data":
                    grad = shard.mean(grad)
            return grad.abs() + self.eps
        correction = 1.0 - self.betas[1] ** state.count
        return (state.second_moment / correction).sqrt() + self.eps

    def _adapting(self):
        # The mass adapts during warmup (and at least once, so that it is defined).
        return self.adapt_after_warmup or self._step < max(self._warmup_steps, 1)


class PreconditionedSGHMC(SGMCMCKernel):
    r"""
    SGHMC with a constant diagonal mass ``M = 1 / Var(z)``, the inverse posterior variance
    of each unconstrained coordinate, set once from a window of warm-up draws: the
    constant diagonal metric NUTS adapts, for a sampler without accept/reject. See
    :func:`~pyro_ext.infer.sgmcmc.updates.preconditioned_sghmc_update` for the update and
    :mod:`pyro_ext.infer.sgmcmc.mass` for the estimate and why it beats Adam's mass on
    weakly identified coordinates.

    ``M`` starts from ``init_scale`` (e.g. an :class:`~pyro.infer.autoguide.AutoNormal`
    fit's scales; unit otherwise) and is re-estimated once, at the end of the window
    ``adapt_window`` (fractions of the warm-up), from the draws pooled over particles and
    steps (:func:`~pyro_ext.infer.sgmcmc.mass.windowed_mass`); the momenta are rescaled to
    their stationary law for the new mass. Fixed afterwards, so the chain that is kept is
    a valid sampler as ``step_size -> 0``. The window's draws are collected between steps,
    so the step itself is the registered pure update: it compiles (``jit_compile``) and
    shards (the window's draws are gathered over the ranks) like the other kernels.
    Momenta start at rest.

    The default window ends at mid-warm-up, so that with the default step size
    (``step_size=None``) the second half of warm-up sets the step in the final mass's
    coordinates; :class:`~pyro_ext.models.RetailBSTS` passes its own step and the window
    ``(0.3, 1.0)``.

    :param float friction: ``1 - momentum``, in ``(0, 1]``.
    :param dict init_scale: per-site scales ``{site: tensor}`` in unconstrained space (the
        site's shape, or with a leading particle dimension); the initial mass is
        ``1 / scale^2``, averaged over particles.
    :param tuple adapt_window: ``(start, end)``, fractions of the warm-up, ``0 <= start <
        end <= 1``.
    :param float adam_floor: the mass is never below this times Adam's mass
        ``sqrt(E[grad^2])`` over the window (default 0: no floor). ``1 / Var`` and Adam's
        ``1 / sd`` agree only at unit scale, so the floor is a heuristic for coordinates of
        about unit scale: :class:`~pyro_ext.models.RetailBSTS` uses 0.6, where its skewed
        noise scales' stiff flank made an unfloored step unstable; on wider coordinates it
        takes over from ``1 / Var`` and the dynamics lose their scale invariance.

    Other parameters as in :class:`SGMCMCKernel`.
    """

    sampler_name = "preconditioned_sghmc"
    coupling_power = 2
    #: the fewest window draws per particle that re-estimate the mass
    MIN_WINDOW = 10

    def __init__(
        self,
        model: Callable,
        step_size: float | Callable[[int], float] | None = None,
        friction: float = 0.1,
        init_scale: Mapping | None = None,
        adapt_window: tuple[float, float] = (0.25, 0.5),
        adam_floor: float = 0.0,
        **kwargs,
    ):
        self.friction = check_real(friction, "friction", 0, 1, low_open=True)
        if init_scale is not None and not isinstance(init_scale, Mapping):
            raise TypeError(
                "init_scale must be a dict {site: scale tensor} or None, got "
                f"{type(init_scale).__name__}"
            )
        self.init_scale = init_scale
        if not (isinstance(adapt_window, (tuple, list)) and len(adapt_window) == 2):
            raise TypeError(
                f"adapt_window must be a pair (start, end) of warm-up fractions, got {adapt_window!r}"
            )
        start = check_real(adapt_window[0], "adapt_window[0]", 0, 1)
        end = check_real(adapt_window[1], "adapt_window[1]", 0, 1)
        if not start < end:
            raise ValueError(f"adapt_window must have start < end, got {adapt_window!r}")
        self.adapt_window = (start, end)
        self.adam_floor = check_real(adam_floor, "adam_floor", low=0)
        super().__init__(model, step_size, **kwargs)
        self._window_draws = []

    @property
    def hyper(self):
        return {"friction": self.friction}

    @property
    def adaptation_friction(self) -> float:
        return self.friction

    def adaptation_mass(self, state, z):
        return state.mass

    def _init_state(self, z):
        state = self.sampler.init_state(z, 0.0, self.temperature, at_rest=True, **self.hyper)
        if self.init_scale is None:
            variance = torch.ones_like(z)
        else:
            variance = self.potential.flatten(self.init_scale, z.shape[0]).to(z).pow(2)
        # Every particle (and, sharded, every rank) starts from the same mass.
        self._initial_variance = variance.mean(0)
        self._window_draws = []
        return state._replace(mass=(1.0 / self._initial_variance).expand_as(z).clone())

    def window(self) -> tuple[int, int]:
        """The warm-up steps ``[start, end)`` whose draws set the mass."""
        start, end = self.adapt_window
        return int(round(start * self._warmup_steps)), int(round(end * self._warmup_steps))

    def _adapting(self):
        # The update sums grad^2 over the window (the floor of the mass).
        start, end = self.window()
        return start <= self._step < end

    def _after_step(self):
        taken = self._step - 1
        start, end = self.window()
        if not start <= taken < end:
            return
        self._window_draws.append((taken, self._state.z.detach().clone()))
        if taken == end - 1 and len(self._window_draws) >= self.MIN_WINDOW:
            self._set_mass()

    def _discard_from(self, step):
        super()._discard_from(step)
        self._window_draws = [(s, z) for s, z in self._window_draws if s < step]

    def _set_mass(self):
        state = self._state
        draws = torch.stack([z for _, z in self._window_draws], 1)  # (L, S, D)
        grad_sq = state.grad_sq
        shard = self.shard
        if shard is not None and shard.num_local_particles < shard.num_particles:
            draws, grad_sq = shard.gather(draws), shard.gather(grad_sq)
        count = state.count.clamp(min=1)
        grad_sq_mean = grad_sq.mean(0) / count
        mass = windowed_mass(draws, grad_sq_mean, self._initial_variance, self.adam_floor)
        self._state = rescale_momenta(state, mass)
        self._window_draws = []

    def state_dict(self):
        state = super().state_dict()
        # A checkpoint inside the window resumes with the window's draws so far.
        state["mass_window"] = [[step, z] for step, z in self._window_draws]
        state["initial_variance"] = self._initial_variance
        return state

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self._window_draws = [(int(s), z) for s, z in state_dict.get("mass_window", [])]
        if "initial_variance" in state_dict:
            self._initial_variance = state_dict["initial_variance"]


#: sampler name -> kernel class, keyed like :data:`~.updates.SAMPLERS`: the one registry of
#: kernels that callers choosing a sampler by name (ARA training, BSTS) look up.
KERNELS = {kernel.sampler_name: kernel for kernel in (SGLD, SGHMC, AdamSGLD, PreconditionedSGHMC)}


def get_kernel(name: str) -> type[SGMCMCKernel]:
    """The kernel class registered as ``name`` (``"sgld"``, ``"sghmc"``, ``"adam"`` or
    ``"preconditioned_sghmc"``)."""
    return lookup(KERNELS, name, "kernel")
