"""Risk-constrained allocation of a marketing budget from a fitted retail BSTS.

Thesis section 1.2.4 ("Budget allocation. Model-based solutions") turns the Nerlove-Arrow
structural time-series model into a decision-support tool: choose next period's spend
``u = (u_1, ..., u_k)`` over the ``k`` advertising channels to

    maximise   E[y | data, x, u]
    subject to sum_i u_i <= b   and   Var[y | data, x, u] <= sigma^2,

or, alternatively, maximise the "lower quantile" ``E[y] - lambda * sd[y]``. Sweeping
``sigma`` traces a one-dimensional curve of Pareto-optimal strategies in the risk-return
plane, and a small set of hand-made candidate strategies can be screened by discarding the
dominated ones. Over a horizon of ``h > 1`` periods the two objectives are the mean and the
standard deviation of *total* sales over ``t+1, ..., t+h``.

Public API
----------
* :func:`allocate_budget` -- one optimal allocation (max mean, max mean under an ``sd``
  cap, or max ``mean - lambda * sd``); returns an :class:`AllocationResult`.
* :func:`pareto_frontier` -- the risk-return frontier from the minimum-variance
  allocation to the maximum-mean one; returns a :class:`ParetoFrontier`.
* :func:`evaluate_strategies` -- mean / sd of user-supplied candidate allocations and a
  mask of the non-dominated ones; returns a :class:`StrategyEvaluation`.

Model interface (duck-typed)
----------------------------
The functions only need a *fitted* model exposing

* ``model.sales_moments(spend_future, covariates_future=None) -> (means, variances)``:
  ``spend_future`` is an ``(h, k)`` tensor of per-period spends; ``means`` and
  ``variances`` are ``(num_draws,)`` tensors with, per posterior draw, the predictive mean
  and variance of total sales over the ``h`` periods, differentiable w.r.t.
  ``spend_future``. The posterior-predictive moments are combined by the law of total
  variance: ``mean = E_s[means_s]``, ``var = E_s[variances_s] + Var_s[means_s]`` -- so the
  risk depends on the allocation through parameter uncertainty. Used by
  ``method="exact"``.
* ``model.sample_sales(spend_future, covariates_future=None, num_samples=N)`` -> a 1-D
  tensor of Monte Carlo draws of total sales over the horizon. Used by
  ``method="monte_carlo"`` (non-Gaussian innovations). ``num_samples`` is forwarded
  as-is (whether it counts all draws or draws per posterior draw is the model's
  convention; ``None`` leaves the model's default). Every evaluation re-seeds the torch
  generator with the same ``seed`` (common random numbers), so the estimated mean and sd
  are smooth, deterministic functions of the spend. Gradients are taken by autograd when
  the draws carry a graph back to ``spend_future`` (reparameterised draws) and by central
  finite differences otherwise.
* ``model.num_channels`` (``k``) and optionally ``model.channel_names`` (list of ``k``
  strings), ``model.dtype`` and ``model.device`` (default: float64 when the model accepts
  it, else the torch default dtype; CPU), and ``model.spend_lag`` (default 0): when spend
  acts on sales ``lag`` periods later (eq. 1.4), the sales counted are those of the
  ``h + lag`` periods that the plan reaches, with zero spend after the plan (and the last
  row of ``covariates_future`` repeated).

Conventions
-----------
* ``budget`` is the budget **per period**. By default the constraint is the thesis'
  ``sum_i u_i <= budget`` (leaving money unspent is allowed, which matters when a channel
  has a negative expected return); ``exact_budget=True`` imposes ``sum_i u_i == budget``.
* Spend is non-negative; ``bounds`` is an optional ``(k, 2)`` array of per-channel
  ``[lower, upper]`` spends per period (``upper`` may be ``inf``), default ``[0, budget]``.
* By default the plan is constant over the horizon: ``result.spend`` is the ``(k,)``
  per-period spend and ``result.plan`` the ``(h, k)`` matrix passed to the model. With
  ``per_period=True`` every period gets its own allocation (each period's spend obeys the
  budget and bounds); then ``result.spend`` is the ``(h, k)`` plan as well.
* Infeasible problems raise :class:`InfeasibleAllocationError` (a :class:`ValueError`)
  whose message says which constraint cannot be met (bounds vs. budget, or ``max_sd``
  below the minimum achievable sd, which is reported). Returned results are always
  feasible (``result.feasible`` is ``True``); ``result.converged`` reports whether the
  local solver converged from the start that produced the returned point.

Solver
------
With exact moments the problem is smooth over a box-plus-budget polytope (and convex for a
linear-Gaussian response). Each sub-problem is solved by :func:`scipy.optimize.minimize`
with ``method="SLSQP"`` on rescaled variables (spend / budget, objective / a reference
sd), with gradients of the mean and variance from torch autograd, from several starts --
the user's ``start`` (projected onto the feasible set), the uniform split, the best
vertices of the polytope (whole remaining budget on one channel) and, for risk-constrained
problems, the minimum-variance allocation -- keeping the best feasible end point. So a poor
start (e.g. an extreme corner) does not trap the solution. For a ``max_sd`` constraint the
minimum-variance problem is solved first: it decides feasibility and supplies a feasible
start; if the unconstrained max-mean solution already meets the cap it is returned.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
from scipy.optimize import minimize

from ...ops.validation import check_choice, check_int, check_positive, check_real

__all__ = [
    "AllocationResult",
    "InfeasibleAllocationError",
    "ParetoFrontier",
    "StrategyEvaluation",
    "allocate_budget",
    "evaluate_strategies",
    "non_dominated",
    "pareto_frontier",
]

_METHODS = ("exact", "monte_carlo")
_SD_RTOL = 1e-6  # relative slack accepted on the sd cap
_BUDGET_RTOL = 1e-9


class InfeasibleAllocationError(ValueError):
    """The allocation problem has no feasible solution (the message says why)."""


@dataclass
class AllocationResult:
    """An optimal allocation and the predictive moments of total sales it produces.

    ``spend`` is the per-period spend, ``(k,)`` (or ``(h, k)`` for per-period plans);
    ``plan`` is the ``(h, k)`` spend matrix over the horizon; ``mean`` and ``sd`` are the
    posterior-predictive mean and standard deviation of total sales over the horizon.
    """

    spend: torch.Tensor
    plan: torch.Tensor
    mean: float
    sd: float
    objective: float
    feasible: bool
    converged: bool
    status: str
    message: str
    channel_names: list = field(default_factory=list)
    horizon: int = 1
    budget: float = 0.0
    max_sd: float | None = None
    risk_aversion: float | None = None
    method: str = "exact"

    @property
    def total_spend(self) -> float:
        """Total spend over the whole horizon."""
        return float(self.plan.sum())

    def as_dict(self) -> dict:
        """Per-channel per-period spend keyed by channel name (constant plans only)."""
        spend = self.spend if self.spend.dim() == 1 else self.plan.mean(0)
        return {name: float(v) for name, v in zip(self.channel_names, spend)}


class ParetoFrontier(NamedTuple):
    """Risk-return frontier: row ``j`` is the best allocation with ``sd <= max_sd[j]``.

    ``sd`` and ``mean`` are ``(n,)``, ``spend`` is ``(n, k)`` (``(n, h, k)`` for per-period
    plans); rows go from the minimum-variance allocation to the maximum-mean one, with
    ``mean`` non-decreasing.
    """

    max_sd: torch.Tensor
    sd: torch.Tensor
    mean: torch.Tensor
    spend: torch.Tensor
    channel_names: list

    def rows(self) -> list:
        """The frontier as a list of ``(sd, mean, spend)`` tuples."""
        return [(float(s), float(m), u) for s, m, u in zip(self.sd, self.mean, self.spend)]


class StrategyEvaluation(NamedTuple):
    """Moments of candidate strategies and which of them are Pareto optimal."""

    mean: torch.Tensor
    sd: torch.Tensor
    non_dominated: torch.Tensor

    @property
    def pareto_indices(self) -> torch.Tensor:
        """Indices of the non-dominated candidates, by increasing sd."""
        idx = torch.nonzero(self.non_dominated).reshape(-1)
        return idx[torch.argsort(self.sd[idx], stable=True)]


# ----------------------------------------------------------------------------------------
# input validation


def _item(value):
    """A one-element tensor as its Python number, for the scalar checks; else ``value``."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return value


def _num_channels(model):
    k = getattr(model, "num_channels", None)
    if k is None:
        raise TypeError("model must expose `num_channels` (the number of advertising channels)")
    return check_int(int(k), "model.num_channels", low=1)


def _channel_names(model, k):
    names = getattr(model, "channel_names", None)
    if names is None or len(names) != k:
        return [f"channel_{i}" for i in range(k)]
    return [str(n) for n in names]


def _as_numpy(x, name):
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().to(torch.float64).numpy()
    try:
        return np.array(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an array of numbers") from None


def _check_bounds(bounds, k, budget):
    """Return ``(lo, hi)`` arrays of shape ``(k,)`` with ``hi`` capped at the budget."""
    if bounds is None:
        lo = np.zeros(k)
        hi = np.full(k, budget)
    else:
        b = _as_numpy(bounds, "bounds")
        if b.shape != (k, 2):
            raise ValueError(
                f"bounds must have shape (num_channels, 2) = ({k}, 2) of [lower, upper] "
                f"spends, got shape {b.shape}"
            )
        lo, hi = b[:, 0].copy(), b[:, 1].copy()
        if np.isnan(b).any() or np.isinf(lo).any():
            raise ValueError("bounds must not contain NaN, and lower bounds must be finite")
        if (lo < 0).any():
            raise ValueError(f"bounds: lower bounds must be non-negative (spend >= 0), got {lo}")
        if (lo > hi).any():
            bad = np.nonzero(lo > hi)[0].tolist()
            raise ValueError(f"bounds: lower bound exceeds upper bound for channel(s) {bad}")
        hi = np.minimum(hi, budget)
    return lo, hi


def _check_feasible_box(lo, hi, budget, exact_budget):
    if lo.sum() > budget * (1 + _BUDGET_RTOL) + 1e-12:
        raise InfeasibleAllocationError(
            f"infeasible: the per-channel lower bounds sum to {lo.sum():.6g}, more than the "
            f"budget {budget:.6g}"
        )
    if exact_budget and hi.sum() < budget * (1 - _BUDGET_RTOL) - 1e-12:
        raise InfeasibleAllocationError(
            f"infeasible: exact_budget=True but the per-channel upper bounds only allow a "
            f"total spend of {hi.sum():.6g} < budget {budget:.6g}"
        )


# ----------------------------------------------------------------------------------------
# moment evaluation


class _Evaluator:
    """Posterior-predictive mean / variance of total sales and their gradients.

    Works in float64 numpy on the flattened ``(P, k)`` plan (``P = 1`` for plans constant
    over the horizon, ``P = h`` otherwise) and caches the last point, since SLSQP asks for
    the objective, the constraints and their Jacobians at the same point separately.
    """

    def __init__(
        self, model, k, horizon, per_period, covariates_future, method, num_samples, seed, fd_step
    ):
        self.model = model
        self.k = k
        self.h = horizon
        self.P = horizon if per_period else 1
        self.lag = int(getattr(model, "spend_lag", 0) or 0)
        if covariates_future is not None and self.lag:
            cov = torch.as_tensor(covariates_future)
            covariates_future = torch.cat([cov, cov[-1:].expand(self.lag, cov.shape[-1])])
        self.cov = covariates_future
        self.method = method
        self.num_samples = num_samples
        self.seed = seed
        self.fd_step = fd_step
        device = getattr(model, "device", None)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        dtype = getattr(model, "dtype", None)
        self.dtype = dtype if isinstance(dtype, torch.dtype) else None
        self._cache_key = None
        self._cache = None
        self._values = {}

    def plan(self, x, dtype=None):
        """The ``(h, k)`` spend matrix for the flat vector ``x`` (a float64 tensor on the
        model's device)."""
        u = torch.as_tensor(
            np.asarray(x, dtype=np.float64).reshape(self.P, self.k),
            dtype=dtype or torch.float64,
            device=self.device,
        )
        return u.expand(self.h, self.k).clone() if self.P == 1 else u

    def _with_lag(self, plan):
        # Spend acting with a lag (``model.spend_lag`` periods, eq. 1.4) reaches sales up to
        # ``lag`` periods after the plan ends: those sales count too, and the spend of the
        # periods after the plan is zero.
        if not self.lag:
            return plan
        return torch.cat([plan, plan.new_zeros(self.lag, plan.shape[-1])])

    def _moments(self, x, requires_grad):
        dtype = self.dtype or torch.float64
        u = torch.as_tensor(
            np.asarray(x, dtype=np.float64).reshape(self.P, self.k), dtype=dtype, device=self.device
        )
        u.requires_grad_(requires_grad)
        plan = self._with_lag(u.expand(self.h, self.k) if self.P == 1 else u)
        if self.method == "exact":
            means, variances = self.model.sales_moments(plan, self.cov)
            means = means.reshape(-1).to(torch.float64)
            variances = variances.reshape(-1).to(torch.float64)
            mean = means.mean()
            # law of total variance, written without the E[m^2] - E[m]^2 cancellation
            var = variances.mean() + (means - mean).pow(2).mean()
        else:
            devices = [self.device] if self.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(self.seed)
                kw = {} if self.num_samples is None else {"num_samples": self.num_samples}
                draws = self.model.sample_sales(plan, self.cov, **kw)
            draws = draws.reshape(-1).to(torch.float64)
            mean = draws.mean()
            var = (draws - mean).pow(2).mean()
        return u, mean, var

    def _safe_moments(self, x, requires_grad):
        if self.dtype is None:
            # prefer float64 for accurate gradients; fall back to the default dtype if the
            # model refuses to mix its float32 parameters with a float64 spend
            try:
                out = self._moments(x, requires_grad)
                self.dtype = torch.float64
                return out
            except RuntimeError:
                self.dtype = torch.get_default_dtype()
        return self._moments(x, requires_grad)

    def values(self, x):
        """``(mean, var)`` as floats (memoised: model calls can be expensive)."""
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        key = x.tobytes()
        if key == self._cache_key:
            return self._cache[:2]
        if key in self._values:
            return self._values[key]
        out = self._values_uncached(x)
        if len(self._values) > 10000:
            self._values.clear()
        self._values[key] = out
        return out

    def _values_uncached(self, x):
        with torch.no_grad():
            _, mean, var = self._safe_moments(x, False)
        mean, var = float(mean), float(var)
        if not (math.isfinite(mean) and math.isfinite(var)):
            raise FloatingPointError(f"the model returned non-finite sales moments at {x}")
        return mean, max(var, 0.0)

    def __call__(self, x):
        """``(mean, var, grad_mean, grad_var)`` in float64 numpy (cached)."""
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        key = x.tobytes()
        if key == self._cache_key:
            return self._cache
        with torch.enable_grad():
            u, mean, var = self._safe_moments(x, True)
            if mean.requires_grad and var.requires_grad:
                (gm,) = torch.autograd.grad(mean, u, retain_graph=True, allow_unused=True)
                (gv,) = torch.autograd.grad(var, u, allow_unused=True)
            else:
                gm = gv = None
        mean_f, var_f = float(mean.detach()), max(float(var.detach()), 0.0)
        if not (math.isfinite(mean_f) and math.isfinite(var_f)):
            raise FloatingPointError(f"the model returned non-finite sales moments at {x}")
        if gm is None and gv is None:
            gm, gv = self._finite_differences(x)
        else:
            gm = np.zeros_like(x) if gm is None else gm.detach().cpu().double().numpy().ravel()
            gv = np.zeros_like(x) if gv is None else gv.detach().cpu().double().numpy().ravel()
        out = (mean_f, var_f, gm, gv)
        self._cache_key, self._cache = key, out
        return out

    def _finite_differences(self, x):
        # central differences (forward at the zero-spend boundary) with common random numbers
        step = self.fd_step
        gm = np.zeros_like(x)
        gv = np.zeros_like(x)
        m0 = v0 = None
        for i in range(x.size):
            xp = x.copy()
            xp[i] += step
            mp, vp = self.values(xp)
            if x[i] - step >= 0:
                xm = x.copy()
                xm[i] -= step
                mm, vm = self.values(xm)
                gm[i], gv[i] = (mp - mm) / (2 * step), (vp - vm) / (2 * step)
            else:
                if m0 is None:
                    m0, v0 = self.values(x)
                gm[i], gv[i] = (mp - m0) / step, (vp - v0) / step
        return gm, gv


# ----------------------------------------------------------------------------------------
# the optimisation problem over the box + budget polytope


def _project_row(x, lo, hi, budget, exact):
    """Euclidean projection of ``x`` onto ``{lo <= u <= hi, sum(u) <= budget}`` (or ``==``)."""
    y = np.clip(x, lo, hi)
    s = y.sum()
    if (not exact and s <= budget) or abs(s - budget) <= 1e-14 * max(budget, 1.0):
        return y
    # u(tau) = clip(x - tau, lo, hi) has a sum that is non-increasing in tau: bisect
    a, b = (x - hi).min() - 1.0, (x - lo).max() + 1.0
    if not exact:
        a = 0.0
    for _ in range(200):
        tau = 0.5 * (a + b)
        if np.clip(x - tau, lo, hi).sum() > budget:
            a = tau
        else:
            b = tau
    y = np.clip(x - 0.5 * (a + b), lo, hi)
    return y


class _Problem:
    def __init__(self, ev, lo, hi, budget, exact_budget):
        self.ev = ev
        self.k = ev.k
        self.P = ev.P
        self.lo, self.hi = lo, hi
        self.budget = budget
        self.exact = exact_budget
        self.scale = budget if budget > 0 else 1.0
        self.zbounds = list(zip(np.tile(lo, self.P) / self.scale, np.tile(hi, self.P) / self.scale))
        rows = np.zeros((self.P, self.P * self.k))
        for p in range(self.P):
            rows[p, p * self.k : (p + 1) * self.k] = 1.0
        self.budget_rows = rows
        self.flat = False  # sales moments do not depend on the spend at all
        self.fs = 1.0  # objective scale (sales)
        self.vs = 1.0  # variance scale

    # feasible points -------------------------------------------------------------------
    def project(self, x):
        x = np.asarray(x, dtype=np.float64).reshape(self.P, self.k)
        return np.concatenate(
            [_project_row(r, self.lo, self.hi, self.budget, self.exact) for r in x]
        )

    def uniform(self):
        return self.project(np.full(self.P * self.k, self.budget / self.k))

    def vertices(self):
        """For each channel: lower bounds plus as much of the remaining budget as it takes."""
        out = []
        for i in range(self.k):
            u = self.lo.copy()
            rest = self.budget - u.sum()
            order = [i] + [j for j in range(self.k) if j != i]
            for j in order if self.exact else [i]:
                add = min(rest, self.hi[j] - u[j])
                u[j] += add
                rest -= add
            out.append(np.tile(u, self.P))
        if not self.exact:
            out.append(np.tile(self.lo.copy(), self.P))
        return out

    def set_scales(self, points):
        vals = [self.ev.values(x) for x in points]
        means = np.array([m for m, _ in vals])
        vars_ = np.array([v for _, v in vals])
        tiny = 1e-12 * max(1.0, float(np.abs(means).max()))
        self.flat = bool(
            np.ptp(means) <= 1e-12 * max(1.0, float(np.abs(means).max()))
            and np.ptp(vars_) <= 1e-12 * max(1e-300, float(vars_.max()))
        )
        self.fs = max(float(means.max() - means.min()), float(np.sqrt(vars_.max())), tiny)
        self.vs = max(float(vars_.max()), tiny**2, 1e-300)

    # objectives --------------------------------------------------------------------------
    def _objective(self, kind, p):
        ev, s, fs, vs = self.ev, self.scale, self.fs, self.vs
        if kind in ("max_mean", "max_mean_sd"):

            def f(z):
                m, v, gm, gv = ev(z * s)
                return -m / fs, -gm * s / fs
        elif kind in ("min_var", "min_var_mean"):

            def f(z):
                m, v, gm, gv = ev(z * s)
                return v / vs, gv * s / vs
        elif kind == "risk":
            lam = p["risk_aversion"]

            def f(z):
                m, v, gm, gv = ev(z * s)
                sd = math.sqrt(max(v, 1e-300))
                return -(m - lam * sd) / fs, -(gm - lam * gv / (2 * sd)) * s / fs
        else:  # pragma: no cover
            raise AssertionError(kind)
        return f

    def _merit(self, kind, p, m, v):
        """Objective value to minimise (un-scaled) for comparing end points."""
        if kind in ("max_mean", "max_mean_sd"):
            return -m
        if kind in ("min_var", "min_var_mean"):
            return v
        return -(m - p["risk_aversion"] * math.sqrt(v))

    def _is_feasible(self, kind, p, m, v):
        if kind == "max_mean_sd":
            return math.sqrt(v) <= p["max_sd"] * (1 + _SD_RTOL) + 1e-300
        if kind == "min_var_mean":
            return m >= p["min_mean"] - 1e-9 * self.fs
        return True

    def _constraints(self, kind, p):
        cons = []
        ev, s = self.ev, self.scale
        A = self.budget_rows
        cons.append(
            {
                "type": "eq" if self.exact else "ineq",
                "fun": lambda z: 1.0 - A @ z if self.budget > 0 else -(A @ z),
                "jac": lambda z: -A,
            }
        )
        if kind == "max_mean_sd":
            c = p["max_sd"] ** 2

            def g(z):
                return 1.0 - ev(z * s)[1] / c

            def gj(z):
                return (-ev(z * s)[3] * s / c)[None, :]

            cons.append({"type": "ineq", "fun": g, "jac": gj})
        elif kind == "min_var_mean":
            target, fs = p["min_mean"], self.fs

            def g(z):
                return (ev(z * s)[0] - target) / fs

            def gj(z):
                return (ev(z * s)[2] * s / fs)[None, :]

            cons.append({"type": "ineq", "fun": g, "jac": gj})
        return cons

    def solve(self, kind, starts, maxiter=200, **p):
        """Best feasible end point of SLSQP over ``starts``: ``(x, mean, var, converged)``."""
        f = self._objective(kind, p)
        cons = self._constraints(kind, p)
        best = None
        seen = []
        agreed = 0  # successful runs that ended at the incumbent
        for x0 in starts:
            if agreed >= 2:
                break  # two starts converged to the same point: accept it
            x0 = self.project(x0)
            if any(np.allclose(x0, y, rtol=0, atol=1e-9 * self.scale) for y in seen):
                continue
            seen.append(x0)
            candidates = [(x0, False)]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                try:
                    res = minimize(
                        f,
                        x0 / self.scale,
                        jac=True,
                        method="SLSQP",
                        bounds=self.zbounds,
                        constraints=cons,
                        options={"maxiter": maxiter, "ftol": 1e-12},
                    )
                    candidates.insert(0, (self.project(res.x * self.scale), bool(res.success)))
                except (ValueError, FloatingPointError, np.linalg.LinAlgError):
                    pass  # a failed solve leaves the (projected) start as the candidate
            for x, ok in candidates:
                m, v = self.ev.values(x)
                if not self._is_feasible(kind, p, m, v):
                    continue
                merit = self._merit(kind, p, m, v)
                if best is None or merit < best[0] - 1e-12 * (abs(best[0]) + self.fs):
                    same = best is not None and np.allclose(
                        x, best[1], rtol=0, atol=1e-4 * self.scale
                    )
                    best = (merit, x, m, v, ok)
                    agreed = agreed + 1 if (same and ok) else int(ok)
                elif ok and np.allclose(x, best[1], rtol=0, atol=1e-4 * self.scale):
                    agreed += 1
                break  # the SLSQP end point was feasible: do not fall back to the start
        if best is None:
            return None
        _, x, m, v, ok = best
        return x, m, v, ok


# ----------------------------------------------------------------------------------------
# public API


def _setup(
    model,
    budget,
    bounds,
    horizon,
    covariates_future,
    method,
    exact_budget,
    per_period,
    num_samples,
    seed,
):
    budget = check_real(_item(budget), "budget", low=0)
    horizon = check_int(horizon, "horizon", low=1)
    check_choice(method, "method", _METHODS)
    num_samples = check_int(num_samples, "num_samples", low=1, allow_none=True)
    if method == "exact" and not callable(getattr(model, "sales_moments", None)):
        raise TypeError("method='exact' needs a model with a `sales_moments` method")
    if method == "monte_carlo" and not callable(getattr(model, "sample_sales", None)):
        raise TypeError("method='monte_carlo' needs a model with a `sample_sales` method")
    k = _num_channels(model)
    lo, hi = _check_bounds(bounds, k, budget)
    _check_feasible_box(lo, hi, budget, exact_budget)
    ev = _Evaluator(
        model,
        k,
        horizon,
        per_period,
        covariates_future,
        method,
        num_samples,
        int(seed),
        fd_step=1e-4 * (budget if budget > 0 else 1.0),
    )
    prob = _Problem(ev, lo, hi, budget, bool(exact_budget))
    return prob, _channel_names(model, k), budget, horizon


def _check_start(start, prob):
    if start is None:
        return None
    x = _as_numpy(start, "start")
    if x.size not in (prob.k, prob.P * prob.k) or x.shape[-1] != prob.k:
        raise ValueError(
            f"start must have shape ({prob.k},) or ({prob.P}, {prob.k}), got {x.shape}"
        )
    if not np.isfinite(x).all() or (x < 0).any():
        raise ValueError("start must contain finite non-negative spends")
    return np.tile(x.reshape(-1), prob.P * prob.k // x.size)


def _starts(prob, kind, user_start, extra=(), num_vertices=3, **p):
    """Candidate starting points: extra, user start, uniform split, best vertices."""
    starts = [x for x in extra if x is not None]
    if user_start is not None:
        starts.append(user_start)
    starts.append(prob.uniform())
    verts = prob.vertices()
    scored = []
    for x in verts:
        m, v = prob.ev.values(x)
        feas = prob._is_feasible(kind, p, m, v)
        scored.append((not feas, prob._merit(kind, p, m, v), len(scored), x))
    scored.sort(key=lambda t: t[:3])
    starts.extend(t[3] for t in scored[:num_vertices])
    return starts


def _result(prob, x, m, v, ok, names, budget, horizon, method, max_sd, lam, status, msg):
    plan = prob.ev.plan(x)
    spend = plan[0].clone() if prob.P == 1 else plan.clone()
    sd = math.sqrt(v)
    obj = m if lam is None else m - lam * sd
    if prob.flat:
        msg += (
            "; note: the predicted sales do not depend on the spend over this horizon "
            "(e.g. spend acts with a lag >= horizon), so every allocation is optimal"
        )
    return AllocationResult(
        spend=spend,
        plan=plan,
        mean=m,
        sd=sd,
        objective=obj,
        feasible=True,
        converged=ok,
        status=status,
        message=msg,
        channel_names=names,
        horizon=horizon,
        budget=budget,
        max_sd=max_sd,
        risk_aversion=lam,
        method=method,
    )


def _max_mean(prob, starts):
    """Max-mean allocation, then the least-variance one among the (near) ties."""
    x, m, v, ok = prob.solve("max_mean", starts)
    tol = 1e-9 * prob.fs
    refined = prob.solve("min_var_mean", [x], min_mean=m - tol)
    if refined is not None and refined[2] < v * (1 - 1e-6):
        x, m, v, _ = refined
    return x, m, v, ok


def _min_var(prob, starts):
    """Min-variance allocation, then the highest-mean one among the (near) ties."""
    x, m, v, ok = prob.solve("min_var", starts)
    sd_cap = math.sqrt(v) * (1 + 1e-9) + 1e-300
    refined = prob.solve("max_mean_sd", [x], max_sd=sd_cap)
    if refined is not None and refined[1] > m + 1e-6 * prob.fs:
        x, m, v, _ = refined
    return x, m, v, ok


def allocate_budget(
    model,
    budget,
    max_sd=None,
    risk_aversion=None,
    bounds=None,
    horizon=1,
    covariates_future=None,
    method="exact",
    start=None,
    num_samples=None,
    exact_budget=False,
    per_period=False,
    seed=0,
):
    """Optimal split of a per-period advertising ``budget`` across the model's channels.

    Maximises the posterior-predictive mean of total sales over the next ``horizon``
    periods subject to ``sum(spend) <= budget`` (``== budget`` with ``exact_budget``),
    ``0 <= bounds[:, 0] <= spend <= bounds[:, 1]`` and, optionally, either the risk
    constraint ``sd(total sales) <= max_sd`` or -- with ``risk_aversion=lam`` -- the
    objective ``mean - lam * sd`` (thesis section 1.2.4).

    :param model: a fitted model with the interface described in the module docstring.
    :param float budget: non-negative budget per period.
    :param float max_sd: cap on the predictive sd of total sales (mutually exclusive with
        ``risk_aversion``).
    :param float risk_aversion: ``lam >= 0`` in ``mean - lam * sd``.
    :param bounds: optional ``(k, 2)`` per-channel ``[lower, upper]`` spends per period.
    :param int horizon: number of future periods ``h``.
    :param covariates_future: passed through to the model.
    :param str method: ``"exact"`` (``sales_moments``) or ``"monte_carlo"`` (``sample_sales``
        with common random numbers: torch seed ``seed`` before every call, ``num_samples``
        forwarded to ``sample_sales`` unless ``None``).
    :param start: optional starting allocation ``(k,)`` (or ``(h, k)``); projected onto the
        feasible set and used as one of several starts.
    :param bool exact_budget: spend the whole budget (equality constraint).
    :param bool per_period: optimise a separate allocation for every period.
    :returns: :class:`AllocationResult`.
    :raises InfeasibleAllocationError: if the bounds do not fit the budget or ``max_sd`` is
        below the smallest achievable sd (the message reports it).
    :raises ValueError: on malformed arguments.
    """
    if max_sd is not None and risk_aversion is not None:
        raise ValueError("max_sd and risk_aversion are mutually exclusive: give at most one")
    if max_sd is not None:
        max_sd = check_positive(_item(max_sd), "max_sd")
    if risk_aversion is not None:
        risk_aversion = check_real(_item(risk_aversion), "risk_aversion", low=0)
    prob, names, budget, horizon = _setup(
        model,
        budget,
        bounds,
        horizon,
        covariates_future,
        method,
        exact_budget,
        per_period,
        num_samples,
        seed,
    )
    x0 = _check_start(start, prob)
    prob.set_scales([prob.uniform()] + prob.vertices())
    common = dict(
        names=names, budget=budget, horizon=horizon, method=method, max_sd=max_sd, lam=risk_aversion
    )

    if prob.flat:  # nothing to optimise: keep the user's start (projected) or the uniform split
        x = prob.project(x0) if x0 is not None else prob.uniform()
        m, v = prob.ev.values(x)
        if max_sd is not None and math.sqrt(v) > max_sd * (1 + _SD_RTOL):
            raise InfeasibleAllocationError(
                f"infeasible: max_sd={max_sd:.6g} is below the sd of total sales, "
                f"{math.sqrt(v):.6g}, which no allocation changes over this horizon"
            )
        return _result(
            prob, x, m, v, True, status="optimal", msg="no allocation is better", **common
        )

    if risk_aversion is not None:
        starts = _starts(prob, "risk", x0, risk_aversion=risk_aversion)
        x, m, v, ok = prob.solve("risk", starts, risk_aversion=risk_aversion)
        return _result(
            prob,
            x,
            m,
            v,
            ok,
            status="optimal",
            msg=f"maximised mean - {risk_aversion:g} * sd",
            **common,
        )

    mm_starts = _starts(prob, "max_mean", x0)
    if max_sd is None:
        x, m, v, ok = _max_mean(prob, mm_starts)
        return _result(
            prob, x, m, v, ok, status="optimal", msg="maximised expected sales", **common
        )

    xv, mv, vv, okv = _min_var(prob, _starts(prob, "min_var", x0))
    sd_min = math.sqrt(vv)
    if sd_min > max_sd * (1 + _SD_RTOL):
        raise InfeasibleAllocationError(
            f"infeasible: max_sd={max_sd:.6g} is below the minimum achievable sd of total "
            f"sales, {sd_min:.6g} (attained by spend {np.round(xv, 6).tolist()})"
        )
    x, m, v, ok = _max_mean(prob, mm_starts)
    if math.sqrt(v) <= max_sd * (1 + _SD_RTOL):
        return _result(
            prob,
            x,
            m,
            v,
            ok,
            status="optimal",
            msg="maximised expected sales; the sd constraint is not binding",
            **common,
        )
    starts = _starts(prob, "max_mean_sd", x0, extra=[xv, x], max_sd=max_sd)
    x, m, v, ok = prob.solve("max_mean_sd", starts, max_sd=max_sd)
    return _result(
        prob,
        x,
        m,
        v,
        ok,
        status="optimal",
        msg="maximised expected sales subject to sd <= max_sd",
        **common,
    )


def pareto_frontier(
    model,
    budget,
    num_points=20,
    bounds=None,
    horizon=1,
    covariates_future=None,
    method="exact",
    num_samples=None,
    exact_budget=False,
    per_period=False,
    seed=0,
):
    """Risk-return frontier of optimal allocations (thesis section 1.2.4).

    Solves :func:`allocate_budget` for ``num_points`` caps ``max_sd`` evenly spaced from
    the minimum achievable sd (the minimum-variance allocation, highest mean among ties) to
    the sd of the maximum-mean allocation (least variance among ties). Each solve is warm
    started from the previous frontier point; the returned means are non-decreasing (a
    point whose solve came out worse than its predecessor is replaced by the predecessor,
    which is feasible for the looser cap). If both endpoints coincide (e.g. the sales do
    not depend on the spend over the horizon), a single row is
    returned. Arguments as in :func:`allocate_budget`.

    :returns: :class:`ParetoFrontier`.
    """
    num_points = check_int(num_points, "num_points", low=1)
    prob, names, budget, horizon = _setup(
        model,
        budget,
        bounds,
        horizon,
        covariates_future,
        method,
        exact_budget,
        per_period,
        num_samples,
        seed,
    )
    prob.set_scales([prob.uniform()] + prob.vertices())
    if prob.flat:
        x = prob.uniform()
        m, v = prob.ev.values(x)
        plan = prob.ev.plan(x)
        return ParetoFrontier(
            max_sd=torch.tensor([math.sqrt(v)], dtype=torch.float64),
            sd=torch.tensor([math.sqrt(v)], dtype=torch.float64),
            mean=torch.tensor([m], dtype=torch.float64),
            spend=(plan[0] if prob.P == 1 else plan)[None],
            channel_names=names,
        )
    xv, mv, vv, _ = _min_var(prob, _starts(prob, "min_var", None))
    xm, mm, vm, _ = _max_mean(prob, _starts(prob, "max_mean", None))
    sd_lo, sd_hi = math.sqrt(vv), math.sqrt(vm)
    if mm < mv:  # cannot happen at exact optima; guard against solver noise
        xm, mm, vm, sd_hi = xv, mv, vv, sd_lo
    rows = [(sd_lo, xv, mv, vv)]
    if sd_hi > sd_lo * (1 + 1e-6) + 1e-12 * prob.fs and num_points > 1:
        caps = np.linspace(sd_lo, sd_hi, num_points)
        prev = xv
        for cap in caps[1:-1]:
            out = prob.solve("max_mean_sd", [prev, xm, xv, prob.uniform()], max_sd=float(cap))
            if out is None or out[1] < rows[-1][2]:
                x, m, v = rows[-1][1], rows[-1][2], rows[-1][3]
            else:
                x, m, v, _ = out
            rows.append((float(cap), x, m, v))
            prev = x
        rows.append((sd_hi, xm, mm, vm))
    plans = [prob.ev.plan(x) for _, x, _, _ in rows]
    spend = torch.stack([p[0] if prob.P == 1 else p for p in plans])
    dt = torch.float64
    return ParetoFrontier(
        max_sd=torch.tensor([r[0] for r in rows], dtype=dt),
        sd=torch.tensor([math.sqrt(r[3]) for r in rows], dtype=dt),
        mean=torch.tensor([r[2] for r in rows], dtype=dt),
        spend=spend,
        channel_names=names,
    )


def evaluate_strategies(
    model,
    candidates,
    horizon=1,
    covariates_future=None,
    method="exact",
    num_samples=None,
    seed=0,
    budget=None,
):
    """Predictive mean / sd of total sales for discrete candidate allocations.

    ``candidates`` is ``(s, k)`` (per-period spend, constant over ``horizon``) or
    ``(s, h, k)`` (per-period plans, then ``horizon`` is taken from it). A candidate is
    *dominated* when another has a mean at least as high and an sd at least as low, one of
    them strictly; the thesis proposes presenting the manager only the non-dominated ones.
    With ``method="monte_carlo"`` all candidates share the same random numbers.

    :param budget: optional per-period budget; a candidate spending more raises.
    :returns: :class:`StrategyEvaluation` with ``mean``, ``sd`` (``(s,)``, float64) and the
        boolean mask ``non_dominated``.
    """
    check_choice(method, "method", _METHODS)
    k = _num_channels(model)
    c = _as_numpy(candidates, "candidates")
    if c.ndim == 2 and c.shape[1] == k:
        horizon = check_int(horizon, "horizon", low=1)
        plans = np.repeat(c[:, None, :], horizon, axis=1)
    elif c.ndim == 3 and c.shape[2] == k:
        horizon = c.shape[1]
        plans = c
    else:
        raise ValueError(
            f"candidates must have shape (num_candidates, {k}) or "
            f"(num_candidates, horizon, {k}), got {c.shape}"
        )
    if c.shape[0] == 0:
        raise ValueError("candidates is empty")
    if not np.isfinite(c).all():
        raise ValueError("candidates must be finite")
    if (c < 0).any():
        bad = sorted(set(np.nonzero(c < 0)[0].tolist()))
        raise ValueError(f"candidates: spend must be non-negative (candidate(s) {bad})")
    if budget is not None:
        budget = check_real(_item(budget), "budget", low=0)
        over = np.nonzero(plans.sum(-1).max(-1) > budget * (1 + _BUDGET_RTOL) + 1e-12)[0]
        if over.size:
            raise ValueError(
                f"candidates: candidate(s) {over.tolist()} exceed the budget {budget:g}"
            )
    num_samples = check_int(num_samples, "num_samples", low=1, allow_none=True)
    ev = _Evaluator(
        model, k, horizon, True, covariates_future, method, num_samples, int(seed), fd_step=1.0
    )
    vals = [ev.values(p) for p in plans]
    mean = torch.tensor([m for m, _ in vals], dtype=torch.float64)
    sd = torch.tensor([math.sqrt(v) for _, v in vals], dtype=torch.float64)
    return StrategyEvaluation(mean=mean, sd=sd, non_dominated=non_dominated(mean, sd))


def non_dominated(mean, sd):
    """Mask of points not dominated in (maximise ``mean``, minimise ``sd``)."""
    mean = torch.as_tensor(mean, dtype=torch.float64).reshape(-1)
    sd = torch.as_tensor(sd, dtype=torch.float64).reshape(-1)
    ge = mean[:, None] >= mean[None, :]  # [j, i]: j's mean >= i's
    le = sd[:, None] <= sd[None, :]
    strict = (mean[:, None] > mean[None, :]) | (sd[:, None] < sd[None, :])
    dominated = (ge & le & strict).any(0)
    return ~dominated
