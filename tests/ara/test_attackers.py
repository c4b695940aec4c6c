import pyro
import pytest
import torch

from pyro_ext.ara.attackers import AttackMixture, LangevinAttacker, langevin_attack
from pyro_ext.ara.attacks import fgsm


def linear_model(device, in_features=6, num_classes=3):
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(num_classes, in_features, generator=generator).to(device)
    bias = torch.randn(num_classes, generator=generator).to(device)
    return weight, bias, lambda x: x @ weight.T + bias


def inputs(device, num=8, in_features=6, num_classes=3):
    x = (0.25 + 0.5 * torch.rand(num, in_features)).to(device)
    return x, torch.randint(0, num_classes, (num,)).to(device)


def zero_gradient_logits(x):
    # Constant logits: the input gradient is exactly 0, so sign(0) = 0 and only noise moves x.
    return (0.0 * x).flatten(1).sum(-1, keepdim=True).expand(-1, 2)


def test_samples_shape_device_domain(device):
    _, _, logits = linear_model(device)
    x, y = inputs(device)
    attacker = LangevinAttacker(logits, x, y, eps=(0.05, 0.3), steps=1, steps_rate=2.0)
    assert attacker.batch_shape == (8,) and attacker.event_shape == (6,)
    assert not attacker.has_rsample
    draws = attacker.sample((5,))
    assert draws.shape == (5, 8, 6) and draws.device == x.device and draws.dtype == x.dtype
    assert bool(attacker.support.check(draws).all())
    assert not draws.requires_grad
    with pyro.poutine.trace() as tracer:
        pyro.sample("x_attacked", attacker)
    assert tracer.trace.nodes["x_attacked"]["value"].shape == x.shape


def test_image_shaped_inputs(device):
    x = torch.rand(4, 1, 3, 3, device=device)
    y = torch.tensor([0, 1, 0, 1], device=device)
    attacker = LangevinAttacker(lambda v: v.flatten(1)[:, :2], x, y, eps=0.1, noise_scale=0.0)
    assert attacker.event_shape == (1, 3, 3)
    assert attacker.sample().shape == x.shape


def test_hyperparameters_random_and_bounded(device):
    _, _, logits = linear_model(device)
    x, y = inputs(device)
    attacker = LangevinAttacker(logits, x, y, eps=(0.05, 0.2), steps=1, steps_rate=3.0, max_steps=6)
    eps, steps = attacker.sample_hyperparameters((500,))
    assert eps.shape == steps.shape == (500, 8)
    assert float(eps.min()) >= 0.05 and float(eps.max()) <= 0.2 and float(eps.var()) > 1e-4
    assert int(steps.min()) >= 1 and int(steps.max()) <= 6 and float(steps.float().var()) > 0.5
    # 1 + Poisson(3), truncated at 6, has mean close to 4.
    assert abs(float(steps.float().mean()) - 3.85) < 0.2
    fixed_eps, fixed_steps = LangevinAttacker(
        logits, x, y, eps=0.1, steps=2
    ).sample_hyperparameters()
    assert bool((fixed_eps == 0.1).all()) and bool((fixed_steps == 2).all())


def test_deterministic_case_is_iterated_fgsm(device):
    weight, bias, logits = linear_model(device)
    x, y = inputs(device)
    eps, steps = 0.07, 3
    attacker = LangevinAttacker(logits, x, y, eps=eps, steps=steps, noise_scale=0.0)
    expected = x.clone()
    for _ in range(steps):
        # d CE / dx for logits W x + b is (softmax - onehot) W.
        probs = torch.softmax(expected @ weight.T + bias, -1)
        grad = (probs - torch.nn.functional.one_hot(y, 3).to(x.dtype)) @ weight
        expected = (expected + eps * grad.sign()).clamp(0, 1)
    assert torch.allclose(attacker.sample(), expected)
    one_step = LangevinAttacker(logits, x, y, eps=eps, steps=1, noise_scale=0.0).sample()
    assert torch.allclose(one_step, fgsm(logits, x, y, eps))


def test_noise_variance(device):
    x = torch.full((2000, 10), 0.5, device=device)
    y = torch.zeros(2000, dtype=torch.long, device=device)
    eps, noise_scale, steps = 0.01, 0.25, 3
    attacker = LangevinAttacker(
        zero_gradient_logits, x, y, eps=eps, steps=steps, noise_scale=noise_scale
    )
    delta = attacker.sample() - x
    expected = steps * 2 * eps * noise_scale  # eq. (3.14): variance 2 eps per step
    assert abs(float(delta.mean())) < 0.003
    assert abs(float(delta.var()) / expected - 1) < 0.05


def test_same_seed_same_draws(device):
    _, _, logits = linear_model(device)
    x, y = inputs(device)
    attacker = LangevinAttacker(logits, x, y, eps=(0.05, 0.2), steps_rate=1.0, noise_scale=0.1)
    pyro.set_rng_seed(3)
    first = attacker.sample((2,))
    pyro.set_rng_seed(3)
    assert torch.equal(first, attacker.sample((2,)))
    assert not torch.equal(first, attacker.sample((2,)))


def test_l2_steps_have_length_eps(device):
    _, _, logits = linear_model(device)
    x, y = inputs(device)
    x_attacked = langevin_attack(
        logits,
        x,
        y,
        torch.full((8,), 0.05, device=device),
        torch.ones(8, device=device),
        noise_scale=0.0,
        loss="cw",
        norm="l2",
    )
    assert torch.allclose(
        (x_attacked - x).norm(dim=1), torch.full((8,), 0.05, device=device), atol=1e-5
    )


def test_mixture_chooses_per_example(device):
    _, _, logits = linear_model(device)
    x, y = inputs(device, num=400)
    moving = LangevinAttacker(logits, x, y, eps=0.1, noise_scale=0.0)
    idle = LangevinAttacker(logits, x, y, eps=0.0, noise_scale=0.0)
    mixture = AttackMixture([moving, idle], probs=[1.0, 3.0])
    assert mixture.batch_shape == (400,) and mixture.event_shape == (6,)
    draws = mixture.sample((3,))
    assert draws.shape == (3, 400, 6) and draws.device == x.device
    attacked = (draws != x).any(-1).float()
    assert abs(float(attacked.mean()) - 0.25) < 0.05
    assert torch.allclose(
        draws[attacked.bool()], moving.sample().expand(3, 400, 6)[attacked.bool()]
    )


def test_validation_errors():
    x, y = inputs("cpu")
    logits = linear_model("cpu")[2]
    with pytest.raises(ValueError, match="outside the attacker's domain"):
        LangevinAttacker(logits, x + 1.0, y)
    with pytest.raises(ValueError, match="low <= high"):
        LangevinAttacker(logits, x, y, eps=(0.2, 0.1))
    with pytest.raises(ValueError, match="eps must be"):
        LangevinAttacker(logits, x, y, eps=-0.1)
    with pytest.raises(ValueError, match="shape"):
        LangevinAttacker(logits, x, y[:-1])
    with pytest.raises(ValueError, match="loss"):
        LangevinAttacker(logits, x, y, loss="hinge")
    with pytest.raises(ValueError, match="max_steps must be an integer >= 3, got 2"):
        LangevinAttacker(logits, x, y, steps=3, max_steps=2)
    with pytest.raises(TypeError, match="steps must be an integer >= 0"):
        LangevinAttacker(logits, x, y, steps=1.5)
    with pytest.raises(TypeError, match="eps must be a finite number >= 0"):
        LangevinAttacker(logits, x, y, eps=(0.0, "0.1"))
    with pytest.raises(TypeError, match="loss must be a string"):
        LangevinAttacker(logits, x, y, loss=None)
    other = LangevinAttacker(logits, x[:4], y[:4])
    with pytest.raises(ValueError, match="same shape"):
        AttackMixture([LangevinAttacker(logits, x, y), other])
