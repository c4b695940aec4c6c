import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.contrib.funsor.infer import TraceMarkovEnum_ELBO
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoDelta

from pyro_ext.infer import MCMC, SGLD
from pyro_ext.timeseries.models import HiddenMarkovModel


def _fixed(emission, K, device, dtype=torch.float64):
    generator = torch.Generator().manual_seed(3)
    init = torch.rand(K, generator=generator, dtype=dtype).softmax(-1).to(device)
    trans = torch.rand(K, K, generator=generator, dtype=dtype).softmax(-1).to(device)
    if emission == "categorical":
        params = {
            "emission_probs": torch.rand(K, 4, generator=generator, dtype=dtype)
            .softmax(-1)
            .to(device)
        }
    elif emission == "poisson":
        params = {
            "emission_rates": (1 + 5 * torch.rand(K, generator=generator, dtype=dtype)).to(device)
        }
    else:
        params = {
            "emission_loc": torch.randn(K, generator=generator, dtype=dtype).to(device),
            "emission_scale": (0.5 + torch.rand(K, generator=generator, dtype=dtype)).to(device),
        }
    return init, trans, params


def _series(emission, T, device):
    generator = torch.Generator().manual_seed(4)
    if emission == "categorical":
        return torch.randint(4, (T,), generator=generator).double().to(device)
    if emission == "poisson":
        return torch.poisson(3 * torch.ones(T, dtype=torch.float64), generator=generator).to(device)
    return torch.randn(T, generator=generator, dtype=torch.float64).to(device)


def _empty_guide(y):
    """The models below have fixed parameters, so the ELBO is log p(y) exactly."""


@pytest.mark.parametrize("emission", ["categorical", "poisson", "gaussian"])
def test_scan_backend_equals_funsor_enumeration(emission, device):
    K, T = 3, 12
    init, trans, params = _fixed(emission, K, device)
    y = _series(emission, T, device)
    kwargs = dict(num_symbols=4, init_probs=init, transition_probs=trans, emission_params=params)
    scan = HiddenMarkovModel(K, emission, **kwargs)
    funsor = HiddenMarkovModel(K, emission, backend="funsor", **kwargs)
    scan_loss = Trace_ELBO().differentiable_loss(scan, _empty_guide, y)
    funsor_loss = TraceMarkovEnum_ELBO(max_plate_nesting=1).differentiable_loss(
        funsor, _empty_guide, y
    )
    assert torch.allclose(scan_loss, funsor_loss.to(scan_loss), rtol=1e-6)


@pytest.mark.parametrize("emission", ["categorical", "poisson", "gaussian"])
def test_fixed_parameters_follow_the_data_device(emission, device):
    # Fixed parameters given on the CPU are plain attributes, which model.to(device) does
    # not move: the program moves them to the data's device.
    K, T = 3, 12
    init, trans, params = _fixed(emission, K, "cpu")
    kwargs = dict(num_symbols=4, init_probs=init, transition_probs=trans, emission_params=params)
    model = HiddenMarkovModel(K, emission, **kwargs).to(device)
    y = _series(emission, T, device)
    trace = pyro.poutine.trace(model).get_trace(y)
    log_prob = trace.nodes["obs"]["fn"].log_prob(y)
    assert log_prob.device == y.device
    cpu = HiddenMarkovModel(K, emission, **kwargs)
    expected = pyro.poutine.trace(cpu).get_trace(y.cpu()).nodes["obs"]["fn"].log_prob(y.cpu())
    assert torch.allclose(log_prob.cpu(), expected, rtol=1e-6)
    path, _ = model.viterbi(y, {})
    assert path.device == y.device


def test_missing_values_are_marginalised(device):
    K = 2
    init, trans, params = _fixed("gaussian", K, device)
    model = HiddenMarkovModel(
        K, "gaussian", init_probs=init, transition_probs=trans, emission_params=params
    )
    y = _series("gaussian", 8, device)
    y_missing = y.clone()
    y_missing[3] = float("nan")
    # Brute force: p(y without y_3) sums over all paths with the emission at t=3 dropped.
    import itertools

    total = []
    emission = dist.Normal(params["emission_loc"], params["emission_scale"])
    for path in itertools.product(range(K), repeat=8):
        lp = init[path[0]].log()
        for t in range(1, 8):
            lp = lp + trans[path[t - 1], path[t]].log()
        for t in range(8):
            if t != 3:
                lp = lp + emission.log_prob(y[t])[path[t]]
        total.append(lp)
    expected = torch.stack(total).logsumexp(0)
    loss = Trace_ELBO().differentiable_loss(model, _empty_guide, y_missing)
    assert torch.allclose(-loss, expected, rtol=1e-8)


def test_map_with_delta_guide_recovers_emission_means():
    # Bayesian Baum–Welch: MAP of a two-state Gaussian HMM with sticky transitions.
    generator = torch.Generator().manual_seed(0)
    T, locs = 400, torch.tensor([-2.0, 2.0])
    states = [0]
    for _ in range(T - 1):
        stay = torch.rand((), generator=generator) < 0.95
        states.append(states[-1] if stay else 1 - states[-1])
    y = locs[torch.tensor(states)] + 0.5 * torch.randn(T, generator=generator)
    model = HiddenMarkovModel(2, "gaussian")

    def init_loc_fn(site):
        if site["name"] == "emission_loc":
            return torch.tensor([-0.5, 0.5])
        return pyro.infer.autoguide.init_to_median(site)

    guide = AutoDelta(model, init_loc_fn=init_loc_fn)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    for _ in range(400):
        svi.step(y)
    est = guide.median(y)
    assert torch.allclose(est["emission_loc"], locs, atol=0.15), est["emission_loc"]
    assert torch.allclose(est["emission_scale"], torch.tensor([0.5, 0.5]), atol=0.1)
    assert (est["transition_probs"].diagonal() > 0.85).all()


def test_batched_series_use_a_plate(device):
    K = 2
    init, trans, params = _fixed("categorical", K, device)
    model = HiddenMarkovModel(
        K,
        "categorical",
        num_symbols=4,
        init_probs=init,
        transition_probs=trans,
        emission_params=params,
    )
    y = torch.stack([_series("categorical", 6, device), _series("categorical", 6, device).flip(0)])
    batched = Trace_ELBO().differentiable_loss(model, _empty_guide, y)
    single = sum(Trace_ELBO().differentiable_loss(model, _empty_guide, row) for row in y)
    assert torch.allclose(batched, single, rtol=1e-8)


def test_forecast_follows_a_deterministic_cycle(device):
    # A 2-cycle that emits its own state: the k-step forecast alternates with certainty.
    eye = torch.eye(2, dtype=torch.float64, device=device)
    near_one = 1 - 1e-6
    trans = torch.tensor(
        [[1 - near_one, near_one], [near_one, 1 - near_one]], dtype=torch.float64, device=device
    )
    emission = near_one * eye + (1 - near_one) * eye.flip(0)
    model = HiddenMarkovModel(
        2,
        "categorical",
        num_symbols=2,
        init_probs=torch.full((2,), 0.5).double().to(device),
        transition_probs=trans,
        emission_params={"emission_probs": emission},
    )
    y = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0], dtype=torch.float64, device=device)
    forecast = model.forecast(y, {}, num_steps=4)
    probs_of_one = forecast.log_prob(torch.ones(4, dtype=torch.float64, device=device)).exp()
    assert torch.allclose(
        probs_of_one,
        torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64, device=device),
        atol=1e-4,
    )
    path, _ = model.viterbi(y, {})
    assert path.tolist() == [0, 1, 0, 1, 0]
    marginals = model.smooth(y, {})
    assert torch.allclose(marginals.sum(-1), torch.ones(5, dtype=torch.float64, device=device))


def test_sgld_samples_latent_dirichlet_parameters():
    y = torch.tensor([0, 1] * 20, dtype=torch.float64)
    model = HiddenMarkovModel(2, "categorical", num_symbols=2)
    mcmc = MCMC(
        SGLD(model, step_size=1e-3, num_particles=4),
        num_samples=50,
        warmup_steps=50,
        disable_progbar=True,
    )
    mcmc.run(y)
    draws = mcmc.get_samples()
    assert draws["transition_probs"].shape == (200, 2, 2)
    assert torch.allclose(
        draws["transition_probs"].sum(-1), torch.ones(200, 2, dtype=torch.float64)
    )
    forecast = model.forecast(y, draws, num_steps=2)
    assert forecast.batch_shape == (2, 200)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_states=0), "num_states"),
        (dict(num_states=2, emission="beta"), "emission"),
        (dict(num_states=2, emission="categorical"), "num_symbols"),
        (
            dict(
                num_states=2,
                emission="gaussian",
                transition_probs=torch.tensor([[0.5, 0.6], [0.5, 0.5]]),
            ),
            "transition_probs",
        ),
        (dict(num_states=2, emission="gaussian", init_probs=torch.ones(3) / 3), "init_probs"),
        (dict(num_states=2, emission="gaussian", backend="jax"), "backend"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HiddenMarkovModel(**kwargs)


def test_observation_site_has_the_series_length_and_draws_like_it(device):
    # As a Pyro user expects of a series site: event_shape (T,), and a draw of that length
    # (prior predictive checks), one per series under the plate.
    y = torch.tensor([0.0, 1.0, 2.0, 1.0, 0.0] * 4, device=device)
    model = HiddenMarkovModel(2, "categorical", num_symbols=3)
    for data in (y, y.expand(3, -1)):
        site = pyro.poutine.trace(model).get_trace(data).nodes["obs"]
        assert site["fn"].event_shape == (20,)
        draw = site["fn"].sample()
        assert draw.shape == data.shape and draw.device == y.device
        assert bool(((draw >= 0) & (draw < 3)).all())


def test_sampling_a_homogeneous_chain_says_what_to_pass():
    hmm = HiddenMarkovModel(2, "poisson").distribution(
        {
            "init_probs": torch.tensor([0.5, 0.5]),
            "transition_probs": torch.tensor([[0.9, 0.1], [0.1, 0.9]]),
            "emission_rates": torch.tensor([1.0, 5.0]),
        }
    )
    with pytest.raises(ValueError, match="pass duration=T"):
        hmm.sample()
