import math

import pytest
import torch

from pyro_ext.models.bsts.allocation import (
    AllocationResult,
    InfeasibleAllocationError,
    ParetoFrontier,
    allocate_budget,
    evaluate_strategies,
    non_dominated,
    pareto_frontier,
)

B = 10.0


class LinearGaussianModel:
    """Test double: per posterior draw ``s`` and period, sales ~ N(a_s + b_s . u, v_s).

    Over a horizon of ``h`` periods with plan ``U`` (h, k) the per-draw total has mean
    ``h a_s + b_s . sum_t U_t`` and variance ``h v_s``.
    """

    def __init__(self, a, b, v, differentiable_samples=True, dtype=torch.float64):
        self.a = torch.as_tensor(a, dtype=dtype)
        self.b = torch.as_tensor(b, dtype=dtype)
        self.v = torch.as_tensor(v, dtype=dtype)
        self.num_channels = self.b.shape[1]
        self.channel_names = [f"ch{i}" for i in range(self.num_channels)]
        self.differentiable_samples = differentiable_samples
        self.calls = 0

    def sales_moments(self, spend_future, covariates_future=None):
        self.calls += 1
        h = spend_future.shape[0]
        means = h * self.a + spend_future.sum(0) @ self.b.T
        return means, h * self.v

    def sample_sales(self, spend_future, covariates_future=None, num_samples=1000):
        means, variances = self.sales_moments(spend_future, covariates_future)
        idx = torch.randint(means.shape[0], (num_samples,))
        eps = torch.randn(num_samples, dtype=means.dtype)
        draws = means[idx] + variances[idx].sqrt() * eps
        return draws if self.differentiable_samples else draws.detach()

    # closed-form posterior-predictive moments, vectorised over a batch of allocations
    def moments(self, u, h=1):
        u = torch.as_tensor(u, dtype=torch.float64).reshape(-1, self.num_channels)
        m = h * self.a[None, :] + h * u @ self.b.double().T  # (n, S)
        mean = m.mean(1)
        var = h * self.v.double().mean() + m.var(1, unbiased=False)
        return mean, var


def _draws(mu, sd, num_draws=400, a_mean=100.0, a_sd=0.5, noise_var=1.0, seed=0, corr=None):
    """Posterior draws with exactly the requested empirical means of the slopes."""
    g = torch.Generator().manual_seed(seed)
    k = len(mu)
    z = torch.randn(num_draws, k, generator=g, dtype=torch.float64)
    z = z - z.mean(0)
    z = z / z.std(0, unbiased=False)
    if corr is not None:
        z = z @ torch.linalg.cholesky(torch.as_tensor(corr, dtype=torch.float64)).T
    b = torch.as_tensor(mu, dtype=torch.float64) + z * torch.as_tensor(sd, dtype=torch.float64)
    a = a_mean + a_sd * torch.randn(num_draws, generator=g, dtype=torch.float64)
    v = torch.full((num_draws,), noise_var, dtype=torch.float64)
    return a, b, v


@pytest.fixture(scope="module")
def model3():
    # channel 1 has the best mean return but is the riskiest
    a, b, v = _draws(mu=[0.5, 1.0, 0.8], sd=[0.1, 0.6, 0.3])
    return LinearGaussianModel(a, b, v)


def _simplex_grid(k, n, total=B, exact=False):
    pts = []
    step = total / n
    if k == 3:
        for i in range(n + 1):
            for j in range(n + 1 - i):
                if exact:
                    pts.append((i, j, n - i - j))
                else:
                    for m in range(n + 1 - i - j):
                        pts.append((i, j, m))
    return torch.tensor(pts, dtype=torch.float64) * step


def _brute_force(model, max_sd=None, lam=None, n=60):
    grid = _simplex_grid(3, n)
    mean, var = model.moments(grid)
    sd = var.sqrt()
    if lam is not None:
        score = mean - lam * sd
    else:
        score = torch.where(sd <= max_sd, mean, torch.full_like(mean, -math.inf))
    j = int(torch.argmax(score))
    return grid[j], float(mean[j]), float(sd[j]), float(score[j])


def _check_constraints(spend, budget=B, bounds=None, tol=1e-6):
    spend = torch.as_tensor(spend)
    assert (spend >= -tol).all()
    assert float(spend.sum(-1).max()) <= budget + tol
    if bounds is not None:
        bounds = torch.as_tensor(bounds, dtype=spend.dtype)
        assert (spend >= bounds[:, 0] - tol).all() and (spend <= bounds[:, 1] + tol).all()


# ----------------------------------------------------------------------------------------
# unconstrained (max mean) allocations


def test_max_mean_puts_budget_on_best_channel(model3):
    res = allocate_budget(model3, B)
    assert isinstance(res, AllocationResult)
    assert res.feasible and res.status == "optimal"
    torch.testing.assert_close(
        res.spend, torch.tensor([0.0, B, 0.0], dtype=torch.float64), atol=1e-5, rtol=0
    )
    mean, var = model3.moments(res.spend)
    assert res.mean == pytest.approx(float(mean), rel=1e-9)
    assert res.sd == pytest.approx(math.sqrt(float(var)), rel=1e-7)
    assert res.mean == pytest.approx(float(model3.a.mean()) + B * 1.0, rel=1e-7)
    assert res.channel_names == ["ch0", "ch1", "ch2"]
    assert res.plan.shape == (1, 3)


@pytest.mark.parametrize("corner", [0, 2])
def test_start_at_bad_corner_still_reaches_optimum(model3, corner):
    start = torch.zeros(3)
    start[corner] = B
    res = allocate_budget(model3, B, start=start)
    torch.testing.assert_close(
        res.spend, torch.tensor([0.0, B, 0.0], dtype=torch.float64), atol=1e-5, rtol=0
    )
    ref = allocate_budget(model3, B, max_sd=12.0)
    res = allocate_budget(model3, B, max_sd=12.0, start=start)
    assert res.mean == pytest.approx(ref.mean, rel=1e-6)
    torch.testing.assert_close(res.spend, ref.spend, atol=1e-3, rtol=0)


def test_bounds_spill_over_to_next_best_channel(model3):
    bounds = [[1.0, 10.0], [0.0, 4.0], [0.0, math.inf]]
    res = allocate_budget(model3, B, bounds=bounds)
    torch.testing.assert_close(
        res.spend, torch.tensor([1.0, 4.0, 5.0], dtype=torch.float64), atol=1e-5, rtol=0
    )
    _check_constraints(res.spend, bounds=bounds)


def test_negative_returns_leave_budget_unspent_unless_exact():
    a, b, v = _draws(mu=[-0.2, -0.5], sd=[0.05, 0.05])
    model = LinearGaussianModel(a, b, v)
    res = allocate_budget(model, B, start=[5.0, 5.0])
    torch.testing.assert_close(res.spend, torch.zeros(2, dtype=torch.float64), atol=1e-6, rtol=0)
    res = allocate_budget(model, B, exact_budget=True)
    torch.testing.assert_close(
        res.spend, torch.tensor([B, 0.0], dtype=torch.float64), atol=1e-5, rtol=0
    )


def test_ties_in_mean_are_broken_by_variance():
    # equal expected returns, independent slopes with sd 0.2 and 0.4: among the max-mean
    # allocations the least-variance one splits the budget as 0.4^2 : 0.2^2
    a, b, v = _draws(mu=[1.0, 1.0], sd=[0.2, 0.4], num_draws=2000, a_sd=0.0)
    # make the slope draws exactly uncorrelated
    zc = b - b.mean(0)
    q, _ = torch.linalg.qr(zc)
    b = 1.0 + q * math.sqrt(b.shape[0]) * torch.tensor([0.2, 0.4], dtype=torch.float64)
    model = LinearGaussianModel(a, b, v)
    res = allocate_budget(model, B)
    torch.testing.assert_close(
        res.spend, torch.tensor([8.0, 2.0], dtype=torch.float64), atol=1e-3, rtol=0
    )


# ----------------------------------------------------------------------------------------
# risk-constrained allocations


@pytest.mark.parametrize("max_sd", [3.0, 5.0, 8.0])
def test_sd_constraint_matches_brute_force(model3, max_sd):
    res = allocate_budget(model3, B, max_sd=max_sd)
    assert res.sd <= max_sd * (1 + 1e-6)
    _check_constraints(res.spend)
    u_bf, mean_bf, sd_bf, _ = _brute_force(model3, max_sd=max_sd)
    # at least as good as the grid (up to tolerance), and close to its allocation
    assert res.mean >= mean_bf - 1e-6
    assert res.mean <= mean_bf + 0.1
    torch.testing.assert_close(res.spend, u_bf, atol=0.35, rtol=0)
    mean, var = model3.moments(res.spend)
    assert res.sd == pytest.approx(math.sqrt(float(var)), rel=1e-7)


def test_nonbinding_sd_constraint_returns_max_mean(model3):
    free = allocate_budget(model3, B)
    res = allocate_budget(model3, B, max_sd=free.sd * 1.5)
    torch.testing.assert_close(res.spend, free.spend, atol=1e-5, rtol=0)
    assert "not binding" in res.message


@pytest.mark.parametrize("lam", [0.5, 2.0])
def test_risk_aversion_matches_brute_force(model3, lam):
    res = allocate_budget(model3, B, risk_aversion=lam, start=[B, 0.0, 0.0])
    _, _, _, score_bf = _brute_force(model3, lam=lam)
    assert res.objective == pytest.approx(res.mean - lam * res.sd)
    assert res.objective >= score_bf - 1e-6
    assert res.objective <= score_bf + 0.05
    _check_constraints(res.spend)


def test_infeasible_problems_raise_clearly(model3):
    with pytest.raises(InfeasibleAllocationError, match="lower bounds sum"):
        allocate_budget(model3, B, bounds=[[4.0, 10.0], [4.0, 10.0], [4.0, 10.0]])
    with pytest.raises(InfeasibleAllocationError, match="upper bounds"):
        allocate_budget(model3, B, bounds=[[0.0, 2.0], [0.0, 2.0], [0.0, 2.0]], exact_budget=True)
    # the zero-spend allocation has sd ~ sqrt(1 + 0.25): a cap of 0.5 is unattainable
    with pytest.raises(InfeasibleAllocationError, match="minimum achievable sd") as err:
        allocate_budget(model3, B, max_sd=0.5)
    assert isinstance(err.value, ValueError)
    # spending the whole budget makes a cap of 1.3 unattainable, not spending it does not
    res = allocate_budget(model3, B, max_sd=1.3)
    assert res.sd <= 1.3 * (1 + 1e-6)
    with pytest.raises(InfeasibleAllocationError, match="minimum achievable sd"):
        allocate_budget(model3, B, max_sd=1.3, exact_budget=True)


def test_horizon_and_per_period_plans(model3):
    res1 = allocate_budget(model3, B, max_sd=4.0)
    res3 = allocate_budget(model3, B, max_sd=12.0, horizon=3)
    assert res3.plan.shape == (3, 3) and res3.spend.shape == (3,)
    # total-sales sd over 3 periods with a constant plan: the same problem scaled
    mean, var = model3.moments(res3.spend, h=3)
    assert res3.sd == pytest.approx(math.sqrt(float(var)), rel=1e-6)
    assert res3.sd <= 12.0 * (1 + 1e-6)
    assert res3.total_spend == pytest.approx(3 * float(res3.spend.sum()))
    assert res1.spend.shape == (3,)
    pp = allocate_budget(model3, B, max_sd=12.0, horizon=3, per_period=True, start=[B, 0, 0])
    assert pp.spend.shape == (3, 3)
    _check_constraints(pp.spend)
    assert pp.sd <= 12.0 * (1 + 1e-6)
    assert pp.mean == pytest.approx(res3.mean, rel=1e-5)


def test_float32_model_falls_back_to_its_dtype():
    a, b, v = _draws(mu=[0.5, 1.0, 0.8], sd=[0.1, 0.6, 0.3])
    model = LinearGaussianModel(a, b, v, dtype=torch.float32)
    res = allocate_budget(model, B, max_sd=5.0)
    assert res.sd <= 5.0 * (1 + 1e-4)
    ref = allocate_budget(LinearGaussianModel(a, b, v), B, max_sd=5.0)
    assert res.mean == pytest.approx(ref.mean, rel=1e-4)


# ----------------------------------------------------------------------------------------
# Pareto frontier


def test_pareto_frontier(model3):
    front = pareto_frontier(model3, B, num_points=8)
    assert isinstance(front, ParetoFrontier)
    n = front.sd.shape[0]
    assert n == 8 and front.spend.shape == (8, 3) and front.mean.shape == (8,)
    assert (front.mean[1:] >= front.mean[:-1] - 1e-9).all()
    assert (front.sd[1:] >= front.sd[:-1] - 1e-9).all()
    assert (front.sd <= front.max_sd * (1 + 1e-6)).all()
    _check_constraints(front.spend)
    mean, var = model3.moments(front.spend)
    torch.testing.assert_close(front.mean, mean, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(front.sd, var.sqrt(), rtol=1e-6, atol=1e-9)
    # endpoints: the max-mean allocation, and the minimum-variance one (no spend here,
    # since every channel adds parameter risk)
    top = allocate_budget(model3, B)
    torch.testing.assert_close(front.spend[-1], top.spend, atol=1e-5, rtol=0)
    assert float(front.mean[-1]) == pytest.approx(top.mean, rel=1e-9)
    grid = _simplex_grid(3, 40)
    assert float(front.sd[0]) <= float(model3.moments(grid)[1].sqrt().min()) + 1e-9
    with pytest.raises(InfeasibleAllocationError):
        allocate_budget(model3, B, max_sd=float(front.sd[0]) * 0.99)
    low = allocate_budget(model3, B, max_sd=float(front.sd[0]) * (1 + 1e-6))
    # (the mean rises steeply as the cap is loosened above the minimum sd)
    assert float(front.mean[0]) - 1e-6 <= low.mean <= float(front.mean[0]) + 0.02
    # interior points agree with direct solves
    j = 4
    direct = allocate_budget(model3, B, max_sd=float(front.max_sd[j]))
    assert float(front.mean[j]) == pytest.approx(direct.mean, rel=1e-6)
    assert len(front.rows()) == 8


def test_pareto_frontier_with_exact_budget_and_bounds(model3):
    bounds = [[1.0, 8.0], [0.0, 6.0], [0.0, 8.0]]
    front = pareto_frontier(model3, B, num_points=6, bounds=bounds, exact_budget=True)
    assert (front.mean[1:] >= front.mean[:-1] - 1e-9).all()
    _check_constraints(front.spend, bounds=bounds)
    torch.testing.assert_close(
        front.spend.sum(-1), torch.full((6,), B, dtype=torch.float64), atol=1e-6, rtol=0
    )
    # min-variance endpoint against a brute-force grid over the (bounded) simplex
    grid = _simplex_grid(3, 100, exact=True)
    lo, hi = torch.tensor(bounds, dtype=torch.float64).T
    grid = grid[((grid >= lo) & (grid <= hi)).all(1)]
    assert float(front.sd[0]) <= float(model3.moments(grid)[1].sqrt().min()) + 1e-9
    assert float(front.mean[-1]) >= float(model3.moments(grid)[0].max()) - 1e-9


# ----------------------------------------------------------------------------------------
# Monte Carlo moments


@pytest.mark.parametrize("differentiable", [True, False])
def test_monte_carlo_agrees_with_exact(differentiable):
    a, b, v = _draws(mu=[0.5, 1.0, 0.8], sd=[0.1, 0.6, 0.3], num_draws=200)
    model = LinearGaussianModel(a, b, v, differentiable_samples=differentiable)
    exact = allocate_budget(model, B, max_sd=4.0)
    mc = allocate_budget(
        model, B, max_sd=4.0, method="monte_carlo", num_samples=20000, start=[B, 0.0, 0.0]
    )
    assert mc.method == "monte_carlo"
    assert mc.sd <= 4.0 * (1 + 1e-6)  # the constraint holds for the MC estimate
    torch.testing.assert_close(mc.spend, exact.spend, atol=0.6, rtol=0)
    assert mc.mean == pytest.approx(exact.mean, abs=0.3)
    true_mean, true_var = model.moments(mc.spend)
    assert math.sqrt(float(true_var)) <= 4.0 * 1.05


# ----------------------------------------------------------------------------------------
# discrete strategies


class MomentModel:
    """Single-draw test double whose mean is ``u_0`` and sd is ``u_1`` (for hand examples)."""

    num_channels = 2
    channel_names = ["mean", "sd"]

    def sales_moments(self, spend_future, covariates_future=None):
        u = spend_future[0]
        return u[0].reshape(1), u[1].pow(2).reshape(1)


def test_evaluate_strategies_drops_dominated():
    candidates = torch.tensor(
        [
            [3.0, 1.0],  # 0: non-dominated
            [3.0, 2.0],  # 1: dominated by 0 (same mean, more risk)
            [2.0, 1.0],  # 2: dominated by 0 (less mean, same risk)
            [4.0, 3.0],  # 3: non-dominated
            [1.0, 0.5],  # 4: non-dominated (least risk)
            [4.0, 3.0],  # 5: duplicate of 3: neither dominates the other
            [3.5, 3.5],  # 6: dominated by 3
        ]
    )
    ev = evaluate_strategies(MomentModel(), candidates)
    torch.testing.assert_close(ev.mean, candidates[:, 0].double())
    torch.testing.assert_close(ev.sd, candidates[:, 1].double())
    assert ev.non_dominated.tolist() == [True, False, False, True, True, True, False]
    assert ev.pareto_indices.tolist() == [4, 0, 3, 5]
    assert non_dominated([1.0, 2.0], [1.0, 1.0]).tolist() == [False, True]


def test_evaluate_strategies_on_bsts_double(model3):
    cands = torch.tensor(
        [[0.0, B, 0.0], [B, 0.0, 0.0], [0.0, 0.0, B], [0.0, 0.0, 0.0], [2.0, 2.0, 2.0]],
        dtype=torch.float64,
    )
    ev = evaluate_strategies(model3, cands, horizon=2)
    mean, var = model3.moments(cands, h=2)
    torch.testing.assert_close(ev.mean, mean)
    torch.testing.assert_close(ev.sd, var.sqrt())
    # per-period plans of shape (s, h, k) give the same answer for constant plans
    ev2 = evaluate_strategies(model3, cands[:, None, :].expand(5, 2, 3))
    torch.testing.assert_close(ev2.mean, ev.mean)
    mc = evaluate_strategies(model3, cands, method="monte_carlo", num_samples=20000)
    mean1, var1 = model3.moments(cands)
    torch.testing.assert_close(mc.mean, mean1, atol=0.2, rtol=0)
    torch.testing.assert_close(mc.sd, var1.sqrt(), rtol=0.05, atol=0.05)
    # the optimal allocation at each candidate's risk level is at least as good
    ev1 = evaluate_strategies(model3, cands)
    for m, s in zip(ev1.mean, ev1.sd):
        assert allocate_budget(model3, B, max_sd=float(s)).mean >= float(m) - 1e-6


# ----------------------------------------------------------------------------------------
# input validation


def test_bad_inputs_name_the_argument(model3):
    with pytest.raises(ValueError, match="budget"):
        allocate_budget(model3, -1.0)
    with pytest.raises(ValueError, match="bounds must have shape"):
        allocate_budget(model3, B, bounds=[[0.0, 1.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="lower bound exceeds upper"):
        allocate_budget(model3, B, bounds=[[2.0, 1.0], [0.0, 1.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="non-negative"):
        allocate_budget(model3, B, bounds=[[-1.0, 1.0], [0.0, 1.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="mutually exclusive"):
        allocate_budget(model3, B, max_sd=1.0, risk_aversion=1.0)
    with pytest.raises(ValueError, match="max_sd"):
        allocate_budget(model3, B, max_sd=-1.0)
    with pytest.raises(ValueError, match="risk_aversion"):
        allocate_budget(model3, B, risk_aversion=-1.0)
    with pytest.raises(ValueError, match="method"):
        allocate_budget(model3, B, method="grid")
    with pytest.raises(ValueError, match="horizon"):
        allocate_budget(model3, B, horizon=0)
    with pytest.raises(ValueError, match="start"):
        allocate_budget(model3, B, start=[-1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="start"):
        allocate_budget(model3, B, start=[1.0, 0.0])
    with pytest.raises(ValueError, match="num_points"):
        pareto_frontier(model3, B, num_points=0)
    with pytest.raises(ValueError, match="candidates"):
        evaluate_strategies(model3, [[1.0, -1.0, 0.0]])
    with pytest.raises(ValueError, match="candidates"):
        evaluate_strategies(model3, [[1.0, 1.0]])
    with pytest.raises(ValueError, match="exceed the budget"):
        evaluate_strategies(model3, [[5.0, 5.0, 5.0]], budget=B)
    with pytest.raises(ValueError, match="budget must be a finite number >= 0, got inf"):
        allocate_budget(model3, float("inf"))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda m: allocate_budget(m, "10"), "budget must be a finite number >= 0"),
        (lambda m: allocate_budget(m, True), "budget must be a finite number >= 0"),
        (lambda m: allocate_budget(m, B, horizon=2.0), "horizon must be an integer >= 1"),
        (lambda m: allocate_budget(m, B, method=None), "method must be a string"),
        (lambda m: allocate_budget(m, B, max_sd="1"), "max_sd must be a finite number > 0"),
        (
            lambda m: allocate_budget(m, B, risk_aversion=[1.0]),
            "risk_aversion must be a finite number >= 0",
        ),
        (
            lambda m: allocate_budget(m, B, method="monte_carlo", num_samples=10.0),
            "num_samples must be an integer >= 1 or None",
        ),
        (lambda m: pareto_frontier(m, B, num_points=1.5), "num_points must be an integer >= 1"),
        (
            lambda m: evaluate_strategies(m, [[1.0, 1.0, 1.0]], budget="x"),
            "budget must be a finite number >= 0",
        ),
    ],
)
def test_wrong_types_are_type_errors(model3, call, match):
    with pytest.raises(TypeError, match=match):
        call(model3)


def test_one_element_tensor_budget_is_accepted(model3):
    assert allocate_budget(model3, torch.tensor(B)).spend.sum() <= B * (1 + 1e-6)


def test_zero_budget(model3):
    res = allocate_budget(model3, 0.0, max_sd=10.0)
    torch.testing.assert_close(res.spend, torch.zeros(3, dtype=torch.float64))


class LaggedModel(LinearGaussianModel):
    """Spend acts with a one-period lag: over a one-period horizon it has no effect."""

    def sales_moments(self, spend_future, covariates_future=None):
        lagged = torch.cat([torch.zeros_like(spend_future[:1]), spend_future[:-1]])
        return super().sales_moments(lagged, covariates_future)


def test_spend_without_effect_is_reported(model3):
    lagged = LaggedModel(model3.a, model3.b, model3.v)
    res = allocate_budget(lagged, B)
    assert "do not depend on the spend" in res.message
    res2 = allocate_budget(lagged, B, horizon=2, start=[B, 0.0, 0.0])
    assert "do not depend" not in res2.message
    torch.testing.assert_close(
        res2.spend, torch.tensor([0.0, B, 0.0], dtype=torch.float64), atol=1e-5, rtol=0
    )
    assert pareto_frontier(lagged, B, num_points=5).sd.shape == (1,)
    start = torch.tensor([1.0, 2.0, 3.0])
    torch.testing.assert_close(allocate_budget(lagged, B, start=start).spend, start.double())
