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

A particle far below on average may instead be late: started at the ensemble's worst
point, it climbs with the others and reaches them only during the kept steps. On the UCI
concrete data (split 7, ``AdamSGLD`` with repulsion at its default step) one particle sat
234 nats below the median on average against a threshold of 217, but 261, 233, 199 and 187
in the four quarters of the kept steps; the predictive's test log-likelihood was -3.134
with it and -3.138 without. The escape verdict therefore rests on where a particle is at
the end: its mean over the last quarter of the kept steps (:data:`FINAL_FRACTION`) must
also be below the median of those means by more than the threshold. A particle below on
average but not at the end has rejoined the ensemble (:attr:`Escape.rejoined`): its first
kept draws are the transient of a warm-up too short for it, a slow-mixing problem, not an
escape.
"""

import math
from typing import NamedTuple

import torch

#: how many robust standard deviations below the ensemble's median a particle must sit
ROBUST_SD_FACTOR = 10.0
#: the tail probability of the Gaussian-posterior floor
TAIL_PROBABILITY = 1e-9
#: the final part of the kept steps on which an escape verdict must hold too
FINAL_FRACTION = 0.25
#: at most this many block sums per particle are kept (adjacent blocks merge beyond it)
MAX_BLOCKS = 64


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
    #: particles below by more than the threshold on average but not over the final
    #: :data:`FINAL_FRACTION` of the kept steps (late, not escaped), lowest mean first
    rejoined: list = []
    #: each rejoined particle's gap on average over the kept steps (nats)
    rejoined_gaps: list = []
    #: and over the final ones (nats)
    final_gaps: list = []


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
    mean_log_density: torch.Tensor,
    dim: int,
    temperature: float = 1.0,
    num_steps: int = 0,
    final_log_density: torch.Tensor | None = None,
) -> Escape:
    """
    The particles whose mean log density (``(L,)``, over the kept steps) is below the
    ensemble's median by more than the larger of :data:`ROBUST_SD_FACTOR` robust standard
    deviations of the means and :func:`gaussian_floor` (see the module's docstring), and
    whose mean over the final kept steps (``final_log_density``, ``(L,)``; ``None``: not
    known) is below the median of those by more than the same threshold. The ones below
    on average only are :attr:`Escape.rejoined`. Fewer than three particles, or a
    temperature of 0 (optimisation), report none.
    """
    means = mean_log_density.detach().double().cpu()
    if means.numel() < 3 or temperature == 0 or not bool(torch.isfinite(means).all()):
        return Escape([], [], math.inf, num_steps)
    median = means.median()
    robust_sd = 1.4826 * float((means - median).abs().median())
    threshold = max(ROBUST_SD_FACTOR * robust_sd, gaussian_floor(dim, temperature))
    gaps = median - means
    if final_log_density is None:
        final_gaps = gaps
    else:
        final = final_log_density.detach().double().cpu()
        final_gaps = final.median() - final
    order = torch.argsort(gaps, descending=True)
    below = [int(i) for i in order if float(gaps[i]) > threshold]
    particles = [i for i in below if float(final_gaps[i]) > threshold]
    rejoined = [i for i in below if float(final_gaps[i]) <= threshold]
    return Escape(
        particles,
        [float(gaps[i]) for i in particles],
        threshold,
        num_steps,
        rejoined,
        [float(gaps[i]) for i in rejoined],
        [float(final_gaps[i]) for i in rejoined],
    )


class KeptLogDensity:
    """
    The per-particle sum of the kept steps' log densities, whole and by blocks of
    consecutive steps (at most :data:`MAX_BLOCKS`, so bounded memory) for the mean over the
    final steps. The steps a deferred verification has not read yet stay pending, so that
    a rewind (see :mod:`.verification`) drops them instead of counting the replayed steps
    twice.
    """

    def __init__(self):
        self.reset()

    def reset(self):
        self.total, self.count, self.pending = None, 0, []
        # Sums over consecutive blocks of block_size steps (the last one filling), for the
        # mean over the final steps; pairs merge when there are MAX_BLOCKS, so the memory
        # stays bounded however long the run.
        self.blocks, self.block_counts, self.block_size = [], [], 1

    def _add_to_blocks(self, log_density):
        if self.block_counts and self.block_counts[-1] < self.block_size:
            self.blocks[-1] = self.blocks[-1] + log_density
            self.block_counts[-1] += 1
            return
        if len(self.blocks) == MAX_BLOCKS:  # every block full: merge adjacent pairs
            self.blocks = [a + b for a, b in zip(self.blocks[::2], self.blocks[1::2])]
            self.block_counts = [
                a + b for a, b in zip(self.block_counts[::2], self.block_counts[1::2])
            ]
            self.block_size *= 2
        self.blocks.append(log_density.clone())
        self.block_counts.append(1)

    def add(self, step: int, log_density: torch.Tensor) -> None:
        self.pending.append((step, log_density.detach()))

    def commit(self, verified_steps: int) -> None:
        """Fold the pending steps before ``verified_steps`` into the sum."""
        keep = []
        for step, log_density in self.pending:
            if step < verified_steps:
                self.total = log_density.clone() if self.total is None else self.total + log_density
                self.count += 1
                self._add_to_blocks(log_density)
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

    def final_means(self, fraction: float = FINAL_FRACTION) -> torch.Tensor | None:
        """The mean over the last blocks that hold at least ``fraction`` of the committed
        steps (``None`` before the first)."""
        if self.total is None:
            return None
        total, count = None, 0
        for block, block_count in zip(reversed(self.blocks), reversed(self.block_counts)):
            total = block if total is None else total + block
            count += block_count
            if count >= fraction * self.count:
                break
        return total / count

    def state_dict(self, like: torch.Tensor) -> dict:
        """The committed sums (zeros shaped like ``like`` ``(L,)`` before the first)."""
        total = self.total if self.total is not None else like.new_zeros(like.shape[0])
        return {
            "total": total,
            "count": self.count,
            # A list (of (L,) sums): its length grows with the run.
            "blocks": list(self.blocks),
            "block_counts": list(self.block_counts),
            "block_size": self.block_size,
        }

    def load_state_dict(self, state: dict | None) -> None:
        self.reset()
        if state is None or state["count"] == 0:  # None: saved before the escape check
            return
        self.total, self.count = state["total"], state["count"]
        if "blocks" in state:
            self.blocks = list(state["blocks"])
            self.block_counts = list(state["block_counts"])
            self.block_size = state["block_size"]
        else:  # saved before the final means: one block (the verdict on the mean alone)
            self.blocks, self.block_counts, self.block_size = [self.total], [self.count], self.count
