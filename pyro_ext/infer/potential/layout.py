"""How a model's latent sites lie in the flat unconstrained vector the samplers move.

Each continuous latent site moves to unconstrained space by the bijection onto its support
(:class:`SupportMap`) and takes a run of columns of the flat vector (:class:`_SiteLayout`);
the discrete sites a Gibbs move updates keep their own record (:class:`DiscreteSite`). The
functions below map between flat particles and site values given a layout alone (the
``layout`` dict of :class:`~pyro_ext.infer.potential.ParticlePotential`, site name ->
:class:`_SiteLayout`), without running the model.
"""

from typing import NamedTuple

import torch
from pyro.distributions.util import sum_rightmost
from torch.distributions import biject_to, constraints


def _base_support(support):
    # torch has no bijection registered for a mixture's support: it is its components'.
    while isinstance(support, constraints.MixtureSameFamilyConstraint):
        support = support.base_constraint
    return support


class SupportMap(NamedTuple):
    """
    How a continuous latent site moves to unconstrained space: the bijection from
    unconstrained values onto the site's support (:func:`torch.distributions.biject_to`),
    and the event dimensions on either side. The one record behind both site layouts of
    the package: :class:`~pyro_ext.infer.potential.ParticlePotential`'s flat layout of
    global latents, and VIS's layout of the base guide's draws (local latents and guide
    plates included).
    """

    #: unconstrained -> support
    transform: torch.distributions.Transform
    #: event dims of the constrained value (the distribution's ``event_dim``)
    event_dim: int
    #: event dims of the unconstrained value (they differ for e.g. a simplex)
    unconstrained_event_dim: int
    #: the support is the real line already: no transform, no Jacobian
    is_identity: bool

    @classmethod
    def of(cls, fn) -> "SupportMap":
        """The map of a site whose distribution is ``fn``."""
        support = _base_support(fn.support)
        transform = biject_to(support)
        unconstrained_event_dim = (
            fn.event_dim - transform.codomain.event_dim + transform.domain.event_dim
        )
        while isinstance(support, constraints.independent):
            support = support.base_constraint
        return cls(transform, fn.event_dim, unconstrained_event_dim, support is constraints.real)

    def log_jacobian(self, unconstrained, value):
        """``log|d value / d unconstrained|`` summed over the site's event dims."""
        log_det = self.transform.log_abs_det_jacobian(unconstrained, value)
        return sum_rightmost(
            log_det, self.unconstrained_event_dim - self.transform.domain.event_dim
        )


class DiscreteSite(NamedTuple):
    """A discrete latent site that a Gibbs move updates: its value's shape, batch shape,
    the values each element takes, and its dtype."""

    shape: tuple
    batch_shape: tuple
    support: torch.Tensor
    dtype: torch.dtype


class _SiteLayout(NamedTuple):
    start: int
    end: int
    unconstrained_shape: torch.Size
    support_map: SupportMap
    batch_shape: torch.Size

    @property
    def transform(self):
        return self.support_map.transform

    @property
    def is_real(self):
        return self.support_map.is_identity


def site_of(layout: dict[str, _SiteLayout], column: int) -> str:
    """The site whose columns hold flat coordinate ``column``."""
    for name, site in layout.items():
        if site.start <= column < site.end:
            return name
    raise IndexError(column)


def unflatten(layout: dict[str, _SiteLayout], z: torch.Tensor) -> dict[str, torch.Tensor]:
    """Split flat particles ``(..., D)`` into unconstrained site values."""
    batch = z.shape[:-1]
    return {
        name: z[..., s.start : s.end].reshape(batch + s.unconstrained_shape)
        for name, s in layout.items()
    }


def constrain(layout: dict[str, _SiteLayout], z: torch.Tensor) -> dict[str, torch.Tensor]:
    """Constrained site values at flat unconstrained particles ``z`` ``(..., D)``."""
    return {name: layout[name].transform(u) for name, u in unflatten(layout, z).items()}


def flatten(
    layout: dict[str, _SiteLayout], values: dict[str, torch.Tensor], num_particles: int
) -> torch.Tensor:
    """Inverse of :func:`unflatten`; values without a particle dim are broadcast."""
    columns = []
    for name, s in layout.items():
        if name not in values:
            raise ValueError(f"initial_params is missing latent site {name!r}")
        value = torch.as_tensor(values[name])
        expected = (num_particles,) + tuple(s.unconstrained_shape)
        if tuple(value.shape) == tuple(s.unconstrained_shape):
            value = value.expand(expected)
        elif num_particles == 1 and tuple(value.shape) == expected[1:]:
            value = value.unsqueeze(0)
        if tuple(value.shape) != expected:
            raise ValueError(
                f"initial_params[{name!r}] has shape {tuple(value.shape)}; expected "
                f"{tuple(s.unconstrained_shape)} or {expected} (unconstrained, with an "
                "optional leading particle dimension)"
            )
        columns.append(value.reshape(num_particles, -1))
    return torch.cat(columns, dim=-1)


def unconstrain(
    layout: dict[str, _SiteLayout], values: dict[str, torch.Tensor], num_particles: int
) -> torch.Tensor:
    """Flat unconstrained particles ``(L, D)`` from constrained site values."""
    return flatten(
        layout,
        {
            name: layout[name].transform.inv(torch.as_tensor(values[name]))
            for name in layout
            if name in values
        },
        num_particles,
    )


def constrain_with_log_jacobian(layout: dict[str, _SiteLayout], z: torch.Tensor):
    """Site values and the summed log-Jacobian at particles ``z`` of shape ``(..., D)``."""
    batch = z.shape[:-1]
    values = {}
    log_jacobian = 0.0  # stays a number when every site is unconstrained already
    columns = z.split([s.end - s.start for s in layout.values()], -1)
    for (name, s), column in zip(layout.items(), columns):
        unconstrained = column.reshape(batch + s.unconstrained_shape)
        if s.is_real:
            values[name] = unconstrained
            continue
        value = s.transform(unconstrained)
        log_det = s.transform.log_abs_det_jacobian(unconstrained, value)
        log_jacobian = log_jacobian + log_det.reshape(batch + (-1,)).sum(-1)
        values[name] = value
    if not isinstance(log_jacobian, torch.Tensor):
        log_jacobian = z.new_zeros(batch)
    return values, log_jacobian
