"""Natural-gradient variational inference with a mean-field Gaussian (IVON, VOGN, VON)."""

from .natural_gradient import METHODS, NaturalGradientVI, NGVIDivergenceError
from .updates import NGVIState, init_state, ngvi_update, posterior_scale, price_hessian

__all__ = [
    "METHODS",
    "NGVIDivergenceError",
    "NGVIState",
    "NaturalGradientVI",
    "init_state",
    "ngvi_update",
    "posterior_scale",
    "price_hessian",
]
