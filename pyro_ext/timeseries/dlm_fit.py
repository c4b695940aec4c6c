"""
Maximum-likelihood fitting of a dynamic linear model's scales, by L-BFGS through the exact
Kalman likelihood (:meth:`~pyro_ext.timeseries.DLM.log_likelihood`).

The model is given as a function of its scales, so any combination of components (and any
tying of scales between them) fits: ``make_dlm(scales) -> DLM`` with ``scales`` a dict of
positive 0-dim tensors. The scales are optimised on the log scale, from ``init`` and from
``num_restarts - 1`` further starts around it; the best start by log-likelihood is kept.
This is the estimator of statsmodels' ``UnobservedComponents.fit`` (there by BFGS with
numerical or approximate derivatives; here with the exact gradient of the Kalman filter).

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
from collections.abc import Callable
from typing import NamedTuple

import torch

from ..ops.validation import check_int, check_positive
from .dlm import DLM

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
    max_iterations: int = 200,
    tolerance: float = 1e-9,
    seed: int = 0,
) -> DLMFit:
    """Maximum-likelihood scales of a DLM (see the module docstring).

    :param make_dlm: ``scales -> DLM``, ``scales`` a dict of positive 0-dim tensors (on
        ``y``'s device and dtype) keyed as ``init``.
    :param y: ``(T,)`` floating-point observations, ``NaN`` where missing.
    :param dict init: name -> positive starting scale (the first start).
    :param int num_restarts: starts in all; each further one multiplies every starting
        scale by ``exp(z)``, ``z ~ N(0, 1)`` (seeded by ``seed``), against local optima.
    :param int max_iterations: L-BFGS iterations per start.
    :param float tolerance: L-BFGS's tolerance on the change of the log-likelihood and on
        the gradient of the log-scales.
    :returns: :class:`DLMFit`.
    :raises TypeError: if ``make_dlm`` is not callable, ``y`` not a floating-point tensor,
        ``init`` not a non-empty dict, or ``make_dlm`` does not return a :class:`DLM`.
    :raises ValueError: if a starting scale is not positive and finite, or no start reaches
        a finite log-likelihood.
    """
    if not callable(make_dlm):
        raise TypeError(f"make_dlm must be callable (scales -> DLM), got {make_dlm!r}")
    if not (isinstance(y, torch.Tensor) and y.is_floating_point()):
        raise TypeError(f"y must be a floating-point tensor, got {type(y).__name__}")
    if not isinstance(init, dict) or not init:
        raise TypeError(f"init must be a non-empty dict of name -> starting scale, got {init!r}")
    starts = {name: check_positive(value, f"init[{name!r}]") for name, value in init.items()}
    num_restarts = check_int(num_restarts, "num_restarts", low=1)
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

    best, finals = None, []
    for start in [base] + list(base + jitter):
        log_scales = start.to(**options).requires_grad_()
        optimizer = torch.optim.LBFGS(
            [log_scales],
            max_iter=max_iterations,
            tolerance_grad=tolerance,
            tolerance_change=tolerance,
            line_search_fn="strong_wolfe",
        )

        def closure(log_scales=log_scales, optimizer=optimizer):
            optimizer.zero_grad()
            loss = -build(log_scales).log_likelihood(y)
            if torch.isfinite(loss):
                loss.backward()
            return loss

        optimizer.step(closure)
        with torch.no_grad():
            value = float(build(log_scales).log_likelihood(y))
        iterations = optimizer.state[log_scales].get("n_iter", 0)
        finals.append(value if math.isfinite(value) else -math.inf)
        if math.isfinite(value) and (best is None or value > best[0]):
            best = (value, log_scales.detach().clone(), iterations < max_iterations)
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
