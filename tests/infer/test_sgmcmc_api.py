"""Framework wiring of the SG-MCMC kernels: Pyro interop, errors, reproducibility."""

import math
import pickle
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pyro.infer import SVGD, Predictive, RBFSteinKernel
from pyro.infer.autoguide import init_to_value
from pyro.optim import SGD

from pyro_ext.infer import (
    MCMC,
    SGHMC,
    SGLD,
    AdamSGLD,
    CyclicalStepSize,
    PolynomialDecay,
    RBFKernel,
    SamplerDivergenceError,
)
from pyro_ext.infer.sgmcmc import ParticlePotential
from pyro_ext.infer.sgmcmc.repulsion import coupled_noise, stein_coupling
from pyro_ext.infer.sgmcmc.step import step
from pyro_ext.infer.sgmcmc.updates import SAMPLERS, PositionState, drift, sgld_update

KERNELS = [SGLD, SGHMC, AdamSGLD]


def logistic_model(x, y):
    w = pyro.sample("w", dist.Normal(x.new_zeros(x.shape[1]), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=100) as idx:
        pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=None if y is None else y[idx])


def logistic_data(device, n=500, d=3):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=generator)
    w = torch.tensor([1.0, -2.0, 0.5])[:d]
    y = torch.bernoulli(torch.sigmoid(x @ w), generator=generator)
    return x.to(device), y.to(device)


def run(kernel, *args, num_samples=20, warmup_steps=10, **kwargs):
    mcmc = MCMC(
        kernel, num_samples=num_samples, warmup_steps=warmup_steps, disable_progbar=True, **kwargs
    )
    mcmc.run(*args)
    return mcmc


def test_contract_snippet(device):
    x, y = logistic_data(device)
    kernel = SGLD(logistic_model, step_size=1e-3, num_particles=20, repulsion="rbf")
    mcmc = run(kernel, x, y, num_samples=50, warmup_steps=50)
    samples = mcmc.get_samples()
    assert samples["w"].shape == (50 * 20, 3)
    assert samples["w"].device.type == device.type
    grouped = mcmc.get_samples(group_by_chain=True)
    assert grouped["w"].shape == (20, 50, 3)
    # group_by_chain=False concatenates particles in order.
    assert torch.equal(grouped["w"][1], samples["w"][50:100])
    predictive = Predictive(logistic_model, posterior_samples={"w": samples["w"][:30]})(x, None)
    assert predictive["y"].shape == (30, 100)
    diagnostics = mcmc.diagnostics()
    assert diagnostics["w"]["r_hat"].shape == (3,)
    mcmc.summary()
    assert mcmc.num_chains == 20


@pytest.mark.parametrize("kernel_class", KERNELS)
@pytest.mark.parametrize("repulsion", [None, "rbf"])
def test_all_kernels_learn_logistic_weights(device, kernel_class, repulsion):
    x, y = logistic_data(device, n=1000)
    step_size = {SGLD: 1e-3, SGHMC: 1e-3, AdamSGLD: 5e-3}[kernel_class]
    if repulsion:
        step_size *= 8  # the kernel-weighted drift of eq. (2.7) averages over the L = 8 particles
    kernel = kernel_class(logistic_model, step_size=step_size, num_particles=8, repulsion=repulsion)
    samples = run(kernel, x, y, num_samples=100, warmup_steps=300).get_samples()["w"]
    assert torch.allclose(samples.mean(0).cpu(), torch.tensor([1.0, -2.0, 0.5]), atol=0.35)


def test_plain_pyro_mcmc_runs_a_single_particle(device):
    x, y = logistic_data(device)
    kernel = SGLD(logistic_model, step_size=1e-3)
    mcmc = pyro.infer.MCMC(kernel, num_samples=30, warmup_steps=20, disable_progbar=True)
    mcmc.run(x, y)
    assert mcmc.get_samples()["w"].shape == (30, 3)


def test_plain_pyro_mcmc_returns_constrained_values():
    data = torch.tensor([0.5, 1.5, 1.0])

    def model(data):
        scale = pyro.sample("scale", dist.LogNormal(0.0, 1.0))
        with pyro.plate("data", 3):
            pyro.sample("obs", dist.Normal(0.0, scale), obs=data)

    mcmc = pyro.infer.MCMC(
        SGLD(model, step_size=1e-2), num_samples=50, warmup_steps=10, disable_progbar=True
    )
    mcmc.run(data)
    assert (mcmc.get_samples()["scale"] > 0).all()


@settings(max_examples=12, deadline=None)
@given(
    num_particles=st.integers(1, 5),
    shape=st.lists(st.integers(1, 3), min_size=0, max_size=3),
    simplex_size=st.integers(2, 4),
    kernel_index=st.integers(0, 2),
)
def test_sample_shapes(num_particles, shape, simplex_size, kernel_index):
    shape = tuple(shape)

    def model():
        pyro.sample("loc", dist.Normal(torch.zeros(shape), 1.0).to_event(len(shape)))
        pyro.sample("probs", dist.Dirichlet(torch.ones(simplex_size)))

    kernel = KERNELS[kernel_index](model, step_size=1e-3, num_particles=num_particles)
    mcmc = run(kernel, num_samples=4, warmup_steps=2)
    grouped = mcmc.get_samples(group_by_chain=True)
    assert grouped["loc"].shape == (num_particles, 4) + shape
    assert grouped["probs"].shape == (num_particles, 4, simplex_size)
    assert mcmc.get_samples()["loc"].shape == (num_particles * 4,) + shape
    assert torch.allclose(grouped["probs"].sum(-1), torch.ones(num_particles, 4))


@pytest.mark.parametrize("repulsion", ["ours", "pyro"])
def test_noise_free_sgld_r_is_one_svgd_step(repulsion):
    data = torch.tensor([0.3, -1.2, 2.0, 0.7])

    # One latent site (positive, so the log-Jacobian matters): SVGD's flat parameter is
    # then laid out particle by particle.
    def model():
        w = pyro.sample("w", dist.LogNormal(torch.zeros(3), 1.0).to_event(1))
        with pyro.plate("data", 4):
            pyro.sample("obs", dist.Normal(w.sum(-1).log(), 1.0), obs=data)

    num_particles, step_size = 7, 0.05
    stein_kernel = RBFKernel() if repulsion == "ours" else RBFSteinKernel()
    svgd = SVGD(model, stein_kernel, SGD({"lr": step_size}), num_particles, 1, mode="multivariate")
    svgd.guide()  # creates the particle parameter
    particles = torch.randn(num_particles, 3)
    pyro.get_param_store()["svgd_particles"] = particles.reshape(-1).clone()
    svgd.step()
    expected = pyro.param("svgd_particles").detach().reshape(num_particles, 3)

    kernel = SGLD(
        model,
        step_size=step_size,
        num_particles=num_particles,
        repulsion=stein_kernel,
        temperature=0.0,
    )
    kernel.initial_params = {"w": particles}
    kernel.setup(0)
    params = kernel.sample(kernel.initial_params)
    assert torch.allclose(params["w"], expected, atol=1e-5)
    assert not torch.allclose(params["w"], particles, atol=1e-2)


def test_rbf_repulsion_matches_autograd():
    z = torch.randn(6, 4, dtype=torch.float64)
    kernel = RBFKernel(bandwidth=1.7)
    coupling = kernel.coupling(z)
    zj = z.clone().requires_grad_(True)
    k = torch.exp(-((zj.unsqueeze(1) - z.unsqueeze(0)) ** 2).sum(-1) / 1.7)  # k[j, i] = k(z_j, z_i)
    expected = torch.stack(
        [torch.autograd.grad(k[:, i].sum(), zj, retain_graph=True)[0].sum(0) for i in range(6)]
    )
    assert torch.allclose(coupling.repulsion, expected)
    assert torch.allclose(coupling.matrix, k.detach())
    # The one-product drift through the shift equals K grad + repulsion, eq. (2.8).
    grad = torch.randn(6, 4, dtype=torch.float64)
    expected_drift = (coupling.matrix @ grad + expected) / 6
    assert torch.allclose(drift(grad, coupling), expected_drift)
    assert torch.allclose(drift(grad, coupling._replace(shift=None)), expected_drift)


@pytest.mark.parametrize("num_particles", [2, 3, 4, 7])
def test_rbf_repulsion_is_the_exact_divergence_with_the_median_bandwidth(num_particles):
    # SGLD+R's divergence term Gamma_i = sum_j d K_ij / d z_j (eq. 2.5), where the median
    # bandwidth h(z) makes K_ij depend on every particle (4 particles: 6 pairs, an even
    # count, where the median is the lower middle one).
    z = torch.randn(num_particles, 3, dtype=torch.float64)
    rows, cols = torch.triu_indices(num_particles, num_particles, offset=1)

    def gram(particles, bandwidth=None):
        sq = (particles.unsqueeze(1) - particles.unsqueeze(0)).square().sum(-1)
        if bandwidth is None:
            bandwidth = sq[rows, cols].median() / math.log(num_particles + 1)
        return torch.exp(-sq / bandwidth)

    def divergence(jacobian):  # (L, L, L, D): d K_ij / d z_k
        return (
            torch.stack(
                [jacobian[i, j, j] for i in range(num_particles) for j in range(num_particles)]
            )
            .reshape(num_particles, num_particles, -1)
            .sum(1)
        )

    exact = divergence(torch.autograd.functional.jacobian(gram, z))
    assert torch.allclose(RBFKernel().coupling(z).repulsion, exact)
    # Holding h constant (SVGD's convention) leaves out a term of the same order.
    h = (2 * z / RBFKernel().coupling(z).shift)[0, 0]
    held = divergence(torch.autograd.functional.jacobian(lambda p: gram(p, h), z))
    frozen = RBFKernel().coupling(z, bandwidth_gradient=False)
    assert torch.allclose(frozen.repulsion, held)
    assert (exact - held).abs().max() > 0.01
    # The drift's one-product path carries the term too.
    grad = torch.randn(num_particles, 3, dtype=torch.float64)
    expected_drift = (gram(z) @ grad + exact) / num_particles
    assert torch.allclose(drift(grad, RBFKernel().coupling(z)), expected_drift)
    # A fixed bandwidth has no such term.
    fixed = RBFKernel(bandwidth=1.3)
    assert torch.allclose(fixed.coupling(z).repulsion, fixed.coupling(z, False).repulsion)


def test_repulsion_gradient_is_used_by_noisy_samplers_only():
    # SGLD+R at temperature 0 is SVGD (bandwidth held constant, as pyro.infer.SVGD does);
    # with noise the exact divergence enters: the two drifts differ by the bandwidth term.
    z = torch.randn(5, 2, dtype=torch.float64)
    exact = RBFKernel().coupling(z)
    frozen = RBFKernel().coupling(z, bandwidth_gradient=False)
    grad = torch.zeros_like(z)
    assert torch.allclose(drift(grad, exact) - drift(grad, frozen), exact.bandwidth_term / 5)
    assert exact.bandwidth_term.abs().max() > 0


def test_coupled_noise_covariance():
    z = torch.randn(5, 3, dtype=torch.float64)
    coupling = RBFKernel().coupling(z)
    draws = coupled_noise(coupling, torch.randn(4000, 5, 3, dtype=torch.float64))
    cov = torch.einsum("sid,sjd->ij", draws, draws) / (draws.shape[0] * 3)
    assert torch.allclose(cov, coupling.matrix / 5, atol=0.01)


def test_sgld_update_without_noise_is_gradient_ascent():
    z, grad = torch.randn(3, 2), torch.randn(3, 2)
    assert torch.allclose(
        sgld_update(z, grad, 0.1, torch.randn(3, 2), temperature=0.0), z + 0.1 * grad
    )


def test_same_seed_same_draws():
    x, y = logistic_data("cpu")
    draws = []
    for _ in range(2):
        pyro.set_rng_seed(3)
        kernel = SGHMC(logistic_model, step_size=1e-3, num_particles=4, repulsion="rbf")
        draws.append(run(kernel, x, y).get_samples()["w"])
    assert torch.equal(draws[0], draws[1])


@pytest.mark.parametrize("kernel_class", KERNELS)
def test_checkpoint_resume_gives_identical_draws(tmp_path, kernel_class):
    x, y = logistic_data("cpu")
    kwargs = dict(num_samples=30, warmup_steps=20, thinning=2)

    pyro.set_rng_seed(5)
    reference = run(
        kernel_class(logistic_model, 1e-3, num_particles=3, repulsion="rbf"), x, y, **kwargs
    )

    class Interrupt(Exception):
        """A simulated crash in the middle of the sampling stage."""

    def crash(kernel, params, stage, index):
        if stage == "Sample" and index == 27:
            raise Interrupt

    path = str(tmp_path / "run.ckpt")
    pyro.set_rng_seed(5)
    first = MCMC(
        kernel_class(logistic_model, 1e-3, num_particles=3, repulsion="rbf"),
        checkpoint_path=path,
        checkpoint_every=15,
        hook_fn=crash,
        disable_progbar=True,
        **kwargs,
    )
    with pytest.raises(Interrupt):
        first.run(x, y)
    resumed = MCMC(
        kernel_class(logistic_model, 1e-3, num_particles=3, repulsion="rbf"),
        checkpoint_path=path,
        disable_progbar=True,
        **kwargs,
    )
    pyro.set_rng_seed(123)  # resume restores the generator state itself
    resumed.resume(x, y)
    assert torch.equal(resumed.get_samples()["w"], reference.get_samples()["w"])


# The inductor-compiled case compiles for 10 s: in the integration run; the traced graph
# (the same step, not compiled) stays in the default run.
@pytest.mark.parametrize(
    "jit_compile", [False, "trace", pytest.param(True, marks=pytest.mark.integration)]
)
def test_a_factorisation_failing_inside_the_model_is_a_divergence_with_the_step(jit_compile):
    # A variance run to 0 makes the model's covariance singular and its Cholesky raise.
    # That is a divergence at that step, the draws so far kept, not a raw LinAlgError; a
    # compiled step hands the failing step to the eager one, which reports it the same way.
    def model():
        s = pyro.sample("s", dist.Normal(0.0, 1.0))
        pyro.factor("pull", -1e4 * s)  # ... which the first step of size 1 throws to -5000
        pyro.sample("x", dist.Normal(0.0, 1.0))
        cov = torch.ones(2, 2) + torch.eye(2) * torch.nn.functional.softplus(s)
        pyro.sample("y", dist.MultivariateNormal(torch.zeros(2), cov), obs=torch.ones(2))

    kernel = SGLD(
        model,
        step_size=1.0,
        num_particles=2,
        init_strategy=init_to_value(values={"s": torch.tensor(0.0)}),
        jit_compile=jit_compile,
    )
    mcmc = MCMC(kernel, num_samples=20, warmup_steps=0, disable_progbar=True)
    with pytest.raises(SamplerDivergenceError, match=r"step 1: the model raised LinAlgError"):
        mcmc.run()
    assert mcmc.get_samples(group_by_chain=True)["x"].shape == (2, 1)


def test_divergence_names_step_and_site_and_keeps_draws(device):
    def model():
        pyro.sample("stiff", dist.Normal(torch.zeros(2, device=device), 1e-3).to_event(1))
        pyro.sample("soft", dist.Normal(torch.zeros((), device=device), 1.0))

    kernel = SGLD(model, step_size=0.1, num_particles=2)
    mcmc = MCMC(kernel, num_samples=100, warmup_steps=0, disable_progbar=True)
    with pytest.raises(SamplerDivergenceError, match=r"step \d+.*'stiff'") as info:
        mcmc.run()
    assert info.value.sites == ["stiff"]
    kept = mcmc.get_samples(group_by_chain=True)["stiff"]
    assert kept.shape == (2, info.value.step, 2)
    assert torch.isfinite(kept).all()
    # The error survives pickling, e.g. the trip back from a worker process.
    copy = pickle.loads(pickle.dumps(info.value))
    assert info.value.particles and set(info.value.particles) <= {0, 1}
    assert (copy.step, copy.sites, copy.particles) == (
        info.value.step,
        ["stiff"],
        info.value.particles,
    )
    assert str(copy) == str(info.value)


def test_initial_params_are_used():
    def model():
        pyro.sample("a", dist.Normal(0.0, 1.0))

    kernel = SGLD(model, step_size=1e-8, num_particles=3, temperature=0.0)
    mcmc = MCMC(
        kernel,
        num_samples=2,
        warmup_steps=0,
        initial_params={"a": torch.tensor([5.0, 6.0, 7.0])},
        disable_progbar=True,
    )
    mcmc.run()
    assert torch.allclose(
        mcmc.get_samples(group_by_chain=True)["a"][:, 0], torch.tensor([5.0, 6.0, 7.0]), atol=1e-4
    )


def test_step_size_schedules():
    decay = PolynomialDecay(a=0.1, b=10.0, gamma=0.55)
    assert decay(0) == pytest.approx(0.1 * 10**-0.55)
    assert decay(90) == pytest.approx(0.1 * 100**-0.55)
    cyclic = CyclicalStepSize(0.2, num_cycles=2, num_steps=10)
    assert [cyclic(t) for t in (0, 5)] == [pytest.approx(0.2), pytest.approx(0.2)]
    assert cyclic(4) < cyclic(3) < cyclic(0)

    def model():
        pyro.sample("a", dist.Normal(0.0, 1.0))

    kernel = SGLD(model, step_size=decay)
    run(kernel, num_samples=3, warmup_steps=0)
    assert kernel.diagnostics()["step_size"] == pytest.approx(decay(2))


def discrete_model():
    pyro.sample("k", dist.Categorical(torch.ones(3)))


def local_latent_model(x):
    with pyro.plate("data", x.shape[0], subsample_size=2):
        pyro.sample("z", dist.Normal(0.0, 1.0))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: SGLD(discrete_model, 1e-3).setup(0), "latent site 'k' is discrete"),
        (
            lambda: SGLD(local_latent_model, 1e-3).setup(0, torch.zeros(5)),
            "'z' lies inside the subsampled plate 'data'",
        ),
        (lambda: SGLD(logistic_model, step_size=0.0), "step_size must be a finite number > 0"),
        (lambda: SGLD(logistic_model, step_size=-1e-3), "step_size must be a finite number > 0"),
        (
            lambda: SGLD(logistic_model, step_size=float("nan")),
            "step_size must be a finite number > 0",
        ),
        (
            lambda: SGLD(logistic_model, 1e-3, num_particles=0),
            "num_particles must be an integer >= 1, got 0",
        ),
        (
            lambda: SGLD(logistic_model, 1e-3, num_particles=4, repulsion="gaussian"),
            "repulsion must be None, 'rbf'",
        ),
        (lambda: SGLD(logistic_model, 1e-3, repulsion="rbf"), "needs num_particles >= 2"),
        (lambda: SGLD(logistic_model, 1e-3, temperature=-1.0), "temperature must be"),
        (
            lambda: SGHMC(logistic_model, 1e-3, friction=0.0),
            r"friction must be a finite number in \(0, 1\]",
        ),
        (
            lambda: AdamSGLD(logistic_model, 1e-3, betas=(1.0, 0.9)),
            r"betas\[0\] must be a finite number in \[0, 1\)",
        ),
        (lambda: PolynomialDecay(a=0.1, gamma=1.5), r"gamma must be a finite number in \(0, 1\]"),
        (lambda: RBFKernel(bandwidth=-1.0), "bandwidth must be a finite number > 0 or None"),
        (
            lambda: MCMC(SGLD(logistic_model, 1e-3), num_samples=10, num_chains=2),
            "set num_particles",
        ),
        (
            lambda: MCMC(SGLD(logistic_model, 1e-3), num_samples=10, thinning=0),
            "thinning must be an integer >= 1, got 0",
        ),
    ],
)
def test_bad_input_gives_clear_errors(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: SGLD(logistic_model, step_size="0.1"), "step_size must be a finite number > 0"),
        (lambda: SGLD(logistic_model, 1e-3, num_particles=2.0), "num_particles must be an integer"),
        (
            lambda: SGLD(logistic_model, 1e-3, num_particles=True),
            "num_particles must be an integer",
        ),
        (
            lambda: SGLD(logistic_model, 1e-3, temperature="1"),
            "temperature must be a finite number",
        ),
        (lambda: SGLD(logistic_model, 1e-3, vectorize=None), "vectorize must be a string"),
        (lambda: SGLD(logistic_model, bias_bound=None), "bias_bound must be a string"),
        (
            lambda: SGLD(logistic_model, 1e-3, divergence_check_every=2.0),
            "divergence_check_every must be an integer >= 1 or None",
        ),
        (lambda: SGHMC(logistic_model, 1e-3, friction=True), "friction must be a finite number"),
        (lambda: AdamSGLD(logistic_model, 1e-3, betas=(0.9, "0.99")), r"betas\[1\] must be a"),
        (lambda: PolynomialDecay(a="0.1"), "a must be a finite number > 0"),
        (lambda: CyclicalStepSize(0.1, num_cycles=2.0, num_steps=10), "num_cycles must be an"),
        (lambda: RBFKernel(bandwidth="1"), "bandwidth must be a finite number > 0 or None"),
    ],
)
def test_wrong_types_are_type_errors(make, match):
    with pytest.raises(TypeError, match=match):
        make()


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: SGLD(logistic_model, 1e-3, vectorize="batch"), "vectorize must be one of 'auto'"),
        (lambda: SGLD(logistic_model, bias_bound="max"), "bias_bound must be one of 'auto'"),
        (
            lambda: SGLD(logistic_model, 1e-3, divergence_check_every=0),
            "divergence_check_every must be an integer >= 1 or None, got 0",
        ),
        (lambda: CyclicalStepSize(0.1, num_cycles=0, num_steps=10), "num_cycles must be an"),
        (lambda: CyclicalStepSize(0.1, num_cycles=3, num_steps=2), "num_cycles <= num_steps"),
    ],
)
def test_wrong_values_are_value_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_initial_params_shape():
    x, y = logistic_data("cpu")
    kernel = SGLD(logistic_model, 1e-3, num_particles=2)
    kernel.initial_params = {"w": torch.zeros(5, 3)}
    with pytest.raises(ValueError, match=r"initial_params\['w'\] has shape \(5, 3\)"):
        kernel.setup(0, x, y)


def test_schedule_returning_bad_step_size_is_reported():
    def model():
        pyro.sample("a", dist.Normal(0.0, 1.0))

    kernel = SGLD(model, step_size=lambda t: 0.1 if t < 2 else -1.0)
    with pytest.raises(ValueError, match="step size schedule gave -1.0 at step 2"):
        run(kernel, num_samples=5, warmup_steps=0)


def test_minibatch_gradient_is_unbiased():
    x, y = logistic_data("cpu", n=400)
    kernel = SGLD(logistic_model, 1e-3, num_particles=2)
    kernel.setup(0, x, y)
    z = torch.randn(2, 3)
    potential = kernel.potential
    # Four disjoint minibatches that cover the data average to the full-data gradient.
    partition = torch.randperm(400).reshape(4, 100)
    full_grad = torch.stack(
        [potential.log_density_and_grad(z, {"data": b})[1] for b in partition]
    ).mean(0)
    grads = torch.stack([potential.log_density_and_grad(z)[1] for _ in range(3000)])
    se = grads.std(0) / math.sqrt(grads.shape[0])
    assert ((grads.mean(0) - full_grad).abs() < 4 * se).all()


def test_vmap_and_plate_paths_agree():
    counts = torch.tensor([3.0, 10.0, 7.0])

    def vectorisable(counts):
        probs = pyro.sample("probs", dist.Dirichlet(torch.ones(3)))
        with pyro.plate("rep", 2):
            pyro.sample("obs", dist.Multinomial(20, probs), obs=counts)

    kernel = SGLD(vectorisable, 1e-3, num_particles=4)
    kernel.setup(0, counts)
    z = torch.randn(4, 2)
    subsamples = {}
    by_plate = kernel.potential.log_density_plate(z, subsamples)
    by_loop = torch.stack([kernel.potential.log_density(particle, subsamples) for particle in z])
    assert torch.allclose(by_plate, by_loop)
    log_density, _ = kernel.potential.log_density_and_grad(z, subsamples)
    assert kernel.potential.vectorize == "plate"  # Multinomial masks by boolean index
    assert torch.allclose(log_density, by_loop)


def test_arviz_from_pyro():
    az = pytest.importorskip("arviz")
    x, y = logistic_data("cpu")

    def vectorisable_model(x, y):
        w = pyro.sample("w", dist.Normal(x.new_zeros(x.shape[1]), 1.0).to_event(1))
        with pyro.plate("data", x.shape[0], subsample_size=100) as idx:
            pyro.sample("y", dist.Bernoulli(logits=(x[idx] * w.unsqueeze(-2)).sum(-1)), obs=y[idx])

    mcmc = run(SGLD(vectorisable_model, 1e-3, num_particles=4), x, y)
    idata = az.from_pyro(mcmc)
    assert idata.posterior["w"].shape == (4, 20, 3)
    assert idata.log_likelihood["y"].shape == (4, 20, 100)
    assert not idata.sample_stats["diverging"].values.any()
    assert set(az.summary(idata).index) == {"w[0]", "w[1]", "w[2]"}


def test_mixture_latent_site_is_sampled_in_unconstrained_space():
    def model():
        mixture = dist.MixtureSameFamily(
            dist.Categorical(torch.ones(2)), dist.Exponential(torch.tensor([1.5, 0.5]))
        )
        pyro.sample("x", mixture)

    samples = run(SGLD(model, 0.05, num_particles=4), num_samples=50).get_samples()["x"]
    assert (samples > 0).all()


def test_repulsive_divergence_is_reported_not_a_linear_algebra_error():
    def model():
        pyro.sample("stiff", dist.Normal(torch.zeros(2), 1e-3).to_event(1))

    mcmc = MCMC(
        SGLD(model, 0.1, num_particles=5, repulsion="rbf"),
        num_samples=200,
        warmup_steps=0,
        disable_progbar=True,
    )
    with pytest.raises(SamplerDivergenceError, match="'stiff'"):
        mcmc.run()
    assert torch.isfinite(mcmc.get_samples()["stiff"]).all()


# The inductor-compiled cases (about 25 s, the cold compile) are in the integration run; the
# default run keeps the traced ones, and test_sgmcmc_compiled.py compiles with inductor.
@pytest.mark.parametrize(
    "jit_compile", ["trace", pytest.param(True, marks=pytest.mark.integration)]
)
@pytest.mark.parametrize("num_particles", [1, 4])
def test_jit_compile_gives_the_same_draws(num_particles, jit_compile):
    x, y = logistic_data("cpu")

    def vectorisable_model(x, y):
        w = pyro.sample("w", dist.Normal(x.new_zeros(x.shape[1]), 1.0).to_event(1))
        scale = pyro.sample("scale", dist.LogNormal(0.0, 1.0))
        with pyro.plate("data", x.shape[0], subsample_size=100) as idx:
            pyro.sample("y", dist.Bernoulli(logits=(x[idx] * w).sum(-1) / scale), obs=y[idx])

    draws = []
    for compiled in (False, jit_compile):
        pyro.set_rng_seed(0)
        kernel = SGHMC(vectorisable_model, 1e-3, num_particles=num_particles, jit_compile=compiled)
        draws.append(run(kernel, x, y).get_samples())
    assert kernel.compiled_step.num_traces == 1
    for name in ("w", "scale"):
        assert torch.allclose(draws[0][name], draws[1][name], atol=1e-5)


def test_potential_constrain_unconstrain_and_log_jacobian():
    """The potential's public maps: a round trip, and the log-Jacobian autograd computes."""

    def model():
        pyro.sample("scale", dist.LogNormal(0.0, 1.0))
        pyro.sample("probs", dist.Dirichlet(torch.ones(3)))
        pyro.sample("loc", dist.Normal(torch.zeros(2), 1.0).to_event(1))

    potential = ParticlePotential(model)
    z = torch.randn(4, potential.dim, dtype=torch.float64)
    values = potential.constrain(z)
    assert (values["scale"] > 0).all() and torch.allclose(
        values["probs"].sum(-1), torch.ones(4, dtype=torch.float64)
    )
    torch.testing.assert_close(potential.unconstrain(values, 4), z)
    for particle in z:
        flat = lambda u: torch.cat([v.reshape(-1) for v in potential.constrain(u).values()])  # noqa: E731
        jacobian = torch.autograd.functional.jacobian(
            flat, particle
        )  # (D + 1, D): the simplex adds one
        # log|det| of the square map (scale, first two probs, loc) equals the potential's log-Jacobian
        keep = [0, 1, 2, 4, 5]
        expected = torch.linalg.slogdet(jacobian[keep])[1]
        torch.testing.assert_close(potential.log_jacobian(particle), expected)


def test_a_stein_kernel_with_a_particle_bandwidth_is_flagged_for_sampling():
    with pytest.warns(UserWarning, match="holds its bandwidth constant"):
        SGLD(logistic_model, 1e-3, num_particles=3, repulsion=RBFSteinKernel())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SGLD(logistic_model, 1e-3, num_particles=3, repulsion=RBFSteinKernel(), temperature=0.0)
        SGLD(logistic_model, 1e-3, num_particles=3, repulsion="rbf")


def gaussian_gradient(z, batch):
    """The 1-D standard Gaussian potential: log densities ``(L,)`` and gradients ``(L, 1)``."""
    return -0.5 * z.pow(2).sum(-1), -z


def test_one_sgld_step_is_the_langevin_update_by_hand():
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(5, 1, generator=generator)
    noise = torch.randn(5, 1, generator=generator)
    eps = 1e-2
    state, info = step(
        PositionState(z),
        {},
        noise,
        eps,
        gradient=gaussian_gradient,
        update=lambda s, g, e, n, c: SAMPLERS["sgld"].update(s, g, e, n, c, 1.0, False),
    )
    torch.testing.assert_close(state.z, z + eps * -z + math.sqrt(2 * eps) * noise)
    torch.testing.assert_close(info.log_density, -0.5 * z.squeeze(-1) ** 2)
    torch.testing.assert_close(info.grad, -z)
    assert info.ok.dim() == 0 and bool(info.ok)
    state, info = step(
        PositionState(torch.full((5, 1), math.nan)),
        {},
        noise,
        eps,
        gradient=gaussian_gradient,
        update=lambda s, g, e, n, c: SAMPLERS["sgld"].update(s, g, e, n, c, 1.0, False),
    )
    assert not bool(info.ok)


@pytest.mark.parametrize("sampler", ["sgld", "sghmc", "adam"])
def test_a_repulsive_step_is_the_coupled_transition(sampler):
    """step(...) = gradient, then the update with the Stein coupling of the particles."""
    generator = torch.Generator().manual_seed(1)
    z = torch.randn(6, 1, generator=generator)
    noise = torch.randn(6, 1, generator=generator)
    eps = 3e-2
    entry = SAMPLERS[sampler]
    pyro.set_rng_seed(2)
    start = entry.init_state(z, eps, 1.0)

    def update(s, g, e, n, c):
        return entry.update(s, g, e, n, c, 1.0, True)

    repulsion = RBFKernel()
    state, info = step(
        start, {}, noise, eps, gradient=gaussian_gradient, update=update, repulsion=repulsion
    )
    coupling = stein_coupling(repulsion, z, True)
    expected = update(start, -z, eps, noise, coupling)
    for got, want in zip(state, expected):
        assert torch.equal(got, want)
    assert torch.equal(info.grad, -z) and bool(info.ok)
    # The noise-free limit (SVGD's bandwidth held constant) passes bandwidth_gradient on.
    state, _ = step(
        start,
        {},
        noise,
        eps,
        gradient=gaussian_gradient,
        update=update,
        repulsion=repulsion,
        bandwidth_gradient=False,
    )
    expected = update(start, -z, eps, noise, stein_coupling(repulsion, z, False))
    assert torch.equal(state.z, expected.z)


def test_the_eager_kernel_step_is_step_on_the_potential():
    """One eager SGLD+R step of the kernel is step(...) on its potential and its draws."""
    x, y = logistic_data("cpu")
    kernel = SGLD(logistic_model, 1e-3, num_particles=4, repulsion="rbf")
    kernel.setup(0, x, y)
    start = kernel.state
    pyro.set_rng_seed(5)
    new_z = kernel.potential.flatten(kernel.sample(kernel.initial_params), 4)
    pyro.set_rng_seed(5)
    batch = kernel.potential.draw_subsamples(start.z.device)
    noise = torch.randn_like(start.z)
    state, info = step(
        start,
        batch,
        noise,
        1e-3,
        gradient=kernel.potential.log_density_and_grad,
        update=lambda s, g, e, n, c: SAMPLERS["sgld"].update(s, g, e, n, c, 1.0, False),
        repulsion=kernel.repulsion,
    )
    assert torch.equal(state.z, new_z) and torch.equal(kernel.state.z, new_z)
    assert torch.equal(kernel.step_start.grad, info.grad)
