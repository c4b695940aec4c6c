"""
The constant diagonal mass of :class:`~pyro_ext.infer.PreconditionedSGHMC`, estimated
between steps from a window of warm-up draws: pure functions of the draws and the
sampler state (:class:`~.updates.PreconditionedState`).

Adam's mass ``sqrt(E[grad^2]) ~ 1 / sd`` leaves an oscillation frequency ``~ 1 / sqrt(sd)``
per coordinate, so weakly identified coordinates with a wide posterior (a retail model's
decay rates and noise scales) move far slower than the stiff ones that bound the step
size. With ``M = 1 / Var`` every coordinate of a Gaussian target turns by
``sqrt(step_size)`` radians per step: the dynamics are scale invariant (the constant
diagonal metric NUTS adapts).
"""

import torch

__all__ = ["rescale_momenta", "windowed_mass"]

#: the weight, in draws, of the initial variance that the window's estimate is shrunk to
PRIOR_DRAWS = 5.0


def windowed_mass(draws, grad_sq_mean, initial_variance, adam_floor=0.0):
    """
    The mass ``1 / Var`` per coordinate ``(D,)`` from ``draws`` ``(..., D)`` pooled over
    particles and steps.

    Pooled, because slowly mixing coordinates have not yet explored their range within one
    particle (the within-particle variance under-estimates them about fourfold on Robyn's
    data); robust, through the interquartile range, so that one stray particle cannot
    inflate a variance (a too-small mass makes the stiff side of a skewed posterior
    unstable). The variance is shrunk towards ``initial_variance`` ``(D,)`` with the
    weight of :data:`PRIOR_DRAWS` draws, and the mass is never below ``adam_floor`` times
    Adam's mass ``sqrt(E[grad^2])`` (``grad_sq_mean`` ``(D,)``): where the gradients seen
    were large (the stiff flank of a skewed posterior), ``1 / Var`` alone can make an
    unadjusted step unstable.
    """
    draws = draws.reshape(-1, draws.shape[-1])
    m = draws.shape[0]
    q = torch.quantile(
        draws, torch.tensor([0.25, 0.75], dtype=draws.dtype, device=draws.device), dim=0
    )
    pooled = ((q[1] - q[0]) / 1.349).pow(2)
    variance = (m / (m + PRIOR_DRAWS)) * pooled + (
        PRIOR_DRAWS / (m + PRIOR_DRAWS)
    ) * initial_variance
    return torch.maximum(1.0 / variance, adam_floor * grad_sq_mean.sqrt())


def rescale_momenta(state, mass):
    """``state`` with the mass ``mass`` (broadcast to ``(L, D)``) and its velocities
    rescaled so that the momenta keep their stationary law ``N(0, step_size M)`` for the
    new ``M``; the gradient sums restart."""
    mass = mass.expand_as(state.mass)
    velocity = state.velocity * (mass / state.mass).sqrt()
    return state._replace(
        velocity=velocity,
        mass=mass.clone(),
        grad_sq=torch.zeros_like(state.grad_sq),
        count=torch.zeros_like(state.count),
    )
