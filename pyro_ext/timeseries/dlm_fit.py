r"""
Maximum-likelihood fitting of a dynamic linear model's scales, by L-BFGS through the exact
Kalman likelihood (:meth:`~pyro_ext.timeseries.DLM.log_likelihood`), or by EM.

The model is given as a function of its scales, so any combination of components (and any
tying of scales between them) fits: ``make_dlm(scales) -> DLM`` with ``scales`` a dict of
positive 0-dim tensors. The scales are optimised on the log scale, from ``init`` and from
``num_restarts - 1`` further starts around it; the best start by log-likelihood is kept.
This is the estimator of statsmodels' ``UnobservedComponents.fit`` (there by BFGS with
numerical or approximate derivatives; here with the exact gradient of the Kalman filter,
which on CPU comes in closed form from one filter and smoother pass of the compiled kernels:
see :func:`~pyro_ext.timeseries.kalman_log_likelihood`). Where the model's disturbance and
observation variances are linear in the squared scales (local levels, trends, seasons, and
any tying of their scales), ``make_dlm`` is called only at set-up: each evaluation then
assembles those two matrices from the scales and nothing else, and takes the
log-likelihood and its gradient from one forward pass of a compiled filter that carries
the moments' derivatives along each squared scale.

``method="em"`` runs the EM algorithm of Shumway & Stoffer (1982) instead: the E-step is one
Kalman filter and smoother pass (with the lag-one covariances
:math:`\mathrm{Cov}(x_t, x_{t-1} \mid y)`), the M-step the closed-form variance of each
scale's state disturbances (or of the observation noise). It applies when every scale is the
scale of its own diagonal entries of the disturbance covariance ``W`` (or of the observation
variance), as in :class:`~pyro_ext.timeseries.LocalLevel`,
:class:`~pyro_ext.timeseries.LocalLinearTrend` and :class:`~pyro_ext.timeseries.Seasonal`,
and the prior of the first state does not depend on them; every iteration raises the
likelihood (checked). EM is robust far from the optimum but converges linearly, so it
takes more passes than L-BFGS near it, and creeps towards a scale whose maximum-likelihood
value is 0 (a component the data do not need), which L-BFGS reaches faster.

Example: the Nile's local level model (Durbin & Koopman 2012, section 2.10, where the
maximum-likelihood variances are 15099 and 1469.1):

>>> from pyro_ext.datasets import load_nile
>>> from pyro_ext.timeseries import DLM, LocalLevel, fit_dlm
>>> _, flow = load_nile(dtype=torch.float64)
>>> fit = fit_dlm(
...     lambda s: DLM(LocalLevel(s["level"], init_scale=1e4), s["observation"]),
...     flow,
...     {"level": 10.0, "observation": 100.0},
... )
>>> round(fit.scales["observation"] ** 2), round(fit.scales["level"] ** 2)
(15099, 1469)
"""

import math
import warnings
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pyro
import scipy.optimize
import torch

from ..ops.validation import check_choice, check_int, check_positive
from . import _sequential, kalman
from .dlm import DLM
from .kalman import smoothed_second_moments

__all__ = ["DLMFit", "fit_dlm"]


class DLMFit(NamedTuple):
    """What :func:`fit_dlm` returns.

    :ivar DLM dlm: the model at the maximum-likelihood scales.
    :ivar dict scales: the fitted scales, name -> float.
    :ivar float log_likelihood: :math:`\\log p(y \\mid \\text{scales})` there.
    :ivar bool converged: whether L-BFGS stopped on its tolerance before ``max_iterations``.
    :ivar list restart_log_likelihoods: the final log-likelihood of every start, the kept
        one included (``-inf`` for a start whose likelihood was not finite).
    """

    dlm: DLM
    scales: dict
    log_likelihood: float
    converged: bool
    restart_log_likelihoods: list


def fit_dlm(
    make_dlm: Callable[[dict], DLM],
    y: torch.Tensor,
    init: dict,
    *,
    num_restarts: int = 3,
    max_iterations: int | None = None,
    tolerance: float = 1e-9,
    seed: int = 0,
    method: str = "lbfgs",
) -> DLMFit:
    """Maximum-likelihood scales of a DLM (see the module docstring).

    :param make_dlm: ``scales -> DLM``, ``scales`` a dict of positive 0-dim tensors (on
        ``y``'s device and dtype) keyed as ``init``.
    :param y: ``(T,)`` floating-point observations, ``NaN`` where missing.
    :param dict init: name -> positive starting scale (the first start).
    :param int num_restarts: starts in all; each further one multiplies every starting
        scale by ``exp(z)``, ``z ~ N(0, 1)`` (seeded by ``seed``), against local optima.
    :param int max_iterations: per start, L-BFGS iterations (default 200) or EM's filter and
        smoother passes (default 1,000: EM creeps towards a scale whose maximum-likelihood
        value is 0, where L-BFGS is the better choice).
    :param float tolerance: L-BFGS stops when an iteration changes the log-likelihood by
        less than ``tolerance`` times its magnitude at the start (at least 1), or when no
        entry of the gradient of the log-scales exceeds ``tolerance``; EM stops when an
        iteration raises the log-likelihood by less than ``tolerance`` per observation.
    :param str method: ``"lbfgs"`` (default) or ``"em"`` (see the module docstring).
    :returns: :class:`DLMFit`.
    :raises TypeError: if ``make_dlm`` is not callable, ``y`` not a floating-point tensor,
        ``init`` not a non-empty dict, or ``make_dlm`` does not return a :class:`DLM`.
    :raises ValueError: if a starting scale is not positive and finite, the model at
        ``init`` fails the Kalman functions' value checks (checked once, at set-up; later
        evaluations run unchecked and an invalid point gets a NaN log-likelihood), no start
        reaches a finite log-likelihood, or ``method="em"`` meets a model EM does not apply
        to (the message says why; ``method="lbfgs"`` fits it).
    """
    if not callable(make_dlm):
        raise TypeError(f"make_dlm must be callable (scales -> DLM), got {make_dlm!r}")
    if not (isinstance(y, torch.Tensor) and y.is_floating_point()):
        raise TypeError(f"y must be a floating-point tensor, got {type(y).__name__}")
    if not isinstance(init, dict) or not init:
        raise TypeError(f"init must be a non-empty dict of name -> starting scale, got {init!r}")
    starts = {name: check_positive(value, f"init[{name!r}]") for name, value in init.items()}
    num_restarts = check_int(num_restarts, "num_restarts", low=1)
    check_choice(method, "method", ("lbfgs", "em"))
    if max_iterations is None:
        max_iterations = 1000 if method == "em" else 200
    max_iterations = check_int(max_iterations, "max_iterations", low=1)
    tolerance = check_positive(tolerance, "tolerance")
    seed = check_int(seed, "seed")
    names = list(starts)
    base = torch.tensor([math.log(starts[n]) for n in names], dtype=torch.float64)
    # Starts are drawn on the CPU, so that a seed gives the same fit on every device.
    generator = torch.Generator(device="cpu").manual_seed(seed)
    jitter = torch.randn(num_restarts - 1, len(names), generator=generator, dtype=torch.float64)
    options = dict(dtype=y.dtype, device=y.device)

    def build(log_scales):
        model = make_dlm({n: log_scales[i].exp() for i, n in enumerate(names)})
        if not isinstance(model, DLM):
            raise TypeError(f"make_dlm must return a DLM, got {type(model).__name__}")
        return model

    _warn_if_the_prior_misses_the_data(build(base.to(**options)), y)
    if method == "em":
        return _fit_em(
            build,
            names,
            y,
            [base] + list(base + jitter),
            options,
            max_iterations,
            tolerance,
            init,
            num_restarts,
        )
    # The model's values are checked once, at the first start (a covariance that is not
    # positive semi-definite is named there); the optimiser's evaluations then run unchecked,
    # as samplers evaluate potentials: a step into an invalid region gets a NaN
    # log-likelihood, which the line search backs away from.
    build(base.to(**options)).log_likelihood(y)
    scored = _kernel_score(build, base.to(**options), y)
    best, finals = None, []
    for start in [base] + list(base + jitter):
        log_scales, value, status = _lbfgs(
            build, y, scored, start.to(**options), max_iterations, tolerance
        )
        finals.append(value if math.isfinite(value) else -math.inf)
        if math.isfinite(value) and (best is None or value > best[0]):
            best = (value, log_scales, status == 0)
    return _kept(best, finals, build, names, init, num_restarts)


def _warn_if_the_prior_misses_the_data(model, y):
    """Warn when the first observation lies more than 10 of the model's prior standard
    deviations (of ``F x_1``) from the prior's mean: a first state's prior of the wrong
    magnitude (a component's default ``init_scale`` on data in the thousands) that the fit
    compensates for with inflated variances, at a far lower likelihood."""
    if y.dim() != 1 or y.shape[0] == 0 or bool(torch.isnan(y[0])):
        return
    matrices = model.matrices(y.shape[0])
    F = matrices.observation_matrix
    F = (F[0] if F.dim() == 3 else F).reshape(-1).to(y.dtype)
    spread = float(F @ matrices.init_cov.to(y.dtype) @ F)
    miss = abs(float(y[0] - F @ matrices.init_mean.to(y.dtype)))
    if spread > 0 and miss > 10 * spread**0.5:
        warnings.warn(
            f"y[0] = {float(y[0]):.4g} lies {miss / spread**0.5:.0f} prior standard deviations "
            "from the model's first state: its prior (the components' init_scale) is far too "
            "narrow for these data, and the fitted variances will grow to make up for it. "
            "Give init_scale of the data's magnitude (e.g. LocalLevel(..., init_scale="
            f"{10 ** math.ceil(math.log10(max(miss, 1.0))):.0e})), or centre y",
            UserWarning,
            stacklevel=3,
        )


def _lbfgs(build, y, scored, start, max_iterations, tolerance):
    """One L-BFGS run from the log-scales ``start``: ``(log_scales, log-likelihood there,
    status)``, the status L-BFGS-B's (0: converged; 1: out of iterations or evaluations; 2:
    the line search failed). Each evaluation takes the kernels' ``scored`` where it applies,
    else autograd through the model's own ``log_likelihood``.

    The optimiser is scipy's L-BFGS-B (the one statsmodels fits with), fed the value and
    the exact gradient as float64 numpy arrays: on a local level model its own work per
    iteration is a few microseconds, where ``torch.optim.LBFGS`` spends a quarter of a
    millisecond in Python, more than the Kalman pass itself. It stops when the largest
    gradient entry is below ``tolerance`` or the log-likelihood changes by less than
    ``tolerance`` (relative to the start's, as L-BFGS-B measures it). A point where the
    likelihood is not finite (a variance that overflows) gets a value above every finite one
    seen, which the line search backs off from."""
    options = dict(dtype=start.dtype, device=start.device)
    seen = {}  # the log-likelihood at each point evaluated, so the last is not redone

    def evaluate(x):
        out = None if scored is None else scored(x)
        if out is not None:
            value, gradient = out
        else:
            log_scales = torch.from_numpy(x).to(**options).requires_grad_()
            log_likelihood = build(log_scales).log_likelihood(y)
            value, gradient = float(log_likelihood.detach()), np.zeros_like(x)
            if math.isfinite(value):
                gradient = torch.autograd.grad(log_likelihood, log_scales)[0]
                gradient = gradient.detach().to(torch.float64).cpu().numpy()
        seen[tuple(x.tolist())] = value
        if not (math.isfinite(value) and np.isfinite(gradient).all()):
            # An infinite or NaN value would end the run there as if it had converged.
            return penalty, np.zeros_like(gradient)
        return -value, -gradient

    x0 = start.detach().to(torch.float64).cpu().numpy()
    penalty = math.inf
    with pyro.validation_enabled(False):
        first, gradient = evaluate(x0)
        if not math.isfinite(first):
            return start, seen[tuple(x0.tolist())], 2
        penalty = 1e10 * (1 + abs(first))
        result = scipy.optimize.minimize(
            lambda x: (first, gradient) if np.array_equal(x, x0) else evaluate(x),
            x0,
            jac=True,
            method="L-BFGS-B",
            options=dict(
                maxiter=max_iterations,
                maxfun=max(2 * max_iterations, 20),
                gtol=tolerance,
                ftol=tolerance / max(1.0, abs(first)),
            ),
        )
        value = seen.get(tuple(result.x.tolist()))
        if value is None:
            with torch.no_grad():
                value = float(build(torch.from_numpy(result.x).to(**options)).log_likelihood(y))
    return torch.from_numpy(result.x).to(**options), value, int(result.status)


class _KernelInputs:
    """The compiled Kalman kernels' float64 inputs (:func:`~.kalman._sequential_inputs`) of
    a model whose ``W`` and ``V`` are linear in the squared scales (a :class:`_Linear`) and
    their outputs (a :class:`~.kalman._KernelRun`, which EM's E-step runs), made once:
    :meth:`at` writes ``W``'s and ``V``'s values in place (arrays of its own, never the
    model's), so that an evaluation neither rebuilds the model nor validates, converts or
    allocates arrays again. ``tangent_inputs``, ``initial`` and ``tangent_out`` are the
    forward-mode filter's views of the same arrays and its output (see
    :func:`_kernel_score`)."""

    def __init__(self, linear, args):
        self.args = args
        inputs = list(kalman._sequential_inputs(args))
        S = inputs[5].shape[-1]
        inputs[3] = np.zeros((1, 1, S, S))
        inputs[4] = np.empty((1, 1, 1, 1))
        self.run = kalman._KernelRun(tuple(inputs))
        # W's diagonal as a writable view (np.fill_diagonal costs microseconds a call).
        self.w_diagonal = inputs[3].reshape(-1)[:: S + 1]
        self.state = linear.state.detach().to(torch.float64).cpu().numpy()
        self.observation = linear.observation.detach().to(torch.float64).cpu().numpy()
        # The forward-mode filter's views of the same arrays (one series, static matrices,
        # scalar observations): W is read where at() writes it, V passed by value.
        y, G, F, W, _, m0, P0 = inputs
        self.tangent_inputs = (y[0, :, 0], G[0, 0], F[0, 0, 0], W[0, 0])
        self.initial = (m0[0], P0[0], self.state, self.observation)
        self.tangent_out = np.empty(2 + self.observation.shape[0])

    @staticmethod
    def of(linear, y):
        """The inputs of ``y`` ``(T,)`` under ``linear``'s model, or ``None`` where the
        kernels do not run (CUDA tensors, numba not installed, the kernels switched off).
        The model's values are not checked again (:func:`fit_dlm` has checked them)."""
        with pyro.validation_enabled(False):
            args = kalman._validate(y.unsqueeze(-1), linear.matrices)
        if not _sequential.available("_kalman_kernels", *args[:7]):
            return None
        return _KernelInputs(linear, args)

    def at(self, log_scales):
        """Set ``W`` and ``V`` to their values at ``log_scales`` (a float64 numpy array) and
        return the squared scales. A line search's step that overflows gives infinite
        variances (and a NaN log-likelihood), as the model's own path gives them, without
        numpy's warnings."""
        with np.errstate(over="ignore", invalid="ignore"):
            squared = np.exp(2 * log_scales)
            self.w_diagonal[:] = squared @ self.state
            self.run.arrays[4][0, 0, 0, 0] = squared @ self.observation
        return squared


def _kernel_score(build, log_scales, y):
    """For a model whose ``W`` and ``V`` are linear in the squared scales
    (:func:`_linear_in_squared_scales`), on tensors the compiled Kalman kernels take: a
    function ``log_scales -> (log-likelihood, its gradient)`` on float64 numpy arrays that
    sets only ``W`` and ``V`` (:class:`_KernelInputs`) and takes both from one pass of the
    forward-mode filter (``tangent_filter`` of the kernels: the moments' derivatives along
    each squared scale, whose ``W`` and ``V`` move by ``c_k`` and ``d_k``), the gradient by
    the chain rule ``d/d log s_k = 2 s_k^2 d/d s_k^2``; it returns ``None`` where the
    kernel stops (an innovation variance not positive), for the model's own path. ``None``
    for other models.

    One pass replaces the filter, the RTS smoother and the score (Fisher's identity, as
    :func:`~pyro_ext.timeseries.kalman_log_likelihood` computes the gradient): a DLM has a
    few scales, and the pass costs ``O(K S^3)`` per step against the three's ``O(S^3)``
    each; both switch to the steady state. ``benchmarks/kalman_gradient.py`` times a whole
    evaluation against the three kernels alone: 0.011 against 0.041 ms on a local level (T =
    100), 2.8 against 3.1 ms and 8.2 against 24.7 ms on a trend with a 12-season component
    (4 scales, T = 500 and 5,000)."""
    if y.dim() != 1:
        return None
    linear, _ = _linear_in_squared_scales(build, log_scales, y.shape[0])
    if linear is None:
        return None
    kernel_inputs = _KernelInputs.of(linear, y)
    if kernel_inputs is None:
        return None
    kernels = _sequential.kernels("_kalman_kernels")
    tangent_inputs, initial = kernel_inputs.tangent_inputs, kernel_inputs.initial
    out, V = kernel_inputs.tangent_out, kernel_inputs.run.arrays[4]

    def scored(point):
        squared = kernel_inputs.at(point)
        if kernels.tangent_filter(*tangent_inputs, V[0, 0, 0, 0], *initial, out) >= 0:
            return None
        with np.errstate(over="ignore", invalid="ignore"):
            gradient = 2 * squared * out[1:-1]
        return float(out[0]), gradient

    return scored


def _kept(best, finals, build, names, init, num_restarts):
    """The :class:`DLMFit` of the best start ``(log-likelihood, log scales, converged)``."""
    if best is None:
        raise ValueError(
            f"no start of fit_dlm reached a finite log-likelihood ({num_restarts} tried from "
            f"init={init}): check y and make_dlm, or give starting scales of y's magnitude"
        )
    value, log_scales, converged = best
    return DLMFit(
        build(log_scales),
        {n: float(log_scales[i].exp()) for i, n in enumerate(names)},
        value,
        converged,
        finals,
    )


# -- EM (Shumway & Stoffer 1982) --------------------------------------------------------------
class _Linear(NamedTuple):
    """How the scales enter a model whose only scale-dependent matrices are ``W =
    diag(sum_k s_k^2 c_k)`` and ``V = sum_k s_k^2 d_k`` (static, one series, scalar
    observations), read by :func:`_linear_in_squared_scales`."""

    #: ``(K, S)``: ``c_ki``, the coefficient of ``s_k^2`` in ``W_ii``
    state: torch.Tensor
    #: ``(K,)``: ``d_k``, that of ``s_k^2`` in ``V``
    observation: torch.Tensor
    #: the model's :class:`StateSpaceMatrices` at the scales read
    matrices: object
    #: entries below this are taken for zero coefficients
    tol: float

    def at(self, log_scales):
        """The :class:`StateSpaceMatrices` at ``log_scales`` (half log squared scales)."""
        squared = (2 * log_scales).exp()
        return self.matrices._replace(
            transition_cov=torch.diag_embed(squared @ self.state),
            observation_cov=(squared @ self.observation).reshape(1, 1),
        )


def _linear_in_squared_scales(build, log_scales, num_steps):
    """``(_Linear, None)`` when ``W`` and ``V`` are, exactly, the linear functions of the
    squared scales :class:`_Linear` describes, and ``G``, ``F`` and the first state's prior do
    not depend on the scales (read by doubling each squared scale in turn); else ``(None,
    why)``. :class:`~pyro_ext.timeseries.LocalLevel`,
    :class:`~pyro_ext.timeseries.LocalLinearTrend` and :class:`~pyro_ext.timeseries.Seasonal`
    models are."""

    def read(log_s):
        return build(log_s).matrices(num_steps)

    base = read(log_scales)
    G, F, W, V = (
        base.transition_matrix,
        base.observation_matrix,
        base.transition_cov,
        base.observation_cov,
    )
    if W.dim() != 2 or V.dim() != 2 or G.dim() != 2 or F.dim() != 2:
        return None, "its matrices vary over time or carry a batch (a regression component)"
    if V.shape != (1, 1):
        return None, "its observations are not scalar"
    if bool((W - torch.diag(W.diagonal())).abs().max() > 0):
        return None, "its disturbance covariance W is not diagonal"
    scales2 = (2 * log_scales).exp()
    state, observation = [], []
    for k in range(log_scales.shape[0]):
        bumped = log_scales.clone()
        bumped[k] = bumped[k] + 0.5 * math.log(2.0)  # doubles s_k^2
        try:
            m = read(bumped)
        except Exception as error:  # a probe: make_dlm may refuse the doubled value
            return None, (
                f"make_dlm refused scale {k} doubled ({type(error).__name__}: {error}), so "
                "it is not a variance's scale"
            )
        if not (
            torch.equal(m.transition_matrix, G)
            and torch.equal(m.observation_matrix, F)
            and torch.equal(m.init_mean, base.init_mean)
            and torch.equal(m.init_cov, base.init_cov)
        ):
            return None, "a scale changes G, F or the first state's prior (only W and V may)"
        state.append((m.transition_cov.diagonal() - W.diagonal()) / scales2[k])
        observation.append((m.observation_cov[0, 0] - V[0, 0]) / scales2[k])
    state, observation = torch.stack(state), torch.stack(observation)
    rebuilt_w = (scales2.unsqueeze(-1) * state).sum(0)
    rebuilt_v = (scales2 * observation).sum()
    # Round-off of the model's own dtype: float32 matrices rebuild to about 1e-7.
    rtol = max(1e-8, 100 * torch.finfo(W.dtype).eps)
    tol = rtol * max(1.0, float(W.diagonal().abs().max()), float(V.abs().max()))
    if not (
        torch.allclose(rebuilt_w, W.diagonal(), rtol=rtol, atol=tol)
        and torch.allclose(rebuilt_v, V[0, 0], rtol=rtol, atol=tol)
    ):
        return None, "W and V are not linear in the squared scales"
    return _Linear(state, observation, base, tol), None


class _Patterns(NamedTuple):
    """How each scale enters the model, ``W = diag(sum_k s_k^2 c_k)`` and ``V = sum_k s_k^2
    d_k``, as the M-step uses it: ``s_k^2`` is the mean of the disturbances' second moments
    divided by their coefficients over the entries scale ``k`` owns."""

    #: ``(K, S)``: ``1 / c_ki`` where scale ``k`` drives state ``i``, else 0
    state_weights: torch.Tensor
    #: ``(K,)``: ``1 / d_k`` where scale ``k`` drives the observation, else 0
    observation_weights: torch.Tensor
    #: ``(K,)``: how many states scale ``k`` drives
    num_states: torch.Tensor
    #: ``(K,)``: 1 where scale ``k`` drives the observation, else 0
    observes: torch.Tensor


def _em_patterns(build, log_scales, num_steps):
    """Read each scale's coefficients (:func:`_linear_in_squared_scales`) and check that
    EM's M-step applies: each state or the observation driven by at most one scale, none
    lowered by one. Returns the :class:`_Patterns` and the :class:`_Linear` structure."""
    linear, why = _linear_in_squared_scales(build, log_scales, num_steps)
    if why is None:
        state, observation, tol = linear.state, linear.observation, linear.tol
        drives = (state.abs() > tol).sum(0)
        if bool((state < -tol).any()) or bool((observation < -tol).any()):
            why = "a scale lowers a variance"
        elif bool((drives > 1).any()) or int((observation.abs() > tol).sum()) > 1:
            why = "two scales drive the same state (or both the observation)"
        elif bool(((state.abs() > tol).sum(1) + (observation.abs() > tol)).eq(0).any()):
            why = "a scale drives neither a state nor the observation"
    if why is not None:
        raise ValueError(
            f"method='em' fits scales that each own diagonal entries of W or the observation "
            f"variance; this model cannot be fitted by EM: {why}. Use method='lbfgs'"
        )
    drives, observes = state > tol, observation > tol
    patterns = _Patterns(
        torch.where(drives, state.reciprocal(), torch.zeros_like(state)),
        torch.where(observes, observation.reciprocal(), torch.zeros_like(observation)),
        drives.sum(-1).to(state.dtype),
        observes.to(state.dtype),
    )
    return patterns, linear


def _em_step(y, moments, patterns, G, F, present):
    """The M-step's new squared scales ``(K,)`` from the E-step's ``moments`` (smoothed
    means, covariances, lag-one covariances and log-likelihood, as
    :func:`~pyro_ext.timeseries.kalman.smoothed_second_moments` gives them), with the
    log-likelihood at the current scales."""
    means, covs, cross, log_likelihood = moments
    # E[(x_t - G x_{t-1})_i^2], t = 2..T: the disturbances' second moments.
    residual = means[1:] - means[:-1] @ G.mT
    GP = G @ covs[:-1]
    second = (
        residual.square()
        + covs[1:].diagonal(dim1=-2, dim2=-1)
        + (GP * G).sum(-1)
        - 2 * (cross * G).sum(-1)
    )
    state_totals = second.sum(0)  # (S,)
    num_transitions = second.shape[0]
    # E[(y_t - F x_t)^2] at the observed steps.
    fitted = (means @ F.mT).squeeze(-1)
    spread = ((covs @ F.mT).squeeze(-1) * F.squeeze(0)).sum(-1)
    obs_terms = torch.where(present, (y - fitted).square() + spread, torch.zeros_like(y))
    # The M-step of every scale at once: its entries' second moments over their count.
    total = patterns.state_weights @ state_totals + patterns.observation_weights * obs_terms.sum()
    count = patterns.num_states * num_transitions + patterns.observes * present.sum()
    return total / count, float(log_likelihood)


def _numpy64(x):
    """``x`` as a float64 numpy array (on the CPU)."""
    return x.detach().to(torch.float64).cpu().numpy()


def _fit_em(build, names, y, starts, options, max_iterations, tolerance, init, num_restarts):
    """
    :func:`fit_dlm` with ``method="em"``: EM from each start, the best kept. EM's linear
    convergence is accelerated by SQUAREM (Varadhan & Roland 2008, scheme S3) on the log
    squared scales: two EM steps give an extrapolated point, kept only when its likelihood
    is at least the second step's, so every accepted point raises the likelihood as plain
    EM does. ``max_iterations`` counts E-steps (filter and smoother passes).
    """
    if y.dim() != 1:
        raise ValueError(f"method='em' fits one series y of shape (T,), got {tuple(y.shape)}")
    present = ~torch.isnan(y)
    num_observed = int(present.sum())
    patterns, linear = _em_patterns(build, starts[0].to(**options), y.shape[0])
    G, F = linear.matrices.transition_matrix, linear.matrices.observation_matrix
    build(starts[0].to(**options)).log_likelihood(y)  # the values checked once (see lbfgs)
    kernel_inputs = _KernelInputs.of(linear, y)
    if kernel_inputs is not None and (
        kernel_inputs.run.arrays[1].shape[1] != 1 or kernel_inputs.run.arrays[2].shape[1] != 1
    ):
        kernel_inputs = None  # the compiled M-step takes a static G and F
    tiny = torch.finfo(y.dtype).tiny

    if kernel_inputs is not None:
        # The E- and M-steps on the kernels' float64 arrays, whose buffers every pass
        # reuses: the filter, the smoother and the M-step's sums (em_statistics) are three
        # compiled calls, and the scales stay numpy vectors (the torch M-step's thirty small
        # tensor operations took 60 of a pass's 140 us on the Nile, one-off).
        run = kernel_inputs.run
        kernels = _sequential.kernels("_kalman_kernels")
        y_np, G_np, F_np = run.arrays[0][0, :, 0], run.arrays[1][0, 0], run.arrays[2][0, 0, 0]
        weights = _numpy64(patterns.state_weights)
        observation_weights = _numpy64(patterns.observation_weights)
        count = _numpy64(patterns.num_states) * (y.shape[0] - 1) + _numpy64(
            patterns.observes
        ) * float(num_observed)
        state_totals = np.empty(G_np.shape[0])

        def em_map(log_s):
            """One EM step from ``log_s`` (half log squared scales, a float64 numpy
            vector): the next point and the log-likelihood at ``log_s`` (``-inf`` where the
            pass fails)."""
            kernel_inputs.at(log_s)
            value = float(run.ll[0]) if run.smoother() else -math.inf
            if not math.isfinite(value):
                return log_s, -math.inf
            means, covs, gains = (x[0] for x in run.smoothed)
            observation_total, _ = kernels.em_statistics(
                y_np, G_np, F_np, means, covs, gains, state_totals
            )
            squared = (weights @ state_totals + observation_weights * observation_total) / count
            return 0.5 * np.log(np.maximum(squared, tiny)), value

    else:

        def em_map(log_s):
            """As above, through :func:`smoothed_second_moments` and the torch M-step."""
            at = torch.from_numpy(log_s).to(**options)
            try:
                with pyro.validation_enabled(False):
                    moments = smoothed_second_moments(y.unsqueeze(-1), linear.at(at))
                    squared, value = _em_step(y, moments, patterns, G, F, present)
            except (torch.linalg.LinAlgError, ValueError):
                return log_s, -math.inf
            if not math.isfinite(value):
                return log_s, -math.inf
            return _numpy64(squared.clamp_min(tiny).log().mul(0.5)), value

    best, finals = None, []
    for start in starts:
        current = _numpy64(start)
        following, value = em_map(current)
        passes, converged = 1, False
        while math.isfinite(value) and passes < max_iterations:
            # The plain step's point and the next; then the extrapolation from the two.
            after, step_value = em_map(following)
            passes += 1
            candidate, candidate_value, next_point = following, step_value, after
            r = following - current
            v = after - following - r
            if passes < max_iterations and np.linalg.norm(v) > 0:
                alpha = min(-np.linalg.norm(r) / np.linalg.norm(v), -1.0)
                extrapolated = current - 2 * alpha * r + alpha**2 * v
                beyond, extrapolated_value = em_map(extrapolated)
                passes += 1
                if extrapolated_value >= step_value:
                    candidate, candidate_value, next_point = (
                        extrapolated,
                        extrapolated_value,
                        beyond,
                    )
            if not math.isfinite(candidate_value):
                break
            if candidate_value < value - 1e-8 * max(1.0, abs(value)):
                raise RuntimeError(
                    f"EM lowered the log-likelihood ({value:.8f} -> {candidate_value:.8f}): a "
                    "bug, please report it"
                )
            gain = candidate_value - value
            current, value, following = candidate, candidate_value, next_point
            if gain < tolerance * num_observed:
                converged = True
                break
        finals.append(value if math.isfinite(value) else -math.inf)
        if math.isfinite(value) and (best is None or value > best[0]):
            best = (value, torch.from_numpy(current.copy()).to(**options), converged)
    return _kept(best, finals, build, names, init, num_restarts)
