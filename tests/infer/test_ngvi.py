import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import Predictive

from pyro_ext.infer import SGLD, NaturalGradientVI, NGVIDivergenceError
from pyro_ext.infer.ngvi import ngvi_update

PRIOR_SCALE = 2.0


# -- a Bayesian linear regression: the exact posterior is known ------------------------------
def linear_data(device, num_data=200, dim=3, noise=0.5):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(num_data, dim, generator=generator).to(device)
    w = torch.tensor([1.0, -0.5, 0.25]).to(device)
    y = x @ w + noise * torch.randn(num_data, generator=generator).to(device)
    return x, y, noise


def linear_model(x, y, noise, subsample_size=None):
    w = pyro.sample("w", dist.Normal(x.new_zeros(x.shape[-1]), PRIOR_SCALE).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w, noise), obs=y[idx])


def exact_posterior(x, y, noise):
    precision = x.T @ x / noise**2 + torch.eye(x.shape[-1], device=x.device) / PRIOR_SCALE**2
    mean = torch.linalg.solve(precision, x.T @ y / noise**2)
    return mean, precision


def test_von_reaches_the_mean_field_optimum(device):
    """Full batch, exact Hessian: h + delta -> diag(Lambda) / N and m -> the posterior mean."""
    x, y, noise = linear_data(device)
    mean, precision = exact_posterior(x, y, noise)
    vi = NaturalGradientVI(
        linear_model,
        method="von",
        lr=0.5,
        ess=len(x),
        beta1=0.0,
        beta2=0.5,
        mc_samples=64,
        rescale_lr=False,
    )
    means = []
    for step in range(300):
        vi.step(x, y, noise)
        if step >= 200:
            means.append(vi.state.mean)
    # The mean-field optimum of a Gaussian posterior: its mean, and precisions diag(Lambda).
    expected_scale = precision.diagonal().rsqrt()
    assert torch.allclose(vi.scale, expected_scale, rtol=1e-4)
    # The iterates fluctuate around the optimum with the Monte Carlo gradient noise, of
    # order sigma / sqrt(mc_samples) per step; their average over 100 steps is far closer.
    average = torch.stack(means).mean(0)
    assert torch.allclose(average, mean, atol=0.2 * expected_scale.max().item())
    assert not torch.allclose(average, torch.zeros_like(mean), atol=0.1)


def test_ivon_estimates_the_posterior_of_a_linear_regression(device):
    """IVON's Hessian estimate is unbiased here: its posterior is the mean-field optimum."""
    x, y, noise = linear_data(device)
    mean, precision = exact_posterior(x, y, noise)
    vi = NaturalGradientVI(
        linear_model, lr=0.05, ess=len(x), beta2=0.99, mc_samples=8, hess_init=0.5
    )
    for _ in range(2000):
        vi.step(x, y, noise)
    expected_scale = precision.diagonal().rsqrt()
    assert torch.allclose(vi.scale, expected_scale, rtol=0.15)
    assert torch.allclose(vi.state.mean, mean, atol=expected_scale.max().item())


def test_ivon_step_is_algorithm_1_of_the_paper():
    """Two steps against Shen et al. (2024), Algorithm 1, written out on 3 parameters."""
    x, y, noise = linear_data(torch.device("cpu"), num_data=20)
    num_data = x.shape[0]
    lr, beta1, beta2, h0 = 0.1, 0.9, 0.999, 0.3
    delta = 1 / (PRIOR_SCALE**2 * num_data)
    start = torch.tensor([0.1, 0.2, -0.3])
    vi = NaturalGradientVI(
        linear_model,
        lr=lr,
        ess=num_data,
        beta1=beta1,
        beta2=beta2,
        hess_init=h0,
        rescale_lr=False,
        init_loc_fn=lambda site: start,
    )

    def average_loss(theta):  # the likelihood's: the Gaussian prior is delta
        return -dist.Normal(x @ theta, noise).log_prob(y).sum() / num_data

    vi.setup(x, y, noise)  # reads the model (random draws), before the seeds below
    m, g, h = start.clone(), torch.zeros(3), torch.full((3,), h0)
    for t in (1, 2):
        torch.manual_seed(t)
        vi.step(x, y, noise)
        torch.manual_seed(t)
        sigma = 1 / torch.sqrt(num_data * (h + delta))
        theta = (m + sigma * torch.randn(3)).requires_grad_()
        (g_hat,) = torch.autograd.grad(average_loss(theta), theta)
        h_hat = g_hat * (theta.detach() - m) / sigma**2
        g = beta1 * g + (1 - beta1) * g_hat
        h = (
            beta2 * h
            + (1 - beta2) * h_hat
            + 0.5 * (1 - beta2) ** 2 * (h - h_hat) ** 2 / (h + delta)
        )
        g_bar = g / (1 - beta1**t)
        m = m - lr * (g_bar + delta * m) / (h + delta)
        assert torch.allclose(vi.state.mean, m, atol=1e-6)
        assert torch.allclose(vi.state.hess, h, rtol=1e-5)
        assert torch.allclose(vi.state.momentum, g, atol=1e-6)


def test_one_step_equals_ivon_opt():
    """The same network, batch and draw as the `ivon-opt` package, to float32 round-off."""
    ivon = pytest.importorskip("ivon")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    x, y = torch.randn(32, 3), torch.randn(32)
    names = ["w1", "b1", "w2", "b2"]
    start = {name: p.detach().clone() for name, p in zip(names, net.parameters())}

    def model(x, y):
        prior = dist.Normal(x.new_zeros(()), 1.0)
        w1 = pyro.sample("w1", prior.expand([4, 3]).to_event(2))
        b1 = pyro.sample("b1", prior.expand([4]).to_event(1))
        w2 = pyro.sample("w2", prior.expand([1, 4]).to_event(2))
        b2 = pyro.sample("b2", prior.expand([1]).to_event(1))
        with pyro.plate("data", x.shape[0]):
            out = torch.tanh(x @ w1.T + b1) @ w2.T + b2
            pyro.sample("y", dist.Normal(out.squeeze(-1), 1.0), obs=y)

    settings = dict(lr=0.05, hess_init=0.5, beta1=0.9, beta2=0.999, weight_decay=1e-2)
    theirs = ivon.IVON(net.parameters(), ess=len(x), **settings)
    ours = NaturalGradientVI(
        model, ess=len(x), init_loc_fn=lambda site: start[site["name"]], **settings
    )
    ours.setup(x, y)
    for step in range(3):
        torch.manual_seed(100 + step)
        with theirs.sampled_params(train=True):
            theirs.zero_grad()
            loss = 0.5 * (net(x).squeeze(-1) - y).pow(2).mean()
            loss.backward()
        theirs.step()
        torch.manual_seed(100 + step)
        ours.step(x, y)
        flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        assert torch.allclose(ours.state.mean, flat, atol=1e-6)
        assert torch.allclose(ours.state.hess, theirs.param_groups[0]["hess"], rtol=1e-5)


# -- priors, the guide, composition -------------------------------------------------------------
def test_fixed_normal_priors_become_the_precision_and_others_stay_in_the_loss():
    def model(x):
        w = pyro.sample("w", dist.Normal(torch.ones(2), 3.0).to_event(1))
        tau = pyro.sample("tau", dist.Gamma(2.0, 1.0))
        v = pyro.sample("v", dist.Normal(0.0, tau))  # depends on a latent: not fixed
        with pyro.plate("data", 50, subsample_size=10) as idx:
            pyro.sample("y", dist.Normal(w.sum() + v, 1.0), obs=x[idx])

    vi = NaturalGradientVI(model)
    vi.step(torch.randn(50))
    assert vi.ess == 50  # the plate's full size
    layout = vi.potential.layout
    w, tau, v = (slice(layout[n].start, layout[n].end) for n in ("w", "tau", "v"))
    assert torch.allclose(vi.prior_precision[w], torch.full((2,), 1 / (9.0 * 50)))
    assert torch.equal(vi.prior_mean[w], torch.ones(2))
    assert vi.prior_precision[tau].eq(0).all() and vi.prior_precision[v].eq(0).all()


def test_guide_posterior_and_init_strategy(device):
    x, y, noise = linear_data(device)

    def model(x, y):
        scale = pyro.sample("noise", dist.LogNormal(x.new_zeros(()), 1.0))
        w = pyro.sample("w", dist.Normal(x.new_zeros(x.shape[-1]), PRIOR_SCALE).to_event(1))
        with pyro.plate("data", x.shape[0], subsample_size=50) as idx:
            pyro.sample("y", dist.Normal(x[idx] @ w, scale), obs=y[idx])

    vi = NaturalGradientVI(model, lr=0.1, beta2=0.999, hess_init=0.1)
    for _ in range(1500):
        vi.step(x, y)
    posterior = vi.posterior()
    mean, _ = exact_posterior(x, y, noise)
    loc, scale = posterior["w"]
    assert loc.shape == scale.shape == (3,)
    assert torch.allclose(loc, mean, atol=0.1)
    noise_loc, noise_scale = posterior["noise"]
    assert abs(noise_loc.item() - noise) < 0.1 and 0 < noise_scale.item() < 0.1
    # The log-normal mean from the unconstrained Gaussian matches the Monte Carlo one.
    u = slice(vi.potential.layout["noise"].start, vi.potential.layout["noise"].end)
    expected = torch.exp(vi.state.mean[u] + vi.scale[u] ** 2 / 2)
    assert torch.allclose(noise_loc, expected.squeeze(), rtol=0.01)

    draws = Predictive(model, guide=vi.guide, num_samples=300)(x, y)
    w = draws["w"].reshape(300, 3)  # Predictive pads global sites to the plate nesting
    direct = vi.sample_posterior(2000)
    assert direct["w"].shape == (2000, 3) and direct["noise"].shape == (2000,)
    assert torch.allclose(direct["w"].std(0), scale, rtol=0.1)
    assert torch.allclose(w.mean(0), loc, atol=4 * scale.max().item())

    kernel = SGLD(model, 1e-4, num_particles=4, init_strategy=vi.init_strategy())
    kernel.setup(0, x, y)
    particles = kernel.particles
    assert not torch.allclose(particles[0], particles[1])
    w_columns = particles[:, u.stop :] if u.start == 0 else particles[:, : u.start]
    assert (w_columns - mean).abs().max() < 1.0


def test_same_seed_same_posterior():
    x, y, noise = linear_data(torch.device("cpu"))
    runs = []
    for _ in range(2):
        pyro.set_rng_seed(3)
        vi = NaturalGradientVI(linear_model, mc_samples=2)
        losses = [vi.step(x, y, noise, subsample_size=20) for _ in range(5)]
        runs.append((losses, vi.state.mean))
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])


def test_divergence_names_the_step_and_keeps_the_state():
    x, y, noise = linear_data(torch.device("cpu"))
    vi = NaturalGradientVI(linear_model, lr=1e30, ess=len(x), beta1=0.0)
    vi.step(x, y, noise)
    before = vi.state
    with pytest.raises(NGVIDivergenceError, match="diverged at step") as info:
        for _ in range(10):
            before = vi.state
            vi.step(x, y, noise)
    assert info.value.step >= 1
    assert vi.state is before


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(lr=0.0), ValueError, "lr must be a finite number > 0, got 0.0"),
        (dict(lr="0.1"), TypeError, "lr must be a finite number > 0"),
        (dict(ess=-1), ValueError, "ess must be a finite number > 0 or None"),
        (dict(ess="all"), TypeError, "ess must be a finite number > 0 or None"),
        (dict(hess_init=0), ValueError, "hess_init must be a finite number > 0"),
        (dict(beta2=1.0), ValueError, r"beta2 must be a finite number in \(0, 1\)"),
        (dict(beta1=-0.1), ValueError, r"beta1 must be a finite number in \[0, 1\)"),
        (dict(beta1=True), TypeError, r"beta1 must be a finite number in \[0, 1\)"),
        (dict(method="vadam"), ValueError, "method must be one of 'ivon', 'vogn', 'von'"),
        (dict(method=None), TypeError, "method must be a string"),
        (dict(mc_samples=0), ValueError, "mc_samples must be an integer >= 1, got 0"),
        (dict(mc_samples=2.0), TypeError, "mc_samples must be an integer >= 1"),
        (dict(clip_radius=0.0), ValueError, "clip_radius must be a number > 0"),
        (dict(clip_radius=float("nan")), ValueError, "clip_radius must be a number > 0"),
        (dict(clip_radius="inf"), TypeError, "clip_radius must be a number > 0"),
        (dict(weight_decay=-1.0), ValueError, "weight_decay must be a finite number > 0"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        NaturalGradientVI(linear_model, **kwargs)


@pytest.mark.parametrize(
    "num_samples, error", [(0, ValueError), (2.0, TypeError), (True, TypeError)]
)
def test_sample_posterior_checks_num_samples(num_samples, error):
    x, y, noise = linear_data(torch.device("cpu"))
    vi = NaturalGradientVI(linear_model, ess=len(x))
    vi.step(x, y, noise)
    with pytest.raises(error, match="num_samples must be an integer >= 1"):
        vi.sample_posterior(num_samples)


def test_models_it_cannot_fit_say_why():
    x, y, noise = linear_data(torch.device("cpu"))
    with pytest.raises(ValueError, match="ess .* must be given"):
        NaturalGradientVI(linear_model).step(x, y, noise)

    def discrete(x):
        k = pyro.sample("k", dist.Bernoulli(0.5))
        with pyro.plate("data", 10, subsample_size=5):
            pyro.sample("x", dist.Normal(k, 1.0), obs=x[:5])

    with pytest.raises(ValueError, match="latent site 'k' is discrete"):
        NaturalGradientVI(discrete).step(torch.randn(10))
    with pytest.raises(RuntimeError, match="call step"):
        NaturalGradientVI(linear_model).posterior()


def test_update_with_zero_lr_keeps_the_mean():
    from pyro_ext.infer.ngvi import init_state

    state = init_state(torch.tensor([1.0, 2.0]), 1.0)
    new = ngvi_update(state, torch.ones(2), torch.ones(2), 0.0, 0.1, 0.0)
    assert torch.equal(new.mean, state.mean)
    assert new.count == 1
    assert math.isclose(new.momentum[0].item(), 0.1, rel_tol=1e-6)


def test_von_hessian_diagonal_is_exact():
    """VON's curvature: the diagonal of autograd's full Hessian, at each draw."""

    def model(x, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(2, 3), 1.0).to_event(2))
        v = pyro.sample("v", dist.Normal(torch.zeros(3), 1.0).to_event(1))
        with pyro.plate("data", x.shape[0], subsample_size=6) as idx:
            pyro.sample("y", dist.Bernoulli(logits=torch.tanh(x[idx] @ w) @ v), obs=y[idx])

    x, y = torch.randn(20, 2), torch.randint(0, 2, (20,)).float()
    vi = NaturalGradientVI(model, method="von", mc_samples=2).setup(x, y)
    theta = torch.randn(2, vi.potential.dim)
    subsamples = vi.potential.draw_subsamples(theta.device)
    ours = vi._exact_hessian_diagonal(theta, subsamples)
    for draw, row in zip(theta, ours):

        def loss(point):
            log_density = vi.potential.log_density_all(point.unsqueeze(0), subsamples)
            return -log_density.sum() / vi.ess

        expected = torch.autograd.functional.hessian(loss, draw).diagonal()
        assert torch.allclose(row, expected, atol=1e-5)


def test_weight_decay_needs_fixed_normal_priors():
    def model(x):
        scale = pyro.sample("scale", dist.HalfNormal(1.0))
        with pyro.plate("data", x.shape[0], subsample_size=5):
            pyro.sample("x", dist.Normal(0.0, scale), obs=x[:5])

    with pytest.raises(ValueError, match=r"site\(s\) \['scale'\] have other priors"):
        NaturalGradientVI(model, weight_decay=1e-4).step(torch.randn(10))


def test_ngvi_posterior_is_a_base_guide_for_vis():
    from pyro.infer import Trace_ELBO

    from pyro_ext.infer import VIS

    x, y, noise = linear_data(torch.device("cpu"))
    vi = NaturalGradientVI(linear_model, ess=len(x))
    for _ in range(200):
        vi.step(x, y, noise)
    refined = VIS(linear_model, vi.guide, sampler="sgld", num_steps=2, step_size=1e-4)
    loss = Trace_ELBO().loss(linear_model, refined, x, y, noise)
    assert math.isfinite(loss)


def test_vogn_gauss_newton_is_the_exact_hessian_of_a_linear_gaussian_model():
    x, y, noise = linear_data(torch.device("cpu"))
    vi = NaturalGradientVI(linear_model, method="vogn", ess=len(x)).setup(x, y, noise)
    theta = torch.randn(vi.potential.dim)
    ggn = vi._gauss_newton_diagonal(theta, {})
    expected = (x**2).sum(0) / noise**2 / len(x)  # diag(X^T X) / (sigma^2 N)
    assert torch.allclose(ggn, expected, rtol=1e-5)


@pytest.mark.parametrize("likelihood", ["bernoulli", "categorical"])
def test_vogn_gauss_newton_is_j_lambda_j(likelihood):
    """GGN diag of a logistic/softmax model against J^T Lambda J built from autograd."""
    classes = 2 if likelihood == "bernoulli" else 3
    outputs = 1 if likelihood == "bernoulli" else classes

    def logits_of(w, x):
        return torch.tanh(x @ w[:4].reshape(2, 2)) @ w[4:].reshape(2, outputs)

    def model(x, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(4 + 2 * outputs), 1.0).to_event(1))
        with pyro.plate("data", x.shape[0], subsample_size=8) as idx:
            logits = logits_of(w, x[idx])
            fn = (
                dist.Bernoulli(logits=logits.squeeze(-1))
                if likelihood == "bernoulli"
                else dist.Categorical(logits=logits)
            )
            pyro.sample("y", fn, obs=y[idx])

    x = torch.randn(30, 2)
    y = torch.randint(0, classes, (30,)).float()
    if likelihood == "categorical":
        y = y.long()
    vi = NaturalGradientVI(model, method="vogn").setup(x, y)
    theta = torch.randn(vi.potential.dim)
    subsamples = vi.potential.draw_subsamples(theta.device)
    ggn = vi._gauss_newton_diagonal(theta, subsamples, chunk_size=5)
    xb = x[subsamples["data"]]
    jacobian = torch.autograd.functional.jacobian(lambda w: logits_of(w, xb), theta)  # (B, K, D)
    p = torch.softmax(logits_of(theta, xb), -1)
    if likelihood == "bernoulli":
        p = torch.sigmoid(logits_of(theta, xb))
        lam = (p * (1 - p)).unsqueeze(-1)  # (B, 1, 1)
    else:
        lam = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)  # (B, K, K)
    expected = torch.einsum("bkd,bkl,bld->d", jacobian, lam, jacobian) * (30 / 8) / 30
    assert torch.allclose(ggn, expected, rtol=1e-4, atol=1e-7)


def test_vogn_reaches_the_mean_field_optimum_and_refuses_unknown_likelihoods():
    x, y, noise = linear_data(torch.device("cpu"))
    mean, precision = exact_posterior(x, y, noise)
    vi = NaturalGradientVI(
        linear_model, method="vogn", lr=0.5, ess=len(x), beta1=0.0, beta2=0.5, mc_samples=4
    )
    for _ in range(150):
        vi.step(x, y, noise)
    assert torch.allclose(vi.scale, precision.diagonal().rsqrt(), rtol=1e-4)

    def poisson(x):
        rate = pyro.sample("rate", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0], subsample_size=4):
            pyro.sample("x", dist.Poisson(rate.exp()), obs=x[:4])

    with pytest.raises(ValueError, match="Poisson.*method='ivon'"):
        NaturalGradientVI(poisson, method="vogn").step(torch.ones(8))


def test_compiled_update_equals_the_eager_one():
    x, y, noise = linear_data(torch.device("cpu"))
    states = []
    for jit_compile in (False, True):
        pyro.set_rng_seed(5)
        vi = NaturalGradientVI(linear_model, ess=len(x), mc_samples=2, jit_compile=jit_compile)
        for _ in range(5):
            vi.step(x, y, noise)
        states.append(vi.state)
    for eager, compiled in zip(*states):
        assert torch.allclose(eager, compiled, rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="jit_compile must be None or a bool"):
        NaturalGradientVI(linear_model, jit_compile="yes")


@pytest.mark.parametrize("method", ["vogn", "ivon", "von"])
def test_deterministic_sites_are_never_observations(method):
    # pyro.deterministic records an observed Delta; the step must equal the same model's
    # without it (vogn used to take it for a likelihood term and refuse a "Delta").
    x, y, noise = linear_data(torch.device("cpu"), num_data=40)

    def with_deterministic(x, y, noise):
        w = pyro.sample("w", dist.Normal(x.new_zeros(x.shape[-1]), PRIOR_SCALE).to_event(1))
        mean = pyro.deterministic("mean", x @ w)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(mean, noise), obs=y)

    states = []
    for model in (linear_model, with_deterministic):
        pyro.set_rng_seed(0)
        vi = NaturalGradientVI(model, method=method, ess=len(x), mc_samples=2)
        for _ in range(3):
            vi.step(x, y, noise)
        states.append(vi.state)
    for plain, deterministic in zip(*states):
        torch.testing.assert_close(plain, deterministic, atol=0, rtol=0)
