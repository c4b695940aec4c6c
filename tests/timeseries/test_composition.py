"""The state-space models compose with the package's inference: VIS and SG-MCMC."""

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.autoguide import AutoDelta

from pyro_ext.infer import MCMC, SGLD, VIS
from pyro_ext.timeseries import DLM, DLMDistribution, HiddenMarkovModel, LocalLevel


def test_vis_refinement_climbs_the_hmm_marginal_likelihood():
    # One noise-free refinement step of a point-mass guide is a gradient-ascent step on the
    # exact log joint (states marginalised): it must not decrease it for a small step.
    torch.set_default_dtype(torch.float64)
    try:
        y = torch.tensor([0, 0, 1, 2, 2, 2, 1, 0, 0, 1] * 3, dtype=torch.float64)
        model = HiddenMarkovModel(3, "categorical", num_symbols=3)
        base = AutoDelta(model)
        base(y)  # initialise
        guide = VIS(model, base, sampler="sgd", num_steps=1, step_size=1e-3, entropy="particle")

        def log_joint(guide_fn):
            trace = pyro.poutine.trace(guide_fn).get_trace(y)
            replayed = pyro.poutine.trace(pyro.poutine.replay(model, trace=trace)).get_trace(y)
            return float(replayed.log_prob_sum())

        with torch.no_grad():
            before, after = log_joint(base), log_joint(guide)
        assert after > before
    finally:
        torch.set_default_dtype(torch.float32)


def test_sgld_posterior_of_a_dlm_noise_scale_matches_quadrature():
    # Local level model with one unknown observation scale: the exact posterior of log sigma
    # on a grid (Kalman likelihood times prior) is the ground truth for SGLD's draws.
    generator = torch.Generator().manual_seed(0)
    T = 60
    level = torch.cumsum(0.3 * torch.randn(T, generator=generator, dtype=torch.float64), 0)
    y = level + 0.8 * torch.randn(T, generator=generator, dtype=torch.float64)

    def model(y):
        sigma = pyro.sample("sigma", dist.LogNormal(y.new_zeros(()), 1.0))
        dlm = DLM(LocalLevel(y.new_tensor(0.3), init_scale=3.0), observation_scale=sigma)
        pyro.sample("obs", DLMDistribution(dlm, T), obs=y)

    grid = torch.linspace(-2.0, 1.5, 701, dtype=torch.float64)
    sigma = grid.exp()
    dlm = DLM(
        LocalLevel(torch.tensor(0.3, dtype=torch.float64), init_scale=3.0), observation_scale=sigma
    )
    # Density of log sigma: likelihood x LogNormal prior x Jacobian (sigma).
    log_post = dlm.log_likelihood(y) + dist.LogNormal(0.0, 1.0).log_prob(sigma) + grid
    weights = (log_post - log_post.logsumexp(0)).exp()
    exact_mean = float((weights * sigma).sum())

    kernel = SGLD(model, step_size=2e-3, num_particles=10)
    mcmc = MCMC(kernel, num_samples=300, warmup_steps=200, disable_progbar=True)
    mcmc.run(y)
    draws = mcmc.get_samples()["sigma"]
    exact_sd = float((weights * (sigma - exact_mean) ** 2).sum().sqrt())
    # 3000 correlated draws: allow a quarter of a posterior sd for Monte Carlo error and
    # the step-size bias.
    assert abs(float(draws.mean()) - exact_mean) < 0.25 * exact_sd, (
        float(draws.mean()),
        exact_mean,
        exact_sd,
    )
