r"""
Variationally inferred sampling (VIS), thesis section 2.4 and appendix 2.A.

A tractable base guide :math:`q_{0,\phi}` is refined by ``T`` steps of a gradient-based
sampler :math:`Q_{\eta,T}` on the model's log joint, giving the refined approximation of
eq. (2.9)

.. math:: q_{\phi,\eta}(z) = \int Q_{\eta,T}(z | z_0)\, q_{0,\phi}(z_0)\, dz_0 .

Sampling from it is easy; its log density is not, so the refined ELBO (2.10) uses one of
the thesis' approximations of :math:`\log q_{\phi,\eta}(z_T)`:

* ``"particle"`` (VIS-P): a Dirac at :math:`z_T`, regularised by the entropy of
  :math:`q_0`, i.e. :math:`\log q(z_T) := \log q_0(z_0)`;
* ``"mc"`` (VIS-MC, SGLD only): the chain :math:`z_{0:T}` as auxiliary variables. The
  thesis takes :math:`\log q(z_T) \approx \log q_0(z_0) + \sum_t \log q(z_t | z_{t-1})`
  with the SGLD kernel :math:`q(z_t | z_{t-1}) = \mathcal N(z_t | z_{t-1} + \eta
  \nabla\log p(z_{t-1}), 2\eta I)`. Without a reverse kernel that objective is not a
  lower bound on :math:`\log p(x)`: it grows like :math:`\tfrac{TD}{2}\log\eta`, and a
  learned step size runs away (on the VAE of table 2.7, :math:`\eta` went from 1e-3 to
  0.07 with a training "ELBO" above :math:`\log p(x)`). We implement instead the
  auxiliary-variable bound of Salimans, Kingma & Welling (2015, "Markov chain Monte
  Carlo and variational inference: bridging the gap"),

  .. math:: \mathbb E\Big[\log p(x, z_T) + \sum_t \log r(z_{t-1} | z_t) - \log q_0(z_0)
            - \sum_t \log q(z_t | z_{t-1})\Big] \le \log p(x),

  valid for any reverse kernel :math:`r`, here the Langevin kernel run backwards,
  :math:`r(z_{t-1} | z_t) = \mathcal N(z_{t-1} | z_t + \eta\nabla\log p(z_t), 2\eta I)`
  (one extra gradient, at :math:`z_T`). That is :math:`\log q(z_T) := \log q_0(z_0) +
  \sum_t [\log q(z_t | z_{t-1}) - \log r(z_{t-1} | z_t)]`; the :math:`\log\eta`
  normalising constants cancel, so the step size can be learned;
* ``"gaussian"`` (VIS-G): :math:`z \sim \mathcal N(z_T, \sigma_\phi)` with a learnable
  scale :math:`\sigma_\phi` per site;
* ``"fokker_planck"`` (VIS-FP): the deterministic flow of eq. (2.11),
  :math:`z_t = z_{t-1} + \eta(\nabla\log p - \nabla\log q_t)(z_{t-1})`, with the RBF
  kernel estimate of :math:`\nabla\log q_t` over the particles (appendix 2.A), and the
  VIS-P regulariser :math:`\log q_0(z_0)`.

The sampler runs in unconstrained space on :math:`\log p(x, z) + \log|J|`, so every log
density above is one of unconstrained values; the guide reports it for the constrained
value by subtracting :math:`\log|J(u_T)|` (and :math:`\log q_0` is read off the base guide
in constrained space, hence the :math:`+ \log|J(u_0)|`).

``gradient="full"`` backpropagates through the ``T`` steps (the step size :math:`\eta`
is learned from the refined ELBO), ``gradient="fast"`` uses eq. (2.13),
:math:`z_T = z_0 + \mathrm{stop\_grad}(\sum_t \Delta z_t)`.
"""

from contextlib import ExitStack

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from pyro.distributions.util import sum_rightmost
from pyro.infer.mcmc.util import TraceEinsumEvaluator
from pyro.infer.svgd import SteinKernel
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample
from torch.distributions import constraints

from ..ops.validation import check_choice, check_int, check_positive
from .sgmcmc.potential import LogJointMessenger, SupportMap, check_model_data
from .sgmcmc.repulsion import RBFKernel, stein_coupling
from .sgmcmc.updates import get_sampler

#: VIS's sampler names; each is an entry of :data:`~pyro_ext.infer.sgmcmc.updates.SAMPLERS`
#: (``"svgd"`` is ``"sgd"`` with a kernel).
SAMPLERS = ("sgd", "sgld", "sghmc", "adam", "svgd")
_REGISTRY_NAME = {"svgd": "sgd"}
ENTROPIES = ("particle", "mc", "gaussian", "fokker_planck")
GRADIENTS = ("full", "fast")


def fokker_planck_score(kernel, z):
    r"""
    The kernel estimate of :math:`-\nabla\log q(z_m)` at particles ``z`` ``(L, D)``
    (appendix 2.A), with :math:`\nabla_{z_m} K(z_m, z_n) = -\frac2h (z_m - z_n) K_{mn}`::

        - sum_n grad K(z_m, z_n) / sum_n K_mn  -  sum_l grad K(z_m, z_l) / sum_n K_nl
    """
    matrix, h = kernel.gram(z)
    mass = matrix.sum(-1, keepdim=True)  # K is symmetric: row sums = column sums
    own = z - matrix @ z / mass
    others = z * (matrix @ mass.reciprocal()) - matrix @ (z / mass)
    return (2.0 / h) * (own + others)


def _log_forward_over_reverse(step_size, grad, previous_grad, noise):
    r"""
    :math:`\log q(z_t | z_{t-1}) - \log r(z_{t-1} | z_t)`, elementwise, for one SGLD step
    :math:`z_t = z_{t-1} + \eta g_{t-1} + \sqrt{2\eta}\,\epsilon` (``previous_grad`` =
    :math:`g_{t-1}`, ``grad`` = :math:`g_t`, ``noise`` = :math:`\epsilon`)::

        log q = -eps^2 / 2                                   - log(4 pi eta) / 2
        log r = -(z_{t-1} - z_t - eta g_t)^2 / (4 eta)       - log(4 pi eta) / 2
              = -(eta (g_{t-1} + g_t) + sqrt(2 eta) eps)^2 / (4 eta) - log(4 pi eta) / 2

    so with :math:`G = g_{t-1} + g_t` the difference is :math:`\eta G^2 / 4 +
    \sqrt{\eta/2}\,\epsilon G`: the normalising constants and :math:`\epsilon^2` cancel
    exactly (and :math:`z_{t-1} - z_t` is never formed, which would lose precision).
    """
    total = previous_grad + grad
    return 0.25 * step_size * total.pow(2) + torch.sqrt(0.5 * step_size) * noise * total


def refine(
    z0,
    grad_fn,
    step_size,
    num_steps,
    sampler="sgd",
    kernel=None,
    fokker_planck=False,
    friction=0.1,
    track_density=False,
    fast=False,
):
    r"""
    Run ``num_steps`` sampler steps from particles ``z0`` ``(L, D)`` (unconstrained).

    :param callable grad_fn: ``(z, create_graph) -> grad`` of the log joint, ``(L, D)``.
    :param torch.Tensor step_size: the step size :math:`\eta` (0-dim).
    :param str sampler: one of :data:`SAMPLERS`; ``"sgd"`` and ``"svgd"`` are noise-free.
    :param kernel: a :class:`~pyro.infer.svgd.SteinKernel` coupling the particles (SVGD,
        or the repulsion of the SG-MCMC samplers), or the kernel of the VIS-FP estimate.
    :param bool fokker_planck: add the VIS-FP term :func:`fokker_planck_score` (eq. 2.11).
    :param bool track_density: also return the auxiliary-variable entropy terms of
        VIS-MC (SGLD only), elementwise ``(L, D)``:
        :math:`\sum_t \log q(z_t | z_{t-1}) - \log r(z_{t-1} | z_t)` with the forward
        kernel :math:`q = \mathcal N(z_{t-1} + \eta g(z_{t-1}), 2\eta I)` and the
        reverse Langevin kernel :math:`r = \mathcal N(z_t + \eta g(z_t), 2\eta I)`,
        :math:`g` = ``grad_fn``. This costs one more gradient, at :math:`z_T`.
    :param bool fast: eq. (2.13): return :math:`z_0 + \mathrm{stop\_grad}(z_T - z_0)`.
    :returns: ``(z_T, log_density)``, ``log_density`` ``None`` unless ``track_density``.
    """
    if track_density and (sampler != "sgld" or kernel is not None or fokker_planck):
        raise ValueError("track_density needs sampler='sgld' without a kernel")
    if fast:
        step_size, z = step_size.detach(), z0.detach()
    else:
        z = z0
    log_density = torch.zeros_like(z0) if track_density else None
    registered = get_sampler(_REGISTRY_NAME.get(sampler, sampler))
    hyper = {"friction": friction} if sampler == "sghmc" else {}
    # The chain starts at rest (zero momenta), a deterministic function of z0.
    state = registered.init_state(z, step_size, 1.0, at_rest=True, **hyper)
    noisy = sampler not in ("sgd", "svgd")
    pending = None  # VIS-MC: (g(z_{t-1}), noise_t) of the last step, awaiting g(z_t)
    for _ in range(num_steps):
        grad = grad_fn(state.z, not fast)
        if pending is not None:
            log_density = log_density + _log_forward_over_reverse(step_size, grad, *pending)
            pending = None
        if fokker_planck:
            grad = grad + fokker_planck_score(kernel, state.z)
            coupling = None
        else:
            coupling = None if kernel is None else stein_coupling(kernel, state.z)
        noise = torch.randn_like(state.z) if noisy else None
        state = registered.update(state, grad, step_size, noise, coupling, 1.0, True, **hyper)
        if track_density:
            pending = grad, noise
    z = state.z
    if pending is not None:
        # The reverse kernel of the last step needs the gradient at z_T.
        log_density = log_density + _log_forward_over_reverse(
            step_size, grad_fn(z, not fast), *pending
        )
    if fast:
        z = z0 + (z - z0.detach())
    return z, log_density


class _HideAndRecord(Messenger):
    """
    Records the base guide's sample sites and hides them from outer traces, while outer
    plates (e.g. a vectorised particle plate) still act on them.
    """

    def __init__(self):
        super().__init__()
        self.sites = {}

    def _process_message(self, msg):
        if msg["type"] == "sample" and not msg["is_observed"]:
            msg["infer"] = dict(msg["infer"], _do_not_trace=True, is_auxiliary=True)

    def _postprocess_message(self, msg):
        if msg["type"] == "sample" and not msg["is_observed"]:
            self.sites[msg["name"]] = msg.copy()


def _is_one(scale):
    return isinstance(scale, (int, float)) and scale == 1.0


class _Site:
    """
    A refined latent site: its :class:`~.sgmcmc.potential.SupportMap` and its layout in
    the flat particles. The layout follows the base guide's draw, not the model's global
    sites as :class:`~.sgmcmc.potential.ParticlePotential` does: a local latent of a
    subsampled plate takes the batch's shape, and a guide plate holds the particles.
    """

    def __init__(self, name, base, model_site, particle_dim, num_particles):
        self.name, self.base = name, base
        self.support_map = SupportMap.of(model_site["fn"])
        self.transform = self.support_map.transform
        self.event_dim = self.support_map.event_dim
        self.u_event_dim = self.support_map.unconstrained_event_dim
        u0 = self.transform.inv(base["value"])
        self.shape = u0.shape
        # Rows are particles: the particle plate's dim moves first (L = 1 without one).
        if particle_dim is None:
            self.pos = None
            self.moved_shape = (1,) + u0.shape
        else:
            self.pos = u0.dim() + particle_dim - self.u_event_dim
            if self.pos < 0 or u0.shape[self.pos] != num_particles:
                raise ValueError(
                    f"site {name!r} of the base guide does not vary along the particle plate"
                )
            self.moved_shape = u0.movedim(self.pos, 0).shape
        self.numel = u0.numel() // num_particles
        self.u0 = u0

    def rows(self, u):
        if self.pos is None:
            return u.reshape(1, -1)
        return u.movedim(self.pos, 0).reshape(self.moved_shape[0], -1)

    def unrows(self, rows):
        u = rows.reshape(self.moved_shape)
        return u[0] if self.pos is None else u.movedim(0, self.pos)

    def log_jacobian(self, u, x):
        """``log|dx/du|`` summed over the site's event dims (batch shape)."""
        return self.support_map.log_jacobian(u, x)


class VIS:
    r"""
    A Pyro guide refining ``base_guide`` by ``num_steps`` sampler steps (thesis sec. 2.4).

    Use it wherever a guide goes: :class:`~pyro.infer.SVI` with
    :class:`~pyro.infer.Trace_ELBO` or :class:`~pyro.infer.TraceEnum_ELBO` (discrete
    model sites the base guide does not sample are enumerated in the ELBO and
    marginalised, by the same enumeration, in the sampler's potential), and
    :class:`~pyro.infer.Predictive`. Each call runs the base guide (its sample sites are
    hidden from the ELBO), maps its draws of the model's latent sites to unconstrained
    space, refines them on :math:`\log p(x, z) + \log|J|` and samples the refined values.

    Data subsampled with ``pyro.plate(..., subsample_size=...)`` in the base guide is
    used by the potential too: the model's plates are conditioned on the base guide's
    subsample indices. The potential is the log joint as Pyro scales it (the likelihood
    of a global latent is scaled by ``N / B``), but the gradient of a site is divided by
    the scale of that site, so a local latent :math:`z_i` moves along the per-datapoint
    :math:`\nabla_{z_i}\log p(x_i, z_i)`.

    Interacting samplers (``"svgd"``, ``repulsion``, VIS-FP) need several particles in
    one call: run under ``Trace_ELBO(num_particles=L, vectorize_particles=True,
    max_plate_nesting=...)``, ``Predictive(..., parallel=True)`` or
    :meth:`sample_posterior`. Any plate enclosing the guide that the model itself does
    not declare is taken as the particle plate.

    :param callable model: the Pyro model.
    :param callable base_guide: the initial guide :math:`q_{0,\phi}`, reparameterised
        (e.g. an AutoGuide, or an amortised encoder guide).
    :param str sampler: ``"sgd"`` (noise-free gradient ascent, the thesis' default),
        ``"sgld"``, ``"sghmc"``, ``"adam"`` (Adam+N) or ``"svgd"``.
    :param int num_steps: ``T >= 0`` refinement steps; ``T = 0`` is the base guide,
        except with ``entropy="gaussian"``, which is then :math:`\mathcal N(z_0,
        \sigma_\phi)`.
    :param float step_size: the initial step size :math:`\eta > 0`.
    :param bool learn_step_size: make :math:`\eta` the positive ``pyro.param``
        ``f"{name}_step_size"``.
    :param str entropy: ``"particle"`` (VIS-P), ``"mc"`` (VIS-MC as the
        auxiliary-variable bound with the reverse Langevin kernel, see the module
        docstring; SGLD without repulsion only: the deterministic samplers have no
        transition density),
        ``"gaussian"`` (VIS-G, scales ``f"{name}_{site}_scale"``) or
        ``"fokker_planck"`` (VIS-FP, with ``sampler="sgd"``, which it turns into the flow
        of eq. 2.11).
    :param str gradient: ``"full"`` differentiates through the ``T`` steps: the
        potential's gradient is taken with ``create_graph=True``, so the loss is
        second-order and its graph (memory) grows linearly with ``T``; the step size is
        learned. ``"fast"`` (eq. 2.13) detaches the update ``z_T - z_0``: first-order,
        memory independent of ``T``, and the step size gets no gradient.
    :param repulsion: ``None``, ``"rbf"`` or a :class:`~pyro.infer.svgd.SteinKernel`
        coupling the particles of ``"sgld"``, ``"sghmc"`` or ``"adam"`` (thesis sec.
        2.3); the kernel of ``"svgd"`` (RBF by default).
    :param float friction: the SGHMC friction.
    :param float gaussian_scale: the initial :math:`\sigma_\phi` of VIS-G.
    :param str name: prefix of the guide's parameters.
    """

    def __init__(
        self,
        model,
        base_guide,
        sampler="sgd",
        num_steps=1,
        step_size=1e-3,
        learn_step_size=True,
        entropy="particle",
        gradient="full",
        repulsion=None,
        friction=0.1,
        gaussian_scale=0.1,
        name="vis",
    ):
        for arg, value, what in (
            ("model", model, "the Pyro model"),
            ("base_guide", base_guide, "the initial guide q0, e.g. an AutoGuide"),
        ):
            if not callable(value):
                raise TypeError(f"{arg} must be a callable ({what}), got {value!r}")
        check_choice(sampler, "sampler", SAMPLERS)
        check_choice(entropy, "entropy", ENTROPIES)
        check_choice(gradient, "gradient", GRADIENTS)
        num_steps = check_int(num_steps, "num_steps", low=0)
        step_size = check_positive(step_size, "step_size")
        gaussian_scale = check_positive(gaussian_scale, "gaussian_scale")
        if repulsion is not None:
            if sampler not in ("sgld", "sghmc", "adam", "svgd"):
                raise ValueError(
                    f"repulsion applies to sampler 'sgld', 'sghmc', 'adam' or 'svgd', not "
                    f"{sampler!r} (sgd with repulsion is sampler='svgd')"
                )
            if isinstance(repulsion, str):
                if repulsion != "rbf":
                    raise ValueError(
                        f"repulsion must be None, 'rbf' or a SteinKernel, got {repulsion!r}"
                    )
                repulsion = RBFKernel()
            elif not isinstance(repulsion, SteinKernel):
                raise TypeError(
                    "repulsion must be None, 'rbf' or a SteinKernel, "
                    f"got {type(repulsion).__name__}"
                )
        if entropy == "mc" and (sampler != "sgld" or repulsion is not None):
            raise ValueError(
                "entropy='mc' needs sampler='sgld' without repulsion: the VIS-MC term is "
                "the Gaussian transition density of SGLD, which the other samplers lack"
            )
        if entropy == "fokker_planck" and sampler != "sgd":
            raise ValueError(
                "entropy='fokker_planck' is the deterministic flow of eq. (2.11): use "
                f"sampler='sgd', got sampler={sampler!r}"
            )
        self.model, self.base_guide = model, base_guide
        self.sampler, self.num_steps, self.entropy = sampler, num_steps, entropy
        self.step_size, self.learn_step_size = step_size, learn_step_size
        self.gradient, self.friction = gradient, friction
        self.gaussian_scale, self.name = gaussian_scale, name
        if sampler == "svgd" or entropy == "fokker_planck":
            repulsion = repulsion or RBFKernel()
        self.kernel = repulsion
        self._prototype = None

    # -- model structure ---------------------------------------------------------------

    def _setup(self, args, kwargs):
        # Reading the model's structure must not consume randomness: with T = 0 the guide
        # has to draw exactly what the base guide draws under the same seed.
        rng_state = pyro.util.get_rng_state()
        with poutine.block():
            trace = poutine.trace(self.model).get_trace(*args, **kwargs)
        check_model_data(self.model, args, kwargs, trace)
        pyro.util.set_rng_state(rng_state)
        self._setup_trace = trace
        latents, plates, nesting = {}, set(), 0
        for name, site in trace.nodes.items():
            if site["type"] != "sample":
                continue
            for frame in site["cond_indep_stack"]:
                plates.add(frame.name)
                if frame.vectorized:
                    nesting = max(nesting, -frame.dim)
            if site_is_subsample(site) or site["is_observed"]:
                continue
            latents[name] = site
        self._enumerated = {
            name
            for name, site in latents.items()
            if site["fn"].support.is_discrete and site["infer"].get("enumerate") == "parallel"
        }
        self._prototype = latents
        self._model_plates = plates
        self.max_plate_nesting = nesting

    def _discrete_error(self, name):
        return ValueError(
            f"latent site {name!r} is discrete: VIS refines continuous latents only. Leave it "
            "out of the base guide and enumerate it in the model with "
            'infer={"enumerate": "parallel"}, then train with TraceEnum_ELBO'
        )

    # -- potential ---------------------------------------------------------------------

    def _log_joint(self, values, subsamples, args, kwargs, enumerate_):
        """
        Scaled log joint of the model conditioned on ``values`` and the subsamples, and the
        scales of the conditioned sites.
        """
        if not enumerate_:
            # The same sum as ``trace.log_prob_sum`` of the conditioned, blocked trace, in
            # the same order, accumulated by one light messenger instead of three handlers
            # and a Trace.
            potential = LogJointMessenger(values, subsamples, strict=False)
            with potential:
                self.model(*args, **kwargs)
            return potential.log_joint, potential.scales
        model = poutine.condition(self.model, {**values, **subsamples})
        model = poutine.enum(model, first_available_dim=-self.max_plate_nesting - 1)
        with poutine.block():
            trace = poutine.trace(model).get_trace(*args, **kwargs)
        evaluator = TraceEinsumEvaluator(trace, True, self.max_plate_nesting)
        scales = {
            name: site["scale"] for name, site in trace.nodes.items() if site["type"] == "sample"
        }
        return evaluator.log_prob(trace), scales

    def _grad_fn(self, sites, subsamples, args, kwargs, enumerate_):
        identity = [site.support_map.is_identity for site in sites]

        # Predictive may run the guide under no_grad; the sampler needs gradients anyway.
        @torch.enable_grad()
        def grad_fn(z, create_graph):
            if not z.requires_grad:
                z = z.detach().requires_grad_()
            values, log_jacobian, start = {}, 0.0, 0
            us = {}
            for site in sites:
                u = site.unrows(z[:, start : start + site.numel])
                start += site.numel
                values[site.name] = site.transform(u)
                us[site.name] = u
            # Inside the loop the distributions are not re-validated: every value is the
            # image of an unconstrained one, and the model is validated at z_T by the ELBO.
            with pyro.validation_enabled(False):
                log_joint, site_scales = self._log_joint(
                    values, subsamples, args, kwargs, enumerate_
                )
            scales = [site_scales[site.name] for site in sites]
            for site, scale, is_identity in zip(sites, scales, identity):
                if is_identity:
                    continue  # log|J| = 0 does not depend on z
                ld = site.log_jacobian(us[site.name], values[site.name])
                log_jacobian = log_jacobian + scale * ld.sum()
            (grad,) = torch.autograd.grad(log_joint + log_jacobian, z, create_graph=create_graph)
            # Per-site gradients without the site's own (plate) scale: a local latent then
            # follows its datapoint's posterior, not N / B times it.
            if len(sites) == 1:
                return grad if _is_one(scales[0]) else grad / scales[0]
            start, columns = 0, []
            for site, scale in zip(sites, scales):
                column = grad[:, start : start + site.numel]
                columns.append(column if _is_one(scale) else column / scale)
                start += site.numel
            return torch.cat(columns, -1)

        return grad_fn

    # -- the guide ---------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        return self._guide(self.num_steps, args, kwargs)

    def _guide(self, num_steps, args, kwargs):
        if self._prototype is None:
            self._setup(args, kwargs)
        recorder = _HideAndRecord()
        with recorder:
            self.base_guide(*args, **kwargs)
        base = recorder.sites
        subsamples = {n: s["value"] for n, s in base.items() if site_is_subsample(s)}
        refined = [n for n, s in base.items() if n in self._prototype and not site_is_subsample(s)]
        for name in refined:
            if base[name]["fn"].support.is_discrete:
                raise self._discrete_error(name)
        for name, site in self._prototype.items():
            if site["fn"].support.is_discrete and name not in self._enumerated:
                raise self._discrete_error(name)

        # Plates enclosing the guide that the model does not declare hold the particles.
        particle_frames = {
            f.name: f
            for n in refined
            for f in base[n]["cond_indep_stack"]
            if f.name not in self._model_plates
        }
        interacting = self.kernel is not None
        if len(particle_frames) > 1:
            raise ValueError(
                f"VIS found several particle plates {sorted(particle_frames)}; expected at most one"
            )
        frame = next(iter(particle_frames.values()), None)
        num_particles = 1 if frame is None else frame.size
        if interacting and num_particles < 2:
            raise ValueError(
                "num_particles must be >= 2 for sampler='svgd', repulsion or "
                "entropy='fokker_planck' (the particles interact): run the guide under "
                "Trace_ELBO(num_particles=L, vectorize_particles=True, max_plate_nesting=...), "
                "Predictive(..., parallel=True) or VIS.sample_posterior"
            )
        if frame is not None and self._enumerated:
            raise NotImplementedError(
                "VIS with enumerated model sites runs one particle per guide call"
            )
        if not interacting:
            frame, num_particles = None, 1  # independent chains: all coordinates in one row

        sites = [
            _Site(
                n, base[n], self._prototype[n], None if frame is None else frame.dim, num_particles
            )
            for n in refined
        ]
        z_T = log_density = None
        if num_steps > 0 or self.entropy == "gaussian":
            z0 = torch.cat([site.rows(site.u0) for site in sites], -1)
            step_size = self._step_size(z0)
            grad_fn = self._grad_fn(sites, subsamples, args, kwargs, bool(self._enumerated))
            z_T, log_density = refine(
                z0,
                grad_fn,
                step_size,
                num_steps,
                self.sampler,
                kernel=self.kernel,
                fokker_planck=self.entropy == "fokker_planck",
                friction=self.friction,
                track_density=self.entropy == "mc",
                fast=self.gradient == "fast",
            )
        return self._emit(base, sites, subsamples, num_steps, z_T, log_density)

    def _step_size(self, like):
        if not self.learn_step_size:
            return torch.tensor(self.step_size, dtype=like.dtype, device=like.device)
        return pyro.param(
            f"{self.name}_step_size",
            lambda: torch.tensor(self.step_size, dtype=like.dtype, device=like.device),
            constraint=constraints.positive,
        )

    def _emit(self, base, sites, subsamples, num_steps, z_T, log_density):
        """Sample the refined sites, in the base guide's order, inside its model plates."""
        plates = {}
        by_name = {site.name: site for site in sites}
        result, start = {}, 0
        for name, site in base.items():
            if site_is_subsample(site):
                continue
            with ExitStack() as stack:
                for f in reversed(site["cond_indep_stack"]):
                    if f.name not in self._model_plates:
                        continue
                    if f.name not in plates:
                        plates[f.name] = pyro.plate(
                            f.name,
                            f.full_size or f.size,
                            subsample=subsamples.get(f.name),
                            dim=f.dim,
                        )
                    stack.enter_context(plates[f.name])
                if name not in by_name:
                    # An auxiliary site of the base guide: its log density is part of
                    # log q0, which every entropy but VIS-G keeps.
                    if self.entropy != "gaussian":
                        lp = site["fn"].log_prob(site["value"], *site["args"], **site["kwargs"])
                        pyro.factor(name, lp, has_rsample=site["fn"].has_rsample)
                    continue
                s = by_name[name]
                fn = site["fn"]
                if z_T is None:
                    # T = 0: the base guide's own draw and log density, bit for bit.
                    lp = fn.log_prob(site["value"], *site["args"], **site["kwargs"])
                    result[name] = pyro.sample(
                        name, dist.Delta(site["value"], log_density=lp, event_dim=s.event_dim)
                    )
                    continue
                u_T = s.unrows(z_T[:, start : start + s.numel])
                if self.entropy == "gaussian":
                    scale = pyro.param(
                        f"{self.name}_{name}_scale",
                        lambda u_T=u_T, s=s: torch.full(
                            u_T.shape[u_T.dim() - s.u_event_dim :],
                            self.gaussian_scale,
                            dtype=u_T.dtype,
                            device=u_T.device,
                        ),
                        constraint=constraints.positive,
                    )
                    q = dist.TransformedDistribution(
                        dist.Normal(u_T, scale).to_event(s.u_event_dim), s.transform
                    )
                    result[name] = pyro.sample(name, q)
                else:
                    x_T = s.transform(u_T)
                    # log q(x_T) = log q_u(u_T) - log|J(u_T)| with log q_u(u_T) taken as
                    # log q_u0(u_0) = log q0(x_0) + log|J(u_0)| (+ the VIS-MC chain terms
                    # sum_t log q(u_t | u_{t-1}) - log r(u_{t-1} | u_t)).
                    lp = fn.log_prob(site["value"], *site["args"], **site["kwargs"])
                    lp = lp + s.log_jacobian(s.u0, site["value"]) - s.log_jacobian(u_T, x_T)
                    if log_density is not None:
                        terms = s.unrows(log_density[:, start : start + s.numel])
                        lp = lp + sum_rightmost(terms, s.u_event_dim)
                    result[name] = pyro.sample(
                        name, dist.Delta(x_T, log_density=lp, event_dim=s.event_dim)
                    )
                start += s.numel
        return result

    # -- inference phase ---------------------------------------------------------------

    def sample_posterior(self, *args, num_samples=1000, num_steps=None, **kwargs):
        """
        ``num_samples`` refined draws of each latent site, ``(num_samples, *shape)``,
        drawn together as the particles of one run (VIS-X-Y: ``num_steps`` overrides the
        training ``T``). Gradients of the draws are not kept.
        """
        if num_steps is None:
            num_steps = self.num_steps
        num_steps = check_int(num_steps, "num_steps", low=0)
        num_samples = check_int(num_samples, "num_samples", low=1)
        if self._prototype is None:
            self._setup(args, kwargs)
        else:
            check_model_data(self.model, args, kwargs, self._setup_trace)
        with (
            poutine.trace() as tracer,
            pyro.plate("_vis_samples", num_samples, dim=-self.max_plate_nesting - 1),
        ):
            self._guide(num_steps, args, kwargs)
        draws = {}
        for name, site in tracer.trace.nodes.items():
            if name not in self._prototype:
                continue
            value = site["value"].detach()
            # Drop the padding dims between the samples plate and the site's own shape.
            ndim = self._prototype[name]["value"].dim()
            draws[name] = value.reshape((num_samples,) + value.shape[value.dim() - ndim :])
        return draws
