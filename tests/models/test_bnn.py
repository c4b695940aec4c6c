import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoNormal

from pyro_ext.infer import MCMC, SGLD
from pyro_ext.infer.potential import ParticlePotential
from pyro_ext.models import (
    BayesianMLP,
    expected_calibration_error,
    log_predictive_density,
    predictive_moments,
    rmse,
)

N, D = 12, 3


def _data(likelihood, out_features, device):
    x = torch.randn(N, D, device=device)
    if likelihood == "gaussian":
        y = torch.randn((N, out_features) if out_features > 1 else (N,), device=device)
    elif likelihood == "bernoulli":
        y = torch.randint(
            0, 2, (N, out_features) if out_features > 1 else (N,), device=device
        ).float()
    else:
        y = torch.randint(0, out_features, (N,), device=device)
    return x, y


def _prior_samples(net, x, num):
    return {k: v for k, v in Predictive(net, num_samples=num)(x).items() if k != "obs"}


CASES = [("gaussian", 1), ("gaussian", 2), ("bernoulli", 1), ("bernoulli", 2), ("categorical", 3)]


@pytest.mark.parametrize("likelihood,out_features", CASES)
@pytest.mark.parametrize("subsample_size", [None, 5])
@pytest.mark.parametrize("observed", [False, True])
def test_shapes(likelihood, out_features, subsample_size, observed, device):
    x, y = _data(likelihood, out_features, device)
    net = BayesianMLP(D, hidden=(4, 3), out_features=out_features, likelihood=likelihood).to(device)
    trace = pyro.poutine.trace(net).get_trace(
        x, y if observed else None, subsample_size=subsample_size
    )
    output = trace.nodes["_RETURN"]["value"]
    rows = N if subsample_size is None else subsample_size
    multi = out_features > 1 and likelihood != "categorical"
    assert output.shape == ((N, out_features) if out_features > 1 else (N,))
    assert trace.nodes["obs"]["value"].shape == ((rows, out_features) if multi else (rows,))
    assert trace.nodes["obs"]["is_observed"] == observed
    assert ("precision" in trace.nodes) == (likelihood == "gaussian")
    assert trace.nodes["layers.2.weight"]["value"].shape == (out_features, 3)
    trace.log_prob_sum()  # the joint is well defined

    # Batched draws: Predictive(parallel=True) agrees with the sequential path.
    samples = _prior_samples(net, x, 4)
    par = Predictive(
        net, posterior_samples=samples, return_sites=("_RETURN", "obs"), parallel=True
    )(x)
    seq = Predictive(net, posterior_samples=samples, return_sites=("_RETURN",), parallel=False)(x)
    assert par["_RETURN"].shape == (4,) + output.shape
    assert par["obs"].shape == (4,) + ((N, out_features) if multi else (N,))
    assert torch.allclose(par["_RETURN"], seq["_RETURN"], atol=1e-5)


@pytest.mark.parametrize("likelihood,out_features", CASES)
def test_subsample_scales_likelihood(likelihood, out_features, device):
    x, y = _data(likelihood, out_features, device)
    net = BayesianMLP(
        D, hidden=(4,), out_features=out_features, likelihood=likelihood, hierarchical=True
    ).to(device)
    latents = {
        k: v["value"]
        for k, v in pyro.poutine.trace(net).get_trace(x).nodes.items()
        if v["type"] == "sample" and k not in ("obs", "data")
    }
    full = pyro.poutine.trace(pyro.poutine.condition(net, latents)).get_trace(x, y)
    full.compute_log_prob()
    idx = torch.tensor([7, 1, 10, 4], device=device)
    sub = pyro.poutine.trace(pyro.poutine.condition(net, {**latents, "data": idx})).get_trace(
        x, y, subsample_size=4
    )
    sub.compute_log_prob()
    assert sub.nodes["obs"]["scale"] == pytest.approx(N / 4)
    expected = N / 4 * full.nodes["obs"]["log_prob"][idx].sum()
    assert torch.allclose(sub.nodes["obs"]["log_prob_sum"], expected, rtol=1e-5)
    # The prior terms are not rescaled, and the return value still covers all of x.
    assert torch.allclose(
        sub.nodes["layers.0.weight"]["log_prob_sum"], full.nodes["layers.0.weight"]["log_prob_sum"]
    )
    assert torch.equal(sub.nodes["_RETURN"]["value"], full.nodes["_RETURN"]["value"])


@pytest.mark.parametrize("likelihood,out_features", CASES)
def test_full_output_false_same_log_joint_on_subsample(likelihood, out_features, device):
    x, y = _data(likelihood, out_features, device)
    kwargs = dict(hidden=(4,), out_features=out_features, likelihood=likelihood, hierarchical=True)
    full_net = BayesianMLP(D, **kwargs).to(device)
    mini_net = BayesianMLP(D, full_output=False, **kwargs).to(device)
    latents = {
        k: v["value"]
        for k, v in pyro.poutine.trace(full_net).get_trace(x).nodes.items()
        if v["type"] == "sample" and k not in ("obs", "data")
    }
    idx = torch.tensor([7, 1, 10, 4], device=device)
    traces = []
    for net in (full_net, mini_net):
        trace = pyro.poutine.trace(pyro.poutine.condition(net, {**latents, "data": idx})).get_trace(
            x, y, subsample_size=4
        )
        traces.append(trace)
    full, mini = traces
    assert torch.allclose(mini.log_prob_sum(), full.log_prob_sum(), rtol=1e-5)
    assert torch.allclose(
        mini.nodes["obs"]["fn"].log_prob(y[idx]), full.nodes["obs"]["fn"].log_prob(y[idx])
    )
    # Only the minibatch output comes back, in the order of the plate's indices.
    full_out, mini_out = full.nodes["_RETURN"]["value"], mini.nodes["_RETURN"]["value"]
    assert mini_out.shape[0] == 4
    assert torch.allclose(mini_out, full_out[idx], atol=1e-6)
    # Without subsampling both settings are identical.
    plain = [pyro.poutine.condition(net, latents)(x) for net in (full_net, mini_net)]
    assert torch.equal(plain[0], plain[1])


def test_full_output_false_under_sgld_potential():
    x, y = _data("gaussian", 1, "cpu")
    nets = [BayesianMLP(D, hidden=(4,), full_output=flag) for flag in (True, False)]
    potentials = [ParticlePotential(net, (x, y), {"subsample_size": 5}) for net in nets]
    z = torch.randn(3, potentials[0].dim)
    subsamples = potentials[0].draw_subsamples(z.device)
    values = [p.log_density_and_grad(z, subsamples) for p in potentials]
    assert torch.allclose(values[0][0], values[1][0], rtol=1e-5)
    assert torch.allclose(values[0][1], values[1][1], rtol=1e-4, atol=1e-5)
    with pytest.raises(TypeError, match="full_output must be a bool"):
        BayesianMLP(D, full_output="no")


@pytest.mark.parametrize("hierarchical", [False, True])
def test_particle_plate_matches_vmap_and_single(hierarchical):
    x, y = _data("gaussian", 1, "cpu")
    net = BayesianMLP(D, hidden=(4,), prior_scale=[1.0, 0.5], hierarchical=hierarchical)
    potential = ParticlePotential(net, (x, y), {"subsample_size": 6})
    z = torch.randn(3, potential.dim)
    subsamples = potential.draw_subsamples(z.device)
    single = torch.stack([potential.log_density(p, subsamples) for p in z])
    assert torch.allclose(potential.log_density_plate(z, subsamples), single, rtol=1e-5)
    density, grad = potential.log_density_and_grad(z, subsamples)
    assert torch.allclose(density, single, rtol=1e-5) and grad.shape == z.shape


def test_prior_scale_per_layer():
    net = BayesianMLP(D, hidden=(4,), prior_scale=[2.0, 0.5])
    trace = pyro.poutine.trace(net).get_trace(torch.randn(N, D))
    assert trace.nodes["layers.0.weight"]["fn"].base_dist.scale.max() == 2.0
    assert trace.nodes["layers.1.bias"]["fn"].base_dist.scale.max() == 0.5


def _toy_regression():
    x = torch.linspace(-2, 2, 20).unsqueeze(-1)
    y = torch.sin(1.5 * x[:, 0]) + 0.2 * torch.randn(20)
    return x, y


# In the integration run (`make test-integration`, CI): a reproduction against a NUTS
# reference (300 NUTS and 2 x 1,100 SGLD steps, about 40 s of CPU).
@pytest.mark.integration
@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
def test_sgld_posterior_predictive_agrees_with_nuts():
    # 1-D regression, 20 points, one hidden layer of 5 tanh units (17 latent dimensions).
    x, y = _toy_regression()
    x_test = torch.linspace(-3, 3, 7).unsqueeze(-1)
    net = BayesianMLP(1, hidden=(5,), activation="tanh")
    nuts = pyro.infer.NUTS(net, jit_compile=True, ignore_jit_warnings=True, max_tree_depth=4)
    mcmc = MCMC(nuts, num_samples=150, warmup_steps=150, disable_progbar=True)
    mcmc.run(x, y)
    ref_mean, ref_sd = predictive_moments(net, mcmc.get_samples(), x_test)
    for repulsion, step_size in ((None, 1e-3), ("rbf", 1e-2)):
        kernel = SGLD(net, step_size, num_particles=20, repulsion=repulsion)
        mcmc = MCMC(kernel, num_samples=100, warmup_steps=1000, thinning=10, disable_progbar=True)
        mcmc.run(x, y)
        mean, sd = predictive_moments(net, mcmc.get_samples(), x_test)
        # Posterior predictive sds are ~0.3 (noise 0.2 plus weight uncertainty), and the
        # two estimates share no randomness: Monte Carlo error of a few hundred
        # correlated draws plus SGLD's O(step size) bias stay well below one sd (0.2 sd
        # observed); 2 sds also catches a sampler stuck at the prior or at one mode far off.
        assert ((mean - ref_mean).abs() / ref_sd).max() < 1.0, (repulsion, mean, ref_mean, ref_sd)
        ratio = sd / ref_sd
        assert ratio.min() > 0.67 and ratio.max() < 1.5, (repulsion, sd, ref_sd)


def test_nuts_draws_pass_through_mcmc_to_the_predictive():
    # The default run's check of pyro_ext's MCMC with a Pyro kernel (NUTS) on the network
    # (test_sgld_posterior_predictive_agrees_with_nuts, in the integration run, compares
    # its answer with SGLD's).
    x, y = _toy_regression()
    net = BayesianMLP(1, hidden=(3,), activation="tanh")
    mcmc = MCMC(pyro.infer.NUTS(net, max_tree_depth=3), num_samples=4, warmup_steps=4)
    mcmc.run(x, y)
    samples = mcmc.get_samples()
    assert samples["layers.0.weight"].shape == (4, 3, 1) and samples["precision"].shape == (4,)
    mean, sd = predictive_moments(net, samples, torch.linspace(-3, 3, 7).unsqueeze(-1))
    assert mean.shape == sd.shape == (7,) and torch.isfinite(mean).all() and (sd > 0).all()


def _network_output(net, values, x):
    h = x
    for i in range(len(net.layers)):
        h = h @ values[f"layers.{i}.weight"].T + values[f"layers.{i}.bias"]
        if i < len(net.layers) - 1:
            h = net.activation(h)
    return h.squeeze(-1)


@pytest.mark.parametrize("hierarchical", [False, True])
def test_init_strategy_fan_in_and_residual_precision(hierarchical, device):
    x = torch.randn(40, 4, device=device)
    y = 3.0 + torch.randn(40, device=device)
    net = BayesianMLP(4, hidden=(300,), hierarchical=hierarchical).to(device)
    strategy = net.init_strategy(x, y, max_rows=40)
    init = pyro.infer.autoguide.initialization.InitMessenger(strategy)
    trace = pyro.poutine.trace(init(net)).get_trace(x, y)
    values = {name: site["value"] for name, site in trace.nodes.items() if site["type"] == "sample"}
    assert values["layers.0.weight"].std().item() == pytest.approx(1 / 5**0.5, rel=0.05)
    assert values["layers.1.weight"].std().item() == pytest.approx(1 / 301**0.5, rel=0.2)
    assert torch.equal(values["layers.0.bias"], torch.zeros(300, device=device))
    residual = _network_output(net, values, x) - y
    assert torch.allclose(values["precision"], residual.pow(2).mean().reciprocal())
    # y is centred at 3: the residual precision is far from any prior draw's typical value
    assert values["precision"].item() < 0.2


def test_init_strategy_matches_the_network_in_any_site_order():
    x, y = torch.randn(30, 2), torch.randn(30)
    net = BayesianMLP(2, hidden=(6,))
    sites = pyro.poutine.trace(net).get_trace(x, y).nodes
    layer_sites = [sites[n] for n in sites if n.startswith("layers.")]
    for precision_first in (True, False):
        strategy = net.init_strategy(x, y, max_rows=30)
        networks = []
        for _ in range(2):  # two particles in a row
            order = (
                [sites["precision"]] + layer_sites
                if precision_first
                else layer_sites + [sites["precision"]]
            )
            values = {site["name"]: strategy(site) for site in order}
            residual = _network_output(net, values, x) - y
            assert torch.allclose(values["precision"], residual.pow(2).mean().reciprocal())
            networks.append(values["layers.0.weight"])
        assert not torch.equal(*networks)  # each particle gets its own network


def test_init_strategy_starts_sgld_particles():
    x, y = torch.randn(50, 3), torch.randn(50)
    net = BayesianMLP(3, hidden=(8,))
    kernel = SGLD(net, 1e-3, num_particles=4, init_strategy=net.init_strategy(x, y))
    mcmc = MCMC(kernel, num_samples=5, warmup_steps=5, disable_progbar=True)
    mcmc.run(x, y, subsample_size=10)
    assert mcmc.get_samples()["precision"].shape == (20,)
    with pytest.raises(ValueError, match="needs both x and y"):
        net.init_strategy(x)


def test_kernels_and_ngvi_take_the_declared_start_by_default():
    """SGLD(net) and NaturalGradientVI(net) start as with init_strategy=net.init_strategy(x, y)."""
    from pyro_ext.infer import NaturalGradientVI

    x, y = torch.randn(50, 3), 5 * torch.randn(50)
    net = BayesianMLP(3, hidden=(8,))
    kernel = SGLD(net, 1e-3, num_particles=3)
    kernel.setup(0, x, y, subsample_size=10)
    vi = NaturalGradientVI(net).setup(x, y, subsample_size=10)
    for start in (kernel.particles, vi.state.mean.unsqueeze(0)):
        values = kernel.potential.constrain(start)
        # Not a uniform(-2, 2) draw: zero biases, fan-in scaled weights, and the noise
        # precision of the starting network's residuals (y has variance 25).
        assert torch.equal(values["layers.0.bias"], torch.zeros_like(values["layers.0.bias"]))
        assert values["layers.0.weight"].abs().max() < 2.0
        assert (values["precision"] < 0.2).all()


def test_svi_autonormal_runs_and_predicts():
    x, y = _toy_regression()
    net = BayesianMLP(1, hidden=(5,), activation="tanh")
    guide = AutoNormal(net)
    svi = SVI(net, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    losses = [svi.step(x, y, subsample_size=10) for _ in range(200)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-20:]) < sum(losses[:20])
    samples = Predictive(
        net,
        guide=guide,
        num_samples=50,
        return_sites=[
            "precision",
            "layers.0.weight",
            "layers.0.bias",
            "layers.1.weight",
            "layers.1.bias",
        ],
    )(x)
    assert rmse(net, samples, x, y) < y.std()


def test_log_predictive_density_matches_loop():
    for likelihood, out_features in CASES:
        x, y = _data(likelihood, out_features, "cpu")
        net = BayesianMLP(D, hidden=(4,), out_features=out_features, likelihood=likelihood)
        samples = _prior_samples(net, x, 7)
        per_draw = []
        for s in range(7):
            draw = {k: v[s] for k, v in samples.items()}
            trace = pyro.poutine.trace(pyro.poutine.condition(net, draw)).get_trace(x, y)
            trace.compute_log_prob()
            per_draw.append(trace.nodes["obs"]["log_prob"].exp())
        expected = torch.stack(per_draw).mean(0).log().mean()
        assert torch.allclose(
            log_predictive_density(net, samples, x, y, chunk_size=3), expected, rtol=1e-4
        )


def test_predictive_moments_gaussian_matches_loop():
    x, y = _data("gaussian", 1, "cpu")
    net = BayesianMLP(D, hidden=(4,))
    samples = _prior_samples(net, x, 6)
    outputs = torch.stack(
        [pyro.poutine.condition(net, {k: v[s] for k, v in samples.items()})(x) for s in range(6)]
    )
    mean, sd = predictive_moments(net, samples, x, chunk_size=4)
    var = (outputs.square() + 1 / samples["precision"].reshape(6, 1)).mean(0) - outputs.mean(
        0
    ).square()
    assert torch.allclose(mean, outputs.mean(0), atol=1e-5)
    assert torch.allclose(sd, var.sqrt(), rtol=1e-4)
    probs, _ = predictive_moments(
        BayesianMLP(D, (4,), 3, "categorical"),
        _prior_samples(BayesianMLP(D, (4,), 3, "categorical"), x, 5),
        x,
    )
    assert probs.shape == (N, 3) and torch.allclose(probs.sum(-1), torch.ones(N))


def test_expected_calibration_error():
    probs = dist.Dirichlet(torch.ones(3)).sample((20000,))
    labels = dist.Categorical(probs).sample()
    assert expected_calibration_error(probs, labels) < 0.02
    sharp = torch.softmax(3 * probs.log(), -1)  # overconfident
    assert expected_calibration_error(sharp, labels) > 0.05
    p = torch.rand(20000)
    assert expected_calibration_error(p, torch.bernoulli(p)) < 0.02
    assert expected_calibration_error(torch.ones(4), torch.zeros(4)) == pytest.approx(1.0)


def test_validation_errors():
    x = torch.randn(N, D)
    with pytest.raises(ValueError, match="likelihood"):
        BayesianMLP(D, likelihood="poisson")
    with pytest.raises(ValueError, match="prior_scale"):
        BayesianMLP(D, prior_scale=0.0)
    with pytest.raises(ValueError, match="prior_scale"):
        BayesianMLP(D, hidden=(4,), prior_scale=[1.0])
    with pytest.raises(ValueError, match="classes"):
        BayesianMLP(D, likelihood="categorical")
    with pytest.raises(ValueError, match="x must"):
        BayesianMLP(D)(torch.randn(N, D + 1))
    with pytest.raises(ValueError, match="shape"):
        BayesianMLP(D)(x, torch.randn(N, 1))
    with pytest.raises(ValueError, match="0/1"):
        BayesianMLP(D, likelihood="bernoulli")(x, torch.full((N,), 2.0))
    with pytest.raises(ValueError, match="integer"):
        BayesianMLP(D, out_features=3, likelihood="categorical")(x, torch.zeros(N))
    with pytest.raises(ValueError, match="lie in"):
        BayesianMLP(D, out_features=3, likelihood="categorical")(x, torch.full((N,), 3))
    with pytest.raises(ValueError, match="subsample_size"):
        BayesianMLP(D)(x, subsample_size=N + 1)
    net = BayesianMLP(D)
    with pytest.raises(ValueError, match="lack"):
        predictive_moments(net, {"precision": torch.ones(3)}, x)
    with pytest.raises(ValueError, match="Gaussian"):
        rmse(BayesianMLP(D, likelihood="bernoulli"), {}, x, torch.zeros(N))
    with pytest.raises(ValueError, match="in_features must be an integer >= 1, got 0"):
        BayesianMLP(0)
    with pytest.raises(ValueError, match=r"hidden\[1\] must be an integer >= 1, got 0"):
        BayesianMLP(D, hidden=(4, 0))
    with pytest.raises(ValueError, match=r"noise_prior\[1\] must be a finite number > 0"):
        BayesianMLP(D, noise_prior=(1.0, -0.1))
    with pytest.raises(ValueError, match=rf"subsample_size must be an integer in \[1, {N}\]"):
        BayesianMLP(D)(x, subsample_size=0)
    with pytest.raises(ValueError, match="num_bins must be an integer >= 1, got 0"):
        expected_calibration_error(torch.full((N,), 0.5), torch.zeros(N), num_bins=0)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: BayesianMLP(2.0), "in_features must be an integer >= 1"),
        (lambda: BayesianMLP(D, out_features=True), "out_features must be an integer >= 1"),
        (lambda: BayesianMLP(D, hidden=(4.0,)), r"hidden\[0\] must be an integer >= 1"),
        (lambda: BayesianMLP(D, hidden="4"), "hidden must be an integer or a sequence"),
        (lambda: BayesianMLP(D, likelihood=None), "likelihood must be a string"),
        (lambda: BayesianMLP(D, prior_scale="1"), "prior_scale must be a finite number > 0"),
        (lambda: BayesianMLP(D, activation=3), "activation must be a callable or a name"),
        (lambda: BayesianMLP(D, noise_prior=(1.0, "a")), r"noise_prior\[1\] must be a finite"),
        (
            lambda: BayesianMLP(D)(torch.randn(N, D), subsample_size=2.0),
            "subsample_size must be an integer in",
        ),
        (lambda: predictive_moments("net", {}, torch.randn(N, D)), "net must be a BayesianMLP"),
        (
            lambda: expected_calibration_error(torch.full((N,), 0.5), torch.zeros(N), num_bins=2.0),
            "num_bins must be an integer >= 1",
        ),
    ],
)
def test_wrong_types_are_type_errors(make, match):
    with pytest.raises(TypeError, match=match):
        make()


@pytest.mark.parametrize(
    "helper", [predictive_moments, log_predictive_density, rmse], ids=lambda f: f.__name__
)
@pytest.mark.parametrize(
    "chunk_size, error",
    [(0, ValueError), (-2, ValueError), (2.5, TypeError), (None, TypeError), (True, TypeError)],
)
def test_chunk_size_is_checked(helper, chunk_size, error):
    x, y = _data("gaussian", 1, "cpu")
    net = BayesianMLP(D, hidden=(4,))
    samples = _prior_samples(net, x, 3)
    args = (x,) if helper is predictive_moments else (x, y)
    with pytest.raises(error, match=r"chunk_size \(draws evaluated at a time\) must be an integer"):
        helper(net, samples, *args, chunk_size=chunk_size)


@pytest.mark.parametrize(
    "probs, match",
    [
        (
            torch.tensor([[0.9, 0.9, 0.9], [0.2, 0.3, 0.5]]),
            "row of probs .* sum to 1, got 2.7 in row 0",
        ),
        (torch.tensor([[0.2, 0.8], [0.5, 0.6]]), "row of probs .* sum to 1, got 1.1 in row 1"),
        (torch.tensor([[2.0, -1.0], [0.5, 0.5]]), r"probs must be probabilities in \[0, 1\]"),
        (torch.tensor([0.2, 1.3]), r"probs must be probabilities in \[0, 1\].*index 1"),
        (torch.tensor([0.2, float("nan")]), r"probs must be probabilities in \[0, 1\], got nan"),
    ],
)
def test_expected_calibration_error_refuses_non_probabilities(probs, match):
    labels = torch.zeros(probs.shape[0], dtype=torch.long)
    with pytest.raises(ValueError, match=match):
        expected_calibration_error(probs, labels)
    with pyro.validation_enabled(False):  # value checks follow the validation switch
        expected_calibration_error(probs, labels)


def test_expected_calibration_error_takes_averaged_softmaxes():
    """A mean of softmaxes lands an ulp above 1: round-off, accepted."""
    probs = torch.tensor([[1.0 + 1.2e-7, 0.0], [0.3, 0.7]])
    assert 0 <= float(expected_calibration_error(probs, torch.tensor([0, 1]))) <= 1


@pytest.mark.parametrize("hierarchical", [False, True])
def test_compiled_step_runs_the_bayesian_mlp_as_eager(hierarchical):
    """A PyroModule's cached priors check their samples; the traced step must not trip on it."""
    x = torch.randn(120, 3)
    y = torch.sin(x.sum(-1)) + 0.1 * torch.randn(120)
    chains = []
    for jit_compile in (False, "trace"):
        pyro.set_rng_seed(0)
        net = BayesianMLP(3, hidden=(8,), hierarchical=hierarchical, full_output=False)
        kernel = SGLD(
            net,
            1e-4,
            num_particles=3,
            jit_compile=jit_compile,
            init_strategy=net.init_strategy(x, y),
        )
        mcmc = MCMC(kernel, num_samples=30, warmup_steps=10, disable_progbar=True)
        mcmc.run(x, y, subsample_size=40)
        chains.append(mcmc.get_samples(group_by_chain=True))
    for name, value in chains[0].items():
        torch.testing.assert_close(chains[1][name], value, atol=1e-5, rtol=1e-4)
