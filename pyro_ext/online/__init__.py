"""
Online Bayesian learning for Pyro models: Gaussian beliefs over a model's latent sites
updated one observation (or minibatch) at a time by BONG and its relatives (Jones, Chang
& Murphy 2024), low-rank (LoFi) and outlier-robust (WoLF) variants, and decision making
on top of them.

Example: a Bayesian linear regression learnt one point at a time. On a linear-Gaussian
model BONG's default (linearised) update is the Kalman filter, so after the stream the
belief is the exact posterior:

>>> import pyro, pyro.distributions as dist
>>> from pyro_ext.online import BONG
>>> def model(x, y=None):
...     w = pyro.sample("w", dist.Normal(torch.zeros(2), 1.0).to_event(1))
...     with pyro.plate("data", x.shape[0]):
...         return pyro.sample("y", dist.Normal(x @ w, 0.5), obs=y)
>>> x = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
>>> y = torch.tensor([0.9, 2.1, 2.9])
>>> belief = BONG(model)
>>> for i in range(3):
...     belief = belief.update(x[i : i + 1], y[i : i + 1])  # returns itself
>>> cov = torch.linalg.inv(torch.eye(2) + x.T @ x / 0.5**2)  # the conjugate posterior
>>> torch.allclose(belief.mean, cov @ x.T @ y / 0.5**2, atol=1e-5)
True
>>> torch.allclose(belief.covariance(), cov, atol=1e-5)
True
"""

from .bandits import (
    BanditHistory,
    BayesOptResult,
    BernoulliBandit,
    GaussianBandit,
    LinearContextualBandit,
    LogisticContextualBandit,
    ThompsonBandit,
    bayes_opt_1d,
    bernoulli_arms_model,
    gaussian_arms_model,
    linear_contextual_model,
    logistic_contextual_model,
    neural_contextual_model,
)
from .filters import (
    BONG,
    IMQ,
    LoFi,
    OnlineDivergenceError,
    OnlineInputError,
    OnlinePredictions,
    WoLF,
)

__all__ = [
    "BONG",
    "IMQ",
    "LoFi",
    "OnlineDivergenceError",
    "OnlineInputError",
    "OnlinePredictions",
    "WoLF",
    "BanditHistory",
    "BayesOptResult",
    "BernoulliBandit",
    "GaussianBandit",
    "LinearContextualBandit",
    "LogisticContextualBandit",
    "ThompsonBandit",
    "bayes_opt_1d",
    "bernoulli_arms_model",
    "gaussian_arms_model",
    "linear_contextual_model",
    "logistic_contextual_model",
    "neural_contextual_model",
]
