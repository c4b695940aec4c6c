"""Natural-gradient mean-field Gaussian VI for Pyro models (IVON, VOGN, VON)."""

import math
import numbers
from collections.abc import Callable

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.autoguide.initialization import init_to_uniform
from pyro.poutine.util import site_is_subsample

from ...ops.curvature import hessian_diagonal
from ...ops.validation import check_choice, check_int, check_positive, check_real
from ..errors import DivergenceError
from ..potential import VECTORIZE, LogJointMessenger, ParticlePotential
from .updates import NGVIState, init_state, ngvi_update, posterior_scale, price_hessian

METHODS = ("ivon", "vogn", "von")
#: with ``jit_compile=None``, the update is compiled from this many parameters on
_COMPILE_FROM = 2**16


class NGVIDivergenceError(DivergenceError):
    """
    Raised when a natural-gradient step makes the posterior non-finite. The state stays
    at the last finite step.

    :ivar int step: the (0-based) step that failed.
    """

    def __init__(self, step, what):
        self.step = step
        super().__init__(
            f"natural-gradient VI diverged at step {step}: {what} is not finite. The state "
            "is the one before this step; lower lr, or raise hess_init."
        )


class NaturalGradientVI:
    r"""
    Natural-gradient variational inference with a mean-field Gaussian posterior over the
    latent sites of a Pyro model (in unconstrained space), the way an optimiser trains a
    network: IVON (Shen et al. 2024) or VON (Khan et al. 2018). See
    :mod:`~pyro_ext.infer.ngvi.updates` for the update.

    The loss is the model's negative log joint, scaled by the plates' subsampling, divided
    by the effective sample size ``ess``: the average negative log-likelihood per datum that
    a network's optimiser minimises. Each step draws ``mc_samples`` parameter vectors
    :math:`\theta_s = m + \sigma\epsilon_s`, evaluates their gradients in one vectorised pass
    of the model (the potential of the SG-MCMC kernels,
    :class:`~pyro_ext.infer.potential.ParticlePotential`), and estimates the diagonal Hessian:

    * ``"ivon"``: :func:`~.updates.price_hessian`, :math:`\hat g\,(\theta - m)/\sigma^2`,
      free given the gradient;
    * ``"vogn"``: the diagonal of the generalised Gauss-Newton matrix :math:`J^\top
      \Lambda J` of the likelihood at each draw, from per-example gradients of its outputs
      (one vectorised vector-Jacobian product per datum and output): the Normal's mean (and
      log-scale, when the scale depends on the latents), the Bernoulli's and Categorical's
      logits. Never negative, exact for a linear-Gaussian model; the curvature of
      non-Gaussian prior terms is left out;
    * ``"von"``: the exact diagonal of the Hessian at each draw (one Hessian-vector
      product per coordinate, vectorised: for models of up to a few thousand parameters).

    **Priors.** A latent site whose prior is a Normal with parameters that depend on no
    other latent (e.g. ``Normal(0, s).expand(shape).to_event(k)``, a network's weights)
    enters through its precision: :math:`\delta = 1 / (s^2\,\mathrm{ess})` and its mean
    :math:`m_0`, exactly, as IVON's weight decay does. Any other prior (a ``Gamma``
    precision, a hierarchical scale) stays in the loss, on its unconstrained coordinate with
    the log-Jacobian of the map to its support, and its curvature is estimated with the
    likelihood's. ``weight_decay=w`` instead replaces every prior by
    :math:`\mathcal N(0, 1/(\mathrm{ess}\,w))` on every unconstrained coordinate, as
    ``ivon-opt`` does.

    :meth:`state_dict` and :meth:`load_state_dict` checkpoint a run: a state loads only
    into an object set up on the same model (the same latent sites, distributions,
    supports and shapes) with the same ``method``, ``ess``, ``beta1``, ``beta2``,
    ``hess_init``, ``weight_decay`` and ``rescale_lr`` (what the saved mean and Hessian
    mean); ``lr``, ``mc_samples``, ``clip_radius`` and the rest shape only the steps to
    come and may differ.

    :param callable model: a Pyro model with continuous latent sites; the data may be
        subsampled with ``pyro.plate(..., subsample_size=...)`` (a fresh minibatch every
        step), or passed to :meth:`step` one minibatch at a time with the plate's
        ``subsample`` (then give ``ess``).
    :param str method: ``"ivon"`` (default), ``"vogn"`` or ``"von"``.
    :param float lr: the learning rate :math:`\alpha` (with ``rescale_lr``, the first
        steps move the mean as SGD with this rate would). The default 0.03 was chosen on
        UCI regression with a 50-unit BNN; large networks often take 0.1 or more.
    :param float ess: the effective sample size :math:`\lambda`; by default the full size
        of the model's subsampled plate. A model without one needs it.
    :param float beta1: gradient momentum, in ``[0, 1)``.
    :param float beta2: Hessian averaging, in ``(0, 1)``. ``h`` needs about ``1 / (1 -
        beta2)`` steps to move away from ``hess_init``: the default 0.999 suits runs of a
        few thousand steps (a small BNN's UCI fit); ``ivon-opt``'s 0.99999 suits runs of
        10^5 steps and more (on yacht, 2,000 steps with it leave ``h`` at ``hess_init``
        and double the test RMSE).
    :param float hess_init: the initial Hessian estimate ``h``: the initial posterior
        scale is :math:`1/\sqrt{\mathrm{ess}\,(h_0 + \delta)}`.
    :param int mc_samples: draws per step.
    :param float weight_decay: ``None`` (default): the model's priors; a number replaces
        them (see above).
    :param float clip_radius: clips each coordinate of the mean's step direction
        :math:`(\hat g + \delta m)/(h + \delta)` to ``[-clip_radius, clip_radius]``
        (``ivon-opt``'s ``clip_radius``); by default no clip. A learned Gaussian noise
        precision is the usual reason to set one: a minibatch of large residuals gives its
        log a gradient :math:`\tfrac12(\tau r^2 - 1)` that ``h`` does not track (a Newton
        step down on it is less than 1 whatever the residuals), so one step can collapse
        the precision and leave a finite fit that predicts worse than a constant. A radius
        of 1 to 3 bounds such steps but does not rule the failure out: check a fit's
        posterior predictive on its training data (``benchmarks/ngvi.py`` refits a run that
        scores below the constant predictor).

    :param bool rescale_lr: multiply ``lr`` by ``hess_init + delta`` (``ivon-opt``'s
        default); ``False`` follows Algorithm 1 of the paper literally.
    :param callable init_loc_fn: a Pyro init strategy for the mean (as in Pyro's
        autoguides); by default the start the SG-MCMC kernels take: the model's declared
        start (a :class:`~pyro_ext.models.BayesianMLP` starts as a network's optimiser
        would, also inside a wrapping model), else the prior-scaled start of
        :meth:`~pyro_ext.infer.potential.ParticlePotential.initial_particles`.
    :param str vectorize: how the ``mc_samples`` draws are evaluated together (see
        :class:`~pyro_ext.infer.potential.ParticlePotential`).
    :param jit_compile: compile the step's elementwise arithmetic (the draw ``m + sigma
        eps`` and the update) into two fused loops with :func:`torch.compile` (a few
        seconds, once). ``None`` (default): from 65,536 parameters on, where it is most of
        a step's cost; ``True``/``False`` force it. The normals are drawn as the eager step
        draws them, so the compiled step equals the eager one up to float32 round-off.
    """

    def __init__(
        self,
        model: Callable,
        method: str = "ivon",
        lr: float = 0.03,
        ess: float | None = None,
        beta1: float = 0.9,
        beta2: float = 0.999,
        hess_init: float = 1.0,
        mc_samples: int = 1,
        weight_decay: float | None = None,
        clip_radius: float = math.inf,
        rescale_lr: bool = True,
        init_loc_fn: Callable | None = None,
        vectorize: str = "auto",
        jit_compile: bool | None = None,
    ):
        if not callable(model):
            raise TypeError(f"model must be a callable Pyro model, got {type(model).__name__}")
        self.model = model
        self.method = check_choice(method, "method", METHODS)
        self.mc_samples = check_int(mc_samples, "mc_samples", low=1)
        self.clip_radius = check_real(
            clip_radius, "clip_radius", low=0, low_open=True, finite=False
        )
        self.lr = check_positive(lr, "lr")
        self.ess = check_positive(ess, "ess", allow_none=True)
        self.beta1 = check_real(beta1, "beta1", 0, 1, high_open=True)
        self.beta2 = check_real(beta2, "beta2", 0, 1, low_open=True, high_open=True)
        self.hess_init = check_positive(hess_init, "hess_init")
        self.weight_decay = check_positive(weight_decay, "weight_decay", allow_none=True)
        if not isinstance(rescale_lr, bool):
            raise TypeError(f"rescale_lr must be a bool, got {type(rescale_lr).__name__}")
        self.rescale_lr = rescale_lr
        if init_loc_fn is not None and not callable(init_loc_fn):
            raise TypeError(
                "init_loc_fn must be None or a Pyro init strategy (a callable site -> value, "
                f"e.g. pyro.infer.autoguide.init_to_median), got {type(init_loc_fn).__name__}"
            )
        self.init_loc_fn = init_loc_fn
        if jit_compile is not None and not isinstance(jit_compile, bool):
            raise TypeError(f"jit_compile must be None or a bool, got {type(jit_compile).__name__}")
        self.jit_compile = jit_compile
        self._step_functions = None
        self.vectorize = check_choice(vectorize, "vectorize", VECTORIZE)
        self.potential = None
        self.state = None
        self.prior_precision = None  # delta, (D,)
        self.prior_mean = None  # m0, (D,)
        self.num_steps = 0

    # -- set-up ------------------------------------------------------------------------
    def _setup(self, args, kwargs):
        # Empty data, a wrong length and values outside a support are refused here, by the
        # potential's data contract.
        potential = ParticlePotential(self.model, args, kwargs, vectorize=self.vectorize)
        if self.ess is None:
            sizes = {size for size, _ in potential.subsample_sizes.values()}
            if len(sizes) != 1:
                raise ValueError(
                    "ess (the effective sample size, usually the number of data) must be "
                    "given: the model has "
                    + (
                        "no subsampled pyro.plate to read it from"
                        if not sizes
                        else f"subsampled plates of different sizes {sorted(sizes)}"
                    )
                )
            self.ess = float(sizes.pop())
        mean = potential.initial_particles(1, self.init_loc_fn)[0]
        self._read_gaussian_priors(potential, mean)
        if self.weight_decay is None:
            self.prior_precision = self._model_precision / self.ess
            self.prior_mean = self._model_mean
        else:
            others = [
                name
                for name, layout in potential.layout.items()
                if not self._gaussian_columns[layout.start : layout.end].all()
            ]
            if others:
                raise ValueError(
                    f"weight_decay replaces the fixed Normal priors of the model's sites, but "
                    f"site(s) {others} have other priors (or Normal priors whose parameters "
                    "depend on other latents); leave weight_decay=None to use the model's priors"
                )
            self.prior_precision = torch.full_like(mean, self.weight_decay)
            self.prior_mean = torch.zeros_like(mean)
        # The fixed Normal priors enter through delta, exactly: the potential leaves them out.
        # It is built again to say so (the sites are known once the model has been read);
        # its set-up run of the model leaves the random state as it found it, so a seeded
        # fit draws what it would with one potential.
        exclude = [
            name
            for name, layout in potential.layout.items()
            if self._gaussian_columns[layout.start : layout.end].all()
        ]
        devices = [mean.device] if mean.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            potential = ParticlePotential(
                self.model, args, kwargs, vectorize=self.vectorize, exclude_log_prob=exclude
            )
        self.potential = potential
        self.state = init_state(mean, self.hess_init)

    def _read_gaussian_priors(self, potential, mean):
        """Precision and mean of the sites with a fixed Normal prior; 0 elsewhere."""
        priors = potential.fixed_normal_priors(mean)
        self._model_precision, self._model_mean = priors.precision, priors.mean
        self._gaussian_columns = priors.columns

    # -- one step ----------------------------------------------------------------------
    def _exact_hessian_diagonal(self, theta, subsamples):
        """
        Diagonals ``(S, D)`` of the Hessians of the loss ``-log p / ess`` (fixed Normal
        priors left out, as in the potential) at draws ``theta`` ``(S, D)``; the summed loss
        is separable across draws (see :func:`~pyro_ext.ops.curvature.hessian_diagonal`).
        """
        potential, ess = self.potential, self.ess

        def loss(points):
            return -potential.log_density_all(points, subsamples).sum() / ess

        with pyro.validation_enabled(False):
            return hessian_diagonal(loss, theta)

    def _perturb(self, state, eps):
        """The draws ``theta = m + sigma eps`` ``(S, D)`` and their offsets ``sigma eps`` from
        standard normals ``eps`` (a pure function)."""
        noise = posterior_scale(state, self.ess, self.prior_precision) * eps
        return state.mean + noise, noise

    def _update(self, state, log_density_grads, noise, hess_estimate):
        """
        The update from the gradients ``(S, D)`` of the draws' log densities and their
        offsets ``noise`` (a pure function). Also returns whether the new mean and Hessian
        are finite, a reduction that fuses into the compiled update's loop.
        """
        grads = -log_density_grads / self.ess
        if hess_estimate is None:
            hess_estimate = price_hessian(grads, noise, state, self.ess, self.prior_precision)
        new_state = ngvi_update(
            state,
            grads.mean(0),
            hess_estimate,
            self.lr,
            self.prior_precision,
            self.prior_mean,
            beta1=self.beta1,
            beta2=self.beta2,
            hess_init=self.hess_init,
            clip_radius=self.clip_radius,
            rescale_lr=self.rescale_lr,
        )
        finite = torch.isfinite(new_state.mean.sum() + new_state.hess.sum())
        return new_state, finite

    def _step_fns(self):
        """
        The draw and the update, each compiled into one fused loop when ``jit_compile``
        says so: a step's elementwise arithmetic over ``D`` parameters is some thirty
        passes over memory eagerly (11.8 ms of the update alone for the 478,410 weights of
        a 784-400-400-10 network on one CPU thread, 0.7 ms compiled). The normals stay
        ATen's (inductor's CPU generator is ten times slower), so the compiled step draws
        what the eager one draws.
        """
        if self._step_functions is None:
            compile_it = self.jit_compile
            if compile_it is None:
                compile_it = self.potential.dim >= _COMPILE_FROM
            if compile_it:
                self._step_functions = (
                    torch.compile(self._perturb, dynamic=False),
                    torch.compile(self._update, dynamic=False),
                )
            else:
                self._step_functions = (self._perturb, self._update)
        return self._step_functions

    def _pseudo_outputs(self, theta, subsamples):
        """
        The likelihood's outputs at one draw ``theta`` ``(D,)``, each multiplied by a
        factor of its Fisher information (held constant): ``u`` with ``J_u^T J_u`` the
        generalised Gauss-Newton matrix ``J^T Lambda J`` of the loss ``-log p / ess``.
        """
        values = self.potential.constrain(theta)
        with (
            pyro.poutine.trace() as tracer,
            LogJointMessenger(values, subsamples, block=False),
        ):
            self.potential.run_model(None, None)
        outputs = []
        for name, site in tracer.trace.nodes.items():
            if (
                site["type"] != "sample"
                or site_is_subsample(site)
                or name in self.potential.layout
                or not site["is_observed"]
                # pyro.deterministic records an observed Delta: a function of the latent
                # sites, not an observation, and no term of the likelihood.
                or site["infer"].get("_deterministic")
            ):
                continue
            fn = site["fn"]
            while isinstance(fn, torch.distributions.Independent):
                fn = fn.base_dist
            weight = (
                math.sqrt(site["scale"] / self.ess)
                if isinstance(site["scale"], numbers.Real)
                else (site["scale"] / self.ess).sqrt()
            )
            if isinstance(fn, torch.distributions.Normal):
                outputs.append(weight * fn.loc / fn.scale.detach())
                if fn.scale.requires_grad:  # a scale that depends on the latents
                    outputs.append(weight * math.sqrt(2.0) * fn.scale.log().expand_as(fn.loc))
            elif isinstance(fn, torch.distributions.Bernoulli):
                p = torch.sigmoid(fn.logits).detach()
                outputs.append(weight * (p * (1 - p)).sqrt() * fn.logits)
            elif isinstance(fn, torch.distributions.Categorical):
                # Lambda = diag(p) - p p^T = B B^T with B = diag(sqrt p) - p sqrt(p)^T.
                p = fn.probs.detach()
                root = p.sqrt()
                factor = torch.diag_embed(root) - p.unsqueeze(-1) * root.unsqueeze(-2)
                logits = fn.logits
                outputs.append(weight * (factor.transpose(-1, -2) @ logits.unsqueeze(-1)))
            else:
                raise ValueError(
                    f"method='vogn' needs the Gauss-Newton factor of the likelihood of site "
                    f"{name!r}, a {type(fn).__name__}: it has Normal, Bernoulli and "
                    "Categorical. Use method='ivon' (any likelihood)."
                )
        if not outputs:
            raise ValueError("method='vogn' found no observed sites in the model")
        return torch.cat([output.reshape(-1) for output in outputs])

    def _gauss_newton_diagonal(self, theta, subsamples, chunk_size=256):
        """
        The diagonal ``(D,)`` of the generalised Gauss-Newton matrix of the likelihood's
        loss at one draw ``theta`` ``(D,)``: the column sums of squares of the Jacobian of
        :meth:`_pseudo_outputs`, one vectorised vector-Jacobian product per output
        (per-example gradients), ``chunk_size`` at a time.
        """
        with torch.enable_grad(), pyro.validation_enabled(False):
            outputs, pullback = torch.func.vjp(
                lambda point: self._pseudo_outputs(point, subsamples), theta
            )
            diagonal = torch.zeros_like(theta)
            eye = torch.eye(outputs.shape[0], dtype=outputs.dtype, device=outputs.device)
            for rows in eye.split(chunk_size):
                (jacobian_rows,) = torch.func.vmap(pullback)(rows)
                diagonal = diagonal + jacobian_rows.square().sum(0)
        return diagonal

    def setup(self, *args, **kwargs) -> "NaturalGradientVI":
        """
        Read the model's latent sites and priors and set the initial posterior (done by
        the first :meth:`step` otherwise). Setting up draws the initial mean from
        ``init_loc_fn``, so it consumes random numbers.
        """
        self._setup(args, kwargs)
        return self

    def step(self, *args, **kwargs) -> float:
        """
        One natural-gradient step on the model's arguments (the data, or the next
        minibatch). Returns the Monte Carlo estimate of the average loss at the draws, as
        :meth:`pyro.infer.SVI.step` returns its loss: the negative log-likelihood per
        datum, plus the prior terms other than the fixed Normal ones, which enter through
        ``delta`` (as a network optimiser's loss leaves out its weight decay).
        """
        if self.potential is None:
            self._setup(args, kwargs)
        else:
            self.potential.set_data(*args, **kwargs)
        state, ess = self.state, self.ess
        perturb, update = self._step_fns()
        mean = state.mean
        eps = torch.randn((self.mc_samples,) + mean.shape, dtype=mean.dtype, device=mean.device)
        theta, noise = perturb(state, eps)
        subsamples = self.potential.draw_subsamples(theta.device)
        log_density, grad = self.potential.log_density_and_grad(theta, subsamples)
        losses = -log_density / ess
        hess_estimate = None  # IVON's is computed inside the (compiled) update
        if self.method == "vogn":
            hess_estimate = torch.stack(
                [self._gauss_newton_diagonal(point, subsamples) for point in theta.detach()]
            ).mean(0)
        elif self.method == "von":
            hess_estimate = self._exact_hessian_diagonal(theta.detach(), subsamples).mean(0)
        new_state, finite = update(state, grad, noise, hess_estimate)
        loss = losses.mean()
        loss_finite = bool(torch.isfinite(loss))
        if not (loss_finite and bool(finite)):
            what = "the loss" if not loss_finite else "the posterior mean or Hessian"
            raise NGVIDivergenceError(self.num_steps, what)
        self.state = new_state
        self.num_steps += 1
        return loss.item()

    # -- the posterior -----------------------------------------------------------------
    def _require_fit(self):
        if self.state is None:
            raise RuntimeError("no posterior yet: call step() at least once")

    @property
    def scale(self) -> torch.Tensor:
        """The posterior standard deviations ``(D,)`` in unconstrained space."""
        self._require_fit()
        return posterior_scale(self.state, self.ess, self.prior_precision)

    def _draw(self, num_samples, generator=None):
        mean, scale = self.state.mean, self.scale
        eps = torch.randn(
            (num_samples,) + mean.shape, dtype=mean.dtype, device=mean.device, generator=generator
        )
        return self.potential.constrain(mean + scale * eps)

    def sample_posterior(self, num_samples: int = 1000) -> dict[str, torch.Tensor]:
        """
        ``num_samples`` joint draws of every latent site from the posterior, in
        constrained space: ``{site: (num_samples, *shape)}`` (the form
        :class:`pyro.infer.Predictive` and the BNN helpers take as ``posterior_samples``).
        """
        self._require_fit()
        num_samples = check_int(num_samples, "num_samples", low=1)
        with torch.no_grad():
            return self._draw(num_samples)

    def guide(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        """
        A Pyro guide drawing every latent site from the posterior (in constrained space),
        for :class:`pyro.infer.Predictive` or as the base guide of
        :class:`~pyro_ext.infer.VIS`. The arguments are the model's, and unused.
        """
        self._require_fit()
        locs = self.potential.unflatten(self.state.mean)
        scales = self.potential.unflatten(self.scale)
        draws = {}
        for name, layout in self.potential.layout.items():
            event_dim = len(layout.unconstrained_shape) - len(layout.batch_shape)
            base = dist.Normal(locs[name], scales[name]).to_event(event_dim)
            fn = base if layout.is_real else dist.TransformedDistribution(base, layout.transform)
            draws[name] = pyro.sample(name, fn)
        return draws

    def posterior(self, num_samples: int = 4096) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """
        Mean and standard deviation of each latent site under the posterior, in
        constrained space: ``{site: (loc, scale)}``. Exact for real-valued sites (a
        network's weights); sites with a constrained support are mapped from ``num_samples``
        draws (of a fixed seed, leaving the global random state alone).
        """
        self._require_fit()
        num_samples = check_int(num_samples, "num_samples", low=1)
        mean, scale = self.state.mean, self.scale

        def sample_flat(n, generator):
            eps = torch.randn(
                (n,) + mean.shape, dtype=mean.dtype, device=mean.device, generator=generator
            )
            return mean + scale * eps

        return self.potential.site_marginals(mean, scale, sample_flat, num_samples)

    # -- checkpoints -------------------------------------------------------------------
    #: the settings a saved state's mean and Hessian depend on (see the class docstring)
    _STATE_SETTINGS = ("method", "ess", "beta1", "beta2", "hess_init", "weight_decay", "rescale_lr")
    _STATE_KEYS = ("class", "settings", "sites", "state", "num_steps")

    def _site_fingerprint(self):
        """``{site: [distribution, support, shape]}`` of the latent sites, in flat order."""
        trace = self.potential._trace
        out = {}
        for name, layout in self.potential.layout.items():
            fn = trace.nodes[name]["fn"]
            base = fn
            while isinstance(base, torch.distributions.Independent):
                base = base.base_dist
            out[name] = [
                type(base).__name__,
                str(fn.support),
                list(trace.nodes[name]["value"].shape),
                list(layout.unconstrained_shape),
            ]
        return out

    def _settings(self):
        return {name: getattr(self, name) for name in self._STATE_SETTINGS}

    def state_dict(self) -> dict:
        """
        The posterior and the run's position, to checkpoint it (``torch.save``):
        :meth:`load_state_dict` on an object set up on the same model with the same
        settings resumes it. The dict holds the class, the settings (``method``, ``ess``,
        ``beta1``, ``beta2``, ``hess_init``, ``weight_decay``, ``rescale_lr``), a
        fingerprint of the model's latent sites (distribution, support, shapes), the
        state's tensors and ``num_steps``.
        """
        self._require_fit()
        return {
            "class": type(self).__name__,
            "settings": self._settings(),
            "sites": self._site_fingerprint(),
            "state": {k: v.detach().clone() for k, v in self.state._asdict().items()},
            "num_steps": self.num_steps,
        }

    def load_state_dict(self, state_dict: dict) -> "NaturalGradientVI":
        """
        Resume from :meth:`state_dict`. Call :meth:`setup` on the model's data first (the
        sites are read from the model). Everything is checked before anything is changed:

        :raises TypeError: if ``state_dict`` or one of its items has the wrong type.
        :raises ValueError: if a key is missing or unknown, or the state comes from another
            model or other settings (the message names the item that differs), or its
            tensors have the wrong shape or are not finite.
        """
        if self.potential is None:
            raise RuntimeError(
                "load_state_dict needs the model's sites: call setup(*args, **kwargs) with the "
                "model's data first"
            )
        if not isinstance(state_dict, dict):
            raise TypeError(
                "state_dict must be a dict from NaturalGradientVI.state_dict(), got "
                f"{type(state_dict).__name__}"
            )
        missing = [k for k in self._STATE_KEYS if k not in state_dict]
        extra = [k for k in state_dict if k not in self._STATE_KEYS]
        if missing or extra:
            raise ValueError(
                f"state_dict must have the keys {list(self._STATE_KEYS)} of "
                "NaturalGradientVI.state_dict(): "
                + "; ".join(
                    ([f"missing {missing}"] if missing else [])
                    + ([f"unknown {extra}"] if extra else [])
                )
            )
        if state_dict["class"] != type(self).__name__:
            raise ValueError(
                f"state_dict['class'] is {state_dict['class']!r}: it was saved by another "
                f"class than this {type(self).__name__}"
            )
        for key, kind in (("settings", dict), ("sites", dict), ("state", dict)):
            if not isinstance(state_dict[key], kind):
                raise TypeError(
                    f"state_dict[{key!r}] must be a {kind.__name__}, got "
                    f"{type(state_dict[key]).__name__}"
                )
        num_steps = check_int(state_dict["num_steps"], "state_dict['num_steps']", low=0)
        saved, now = state_dict["settings"], self._settings()
        different = [k for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
        if different:
            raise ValueError(
                "state_dict was saved with other settings: "
                + "; ".join(
                    f"settings[{k!r}] was {saved.get(k, '(missing)')!r}, is "
                    f"{now.get(k, '(none)')!r}"
                    for k in different
                )
                + ". Build this NaturalGradientVI with the settings of the run that saved it."
            )
        saved, now = state_dict["sites"], self._site_fingerprint()
        if list(saved) != list(now):
            raise ValueError(
                f"state_dict comes from another model: its latent sites are {list(saved)}, "
                f"this model's are {list(now)}"
            )
        what = ("distribution", "support", "shape", "unconstrained shape")
        for name in now:
            if list(saved[name]) != now[name]:
                item = next(
                    (i for i, (a, b) in enumerate(zip(saved[name], now[name])) if a != b),
                    len(what) - 1,
                )
                raise ValueError(
                    f"state_dict comes from another model: the {what[item]} of site {name!r} "
                    f"was {saved[name][item]!r}, is {now[name][item]!r}"
                )
        tensors = state_dict["state"]
        fields = NGVIState._fields
        missing = [k for k in fields if k not in tensors]
        extra = [k for k in tensors if k not in fields]
        if missing or extra:
            raise ValueError(
                f"state_dict['state'] must have the keys {list(fields)}: "
                + "; ".join(
                    ([f"missing {missing}"] if missing else [])
                    + ([f"unknown {extra}"] if extra else [])
                )
            )
        template = self.state
        values = {}
        for key in fields:
            value, like = tensors[key], getattr(template, key)
            if not isinstance(value, torch.Tensor) or not value.is_floating_point():
                raise TypeError(
                    f"state_dict['state'][{key!r}] must be a floating-point tensor, got "
                    + (
                        f"dtype {value.dtype}"
                        if isinstance(value, torch.Tensor)
                        else type(value).__name__
                    )
                )
            if value.shape != like.shape:
                raise ValueError(
                    f"state_dict['state'][{key!r}] has shape {tuple(value.shape)}, this model's "
                    f"needs {tuple(like.shape)}"
                )
            bad = ~torch.isfinite(value)
            if bool(bad.any()):
                index = int(bad.reshape(-1).nonzero()[0])
                raise ValueError(
                    f"state_dict['state'][{key!r}] must be finite: entry {index} is "
                    f"{float(value.reshape(-1)[index])} (first of {int(bad.sum())})"
                )
            values[key] = value.detach().to(dtype=like.dtype, device=like.device).clone()
        if bool((values["hess"] + self.prior_precision <= 0).any()):
            raise ValueError(
                "state_dict['state']['hess'] plus the prior precision must be positive (the "
                "posterior precision)"
            )
        self.state = NGVIState(**values)
        self.num_steps = num_steps
        return self

    def init_strategy(self) -> Callable:
        """
        A Pyro ``init_strategy`` drawing each latent site from the posterior, e.g. to start
        SG-MCMC particles: ``SGLD(model, ..., init_strategy=vi.init_strategy())`` (each
        particle gets its own joint draw).
        """
        self._require_fit()
        return _PosteriorInit(self)


class _PosteriorInit:
    """Init strategy: one posterior draw per model run (per particle)."""

    def __init__(self, vi):
        self.vi = vi
        self._values = None
        self._used = set()

    def __call__(self, site):
        name = site["name"]
        layout = self.vi.potential.layout.get(name)
        if layout is None:
            return init_to_uniform(site)
        if self._values is None or name in self._used:
            self._values = {k: v[0] for k, v in self.vi._draw(1).items()}
            self._used = set()
        self._used.add(name)
        value = self._values[name]
        return value.expand(site["fn"].shape()) if value.shape != site["fn"].shape() else value
