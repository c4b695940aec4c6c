r"""
Simulation-based calibration (Talts et al. 2018) of an MCMC kernel on a conjugate model.

:func:`normal_means_sbc` draws ``R`` means :math:`\theta_r \sim N(0, 1)` from the prior,
``n`` observations :math:`y_{ri} \sim N(\theta_r, \sigma^2)` of each, and runs the kernel
once on the model of all ``R`` replications together: their posteriors are independent,
:math:`\theta_r | y \sim N(\mu_r, s^2)` with :math:`s^2 = 1 / (1 + n / \sigma^2)` and
:math:`\mu_r = s^2 \sum_i y_{ri} / \sigma^2`, so one run gives ``R`` calibration
replications. For an exact sampler

* the rank of each :math:`\theta_r` among its thinned draws is uniform (a chi-square test,
  :func:`~pyro_ext.ops.stats.rank_uniformity_test`);
* the standardised draws :math:`(\theta - \mu_r) / s` have :math:`E[z^2] = 1` and
  :math:`P(|z| > 2) = 0.0455`.

A kernel whose stationary law is off by a few per cent fails the moment checks long before
the rank test notices, so both are reported, with Monte Carlo standard errors computed
across replications.
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import pyro
import pyro.distributions as dist
import torch

from ..ops.stats import rank_uniformity_test, sbc_ranks
from ..ops.validation import check_int, check_positive

__all__ = [
    "CalibrationResult",
    "EnsembleMoments",
    "MinibatchedNormalMean",
    "minibatched_normal_mean",
    "normal_means_model",
    "normal_means_posterior_cdf",
    "normal_means_sbc",
    "repulsive_ensemble_moments",
]

#: :math:`P(|z| > 2)` for a standard normal ``z``
NORMAL_TAIL_MASS = math.erfc(2.0 / math.sqrt(2.0))


#: the prior means of :func:`normal_means_model`'s two components with ``mixture=True``
MIXTURE_LOCS = (-2.0, 2.0)


class MinibatchedNormalMean(NamedTuple):
    """What :func:`minibatched_normal_mean` returns: the model, its data and its exact
    posterior, curvature and minibatch-gradient variance."""

    model: Callable
    data: torch.Tensor
    posterior_mean: float
    posterior_sd: float
    #: the potential's second derivative (the posterior precision), the same everywhere
    curvature: float
    #: the variance of the minibatch estimate of the potential's gradient, the same everywhere
    gradient_noise: float


def minibatched_normal_mean(
    num_data=2000, subsample_size=100, prior_scale=10.0, seed=0, dtype=torch.float64, device=None
) -> MinibatchedNormalMean:
    """
    ``y_i ~ N(mu, 1)``, ``mu ~ N(0, prior_scale^2)``, the data subsampled by
    ``pyro.plate(..., subsample_size=...)``: a posterior known exactly whose minibatch noise
    is known exactly too. Drawing ``B`` of ``N`` without replacement, the gradient estimate
    ``(N / B) sum_batch (y_i - mu)`` has variance ``N^2 / B (N - B) / (N - 1) var(y)``
    (population variance), whatever ``mu`` is; the data are ``1.5 + N(0, 1)`` draws.
    """
    generator = torch.Generator().manual_seed(seed)
    y = (1.5 + torch.randn(num_data, generator=generator, dtype=dtype)).to(device)

    def model(y):
        mu = pyro.sample("mu", dist.Normal(y.new_zeros(()), prior_scale))
        with pyro.plate("data", y.shape[0], subsample_size=subsample_size) as idx:
            pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])

    precision = 1 / prior_scale**2 + num_data
    noise = (num_data**2 / subsample_size * (num_data - subsample_size) / (num_data - 1)) * float(
        y.var(unbiased=False)
    )
    return MinibatchedNormalMean(
        model, y, float(y.sum() / precision), 1 / math.sqrt(precision), precision, noise
    )


def normal_means_model(y, noise_scale=1.0, mixture=False):
    """
    ``R`` independent normal means with a standard normal prior, observed ``n`` times each:
    ``y`` has shape ``(n, R)``; the latent site ``"theta"`` has shape ``(R,)``.

    With ``mixture=True`` each mean first picks a component, ``"component" ~
    Bernoulli(1/2)``, and ``theta ~ N(MIXTURE_LOCS[component], 1)``: a discrete site for
    :class:`~pyro_ext.infer.Gibbs`, and a two-component posterior.
    """
    with pyro.plate("replications", y.shape[-1]):
        loc = y.new_zeros(())
        if mixture:
            component = pyro.sample("component", dist.Bernoulli(y.new_tensor(0.5)))
            low, high = MIXTURE_LOCS
            loc = low + (high - low) * component
        theta = pyro.sample("theta", dist.Normal(loc, 1.0))
        with pyro.plate("observations", y.shape[-2]):
            pyro.sample("y", dist.Normal(theta, noise_scale), obs=y)


def normal_means_posterior_cdf(theta, y, noise_scale=1.0, mixture=False):
    """
    The exact posterior CDF of each mean of :func:`normal_means_model` at ``theta``
    ``(M, R)``, given ``y`` ``(n, R)``: ``(M, R)`` probabilities.
    """
    n = y.shape[0]
    var = 1.0 / (1.0 + n / noise_scale**2)
    normal = dist.Normal(y.new_zeros(()), 1.0)
    if not mixture:
        mean = var * y.sum(0) / noise_scale**2
        return normal.cdf((theta - mean) / math.sqrt(var))
    # Given the component, conjugate; the components are weighted by the marginal likelihood
    # of the sample mean, N(loc, 1 + sigma^2 / n).
    locs = y.new_tensor(MIXTURE_LOCS).unsqueeze(-1)  # (2, 1)
    means = var * (locs + y.sum(0) / noise_scale**2)  # (2, R)
    evidence = dist.Normal(locs, math.sqrt(1.0 + noise_scale**2 / n)).log_prob(y.mean(0))
    weights = evidence.softmax(0)  # (2, R)
    cdfs = normal.cdf((theta.unsqueeze(-2) - means) / math.sqrt(var))  # (M, 2, R)
    return (weights * cdfs).sum(-2)


class CalibrationResult(NamedTuple):
    """What :func:`normal_means_sbc` measured."""

    #: chi-square p-value of the rank histogram's uniformity
    p_value: float
    #: the rank histogram's counts
    counts: torch.Tensor
    #: draws per replication the ranks were taken among
    num_draws: int
    #: E[z^2] of the standardised draws (1 for an exact sampler) and its standard error
    mean_square: float
    mean_square_se: float
    #: ``P(|z| > 2)`` of the standardised draws (0.0455 for an exact sampler) and its standard error
    tail_mass: float
    tail_mass_se: float
    #: E[z] of the standardised draws (0 for an exact sampler) and its standard error
    mean: float
    mean_se: float

    def moments_agree(self, num_se=4.0, bias=0.0):
        """
        Whether ``E[z]``, ``E[z^2]`` and the tail mass are within ``num_se`` standard errors
        (plus an allowance ``bias`` on ``E[z^2]`` for a sampler's known step-size bias) of
        the exact values.
        """
        return (
            abs(self.mean) < num_se * self.mean_se
            and abs(self.mean_square - 1.0) < num_se * self.mean_square_se + bias
            and abs(self.tail_mass - NORMAL_TAIL_MASS) < num_se * self.tail_mass_se
        )


def normal_means_sbc(
    make_kernel: Callable,
    num_samples: int,
    warmup_steps: int,
    thin: int,
    num_replications: int = 200,
    num_observations: int = 4,
    noise_scale: float = 1.0,
    seed: int = 0,
    dtype=torch.float64,
    device=None,
    mcmc=None,
    mixture=False,
) -> CalibrationResult:
    """
    Run simulation-based calibration of the kernel ``make_kernel(model)`` on
    :func:`normal_means_model` (see the module docstring).

    :param make_kernel: ``model -> MCMCKernel``, e.g. ``lambda m: SGLD(m, 1e-3,
        num_particles=10)``; a particle kernel's particles are its chains.
    :param int num_samples: draws after warm-up; every ``thin``-th is kept, so each
        replication's rank is taken among ``chains * num_samples / thin`` draws.
    :param int warmup_steps: warm-up steps.
    :param int thin: keep every ``thin``-th draw: enough steps apart that the kept draws are
        nearly independent (autocorrelated draws make the ranks U-shaped).
    :param int num_replications: ``R``, the number of simulated truths.
    :param int num_observations: ``n`` observations per replication.
    :param float noise_scale: ``sigma``.
    :param int seed: seeds both the simulation and the run.
    :param mcmc: ``(kernel, num_samples, warmup_steps) -> MCMC``; by default
        :class:`pyro_ext.infer.MCMC` without a progress bar.
    :param bool mixture: give each mean a two-component prior with a discrete
        ``"component"`` site (see :func:`normal_means_model`), for kernels that move discrete
        sites (:class:`~pyro_ext.infer.Gibbs`). The draws are then standardised through the
        exact posterior's CDF, ``z = Phi^{-1}(F(theta))``, which is N(0, 1) for exact draws
        as in the conjugate case.
    """
    num_samples = check_int(num_samples, "num_samples", low=1)
    warmup_steps = check_int(warmup_steps, "warmup_steps", low=0)
    thin = check_int(thin, "thin", low=1)
    num_replications = check_int(num_replications, "num_replications", low=1)
    num_observations = check_int(num_observations, "num_observations", low=1)
    noise_scale = check_positive(noise_scale, "noise_scale")
    if not callable(make_kernel):
        raise TypeError(f"make_kernel must be callable (model -> kernel), got {make_kernel!r}")
    if mcmc is None:
        from .mcmc import MCMC

        def mcmc(kernel, num_samples, warmup_steps):
            return MCMC(kernel, num_samples, warmup_steps, disable_progbar=True)

    generator = torch.Generator().manual_seed(seed)
    truth = torch.randn(num_replications, generator=generator, dtype=dtype)
    if mixture:
        low, high = MIXTURE_LOCS
        component = torch.rand(num_replications, generator=generator, dtype=dtype) < 0.5
        truth = truth + low + (high - low) * component.to(dtype)
    y = truth + noise_scale * torch.randn(
        num_observations, num_replications, generator=generator, dtype=dtype
    )
    truth, y = truth.to(device), y.to(device)

    def model(y):
        return normal_means_model(y, noise_scale, mixture)

    pyro.set_rng_seed(seed)
    run = mcmc(make_kernel(model), num_samples, warmup_steps)
    run.run(y)
    draws = run.get_samples(group_by_chain=True)["theta"]  # (chains, num_samples, R)
    kept = draws[:, thin - 1 :: thin].reshape(-1, num_replications)  # (M, R)
    num_draws = kept.shape[0]
    p_value, counts = rank_uniformity_test(sbc_ranks(truth, kept), num_draws)
    # The probability integral transform by the exact posterior, then the normal quantile.
    tiny = torch.finfo(kept.dtype).eps
    cdf = normal_means_posterior_cdf(kept, y, noise_scale, mixture).clamp(tiny, 1 - tiny)
    z = dist.Normal(cdf.new_zeros(()), 1.0).icdf(cdf)

    def mean_and_se(per_replication):  # independent across replications
        value = per_replication.mean()
        return float(value), float(per_replication.std() / math.sqrt(num_replications))

    mean, mean_se = mean_and_se(z.mean(0))
    mean_square, mean_square_se = mean_and_se(z.square().mean(0))
    tail, tail_se = mean_and_se((z.abs() > 2).to(z.dtype).mean(0))
    return CalibrationResult(
        p_value, counts, num_draws, mean_square, mean_square_se, tail, tail_se, mean, mean_se
    )


class EnsembleMoments(NamedTuple):
    """What :func:`repulsive_ensemble_moments` measured, each with its standard error."""

    mean_square: float
    mean_square_se: float
    tail_mass: float
    tail_mass_se: float
    #: the per-particle effective step ``(1 - lag-one autocorrelation) / step_size``: 1 for
    #: SGLD on N(0, 1), where ``z <- (1 - eps) z + noise``
    effective_step: float
    #: the mean per-particle effective sample size per step
    ess_per_step: float


def repulsive_ensemble_moments(
    num_particles: int,
    step_size: float,
    num_ensembles: int = 400,
    num_steps: int | None = None,
    burn_in: int | None = None,
    repulsion=True,
    bandwidth_gradient: bool = True,
    seed: int = 0,
    dtype=torch.float64,
    device=None,
) -> EnsembleMoments:
    r"""
    The stationary law of SGLD (``repulsion=False``) or SGLD+R (eq. 2.7-2.8, with the
    :class:`~pyro_ext.infer.RBFKernel` and its median bandwidth, or the given
    :class:`~pyro.infer.svgd.SteinKernel`) on a 1-D standard normal target, from
    ``num_ensembles`` independent ensembles of ``num_particles`` particles run side by side
    (``torch.func.vmap`` over the very update and coupling the kernels use).

    The particles start at the target, N(0, 1), so an exact sampler has nothing to forget;
    ``burn_in`` steps (default ``4 / step_size``) let a wrong one drift to its own law
    before ``num_steps`` more (default ``24 / step_size``) are averaged. Standard errors are
    across ensembles, which are independent.
    """
    from pyro.ops.stats import effective_sample_size
    from torch.func import vmap

    from .sgmcmc.repulsion import RBFKernel, stein_coupling
    from .sgmcmc.updates import sgld_update

    num_particles = check_int(num_particles, "num_particles", low=1)
    step_size = check_positive(step_size, "step_size")
    num_ensembles = check_int(num_ensembles, "num_ensembles", low=2)
    num_steps = check_int(
        int(24 / step_size) if num_steps is None else num_steps, "num_steps", low=2
    )
    burn_in = check_int(int(4 / step_size) if burn_in is None else burn_in, "burn_in", low=0)
    kernel = RBFKernel() if repulsion is True else (repulsion or None)

    def update(z, noise):
        coupling = None
        if kernel is not None:
            # One Cholesky try: no data-dependent branch, which vmap cannot batch.
            coupling = stein_coupling(kernel, z, bandwidth_gradient)._replace(cholesky_tries=1)
        return sgld_update(z, -z, step_size, noise, coupling)

    step = vmap(update)
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape):
        return torch.randn(*shape, generator=generator, dtype=dtype).to(device)

    z = normal(num_ensembles, num_particles, 1)
    for _ in range(burn_in):
        z = step(z, normal(num_ensembles, num_particles, 1))
    square = torch.zeros(num_ensembles, dtype=dtype, device=z.device)
    tail = torch.zeros_like(square)
    lagged = torch.zeros_like(square)
    # A subset of the trace for the ESS (every particle, every step would be large).
    stride = max(1, num_steps // 2000)
    trace = []
    for t in range(num_steps):
        previous, z = z, step(z, normal(num_ensembles, num_particles, 1))
        square += z.square().mean((1, 2))
        tail += (z.abs() > 2).to(dtype).mean((1, 2))
        lagged += (z * previous).mean((1, 2))
        if t % stride == 0:
            trace.append(z[..., 0])
    if not bool(torch.isfinite(square).all()):
        raise RuntimeError(f"the ensembles diverged at step_size={step_size}: take a smaller one")
    square, tail, lagged = square / num_steps, tail / num_steps, lagged / num_steps
    root = math.sqrt(num_ensembles)
    autocorrelation = float(lagged.mean() / square.mean())
    # (chains, draws): every particle of every ensemble is a chain.
    chains = torch.stack(trace, dim=-1).reshape(-1, len(trace))
    ess = effective_sample_size(chains.unsqueeze(-1), chain_dim=0, sample_dim=1)
    ess_per_step = float(ess) / chains.shape[0] / (len(trace) * stride)
    return EnsembleMoments(
        float(square.mean()),
        float(square.std() / root),
        float(tail.mean()),
        float(tail.std() / root),
        (1.0 - autocorrelation) / step_size,
        ess_per_step,
    )
