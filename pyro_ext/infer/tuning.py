r"""
Step-size selection for the stochastic-gradient samplers by kernel Stein discrepancy.

The step size is the one knob every SG-MCMC user has to set, and neither the acceptance
rate nor the effective sample size can set it: there is no accept/reject step, and a
larger step always mixes faster while its bias grows. Coullon, South & Nemeth (2023,
"Efficient and generalizable tuning strategies for stochastic gradient MCMC", Statistics
and Computing; arXiv 2105.13059) pick it by the kernel Stein discrepancy (KSD) of short
pilot runs: the KSD of draws to the posterior needs only the score
:math:`\nabla\log p`, penalises both a chain that has not moved (too small a step) and
one that is biased or unstable (too large a step), and ranks step sizes much as long runs
do. :func:`tune_step_size` runs one pilot chain per candidate (all its particles in one
vectorised run) and returns the step size of the smallest KSD
(:func:`~pyro_ext.ops.kernel_stein_discrepancy`, the IMQ kernel of Gorham & Mackey 2017),
with the table of every candidate.

Short pilots favour steps that move fast over steps that are unbiased: on the calibration's
normal means (``pyro_ext.infer.calibration``), the pick of 300-step pilots sampled with
E[z^2] = 1.30 where 1 is exact. The kernels' default (``step_size=None``,
:mod:`~pyro_ext.infer.sgmcmc.adaptation`) bounds the bias instead; use this tuner to explore
step sizes, and check what it picks.
"""

import math
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import pyro
import torch
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel

from ..ops.stats import kernel_stein_discrepancy
from ..ops.validation import check_int, check_positive
from .errors import SamplerDivergenceError
from .mcmc import MCMC
from .sgmcmc import SGMCMCKernel
from .sgmcmc.schedules import ConstantStepSize

__all__ = ["StepSizeTrial", "StepSizeTuning", "tune_step_size"]

#: Candidates when none are given: half-decades from 1e-6 to 1e-1.
DEFAULT_CANDIDATES = tuple(10.0 ** (e / 2) for e in range(-12, -1))


class StepSizeTrial(NamedTuple):
    """One pilot run of :func:`tune_step_size`."""

    #: the candidate step size
    step_size: float
    #: the KSD of the pilot's draws after burn-in (``inf`` when it diverged)
    ksd: float
    #: the step at which it diverged, else ``None``
    diverged_at: int | None
    #: wall time of the pilot run and its KSD, seconds
    seconds: float


class StepSizeTuning(NamedTuple):
    """What :func:`tune_step_size` returns: the chosen step size and every trial."""

    #: the candidate of the smallest KSD
    step_size: float
    #: one :class:`StepSizeTrial` per candidate, in the order given
    trials: list

    def __str__(self):
        lines = ["step size    KSD         diverged at   seconds"]
        for t in self.trials:
            mark = "  <- chosen" if t.step_size == self.step_size else ""
            diverged = "-" if t.diverged_at is None else str(t.diverged_at)
            lines.append(
                f"{t.step_size:<12.3g} {t.ksd:<11.4g} {diverged:<13} {t.seconds:<7.2f}{mark}"
            )
        return "\n".join(lines)


def _full_data_score(potential, z, chunk_size=256):
    """
    The score of the whole-data posterior in unconstrained space at draws ``z`` ``(n, D)``.
    A model that subsamples a plate of ``N`` rows in minibatches of ``b`` is evaluated in
    ``ceil(N / b)`` passes over rows ``[k b, (k + 1) b)`` (mod ``N``) and the passes'
    gradients are averaged: exactly the whole-data score when ``b`` divides ``N``, and
    otherwise one that counts the rows of the last, wrapped-around pass twice.
    """
    plates = potential.subsample_sizes
    passes = max((-(-size // batch) for size, batch in plates.values()), default=1)
    scores = []
    for rows in z.split(chunk_size):
        total = torch.zeros_like(rows)
        for k in range(passes):
            subsamples = {
                name: torch.arange(k * batch, (k + 1) * batch, device=z.device) % size
                for name, (size, batch) in plates.items()
            }
            total += potential.log_density_and_grad(rows, subsamples)[1]
        scores.append(total / passes)
    return torch.cat(scores)


def _initial_step_size(kernel):
    """The step size a kernel takes at its first step, ``None`` where it adapts its own
    (``step_size=None``) or the schedule cannot be read."""
    schedule = kernel.step_size
    if schedule is None:
        return None
    try:
        return float(schedule(0))
    except (TypeError, ValueError, RuntimeError):  # a user's schedule that needs more
        return math.nan


def _check_factory_uses_step_size(kernels, candidates):
    """Refuse a ``kernel_factory`` that ignores the step size it is given: one that returns
    the same kernel object twice, a kernel without a step size (``step_size=None``: it
    adapts its own), one whose constant step size is not the candidate, or kernels of
    different candidates that start with the same step size."""
    must = (
        "kernel_factory must build a new kernel per call with the step size it is given, e.g. "
        "lambda h: SGLD(model, step_size=h, num_particles=10)"
    )
    seen = {}
    for h, kernel in zip(candidates, kernels):
        if id(kernel) in seen and seen[id(kernel)][0] != h:
            raise ValueError(
                f"{must}: it returned the same kernel object for step sizes "
                f"{seen[id(kernel)][0]:g} and {h:g}"
            )
        first = _initial_step_size(kernel)
        if first is None:
            raise ValueError(
                f"{must}: for step size {h:g} it returned a {type(kernel).__name__} with "
                "step_size=None (which adapts its own step size and ignores the candidate)"
            )
        if isinstance(kernel.step_size, ConstantStepSize) and not math.isclose(
            first, h, rel_tol=1e-6
        ):
            raise ValueError(
                f"{must}: for step size {h:g} it returned a {type(kernel).__name__} with "
                f"step_size={first:g}"
            )
        seen[id(kernel)] = (h, first)
    starts = {}
    for h, first in seen.values():
        if math.isfinite(first):
            starts.setdefault(first, set()).add(h)
    for first, hs in starts.items():
        if len(hs) > 1:
            raise ValueError(
                f"{must}: the kernels it built for step sizes {sorted(hs)} all start with "
                f"step size {first:g}, so their pilots cannot differ"
            )


def tune_step_size(
    kernel_factory: Callable[[float], SGMCMCKernel],
    *args,
    candidates: Sequence[float] | None = None,
    num_steps: int = 300,
    burn_in: int | None = None,
    max_draws: int = 1000,
    seed: int = 0,
    **kwargs,
) -> StepSizeTuning:
    """
    Pick a step size for a stochastic-gradient sampler by the kernel Stein discrepancy of
    short pilot runs (Coullon et al. 2023), one per candidate::

        tuning = tune_step_size(lambda h: SGLD(model, step_size=h, num_particles=10), x, y)
        print(tuning)                       # the KSD of every candidate
        kernel = SGLD(model, step_size=tuning.step_size, num_particles=10)

    Each pilot runs ``num_steps`` steps of ``kernel_factory(step_size)`` on the model's
    arguments ``*args, **kwargs`` from the same seed (so the candidates differ only in
    their step size), keeps the draws of all particles after ``burn_in`` steps (thinned
    to at most ``max_draws``) and scores them by their KSD to the posterior, with the
    whole-data score at each draw (a subsampled plate is covered in passes of its
    minibatch size, whose gradients are averaged). A pilot that diverges scores ``inf``. The step size of the smallest KSD is returned with every trial.

    Pilot length matters: the KSD favours the step that gets closest to the posterior in
    ``num_steps`` steps, so a pilot much shorter than the run it tunes favours large
    steps. Pass the schedule's or the run's particle count and minibatch in the factory,
    as the real run will use them.

    :param callable kernel_factory: ``step_size -> kernel``, an
        :class:`~pyro_ext.infer.SGMCMCKernel` (SGLD, SGHMC, AdamSGLD, with or without
        repulsion).
    :param candidates: positive step sizes to try (default: half-decades from ``1e-6``
        to ``1e-1``, :data:`DEFAULT_CANDIDATES`).
    :param int num_steps: steps per pilot run.
    :param int burn_in: steps discarded per pilot (default ``num_steps // 2``).
    :param int max_draws: the most draws the KSD of a pilot is computed on.
    :param int seed: the seed every pilot starts from.
    :returns: :class:`StepSizeTuning` ``(step_size, trials)``.
    :raises TypeError: if ``kernel_factory`` is not callable or does not return an
        :class:`~pyro_ext.infer.SGMCMCKernel`.
    :raises ValueError: if every candidate diverged (the message names the smallest), the
        arguments are out of range, or ``kernel_factory`` ignores the step size it is given
        (returns one kernel object for every call, a kernel with ``step_size=None``, or
        kernels that start with the same step size for different candidates).
    """
    if not callable(kernel_factory) or isinstance(kernel_factory, MCMCKernel):
        raise TypeError(
            "kernel_factory must be a callable step_size -> kernel, e.g. "
            f"lambda h: SGLD(model, step_size=h), got {type(kernel_factory).__name__}"
        )
    if candidates is None:
        candidates = DEFAULT_CANDIDATES
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence):
        raise TypeError(
            f"candidates must be a sequence of step sizes, got {type(candidates).__name__}"
        )
    candidates = [check_positive(h, "candidates (each step size)") for h in candidates]
    if not candidates:
        raise ValueError("candidates must hold at least one step size")
    num_steps = check_int(num_steps, "num_steps", low=2)
    burn_in = num_steps // 2 if burn_in is None else burn_in
    burn_in = check_int(burn_in, "burn_in", low=0, high=num_steps - 1)
    max_draws = check_int(max_draws, "max_draws", low=2)
    seed = check_int(seed, "seed", low=0)

    # Every kernel is built (cheap: nothing runs before setup) and checked before the first
    # pilot: a factory that ignores its argument makes every pilot the same run, so every KSD
    # ties and the first candidate "wins" in silence.
    kernels = [kernel_factory(step_size) for step_size in candidates]
    for kernel in kernels:
        if not isinstance(kernel, SGMCMCKernel):
            raise TypeError(
                "kernel_factory must return a stochastic-gradient kernel (SGLD, SGHMC, "
                f"AdamSGLD), got {type(kernel).__name__}"
            )
    _check_factory_uses_step_size(kernels, candidates)

    trials = []
    for step_size, kernel in zip(candidates, kernels):
        start = time.perf_counter()
        pyro.set_rng_seed(seed)
        mcmc = MCMC(
            kernel, num_samples=num_steps - burn_in, warmup_steps=burn_in, disable_progbar=True
        )
        diverged_at, ksd = None, math.inf
        try:
            mcmc.run(*args, **kwargs)
        except SamplerDivergenceError as error:
            diverged_at = error.step
        if diverged_at is None:
            draws = mcmc.get_samples()
            num = next(iter(draws.values())).shape[0]
            keep = torch.linspace(0, num - 1, min(num, max_draws)).round().long().unique()
            potential = kernel.potential
            z = potential.unconstrain({k: v[keep] for k, v in draws.items()}, len(keep))
            with pyro.validation_enabled(False):
                score = _full_data_score(potential, z)
            if bool(torch.isfinite(score).all()):
                ksd = float(kernel_stein_discrepancy(z.detach(), score))
            else:
                diverged_at = num_steps
        trials.append(StepSizeTrial(step_size, ksd, diverged_at, time.perf_counter() - start))
    finite = [t for t in trials if math.isfinite(t.ksd)]
    if not finite:
        raise ValueError(
            f"every candidate step size diverged (the smallest, {min(candidates):.3g}, at "
            f"step {min(trials, key=lambda t: t.step_size).diverged_at}); try smaller "
            "candidates, or check the model's start and data"
        )
    best = min(finite, key=lambda t: t.ksd)
    return StepSizeTuning(best.step_size, trials)
