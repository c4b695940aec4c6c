import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyro.ops.stats import split_gelman_rubin

from pyro_ext.ops import kernel_stein_discrepancy, rank_uniformity_test, sbc_ranks, split_rhat
from pyro_ext.ops.stats import kernel_stein_discrepancy as from_module


def standard_normal_score(x):
    return -x


def imq(x, y, c, beta):
    return (c**2 + (x - y).pow(2).sum()) ** beta


def brute_force_ksd(samples, score, c, beta):
    """sqrt(mean_ij k0(x_i, x_j)) with every derivative of the IMQ kernel by autograd."""
    grad_x = torch.func.grad(imq, argnums=0)
    grad_y = torch.func.grad(imq, argnums=1)
    # d/dx_j of d/dy_i k: its trace is the divergence term nabla_x . nabla_y k.
    cross = torch.func.jacrev(grad_y, argnums=0)
    total = 0.0
    for x, sx in zip(samples, score):
        for y, sy in zip(samples, score):
            total = total + (
                torch.trace(cross(x, y, c, beta))
                + grad_x(x, y, c, beta) @ sy
                + grad_y(x, y, c, beta) @ sx
                + imq(x, y, c, beta) * (sx @ sy)
            )
    return (total / samples.shape[0] ** 2).sqrt()


def test_reexported():
    import pyro_ext.ops

    assert kernel_stein_discrepancy is from_module
    assert pyro_ext.ops.__all__ == [
        "associative_scan",
        "hessian_diagonal",
        "is_traced",
        "kernel_stein_discrepancy",
        "rank_uniformity_test",
        "rng_preserved",
        "sbc_ranks",
        "split_rhat",
        "vector_reduce",
        "vector_scan",
    ]


# The device fixture is a constant per test, so reusing it across examples is safe.
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    num_samples=st.integers(1, 6),
    dim=st.integers(1, 4),
    c=st.floats(0.3, 3.0),
    beta=st.floats(-0.95, -0.05),
    seed=st.integers(0, 2**16),
)
def test_matches_brute_force(device, num_samples, dim, c, beta, seed):
    generator = torch.Generator().manual_seed(seed)
    samples = 2.0 * torch.randn(num_samples, dim, generator=generator, dtype=torch.float64)
    score = torch.randn(num_samples, dim, generator=generator, dtype=torch.float64)
    expected = brute_force_ksd(samples, score, c, beta)
    actual = kernel_stein_discrepancy(samples.to(device), score.to(device), c=c, beta=beta)
    assert actual.device.type == device.type
    assert actual.dtype == torch.float64
    assert actual.shape == ()
    assert torch.allclose(actual.cpu(), expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("c,beta", [(1.0, -0.5), (0.5, -0.2), (2.0, -0.9)])
def test_single_point_closed_form(device, c, beta):
    # For n = 1: k0(x, x) = -2 beta d c^(2 beta - 2) + c^(2 beta) |s(x)|^2.
    x = torch.tensor([[0.3, -1.0, 2.0]], dtype=torch.float64, device=device)
    score = torch.tensor([[1.0, 2.0, -0.5]], dtype=torch.float64, device=device)
    expected = math.sqrt(-2 * beta * 3 * c ** (2 * beta - 2) + c ** (2 * beta) * 5.25)
    actual = kernel_stein_discrepancy(x, score, c=c, beta=beta)
    assert actual.item() == pytest.approx(expected, rel=1e-12)


def test_callable_score_equals_tensor_score(device):
    x = torch.randn(50, 3, device=device)
    assert torch.equal(
        kernel_stein_discrepancy(x, standard_normal_score),
        kernel_stein_discrepancy(x, standard_normal_score(x)),
    )


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 199, 200, 5000])
def test_chunked_equals_unchunked(device, chunk_size):
    x = torch.randn(200, 3, dtype=torch.float64, device=device) + 0.3
    unchunked = kernel_stein_discrepancy(x, standard_normal_score, chunk_size=200)
    chunked = kernel_stein_discrepancy(x, standard_normal_score, chunk_size=chunk_size)
    assert torch.allclose(chunked, unchunked, rtol=1e-12)


def test_float32_agrees_with_float64(device):
    x = torch.randn(300, 2, dtype=torch.float64, device=device) * 3.0 + 100.0
    score = -(x - 100.0)
    exact = kernel_stein_discrepancy(x, score)
    single = kernel_stein_discrepancy(x.float(), score.float())
    assert single.dtype == torch.float32
    assert single.item() == pytest.approx(exact.item(), rel=1e-3)


def test_exact_samples_decay_as_inverse_square_root(device):
    # E[KSD^2] = E[k0(x, x)] / n = 2 d / n for N(0, I) with c = 1, beta = -1/2, since the
    # off-diagonal terms have mean zero (Stein's identity).
    dim, reps = 2, 30
    generator = torch.Generator().manual_seed(0)
    sizes = [100, 400, 1600]
    mean_sq = []
    for n in sizes:
        draws = torch.randn(reps, n, dim, generator=generator, dtype=torch.float64).to(device)
        values = torch.stack([kernel_stein_discrepancy(x, standard_normal_score) for x in draws])
        mean_sq.append(values.pow(2).mean().item())
    for n, value in zip(sizes, mean_sq):
        assert value == pytest.approx(2 * dim / n, rel=0.25)
    slope = math.log(mean_sq[-1] / mean_sq[0]) / math.log(sizes[-1] / sizes[0])
    assert slope == pytest.approx(-1.0, abs=0.15)  # KSD ~ n^(-1/2)


@pytest.mark.parametrize(
    "transform", [lambda x: x + 0.5, lambda x: 0.5 * x], ids=["shifted", "shrunk"]
)
def test_detects_wrong_distribution(device, transform):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2000, 2, generator=generator, dtype=torch.float64).to(device)
    exact = kernel_stein_discrepancy(x, standard_normal_score)
    wrong = kernel_stein_discrepancy(transform(x), standard_normal_score)
    assert wrong > 5 * exact


def test_differentiable(device):
    x = torch.randn(8, 2, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x: kernel_stein_discrepancy(x, standard_normal_score, chunk_size=3), (x,)
    )


def test_integer_samples_are_promoted():
    x = torch.tensor([[0, 1], [2, -1]])
    expected = kernel_stein_discrepancy(x.to(torch.get_default_dtype()), standard_normal_score)
    assert torch.equal(kernel_stein_discrepancy(x, standard_normal_score), expected)


@pytest.mark.parametrize(
    "samples,score,kwargs,match",
    [
        (torch.randn(5), torch.randn(5), {}, "shape \\(n, d\\)"),
        (torch.randn(2, 3, 4), torch.randn(2, 3, 4), {}, "shape \\(n, d\\)"),
        (torch.randn(0, 2), torch.randn(0, 2), {}, "shape \\(n, d\\)"),
        (torch.randn(5, 2), torch.randn(5, 3), {}, "score must have the shape"),
        (torch.randn(5, 2), lambda x: x[:, :1], {}, "score must have the shape"),
        (torch.tensor([[0.0, float("nan")]]), torch.zeros(1, 2), {}, "samples contains NaN"),
        (torch.zeros(1, 2), torch.tensor([[float("inf"), 0.0]]), {}, "score contains NaN"),
        (torch.randn(5, 2), torch.randn(5, 2), {"c": 0.0}, "c must be"),
        (torch.randn(5, 2), torch.randn(5, 2), {"c": -1.0}, "c must be"),
        (torch.randn(5, 2), torch.randn(5, 2), {"c": float("inf")}, "c must be"),
        (torch.randn(5, 2), torch.randn(5, 2), {"beta": 0.0}, "beta must"),
        (torch.randn(5, 2), torch.randn(5, 2), {"beta": -1.0}, "beta must"),
        (torch.randn(5, 2), torch.randn(5, 2), {"beta": 0.5}, "beta must"),
        (torch.randn(5, 2), torch.randn(5, 2), {"beta": float("nan")}, "beta must"),
        (torch.randn(5, 2), torch.randn(5, 2), {"chunk_size": 0}, "chunk_size"),
        (torch.randn(5, 2), torch.randn(5, 2, dtype=torch.cfloat), {}, "must be real"),
    ],
)
def test_errors(samples, score, kwargs, match):
    with pytest.raises(ValueError, match=match):
        kernel_stein_discrepancy(samples, score, **kwargs)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"chunk_size": 2.0}, "chunk_size must be an integer"),
        ({"chunk_size": True}, "chunk_size must be an integer"),
        ({"c": "1"}, "c must be a finite number"),
        ({"c": True}, "c must be a finite number"),
        ({"beta": None}, "beta must be a finite number"),
    ],
)
def test_type_errors(kwargs, match):
    with pytest.raises(TypeError, match=match):
        kernel_stein_discrepancy(torch.randn(5, 2), torch.randn(5, 2), **kwargs)


# ---------------------------------------------------------------- split_rhat


@pytest.mark.parametrize("chain_dim, sample_dim", [(0, 1), (1, 0), (0, -2)])
def test_split_rhat_is_pyros_split_gelman_rubin(device, chain_dim, sample_dim):
    draws = torch.randn(3, 20, 2, dtype=torch.float64, device=device)
    if (chain_dim, sample_dim) == (1, 0):
        draws = draws.transpose(0, 1)
    expected = split_gelman_rubin(draws, chain_dim=chain_dim, sample_dim=sample_dim)
    assert torch.equal(split_rhat(draws, chain_dim, sample_dim), expected)


@pytest.mark.parametrize("num_draws", [0, 1, 3])
def test_split_rhat_of_chains_too_short_to_split_is_nan(device, num_draws):
    draws = torch.randn(4, num_draws, 2, 5, dtype=torch.float32, device=device)
    rhat = split_rhat(draws)
    assert rhat.shape == (2, 5) and rhat.dtype == draws.dtype and rhat.device == draws.device
    assert torch.isnan(rhat).all()


def test_sbc_ranks_count_the_draws_below_the_truth():
    truth = torch.tensor([0.0, 10.0, -10.0])
    draws = torch.tensor([[-1.0, 1.0, 2.0], [0.5, -0.5, 3.0], [1.5, 2.0, 4.0]])  # (M=3, 3)
    assert sbc_ranks(truth, draws).tolist() == [1, 3, 0]
    assert sbc_ranks(truth, draws.T, sample_dim=1).tolist() == [1, 3, 0]
    with pytest.raises(ValueError, match="one dimension more than truth"):
        sbc_ranks(truth, truth)


def test_rank_uniformity_test_accepts_uniform_and_rejects_humped_ranks():
    generator = torch.Generator().manual_seed(0)
    uniform = torch.randint(0, 100, (2000,), generator=generator)  # ranks among M = 99 draws
    p_value, counts = rank_uniformity_test(uniform, 99)
    assert p_value > 1e-3
    assert counts.sum() == 2000 and counts.shape == (20,)
    # Draws twice as wide as the posterior put the truth mid-rank.
    z = torch.randn(2000, generator=generator)
    humped = (torch.distributions.Normal(0.0, 2**0.5).cdf(z) * 100).long().clamp_max(99)
    assert rank_uniformity_test(humped, 99)[0] < 1e-6
    # Bins of unequal width (M + 1 = 101 ranks in 20 bins) still expect uniform counts.
    assert rank_uniformity_test(torch.randint(0, 101, (4000,), generator=generator), 100)[0] > 1e-3


@pytest.mark.parametrize(
    "args, error, match",
    [
        ((torch.tensor([0.5]), 3), TypeError, "integer tensor"),
        ((torch.tensor([4]), 3), ValueError, r"\[0, num_draws=3\]"),
        ((torch.tensor([], dtype=torch.long), 3), ValueError, "empty"),
        ((torch.tensor([1, 2]), 3, 5), ValueError, "num_bins"),
    ],
)
def test_rank_uniformity_test_refuses_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        rank_uniformity_test(*args)
