"""Wrong ARA arguments fail with an error naming them (issue 20, section 2)."""

import math

import pytest
import torch

from pyro_ext.ara import (
    AdversarialTrainer,
    ARATrainer,
    BernoulliNaiveBayes,
    fgsm,
    langevin_attack,
    pgd,
    security_evaluation_curve,
)
from pyro_ext.models import BayesianMLP

N, D = 8, 5


def _problem():
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(N, D, generator=generator)
    y = torch.arange(N) % 2
    weight = torch.randn(D, 2, generator=generator)
    return x, y, lambda inputs: inputs @ weight


@pytest.mark.parametrize(
    "alpha, error, match",
    [
        (0, ValueError, "alpha must be a finite number > 0, got 0: .* 1e-10"),
        (0.0, ValueError, "alpha must be a finite number > 0"),
        (-1.0, ValueError, "alpha must be a finite number > 0"),
        (math.inf, ValueError, "alpha must be a finite number > 0"),
        (math.nan, ValueError, "alpha must be a finite number > 0"),
        ("1", TypeError, "alpha must be a finite number > 0"),
        (None, TypeError, "alpha must be a finite number > 0"),
        (True, TypeError, "alpha must be a finite number > 0"),
    ],
)
def test_naive_bayes_refuses_alpha(alpha, error, match):
    with pytest.raises(error, match=match):
        BernoulliNaiveBayes(alpha=alpha)


@pytest.mark.parametrize(
    "change, error, match",
    [
        (
            dict(eps=torch.full((N,), -0.1)),
            ValueError,
            r"eps must hold finite step sizes >= 0 .*eps\[0\] = -0.1",
        ),
        (dict(eps=torch.tensor([0.1] * (N - 1) + [math.nan])), ValueError, r"eps\[7\] = nan"),
        (dict(eps=torch.full((N - 1,), 0.1)), ValueError, r"eps must have shape \(8,\)"),
        (dict(eps=0.1), TypeError, "eps must be a tensor of per-example values"),
        (
            dict(noise_scale=-1.0),
            ValueError,
            r"noise_scale must be a finite number >= 0, got -1.0 \(it multiplies the noise",
        ),
        (dict(noise_scale=math.nan), ValueError, "noise_scale must be a finite number >= 0"),
        (dict(noise_scale="1"), TypeError, "noise_scale must be a finite number >= 0"),
        (dict(norm="l1"), ValueError, "norm must be one of 'linf', 'l2'"),
        (dict(norm=2), TypeError, "norm must be a string"),
    ],
)
def test_langevin_attack_refuses_bad_arguments(change, error, match):
    x, y, logits = _problem()
    kwargs = dict(eps=torch.full((N,), 0.1), steps=torch.ones(N, dtype=torch.long))
    kwargs.update(change)
    with pytest.raises(error, match=match):
        langevin_attack(logits, x, y, **kwargs)


def _nan_logits(inputs):
    return inputs[:, :2] * math.nan


def _nan_gradient(inputs):
    # Finite logits whose input gradient is NaN (sqrt at 0).
    return torch.stack([inputs.sum(1), (inputs[:, 0] * 0).sqrt()], -1)


@pytest.mark.parametrize(
    "attack",
    [
        lambda f, x, y: fgsm(f, x, y, 0.1),
        lambda f, x, y: pgd(f, x, y, 0.1, steps=3, step_size=0.05),
        lambda f, x, y: pgd(f, x, y, 0.1, steps=3, step_size=0.05, random_start=False, norm="l2"),
    ],
    ids=["fgsm", "pgd", "pgd-l2"],
)
@pytest.mark.parametrize(
    "predict_logits, match",
    [
        (_nan_logits, "predict_logits returned NaN logits .* for example 0 of x"),
        (_nan_gradient, "input gradient of the attack loss is NaN for example 0"),
    ],
)
def test_attacks_refuse_nan_logits(attack, predict_logits, match):
    x, y, _ = _problem()
    with pytest.raises(ValueError, match=match):
        attack(predict_logits, x, y)


@pytest.mark.parametrize(
    "labels, error, match",
    [
        (torch.tensor([0, 1, 2, 3, 0, 1, 0, 1]), ValueError, r"y has labels up to 3 .* \[0, 2\)"),
        (torch.tensor([-1, 1, 0, 1, 0, 1, 0, 1]), ValueError, "y must hold class labels >= 0"),
        (torch.full((N,), 0.5), ValueError, "y must hold integer class labels"),
        ([0, 1] * 4, TypeError, "y must be a tensor"),
    ],
)
def test_security_evaluation_curve_refuses_labels(labels, error, match):
    x, _, logits = _problem()
    with pytest.raises(error, match=match):
        security_evaluation_curve(logits, fgsm, [0.0, 0.1], x, labels)


@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.parametrize("trainer", ["ara", "adversarial"])
def test_trainers_refuse_non_finite_x(trainer, value):
    x, y, _ = _problem()
    x[3, 2] = value
    if trainer == "ara":
        net = BayesianMLP(D, hidden=(), out_features=2, likelihood="categorical")
        fit = ARATrainer(net, None, step_size=1e-3, num_particles=2, batch_size=4).fit
    else:
        fit = AdversarialTrainer(torch.nn.Linear(D, 2)).fit
    with pytest.raises(ValueError, match=rf"x must be finite: x\[3, 2\] is {value}"):
        fit(x, y)
