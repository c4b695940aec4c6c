"""The model-to-density layer that every inference family shares: the log joint of a Pyro
model over ``L`` flat unconstrained particles of its latent sites.

:class:`ParticlePotential` is what the SG-MCMC kernels, Gibbs, VIS, natural-gradient VI,
the online filters and the BSTS sampler evaluate. Its parts:

* :mod:`~pyro_ext.infer.potential.layout`: how the latent sites lie in the flat vector
  (:class:`SupportMap`, the site layout, flatten/unflatten/constrain given a layout);
* :mod:`~pyro_ext.infer.potential.density`: :class:`ParticlePotential` and the poutine
  handler behind every log joint of the package, :class:`LogJointMessenger`;
* :mod:`~pyro_ext.infer.potential.init`: the starting points (the model's declared start, a
  Pyro init strategy, the prior-scaled start);
* :mod:`~pyro_ext.infer.potential.checks`: the data contract, :func:`check_model_data`;
* :mod:`~pyro_ext.infer.potential.arguments`: :class:`PerParticle`, a model argument with one
  value per particle.
"""

from .arguments import PerParticle
from .checks import check_model_data
from .density import VECTORIZE, GaussianPriors, LogJointMessenger, ParticlePotential
from .layout import DiscreteSite, SupportMap

__all__ = [
    "VECTORIZE",
    "DiscreteSite",
    "GaussianPriors",
    "LogJointMessenger",
    "ParticlePotential",
    "PerParticle",
    "SupportMap",
    "check_model_data",
]
