"""When to check tensor *values*: one switch for the whole package."""

from torch.distributions import Distribution


def values_checked() -> bool:
    """
    Whether to check tensor values (label ranges, NaN, negative variances, failed
    factorisations), not only shapes and dtypes.

    These checks follow torch.distributions' global validation switch
    (``pyro.enable_validation`` / ``pyro.validation_enabled``), like distributions' own
    argument and sample checks. Samplers turn validation off while they evaluate potentials:
    a particle that strays into an invalid region then gets a NaN log density (reported as a
    divergence) instead of an exception, ``torch.func.vmap`` (which cannot branch on values)
    can batch the model, and a traced, compiled step never reads a tensor on the host.
    """
    return Distribution._validate_args
