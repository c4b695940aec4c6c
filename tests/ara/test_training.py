import functools

import pyro
import pytest
import torch

from pyro_ext.ara.attackers import LangevinAttacker
from pyro_ext.ara.attacks import fgsm
from pyro_ext.ara.training import AdversarialTrainer, ARATrainer
from pyro_ext.infer import SamplerDivergenceError
from pyro_ext.models import BayesianMLP

FEATURES = 21
ATTACK_EPS = 0.12


def robust_and_fragile_features(num, generator, device="cpu"):
    """
    Two classes in [0, 1]^21: feature 0 separates them by a margin (0.25) larger than the
    attack, the 20 others only weakly (0.06 each) but jointly: a classifier that leans on
    them is accurate on clean data and fooled by a linf attack of radius 0.12.
    """
    y = torch.randint(0, 2, (num,), generator=generator)
    shift = torch.full((FEATURES,), 0.06)
    shift[0] = 0.25
    x = 0.5 + (2 * y[:, None] - 1) * shift + 0.1 * torch.randn(num, FEATURES, generator=generator)
    return x.clamp(0, 1).to(device), y.to(device)


def accuracy(trainer, x, y):
    return float((trainer.predict(x) == y).float().mean())


def robust_accuracy(trainer, x, y):
    return accuracy(trainer, fgsm(trainer.predict_logits, x, y, ATTACK_EPS), y)


@pytest.fixture(scope="module")
def data():
    generator = torch.Generator().manual_seed(1)
    return robust_and_fragile_features(300, generator), robust_and_fragile_features(500, generator)


def ara_trainer(attacker, seed=0, device="cpu", **kwargs):
    pyro.set_rng_seed(seed)
    net = BayesianMLP(FEATURES, hidden=(), out_features=2, likelihood="categorical").to(device)
    options = dict(step_size=0.1 / 300, kernel="sghmc", num_particles=3, batch_size=32)
    return ARATrainer(net, attacker, **{**options, **kwargs})


LANGEVIN = functools.partial(
    LangevinAttacker, eps=(0.05, 0.15), steps=1, steps_rate=1.0, noise_scale=0.01
)


@pytest.mark.parametrize("seed", [0, 1])
def test_ara_training_is_more_robust_than_plain_sgmcmc(data, seed):
    (x, y), (x_test, y_test) = data
    plain = ara_trainer(None, seed).fit(x, y, epochs=20)
    ara = ara_trainer(LANGEVIN, seed).fit(x, y, epochs=20)
    assert accuracy(ara, x_test, y_test) > 0.95
    assert accuracy(plain, x_test, y_test) > 0.95
    assert robust_accuracy(ara, x_test, y_test) > robust_accuracy(plain, x_test, y_test) + 0.1
    assert len(ara.epoch_times) == 20 and min(ara.epoch_times) > 0
    # Temperature 1: the particles are distinct posterior draws.
    weights = ara.posterior_samples["layers.0.weight"]
    assert weights.shape == (3, 2, FEATURES)
    assert float(weights.std(0).mean()) > 0.05


@pytest.mark.parametrize("seed", [0, 1])
def test_adversarial_training_is_more_robust_than_plain_training(data, seed):
    (x, y), (x_test, y_test) = data
    results = {}
    for clean_fraction in (1.0, 0.0):
        pyro.set_rng_seed(seed)
        trainer = AdversarialTrainer(
            torch.nn.Linear(FEATURES, 2),
            eps=ATTACK_EPS,
            steps=3,
            clean_fraction=clean_fraction,
            lr=0.1,
        )
        trainer.fit(x, y, epochs=20)
        assert len(trainer.epoch_times) == 20
        results[clean_fraction] = (
            accuracy(trainer, x_test, y_test),
            robust_accuracy(trainer, x_test, y_test),
        )
    assert results[0.0][0] > 0.95
    assert results[0.0][1] > results[1.0][1] + 0.05


def test_predictions_and_posterior_on_device(device):
    x, y = robust_and_fragile_features(64, torch.Generator().manual_seed(2), device)
    trainer = ara_trainer(LANGEVIN, kernel="sgld", batch_size=16, device=device).fit(x, y)
    logits = trainer.predict_logits(x)
    assert logits.shape == (64, 2) and logits.device == x.device
    assert torch.allclose(logits.logsumexp(-1), torch.zeros(64, device=device), atol=1e-5)
    assert trainer.predict(x).device == x.device
    assert all(v.device == x.device for v in trainer.posterior_samples.values())
    trainer.fit(x, y)  # continues from the current particles
    assert len(trainer.epoch_times) == 2
    # The attack is the exact expectation over the particles: gradients reach x.
    x_grad = x.clone().requires_grad_()
    trainer.predict_logits(x_grad)[:, 0].sum().backward()
    assert x_grad.grad is not None and bool(x_grad.grad.abs().sum() > 0)


def test_attacker_sees_the_mixed_share(data):
    (x, y), _ = data
    calls = []

    def recording_attacker(predict_logits, x, y):
        calls.append(x.shape[0])
        return LangevinAttacker(predict_logits, x, y, eps=0.05, noise_scale=0.0)

    ara_trainer(recording_attacker, clean_fraction=0.25, batch_size=32).fit(x[:64], y[:64])
    # one validation call on the whole set, then 3/4 of each minibatch of 32 is attacked,
    # once per particle (3 particles: 72 stacked rows)
    assert calls == [64, 72, 72]
    calls.clear()
    shared = ara_trainer(recording_attacker, clean_fraction=0.25, attacks="shared")
    shared.fit(x[:64], y[:64])
    assert calls == [64, 24, 24]


def _log_joint_by_hand(trainer, z, x, y, scale):
    """The minibatch log joint of Algorithm 3.2 at one flat particle: prior plus
    ``scale`` times the likelihood of the observation site ``"obs"`` (the BNN's sites are
    real: no Jacobian)."""
    values = trainer.kernel.potential.constrain(z)
    conditioned = pyro.poutine.condition(trainer.model, values)
    trace = pyro.poutine.trace(conditioned).get_trace(x, y)
    return sum(
        site["fn"].log_prob(site["value"]).sum() * (scale if name == "obs" else 1.0)
        for name, site in trace.nodes.items()
        if site["type"] == "sample"
    )


class RowwiseUnknown:
    """An attacker model that does not declare ``row_aligned``: drawn once per particle."""

    def __init__(self, predict_logits, x, y):
        self.attacker = LangevinAttacker(predict_logits, x, y, eps=0.1, noise_scale=0.0)

    def sample(self):
        return self.attacker.sample()


@pytest.mark.parametrize("row_aligned", [True, False])
def test_each_particle_moves_on_its_own_attacked_batch(data, row_aligned):
    # Algorithm 3.2 written out by hand: particle k's attacked rows are drawn against
    # particle k, and its SGLD step (temperature 0: z + eps grad) follows the gradient of
    # the log joint of its own mixed minibatch. Both ways of drawing the K attacks: one
    # stacked draw (row-aligned attackers) and one draw per particle.
    (x, y), _ = data
    x, y = x[:32], y[:32]
    attacker = functools.partial(LangevinAttacker, eps=0.1, steps=1, noise_scale=0.0)
    trainer = ara_trainer(
        attacker if row_aligned else RowwiseUnknown,
        kernel="sgld",
        temperature=0.0,
        clean_fraction=0.5,
    )
    trainer._setup(x, y)
    before = trainer.kernel.particles.detach().clone()
    scale = x.new_tensor(300 / 32)
    trainer._step(x, y, scale)
    after = trainer.kernel.particles.detach()
    attacked_rows = []
    for k in range(3):
        target = functools.partial(trainer._particle_logits, before[k])
        attacked = attacker(target, x[:16], y[:16]).sample()
        attacked_rows.append(attacked)
        x_k = torch.cat([attacked, x[16:]])
        z = before[k].clone().requires_grad_(True)
        with pyro.validation_enabled(False):
            (grad,) = torch.autograd.grad(_log_joint_by_hand(trainer, z, x_k, y, scale), z)
        expected = before[k] + trainer.step_size * grad
        assert torch.allclose(after[k], expected, rtol=1e-5, atol=1e-6), k
    # The particles' attacks differ: the test tells per-particle from shared data.
    assert (attacked_rows[0] - attacked_rows[1]).abs().max() > 1e-3
    assert (attacked_rows[0] - attacked_rows[2]).abs().max() > 1e-3


@pytest.mark.integration  # 5-20 s: compiles a step per minibatch shape
@pytest.mark.parametrize("attacks", ["per_particle", "shared"])
def test_compiled_step_matches_eager(data, attacks):
    (x, y), _ = data
    attacker = functools.partial(LangevinAttacker, eps=0.1, steps=1, noise_scale=0.0)
    particles = []
    for jit_compile in (False, True):
        trainer = ara_trainer(
            attacker, kernel="sgld", attacks=attacks, batch_size=32, jit_compile=jit_compile
        )
        pyro.set_rng_seed(3)
        trainer.fit(x[:96], y[:96])
        particles.append(trainer.kernel.particles.detach())
    assert torch.allclose(particles[0], particles[1], rtol=1e-4, atol=1e-5)


def test_divergence_raises_sampler_error(data):
    (x, y), _ = data
    trainer = ara_trainer(None, step_size=1e38, kernel="sgld")
    with pytest.raises(SamplerDivergenceError) as info:
        trainer.fit(x, y)
    assert info.value.step >= 0


def test_validation_errors(data):
    (x, y), _ = data
    net = BayesianMLP(FEATURES, hidden=(), out_features=2, likelihood="categorical")
    with pytest.raises(ValueError, match="num_particles"):
        ARATrainer(net, step_size=0.1, num_particles=0)
    with pytest.raises(ValueError, match="step_size"):
        ARATrainer(net, step_size=0.0)
    with pytest.raises(ValueError, match="clean_fraction"):
        ARATrainer(net, step_size=0.1, clean_fraction=1.5)
    with pytest.raises(ValueError, match="kernel"):
        ARATrainer(net, step_size=0.1, kernel="hmc")
    with pytest.raises(ValueError, match="attacks must be one of 'per_particle', 'shared'"):
        ARATrainer(net, step_size=0.1, attacks="each")
    with pytest.raises(ValueError, match="shape"):
        ARATrainer(net, step_size=0.1).fit(x, y[:-1])
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        ARATrainer(net, step_size=0.1).fit(x, y + 1)
    with pytest.raises(ValueError, match="outside the attacker's domain"):
        ARATrainer(net, LANGEVIN, step_size=0.1).fit(x + 1.0, y)
    with pytest.raises(RuntimeError, match="fit"):
        ARATrainer(net, step_size=0.1).predict(x)
    with pytest.raises(ValueError, match="clean_fraction"):
        AdversarialTrainer(torch.nn.Linear(FEATURES, 2), clean_fraction=-0.1)
    with pytest.raises(ValueError, match="outside the attack's domain"):
        AdversarialTrainer(torch.nn.Linear(FEATURES, 2)).fit(x + 1.0, y)
    with pytest.raises(ValueError, match="labels"):
        AdversarialTrainer(torch.nn.Linear(FEATURES, 2)).fit(x, y + 1)
    with pytest.raises(TypeError, match="num_particles must be an integer >= 1"):
        ARATrainer(net, step_size=0.1, num_particles=2.0)
    with pytest.raises(TypeError, match="step_size must be a finite number > 0"):
        ARATrainer(net, step_size="0.1")
    with pytest.raises(TypeError, match="epochs must be an integer >= 1"):
        ARATrainer(net, step_size=0.1).fit(x, y, epochs=1.0)
    with pytest.raises(TypeError, match="eps must be a finite number >= 0"):
        AdversarialTrainer(torch.nn.Linear(FEATURES, 2), eps=None)
    with pytest.raises(TypeError, match="momentum must be a finite number in"):
        AdversarialTrainer(torch.nn.Linear(FEATURES, 2), momentum=True)
