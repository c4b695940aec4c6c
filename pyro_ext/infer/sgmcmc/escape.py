"""
Particles that escaped: finite everywhere, yet far below the rest of the ensemble in log
density.

A step size too large for one region of the posterior can throw a particle into a region
of negligible mass (a network's weights in the hundreds, its noise precision near 0) whose
gradient is too weak to bring it back. Every value stays finite, so the divergence check
does not fire, yet every average over the draws is ruined: on the UCI energy data (split
11, ``AdamSGLD`` at 1e-3, ``benchmarks/uci.py``) one particle of 20 sat 24 000 nats below
the ensemble's median log density and the posterior predictive's test RMSE was 1 485
against 0.36-0.56 on the other 19 splits.

The criterion compares each particle's mean log density over the kept steps with the
ensemble's median. A particle is reported when its mean is below the median by more than
both

* ten robust standard deviations of the ensemble's means (1.4826 times their median
  absolute deviation): the particles' modes, their finite-run noise and the minibatch
  noise all widen this spread, so it scales itself to the problem; and
* what a Gaussian posterior in ``d`` dimensions allows at probability ``1e-9``: there the
  log density of a draw, below its maximum, is a ``Gamma(d / 2, 1)`` variable (times the
  temperature), whose tail gives ``P(X - d / 2 > t) <= exp(-t^2 / (2 (d / 2 + t)))``
  (Bernstein), so ``t = c + sqrt(c^2 + c d)`` with ``c = log(1e9)``; this floor keeps a
  tightly converged ensemble from reporting a particle that is only in a slightly worse
  mode.

Measured on healthy BNN ensembles of the UCI protocol (yacht, Boston, naval, kin8nm,
protein; 20 particles, 1000 kept steps), the lowest particle sat at most 4 median absolute
deviations below the median; the escaped one above sat 480. A majority that escaped
together moves the median with it and is not detected: the check catches the minority a
too-large step lets go, not a chain that failed as a whole.
"""

import math
from typing import NamedTuple

import torch

#: how many robust standard deviations below the ensemble's median a particle must sit
ROBUST_SD_FACTOR = 10.0
#: the tail probability of the Gaussian-posterior floor
TAIL_PROBABILITY = 1e-9


class Escape(NamedTuple):
    """The particles reported by :func:`find_escaped`, with the numbers behind the verdict."""

    #: indices of the escaped particles, lowest mean log density first
    particles: list
    #: how far below the ensemble's median each one's mean log density is (nats)
    gaps: list
    #: the gap above which a particle is reported (nats)
    threshold: float
    #: the number of kept steps the means are over
    num_steps: int


def gaussian_floor(dim: int, temperature: float = 1.0, tail: float = TAIL_PROBABILITY) -> float:
    """
    How far (nats) the log density of one draw from a ``dim``-dimensional Gaussian
    posterior, tempered by ``temperature``, exceeds its typical value (``dim / 2`` below
    the maximum) with probability at most ``tail``: ``T (c + sqrt(c^2 + c dim))`` with
    ``c = log(1 / tail)``, from Bernstein's bound on the ``Gamma(dim / 2, 1)`` tail.
    """
    c = math.log(1.0 / tail)
    return temperature * (c + math.sqrt(c * c + c * dim))


def find_escaped(
    mean_log_density: torch.Tensor, dim: int, temperature: float = 1.0, num_steps: int = 0
) -> Escape:
    """
    The particles whose mean log density (``(L,)``, over the kept steps) is below the
    ensemble's median by more than the larger of :data:`ROBUST_SD_FACTOR` robust standard
    deviations of the means and :func:`gaussian_floor` (see the module's docstring).
    Fewer than three particles, or a temperature of 0 (optimisation), report none.
    """
    means = mean_log_density.detach().double().cpu()
    if means.numel() < 3 or temperature == 0 or not bool(torch.isfinite(means).all()):
        return Escape([], [], math.inf, num_steps)
    median = means.median()
    robust_sd = 1.4826 * float((means - median).abs().median())
    threshold = max(ROBUST_SD_FACTOR * robust_sd, gaussian_floor(dim, temperature))
    gaps = median - means
    order = torch.argsort(gaps, descending=True)
    particles = [int(i) for i in order if float(gaps[i]) > threshold]
    return Escape(particles, [float(gaps[i]) for i in particles], threshold, num_steps)


class KeptLogDensity:
    """
    The per-particle sum of the kept steps' log densities. The steps a deferred
    verification has not read yet stay pending, so that a rewind (see
    :mod:`.verification`) drops them instead of counting the replayed steps twice.
    """

    def __init__(self):
        self.reset()

    def reset(self):
        self.total, self.count, self.pending = None, 0, []

    def add(self, step: int, log_density: torch.Tensor) -> None:
        self.pending.append((step, log_density.detach()))

    def commit(self, verified_steps: int) -> None:
        """Fold the pending steps before ``verified_steps`` into the sum."""
        keep = []
        for step, log_density in self.pending:
            if step < verified_steps:
                self.total = log_density.clone() if self.total is None else self.total + log_density
                self.count += 1
            else:
                keep.append((step, log_density))
        self.pending = keep

    def discard_from(self, step: int) -> None:
        """Drop the pending steps from ``step`` on (the chain was rewound to ``step``)."""
        self.pending = [(s, value) for s, value in self.pending if s < step]

    def means(self) -> torch.Tensor | None:
        """The mean over the committed steps (``None`` before the first)."""
        if self.total is None:
            return None
        return self.total / self.count
