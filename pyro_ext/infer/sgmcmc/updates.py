r"""
Pure update functions of the stochastic-gradient samplers (thesis sections 2.2-2.3).

Each takes the particles ``z`` ``(L, D)`` in unconstrained space, the stochastic gradient
of the log density ``grad`` ``(L, D)`` (``-\nabla H`` in the thesis' notation), the step
size, standard normal noise and an optional :class:`~.repulsion.Coupling`, and returns the
new state. Randomness is an argument, so each function is deterministic and testable.

Step sizes may be Python numbers or 0-dim tensors: a tensor keeps the update
differentiable in the step size (VIS learns it) and lets a compiled step take a new step
size without recompiling. Every branch of an update is on Python values fixed for a run
(the sampler's hyper-parameters), never on tensor values, so the functions trace.

Without a coupling the particles are independent chains. With one, the drift becomes the
SVGD direction :math:`\phi_i = \frac1L \sum_j [k(z_j, z_i) \nabla\log\pi(z_j) +
\nabla_{z_j} k(z_j, z_i)]` of eq. (2.4)/(2.8), and position noise is correlated across
particles with covariance :math:`K \otimes I / L` (eq. 2.7).

:data:`SAMPLERS` is the one registry of samplers: name -> :class:`Sampler`, the pair
``(init_state, update)`` that the kernels, VIS and ARA training all look up.
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from ...ops.validation import check_choice
from .repulsion import Coupling


def _sqrt(value):
    """``sqrt`` of a Python number or a tensor (keeping a tensor differentiable)."""
    return torch.sqrt(value) if isinstance(value, torch.Tensor) else math.sqrt(value)


def drift(grad: torch.Tensor, coupling: Coupling | None) -> torch.Tensor:
    """The drift ``D_K grad + Gamma_K`` of eq. (2.5); ``grad`` itself without coupling."""
    # The coupling computes it: a sharded run's coupling holds only its rank's rows.
    return grad if coupling is None else coupling.drift(grad)


def _couple(velocity: torch.Tensor, coupling: Coupling | None) -> torch.Tensor:
    return velocity if coupling is None else coupling.couple(velocity)


class PositionState(NamedTuple):
    """The state of a first-order sampler (SGLD, SGD, SVGD): the particles alone."""

    z: torch.Tensor


def sgld_update(z, grad, step_size, noise, coupling=None, temperature=1.0):
    r"""
    SGLD, eq. (2.1) (``D = I``, ``Q = 0`` in eq. 2.2), and SGLD+R, eq. (2.7)-(2.8)::

        z <- z + eps * drift(grad) + sqrt(2 eps T) * eta,   eta ~ N(0, D_K)

    With ``temperature=0`` and a coupling this is exactly one SVGD step (eq. 2.6).
    """
    new_z = z + step_size * drift(grad, coupling)
    if temperature == 0:
        return new_z
    if coupling is not None:
        noise = coupling.correlate(noise)
    return new_z + _sqrt(2.0 * step_size * temperature) * noise


class MomentumState(NamedTuple):
    z: torch.Tensor
    velocity: torch.Tensor


def sghmc_update(state, grad, step_size, friction, noise, coupling=None, temperature=1.0):
    r"""
    SGHMC (Chen et al., 2014) in its SGD-with-momentum form, and SGDm+R (Algorithm 2.2).

    The augmented state ``(z, m)`` follows eq. (2.5) with curl matrix
    ``Q_K = [[0, -K], [K, 0]] / L`` and friction ``D = diag(0, a I)`` on the momenta. In the
    velocity ``v = eps' m`` with learning rate ``step_size = eps'^2`` and
    ``friction = a eps'``::

        v <- (1 - friction) v + step_size * drift(grad) + sqrt(2 friction step_size T) xi
        z <- z + K v / L          (z <- z + v without coupling)

    The repulsion enters the momentum only: ``Q_K`` depends on ``z`` alone, so its
    correction term ``Gamma`` vanishes in the position block.
    """
    velocity = (1.0 - friction) * state.velocity + step_size * drift(grad, coupling)
    if temperature != 0:
        velocity = velocity + _sqrt(2.0 * friction * step_size * temperature) * noise
    return MomentumState(state.z + _couple(velocity, coupling), velocity)


class AdamState(NamedTuple):
    z: torch.Tensor
    velocity: torch.Tensor
    second_moment: torch.Tensor
    #: number of adapted steps so far, a 0-dim tensor (an int in states saved before 0.1)
    count: torch.Tensor


def adam_sgld_update(
    state,
    grad,
    step_size,
    noise,
    coupling=None,
    temperature=1.0,
    betas=(0.9, 0.999),
    eps=1e-8,
    adapt=True,
):
    r"""
    Adam plus noise (and repulsion): Adam+N / Adam+NR of thesis section 2.3.2.

    Each particle ``l`` carries the mass matrix ``M_l = diag(sqrt(v_l) + eps)`` built from
    Adam's bias-corrected second-moment estimate ``v_l`` of its gradients, and the momentum
    dynamics of :func:`sghmc_update` with friction ``1 - beta1`` and noise matched to
    ``M_l``::

        v_l <- beta2 v_l + (1 - beta2) grad_l^2                     (only while adapting)
        u   <- beta1 u + step_size * drift(grad) + sqrt(2 (1 - beta1) step_size T M) xi
        z   <- z + K (M^{-1} u) / L                                 (z + M^{-1} u alone)

    With ``M`` frozen the chain targets the posterior exactly as ``step_size -> 0``
    (eq. 2.5 with a constant diagonal mass); while adapting it behaves like Adam.

    :param adapt: a bool, or a 0-dim bool tensor (so that a compiled step switches from
        adapting to frozen without recompiling).
    """
    beta1, beta2 = betas
    second_moment, count = state.second_moment, state.count
    if isinstance(adapt, torch.Tensor):
        count = count + adapt.to(torch.as_tensor(count).dtype)
        second_moment = torch.where(
            adapt, beta2 * second_moment + (1.0 - beta2) * grad.pow(2), second_moment
        )
    elif adapt:
        count = count + 1
        second_moment = beta2 * second_moment + (1.0 - beta2) * grad.pow(2)
    mass = (second_moment / (1.0 - beta2**count)).sqrt() + eps
    friction = 1.0 - beta1
    velocity = beta1 * state.velocity + step_size * drift(grad, coupling)
    if temperature != 0:
        velocity = velocity + _sqrt(2.0 * friction * step_size * temperature) * mass.sqrt() * noise
    z = state.z + _couple(velocity / mass, coupling)
    return AdamState(z, velocity, second_moment, count)


class PreconditionedState(NamedTuple):
    z: torch.Tensor
    velocity: torch.Tensor
    #: the constant diagonal mass ``M`` ``(L, D)``, set between steps (see
    #: :func:`~.mass.windowed_mass`)
    mass: torch.Tensor
    #: per-particle sum of ``grad^2`` over the steps that observed it ``(L, D)``
    grad_sq: torch.Tensor
    #: how many steps observed it, a 0-dim tensor
    count: torch.Tensor


def preconditioned_sghmc_update(
    state, grad, step_size, noise, coupling=None, temperature=1.0, friction=0.1, observe=False
):
    r"""
    SGHMC with a constant diagonal mass ``M`` (eq. 2.5 with ``D = diag(0, a M)``), the
    kernel of :class:`~pyro_ext.infer.PreconditionedSGHMC`::

        u <- (1 - a) u + step_size * drift(grad) + sqrt(2 a step_size T M) xi
        z <- z + K (M^{-1} u) / L                       (z + M^{-1} u alone)

    :func:`adam_sgld_update` with its mass frozen is this update with ``M = sqrt(v) +
    eps``. With ``M`` constant the chain targets the posterior exactly as ``step_size ->
    0``, whatever ``M``. ``observe`` (a bool, or a 0-dim bool tensor so that a compiled
    step need not recompile) adds ``grad^2`` to :attr:`PreconditionedState.grad_sq`: the
    mass estimate between steps floors ``1 / Var`` by the gradients seen.
    """
    mass = state.mass
    velocity = (1.0 - friction) * state.velocity + step_size * drift(grad, coupling)
    if temperature != 0:
        velocity = velocity + _sqrt(2.0 * friction * step_size * temperature) * mass.sqrt() * noise
    z = state.z + _couple(velocity / mass, coupling)
    grad_sq, count = state.grad_sq, state.count
    if isinstance(observe, torch.Tensor):
        grad_sq = torch.where(observe, grad_sq + grad.pow(2), grad_sq)
        count = count + observe.to(count.dtype)
    elif observe:
        grad_sq, count = grad_sq + grad.pow(2), count + 1
    return PreconditionedState(z, velocity, mass, grad_sq, count)


def rescale_velocity(state, old_step_size: float, new_step_size: float):
    """
    The state with its velocity carried from step ``old_step_size`` to ``new_step_size``.

    In the SGD-with-momentum form (Chen et al., 2014, section 4) the velocity is
    ``v = eps' m`` with ``step_size = eps'^2``: the momentum ``m`` is the physical
    variable, at its stationary law ``N(0, T M)``, so ``v ~ N(0, step_size T M)``. When the
    step changes (warm-up's default rule changes it), keeping ``v`` would leave the momentum
    ``sqrt(old / new)`` times too hot (or cold) for about ``1 / friction`` steps; keeping
    ``m`` means scaling ``v`` by ``sqrt(new / old)``. A state without a velocity (SGLD,
    SGD) is returned as it is.
    """
    if "velocity" not in state._fields or old_step_size == new_step_size:
        return state
    return state._replace(velocity=state.velocity * math.sqrt(new_step_size / old_step_size))


# -- the registry --------------------------------------------------------------------------
class Sampler(NamedTuple):
    r"""
    A sampler as a pair of pure functions.

    ``init_state(z, step_size, temperature, at_rest=False, **hyper) -> state`` builds
    the state at particles ``z``: momenta drawn from their stationary law with the global
    RNG, or zero (and no randomness used) ``at_rest``; and
    ``update(state, grad, step_size, noise, coupling, temperature, adapt, **hyper) ->
    state`` is one transition; ``hyper`` are the sampler's own hyper-parameters
    (``friction``; ``betas``, ``eps``) and ``adapt`` says whether a preconditioner adapts.
    """

    init_state: Callable
    update: Callable
    hyper: tuple = ()


def _position_init(z, step_size, temperature, at_rest=False):
    return PositionState(z)


def _sgd_update(state, grad, step_size, noise, coupling, temperature, adapt):
    return PositionState(state.z + step_size * drift(grad, coupling))


def _sgld_update(state, grad, step_size, noise, coupling, temperature, adapt):
    return PositionState(sgld_update(state.z, grad, step_size, noise, coupling, temperature))


def _momentum_init(z, step_size, temperature, at_rest=False, friction=0.1):
    if at_rest:
        return MomentumState(z, torch.zeros_like(z))
    # Momenta start at their stationary law N(0, I), i.e. velocity ~ N(0, step_size T).
    return MomentumState(z, _sqrt(step_size * temperature) * torch.randn_like(z))


def _sghmc_update(state, grad, step_size, noise, coupling, temperature, adapt, friction=0.1):
    return sghmc_update(state, grad, step_size, friction, noise, coupling, temperature)


def _adam_init(z, step_size, temperature, at_rest=False, betas=(0.9, 0.999), eps=1e-8):
    zeros = torch.zeros_like(z)
    return AdamState(z, zeros, zeros.clone(), z.new_zeros((), dtype=torch.long))


def _adam_update(
    state, grad, step_size, noise, coupling, temperature, adapt, betas=(0.9, 0.999), eps=1e-8
):
    return adam_sgld_update(state, grad, step_size, noise, coupling, temperature, betas, eps, adapt)


def _preconditioned_init(z, step_size, temperature, at_rest=False, friction=0.1):
    # Unit mass until one is set between steps; momenta at rest or at N(0, M).
    state = _momentum_init(z, step_size, temperature, at_rest)
    zeros = torch.zeros_like(z)
    return PreconditionedState(
        z, state.velocity, torch.ones_like(z), zeros, z.new_zeros((), dtype=torch.long)
    )


def _preconditioned_update(
    state, grad, step_size, noise, coupling, temperature, adapt, friction=0.1
):
    return preconditioned_sghmc_update(
        state, grad, step_size, noise, coupling, temperature, friction, observe=adapt
    )


#: name -> :class:`Sampler`: the one place the samplers are listed. ``"sgd"`` is noise-free
#: gradient ascent (with a coupling: SVGD), the deterministic limit of ``"sgld"``.
SAMPLERS = {
    "sgd": Sampler(_position_init, _sgd_update),
    "sgld": Sampler(_position_init, _sgld_update),
    "sghmc": Sampler(_momentum_init, _sghmc_update, ("friction",)),
    "adam": Sampler(_adam_init, _adam_update, ("betas", "eps")),
    "preconditioned_sghmc": Sampler(_preconditioned_init, _preconditioned_update, ("friction",)),
}


def lookup(registry: dict, name, what: str):
    """``registry[name]``; a TypeError or ValueError naming ``what`` and the choices otherwise."""
    return registry[check_choice(name, what, sorted(registry))]


def get_sampler(name: str) -> Sampler:
    """The registered :class:`Sampler` called ``name``, or an error listing them."""
    return lookup(SAMPLERS, name, "sampler")
