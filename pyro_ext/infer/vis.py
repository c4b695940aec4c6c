r"""
Variationally inferred sampling (VIS), thesis section 2.4 and appendix 2.A.

A tractable base guide :math:`q_{0,\phi}` is refined by ``T`` steps of a gradient-based
sampler :math:`Q_{\eta,T}` on the model's log joint, giving the refined approximation of
eq. (2.9)

.. math:: q_{\phi,\eta}(z) = \int Q_{\eta,T}(z | z_0)\, q_{0,\phi}(z_0)\, dz_0 .

Sampling from it is easy; its log density is not, so the refined ELBO (2.10) uses one of
the thesis' approximations of :math:`\log q_{\phi,\eta}(z_T)`. Two of them are lower bounds
on :math:`\log p(x)` (the training loss is then an upper bound on :math:`-\log p(x)`, and
can be compared with plain SVI's); the other two are not:

* ``"mc"`` (VIS-MC, SGLD only; **the default**, with ``sampler="sgld"``): the chain
  :math:`z_{0:T}` as auxiliary variables. The thesis takes :math:`\log q(z_T) \approx \log
  q_0(z_0) + \sum_t \log q(z_t | z_{t-1})` with the SGLD kernel :math:`q(z_t | z_{t-1}) =
  \mathcal N(z_t | z_{t-1} + \eta \nabla\log p(z_{t-1}), 2\eta I)`. Without a reverse
  kernel that objective is not a lower bound on :math:`\log p(x)`: it grows like
  :math:`\tfrac{TD}{2}\log\eta`, and a learned step size runs away (on the VAE of table 2.7,
  :math:`\eta` went from 1e-3 to 0.07 with a training "ELBO" above :math:`\log p(x)`). We
  implement instead the auxiliary-variable bound of Salimans, Kingma & Welling (2015, "Markov
  chain Monte Carlo and variational inference: bridging the gap"),

  .. math:: \mathcal L_{MC} = \mathbb E_{q_0(z_0)\prod_t q(z_t|z_{t-1})}\Big[\log p(x, z_T)
            + \sum_t \log r(z_{t-1} | z_t) - \log q_0(z_0)
            - \sum_t \log q(z_t | z_{t-1})\Big] \le \log p(x),

  with the Langevin kernel run backwards as the reverse kernel, :math:`r(z_{t-1} | z_t) =
  \mathcal N(z_{t-1} | z_t + \eta\nabla\log p(z_t), 2\eta I)` (one extra gradient, at
  :math:`z_T`). *Why it is a bound:* :math:`\tilde p(z_{0:T}) = p(x, z_T) \prod_t r(z_{t-1} |
  z_t)` integrates to :math:`p(x)` (each :math:`r` is a normalised density of
  :math:`z_{t-1}`), so :math:`\log p(x) - \mathcal L_{MC} = \mathrm{KL}(q(z_{0:T}) \,\|\,
  \tilde p / p(x)) \ge 0`, for every step size, every ``T`` and every drift (minibatch and
  per-site scaled gradients included: the same drift enters :math:`q` and :math:`r`).
  Moreover :math:`\mathcal L_{MC} = \mathrm{ELBO}(q_{\phi,\eta}) - \mathbb E\,
  \mathrm{KL}(q(z_{0:T-1} | z_T) \,\|\, r(z_{0:T-1} | z_T)) \le \mathrm{ELBO}(q_{\phi,\eta})`,
  the exact refined ELBO (2.10). So :math:`\log q(z_T) := \log q_0(z_0) + \sum_t [\log
  q(z_t | z_{t-1}) - \log r(z_{t-1} | z_t)]`; the :math:`\log\eta` normalising constants
  cancel, so the step size can be learned;
* ``"gaussian"`` (VIS-G): :math:`z \sim \mathcal N(z_T, \sigma_\phi)` with a learnable
  scale :math:`\sigma_\phi` per site. A bound with any sampler: with the base draw and the
  sampler's noise as auxiliary variables :math:`a`, the objective is
  :math:`\mathbb E[\log p(x, z) - \log \mathcal N(z | z_T(a), \sigma_\phi)] =
  \mathrm{ELBO}(q_{marginal}) - I(z; a) \le \log p(x)` (the same argument with the reverse
  model :math:`r(a | z) = p(a)`);
* ``"particle"`` (VIS-P): a Dirac at :math:`z_T`, regularised by the entropy of
  :math:`q_0`, i.e. :math:`\log q(z_T) := \log q_0(z_0)`. The thesis' cheap approximation,
  **not a bound**: it drops :math:`\mathbb E[\log q_{\phi,\eta}(z_T) - \log q_0(z_0)]`.
  With SGD on a log-concave target the refined density is :math:`\log q_0(z_0) - \sum_t
  \log\det(I + \eta\nabla^2\log p(z_{t-1})) \ge \log q_0(z_0)`, so VIS-P overestimates the
  refined ELBO; as :math:`T \to \infty` every draw reaches the mode :math:`\hat z` and VIS-P
  tends to :math:`\log p(x, \hat z) + H(q_0)`, above :math:`\log p(x)` for a Gaussian
  posterior of sd :math:`s` as soon as :math:`q_0`'s sd exceeds :math:`s e^{-1/2}`. With
  SGLD the injected noise spreads the draws without paying for that spread. On the
  conjugate models of ``tests/infer/test_vis.py`` VIS-P ends 0.35-2 nats below
  :math:`-\log p(x)`; issue 30 measured a VIS-P loss of 17.8 on eight schools (5 SGLD
  steps), whose exact :math:`-\log p(y)` is 31.31, with the posterior of :math:`\tau`
  collapsed (``benchmarks/vis_defaults.py`` compares the defaults there);
* ``"fokker_planck"`` (VIS-FP): the deterministic flow of eq. (2.11),
  :math:`z_t = z_{t-1} + \eta(\nabla\log p - \nabla\log q_t)(z_{t-1})`, with the RBF
  kernel estimate of :math:`\nabla\log q_t` over the particles (appendix 2.A), and the
  VIS-P regulariser :math:`\log q_0(z_0)`: **not a bound**, for the same reason.

Training stops with :class:`VISDivergenceError` (a
:class:`~pyro_ext.infer.SamplerDivergenceError`) naming the refinement step, the sites and
any non-finite parameter as soon as the step size, a particle, a gradient or the guide's log
density stops being finite, instead of a Pyro validation message about a NaN ``loc``
further on. :meth:`VIS.sample_posterior` checks its refined draws (non-finite, or far outside
the base guide's mass) before returning them.

The sampler runs in unconstrained space on :math:`\log p(x, z) + \log|J|`, so every log
density above is one of unconstrained values; the guide reports it for the constrained
value by subtracting :math:`\log|J(u_T)|` (and :math:`\log q_0` is read off the base guide
in constrained space, hence the :math:`+ \log|J(u_0)|`).

``gradient="full"`` backpropagates through the ``T`` steps (the step size :math:`\eta`
is learned from the refined ELBO), ``gradient="fast"`` uses eq. (2.13),
:math:`z_T = z_0 + \mathrm{stop\_grad}(\sum_t \Delta z_t)`.
"""

import math
import sys
import warnings
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

from ..ops.random import rng_preserved
from ..ops.validation import check_choice, check_int, check_positive, check_real
from .errors import SamplerDivergenceError
from .potential import LogJointMessenger, SupportMap, check_model_data
from .sgmcmc.repulsion import RBFKernel, stein_coupling
from .sgmcmc.updates import get_sampler

__all__ = [
    "ENTROPIES",
    "GRADIENTS",
    "SAMPLERS",
    "VIS",
    "VISDivergenceError",
    "fokker_planck_score",
    "refine",
]

#: VIS's sampler names; each is an entry of :data:`~pyro_ext.infer.sgmcmc.updates.SAMPLERS`
#: (``"svgd"`` is ``"sgd"`` with a kernel).
SAMPLERS = ("sgd", "sgld", "sghmc", "adam", "svgd")
_REGISTRY_NAME = {"svgd": "sgd"}
ENTROPIES = ("particle", "mc", "gaussian", "fokker_planck")
#: The entropies whose refined ELBO is a lower bound on ``log p(x)`` (module docstring).
BOUNDS = ("mc", "gaussian")
GRADIENTS = ("full", "fast")
#: :meth:`VIS.sample_posterior` refuses refined draws farther than this many scales from the
#: base guide's median (see there).
EXPLOSION_SCALES = 1000.0


class VISDivergenceError(SamplerDivergenceError):
    """
    Raised when VIS's refinement stops being finite during training (or inside
    :meth:`VIS.sample_posterior`), or when :meth:`VIS.sample_posterior` finds refined draws
    that exploded.

    :ivar int step: the refinement step whose state failed: ``0`` is the base guide's draw
        :math:`z_0` (or the step size read before the first step), ``t`` the state
        :math:`z_t` after ``t`` sampler steps (or the gradient taken at :math:`z_{t-1}` to
        make it).
    :ivar int iteration: how many times the guide had been called (outside
        :meth:`VIS.sample_posterior`) before this call: the SVI iteration when each
        iteration calls the guide once (``Trace_ELBO(num_particles=1)`` or
        ``vectorize_particles=True``) and nothing else calls it; ``None`` inside
        :meth:`VIS.sample_posterior`.
    :ivar list sites: the latent sites concerned.
    :ivar list particles: rows of the particles concerned (for independent chains, which
        VIS packs in one row, ``[0]``), or the indices of the exploded draws.
    :ivar list parameters: non-finite parameters of the param store at that moment (e.g.
        ``"vis_step_size"`` or the base guide's ``"AutoNormal.locs.tau"``).
    :ivar str reason: what failed.
    :ivar dict draws: :meth:`VIS.sample_posterior`'s draws when it found them exploded
        (kept, so that they can be inspected), else ``None``.
    """

    def __init__(
        self, step, sites=None, particles=(), reason=None, iteration=None, parameters=(), draws=None
    ):
        if isinstance(step, str) and sites is None:
            # Pyro's trace handler re-raises a RuntimeError inside a model or guide as
            # ``type(error)(message + shapes)``: keep the fields of the error it wraps.
            original = sys.exc_info()[1]
            for field in self._FIELDS:
                setattr(self, field, getattr(original, field, None))
            RuntimeError.__init__(self, step)
            return
        self.step, self.sites, self.particles = step, list(sites), list(particles)
        self.reason, self.iteration, self.parameters = reason, iteration, list(parameters)
        self.draws = draws
        where = f"SVI iteration {iteration}, " if iteration is not None else ""
        sites_text = f" in site(s) {', '.join(map(repr, self.sites))}" if self.sites else ""
        params_text = (
            f"; non-finite parameter(s) {', '.join(map(repr, self.parameters))}"
            if self.parameters
            else ""
        )
        RuntimeError.__init__(
            self,
            f"VIS diverged at {where}refinement step {step}: {reason}{sites_text}{params_text}. "
            "Lower step_size, or fix it (learn_step_size=False), use fewer num_steps, "
            "lower the optimiser's learning rate, or use sampler='sgld' with entropy='mc' "
            "(the default), whose bound penalises unstable steps.",
        )

    _FIELDS = ("step", "sites", "particles", "reason", "iteration", "parameters", "draws")

    def __reduce__(self):
        return type(self), (
            self.step,
            self.sites,
            self.particles,
            self.reason,
            self.iteration,
            self.parameters,
            self.draws,
        )


class _NonFinite(Exception):
    """Internal: a non-finite value at refinement ``step``; ``columns`` (bool, ``(D,)``)
    and ``rows`` (bool, ``(L,)``) locate it in the flat particles."""

    def __init__(self, step, what, bad):
        super().__init__(what)
        self.step, self.what = step, what
        bad = bad.reshape(bad.shape[0], -1) if bad.dim() else bad.reshape(1, 1)
        self.columns, self.rows = bad.any(0), bad.any(-1)


def _check_finite(value, step, what):
    # One device sync per check: T is small, and a non-finite particle must stop the
    # refinement where it happens, not as a NaN loc in the model further on.
    bad = ~torch.isfinite(value)
    if bool(bad.any()):
        raise _NonFinite(step, what, bad)


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
    check=False,
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
    :param bool check: stop at the first non-finite draw, gradient or log density, raising
        an internal error with the step (:class:`VIS` turns it into
        :class:`VISDivergenceError` naming the sites).
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
    if check:
        _check_finite(z0, 0, "the base guide drew a non-finite value")
    for t in range(1, num_steps + 1):
        grad = grad_fn(state.z, not fast)
        if check:
            _check_finite(grad, t, f"the log joint's gradient at z_{t - 1} is not finite")
        if pending is not None:
            log_density = log_density + _log_forward_over_reverse(step_size, grad, *pending)
            pending = None
        if fokker_planck:
            grad = grad + fokker_planck_score(kernel, state.z)
            coupling = None
        else:
            # The noisy samplers carry the median bandwidth's gradient (their stationary law
            # needs it); SVGD holds the bandwidth constant, as pyro.infer.SVGD does.
            coupling = None if kernel is None else stein_coupling(kernel, state.z, noisy)
        noise = torch.randn_like(state.z) if noisy else None
        state = registered.update(state, grad, step_size, noise, coupling, 1.0, True, **hyper)
        if check:
            _check_finite(state.z, t, f"the refined particles z_{t} are not finite")
        if track_density:
            pending = grad, noise
    z = state.z
    if pending is not None:
        # The reverse kernel of the last step needs the gradient at z_T.
        grad = grad_fn(z, not fast)
        if check:
            _check_finite(
                grad, num_steps, f"the log joint's gradient at z_{num_steps} is not finite"
            )
        log_density = log_density + _log_forward_over_reverse(step_size, grad, *pending)
        if check:
            _check_finite(
                log_density, num_steps, "the VIS-MC log density of the chain is not finite"
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


def _broadcast_check(constraint, value, site):
    """``constraint.check(value)`` with the event dims reduced, broadcast to ``value``'s
    batch shape (a scalar ``True`` where the check is not available)."""
    try:
        ok = constraint.check(value)
    except (NotImplementedError, ValueError):
        # A constraint with no check (Pyro's `dependent` raises ValueError, others
        # NotImplementedError): nothing to test the refined value against.
        return torch.ones((), dtype=torch.bool, device=value.device)
    if ok.dim() > value.dim() - site.event_dim:  # a constraint that did not reduce events
        ok = ok.reshape(ok.shape[: value.dim() - site.event_dim] + (-1,)).all(-1)
    return ok


class _Site:
    """
    A refined latent site: its :class:`~pyro_ext.infer.potential.SupportMap` and its layout in
    the flat particles. The layout follows the base guide's draw, not the model's global
    sites as :class:`~pyro_ext.infer.potential.ParticlePotential` does: a local latent of a
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
    :param str sampler: ``"sgld"`` (SGLD, whose transition density gives the VIS-MC bound),
        ``"sgd"`` (noise-free gradient ascent, the thesis' examples), ``"sghmc"``,
        ``"adam"`` (Adam+N) or ``"svgd"``. ``None`` (the default) is ``"sgld"``, or
        ``"sgd"`` with ``entropy="fokker_planck"``.
    :param int num_steps: ``T >= 0`` refinement steps; ``T = 0`` is the base guide,
        except with ``entropy="gaussian"``, which is then :math:`\mathcal N(z_0,
        \sigma_\phi)`.
    :param float step_size: the initial step size :math:`\eta > 0`.
    :param bool learn_step_size: make :math:`\eta` the positive ``pyro.param``
        ``f"{name}_step_size"``.
    :param str entropy: how :math:`\log q_{\phi,\eta}(z_T)` is approximated (module
        docstring). Lower bounds on :math:`\log p(x)`: ``"mc"`` (VIS-MC as the
        auxiliary-variable bound with the reverse Langevin kernel; SGLD without repulsion
        only: the other samplers have no tractable transition density) and ``"gaussian"``
        (VIS-G, scales ``f"{name}_{site}_scale"``). Not bounds (the loss can fall below
        :math:`-\log p(x)` and the posterior collapse): ``"particle"`` (VIS-P, the thesis'
        cheap approximation) and ``"fokker_planck"`` (VIS-FP, with ``sampler="sgd"``, which
        it turns into the flow of eq. 2.11). ``None`` (the default) is ``"mc"`` for SGLD
        without repulsion; with another sampler it falls back to ``"particle"`` with a
        warning (pass ``entropy`` explicitly to choose).
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
        sampler=None,
        num_steps=1,
        step_size=1e-3,
        learn_step_size=True,
        entropy=None,
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
        check_choice(sampler, "sampler", SAMPLERS, allow_none=True)
        if sampler is None:
            # VIS-FP is a flow of the noise-free sampler; everything else defaults to SGLD.
            sampler = "sgd" if entropy == "fokker_planck" else "sgld"
        check_choice(entropy, "entropy", ENTROPIES, allow_none=True)
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
        if entropy is None:
            if sampler == "sgld" and repulsion is None:
                entropy = "mc"
            else:
                entropy = "particle"
                warnings.warn(
                    f"VIS with sampler={sampler!r}"
                    f"{' and repulsion' if repulsion is not None else ''} has no VIS-MC bound, "
                    "so entropy defaults to 'particle' (VIS-P), which is not a bound on "
                    "-log p(x): its loss can fall below any bound and the posterior can "
                    "collapse. Pass entropy='gaussian' for a bound with this sampler, "
                    "sampler='sgld' for the VIS-MC bound (the default), or "
                    "entropy='particle' to keep VIS-P without this warning.",
                    UserWarning,
                    stacklevel=2,
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
        # SGHMC's velocity keeps 1 - friction of itself per step (as the SGHMC kernel).
        friction = check_real(friction, "friction", 0, 1, low_open=True)
        self.gradient, self.friction = gradient, friction
        self.gaussian_scale, self.name = gaussian_scale, name
        if sampler == "svgd" or entropy == "fokker_planck":
            repulsion = repulsion or RBFKernel()
        self.kernel = repulsion
        self._prototype = None
        self._num_calls = 0  # calls of the guide, for VISDivergenceError.iteration

    @property
    def is_bound(self):
        r"""Whether the training loss is an upper bound on :math:`-\log p(x)` (module
        docstring): ``entropy`` is ``"mc"`` or ``"gaussian"``."""
        return self.entropy in BOUNDS

    # -- model structure ---------------------------------------------------------------

    def _setup(self, args, kwargs):
        # Reading the model's structure must not consume randomness: with T = 0 the guide
        # has to draw exactly what the base guide draws under the same seed.
        with rng_preserved(), poutine.block():
            trace = poutine.trace(self.model).get_trace(*args, **kwargs)
        check_model_data(self.model, args, kwargs, trace)
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
        iteration = self._num_calls
        self._num_calls += 1
        return self._guide(self.num_steps, args, kwargs, iteration=iteration)

    def _non_finite_parameters(self):
        return [
            name
            for name, value in pyro.get_param_store().items()
            if not bool(torch.isfinite(value).all())
        ]

    def _divergence(self, step, reason, sites=(), particles=(), iteration=None):
        return VISDivergenceError(
            step,
            sites,
            particles,
            reason=reason,
            iteration=iteration,
            parameters=self._non_finite_parameters(),
        )

    def _guide(self, num_steps, args, kwargs, iteration=None, record=None):
        """The refined guide; ``iteration`` is set for training calls (which are checked
        for divergence as they go), ``record`` (a dict) receives the sites, the base and
        the refined particles for :meth:`sample_posterior`'s final check."""
        check = record is None
        if self._prototype is None:
            self._setup(args, kwargs)
        recorder = _HideAndRecord()
        try:
            with recorder:
                self.base_guide(*args, **kwargs)
        except (ValueError, RuntimeError) as error:
            # A NaN gradient that reached the optimiser shows up first as the base guide's
            # validation error ("Expected parameter loc ... nan"): name the parameter.
            if isinstance(error, VISDivergenceError) or not self._non_finite_parameters():
                raise
            raise self._divergence(
                0,
                f"the base guide failed ({type(error).__name__}: "
                f"{str(error).strip().splitlines()[0][:200]})",
                iteration=iteration,
            ) from error
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
            step_size = self._step_size(z0, iteration)
            grad_fn = self._grad_fn(sites, subsamples, args, kwargs, bool(self._enumerated))
            try:
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
                    check=check,
                )
            except _NonFinite as error:
                bad, start = [], 0
                for site in sites:
                    if bool(error.columns[start : start + site.numel].any()):
                        bad.append(site.name)
                    start += site.numel
                rows = error.rows.nonzero().flatten().tolist()
                raise self._divergence(error.step, error.what, bad, rows, iteration) from None
            if record is not None:
                record.update(
                    sites=sites, z0=z0.detach(), z_T=z_T.detach(), step_size=step_size.detach()
                )
        return self._emit(base, sites, subsamples, num_steps, z_T, log_density, iteration, check)

    def _step_size(self, like, iteration=None):
        if not self.learn_step_size:
            return torch.tensor(self.step_size, dtype=like.dtype, device=like.device)
        step_size = pyro.param(
            f"{self.name}_step_size",
            lambda: torch.tensor(self.step_size, dtype=like.dtype, device=like.device),
            constraint=constraints.positive,
        )
        value = float(step_size.detach())
        if not (math.isfinite(value) and value > 0):
            # A NaN gradient reached the optimiser, or the step size over/underflowed.
            raise self._divergence(
                0,
                f"the learned step size {self.name + '_step_size'!r} is {value}, not a finite "
                "number > 0",
                iteration=iteration,
            )
        return step_size

    def _emit(self, base, sites, subsamples, num_steps, z_T, log_density, iteration, check):
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
                    if check:
                        self._check_value(s, x_T, num_steps, iteration)
                    # log q(x_T) = log q_u(u_T) - log|J(u_T)| with log q_u(u_T) taken as
                    # log q_u0(u_0) = log q0(x_0) + log|J(u_0)| (+ the VIS-MC chain terms
                    # sum_t log q(u_t | u_{t-1}) - log r(u_{t-1} | u_t)).
                    lp = fn.log_prob(site["value"], *site["args"], **site["kwargs"])
                    lp = lp + s.log_jacobian(s.u0, site["value"]) - s.log_jacobian(u_T, x_T)
                    if log_density is not None:
                        terms = s.unrows(log_density[:, start : start + s.numel])
                        lp = lp + sum_rightmost(terms, s.u_event_dim)
                    if check and not bool(torch.isfinite(lp).all()):
                        raise self._divergence(
                            num_steps,
                            "the guide's log density of the refined draw is not finite",
                            [name],
                            iteration=iteration,
                        )
                    result[name] = pyro.sample(
                        name, dist.Delta(x_T, log_density=lp, event_dim=s.event_dim)
                    )
                start += s.numel
        return result

    def _check_value(self, site, x_T, step, iteration):
        """A refined value must be finite and inside the site's support: exp(u) of a very
        negative u underflows to 0, which the model would refuse as a scale."""
        if site.support_map.is_identity:
            ok = torch.isfinite(x_T)
        else:
            ok = torch.isfinite(x_T) & _broadcast_check(site.transform.codomain, x_T, site)
        if not bool(ok.all()):
            raise self._divergence(
                step,
                "the refined value is not finite or left the support (the unconstrained "
                "value over- or underflowed)",
                [site.name],
                iteration=iteration,
            )

    # -- inference phase ---------------------------------------------------------------

    def sample_posterior(self, *args, num_samples=1000, num_steps=None, check=True, **kwargs):
        r"""
        ``num_samples`` refined draws of each latent site, ``(num_samples, *shape)``,
        drawn together as the particles of one run (VIS-X-Y: ``num_steps`` overrides the
        training ``T``). Gradients of the draws are not kept.

        With ``check=True`` the draws are checked before they are returned, in the
        unconstrained space where the sampler runs. A draw is refused when it is not
        finite (or its constrained value is not), or when it lies farther than
        :data:`EXPLOSION_SCALES` (1000) scales from the base guide's median in some
        coordinate :math:`j`,

        .. math:: |u_{T,j} - \mathrm{med}(u_{0,j})| > 1000\,\bigl(\hat s_j
                  + \sqrt{2\eta T}\,[\text{noisy sampler}]\bigr),

        with :math:`\hat s_j` the base draws' robust scale (interquartile range / 1.349)
        and :math:`\sqrt{2\eta T}` the spread the sampler's noise alone adds in ``T``
        steps. A base draw never lies that far out (a Gaussian one is beyond 10 scales with
        probability 1e-23), and a stable sampler started from the base guide's mass moves
        by a few posterior scales, which a fitted base guide underestimates by far less
        than 1000-fold: such draws come from a sampler that went unstable (a step size too
        large where the base guide puts some draws, e.g. a funnel's neck), not from the
        posterior. Coordinates where the base guide has no spread and the sampler no noise
        (a point-mass base with ``"sgd"``) are checked for finiteness only.

        :raises VISDivergenceError: naming the sites and the number of draws refused; its
            ``draws`` attribute holds the draws, and the message says what to change.
            ``check=False`` returns them unchecked.
        """
        if num_steps is None:
            num_steps = self.num_steps
        num_steps = check_int(num_steps, "num_steps", low=0)
        num_samples = check_int(num_samples, "num_samples", low=1)
        if self._prototype is None:
            self._setup(args, kwargs)
        else:
            # On these arguments: the set-up trace holds the set-up data's observations.
            check_model_data(self.model, args, kwargs, None)
        record = {}
        with (
            poutine.trace() as tracer,
            pyro.plate("_vis_samples", num_samples, dim=-self.max_plate_nesting - 1),
        ):
            self._guide(num_steps, args, kwargs, record=record)
        draws = {}
        for name, site in tracer.trace.nodes.items():
            if name not in self._prototype:
                continue
            value = site["value"].detach()
            # Drop the padding dims between the samples plate and the site's own shape.
            ndim = self._prototype[name]["value"].dim()
            draws[name] = value.reshape((num_samples,) + value.shape[value.dim() - ndim :])
        if check and record:
            self._check_draws(record, draws, num_samples, num_steps)
        return draws

    def _check_draws(self, record, draws, num_samples, num_steps):
        """Refuse non-finite or exploded refined draws (see :meth:`sample_posterior`)."""
        noise = 0.0
        if self.sampler not in ("sgd", "svgd") and num_steps > 0:
            noise = math.sqrt(2.0 * float(record["step_size"]) * num_steps)
        bad_draws = torch.zeros(num_samples, dtype=torch.bool, device=record["z0"].device)
        non_finite, far, worst, start = [], [], {}, 0
        for site in record["sites"]:
            u0 = site.u0.detach().reshape(num_samples, -1)
            u_T = site.unrows(record["z_T"][:, start : start + site.numel]).reshape(num_samples, -1)
            start += site.numel
            bad = ~torch.isfinite(u_T).all(-1) | ~torch.isfinite(draws[site.name]).reshape(
                num_samples, -1
            ).all(-1)
            if bool(bad.any()):
                non_finite.append(site.name)
            if num_samples >= 2:
                quartiles = torch.quantile(
                    u0, torch.tensor([0.25, 0.5, 0.75], dtype=u0.dtype, device=u0.device), dim=0
                )
                scale = (quartiles[2] - quartiles[0]) / 1.349 + noise
                distance = (u_T - quartiles[1]).abs() / scale
                # Coordinates without spread or noise: finiteness only.
                distance = torch.where(scale > 0, distance, torch.zeros_like(distance))
                distance = torch.nan_to_num(distance, nan=0.0, posinf=0.0)
                out = (distance > EXPLOSION_SCALES).any(-1) & ~bad
                if bool(out.any()):
                    far.append(site.name)
                    worst[site.name] = float(distance.max())
                bad = bad | out
            bad_draws |= bad
        if bool(bad_draws.any()):
            count = int(bad_draws.sum())
            parts = []
            if non_finite:
                parts.append(f"non-finite values in site(s) {', '.join(map(repr, non_finite))}")
            if far:
                parts.append(
                    f"values more than {EXPLOSION_SCALES:g} base-guide scales from its median "
                    "(unconstrained) in site(s) "
                    + ", ".join(f"{n!r} (up to {worst[n]:.3g} scales)" for n in far)
                )
            error = VISDivergenceError(
                num_steps,
                non_finite + [n for n in far if n not in non_finite],
                bad_draws.nonzero().flatten().tolist(),
                reason=f"{count} of {num_samples} refined draws exploded: "
                + "; ".join(parts)
                + " (the draws are in this error's .draws; sample_posterior(check=False) "
                "returns them unchecked)",
                parameters=self._non_finite_parameters(),
                draws=draws,
            )
            raise error
