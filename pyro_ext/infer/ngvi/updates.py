r"""
Pure updates of natural-gradient mean-field Gaussian variational inference: the Bayesian
learning rule with a diagonal Gaussian posterior (Khan et al. 2018, "Fast and scalable
Bayesian deep learning by weight-perturbation in Adam"; Shen et al. 2024, "Variational
learning is effective for large deep networks", Algorithm 1).

The variational posterior over the ``D`` flat unconstrained parameters is
:math:`q = \mathcal N(m, \mathrm{diag}(\sigma^2))` with

.. math:: \sigma = 1 / \sqrt{\lambda (h + \delta)},

where :math:`\lambda` is the effective sample size (``ess``, the number of data), ``h``
the running estimate of the diagonal Hessian of the average loss :math:`\bar\ell(\theta) =
-\log p(\mathcal D \mid \theta) / \lambda` (non-Gaussian prior terms included), and
:math:`\delta` the precision of the Gaussian prior divided by :math:`\lambda` (a vector:
one entry per coordinate; IVON's weight decay when it is a number). Given the gradient
:math:`\hat g` and a Hessian estimate :math:`\hat h` of :math:`\bar\ell` at a draw
:math:`\theta \sim q`, one step is

.. math::
    g &\leftarrow \beta_1 g + (1 - \beta_1) \hat g, \\
    h &\leftarrow \beta_2 h + (1 - \beta_2) \hat h
        + \tfrac12 (1 - \beta_2)^2 (h - \hat h)^2 / (h + \delta), \\
    m &\leftarrow m - \alpha\, \big(g / (1 - \beta_1^t) + \delta (m - m_0)\big) / (h + \delta),

with the prior mean :math:`m_0`. The three methods differ only in :math:`\hat h`:
IVON's reparameterisation estimate :func:`price_hessian` :math:`\hat g (\theta - m) /
\sigma^2`, VON's exact diagonal Hessian, VOGN's Gauss-Newton diagonal. The
:math:`(h - \hat h)^2` term (IVON's Riemannian correction) keeps ``h + delta`` positive
whatever the sign of :math:`\hat h`. With ``rescale_lr`` the learning rate is
:math:`\alpha (h_0 + \delta)`, as the ``ivon-opt`` package does, so that the first steps
move the mean as far as SGD with learning rate :math:`\alpha` would.
"""

import math
from typing import NamedTuple

import torch


class NGVIState(NamedTuple):
    """The state of a natural-gradient VI run; every field but ``count`` has shape ``(D,)``."""

    #: the mean ``m`` of the Gaussian posterior in unconstrained space
    mean: torch.Tensor
    #: the running Hessian estimate ``h`` of the average loss
    hess: torch.Tensor
    #: the gradient momentum ``g``
    momentum: torch.Tensor
    #: the number of updates so far, a 0-dim tensor
    count: torch.Tensor


def init_state(mean: torch.Tensor, hess_init: float) -> NGVIState:
    """The state before the first step: momentum 0 and ``h = hess_init`` everywhere."""
    return NGVIState(
        mean,
        torch.full_like(mean, hess_init),
        torch.zeros_like(mean),
        torch.zeros((), dtype=mean.dtype, device=mean.device),
    )


def posterior_scale(state: NGVIState, ess, prior_precision) -> torch.Tensor:
    """
    The posterior standard deviation ``sigma = 1 / sqrt(ess (h + delta))``.

    >>> import torch
    >>> state = init_state(torch.zeros(2), hess_init=1.0)
    >>> posterior_scale(state, ess=100, prior_precision=0.0)
    tensor([0.1000, 0.1000])
    """
    return torch.rsqrt(ess * (state.hess + prior_precision))


def price_hessian(grads, noise, state: NGVIState, ess, prior_precision) -> torch.Tensor:
    r"""
    IVON's estimate of the diagonal Hessian from gradients alone (Price's theorem with the
    reparameterisation trick): the mean over draws of :math:`\hat g_s \epsilon_s /
    \sigma^2`, where :math:`\theta_s = m + \epsilon_s`. ``grads`` and ``noise`` have shape
    ``(S, D)`` for ``S`` Monte Carlo draws.
    """
    return (grads * noise).mean(0) * ess * (state.hess + prior_precision)


def ngvi_update(
    state: NGVIState,
    grad: torch.Tensor,
    hess_estimate: torch.Tensor,
    lr: float,
    prior_precision,
    prior_mean,
    beta1: float = 0.9,
    beta2: float = 0.999,
    hess_init: float = 1.0,
    clip_radius: float = math.inf,
    debias: bool = True,
    rescale_lr: bool = True,
) -> NGVIState:
    """
    One step of the update in the module docstring, from the Monte Carlo average gradient
    ``grad`` and Hessian estimate ``hess_estimate`` of the average loss (both ``(D,)``).
    ``prior_precision`` and ``prior_mean`` are numbers or ``(D,)`` tensors.
    """
    count = state.count + 1
    momentum = beta1 * state.momentum + (1.0 - beta1) * grad
    denominator = state.hess + prior_precision
    hess = (
        beta2 * state.hess
        + (1.0 - beta2) * hess_estimate
        + 0.5 * (1.0 - beta2) ** 2 * (state.hess - hess_estimate).square() / denominator
    )
    direction = momentum / (1.0 - beta1**count) if debias else momentum
    direction = (direction + prior_precision * (state.mean - prior_mean)) / (hess + prior_precision)
    if math.isfinite(clip_radius):
        direction = direction.clamp(-clip_radius, clip_radius)
    step = lr * (hess_init + prior_precision) if rescale_lr else lr
    return NGVIState(state.mean - step * direction, hess, momentum, count)
