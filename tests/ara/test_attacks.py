import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyro_ext.ara.attacks import attack_loss, fgsm, pgd, predictive_logits, project_l1_ball

NORM_ORDER = {"linf": float("inf"), "l2": 2, "l1": 1}


def linear(weight, bias=None):
    return lambda x: x.flatten(1) @ weight.T + (0 if bias is None else bias)


def perturbation_norm(x_adv, x, norm):
    return (x_adv - x).flatten(1).norm(p=NORM_ORDER[norm], dim=1)


def trained_mlp(device, num_points=200):
    """A tiny ReLU net fitted to two noisy concentric rings in [0, 1]^2."""
    radius = torch.where(torch.rand(num_points) < 0.5, 0.15, 0.35)
    angle = 2 * torch.pi * torch.rand(num_points)
    x = 0.5 + radius[:, None] * torch.stack([angle.cos(), angle.sin()], -1)
    x = (x + 0.02 * torch.randn(num_points, 2)).clamp(0, 1).to(device)
    y = (radius > 0.2).long().to(device)
    net = torch.nn.Sequential(torch.nn.Linear(2, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)).to(
        device
    )
    optim = torch.optim.Adam(net.parameters(), lr=0.05)
    for _ in range(100):
        optim.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        optim.step()
    net.zero_grad(set_to_none=True)
    return net, x, y


def accuracy(predict_logits, x, y):
    with torch.no_grad():
        return (predict_logits(x).argmax(-1) == y).double().mean().item()


@pytest.mark.parametrize("norm", ["linf", "l2", "l1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pgd_stays_in_ball_and_domain(device, norm, dtype):
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 5)).to(device, dtype)
    x = torch.rand(8, 3, 4, device=device, dtype=dtype)
    y = torch.randint(0, 5, (8,), device=device)
    eps = {"linf": 0.1, "l2": 0.5, "l1": 1.0}[norm]
    with torch.no_grad():
        x_adv = pgd(model, x, y, eps, steps=5, step_size=eps / 2, norm=norm, restarts=2)
    assert x_adv.shape == x.shape and x_adv.dtype == dtype and x_adv.device == x.device
    assert not x_adv.requires_grad
    assert (perturbation_norm(x_adv, x, norm) <= eps + 1e-5).all()
    assert x_adv.min() >= 0 and x_adv.max() <= 1
    assert all(p.grad is None and p.requires_grad for p in model.parameters())
    assert (x_adv != x).any()


def test_fgsm_preserves_input_and_parameters(device):
    model = torch.nn.Linear(3, 4).to(device)
    x = torch.rand(6, 3, device=device)
    y = torch.randint(0, 4, (6,), device=device)
    x_before = x.clone()
    with torch.no_grad():
        x_adv = fgsm(model, x, y, 0.2)
    assert torch.equal(x, x_before)
    assert all(p.grad is None for p in model.parameters())
    assert x_adv.device == x.device and not x_adv.requires_grad
    assert ((x_adv - x).abs() <= 0.2 + 1e-6).all() and x_adv.min() >= 0 and x_adv.max() <= 1


def test_fgsm_binary_linear_is_analytic(device):
    # For two classes, grad_x CE = p_other * (w_other - w_y), so its sign is exact.
    weight = torch.randn(2, 7, device=device)
    x = torch.randn(20, 7, device=device)
    y = torch.randint(0, 2, (20,), device=device)
    x_adv = fgsm(linear(weight, torch.randn(2, device=device)), x, y, 0.3, clip=None)
    expected = x + 0.3 * (weight[1 - y] - weight[y]).sign()
    assert torch.allclose(x_adv, expected)


def test_fgsm_cw_loss_linear_is_analytic(device):
    # The CW margin max_{j != y} z_j - z_y has gradient w_{j*} - w_y on a linear model.
    weight = torch.randn(4, 5, device=device)
    x = torch.randn(30, 5, device=device)
    y = torch.randint(0, 4, (30,), device=device)
    logits = x @ weight.T
    runner_up = logits.scatter(1, y[:, None], -float("inf")).argmax(1)
    x_adv = fgsm(linear(weight), x, y, 0.1, clip=None, loss="cw")
    assert torch.allclose(x_adv, x + 0.1 * (weight[runner_up] - weight[y]).sign())


def test_pgd_without_random_start_one_step_is_fgsm(device):
    weight = torch.randn(3, 4, device=device)
    x = torch.rand(10, 4, device=device)
    y = torch.randint(0, 3, (10,), device=device)
    expected = fgsm(linear(weight), x, y, 0.05)
    actual = pgd(linear(weight), x, y, 0.05, steps=1, step_size=0.05, random_start=False)
    assert torch.equal(actual, expected)


def test_pgd_is_stronger_than_fgsm(device):
    net, x, y = trained_mlp(device)
    assert accuracy(net, x, y) > 0.9
    eps = 0.08
    x_fgsm = fgsm(net, x, y, eps)
    x_pgd = pgd(net, x, y, eps, steps=20, step_size=eps / 8, random_start=False)
    with torch.no_grad():
        assert attack_loss(net(x_pgd), y).mean() >= attack_loss(net(x_fgsm), y).mean()
    assert accuracy(net, x_pgd, y) <= accuracy(net, x_fgsm, y) < accuracy(net, x, y)
    # More steps, same seed, never leave a higher accuracy.
    accuracies = [
        accuracy(
            net,
            pgd(net, x, y, eps, steps, eps / 8, generator=torch.Generator(device).manual_seed(1)),
            y,
        )
        for steps in (2, 5, 10, 20)
    ]
    assert accuracies == sorted(accuracies, reverse=True)
    assert accuracies[-1] < accuracies[0]
    assert all(p.grad is None for p in net.parameters())


@pytest.mark.parametrize("norm", ["linf", "l2", "l1"])
def test_pgd_generator_is_reproducible(device, norm):
    net, x, y = trained_mlp(device, num_points=32)
    attack = functools.partial(pgd, net, x, y, 0.1, 3, 0.05, norm=norm, restarts=2)
    first = attack(generator=torch.Generator(device).manual_seed(3))
    second = attack(generator=torch.Generator(device).manual_seed(3))
    other = attack(generator=torch.Generator(device).manual_seed(4))
    assert torch.equal(first, second)
    assert not torch.equal(first, other)


def test_pgd_restarts_keep_best(device):
    # With 3 classes the cross-entropy does not determine misclassification, so the
    # preference for a fooling restart over a higher-loss one matters.
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(
        device
    )
    x = torch.rand(200, 4, device=device)
    with torch.no_grad():
        y = net(x).argmax(-1)
    attack = functools.partial(pgd, net, x, y, 0.3, 2, 0.1)
    # Restarts draw their starts in sequence from the generator, so single runs sharing
    # one generator reproduce them.
    generator = torch.Generator(device).manual_seed(0)
    runs = torch.stack([attack(generator=generator) for _ in range(3)])
    best = attack(restarts=3, generator=torch.Generator(device).manual_seed(0))
    with torch.no_grad():
        logits = net(runs.flatten(0, 1)).view(3, len(y), 3)
    fooled = logits.argmax(-1) != y
    loss = attack_loss(logits.flatten(0, 1), y.repeat(3)).view(3, -1)
    expected = runs[(fooled.double() * 1e6 + loss).argmax(0), torch.arange(len(y), device=device)]
    assert torch.equal(best, expected)
    with torch.no_grad():
        assert (net(best).argmax(-1) != y).sum() == fooled.any(0).sum()
    assert all(p.grad is None for p in net.parameters())


def test_eot_matches_expected_gradient_sign(device):
    # A 2-point posterior over the weights: W w.p. 0.7 and -W w.p. 0.3.
    weight = torch.randn(2, 6, device=device)
    x = torch.rand(40, 6, device=device)
    y = torch.randint(0, 2, (40,), device=device)

    def stochastic(z):
        sign = 1.0 if torch.rand(()) < 0.7 else -1.0
        return z @ (sign * weight).T

    x_req = x.clone().requires_grad_()
    expected_loss = 0.7 * attack_loss(x_req @ weight.T, y) + 0.3 * attack_loss(-x_req @ weight.T, y)
    (mean_grad,) = torch.autograd.grad(expected_loss.sum(), x_req)
    clear = mean_grad.abs() > 0.05 * mean_grad.abs().max()

    def agreement(eot_samples):
        x_adv = fgsm(stochastic, x, y, 0.01, clip=None, eot_samples=eot_samples)
        same = (x_adv - x).sign() == mean_grad.sign()
        return same[clear].double().mean().item()

    assert agreement(1000) == 1.0
    assert agreement(1) < 0.9


def test_predictive_logits(device):
    weights = [torch.randn(3, 4, device=device) for _ in range(3)]
    x = torch.randn(5, 4, device=device)
    average = predictive_logits(linear(w) for w in weights)
    expected = torch.stack([(x @ w.T).softmax(-1) for w in weights]).mean(0).log()
    assert torch.allclose(average(x), expected, atol=1e-6)
    single = predictive_logits([linear(weights[0])])
    assert torch.allclose(single(x), (x @ weights[0].T).log_softmax(-1), atol=1e-6)
    with pytest.raises(ValueError, match="at least one"):
        predictive_logits([])


def test_attack_loss_values():
    logits = torch.tensor([[3.0, 1.0, 0.0, -1.0], [0.0, 2.0, 5.0, 1.0]])
    y = torch.tensor([1, 2])
    assert torch.allclose(attack_loss(logits, y, "cw"), torch.tensor([2.0, -3.0]))
    # dlr = (max_{j != y} z_j - z_y) / (z_pi1 - z_pi3)
    assert torch.allclose(attack_loss(logits, y, "dlr"), torch.tensor([2.0 / 3.0, -3.0 / 4.0]))
    expected_ce = -logits.log_softmax(-1)[torch.arange(2), y]
    assert torch.allclose(attack_loss(logits, y, "ce"), expected_ce)


def test_l1_projection_known_cases():
    v = torch.tensor([[3.0, 1.0], [1.0, 1.0], [-2.0, 1.0], [0.1, -0.2]])
    w = project_l1_ball(v, 1.5)
    expected = torch.tensor([[1.5, 0.0], [0.75, 0.75], [-1.25, 0.25], [0.1, -0.2]])
    assert torch.allclose(w, expected)
    assert torch.equal(project_l1_ball(v, 0.0), torch.zeros_like(v))


def test_l1_projection_kkt():
    # w = argmin |w - v|^2 s.t. |w|_1 <= r iff w = sign(v) max(|v| - theta, 0) with
    # theta >= 0, |w|_1 = r when theta > 0 (Duchi et al. 2008, lemma 3).
    v = torch.randn(200, 3, 5, dtype=torch.float64) * torch.rand(200, 1, 1, dtype=torch.float64) * 3
    radius = 2.0
    w = project_l1_ball(v, radius).flatten(1)
    v = v.flatten(1)
    norms = v.abs().sum(1)
    inside = norms <= radius
    assert torch.equal(w[inside], v[inside])
    w, v = w[~inside], v[~inside]
    assert torch.allclose(w.abs().sum(1), torch.full((len(w),), radius, dtype=w.dtype))
    support = w != 0
    theta = (v.abs() - w.abs()).where(support, torch.nan).nanmean(1, keepdim=True)
    assert (theta > 0).all()
    assert torch.allclose((v - w)[support], (theta * w.sign()).expand_as(w)[support])
    assert (v.abs()[~support] <= theta.expand_as(v)[~support] + 1e-12).all()
    assert (w.sign() * v.sign() >= 0).all()


def test_l1_step_skips_coordinates_stuck_at_the_boundary(device):
    # Coordinate 0 has the largest gradient but is already at the upper bound.
    weight = torch.tensor([[0.0, 0.0, 0.0], [3.0, 2.0, 1.0]], device=device)
    x = torch.tensor([[1.0, 0.5, 0.5]], device=device)
    y = torch.tensor([0], device=device)
    x_adv = pgd(linear(weight), x, y, 0.2, 1, 0.2, norm="l1", random_start=False)
    assert torch.allclose(x_adv, torch.tensor([[1.0, 0.7, 0.5]], device=device))


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 4),
    dim=st.integers(1, 6),
    eps=st.floats(0.0, 2.0),
    norm=st.sampled_from(["linf", "l2", "l1"]),
    restarts=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
def test_ball_and_domain_property(device, n, dim, eps, norm, restarts, seed):
    generator = torch.Generator(device).manual_seed(seed)
    weight = torch.randn(3, dim, device=device, generator=generator)
    x = torch.rand(n, dim, device=device, generator=generator)
    y = torch.randint(0, 3, (n,), device=device, generator=generator)
    x_adv = pgd(
        linear(weight),
        x,
        y,
        eps,
        3,
        eps / 2 + 0.01,
        norm=norm,
        restarts=restarts,
        generator=generator,
    )
    assert x_adv.shape == x.shape
    assert (perturbation_norm(x_adv, x, norm) <= eps + 1e-5).all()
    assert x_adv.min() >= 0 and x_adv.max() <= 1
    x_fgsm = fgsm(linear(weight), x, y, eps)
    assert ((x_fgsm - x).abs() <= eps + 1e-6).all() and x_fgsm.min() >= 0 and x_fgsm.max() <= 1


def _linear_setup(num_classes=10):
    weight = torch.randn(num_classes, 3)
    return linear(weight), torch.rand(4, 3), torch.randint(0, num_classes, (4,))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(eps=-0.1), "eps must be a finite number >= 0"),
        (dict(eps=float("nan")), "eps must be a finite number >= 0"),
        (dict(eps=float("inf")), "eps must be a finite number >= 0"),
        (dict(steps=0), "steps must be an integer >= 1"),
        (dict(step_size=0.0), "step_size must be a finite number > 0"),
        (dict(norm="l3"), "norm must be one of"),
        (dict(restarts=0), "restarts must be an integer >= 1"),
        (dict(eot_samples=0), "eot_samples must be an integer >= 1"),
        (dict(loss="hinge"), "loss must be one of"),
        (dict(l1_sparsity=1.5), r"l1_sparsity must be a finite number in \[0, 1\]"),
    ],
)
def test_pgd_argument_errors(kwargs, match):
    fn, x, y = _linear_setup()
    arguments = dict(eps=0.1, steps=2, step_size=0.05) | kwargs
    with pytest.raises(ValueError, match=match):
        pgd(fn, x, y, **arguments)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(eps="0.1"), "eps must be a finite number >= 0"),
        (dict(eps=torch.tensor(0.1)), "eps must be a finite number >= 0"),
        (dict(steps=2.0), "steps must be an integer >= 1"),
        (dict(steps=True), "steps must be an integer >= 1"),
        (dict(step_size=None), "step_size must be a finite number > 0"),
        (dict(norm=2), "norm must be a string"),
        (dict(restarts=1.0), "restarts must be an integer >= 1"),
        (dict(eot_samples=1.5), "eot_samples must be an integer >= 1"),
        (dict(loss=None), "loss must be a string"),
        (dict(l1_sparsity="0.5"), r"l1_sparsity must be a finite number in \[0, 1\]"),
    ],
)
def test_pgd_argument_type_errors(kwargs, match):
    fn, x, y = _linear_setup()
    arguments = dict(eps=0.1, steps=2, step_size=0.05) | kwargs
    with pytest.raises(TypeError, match=match):
        pgd(fn, x, y, **arguments)


def test_input_errors():
    fn, x, y = _linear_setup()
    with pytest.raises(ValueError, match="x contains NaN"):
        fgsm(fn, x.index_fill(0, torch.tensor([1]), float("nan")), y, 0.1)
    bad = x.clone()
    bad[0, 0], bad[1, 1] = -0.3, 1.0
    msg = r"x has values outside the data domain clip=\(0, 1\): min -0.3, max 1"
    with pytest.raises(ValueError, match=msg):
        fgsm(fn, bad, y, 0.1)
    fgsm(fn, bad, y, 0.1, clip=None)
    with pytest.raises(ValueError, match=r"y must be a tensor of shape \(4,\)"):
        fgsm(fn, x, y[:3], 0.1)
    with pytest.raises(ValueError, match="y must hold integer class labels"):
        fgsm(fn, x, y.float(), 0.1)
    with pytest.raises(ValueError, match=r"y has labels outside \[0, 10\)"):
        pgd(fn, x, torch.tensor([0, 1, 10, 2]), 0.1, 2, 0.05)
    with pytest.raises(ValueError, match=r"y has labels outside \[0, 10\)"):
        fgsm(fn, x, torch.tensor([0, -1, 2, 2]), 0.1)
    with pytest.raises(ValueError, match="x must be a floating point tensor"):
        fgsm(fn, x.long(), y, 0.1)


def test_dlr_needs_three_classes():
    fn, x, y = _linear_setup(num_classes=2)
    with pytest.raises(ValueError, match="loss='dlr' needs at least 3 classes"):
        pgd(fn, x, y, 0.1, 2, 0.05, loss="dlr")
    fn, x, y = _linear_setup(num_classes=3)
    x_adv = pgd(fn, x, y, 0.1, 2, 0.05, loss="dlr")
    assert ((x_adv - x).abs() <= 0.1 + 1e-6).all()
