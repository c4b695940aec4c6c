"""
The default step size (``step_size=None``): the stationary variance error it bounds, the
power-iteration estimates it is computed from, and what a user who passes no step size
gets on a posterior that is known exactly.
"""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide import init_to_value
from pyro.ops.stats import split_gelman_rubin

from pyro_ext.infer import MCMC, SGHMC, SGLD, AdamSGLD, SlowMixingWarning
from pyro_ext.infer.calibration import minibatched_normal_mean
from pyro_ext.infer.sgmcmc import ParticlePotential
from pyro_ext.infer.sgmcmc.adaptation import (
    StepSizeAdaptation,
    bias_bounded_step_size,
    stationary_variance_error,
)


@pytest.mark.parametrize(
    "step_size, curvature, noise", [(0.1, 1.0, 0.0), (0.1, 1.0, 2.0), (0.01, 10.0, 5.0)]
)
def test_sgld_error_is_the_closed_form(step_size, curvature, noise):
    # z <- (1 - h lam) z - h zeta + sqrt(2 h) xi has variance (2h + h^2 s^2) / (1 - (1 - h lam)^2).
    exact = (1 + step_size * noise / 2) / (1 - step_size * curvature / 2) - 1
    assert stationary_variance_error(step_size, curvature, noise, 1.0) == pytest.approx(
        exact, rel=1e-12
    )


@pytest.mark.parametrize("friction", [0.1, 0.5])
def test_momentum_error_matches_a_simulation_of_the_recursion(friction):
    # The SGHMC recursion of sghmc_update, run for 20 000 independent chains from its
    # stationary law's neighbourhood, against the Lyapunov solution.
    step_size, curvature, noise = 0.02, 1.0, 4.0
    generator = torch.Generator().manual_seed(0)
    chains = 5000
    z = torch.randn(chains, generator=generator, dtype=torch.float64)
    v = math.sqrt(step_size) * torch.randn(chains, generator=generator, dtype=torch.float64)
    second_moments = []
    for step in range(1500):
        zeta = math.sqrt(noise) * torch.randn(chains, generator=generator, dtype=torch.float64)
        xi = torch.randn(chains, generator=generator, dtype=torch.float64)
        v = (1 - friction) * v - step_size * (curvature * z + zeta)
        v = v + math.sqrt(2 * friction * step_size) * xi
        z = z + v
        if step >= 500 and step % 25 == 0:
            second_moments.append(z.square().mean())
    simulated = torch.stack(second_moments)
    standard_error = 2 * simulated.std() / math.sqrt(len(simulated)) + 2 * math.sqrt(2 / chains)
    predicted = 1 + stationary_variance_error(step_size, curvature, noise, friction)
    assert abs(simulated.mean() - predicted) < 3 * standard_error
    assert predicted > 1.05  # the check has something to detect


def test_unstable_steps_have_infinite_error():
    assert stationary_variance_error(2.5, 1.0) == math.inf


@pytest.mark.parametrize("friction", [1.0, 0.1])
@pytest.mark.parametrize("tolerance", [0.01, 0.05, 1.0])
def test_bias_bounded_step_size_inverts_the_error(friction, tolerance):
    step_size = bias_bounded_step_size(50.0, 300.0, friction, tolerance)
    assert stationary_variance_error(step_size, 50.0, 300.0, friction) <= tolerance
    assert stationary_variance_error(step_size * 1.01, 50.0, 300.0, friction) > tolerance


def test_bias_bounded_step_size_refuses_what_bounds_nothing():
    with pytest.raises(ValueError, match="finite"):
        bias_bounded_step_size(float("nan"), 1.0)
    with pytest.raises(ValueError, match="pass step_size"):
        bias_bounded_step_size(0.0, 0.0)


def _gaussian_potential(precision, device):
    def model():
        pyro.sample(
            "z",
            dist.MultivariateNormal(
                precision.new_zeros(len(precision)), precision_matrix=precision
            ),
        )

    potential = ParticlePotential(model, (), {})
    return potential


def test_power_iteration_finds_the_largest_curvature(device):
    # No minibatch: the Hessian is exact, the gradient noise zero.
    precision = torch.tensor(
        [[9.0, 2.0, 0.0], [2.0, 4.0, 1.0], [0.0, 1.0, 1.0]], dtype=torch.float64, device=device
    )
    potential = _gaussian_potential(precision, device)
    adaptation = StepSizeAdaptation()
    z = torch.randn(4, 3, dtype=torch.float64, device=device)
    adaptation.start(potential, z)
    largest = torch.linalg.eigvalsh(precision).max()
    assert torch.allclose(adaptation.curvature, largest.expand(4), rtol=1e-3)
    assert float(adaptation.noise_variance.abs().max()) < 1e-18
    assert adaptation.step_size == pytest.approx(bias_bounded_step_size(float(largest)), rel=1e-3)


# 10-30 s: in the integration run (`make test-integration`, CI), not the default one.
@pytest.mark.integration
def test_hutchinson_estimate_is_the_mean_curvature(device):
    # tr(H) / D of a dense precision, from Rademacher probes averaged over the estimates.
    generator = torch.Generator().manual_seed(1)
    factor = torch.randn(6, 6, generator=generator, dtype=torch.float64)
    precision = (factor @ factor.T + torch.eye(6, dtype=torch.float64)).to(device)
    potential = _gaussian_potential(precision, device)
    pyro.set_rng_seed(0)
    adaptation = StepSizeAdaptation(smoothing=0.999)
    z = torch.zeros(2, 6, dtype=torch.float64, device=device)
    for _ in range(400):
        adaptation.observe(potential, z)
    mean = float(precision.diagonal().mean())
    assert float(adaptation.mean_curvature.mean()) == pytest.approx(mean, rel=0.05)
    # In six dimensions the relaxation reads the median eigenvalue of the whole Hessian
    # (exact here: no minibatch), not the mean: SGLD relaxes a direction of curvature
    # lambda at rate step * lambda.
    median = float(torch.linalg.eigvalsh(precision).median())
    assert adaptation.median_curvature.tolist() == pytest.approx([median, median], rel=1e-10)
    step = adaptation.step_size
    assert adaptation.relaxation_steps() == pytest.approx(1.0 / (step * median), rel=1e-10)


def _stiff_gaussian(num_flat):
    # One direction 10^4 times stiffer than the num_flat others: the default step is set
    # by the stiff one, and the flat ones relax 10^4 times slower than it.
    precision = torch.cat([torch.tensor([1e4]), torch.ones(num_flat)]).double()

    def model():
        pyro.sample("z", dist.Normal(torch.zeros_like(precision), precision.rsqrt()).to_event(1))

    return model


def test_a_run_too_short_to_mix_at_the_default_step_is_warned_about():
    from pyro_ext.infer import SlowMixingWarning

    pyro.set_rng_seed(0)
    kernel = SGLD(_stiff_gaussian(99), num_particles=4, bias_bound="stiffest")
    mcmc = MCMC(kernel, num_samples=100, warmup_steps=100, disable_progbar=True)
    with pytest.warns(SlowMixingWarning, match="bias_tolerance=1") as record:
        mcmc.run()
    (warning,) = [w for w in record if w.category is SlowMixingWarning]
    relaxation = kernel.relaxation_steps()
    # Mean curvature (10^4 + 99) / 100 = 101, step about 0.1 / 10^4: about 1000 steps.
    assert 500 < relaxation < 2000
    assert f"at least {relaxation:.0f} steps" in str(warning.message)
    assert "keeps 100 (num_samples x thinning)" in str(warning.message)
    # The draws have indeed not mixed: each particle's flat coordinates have barely moved
    # from their start (variance within a particle far below the target's 1).
    flat = mcmc.get_samples(group_by_chain=True)["z"][..., 1:]
    assert float(flat.var(1).mean()) < 0.2


def test_a_low_dimensional_stiff_direction_is_warned_about():
    # Four dimensions, one 10^4 times stiffer: the mean curvature (10^4 + 3) / 4 = 2500
    # would put a typical direction's relaxation at about 40 steps and stay silent with
    # 1000 kept; the median eigenvalue (1) puts it near 10^5, as the flat coordinates show.
    from pyro_ext.infer import SlowMixingWarning

    pyro.set_rng_seed(0)
    kernel = SGLD(_stiff_gaussian(3), num_particles=4, bias_bound="stiffest")
    mcmc = MCMC(kernel, num_samples=1000, warmup_steps=100, disable_progbar=True)
    with pytest.warns(SlowMixingWarning, match="keeps 1000"):
        mcmc.run()
    adaptation = kernel.step_size_adaptation
    assert torch.allclose(adaptation.median_curvature, torch.ones(4, dtype=torch.float64))
    assert 5e4 < kernel.relaxation_steps() < 2e5
    flat = mcmc.get_samples(group_by_chain=True)["z"][..., 1:]
    assert float(flat.var(1).mean()) < 0.2


def _estimates(bound, kept_steps=None, **estimates):
    adaptation = StepSizeAdaptation(bound=bound, kept_steps=kept_steps)
    for name, value in estimates.items():
        setattr(adaptation, name, torch.tensor([value], dtype=torch.float64))
    return adaptation


def test_each_bias_bound_is_its_stated_step():
    # Curvature 1e4 in the stiffest direction, 1 on average and in a typical direction,
    # gradient noise 1e5 at most and 10 on average (a minibatched, ill-conditioned
    # posterior): the three bounds written out from their definitions.
    estimates = dict(
        curvature=1e4, noise_variance=1e5, mean_curvature=1.0, mean_noise_variance=10.0
    )
    stiffest = bias_bounded_step_size(1e4, 1e5)
    stable = bias_bounded_step_size(1e4, 0.0, tolerance=0.3)
    typical = min(bias_bounded_step_size(1.0, 10.0), stable)
    assert stiffest < typical  # 5e-7 against 4.6e-5 (the stable step binds)
    assert _estimates("stiffest", **estimates).bounded_step_size(0.05) == stiffest
    assert _estimates("typical", **estimates).bounded_step_size(0.05) == typical
    # "auto": the step at which a typical direction (curvature 1) relaxes a hundred times
    # (MIXING_RELAXATIONS) within the kept steps, 100 / kept, between the two.
    for kept, expected in [(1e3, typical), (1e7, 1e-5), (1e9, stiffest)]:
        adaptation = _estimates("auto", kept, **estimates)
        assert adaptation.bounded_step_size(0.05) == pytest.approx(expected, rel=1e-12)
    # The stiffest direction's error of the step in force: the tolerance under
    # "stiffest", far more where the step was raised.
    adaptation = _estimates("typical", **estimates)
    adaptation.step_size = adaptation.bounded_step_size(0.05)
    assert adaptation.stiffest_error() > 1
    adaptation = _estimates("stiffest", **estimates)
    adaptation.step_size = adaptation.bounded_step_size(0.05)
    assert adaptation.stiffest_error() == pytest.approx(0.05, rel=1e-2)
    with pytest.raises(ValueError, match="bound must be one of"):
        StepSizeAdaptation(bound="largest")


# 10-30 s: in the integration run (`make test-integration`, CI), not the default one.
@pytest.mark.integration
def test_the_auto_bound_raises_the_step_until_the_kept_draws_mix():
    # One direction 50 times stiffer than 99 flat ones, no minibatch: at the stiffest
    # bound (step 0.1 / 50) a typical direction relaxes in about 1 / (0.002 * 1.49) = 340
    # steps, too slow for 10 000 kept steps (fewer than 100 relaxations: warned about);
    # "auto" raises the step to relax it in 100 (100 / (10 000 * 1.49) = 6.7e-3, under the
    # typical bound 0.067 and the stable 9.2e-3) at a stiffest-direction error of about
    # 20 %, and the flat coordinates mix: their split-R-hat over the particles falls.
    import warnings as _warnings

    from pyro_ext.infer import SlowMixingWarning

    precision = torch.cat([torch.tensor([50.0]), torch.ones(99)]).double()

    def model():
        pyro.sample("z", dist.Normal(torch.zeros_like(precision), precision.rsqrt()).to_event(1))

    variances, r_hats = {}, {}
    for bound in ("stiffest", "auto"):
        pyro.set_rng_seed(0)
        kernel = SGLD(model, num_particles=4, bias_bound=bound)
        mcmc = MCMC(kernel, num_samples=1000, warmup_steps=200, thinning=10, disable_progbar=True)
        with _warnings.catch_warnings(record=True) as record:
            _warnings.simplefilter("always")
            mcmc.run()
        warned = any(w.category is SlowMixingWarning for w in record)
        assert warned == (bound == "stiffest")
        flat = mcmc.get_samples(group_by_chain=True)["z"][..., 1:]
        variances[bound] = float(flat.var(1).mean())
        r_hats[bound] = split_gelman_rubin(flat, chain_dim=0, sample_dim=1)
        adaptation = kernel.step_size_adaptation
        error = kernel.diagnostics()["stiffest_variance_error"]
        # The first half of warm-up is faster only within the stiffest direction's bounds
        # (error 1 with the noise, 0.3 from the curvature), never slower than the kept step.
        faster = min(
            bias_bounded_step_size(50.0, 0.0, tolerance=0.3),
            bias_bounded_step_size(50.0, 0.0, tolerance=1.0),
        )
        assert adaptation.early_step_size == pytest.approx(
            max(adaptation.step_size, faster), rel=0.05
        )
        if bound == "auto":
            assert adaptation.step_size == pytest.approx(adaptation.mixing_step_size())
            assert kernel.relaxation_steps() == pytest.approx(100.0, rel=1e-6)
            assert 0.15 < error < 0.25
        else:
            assert error == pytest.approx(0.05, rel=1e-2)
        # The stiff coordinate (relaxing in a few steps, so about 1300 effective draws: a
        # standard error near 4 %) has the variance the reported error says, 1 + error times
        # its exact 1 / 50: the error is what the draws carry.
        stiff = mcmc.get_samples(group_by_chain=True)["z"][..., 0]
        sampled = float(stiff.var(1).mean()) * 50.0
        assert sampled == pytest.approx(1 + error, rel=0.1)
    # 100 relaxations within the kept steps: split-R-hat over the four particles about 1.03
    # on average over the flat coordinates (1.11 at the stiffest bound's 30), and the
    # within-particle variance near its 1 - 2 * 100 / 10 000.
    assert float(r_hats["auto"].mean()) < 1.05 < 1.08 < float(r_hats["stiffest"].mean())
    assert float(r_hats["auto"].max()) < float(r_hats["stiffest"].max())
    assert 0.94 < variances["auto"] < 1.05


def test_the_median_curvature_is_in_the_mass_coordinates():
    # AdamSGLD's estimates are in its preconditioned coordinates: with the mass M the
    # Hessian seen is M^-1/2 H M^-1/2, here diag(precision / mass).
    precision = torch.tensor([1e4, 1.0, 4.0]).double()
    potential = ParticlePotential(
        lambda: pyro.sample(
            "z", dist.Normal(torch.zeros(3).double(), precision.rsqrt()).to_event(1)
        ),
        (),
        {},
    )
    adaptation = StepSizeAdaptation()
    z = torch.zeros(2, 3, dtype=torch.float64)
    mass = torch.tensor([[1e4, 1.0, 1.0], [1.0, 1.0, 1.0]]).double()
    adaptation.observe(potential, z, mass=mass)
    # Particle 0 sees (1, 1, 4), median 1; particle 1 sees (1e4, 1, 4), median 4.
    assert adaptation.median_curvature.tolist() == pytest.approx([1.0, 4.0])


def test_a_long_enough_run_or_a_given_step_is_not_warned_about():
    import warnings as _warnings

    from pyro_ext.infer import SlowMixingWarning

    pyro.set_rng_seed(0)

    def model():
        pyro.sample("z", dist.Normal(torch.zeros(5, dtype=torch.float64), 1.0).to_event(1))

    with _warnings.catch_warnings():
        _warnings.simplefilter("error", SlowMixingWarning)
        kernel = SGLD(model, num_particles=4)
        # About 1 / (0.1 * 1) = 10 steps: 1200 kept steps are more than 100 of them.
        MCMC(kernel, num_samples=1200, warmup_steps=100, disable_progbar=True).run()
        assert kernel.relaxation_steps() < 12
        given = SGLD(_stiff_gaussian(99), step_size=1e-5, num_particles=4)
        MCMC(given, num_samples=10, warmup_steps=10, disable_progbar=True).run()
        assert given.relaxation_steps() is None


# 10-30 s: in the integration run (`make test-integration`, CI), not the default one.
@pytest.mark.integration
def test_noise_estimate_is_the_minibatch_gradient_variance(device):
    # y_i ~ N(mu, 1), minibatch B of N without replacement: Var of the gradient estimate is
    # N^2 / B (N - B) / (N - 1) var(y), whatever mu is.
    num_data, batch = 1000, 50
    target = minibatched_normal_mean(num_data, batch, device=device)
    potential = ParticlePotential(target.model, (target.data,), {})
    pyro.set_rng_seed(0)
    # The particles share each minibatch, so one particle carries all the information; a
    # plain average (smoothing close to 1) of 600 draws of d^2 / 2 has a 6 % standard error.
    adaptation = StepSizeAdaptation(smoothing=0.999)
    z = torch.zeros(1, 1, dtype=torch.float64, device=device)
    for _ in range(600):
        adaptation.observe(potential, z)
    exact = num_data**2 / batch * (num_data - batch) / (num_data - 1) * target.data.var(False)
    assert target.gradient_noise == pytest.approx(float(exact), rel=1e-12)
    assert float(adaptation.noise_variance.mean()) == pytest.approx(float(exact), rel=0.2)
    assert float(adaptation.curvature.mean()) == pytest.approx(num_data + 0.01, rel=1e-6)


@pytest.mark.parametrize(
    "make_kernel",
    [
        lambda model: SGLD(model, num_particles=20),
        # 5 s each: the momentum kernels' cases run in the integration run.
        pytest.param(lambda model: SGHMC(model, num_particles=20), marks=pytest.mark.integration),
        pytest.param(
            lambda model: AdamSGLD(model, num_particles=20), marks=pytest.mark.integration
        ),
    ],
    ids=["sgld", "sghmc", "adam"],
)
def test_the_default_step_has_its_stated_bias_on_a_minibatched_posterior(make_kernel, device):
    # Minibatch noise is 19 times the curvature here: SGLD at the step a user would guess
    # from the curvature alone (the demo's 2e-5) inflates the variance by a third. The
    # step the warm-up freezes must have, at the exact curvature and gradient-noise
    # variance of this model, the stationary variance error it promises (the error itself
    # is checked against simulation above).
    target = minibatched_normal_mean(device=device)
    model, x, mean, sd = target.model, target.data, target.posterior_mean, target.posterior_sd
    curvature, noise = target.curvature, target.gradient_noise
    pyro.set_rng_seed(0)
    kernel = make_kernel(model)
    mcmc = MCMC(kernel, num_samples=500, warmup_steps=1500, disable_progbar=True)
    mcmc.run(x)
    step_size = kernel.diagnostics()["step_size"]
    assert step_size == kernel.step_size_adaptation.step_size
    if isinstance(kernel, AdamSGLD):
        # In the coordinates of each particle's frozen mass M: curvature / M, noise / M.
        state = kernel.particles, kernel.state_dict()["state"]
        moment = state[1]["second_moment"] / (1 - kernel.betas[1] ** state[1]["count"])
        masses = (moment.sqrt() + kernel.eps).flatten().tolist()
    else:
        masses = [1.0]
    friction = kernel.adaptation_friction
    error = max(
        stationary_variance_error(step_size, curvature / m, noise / m, friction) for m in masses
    )
    assert 0.5 * kernel.bias_tolerance < error < 1.5 * kernel.bias_tolerance, error
    draws = mcmc.get_samples()["mu"]
    assert torch.isfinite(draws).all()
    assert float(((draws - mean) / sd).square().mean()) < 2


def test_the_default_step_is_frozen_after_warmup_and_checkpointed():
    model, x = minibatched_normal_mean(num_data=200)[:2]
    steps = []
    kernel = SGLD(model, num_particles=4)
    mcmc = MCMC(
        kernel,
        num_samples=30,
        warmup_steps=40,
        disable_progbar=True,
        hook_fn=lambda kernel_, *_: steps.append(kernel_.diagnostics()["step_size"]),
    )
    mcmc.run(x)
    assert len(set(steps[40:])) == 1 and steps[-1] == kernel.step_size_adaptation.step_size
    assert steps[0] > steps[-1]  # the first half of warm-up moves faster
    state = kernel.state_dict()
    fresh = SGLD(model, num_particles=4)
    fresh.setup(0, x)
    fresh.load_state_dict(state)
    assert fresh.step_size_adaptation.step_size == kernel.step_size_adaptation.step_size


@pytest.mark.parametrize("value", [0.0, -0.1, 1.5, float("nan")])
def test_bias_tolerance_is_checked(value):
    with pytest.raises(ValueError, match="bias_tolerance"):
        SGLD(lambda: None, bias_tolerance=value)


def test_bias_tolerance_type_is_checked():
    with pytest.raises(TypeError, match="bias_tolerance"):
        SGLD(lambda: None, bias_tolerance="small")


# 10-12 s each: in the integration run (`make test-integration`, CI), not the default one.
@pytest.mark.integration
@pytest.mark.parametrize("make_kernel", [SGLD, SGHMC], ids=["SGLD", "SGHMC"])
def test_with_repulsion_each_particle_moves_as_the_plain_sampler_does(make_kernel):
    # The pooled draws' error is the mean over the particle modes of K / L, so the default
    # step divides by the mean eigenvalue mean(mu^p) (1 / L for SGLD+R), not by the largest
    # (the ensemble's mean mode, about 2 / L here, squared for SGHMC): each particle then
    # moves per step as a plain chain at its default step does, at the same pooled bias.
    # Dividing by the largest left SGLD+R 2.2 times and SGHMC+R 4.5 times slower per step.
    scales = torch.linspace(0.3, 3.0, 30).double()

    def model():
        pyro.sample("z", dist.Normal(torch.zeros_like(scales), scales).to_event(1))

    moves, stiff = {}, {}
    for repulsion in (None, "rbf"):
        pyro.set_rng_seed(0)
        kernel = make_kernel(model, num_particles=20, repulsion=repulsion, bias_bound="stiffest")
        mcmc = MCMC(kernel, num_samples=1500, warmup_steps=500, disable_progbar=True)
        mcmc.run()
        z = mcmc.get_samples(group_by_chain=True)["z"] / scales
        lag_one = (z[:, 1:] * z[:, :-1]).mean((0, 1)) / z.square().mean((0, 1))
        moves[repulsion] = float((1 - lag_one).median())
        stiff[repulsion] = float(z[..., 0].square().mean())
        if repulsion is not None:
            adaptation = kernel.step_size_adaptation
            assert (
                adaptation.mean_coupling
                < 0.7 * adaptation.coupling_eigenvalue**kernel.coupling_power
            )
    assert moves["rbf"] == pytest.approx(moves[None], rel=0.2)
    assert stiff["rbf"] == pytest.approx(stiff[None], abs=0.06)


def test_the_mixing_criterion_is_what_split_r_hat_needs():
    # MIXING_RELAXATIONS is set from this: ten particles, each a Gaussian AR(1) chain that
    # relaxes in T steps (SGLD's linear recursion), started at stationarity and run for
    # MIXING_RELAXATIONS * T steps, have a split-R-hat about 1.03 (max over five
    # coordinates); ten relaxations, the criterion before, leave it near 1.3.
    from pyro_ext.infer.sgmcmc.adaptation import MIXING_RELAXATIONS

    generator = torch.Generator().manual_seed(0)

    def max_r_hat(relaxations, steps=2000, replicates=20, particles=10, coordinates=5):
        decay = 1.0 - relaxations / steps
        z = torch.randn(replicates, particles, coordinates, generator=generator)
        chain = torch.empty(replicates, particles, steps, coordinates)
        for t in range(steps):
            noise = torch.randn(z.shape, generator=generator)
            z = decay * z + math.sqrt(1.0 - decay**2) * noise
            chain[:, :, t] = z
        r_hat = torch.stack([split_gelman_rubin(c, chain_dim=0, sample_dim=1) for c in chain])
        return r_hat.amax(-1).median()

    assert max_r_hat(MIXING_RELAXATIONS) < 1.05
    assert max_r_hat(10) > 1.2


def _noise_precision_regression(seed, num_data=300, dim=8, noise=0.03):
    """A linear regression whose noise precision tau is learned: the targets standardised,
    so the posterior sits near ``1 / noise^2`` while the start ``tau = 1`` (the targets'
    variance) has a few hundredth of the posterior's curvature, as a BNN's start does."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_data, dim, generator=generator)
    weights = torch.randn(dim, generator=generator)
    y = x @ weights / dim**0.5 + noise * torch.randn(num_data, generator=generator)
    y = (y - y.mean()) / y.std()

    def model(x, y, subsample_size=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([dim]).to_event(1))
        b = pyro.sample("b", dist.Normal(0.0, 1.0))
        tau = pyro.sample("tau", dist.Gamma(1.0, 0.1))
        with pyro.plate("data", num_data, subsample_size=subsample_size) as rows:
            pyro.sample("y", dist.Normal(x[rows] @ w + b, tau.rsqrt()), obs=y[rows])

    return model, x, y


def _exact_noise_precision_quantiles(x, y, probs):
    """tau's posterior quantiles by quadrature: with the weights and bias marginalised,
    y ~ N(0, x x^T + 1 1^T + I / tau) exactly."""
    x, y = x.double(), y.double()
    eigenvalues, vectors = torch.linalg.eigh(x @ x.T + 1.0)
    projected = (vectors.T @ y).square()
    log_tau = torch.linspace(-2.0, 12.0, 20001, dtype=torch.float64)
    variance = eigenvalues + (-log_tau).exp().unsqueeze(-1)
    log_likelihood = -0.5 * (variance.log().sum(-1) + (projected / variance).sum(-1))
    # Gamma(1, 0.1) in tau, times the Jacobian tau of the log-tau grid.
    log_posterior = log_likelihood - 0.1 * log_tau.exp() + log_tau
    cdf = (log_posterior - log_posterior.max()).exp().cumsum(0)
    cdf = cdf / cdf[-1]
    index = torch.searchsorted(cdf, torch.tensor(probs, dtype=torch.float64))
    return log_tau[index].exp().tolist()


@pytest.mark.parametrize(
    "seed",
    [
        pytest.param(2, marks=pytest.mark.slow),
        pytest.param(3, marks=pytest.mark.slow),
        # 13 s: in the integration run (`make test-integration`, CI), not the default one.
        pytest.param(4, marks=pytest.mark.integration),
    ],
)
def test_warmup_follows_the_curvature_out_of_a_flat_start(seed):
    # Out of the start tau grows 100-fold in warm-up's first tens of steps and every
    # weight's curvature with it. A step re-estimated every ten steps from a running
    # average lagged: SGHMC at its default blew particles out to tau near 0 (seed 4: tau
    # 5e-8, the ensemble's median 0.5; seed 2: the median 16 of an exact 562; seed 3: three
    # particles escaped). The estimates now repeat while the curvature grows and the step
    # is stable at the curvature measured last.
    model, x, y = _noise_precision_regression(seed)
    low, high = _exact_noise_precision_quantiles(x, y, [0.001, 0.999])
    start = {"w": torch.zeros(x.shape[1]), "b": torch.tensor(0.0), "tau": torch.tensor(1.0)}
    pyro.set_rng_seed(seed)
    kernel = SGHMC(model, num_particles=20, init_strategy=init_to_value(values=start))
    heat = []  # the momenta's temperature, v^2 / step (their law is N(0, T = 1))

    def record(kernel_, *_):
        velocity = kernel_._state.velocity
        heat.append(float(velocity.square().mean()) / kernel_.diagnostics()["step_size"])

    mcmc = MCMC(
        kernel,
        num_samples=100,
        warmup_steps=1000,
        thinning=10,
        disable_progbar=True,
        hook_fn=record,
    )
    with pytest.warns(SlowMixingWarning):  # tau relaxes in thousands of steps at the bound
        mcmc.run(x, y, subsample_size=100)
    assert mcmc.escaped_particles == []
    # The step fell 1000-fold in warm-up; the velocity v = sqrt(step) m follows it, so the
    # momenta stay near their law. Kept unscaled, seed 4's momenta ran 30 000 times too hot
    # (the particles rolling into the well heat them at most about 40-fold).
    assert max(heat) < 100, max(heat)
    assert 0.8 < sum(heat[-100:]) / 100 < 1.5, heat[-100:]
    tau = mcmc.get_samples()["tau"]
    # Every draw between the start and the posterior's upper tail: none was thrown back
    # towards tau = 0, none overshot.
    assert float(tau.min()) > 1.0 and float(tau.max()) < high, (float(tau.min()), low, high)
    # The schedule: the estimates repeated while the curvature grew (at most 20 more).
    adaptation = kernel.step_size_adaptation
    regular = adaptation.initial_iterations + (1000 - 1) // adaptation.every
    assert regular < adaptation.estimates <= regular + 20
