"""
The evidence lower bound as a model-comparison statistic, with its Monte Carlo error.

For a model :math:`p(y, \\theta)` and a guide :math:`q(\\theta)`,
:math:`\\mathrm{ELBO} = \\mathbb E_q[\\log p(y, \\theta) - \\log q(\\theta)] = \\log p(y) -
\\mathrm{KL}(q \\,\\|\\, p(\\theta \\mid y))`: a lower bound on the log evidence, tight where
the guide is the posterior. Two models fitted with guides of the same family are compared
by their ELBOs (the larger wins) when the difference exceeds its Monte Carlo error, which
:func:`elbo_estimate` reports: the standard error over independent single-draw estimates
(Pyro's ``Trace_ELBO(num_particles=n)`` returns their mean only).
"""

from collections.abc import Callable
from typing import NamedTuple

import pyro
import torch

from ..ops.validation import check_int

__all__ = ["ELBOEstimate", "elbo_estimate"]


class ELBOEstimate(NamedTuple):
    """An ELBO estimate (nats) and its Monte Carlo standard error."""

    mean: float
    sd: float

    def exceeds(self, other: "ELBOEstimate", num_sd: float = 2.0) -> bool:
        """Whether this bound is larger than ``other``'s by more than ``num_sd`` standard
        errors of their difference."""
        return self.mean - other.mean > num_sd * (self.sd**2 + other.sd**2) ** 0.5


def elbo_estimate(
    model: Callable, guide: Callable, *args, num_particles: int = 32, **kwargs
) -> ELBOEstimate:
    """
    The ELBO of ``guide`` for ``model(*args, **kwargs)`` from ``num_particles``
    independent draws of the guide, with its standard error (``sd / sqrt(num_particles)``;
    0 when the guide is the exact posterior, whose single-draw estimate is the log evidence
    itself). Runs without gradients and with Pyro's validation off.
    """
    if not callable(model):
        raise TypeError(f"model must be callable, got {type(model).__name__}")
    if not callable(guide):
        raise TypeError(f"guide must be callable, got {type(guide).__name__}")
    num_particles = check_int(num_particles, "num_particles", low=2)
    elbo = pyro.infer.Trace_ELBO(num_particles=1)
    with torch.no_grad(), pyro.validation_enabled(False):
        draws = [-elbo.loss(model, guide, *args, **kwargs) for _ in range(num_particles)]
    # Host floats (Trace_ELBO.loss returns them), summarised on the host; a non-finite draw
    # gives a non-finite estimate rather than an error.
    draws = torch.tensor(draws, dtype=torch.float64, device="cpu")
    return ELBOEstimate(float(draws.mean()), float(draws.std() / num_particles**0.5))
