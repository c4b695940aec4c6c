"""Where the particles start: the start a model declares, a Pyro init strategy run once per
particle, or the prior-scaled start (each unconstrained coordinate uniformly around its
prior's centre, within a width set by the prior's scale). Functions of the model and its
set-up trace and layout; :meth:`ParticlePotential.initial_particles
<pyro_ext.infer.potential.ParticlePotential.initial_particles>` picks among them.
"""

import pyro
import torch
from pyro.infer.autoguide.initialization import InitMessenger

from .layout import _SiteLayout


def declared_init_strategy(model, model_args, model_kwargs, trace):
    """
    The start the model declares, or ``None``: ``model.default_init_strategy(*args,
    **kwargs)`` when the model has that method (:class:`~pyro_ext.models.BayesianMLP`
    has), otherwise the first sample site of ``trace`` (the model's set-up trace) whose
    ``infer`` dict holds a ``"default_init_strategy"`` factory (called with no arguments).
    The second form lets a module declare its start from inside a model that wraps it, as
    in ``SGLD(lambda x, y: net(x, y, subsample_size=64), ...)``.
    """
    declared = getattr(model, "default_init_strategy", None)
    if callable(declared):
        return declared(*model_args, **model_kwargs)
    for site in trace.nodes.values():
        factory = site.get("infer", {}).get("default_init_strategy")
        if site["type"] == "sample" and callable(factory):
            return factory()
    return None


def prior_center_and_spread(layout: dict[str, _SiteLayout], trace, name: str, num_draws: int = 256):
    """
    Per unconstrained coordinate of site ``name``: the centre and scale of its prior
    (the scale at most 1). A real-valued site with a finite mean and standard
    deviation gives those; otherwise the median and the interquartile range / 1.349
    of ``num_draws`` prior draws (fewer for large sites), moved to unconstrained
    space; ``(0, 1)`` where the prior cannot be sampled or its draws are not finite.
    A prior that depends on other latent sites is taken at the set-up ``trace``'s values
    of those.
    """
    s = layout[name]
    fn = trace.nodes[name]["fn"]
    like = trace.nodes[name]["value"]
    center = like.new_zeros(s.end - s.start)
    spread = like.new_ones(s.end - s.start)
    if s.is_real:
        try:
            mean = fn.mean.expand(like.shape).reshape(-1).to(like.dtype)
            sd = fn.stddev.expand(like.shape).reshape(-1).to(like.dtype)
        except NotImplementedError:  # no analytic moments (a TransformedDistribution)
            mean = sd = None
        if mean is not None and bool(torch.isfinite(mean).all() & torch.isfinite(sd).all()):
            ok = sd > 0
            return torch.where(ok, mean, center), torch.where(ok, sd.clamp(max=1.0), spread)
    num_draws = max(8, min(num_draws, (1 << 22) // max(1, s.end - s.start)))
    try:
        with torch.no_grad():
            draws = fn.sample((num_draws,))
            draws = s.transform.inv(draws).reshape(num_draws, -1).to(like.dtype)
    except NotImplementedError:  # a distribution that cannot draw more than one value
        return center, spread
    if draws.shape[-1] != center.numel():
        return center, spread
    quartiles = torch.quantile(draws, draws.new_tensor([0.25, 0.5, 0.75]), dim=0)
    robust_scale = ((quartiles[2] - quartiles[0]) / 1.349).clamp(max=1.0)
    ok = torch.isfinite(quartiles).all(0) & (robust_scale > 0)
    return torch.where(ok, quartiles[1], center), torch.where(ok, robust_scale, spread)


def prior_scaled_start(
    layout: dict[str, _SiteLayout], trace, num_particles: int, radius=2.0
) -> torch.Tensor:
    """
    ``num_particles`` flat unconstrained starting points ``(L, D)``, each unconstrained
    coordinate uniformly in ``median ± radius * scale`` of its prior
    (:func:`prior_center_and_spread`), and, for a median inside Pyro's box ``(-radius,
    radius)``, within that box (see
    :meth:`~pyro_ext.infer.potential.ParticlePotential.initial_particles`).
    """
    columns = []
    for name in layout:
        center, spread = prior_center_and_spread(layout, trace, name)
        low, high = center - radius * spread, center + radius * spread
        # Inside Pyro's box (-radius, radius) only narrower, never wider: a noise
        # scale started far below its usual start gives a first gradient of order
        # 1 / scale^2 that throws the chain out; a prior centred outside the box
        # moves the whole interval.
        inside = center.abs() < radius
        low = torch.where(inside, low.clamp(min=-radius), low)
        high = torch.where(inside, high.clamp(max=radius), high)
        u = torch.rand(num_particles, center.numel(), dtype=center.dtype, device=center.device)
        columns.append(low + u * (high - low))
    return torch.cat(columns, -1)


def init_strategy_start(
    model, model_args, model_kwargs, layout: dict[str, _SiteLayout], num_particles, init_strategy
) -> torch.Tensor:
    """``num_particles`` flat unconstrained starting points ``(L, D)`` from running the
    Pyro ``init_strategy`` once per particle."""
    draws = []
    for _ in range(num_particles):
        with pyro.poutine.block():
            trace = pyro.poutine.trace(InitMessenger(init_strategy)(model)).get_trace(
                *model_args, **model_kwargs
            )
        draws.append(
            torch.cat(
                [
                    s.transform.inv(trace.nodes[name]["value"]).detach().reshape(-1)
                    for name, s in layout.items()
                ]
            )
        )
    return torch.stack(draws)
