"""Vectorised log density of a Pyro model over L particles of its latent variables.

:func:`pyro.infer.mcmc.util.initialize_model` refuses models that subsample data with
``pyro.plate(..., subsample_size=...)``, which is exactly what stochastic-gradient MCMC
needs. :class:`ParticlePotential` builds the potential itself: latent sites are moved to
unconstrained space (with the log-Jacobian), the minibatch scaling ``N / |batch|`` comes
from the plates, and all particles are evaluated in one :func:`torch.func.vmap` pass that
shares one fresh subsample per plate and step.

The flat layout of the sites is :mod:`~pyro_ext.infer.potential.layout`'s, the data checks
run at set-up are :mod:`~pyro_ext.infer.potential.checks`', and the starting points come from
:mod:`~pyro_ext.infer.potential.init`.
"""

import numbers
import warnings
from typing import NamedTuple

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions.util import scale_and_mask
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample

from ...ops.validation import check_choice
from .arguments import check_per_particle, has_per_particle, select_particle, split_per_particle
from .checks import check_model_data, run_model_checked
from .init import declared_init_strategy, init_strategy_start, prior_scaled_start
from .layout import (
    DiscreteSite,
    SupportMap,
    _SiteLayout,
    constrain,
    constrain_with_log_jacobian,
    flatten,
    site_of,
    unconstrain,
    unflatten,
)


class GaussianPriors(NamedTuple):
    """Per-coordinate fixed Normal priors of a model (see :meth:`ParticlePotential.fixed_normal_priors`)."""

    #: ``(D,)`` prior precision, 0 where the prior is not a fixed Normal
    precision: torch.Tensor
    #: ``(D,)`` prior mean, 0 where the prior is not a fixed Normal
    mean: torch.Tensor
    #: ``(D,)`` bool, where the prior is a fixed Normal
    columns: torch.Tensor


class LogJointMessenger(Messenger):
    """
    Conditions a Pyro model on latent values and plate subsamples, and accumulates its
    scaled, masked log joint: the one messenger behind every potential of the package
    (:class:`ParticlePotential`, hence the SG-MCMC kernels and ARA training, and VIS).

    One light handler instead of ``condition`` + ``trace`` + ``block`` and a
    :class:`~pyro.poutine.Trace`: the sum equals :meth:`~pyro.poutine.Trace.log_prob_sum`
    of the conditioned trace, in the same order.

    :param dict values: latent site name -> value.
    :param dict subsamples: plate name -> subsample indices (plates absent draw their own).
    :param int particle_dims: ``None`` when one particle is evaluated (the log joint is a
        scalar), else the number of plate dims right of the particle dim, which are summed.
    :param bool strict: a latent site missing from ``values`` is an error (a model whose
        latent structure changed); otherwise it is sampled and scored as in the model.
    :param bool block: hide the model's sites from outer handlers (e.g. an ELBO's trace).
    :param exclude: latent sites whose log density is left out of the sum (a caller that
        accounts for their prior analytically; they are still conditioned on ``values``).
    :ivar log_joint: the accumulated log joint.
    :ivar dict scales: site name -> the scale Pyro's plates gave it.
    """

    def __init__(
        self, values, subsamples=None, particle_dims=None, strict=True, block=True, exclude=()
    ):
        super().__init__()
        self.exclude = frozenset(exclude)
        self.values = values
        self.subsamples = {} if subsamples is None else subsamples
        self.particle_dims = particle_dims
        self.strict = strict
        self.block = block
        self.log_joint = 0.0
        self.scales = {}

    def _process_message(self, msg):
        if self.block:
            msg["stop"] = True
        if msg["type"] != "sample":
            return
        name = msg["name"]
        if site_is_subsample(msg):
            if name in self.subsamples:
                msg["value"] = self.subsamples[name]
            return
        if msg["is_observed"]:
            return
        if name in self.values:
            msg["value"] = self.values[name]
            msg["is_observed"] = True
        elif self.strict:
            raise ValueError(
                f"latent site {name!r} did not appear when the model was set up; "
                "stochastic-gradient samplers need a model with static latent structure"
            )

    def _postprocess_message(self, msg):
        if msg["type"] != "sample":
            return
        name = msg["name"]
        if name in self.scales:
            raise RuntimeError(f"Multiple sample sites named {name!r}")
        self.scales[name] = msg["scale"]
        if site_is_subsample(msg) or msg["infer"].get("_deterministic") or name in self.exclude:
            return
        log_prob = msg["fn"].log_prob(msg["value"], *msg["args"], **msg["kwargs"])
        log_prob = scale_and_mask(log_prob, msg["scale"], msg["mask"])
        if self.particle_dims is None:
            log_prob = log_prob.sum()
        elif self.particle_dims:
            log_prob = log_prob.sum(tuple(range(-self.particle_dims, 0)))
        self.log_joint = self.log_joint + log_prob


def _subsampled_frames(site):
    return [
        f for f in site["cond_indep_stack"] if f.full_size is not None and f.full_size != f.size
    ]


VECTORIZE = ("auto", "vmap", "plate")


class ParticlePotential:
    """
    The log joint density of ``model`` as a function of ``L`` flat unconstrained particles:
    the one potential layer that the SG-MCMC kernels, their compiled step, VIS and ARA
    training share.

    The model is run once to read its latent sites, which are laid out side by side in a
    flat vector of ``D`` unconstrained coordinates (:meth:`unflatten`, :meth:`constrain`,
    :meth:`unconstrain`). The potential at particles ``z`` ``(L, D)`` is the scaled log
    joint plus the log-Jacobian of the maps to the sites' supports.

    :param callable model: a Pyro model with continuous latent sites and static structure.
    :param tuple model_args: positional arguments of ``model``; an argument wrapped in
        :class:`~pyro_ext.infer.potential.PerParticle` holds one value per particle along
        its leading dimension (particle ``k`` sees ``value[k]``; thesis Algorithm 3.2 gives
        each particle its own attacked data).
    :param dict model_kwargs: keyword arguments of ``model`` (:class:`PerParticle` too).
    :param str vectorize: how ``L > 1`` particles are evaluated in one pass.
        ``"vmap"``: :func:`torch.func.vmap` over a model written for one draw (any model
        whose operations vmap can batch); ``"plate"``: one run of the model inside a
        ``pyro.plate`` over particles (needs batch dimensions that broadcast, as
        :class:`pyro.infer.SVGD` does); ``"auto"`` (default): vmap, and if vmap cannot
        batch one of the model's operations (e.g. boolean masking), the plate, with a
        warning that names the vmap error. :attr:`vectorize` then tells which ran.
    :param discrete_sites: names of discrete latent sites that another move updates
        (:class:`~pyro_ext.infer.Gibbs`): they are left out of the flat coordinates, and
        every evaluation conditions them on the per-particle values its caller passes as
        ``conditioned`` (the potential holds no values of its own, so no caller writes
        into it).
    :param int max_support_size: the most values a discrete site's elements may take
        (each is enumerated by a Gibbs move).
    :param bool check_data: check the observed data at setup and on :meth:`set_data`
        (:func:`~pyro_ext.infer.potential.check_model_data`); ``False`` for a caller that
        handles NaN itself (the online filters skip missing observations and report NaN
        inputs with the step).
    :param exclude_log_prob: latent sites whose prior log density the potential leaves
        out, for a caller that adds it analytically (:class:`~pyro_ext.infer.NaturalGradientVI`
        does, for fixed Normal priors); empty by default. The sites are still conditioned
        on the particles' values.
    """

    def __init__(
        self,
        model,
        model_args=(),
        model_kwargs=None,
        vectorize="auto",
        discrete_sites=(),
        max_support_size=64,
        check_data=True,
        exclude_log_prob=(),
    ):
        check_choice(vectorize, "vectorize", VECTORIZE)
        self.check_data = bool(check_data)
        self.discrete_sites = tuple(discrete_sites)
        self.max_support_size = max_support_size
        #: name -> :class:`DiscreteSite` of the sites in ``discrete_sites``
        self.discrete_layout: dict[str, DiscreteSite] = {}
        self.model = model
        self.model_args = tuple(model_args)
        self.model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
        check_per_particle(self.model_args, self.model_kwargs)
        self.vectorize = None if vectorize == "auto" else vectorize
        #: latent sites whose prior log density the potential leaves out, for a caller that
        #: adds it analytically (:class:`~pyro_ext.infer.NaturalGradientVI` does, for fixed
        #: Normal priors); empty by default
        self.exclude_log_prob = frozenset(exclude_log_prob)
        self._read_structure()
        unknown = self.exclude_log_prob - set(self.layout) - set(self.discrete_layout)
        if unknown:
            raise ValueError(
                f"exclude_log_prob names {sorted(unknown)}, which are not latent sites of the "
                f"model (those are {list(self.layout) + list(self.discrete_layout)})"
            )
        self._checked_versions = self._versions(self.model_args, self.model_kwargs)

    def _particle_views(self, args, kwargs):
        """The arguments as each particle sees them: one view without
        :class:`PerParticle` arguments, one per particle with them."""
        if not has_per_particle(args, kwargs):
            return [(args, kwargs)]
        values, _ = split_per_particle(args, kwargs)
        return [select_particle(args, kwargs, k) for k in range(values[0].shape[0])]

    def _read_structure(self):
        """Run the model once: its latent sites' layout and its subsampled plates' sizes."""
        views = self._particle_views(self.model_args, self.model_kwargs)
        # A bad argument that breaks the run itself (empty data, a wrong length) is named.
        trace = run_model_checked(self.model, *views[0], nonfinite=self.check_data)
        previous = getattr(self, "layout", None)
        self.layout: dict[str, _SiteLayout] = {}
        self.discrete_layout = {}
        self._check_discrete_names(trace)
        if self.check_data:
            check_model_data(self.model, *views[0], trace)
            for view in views[1:]:
                check_model_data(self.model, *view, None)
        self.subsample_sizes: dict[str, tuple[int, int]] = {}
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
            frames = _subsampled_frames(site)
            if name in self.discrete_sites:
                self.discrete_layout[name] = self._discrete_site(name, site, frames)
                continue
            if fn.support.is_discrete:
                raise ValueError(
                    f"latent site {name!r} is discrete (support {fn.support}); gradient-based "
                    "samplers need continuous latent sites. Name it in the discrete_sites of "
                    "pyro_ext.infer.Gibbs, which moves it by Gibbs or Metropolis-Hastings "
                    "steps; or observe it, or marginalise it out of the model (e.g. with "
                    "pyro_ext.timeseries for hidden Markov chains)."
                )
            if frames:
                raise ValueError(
                    f"latent site {name!r} lies inside the subsampled plate {frames[0].name!r}; "
                    "stochastic-gradient samplers draw global latent variables only. Move "
                    "local latents out of subsampled plates or marginalise them."
                )
            support_map = SupportMap.of(fn)
            unconstrained = support_map.transform.inv(site["value"])
            size = unconstrained.numel()
            batch_ndim = site["value"].dim() - fn.event_dim
            self.layout[name] = _SiteLayout(
                start,
                start + size,
                unconstrained.shape,
                support_map,
                site["value"].shape[:batch_ndim],
            )
            start += size
        if not self.layout:
            raise ValueError("model has no latent sample sites to draw")
        self.dim = start
        plate_dims = [
            -f.dim
            for site in trace.nodes.values()
            if site["type"] == "sample"
            for f in site["cond_indep_stack"]
            if f.vectorized
        ]
        self.max_plate_nesting = max(plate_dims, default=0)
        self._trace = trace
        if previous is not None:
            before = {name: tuple(s.unconstrained_shape) for name, s in previous.items()}
            after = {name: tuple(s.unconstrained_shape) for name, s in self.layout.items()}
            if before != after:
                raise ValueError(
                    "set_data: the model's latent sites changed with the new data (sites and "
                    f"unconstrained shapes were {before}, are {after}); the particles cannot "
                    "carry over. Keep the latent sites' shapes independent of the data."
                )

    def _check_discrete_names(self, trace):
        for name in self.discrete_sites:
            site = trace.nodes.get(name)
            if site is None or site["type"] != "sample":
                raise ValueError(
                    f"discrete_sites names {name!r}, which is not a sample site of the model"
                )
            if site["is_observed"]:
                raise ValueError(
                    f"discrete_sites names {name!r}, an observed site; name latent sites only"
                )

    def _discrete_site(self, name, site, frames):
        """Validate one site of ``discrete_sites`` and read its support."""
        fn = site["fn"]
        if not fn.support.is_discrete:
            raise ValueError(
                f"discrete_sites names {name!r}, a continuous site (support {fn.support}); "
                "the inner gradient kernel samples continuous sites, leave it out"
            )
        if frames:
            raise ValueError(
                f"discrete site {name!r} lies inside the subsampled plate {frames[0].name!r}; "
                "a Gibbs move needs every element's full conditional, so it cannot follow a "
                "site that changes with the minibatch. Draw it outside subsampled plates."
            )
        base = fn
        while isinstance(base, (torch.distributions.Independent, dist.MaskedDistribution)):
            base = base.base_dist
        if not base.has_enumerate_support or base.event_shape != ():
            raise ValueError(
                f"discrete site {name!r} ({type(base).__name__}) cannot be enumerated element "
                "by element; Gibbs moves need an enumerable distribution with scalar events "
                "(Bernoulli, Categorical, Binomial), possibly with .to_event()"
            )
        support = base.enumerate_support(expand=False).reshape(-1)
        # A batched distribution enumerates the union of its elements' supports; Bernoulli
        # and Categorical share one, which is what the moves assume.
        if support.numel() > self.max_support_size:
            raise ValueError(
                f"discrete site {name!r} takes {support.numel()} values, more than "
                f"max_support_size={self.max_support_size}; every Gibbs move evaluates the "
                "model once per value. Raise max_support_size, or reparametrise the site"
            )
        value = site["value"]
        batch_ndim = value.dim() - fn.event_dim
        return DiscreteSite(tuple(value.shape), value.shape[:batch_ndim], support, value.dtype)

    def conditioning(self, conditioned) -> dict[str, torch.Tensor]:
        """``conditioned`` (``None``: none) checked to hold every discrete site: an
        evaluation without them would draw them from the model instead."""
        conditioned = {} if conditioned is None else conditioned
        missing = [name for name in self.discrete_layout if name not in conditioned]
        if missing:
            raise ValueError(
                f"conditioned has no values for the discrete site(s) {missing}; the potential "
                "of a model with discrete sites is evaluated at given values of them "
                "(Gibbs passes its current ones)"
            )
        return conditioned

    @staticmethod
    def _shapes(args, kwargs):
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))
        return [tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in leaves]

    def set_data(self, *args, **kwargs):
        """
        Evaluate the model on new arguments from now on (the next minibatch, new data).
        When the tensors change shape the model is run once more to read its plate sizes
        (the latent sites must stay the same); a compiled step keeps its compiled code as
        long as the shapes stay.
        """
        check_per_particle(args, kwargs)
        reshaped = self._shapes(args, kwargs) != self._shapes(self.model_args, self.model_kwargs)
        if not reshaped and self.check_data and not self._same_data(args, kwargs):
            # Run on the new data: the trace of the old holds the old observations.
            for view in self._particle_views(args, kwargs):
                check_model_data(self.model, *view, None)
        self.model_args, self.model_kwargs = tuple(args), dict(kwargs)
        if reshaped:
            self._read_structure()
        self._checked_versions = self._versions(args, kwargs)

    @staticmethod
    def _versions(args, kwargs):
        """Each argument leaf with its version counter (bumped by every in-place change)."""
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))
        return [(x, x._version if isinstance(x, torch.Tensor) else None) for x in leaves]

    def _same_data(self, args, kwargs) -> bool:
        """
        Whether ``args``/``kwargs`` are the very objects already checked, unmodified since:
        a loop that passes the whole data set at every step (``vi.step(x, y)``) then pays
        for its check once, not once per step (a scan of MNIST's 47 million pixels costs
        more than the step).
        """
        checked, current = self._checked_versions, self._versions(args, kwargs)
        if len(checked) != len(current):
            return False
        for (old, old_version), (new, new_version) in zip(checked, current):
            if isinstance(new, torch.Tensor):
                if new is not old or new_version != old_version:
                    return False
            elif new is not old:
                try:  # a number or string equal to the old one; an array compares ambiguously
                    if type(new) is not type(old) or not bool(new == old):
                        return False
                except (TypeError, ValueError, RuntimeError):
                    return False
        return True

    def run_model(self, args=None, kwargs=None):
        """Run the model on ``args``/``kwargs`` (default: the current data), under the caller's handlers."""
        args, kwargs = self._shared_arguments(
            args,
            kwargs,
            "only a vectorised evaluation over the particles (log_density_all) or one "
            "particle's evaluation maps them; this method runs the model once for all particles",
        )
        self.model(*args, **kwargs)

    def _shared_arguments(self, args, kwargs, why):
        """``args``/``kwargs`` (default: the current data), refused if they hold
        :class:`PerParticle` values, with ``why``."""
        if args is None:
            args, kwargs = self.model_args, self.model_kwargs
        if has_per_particle(args, kwargs):
            raise ValueError(f"the model's arguments hold PerParticle values: {why}")
        return args, kwargs

    def fixed_normal_priors(self, point: torch.Tensor) -> "GaussianPriors":
        """
        The prior precision and mean of every coordinate whose site has a fixed Normal
        prior (``Normal(loc, scale)``, possibly expanded and ``.to_event``, with parameters
        that depend on no latent, unscaled and unmasked); 0 elsewhere. Read by running the
        model once at the flat unconstrained ``point`` ``(D,)`` (the other sites' values
        there decide whether a site's parameters depend on them).
        """
        precision, prior_mean = torch.zeros_like(point), torch.zeros_like(point)
        gaussian = torch.zeros_like(point, dtype=torch.bool)
        values = self.constrain(point.detach().requires_grad_())
        subsamples = {
            name: torch.arange(subsample_size, device=point.device)
            for name, (_, subsample_size) in self.subsample_sizes.items()
        }
        with (
            torch.enable_grad(),
            pyro.validation_enabled(False),
            pyro.poutine.trace() as tracer,
            LogJointMessenger(values, subsamples, block=False),
        ):
            self.run_model(None, None)
        for name, layout in self.layout.items():
            site = tracer.trace.nodes[name]
            fn = site["fn"]
            while isinstance(fn, torch.distributions.Independent):
                fn = fn.base_dist
            fixed_normal = (
                isinstance(fn, torch.distributions.Normal)
                and layout.is_real
                and not (fn.loc.requires_grad or fn.scale.requires_grad)
                and isinstance(site["scale"], numbers.Real)
                and site["scale"] == 1
                and site["mask"] is None
            )
            if not fixed_normal:
                continue
            shape = layout.unconstrained_shape
            columns = slice(layout.start, layout.end)
            precision[columns] = fn.scale.detach().expand(shape).reshape(-1).pow(-2)
            prior_mean[columns] = fn.loc.detach().expand(shape).reshape(-1)
            gaussian[columns] = True
        return GaussianPriors(precision, prior_mean, gaussian)

    def site_marginals(self, mean, scale, sample_flat, num_samples=4096) -> dict:
        """
        ``{site: (loc, scale)}`` in constrained space of a Gaussian over the flat
        unconstrained coordinates with marginal ``mean`` and ``scale`` ``(D,)``: exact for
        real-valued sites; sites with a constrained support from ``num_samples`` joint
        draws ``sample_flat(num_samples, generator)`` ``(S, D)`` of a fixed seed (leaving
        the global random state alone). Shared by the variational posteriors
        (:class:`~pyro_ext.infer.NaturalGradientVI`, :class:`~pyro_ext.online.BONG`).
        """
        locs, scales = self.unflatten(mean), self.unflatten(scale)
        result, draws = {}, None
        for name, layout in self.layout.items():
            if layout.is_real:
                result[name] = (locs[name], scales[name])
                continue
            if draws is None:
                generator = torch.Generator(device=mean.device).manual_seed(0)
                with torch.no_grad():
                    draws = self.constrain(sample_flat(num_samples, generator))
            result[name] = (draws[name].mean(0), draws[name].std(0))
        return result

    @property
    def transforms(self) -> dict[str, torch.distributions.Transform]:
        """Constrained-to-unconstrained transforms, as :class:`pyro.infer.MCMC` expects."""
        return {name: site.transform.inv for name, site in self.layout.items()}

    def site_of(self, column: int) -> str:
        """The site whose columns hold flat coordinate ``column``."""
        return site_of(self.layout, column)

    def unflatten(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """Split flat particles ``(..., D)`` into unconstrained site values."""
        return unflatten(self.layout, z)

    def constrain(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """Constrained site values at flat unconstrained particles ``z`` ``(..., D)``."""
        return constrain(self.layout, z)

    def unconstrain(self, values: dict[str, torch.Tensor], num_particles: int) -> torch.Tensor:
        """Flat unconstrained particles ``(L, D)`` from constrained site values."""
        return unconstrain(self.layout, values, num_particles)

    def log_jacobian(self, z: torch.Tensor) -> torch.Tensor:
        """``log|d constrain / dz|`` at particles ``z`` ``(..., D)``, shape ``(...)``."""
        return self._constrain(z)[1]

    def flatten(self, values: dict[str, torch.Tensor], num_particles: int) -> torch.Tensor:
        """Inverse of :meth:`unflatten`; values without a particle dim are broadcast."""
        return flatten(self.layout, values, num_particles)

    def declared_init_strategy(self):
        """
        The start the model declares, or ``None``: ``model.default_init_strategy(*args,
        **kwargs)`` when the model has that method (:class:`~pyro_ext.models.BayesianMLP`
        has), otherwise the first sample site whose ``infer`` dict holds a
        ``"default_init_strategy"`` factory (called with no arguments). The second form lets
        a module declare its start from inside a model that wraps it, as in
        ``SGLD(lambda x, y: net(x, y, subsample_size=64), ...)``.
        """
        return declared_init_strategy(self.model, self.model_args, self.model_kwargs, self._trace)

    def initial_particles(self, num_particles: int, init_strategy=None, radius=2.0) -> torch.Tensor:
        """
        Draw ``num_particles`` flat unconstrained starting points by running a Pyro
        ``init_strategy`` once per particle. Without one, the model's declared start
        (:meth:`declared_init_strategy`); otherwise the prior-scaled start: each
        unconstrained coordinate uniformly in ``median ± radius * scale``, with the
        median and the robust scale (capped at 1) of that coordinate under its prior
        (:func:`~pyro_ext.infer.potential.init.prior_center_and_spread`), and, for a median
        inside Pyro's box ``(-radius, radius)``, within that box. For a unit-scale prior
        centred at zero this is Pyro's :func:`~pyro.infer.autoguide.init_to_uniform`; a
        ``Normal(0, 0.1)`` weight starts in ``(-0.2, 0.2)`` instead of up to 20 prior
        standard deviations out, and a ``Normal(5, 0.1)`` one in ``(4.8, 5.2)``.
        """
        if init_strategy is None:
            init_strategy = self.declared_init_strategy()
        if init_strategy is None:
            return prior_scaled_start(self.layout, self._trace, num_particles, radius)
        return init_strategy_start(
            self.model,
            self.model_args,
            self.model_kwargs,
            self.layout,
            num_particles,
            init_strategy,
        )

    def draw_subsamples(self, device) -> dict[str, torch.Tensor]:
        """One fresh minibatch per subsampled plate, shared by all particles."""
        return {
            name: torch.randperm(size, device=device)[:subsample_size]
            for name, (size, subsample_size) in self.subsample_sizes.items()
        }

    def _constrain(self, z: torch.Tensor):
        """Site values and the summed log-Jacobian at particles ``z`` of shape ``(..., D)``."""
        return constrain_with_log_jacobian(self.layout, z)

    def log_density(
        self,
        z: torch.Tensor,
        subsamples: dict[str, torch.Tensor],
        args=None,
        kwargs=None,
        conditioned=None,
    ) -> torch.Tensor:
        """
        Log joint plus log-Jacobian at one flat unconstrained particle ``z`` of shape (D,),
        on the model arguments ``args``/``kwargs`` (default: the current data), with the
        discrete sites at ``conditioned`` (that particle's values; needed when the model has
        discrete sites).
        """
        values, log_jacobian = self._constrain(z)
        values.update(self.conditioning(conditioned))
        with LogJointMessenger(values, subsamples, exclude=self.exclude_log_prob) as joint:
            self.run_model(args, kwargs)
        return joint.log_joint + log_jacobian

    def log_density_plate(
        self, z: torch.Tensor, subsamples, args=None, kwargs=None, conditioned=None
    ) -> torch.Tensor:
        """
        Log densities ``(L,)`` at particles ``z`` ``(L, D)`` by running the model once
        inside a ``pyro.plate`` over particles (the way :class:`pyro.infer.SVGD`
        vectorises); needs a model whose batch dimensions broadcast.
        """
        args, kwargs = self._shared_arguments(
            args,
            kwargs,
            "they need vectorize='vmap'; a particle pyro.plate runs the model once, on the "
            "same arguments for every particle",
        )
        num_particles, nesting = z.shape[0], self.max_plate_nesting
        values, log_jacobian = self._constrain(z)
        values.update(self.conditioning(conditioned))
        batch_shapes = {name: s.batch_shape for name, s in self.layout.items()}
        batch_shapes.update({name: s.batch_shape for name, s in self.discrete_layout.items()})
        for name, batch_shape in batch_shapes.items():
            if len(batch_shape) > nesting:
                raise ValueError(
                    f"site {name!r} has batch shape {tuple(batch_shape)} outside any "
                    "pyro.plate; declare its dimensions with .to_event() or a plate"
                )
            pad = (1,) * (nesting - len(batch_shape))
            values[name] = values[name].reshape((num_particles,) + pad + values[name].shape[1:])
        with LogJointMessenger(
            values, subsamples, particle_dims=nesting, exclude=self.exclude_log_prob
        ) as joint:
            with pyro.plate("_pyro_ext_particles", num_particles, dim=-nesting - 1):
                self.run_model(args, kwargs)
        return joint.log_joint.reshape(-1).expand(num_particles) + log_jacobian

    def nonfinite_sites(self, z: torch.Tensor, subsamples, conditioned=None, particle=0) -> list:
        """Names of sites whose log density (or log-Jacobian) is not finite at particle ``z``
        (with the discrete sites at ``conditioned``, that particle's values; its
        :class:`PerParticle` arguments at index ``particle``)."""
        bad = []
        args, kwargs = self.model_args, self.model_kwargs
        if has_per_particle(args, kwargs):
            args, kwargs = select_particle(args, kwargs, particle)
        with torch.no_grad(), pyro.validation_enabled(False):
            values = {}
            for name, s in self.layout.items():
                unconstrained = z[s.start : s.end].reshape(s.unconstrained_shape)
                values[name] = s.transform(unconstrained)
                if not torch.isfinite(
                    s.transform.log_abs_det_jacobian(unconstrained, values[name])
                ).all():
                    bad.append(name)
            values.update(self.conditioning(conditioned))
            with pyro.poutine.trace() as tracer, LogJointMessenger(values, subsamples, block=False):
                self.run_model(args, kwargs)
            for name, site in tracer.trace.nodes.items():
                if site["type"] == "sample" and not site_is_subsample(site):
                    log_prob = site["fn"].log_prob(site["value"], *site["args"], **site["kwargs"])
                    if not torch.isfinite(log_prob).all() and name not in bad:
                        bad.append(name)
        return bad

    def _log_density_vmap(self, z, subsamples, args=None, kwargs=None, conditioned=None):
        if args is None:
            args, kwargs = self.model_args, self.model_kwargs
        # PerParticle arguments are mapped with the particles; the rest are shared.
        per_particle, rebuild = split_per_particle(args, kwargs)
        return torch.func.vmap(
            lambda particle, values, slices: self.log_density(
                particle, subsamples, *rebuild(slices), values
            ),
            randomness="different",
        )(z, conditioned, per_particle)

    def log_density_all(self, z, subsamples, args=None, kwargs=None, conditioned=None):
        """
        Log densities ``(L,)`` at particles ``z`` ``(L, D)``: one particle runs the model
        directly, several are vectorised as :attr:`vectorize` says. The discrete sites take
        the per-particle values ``conditioned`` ``{site: (L, ...)}`` (needed when the model
        has discrete sites). Differentiable; the caller disables value checks (they branch
        on tensor values).
        """
        conditioned = self.conditioning(conditioned)
        if args is None:
            args, kwargs = self.model_args, self.model_kwargs
        check_per_particle(args, kwargs, z.shape[0])
        if z.shape[0] == 1:
            single = {name: value[0] for name, value in conditioned.items()}
            if has_per_particle(args, kwargs):
                args, kwargs = select_particle(args, kwargs, 0)
            return self.log_density(z[0], subsamples, args, kwargs, single).reshape(1)
        if self.vectorize == "vmap":
            return self._log_density_vmap(z, subsamples, args, kwargs, conditioned)
        if self.vectorize == "plate":
            return self.log_density_plate(z, subsamples, args, kwargs, conditioned)
        # vectorize="auto", first call: vmap runs any model written for one draw, unless
        # it uses an operation vmap cannot batch; then a particle plate, said aloud.
        try:
            log_density = self._log_density_vmap(z, subsamples, args, kwargs, conditioned)
            self.vectorize = "vmap"
        except RuntimeError as vmap_error:
            try:
                log_density = self.log_density_plate(z, subsamples, args, kwargs, conditioned)
            except Exception as plate_error:
                raise RuntimeError(
                    "could not evaluate the particles in one vectorised pass. "
                    f"torch.func.vmap failed with: {vmap_error}; a particle pyro.plate "
                    f"failed with: {plate_error}"
                ) from plate_error
            warnings.warn(
                f"vectorize='auto': torch.func.vmap cannot batch this model ({vmap_error}); "
                "its particles are evaluated under a particle pyro.plate instead. Pass "
                "vectorize='plate' to choose that explicitly.",
                RuntimeWarning,
                stacklevel=2,
            )
            self.vectorize = "plate"
        return log_density

    def log_density_and_grad(self, z: torch.Tensor, subsamples=None, conditioned=None):
        """
        Log densities ``(L,)`` and their gradients ``(L, D)`` at particles ``z`` ``(L, D)``,
        the discrete sites (if any) at the per-particle values ``conditioned``.

        A single particle runs the model directly. Several run it once: under
        :func:`torch.func.vmap` (the model sees per-particle values of their usual shape)
        or inside a particle plate (see ``vectorize``).
        """
        if subsamples is None:
            subsamples = self.draw_subsamples(z.device)
        z = z.detach().requires_grad_(True)
        # Distribution argument checks branch on tensor values, which vmap cannot trace.
        with torch.enable_grad(), pyro.validation_enabled(False):
            log_density = self.log_density_all(z, subsamples, conditioned=conditioned)
            (grad,) = torch.autograd.grad(log_density.sum(), z)
        return log_density.detach(), grad
