import functools

import pytest
import torch

from pyro_ext.ara.attacks import fgsm, pgd
from pyro_ext.ara.evaluation import (
    SecurityCurve,
    check_attack_strength,
    check_security_curve,
    plot_security_curves,
    security_evaluation_curve,
)


def binary_linear(device, num_points=60, dim=5):
    weight = torch.randn(2, dim, device=device)
    bias = torch.randn(2, device=device)
    x = torch.randn(num_points, dim, device=device)
    y = torch.randint(0, 2, (num_points,), device=device)
    return (lambda z: z @ weight.T + bias), weight, bias, x, y


def curve(accuracy, sd=None):
    accuracy = torch.tensor(accuracy)
    epsilons = torch.linspace(0, 0.5, len(accuracy))
    return SecurityCurve(epsilons, accuracy, torch.zeros_like(accuracy) if sd is None else sd)


def test_linear_fgsm_curve_is_analytic(device):
    # Without a domain, linf FGSM lowers the binary margin m of a linear classifier by
    # exactly eps * |w_y - w_other|_1, so the accuracy at eps is P(m > eps |dw|_1).
    defense, weight, bias, x, y = binary_linear(device)
    dw = weight[y] - weight[1 - y]
    margin = (dw * x).sum(1) + bias[y] - bias[1 - y]
    scale = dw.abs().sum(1)
    epsilons = [0.0, 0.1, 0.3, 0.6, 1.0, (margin / scale).max().item() + 1e-3]
    result = security_evaluation_curve(
        defense, functools.partial(fgsm, clip=None), epsilons, x, y, batch_size=7
    )
    expected = torch.stack([(margin > e * scale).double().mean() for e in epsilons]).cpu()
    assert result.epsilons.device.type == "cpu" and result.accuracy.device.type == "cpu"
    assert torch.allclose(result.accuracy.double(), expected)
    assert result.accuracy[0] == (defense(x).argmax(-1) == y).double().mean().item()
    assert (result.accuracy.diff() <= 0).all()
    assert result.accuracy[-1] == 0
    assert torch.equal(result.accuracy_sd, torch.zeros(len(epsilons)))
    assert check_security_curve(result, large_eps_accuracy=0.0) == []


def test_batching_does_not_change_the_curve(device):
    defense, _, _, x, y = binary_linear(device, num_points=23)
    attack = functools.partial(fgsm, clip=None)
    full = security_evaluation_curve(defense, attack, [0.0, 0.2, 0.5], x, y)
    batched = security_evaluation_curve(defense, attack, [0.0, 0.2, 0.5], x, y, batch_size=5)
    assert torch.allclose(full.accuracy, batched.accuracy)


def test_zero_epsilon_skips_the_attack(device):
    defense, _, _, x, y = binary_linear(device)
    calls = []

    def attack(predict_logits, x, y, eps):
        calls.append(eps)
        return x

    security_evaluation_curve(defense, attack, [0.0, 0.0, 0.25], x, y)
    assert calls == [0.25]


def test_stochastic_defense_repeats(device):
    _, weight, bias, x, y = binary_linear(device, num_points=200)

    def noisy(z):
        return z @ (weight + torch.randn_like(weight)).T + bias

    attack = functools.partial(pgd, steps=3, step_size=0.1, clip=None, eot_samples=4)
    result = security_evaluation_curve(noisy, attack, [0.0, 0.3], x, y, num_repeats=8)
    assert (result.accuracy_sd > 0).all()
    assert ((result.accuracy > 0) & (result.accuracy < 1)).all()
    single = security_evaluation_curve(noisy, attack, [0.0, 0.3], x, y)
    assert torch.equal(single.accuracy_sd, torch.zeros(2))


def test_pgd_curve_passes_the_checks(device):
    weight = torch.randn(3, 4, device=device)
    x = torch.rand(50, 4, device=device)
    y = (x @ weight.T).argmax(-1)
    defense = torch.nn.Linear(4, 3).to(device)
    with torch.no_grad():
        defense.weight.copy_(weight)
        defense.bias.zero_()
    epsilons = [0.0, 0.05, 0.1, 0.2, 1.0]
    weak = security_evaluation_curve(defense, fgsm, epsilons, x, y)

    def strong_attack(predict_logits, x, y, eps):
        return pgd(predict_logits, x, y, eps, steps=20, step_size=eps / 8, restarts=2)

    strong = security_evaluation_curve(defense, strong_attack, epsilons, x, y)
    assert weak.accuracy[0] == strong.accuracy[0] == 1
    assert check_security_curve(strong, large_eps_accuracy=0.05, strict=True) == []
    assert check_attack_strength(weak, strong, strict=True) == []
    # 20 steps of 0.01 cannot cross the eps = 1 ball that FGSM crosses in one step.
    short_steps = functools.partial(pgd, steps=20, step_size=0.01, restarts=2)
    stalled = security_evaluation_curve(defense, short_steps, epsilons, x, y)
    problems = check_attack_strength(weak, stalled)
    assert problems and "at eps=1 " in problems[-1]
    assert all(p.grad is None for p in defense.parameters())


def test_check_security_curve_flags_non_monotone():
    assert check_security_curve(curve([0.9, 0.6, 0.3, 0.0])) == []
    problems = check_security_curve(curve([0.9, 0.5, 0.7, 0.0]))
    assert len(problems) == 1
    assert "increases from 0.5000 at eps=0.166667 to 0.7000 at eps=0.333333" in problems[0]
    assert check_security_curve(curve([0.9, 0.5, 0.7, 0.0]), tolerance=0.25) == []
    with pytest.raises(ValueError, match="gradients"):
        check_security_curve(curve([0.9, 0.5, 0.7, 0.0]), strict=True)


def test_check_security_curve_large_eps():
    problems = check_security_curve(curve([0.9, 0.6, 0.3]), large_eps_accuracy=0.05)
    assert len(problems) == 1 and "at the largest eps=0.5" in problems[0]
    assert check_security_curve(curve([0.9, 0.6, 0.03]), large_eps_accuracy=0.05) == []


def test_check_attack_strength():
    weak, strong = curve([0.9, 0.6, 0.3]), curve([0.9, 0.4, 0.35])
    problems = check_attack_strength(weak, strong)
    assert len(problems) == 1 and "at eps=0.5" in problems[0]
    assert check_attack_strength(weak, strong, tolerance=0.1) == []
    with pytest.raises(ValueError, match="not converged"):
        check_attack_strength(weak, strong, strict=True)
    with pytest.raises(ValueError, match="same epsilons"):
        check_attack_strength(weak, curve([0.9, 0.6]))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(epsilons=[0.0, 0.2, 0.1]), "sorted ascending"),
        (dict(epsilons=[-0.1, 0.2]), "finite and >= 0"),
        (dict(epsilons=[0.0, float("nan")]), "finite and >= 0"),
        (dict(epsilons=[0.0, float("inf")]), "finite and >= 0"),
        (dict(epsilons=[]), "non-empty 1-D"),
        (dict(num_repeats=0), "num_repeats must be an integer >= 1"),
        (dict(batch_size=0), "batch_size must be an integer >= 1"),
    ],
)
def test_curve_argument_errors(kwargs, match):
    defense, _, _, x, y = binary_linear("cpu")
    arguments = dict(epsilons=[0.0, 0.1]) | kwargs
    with pytest.raises(ValueError, match=match):
        security_evaluation_curve(defense, fgsm, x=x, y=y, **arguments)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_repeats=2.0), "num_repeats must be an integer >= 1"),
        (dict(num_repeats=True), "num_repeats must be an integer >= 1"),
        (dict(batch_size="all"), "batch_size must be an integer >= 1 or None"),
    ],
)
def test_curve_argument_type_errors(kwargs, match):
    defense, _, _, x, y = binary_linear("cpu")
    with pytest.raises(TypeError, match=match):
        security_evaluation_curve(defense, fgsm, [0.0, 0.1], x, y, **kwargs)


def test_plot_security_curves():
    figure = pytest.importorskip("matplotlib.figure")
    ax = figure.Figure().subplots()
    sd = torch.tensor([0.0, 0.05, 0.02])
    out = plot_security_curves(
        {"none": curve([0.9, 0.4, 0.1]), "ara": curve([0.9, 0.7, 0.5], sd)}, ax=ax
    )
    assert out is ax
    assert ax.get_xlabel() == "ε" and ax.get_ylabel() == "accuracy"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["none", "ara"]
    assert len(ax.lines) >= 2
