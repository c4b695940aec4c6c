"""Models: Bayesian neural networks (thesis sections 1.3.2 and 2.3.3), the variational
autoencoders of the VIS experiments (section 2.4.2) and the retail Bayesian structural time
series of chapter 1.2 (``pyro_ext.models.bsts``).

Example: a network without hidden layers is a Bayesian linear regression; SGLD with its
default step recovers the coefficients:

>>> import pyro
>>> from pyro_ext.infer import MCMC, SGLD
>>> from pyro_ext.models import BayesianMLP
>>> pyro.set_rng_seed(0)
>>> x = torch.randn(100, 3)
>>> y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.1 * torch.randn(100)
>>> net = BayesianMLP(3, hidden=())
>>> kernel = SGLD(net, num_particles=4)  # the default step size
>>> mcmc = MCMC(kernel, num_samples=200, warmup_steps=200, thinning=5, disable_progbar=True)
>>> mcmc.run(x, y)
>>> mcmc.get_samples()["layers.0.weight"].mean(0).round(decimals=1).tolist()
[[1.0, -2.0, 0.5]]
"""

from . import bnn, bsts, vae
from .bnn import (
    BayesianMLP,
    expected_calibration_error,
    log_predictive_density,
    predictive_moments,
    rmse,
)
from .bsts import RetailBSTS, RetailData, simulate_retail
from .vae import CVAE, VAE, importance_log_likelihood, refined_mean_proposal

__all__ = [
    "BayesianMLP",
    "CVAE",
    "RetailBSTS",
    "RetailData",
    "VAE",
    "bnn",
    "bsts",
    "expected_calibration_error",
    "importance_log_likelihood",
    "log_predictive_density",
    "predictive_moments",
    "refined_mean_proposal",
    "rmse",
    "simulate_retail",
    "vae",
]
