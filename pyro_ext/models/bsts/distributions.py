"""The priors of :class:`~pyro_ext.models.bsts.RetailBSTS` that Pyro does not have: the
spike and slab with its indicator summed out, a pair of noise scales sampled in polar
coordinates, and channel effects with a log-normal prior on some and a half-normal on the
others."""

import math

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

__all__ = ["ChannelEffectPrior", "NoiseScales", "PolarTransform", "SpikeSlabNormal"]


class SpikeSlabNormal(dist.TorchDistribution):
    r"""``pi N(0, slab^2) + (1 - pi) N(0, spike^2)`` elementwise: the spike-and-slab prior
    with ``gamma ~ Bernoulli(pi)`` summed out.  ``pi == 1`` is exactly the slab."""

    arg_constraints = {
        "pi": constraints.unit_interval,
        "spike": constraints.positive,
        "slab": constraints.positive,
    }
    support = constraints.real
    has_rsample = False

    def __init__(self, pi, spike, slab, validate_args=None):
        self.pi, self.spike, self.slab = torch.broadcast_tensors(
            torch.as_tensor(pi),
            torch.as_tensor(spike).to(torch.as_tensor(pi)),
            torch.as_tensor(slab).to(torch.as_tensor(pi)),
        )
        super().__init__(self.pi.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return SpikeSlabNormal(
            self.pi.expand(batch_shape),
            self.spike.expand(batch_shape),
            self.slab.expand(batch_shape),
        )

    def _parts(self, value):
        lslab = dist.Normal(0.0, self.slab).log_prob(value) + torch.log(self.pi)
        lspike = dist.Normal(0.0, self.spike).log_prob(value) + torch.log1p(-self.pi)
        forced = self.pi >= 1
        lspike = torch.where(forced, torch.full_like(lspike, -math.inf), lspike)
        return lslab, lspike, forced

    def log_prob(self, value):
        lslab, lspike, forced = self._parts(value)
        return torch.where(forced, lslab, torch.logaddexp(lslab, lspike))

    def responsibility(self, value):
        """``p(gamma = 1 | beta = value)``."""
        lslab, lspike, forced = self._parts(value)
        return torch.where(forced, torch.ones_like(lslab), torch.sigmoid(lslab - lspike))

    def sample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            gamma = torch.bernoulli(self.pi.expand(shape))
            scale = torch.where(gamma > 0, self.slab.expand(shape), self.spike.expand(shape))
            return scale * torch.randn(shape, dtype=self.pi.dtype, device=self.pi.device)


class _PositivePair(constraints.Constraint):
    """Pairs of positive reals, ``(..., 2)``."""

    event_dim = 1

    def check(self, value):
        return (value > 0).all(-1)


positive_pair = _PositivePair()


class PolarTransform(torch.distributions.transforms.Transform):
    r"""``R^2 -> (0, inf)^2``: ``(u_1, u_2) -> r (cos theta, sin theta)`` with ``r = e^{u_1}``
    and ``theta = (pi / 2) sigmoid(u_2)``.

    The unconstrained coordinates of a pair of noise scales ``(sigma_1, sigma_2)`` become
    the log of the total ``r = sqrt(sigma_1^2 + sigma_2^2)`` and the logit of how it is
    shared.  When two noise sources are nearly interchangeable (white observation noise
    and a fast-decaying AR(1) goodwill), the data fix ``r`` and leave ``theta`` loose:
    the curved ridge of ``(log sigma_1, log sigma_2)``, whose stiff flank made an
    unadjusted gradient sampler diverge, becomes two roughly independent coordinates.
    """

    domain = constraints.independent(constraints.real, 1)
    codomain = positive_pair
    bijective = True

    def __eq__(self, other):
        return isinstance(other, PolarTransform)

    def _call(self, u):
        r = u[..., 0].exp()
        theta = (math.pi / 2) * torch.sigmoid(u[..., 1])
        return torch.stack([r * torch.cos(theta), r * torch.sin(theta)], -1)

    def _inverse(self, x):
        # logit(2 theta / pi) = log(theta) - log(pi / 2 - theta), both angles by atan2 so
        # that neither end of the quarter circle loses precision.
        log_r = torch.hypot(x[..., 0], x[..., 1]).log()
        logit = torch.atan2(x[..., 1], x[..., 0]).log() - torch.atan2(x[..., 0], x[..., 1]).log()
        return torch.stack([log_r, logit], -1)

    def log_abs_det_jacobian(self, u, x):
        # polar r dr dtheta, dr = r du_1, dtheta = (pi / 2) s (1 - s) du_2
        return (
            2 * u[..., 0]
            + math.log(math.pi / 2)
            + torch.nn.functional.logsigmoid(u[..., 1])
            + torch.nn.functional.logsigmoid(-u[..., 1])
        )


@torch.distributions.biject_to.register(_PositivePair)
@torch.distributions.transform_to.register(_PositivePair)
def _polar_for_positive_pair(constraint):
    return PolarTransform()


class NoiseScales(dist.TorchDistribution):
    r"""Independent ``HalfNormal(scale_i)`` noise scales as one site, ``(..., 2)``, whose
    unconstrained space is polar (:class:`PolarTransform`): the same prior as two
    HalfNormal sites, reparametrised for samplers."""

    arg_constraints = {"scale": constraints.independent(constraints.positive, 1)}
    support = positive_pair
    has_rsample = True

    def __init__(self, scale, validate_args=None):
        if scale.shape[-1:] != (2,):
            raise ValueError(f"scale must have shape (..., 2), got {tuple(scale.shape)}")
        self.scale = scale
        super().__init__(scale.shape[:-1], scale.shape[-1:], validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return NoiseScales(self.scale.expand(*batch_shape, 2))

    def rsample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        eps = torch.randn(shape, dtype=self.scale.dtype, device=self.scale.device)
        return self.scale.expand(shape) * eps.abs()

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return dist.HalfNormal(self.scale).log_prob(value).sum(-1)


class ChannelEffectPrior(dist.TorchDistribution):
    r"""Independent positive channel effects: ``LogNormal(loc_i, scale_i)`` where
    ``log_normal[i]`` is true, ``HalfNormal(half_normal_scale_i)`` elsewhere.

    :class:`~pyro_ext.models.bsts.RetailBSTS` uses it for ``roas_prior``: a channel with a
    lift test gets a log-normal prior whose ``loc`` is shifted, given the decay rates, so
    that its return on ad spend has the elicited log-normal law; the others keep the
    half-normal.  (Pyro's ``MaskedMixture`` would mix the two, but the supports, ``x > 0`` and
    ``x >= 0``, differ, so no bijection to the unconstrained space is registered for it.)
    """

    arg_constraints = {
        "loc": constraints.real,
        "scale": constraints.positive,
        "half_normal_scale": constraints.positive,
    }
    support = constraints.positive
    has_rsample = True

    def __init__(self, loc, scale, half_normal_scale, log_normal, validate_args=None):
        self.loc, self.scale, self.half_normal_scale = torch.broadcast_tensors(
            torch.as_tensor(loc),
            torch.as_tensor(scale).to(torch.as_tensor(loc)),
            torch.as_tensor(half_normal_scale).to(torch.as_tensor(loc)),
        )
        self.log_normal = torch.as_tensor(log_normal, dtype=torch.bool).expand(self.loc.shape)
        super().__init__(self.loc.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return ChannelEffectPrior(
            self.loc.expand(batch_shape),
            self.scale.expand(batch_shape),
            self.half_normal_scale.expand(batch_shape),
            self.log_normal.expand(batch_shape),
        )

    def rsample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        z = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        log_normal = (self.loc + self.scale * z).exp()
        return torch.where(self.log_normal, log_normal, self.half_normal_scale * z.abs())

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        safe = value.clamp(min=torch.finfo(value.dtype).tiny)
        log_normal = dist.LogNormal(self.loc, self.scale).log_prob(safe)
        half_normal = dist.HalfNormal(self.half_normal_scale).log_prob(value)
        return torch.where(self.log_normal, log_normal, half_normal)

    @property
    def mean(self):
        log_normal = (self.loc + self.scale.pow(2) / 2).exp()
        return torch.where(
            self.log_normal, log_normal, self.half_normal_scale * math.sqrt(2 / math.pi)
        )
