"""The traced and compiled online update (``jit_compile``) and ``update_many``: the eager
update's beliefs, checks and errors, and the stream's exact log marginal likelihood."""

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide.initialization import init_to_mean
from test_filters import exact_posterior, linear_data, linear_model

from pyro_ext.infer import ModelNotTraceableError
from pyro_ext.online import (
    BONG,
    IMQ,
    LoFi,
    OnlineDivergenceError,
    OnlineInputError,
    OnlinePredictions,
)


def logistic_model(dim):
    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(dim, device=x.device), 1.0).to_event(1))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Bernoulli(logits=x @ w), obs=y)

    return model


def stream(f, x, y, seed=0):
    pyro.set_rng_seed(seed)
    for t in range(x.shape[0]):
        f.update(x[t : t + 1], y[t : t + 1])
    return f


SETTINGS = [
    ("full", {}),
    ("diag", {}),
    ("dlr", {"rank": 2}),
    ("full", {"method": "blr", "num_iters": 3}),
    ("dlr", {"method": "blr", "num_iters": 2, "rank": 2}),
    ("full", {"method": "bog", "learning_rate": 0.05}),
    ("diag", {"method": "bbb", "num_iters": 2, "learning_rate": 0.05}),
    ("full", {"dynamics": ("random_walk", 0.01)}),
    ("dlr", {"dynamics": ("random_walk", 0.01), "rank": 2}),
    ("full", {"robust": IMQ(1.0)}),
    ("full", {"linearize": False}),
    ("diag", {"linearize": False, "hessian": "ef"}),
    ("full", {"hessian": "ef"}),
]


@pytest.mark.parametrize("family, kwargs", SETTINGS)
def test_traced_update_is_the_eager_update(float64, device, family, kwargs):
    # Every family, rule, drift, weight and expectation: the same beliefs after a stream
    # (the Monte Carlo rules' draws too: they are drawn as the eager update draws them).
    dim, n = 3, 12
    x, y, _ = linear_data(n, dim, 0.5, device)
    beliefs = []
    for jit in (False, "trace"):
        f = BONG(linear_model(dim, 1.5, 0.5), family=family, jit_compile=jit, **kwargs)
        beliefs.append(stream(f, x, y).belief)
        assert f.num_updates == n
    for eager, traced in zip(*beliefs):
        torch.testing.assert_close(traced, eager, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("family", ["full", "dlr"])
def test_compiled_update_is_exact_on_the_conjugate_stream(float64, device, family):
    # TorchInductor's graph, at the defaults: the closed-form posterior.
    dim, prior_scale, noise, n = 4, 1.5, 0.5, 30
    x, y, _ = linear_data(n, dim, noise, device)
    kwargs = {"rank": dim} if family == "dlr" else {}
    f = BONG(linear_model(dim, prior_scale, noise), family=family, jit_compile=True, **kwargs)
    stream(f, x, y)
    mean, cov = exact_posterior(x, y, prior_scale, noise)
    assert f.compile_seconds > 0 and len(f._graphs) == 1
    torch.testing.assert_close(f.mean, mean, atol=1e-8, rtol=0)
    torch.testing.assert_close(f.covariance(), cov, atol=1e-8, rtol=0)


def test_traced_logistic_stream_is_the_eager_one(float64):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(20, 3, generator=g)
    y = (x @ torch.tensor([1.0, -2.0, 0.5]) > 0).double()
    eager = stream(BONG(logistic_model(3)), x, y)
    traced = stream(BONG(logistic_model(3), jit_compile="trace"), x, y)
    torch.testing.assert_close(traced.mean, eager.mean, atol=1e-10, rtol=0)
    torch.testing.assert_close(traced.covariance(), eager.covariance(), atol=1e-10, rtol=0)


def test_missing_observations_are_skipped_by_the_traced_update(float64):
    dim, n = 3, 10
    x, y, _ = linear_data(n, dim, 0.5)
    y_missing = y.clone()
    y_missing[[3, 7]] = float("nan")
    eager = stream(BONG(linear_model(dim, 1.5, 0.5)), x, y_missing)
    traced = stream(BONG(linear_model(dim, 1.5, 0.5), jit_compile="trace"), x, y_missing)
    torch.testing.assert_close(traced.mean, eager.mean, atol=1e-10, rtol=0)
    keep = ~torch.isnan(y_missing)
    mean, _ = exact_posterior(x[keep], y[keep], 1.5, 0.5)
    torch.testing.assert_close(traced.mean, mean, atol=1e-8, rtol=0)


def test_a_refused_batch_raises_the_eager_error_and_keeps_the_belief(float64):
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    f = BONG(logistic_model(3), jit_compile="trace")
    for t in range(3):
        f.update(x[t : t + 1], y[t : t + 1])
    before = f.belief
    bad_x = x[3:4].clone()
    bad_x[0, 1] = float("nan")
    with pytest.raises(OnlineInputError, match="update 3 refused.*NaN"):
        f.update(bad_x, y[3:4])
    with pytest.raises(ValueError, match="support|Bernoulli|0 and 1|boolean"):
        f.update(x[3:4], torch.tensor([2.0]))
    with pytest.raises(OnlineInputError, match="infinite"):
        f.update(x[3:4], torch.tensor([float("inf")]))
    assert f.belief is before and f.num_updates == 3
    f.update(x[3:4], y[3:4])  # a good batch afterwards goes through the same graph
    assert f.num_updates == 4 and len(f._graphs) == 1


def test_a_step_that_breaks_the_precision_raises_the_eager_divergence(float64):
    # BOG with a rate far too large: the covariance leaves the cone at some update. The
    # traced update flags it and the eager one reports it with the step.
    x, y, _ = linear_data(40, 3, 0.1)
    errors = []
    for jit in (False, "trace"):
        f = BONG(linear_model(3, 1.0, 0.1), method="bog", learning_rate=2.0, jit_compile=jit)
        with pytest.raises(OnlineDivergenceError) as info:
            stream(f, x, y)
        errors.append((str(info.value), f.num_updates))
    assert errors[0] == errors[1]


def test_a_model_that_cannot_be_traced_warns_and_runs_eagerly(float64):
    def branching(x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(2), 1.0).to_event(1))
        scale = 0.5 if bool(x.sum() > 0) else 1.0  # a branch on the data's value
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(x @ w, scale), obs=y)

    x, y, _ = linear_data(5, 2, 0.5)
    f = BONG(branching, jit_compile="trace")
    f.update(x[:1], y[:1])
    with pytest.warns(RuntimeWarning, match="host while tracing.*runs its updates eagerly"):
        f.update(x[1:2], y[1:2])
    assert f.jit_compile is False and f.num_updates == 2
    eager = stream(BONG(branching), x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        traced = stream(BONG(branching, jit_compile="trace"), x, y)
    torch.testing.assert_close(traced.mean, eager.mean)
    assert issubclass(ModelNotTraceableError, RuntimeError)


def test_jit_compile_arguments_are_checked():
    model = linear_model(2, 1.0, 0.5)
    with pytest.raises(TypeError, match="jit_compile must be a bool"):
        BONG(model, jit_compile=1)
    with pytest.raises(ValueError, match="jit_compile must be False"):
        BONG(model, jit_compile="fast")
    with pytest.raises(ValueError, match="needs jit_compile=True"):
        BONG(model, compile_mode="reduce-overhead")


@pytest.mark.parametrize("jit", [False, "trace"])
def test_update_many_is_the_loop_and_sums_to_the_exact_evidence(float64, device, jit):
    # A linear-Gaussian stream: update_many's beliefs are the loop's, and its one-step-ahead
    # log-likelihoods sum to log N(y | 0, X S0 X^T + noise^2 I), the exact evidence.
    dim, prior_scale, noise, n = 3, 1.5, 0.5, 25
    x, y, _ = linear_data(n, dim, noise, device)
    f = BONG(linear_model(dim, prior_scale, noise), jit_compile=jit)
    predictions = f.update_many(x, y)
    assert isinstance(predictions, OnlinePredictions)
    looped = stream(BONG(linear_model(dim, prior_scale, noise)), x, y)
    torch.testing.assert_close(f.mean, looped.mean, atol=1e-10, rtol=0)
    assert predictions.mean.shape == (n,) and predictions.variance.shape == (n,)
    assert predictions.log_likelihood.shape == (n,)
    eye = torch.eye(n, dtype=x.dtype, device=device)
    evidence = dist.MultivariateNormal(
        torch.zeros(n, dtype=x.dtype, device=device),
        prior_scale**2 * x @ x.T + noise**2 * eye,
    ).log_prob(y)
    torch.testing.assert_close(predictions.log_likelihood.sum(), evidence, atol=1e-8, rtol=0)
    # Step t's prediction is from the belief after t points: the closed form.
    t = 10
    mean, cov = exact_posterior(x[:t], y[:t], prior_scale, noise)
    torch.testing.assert_close(predictions.mean[t], x[t] @ mean, atol=1e-8, rtol=0)
    torch.testing.assert_close(
        predictions.variance[t], x[t] @ cov @ x[t] + noise**2, atol=1e-8, rtol=0
    )


def test_update_many_on_a_bernoulli_stream_scores_the_predictive_probabilities(float64):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(15, 2, generator=g)
    y = (x[:, 0] > 0).double()
    f = BONG(logistic_model(2), jit_compile="trace")
    predictions = f.update_many(x, y)
    p = predictions.mean
    expected = torch.where(y > 0, p.log(), (-p).log1p())
    torch.testing.assert_close(predictions.log_likelihood, expected)
    assert bool(((p > 0) & (p < 1)).all())
    # The first prediction is from the prior: probability 1/2 at the prior mean.
    torch.testing.assert_close(p[0], torch.tensor(0.5))


def test_update_many_refuses_a_stream_of_mismatched_lengths():
    f = BONG(linear_model(2, 1.0, 0.5))
    with pytest.raises(ValueError, match="same leading dimension.*'x' of shape \\(5, 2\\)"):
        f.update_many(torch.randn(5, 2), torch.randn(4))
    with pytest.raises(ValueError, match="empty stream"):
        f.update_many(torch.randn(0, 2), torch.randn(0))


def test_update_many_keeps_the_updates_before_a_refused_row(float64):
    x, y, _ = linear_data(8, 2, 0.5)
    x[5, 0] = float("inf")
    f = BONG(linear_model(2, 1.0, 0.5), init_strategy=init_to_mean, jit_compile="trace")
    with pytest.raises(OnlineInputError, match="update 5 refused"):
        f.update_many(x, y)
    assert f.num_updates == 5
    mean, _ = exact_posterior(x[:5], y[:5], 1.0, 0.5)
    torch.testing.assert_close(f.mean, mean, atol=1e-8, rtol=0)
    assert math.isfinite(float(f.mean.sum()))


@pytest.mark.parametrize(
    "family, kwargs",
    [
        ("full", {}),
        ("dlr", {"rank": 2, "dynamics": ("random_walk", 0.01)}),
        ("full", {"robust": IMQ(1.0)}),
        ("full", {"linearize": False}),
        ("diag", {"method": "blr", "num_iters": 2}),
    ],
)
def test_unrolled_update_many_is_the_loop(float64, device, family, kwargs):
    # unroll=4 over 11 observations: the first four one at a time (the first reads the
    # model eagerly), a chunk of four in one graph call, the last three one at a time: the
    # loop's beliefs, predictions and (Monte Carlo rules) draws.
    dim, n = 3, 11
    x, y, _ = linear_data(n, dim, 0.5, device)
    model = linear_model(dim, 1.5, 0.5)
    pyro.set_rng_seed(0)
    unrolled = BONG(model, family=family, jit_compile="trace", unroll=4, **kwargs)
    chunks = []
    compiled_update = unrolled._compiled_update

    def recorded(args, kwargs, predict=False, steps=1):
        result = compiled_update(args, kwargs, predict, steps)
        if steps > 1:
            chunks.append(result is not None)
        return result

    unrolled._compiled_update = recorded
    predictions = unrolled.update_many(x, y)
    assert chunks == [True], "the chunk of rows 4-7 did not go through its graph"
    pyro.set_rng_seed(0)
    looped = BONG(model, family=family, jit_compile="trace", **kwargs)
    expected = looped.update_many(x, y)
    assert unrolled.num_updates == looped.num_updates == n
    for mine, theirs in zip(unrolled.belief, looped.belief):
        torch.testing.assert_close(mine, theirs, atol=1e-10, rtol=0)
    for field in ("mean", "variance", "log_likelihood"):
        torch.testing.assert_close(
            getattr(predictions, field), getattr(expected, field), atol=1e-10, rtol=0
        )
    torch.testing.assert_close(
        unrolled.potential.model_args[0], x[-1:]
    )  # what predictive() reads: the last observation's inputs


def test_unrolled_update_many_keeps_the_updates_before_a_refused_row_in_a_chunk(float64):
    # Row 5 lies inside the chunk of rows 4-7: that chunk runs again one row at a time, so
    # row 4 stands and row 5 is refused by its own update, as without unroll.
    x, y, _ = linear_data(9, 2, 0.5)
    x[5, 0] = float("inf")
    f = BONG(linear_model(2, 1.0, 0.5), init_strategy=init_to_mean, jit_compile="trace", unroll=4)
    with pytest.raises(OnlineInputError, match="update 5 refused"):
        f.update_many(x, y)
    assert f.num_updates == 5
    mean, _ = exact_posterior(x[:5], y[:5], 1.0, 0.5)
    torch.testing.assert_close(f.mean, mean, atol=1e-8, rtol=0)


def test_unroll_is_checked():
    model = linear_model(2, 1.0, 0.5)
    with pytest.raises(ValueError, match="unroll"):
        BONG(model, unroll=0)
    with pytest.raises(TypeError, match="unroll"):
        BONG(model, unroll=2.0)


def test_unrolled_update_many_takes_the_observations_by_keyword(float64):
    # A keyword argument goes through the general cut of the stream: the same beliefs.
    x, y, _ = linear_data(10, 2, 0.5)
    model = linear_model(2, 1.0, 0.5)
    by_keyword = BONG(model, jit_compile="trace", unroll=3)
    predictions = by_keyword.update_many(x, y=y)
    positional = BONG(model, jit_compile="trace")
    expected = positional.update_many(x, y)
    assert any(key[-1] == 3 for key in by_keyword._graphs)
    torch.testing.assert_close(by_keyword.mean, positional.mean, atol=1e-10, rtol=0)
    torch.testing.assert_close(
        predictions.log_likelihood, expected.log_likelihood, atol=1e-10, rtol=0
    )


def test_column_major_data_runs_the_graph_compiled_for_row_major_data(float64):
    # A graph compiled for row-major rows takes the same rows from a column-major table
    # (made contiguous: inductor's graph asserts its inputs' strides), one at a time and by
    # update_many's chunks, with the eager filter's beliefs.
    dim, n = 3, 14
    x, y, _ = linear_data(n, dim, 0.5)
    x_columns, y_strided = x.T.contiguous().T, torch.stack([y, y], 1)[:, 0]
    model = linear_model(dim, 1.5, 0.5)
    compiled = BONG(model, jit_compile=True, unroll=2)
    eager = BONG(model)
    for t in range(4):
        compiled.update(x[t : t + 1], y[t : t + 1])
        eager.update(x[t : t + 1], y[t : t + 1])
    for t in range(4, 8):
        compiled.update(x_columns[t : t + 1], y_strided[t : t + 1])
        eager.update(x[t : t + 1], y[t : t + 1])
    compiled.update_many(x_columns[8:], y_strided[8:])
    eager.update_many(x[8:], y[8:])
    for mine, theirs in zip(compiled.belief, eager.belief):
        torch.testing.assert_close(mine, theirs, atol=1e-8, rtol=0)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_the_low_rank_belief_stays_row_major(float64, jit_compile):
    # LAPACK's singular vectors are column-major; the projection returns W row-major, as
    # the compiled update takes its inputs (a column-major W would be copied at every
    # call, a tenth of a bandit round).
    x, y, _ = linear_data(6, 8, 0.5)
    f = LoFi(linear_model(8, 1.0, 0.5), rank=3, jit_compile=jit_compile)
    for t in range(len(x)):
        f.update(x[t : t + 1], y[t : t + 1])
        assert all(part.is_contiguous() for part in f.belief), t
