"""
Online Bayesian learning for Pyro models: Gaussian beliefs over a model's latent sites
updated one observation (or minibatch) at a time by BONG and its relatives (Jones, Chang
& Murphy 2024), low-rank (LoFi) and outlier-robust (WoLF) variants, and decision making
on top of them.
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
from .filters import BONG, IMQ, LoFi, OnlineDivergenceError, OnlineInputError, WoLF

__all__ = [
    "BONG",
    "IMQ",
    "LoFi",
    "OnlineDivergenceError",
    "OnlineInputError",
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
