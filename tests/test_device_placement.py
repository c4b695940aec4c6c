"""Every entry point makes its tensors where its data are: the CPU stand-in for a CUDA run
(GPUs are lent rarely). Under ``no_stray_tensors`` a tensor that the package makes without
``device=`` lands on ``meta`` and cannot meet the CPU data, as a CPU tensor could not meet
CUDA data. The retail BSTS has its own such test in ``tests/models/test_bsts.py``."""

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_ext.ara import ARATrainer
from pyro_ext.infer import MCMC, SGHMC, SGLD, AdamSGLD, Gibbs, NaturalGradientVI
from pyro_ext.infer.errors import SlowMixingWarning
from pyro_ext.models import BayesianMLP
from pyro_ext.online import BONG, LoFi, WoLF
from pyro_ext.online.bandits import BernoulliBandit, ThompsonBandit, bernoulli_arms_model
from pyro_ext.timeseries import HiddenMarkovModel

# The runs are a few steps long: they check where tensors live, not mixing.
pytestmark = pytest.mark.filterwarnings(f"ignore::{SlowMixingWarning.__module__}.SlowMixingWarning")


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 5, generator=g)
    w = torch.tensor([1.0, -2.0, 0.5, 0.0, 1.5])
    labels = torch.bernoulli(torch.sigmoid(x @ w), generator=g)
    targets = x @ w + 0.1 * torch.randn(120, generator=g)
    return x, labels, targets


def logistic(x, y=None):
    # The test's own model places its tensors by the data (x.new_zeros), as a CUDA user's must.
    w = pyro.sample("w", dist.Normal(x.new_zeros(5), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=60) as idx:
        pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=None if y is None else y[idx])


def regression(x, y=None):
    w = pyro.sample("w", dist.Normal(x.new_zeros(5), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.Normal(x @ w, 0.1), obs=y)


@pytest.mark.parametrize(
    "kernel",
    [
        lambda: SGLD(logistic, num_particles=4),
        lambda: SGHMC(logistic, num_particles=4),
        lambda: AdamSGLD(logistic, num_particles=4),
        lambda: SGLD(logistic, num_particles=4, repulsion="rbf"),
    ],
    ids=["sgld", "sghmc", "adam_sgld", "sgld+r"],
)
def test_mcmc_with_the_default_step_size_rule(kernel, data, no_stray_tensors):
    x, labels, _ = data
    with no_stray_tensors():
        mcmc = MCMC(kernel(), num_samples=10, warmup_steps=10, disable_progbar=True)
        mcmc.run(x, labels)
        samples = mcmc.get_samples()
        mcmc.diagnostics()
    assert samples["w"].device == x.device and bool(torch.isfinite(samples["w"]).all())


@pytest.mark.parametrize(
    "make",
    [
        lambda: BONG(regression, family="full"),
        lambda: BONG(regression, family="diag", dynamics=("random_walk", 1e-3)),
        lambda: BONG(regression, linearize=False),
        lambda: LoFi(regression, rank=2),
        lambda: WoLF(regression, c=1.0),
    ],
    ids=["full", "diag_drift", "mc", "lofi", "wolf"],
)
def test_online_filters(make, data, no_stray_tensors):
    x, _, targets = data
    with no_stray_tensors():
        f = make()
        mean, variance = f.predictive(x[:4])  # before the first update: the prior's
        for t in range(3):
            f.update(x[t : t + 1], targets[t : t + 1])
        mean, variance = f.predictive(x[:4])
        draws = f.sample(5)
    assert mean.device == x.device and bool(torch.isfinite(variance).all())
    assert draws["w"].device == x.device


def test_thompson_bandit(no_stray_tensors):
    env = BernoulliBandit(torch.tensor([0.2, 0.5, 0.7]))
    with no_stray_tensors():
        history = ThompsonBandit(lambda: BONG(bernoulli_arms_model(3)), 3).run(env, 5, seed=0)
    assert len(history.actions) == 5


@pytest.mark.parametrize("emission", ["gaussian", "poisson", "categorical"])
def test_hmm_fit(emission, no_stray_tensors):
    g = torch.Generator().manual_seed(1)
    y = torch.cat([torch.randn(80, generator=g), 3 + torch.randn(80, generator=g)])
    if emission == "poisson":
        y = torch.poisson(y.abs(), generator=g)
    if emission == "categorical":
        y = (y > 1.5).double() + (y > 3).double()
    options = {"num_symbols": 3} if emission == "categorical" else {}
    with no_stray_tensors():
        fitted = HiddenMarkovModel(2, emission, **options).fit(y, num_restarts=2, max_iterations=10)
    assert fitted.log_likelihood == fitted.log_likelihood  # a number, not NaN


def test_natural_gradient_vi(data, no_stray_tensors):
    x, labels, _ = data
    with no_stray_tensors():
        vi = NaturalGradientVI(logistic, method="ivon")
        for _ in range(3):
            vi.step(x, labels)


@pytest.mark.parametrize("attacks", ["per_particle", "shared"])
def test_ara_training(attacks, no_stray_tensors):
    g = torch.Generator().manual_seed(2)
    x, y = torch.rand(64, 20, generator=g), torch.randint(0, 3, (64,), generator=g)
    net = BayesianMLP(20, hidden=(8,), out_features=3, likelihood="categorical")  # on x's device
    with no_stray_tensors():
        trainer = ARATrainer(net, step_size=1e-3, attacks=attacks, num_particles=2, batch_size=16)
        trainer.fit(x, y, epochs=1)


def test_gibbs_on_a_mixture(no_stray_tensors):
    g = torch.Generator().manual_seed(3)
    d = torch.cat([torch.randn(40, generator=g) - 3, torch.randn(40, generator=g) + 3])

    def mixture(d):
        locs = pyro.sample("locs", dist.Normal(d.new_zeros(2), 5.0).to_event(1))
        with pyro.plate("data", d.shape[0]):
            a = pyro.sample("a", dist.Categorical(d.new_ones(2) / 2))
            pyro.sample("obs", dist.Normal(locs[a], 1.0), obs=d)

    with no_stray_tensors():
        mcmc = MCMC(Gibbs(SGLD(mixture, num_particles=2), ["a"]), 10, 10, disable_progbar=True)
        mcmc.run(d)
        samples = mcmc.get_samples()
    assert samples["locs"].device == d.device
