"""Vectorised log density of a Pyro model over L particles of its latent variables.

:func:`pyro.infer.mcmc.util.initialize_model` refuses models that subsample data with
``pyro.plate(..., subsample_size=...)``, which is exactly what stochastic-gradient MCMC
needs. :class:`ParticlePotential` builds the potential itself: latent sites are moved to
unconstrained space (with the log-Jacobian), the minibatch scaling ``N / |batch|`` comes
from the plates, and all particles are evaluated in one :func:`torch.func.vmap` pass that
shares one fresh subsample per plate and step.
"""

from typing import Callable, Dict, NamedTuple, Tuple

import pyro
import torch
from pyro.distributions.util import scale_and_mask
from pyro.infer.autoguide.initialization import InitMessenger
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample
from torch.distributions import biject_to


class SamplerDivergenceError(RuntimeError):
    """
    Raised when the potential or its gradient stops being finite.

    :ivar int step: the (0-based) sampler step at which it happened.
    :ivar list sites: latent sites whose gradient is not finite (empty when only the
        potential is).
    :ivar list particles: indices of the particles concerned.
    """

    def __init__(self, step, sites, particles):
        self.step, self.sites, self.particles = step, list(sites), list(particles)
        where = f"in site(s) {', '.join(repr(s) for s in self.sites)}" if self.sites else ""
        super().__init__(
            f"Sampler diverged at step {step}: non-finite potential or gradient {where} "
            f"for particle(s) {self.particles[:10]}{'...' if len(self.particles) > 10 else ''}. "
            "Reduce the step size or check the model; draws collected before this step "
            "are kept (see MCMC.get_samples())."
        )


class _SiteLayout(NamedTuple):
    start: int
    end: int
    unconstrained_shape: torch.Size
    transform: torch.distributions.Transform


class _LogJointMessenger(Messenger):
    """Conditions latent sites and plate subsamples, and accumulates the scaled log joint."""

    def __init__(self, values, subsamples):
        super().__init__()
        self.values = values
        self.subsamples = subsamples
        self.log_joint = 0.0

    def _pyro_sample(self, msg):
        if site_is_subsample(msg):
            if msg["name"] in self.subsamples:
                msg["value"] = self.subsamples[msg["name"]]
            return
        if msg["is_observed"]:
            return
        try:
            msg["value"] = self.values[msg["name"]]
        except KeyError:
            raise ValueError(
                f"latent site {msg['name']!r} did not appear when the model was set up; "
                "stochastic-gradient samplers need a model with static latent structure"
            ) from None

    def _pyro_post_sample(self, msg):
        if site_is_subsample(msg) or msg["infer"].get("_deterministic"):
            return
        log_prob = msg["fn"].log_prob(msg["value"], *msg["args"], **msg["kwargs"])
        self.log_joint = self.log_joint + scale_and_mask(log_prob, msg["scale"], msg["mask"]).sum()


def _subsampled_frames(site):
    return [
        f for f in site["cond_indep_stack"] if f.full_size is not None and f.full_size != f.size
    ]


class ParticlePotential:
    """
    The log joint density of ``model`` as a function of ``L`` flat unconstrained particles.

    :param callable model: a Pyro model with continuous latent sites and static structure.
    :param tuple model_args: positional arguments of ``model``.
    :param dict model_kwargs: keyword arguments of ``model``.
    """

    def __init__(self, model, model_args=(), model_kwargs=None):
        self.model = model
        self.model_args = tuple(model_args)
        self.model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
        with pyro.poutine.block():
            trace = pyro.poutine.trace(model).get_trace(*self.model_args, **self.model_kwargs)
        self.layout: Dict[str, _SiteLayout] = {}
        self.subsample_sizes: Dict[str, Tuple[int, int]] = {}
        start = 0
        for name, site in trace.nodes.items():
            if site["type"] != "sample":
                continue
            if site_is_subsample(site):
                if site["fn"].subsample_size is not None and (
                    site["fn"].subsample_size < site["fn"].size
                ):
                    self.subsample_sizes[name] = (site["fn"].size, site["fn"].subsample_size)
                continue
            if site["is_observed"]:
                continue
            fn = site["fn"]
            if fn.support.is_discrete:
                raise ValueError(
                    f"latent site {name!r} is discrete (support {fn.support}); gradient-based "
                    "samplers need continuous latent sites. Observe it, or marginalise it "
                    "out of the model (e.g. with pyro_ext.timeseries for hidden Markov chains)."
                )
            frames = _subsampled_frames(site)
            if frames:
                raise ValueError(
                    f"latent site {name!r} lies inside the subsampled plate {frames[0].name!r}; "
                    "stochastic-gradient samplers draw global latent variables only. Move "
                    "local latents out of subsampled plates or marginalise them."
                )
            transform = biject_to(fn.support)
            unconstrained = transform.inv(site["value"])
            size = unconstrained.numel()
            self.layout[name] = _SiteLayout(
                start, start + size, unconstrained.shape, transform
            )
            start += size
        if not self.layout:
            raise ValueError("model has no latent sample sites to draw")
        self.dim = start
        self._trace = trace

    @property
    def transforms(self) -> Dict[str, torch.distributions.Transform]:
        """Constrained-to-unconstrained transforms, as :class:`pyro.infer.MCMC` expects."""
        return {name: site.transform.inv for name, site in self.layout.items()}

    def site_of(self, column: int) -> str:
        for name, site in self.layout.items():
            if site.start <= column < site.end:
                return name
        raise IndexError(column)

    def unflatten(self, z: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Split flat particles ``(..., D)`` into unconstrained site values."""
        batch = z.shape[:-1]
        return {
            name: z[..., s.start : s.end].reshape(batch + s.unconstrained_shape)
            for name, s in self.layout.items()
        }

    def flatten(self, values: Dict[str, torch.Tensor], num_particles: int) -> torch.Tensor:
        """Inverse of :meth:`unflatten`; values without a particle dim are broadcast."""
        columns = []
        for name, s in self.layout.items():
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

    def initial_particles(self, num_particles: int, init_strategy: Callable) -> torch.Tensor:
        """Draw ``num_particles`` flat unconstrained starting points with ``init_strategy``."""
        draws = []
        for _ in range(num_particles):
            with pyro.poutine.block():
                trace = pyro.poutine.trace(InitMessenger(init_strategy)(self.model)).get_trace(
                    *self.model_args, **self.model_kwargs
                )
            draws.append(
                torch.cat(
                    [
                        s.transform.inv(trace.nodes[name]["value"]).detach().reshape(-1)
                        for name, s in self.layout.items()
                    ]
                )
            )
        return torch.stack(draws)

    def draw_subsamples(self, device) -> Dict[str, torch.Tensor]:
        """One fresh minibatch per subsampled plate, shared by all particles."""
        return {
            name: torch.randperm(size, device=device)[:subsample_size]
            for name, (size, subsample_size) in self.subsample_sizes.items()
        }

    def log_density(self, z: torch.Tensor, subsamples: Dict[str, torch.Tensor]) -> torch.Tensor:
        """Log joint plus log-Jacobian at one flat unconstrained particle ``z`` of shape (D,)."""
        values = {}
        log_jacobian = 0.0
        for name, s in self.layout.items():
            unconstrained = z[s.start : s.end].reshape(s.unconstrained_shape)
            value = s.transform(unconstrained)
            log_jacobian = log_jacobian + s.transform.log_abs_det_jacobian(unconstrained, value).sum()
            values[name] = value
        with _LogJointMessenger(values, subsamples) as joint:
            self.model(*self.model_args, **self.model_kwargs)
        return joint.log_joint + log_jacobian

    def log_density_and_grad(self, z: torch.Tensor, subsamples=None):
        """
        Log densities ``(L,)`` and their gradients ``(L, D)`` at particles ``z`` ``(L, D)``.

        A single particle runs the model directly; several run it once under
        :func:`torch.func.vmap`, so the model sees per-particle values of their usual shape.
        """
        if subsamples is None:
            subsamples = self.draw_subsamples(z.device)
        z = z.detach().requires_grad_(True)
        # Distribution argument checks branch on tensor values, which vmap cannot trace.
        with torch.enable_grad(), pyro.validation_enabled(False):
            if z.shape[0] == 1:
                log_density = self.log_density(z[0], subsamples).reshape(1)
            else:
                log_density = torch.func.vmap(
                    lambda particle: self.log_density(particle, subsamples),
                    randomness="different",
                )(z)
            (grad,) = torch.autograd.grad(log_density.sum(), z)
        return log_density.detach(), grad
