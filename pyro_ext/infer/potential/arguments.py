r"""
Model arguments with one value per particle.

Every particle of a :class:`~pyro_ext.infer.potential.ParticlePotential` is evaluated on the
same model arguments, unless an argument is wrapped in :class:`PerParticle`: its leading
dimension then indexes the particles, and particle ``k`` sees ``value[k]``. Thesis
Algorithm 3.2 (ARA training) needs this: each particle :math:`\beta_k` moves on its own
attacked data :math:`x_k \sim p_C(x' \mid x)`. Independent chains on independent
minibatches are another use.

The wrapper is a :class:`~typing.NamedTuple`, so ``torch.utils._pytree`` (and with it the
compiled step, whose inputs are the tensors of the model arguments) sees through it to the
tensor.
"""

from typing import NamedTuple

import torch
from torch.utils import _pytree as pytree

__all__ = [
    "PerParticle",
    "check_per_particle",
    "has_per_particle",
    "select_particle",
    "split_per_particle",
]


class PerParticle(NamedTuple):
    """
    A model argument whose leading dimension indexes the particles: particle ``k`` runs the
    model with ``value[k]`` in its place. Pass it where the argument goes, e.g.
    ``kernel.set_data(PerParticle(x_per_particle), y)`` with ``x_per_particle`` of shape
    ``(L, N, ...)`` for a model ``model(x, y)`` that takes ``x`` of shape ``(N, ...)``.

    Evaluated with :func:`torch.func.vmap` (``vectorize="vmap"``, what ``"auto"`` picks for
    a model vmap can batch); a particle ``pyro.plate`` cannot give particles different
    arguments, and a sharded kernel refuses them.
    """

    value: torch.Tensor


def _is_per_particle(node) -> bool:
    return isinstance(node, PerParticle)


def _flatten(args, kwargs):
    return pytree.tree_flatten((tuple(args), dict(kwargs or {})), is_leaf=_is_per_particle)


def has_per_particle(args, kwargs) -> bool:
    """Whether any of ``args``/``kwargs`` is a :class:`PerParticle`."""
    leaves, _ = _flatten(args, kwargs)
    return any(_is_per_particle(leaf) for leaf in leaves)


def check_per_particle(args, kwargs, num_particles=None) -> None:
    """
    Refuse a :class:`PerParticle` whose value is not a tensor (:class:`TypeError`), has no
    leading dimension, or whose leading size differs from another's or from
    ``num_particles`` (:class:`ValueError`).
    """
    sizes = []
    for leaf in _flatten(args, kwargs)[0]:
        if not _is_per_particle(leaf):
            continue
        if not isinstance(leaf.value, torch.Tensor):
            raise TypeError(
                f"PerParticle must wrap a tensor with the particles along its leading "
                f"dimension, got {type(leaf.value).__name__}"
            )
        if leaf.value.dim() == 0:
            raise ValueError(
                "PerParticle must wrap a tensor with the particles along its leading "
                "dimension, got a 0-dimensional tensor"
            )
        sizes.append(leaf.value.shape[0])
    if len(set(sizes)) > 1:
        raise ValueError(
            f"the PerParticle arguments have leading sizes {sizes}; each must hold one value "
            "per particle"
        )
    if sizes and num_particles is not None and sizes[0] != num_particles:
        raise ValueError(
            f"a PerParticle argument has leading size {sizes[0]} but there are "
            f"{num_particles} particles; pass one value per particle"
        )


def select_particle(args, kwargs, index):
    """``args``/``kwargs`` as particle ``index`` sees them (each :class:`PerParticle` at
    ``value[index]``); the others unchanged."""
    leaves, spec = _flatten(args, kwargs)
    leaves = [leaf.value[index] if _is_per_particle(leaf) else leaf for leaf in leaves]
    return pytree.tree_unflatten(leaves, spec)


def split_per_particle(args, kwargs):
    """
    The :class:`PerParticle` values ``(list of tensors)`` and a function that rebuilds
    ``(args, kwargs)`` from one particle's slices of them: how a vmap over particles maps
    the per-particle arguments and closes over the rest.
    """
    leaves, spec = _flatten(args, kwargs)
    positions = [i for i, leaf in enumerate(leaves) if _is_per_particle(leaf)]
    values = [leaves[i].value for i in positions]

    def rebuild(slices):
        rebuilt = list(leaves)
        for i, value in zip(positions, slices):
            rebuilt[i] = value
        return pytree.tree_unflatten(rebuilt, spec)

    return values, rebuild
