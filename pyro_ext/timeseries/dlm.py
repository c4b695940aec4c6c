r"""Dynamic linear model components and their superposition (Gallego 2021, sec. 1.2.2).

Each component ``c`` is a small state-space block ``(G_c, F_c, W_c, m_c, C_c)`` for
univariate observations.  By the superposition principle (West & Harrison, ch. 3; thesis
"Modularity and additional structure") the model ``Y_t = sum_c Y_{c,t} + v_t`` is again a
DLM (eqs. (1.2)-(1.3)) whose state stacks the component states: ``G``, ``W`` and the
initial covariance are block diagonal and ``F`` is the concatenation of the ``F_c``.
Inference is delegated to :mod:`pyro_ext.timeseries.kalman`.

Every scale may be a tensor that requires grad, so noise variances can be learned by
MAP/SVI/(SG-)MCMC through :class:`DLMDistribution`.  Scale tensors may carry batch dims.

Robust (Student-t) observations, thesis "Robustness", use the exact scale mixture
``v_t | lambda_t ~ N(0, V / lambda_t)``, ``lambda_t ~ Gamma(nu/2, nu/2)``: see
:func:`dlm_observe`.  The Kalman marginalisation over states is exact *conditional on*
``lambda``; ``lambda`` itself is a latent site sampled by the outer Pyro inference.
"""

import math
import numbers
from abc import ABC, abstractmethod
from typing import NamedTuple

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ..ops.validation import (
    broadcast_shapes,
    check_choice,
    check_int,
    check_real_tensor,
    first_nonfinite,
    values_checked,
)
from .kalman import (
    KalmanFilterResult,
    KalmanForecast,
    KalmanSmootherResult,
    KalmanWhitening,
    StateSpaceMatrices,
    kalman_filter,
    kalman_forecast,
    kalman_log_likelihood,
    kalman_sample,
    kalman_smoother,
    kalman_whiten,
    prepare_state_space,
    simulate_prior,
)

#: a scale or coefficient: a Python number or a tensor (batched values broadcast)
Tensorish = float | torch.Tensor

__all__ = [
    "DLM",
    "DLMDistribution",
    "Autoregressive",
    "Component",
    "ComponentBlock",
    "LinearGaussian",
    "LocalLevel",
    "LocalLinearTrend",
    "Regression",
    "Seasonal",
    "StateSpaceMatrices",
    "dlm_observe",
]


class ComponentBlock(NamedTuple):
    """One component's matrices, what :meth:`Component.block` returns: its transition
    ``G`` ``(*b, [T,] S, S)``, its row of the observation matrix ``F`` ``(*b, [T,] 1, S)``
    and its state noise covariance ``W`` ``(*b, [T,] S, S)``; ``time_varying`` says whether
    dim -3 of ``G``/``F``/``W`` is time. :class:`DLM` stacks the components' blocks
    block-diagonally."""

    G: torch.Tensor  # (*b, [T,] S, S)
    F: torch.Tensor  # (*b, [T,] 1, S)
    W: torch.Tensor  # (*b, [T,] S, S)
    time_varying: bool


def _scale(x, name, allow_zero=True):
    if not torch.is_tensor(x):
        try:
            x = torch.as_tensor(x, dtype=torch.get_default_dtype())
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(
                f"{name} must be a number or a real tensor of scales, got {x!r}"
            ) from None
    check_real_tensor(x, name)
    if not x.is_floating_point():
        x = x.to(torch.get_default_dtype())
    # Value checks follow the global validation switch, as in the Kalman functions.
    if values_checked():
        with torch.no_grad():
            if bool((x < 0).any()) or not bool(torch.isfinite(x).all()):
                raise ValueError(f"{name} must be finite and non-negative")
            if not allow_zero and bool((x == 0).any()):
                raise ValueError(f"{name} must be positive")
    return x


def _init_scale(value):
    """``init_scale``: a finite non-negative number or a tensor (checked with ``init_cov``)."""
    if torch.is_tensor(value):
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"init_scale must be a number or a tensor, got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"init_scale must be a finite non-negative number, got {value!r}")
    return value


def _integer(value, name):
    """An integral number (``12`` or ``12.0``), else TypeError/ValueError naming ``name``."""
    if torch.is_tensor(value) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if not (math.isfinite(value) and int(value) == value):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return int(value)


def _diag(scales):
    """``diag(scales**2)`` with broadcasting batch dims; ``scales`` is a list of tensors."""
    batch = broadcast_shapes(*[s.shape for s in scales])
    return torch.diag_embed(torch.stack([s.expand(batch) for s in scales], -1).pow(2))


class Component(ABC):
    """Base class of a DLM's components, and how to write a new one: set ``state_dim`` and
    ``state_names``, and implement :meth:`block` (and :meth:`future_block` where the
    matrices depend on covariates). Components add with ``+`` into a :class:`DLM`."""

    name = "component"
    init_scale = 10.0

    @abstractmethod
    def block(self, num_steps: int) -> ComponentBlock:
        """The component's :class:`ComponentBlock` over ``num_steps`` steps."""

    def future_block(
        self, num_steps: int, covariates: torch.Tensor | None = None
    ) -> ComponentBlock:
        """Matrices for forecasting; covariate-driven components need ``covariates``."""
        return self.block(num_steps)

    def init(self, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Prior of the component's part of ``x_1``: ``N(0, init_scale**2 I)`` by default."""
        scale = torch.as_tensor(self.init_scale, dtype=ref.dtype, device=ref.device)
        eye = torch.eye(self.state_dim, dtype=ref.dtype, device=ref.device)
        return ref.new_zeros(self.state_dim), scale.pow(2)[..., None, None] * eye

    def __add__(self, other):
        return [self] + (list(other) if isinstance(other, (list, tuple)) else [other])

    def __radd__(self, other):
        return list(other) + [self]


def _e1(n, ref):
    F = ref.new_zeros(1, n)
    F[0, 0] = 1
    return F


class LocalLevel(Component):
    """Random-walk level: ``mu_t = mu_{t-1} + N(0, level_scale^2)``, ``F = [1]``."""

    name = "level"

    def __init__(self, level_scale: Tensorish, init_scale: Tensorish = 10.0):
        self.level_scale = _scale(level_scale, "level_scale")
        self.init_scale = _init_scale(init_scale)
        self.state_dim, self.state_names = 1, ["level"]

    def block(self, num_steps: int) -> ComponentBlock:
        s = self.level_scale
        return ComponentBlock(s.new_ones(1, 1), _e1(1, s), _diag([s]), False)


class LocalLinearTrend(Component):
    """Level and slope (thesis appendix 2.B.1): ``G = [[1, 1], [0, 1]]``, ``F = [1, 0]``."""

    name = "trend"

    def __init__(
        self, level_scale: Tensorish, slope_scale: Tensorish, init_scale: Tensorish = 10.0
    ):
        self.level_scale = _scale(level_scale, "level_scale")
        self.slope_scale = _scale(slope_scale, "slope_scale")
        self.init_scale = _init_scale(init_scale)
        self.state_dim, self.state_names = 2, ["level", "slope"]

    def block(self, num_steps: int) -> ComponentBlock:
        s = self.level_scale
        G = s.new_tensor([[1.0, 1.0], [0.0, 1.0]])
        return ComponentBlock(G, _e1(2, s), _diag([s, self.slope_scale]), False)


class Seasonal(Component):
    r"""Seasonal block of period ``period``.

    * ``harmonics=None`` (dummy form, ``period - 1`` states): the first row of ``G`` is all
      ``-1`` and the subdiagonal is the identity, so the ``period`` seasonal effects sum to
      zero up to the noise ``N(0, scale^2)`` entering the first state; ``F = e_1``.
      (The appendix 2.B.1 text prints the ``period x period`` cyclic permutation of the
      form-free seasonal instead; ``form="cyclic"`` gives that variant.)
    * ``harmonics=h`` (trigonometric form): blocks ``[[cos l_j, sin l_j], [-sin l_j, cos l_j]]``
      with ``l_j = 2 pi j / period``, ``j = 1..h``, each with noise ``scale^2 I`` and
      ``F = [1, 0]``; the Nyquist harmonic ``j = period / 2`` is the 1-state block ``[-1]``.
    """

    name = "seasonal"

    def __init__(
        self,
        period: float,
        scale: Tensorish,
        harmonics: int | None = None,
        form: str = "dummy",
        init_scale: Tensorish = 10.0,
    ):
        if _integer(period, "period") < 2:
            raise ValueError(f"period must be an integer >= 2, got {period}")
        check_choice(form, "form", ("dummy", "cyclic"))
        if harmonics is not None and not 1 <= _integer(harmonics, "harmonics") <= period // 2:
            raise ValueError(f"harmonics must be in 1..{int(period) // 2}, got {harmonics}")
        self.period, self.harmonics, self.form = int(period), harmonics, form
        self.scale = _scale(scale, "scale")
        self.init_scale = _init_scale(init_scale)
        if harmonics is not None:
            sizes = [1 if 2 * j == period else 2 for j in range(1, int(harmonics) + 1)]
            self._sizes = sizes
            self.state_dim = sum(sizes)
            self.state_names = [
                f"harmonic{j}_{k}" for j, n in enumerate(sizes, 1) for k in ("cos", "sin")[:n]
            ]
        else:
            self.state_dim = self.period - 1 if form == "dummy" else self.period
            self.state_names = [f"season{k}" for k in range(self.state_dim)]

    def block(self, num_steps: int) -> ComponentBlock:
        ref, n = self.scale, self.state_dim
        zero = torch.zeros_like(self.scale)
        if self.harmonics is None:
            G = ref.new_zeros(n, n)
            G[1:, :-1] = torch.eye(n - 1, dtype=ref.dtype, device=ref.device)
            if self.form == "dummy":
                G[0] = -1
            else:
                G[0, -1] = 1
            return ComponentBlock(G, _e1(n, ref), _diag([self.scale] + [zero] * (n - 1)), False)
        blocks, F = [], []
        for j, size in enumerate(self._sizes, 1):
            lam = 2 * math.pi * j / self.period
            c, s = math.cos(lam), math.sin(lam)
            blocks.append(ref.new_tensor([[c, s], [-s, c]])[:size, :size])
            F += [1.0, 0.0][:size]
        F = ref.new_tensor([F])
        return ComponentBlock(torch.block_diag(*blocks), F, _diag([self.scale] * n), False)


class Regression(Component):
    """Regression on covariates ``X`` ``(..., T, k)``: ``F_t = X_t``, ``G = I``.

    Static coefficients when ``coef_scale`` is ``None`` or 0 (``W = 0``, the thesis'
    parsimonious choice), random-walk coefficients with ``W = coef_scale^2 I`` otherwise.
    """

    name = "regression"

    def __init__(
        self, X: torch.Tensor, coef_scale: Tensorish | None = None, init_scale: Tensorish = 10.0
    ):
        check_real_tensor(X, "X")
        if X.dim() < 2:
            raise ValueError(f"X must have shape (..., T, num_covariates), got {tuple(X.shape)}")
        # Checked once here (covariates cannot be missing: NaN in X would make the whole
        # likelihood NaN); value checks follow the global validation switch.
        if values_checked():
            index = first_nonfinite(X)
            if index is not None:
                raise ValueError(
                    f"X contains NaN or infinite values (first at index {index}); covariates "
                    f"cannot be missing: impute or drop those steps"
                )
        self.X = X if X.is_floating_point() else X.to(torch.get_default_dtype())
        self.coef_scale = None if coef_scale is None else _scale(coef_scale, "coef_scale")
        self.init_scale = _init_scale(init_scale)
        self.state_dim = X.shape[-1]
        self.state_names = [f"coef{k}" for k in range(self.state_dim)]

    def _block(self, X):
        k = self.state_dim
        scale = X.new_zeros(()) if self.coef_scale is None else self.coef_scale
        eye = torch.eye(k, dtype=X.dtype, device=X.device)
        return ComponentBlock(eye, X.unsqueeze(-2), _diag([scale] * k), True)

    def block(self, num_steps: int) -> ComponentBlock:
        if self.X.shape[-2] != num_steps:
            raise ValueError(f"X has {self.X.shape[-2]} steps but the series has {num_steps}")
        return self._block(self.X)

    def future_block(
        self, num_steps: int, covariates: torch.Tensor | None = None
    ) -> ComponentBlock:
        if covariates is None or covariates.shape[-2:] != (num_steps, self.state_dim):
            raise ValueError(
                f"forecasting a Regression component needs future covariates of shape "
                f"(..., {num_steps}, {self.state_dim})"
            )
        return self._block(covariates.to(self.X.dtype))


class Autoregressive(Component):
    """AR(p) in companion form: first row of ``G`` is ``coefs``, subdiagonal identity."""

    name = "ar"

    def __init__(self, coefs: Tensorish, scale: Tensorish, init_scale: Tensorish = 10.0):
        check_real_tensor(coefs, "coefs")
        if coefs.dim() < 1 or coefs.shape[-1] < 1:
            raise ValueError(f"coefs must have shape (..., p) with p >= 1, got {coefs.shape}")
        self.coefs = coefs if coefs.is_floating_point() else coefs.to(torch.get_default_dtype())
        self.scale = _scale(scale, "scale")
        self.init_scale = _init_scale(init_scale)
        self.state_dim = coefs.shape[-1]
        self.state_names = [f"lag{k}" for k in range(self.state_dim)]

    def block(self, num_steps: int) -> ComponentBlock:
        p, ref = self.state_dim, self.coefs
        shift = torch.eye(p, dtype=ref.dtype, device=ref.device)[:-1]
        shift = shift.expand(*self.coefs.shape[:-1], p - 1, p)
        G = torch.cat([self.coefs.unsqueeze(-2), shift], -2)  # differentiable in coefs
        zero = torch.zeros_like(self.scale)
        return ComponentBlock(G, _e1(p, ref), _diag([self.scale] + [zero] * (p - 1)), False)


class LinearGaussian(Component):
    """Generic block ``(G, F, W, init_mean, init_cov)`` with ``F`` of shape ``(..., 1, S)``.

    With ``time_varying=True`` every argument with more than two dims has its time axis at
    dim -3 (2-D ones stay static); this is how covariate-driven ``G_t`` such as the
    Nerlove-Arrow goodwill block (thesis eq. (1.4)) are expressed.  Forecasting a
    time-varying block needs future ``(G, F, W)`` passed as its covariates.
    """

    name = "linear_gaussian"

    def __init__(
        self,
        G: torch.Tensor,
        F: torch.Tensor,
        W: torch.Tensor,
        init_mean: torch.Tensor,
        init_cov: torch.Tensor,
        time_varying: bool = False,
        state_names: list[str] | None = None,
    ):
        for x, n in [
            (G, "G"),
            (F, "F"),
            (W, "W"),
            (init_mean, "init_mean"),
            (init_cov, "init_cov"),
        ]:
            check_real_tensor(x, n)
        S = init_mean.shape[-1]
        if G.shape[-2:] != (S, S) or W.shape[-2:] != (S, S) or F.shape[-2:] != (1, S):
            raise ValueError(
                f"LinearGaussian needs G, W of trailing shape ({S}, {S}) and F of (1, {S}); "
                f"got G {tuple(G.shape)}, F {tuple(F.shape)}, W {tuple(W.shape)}"
            )
        self.G, self.F, self.W = G, F, W
        self._init = (init_mean, init_cov)
        self.time_varying = time_varying
        self.state_dim = S
        self.state_names = state_names or [f"x{k}" for k in range(S)]

    def _block(self, G, F, W, num_steps):
        if not self.time_varying:
            return ComponentBlock(G, F, W, False)
        out = []
        for x, n in [(G, "G"), (F, "F"), (W, "W")]:
            if x.dim() == 2:
                x = x.expand(num_steps, *x.shape)
            elif x.shape[-3] != num_steps:
                raise ValueError(f"{n} has {x.shape[-3]} time steps, expected {num_steps}")
            out.append(x)
        return ComponentBlock(*out, True)

    def block(self, num_steps: int) -> ComponentBlock:
        return self._block(self.G, self.F, self.W, num_steps)

    def future_block(
        self, num_steps: int, covariates: torch.Tensor | None = None
    ) -> ComponentBlock:
        if not self.time_varying:
            return self.block(num_steps)
        if covariates is None:
            raise ValueError("forecasting a time-varying LinearGaussian needs future (G, F, W)")
        return self._block(*covariates, num_steps)

    def init(self, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._init[0].to(ref), self._init[1].to(ref)


def _put(out, block, start):
    n = block.shape[-1]
    out[..., start : start + n, start : start + n] = block


def _stack(blocks, inits, num_steps):
    """Block-diagonal superposition of component matrices (shapes broadcast)."""
    tv = any(b.time_varying for b in blocks)

    def timed(x, is_tv):
        return (
            x.unsqueeze(-3).expand(*x.shape[:-2], num_steps, *x.shape[-2:])
            if (tv and not is_tv)
            else x
        )

    Gs = [timed(b.G, b.time_varying) for b in blocks]
    Fs = [timed(b.F, b.time_varying) for b in blocks]
    Ws = [timed(b.W, b.time_varying) for b in blocks]
    S = sum(G.shape[-1] for G in Gs)
    batch = broadcast_shapes(*[x.shape[:-2] for x in Gs + Fs + Ws])
    dtype = Gs[0].dtype
    for x in Gs + Fs + Ws:
        dtype = torch.promote_types(dtype, x.dtype)
    G = Gs[0].new_zeros(*batch, S, S, dtype=dtype)
    W = torch.zeros_like(G)
    start = 0
    for Gc, Wc in zip(Gs, Ws):
        _put(G, Gc, start)
        _put(W, Wc, start)
        start += Gc.shape[-1]
    F = torch.cat([f.to(dtype).expand(*batch, 1, f.shape[-1]) for f in Fs], -1)
    means, covs = zip(*inits)
    ibatch = broadcast_shapes(*[m.shape[:-1] for m in means], *[c.shape[:-2] for c in covs])
    m0 = torch.cat([m.to(dtype).expand(*ibatch, m.shape[-1]) for m in means], -1)
    P0 = G.new_zeros(*ibatch, S, S)
    start = 0
    for c in covs:
        _put(P0, c.to(dtype), start)
        start += c.shape[-1]
    return G, F, W, m0, P0, tv


class DLM:
    """Superposition of components plus observation noise ``N(0, observation_scale^2)``.

    :param components: a component, a list of them, or ``a + b + ...``.
    :param observation_scale: observation noise scale (tensor, may require grad).
    :param observation_df: degrees of freedom of Student-t observation noise, used by
        :func:`dlm_observe` through the scale-mixture augmentation (``None``: Gaussian).

    Observations ``y`` have shape ``(..., T)``; ``NaN`` marks missing values.
    """

    def __init__(
        self,
        components: list[Component],
        observation_scale: Tensorish,
        observation_df: float | None = None,
    ):
        if isinstance(components, Component):
            components = [components]
        try:
            components = list(components)
        except TypeError:
            raise TypeError(
                f"components must be a Component or a list of them, got {components!r}"
            ) from None
        if not components:
            raise ValueError("components must be a non-empty list of Component instances")
        for c in components:
            if not isinstance(c, Component):
                raise TypeError(
                    "components must be a non-empty list of Component instances "
                    f"(LocalLevel, Seasonal, ...), got an element {c!r}"
                )
        self.components = components
        self.observation_scale = _scale(observation_scale, "observation_scale", False)
        if observation_df is not None:
            if isinstance(observation_df, bool) or not isinstance(
                observation_df, (numbers.Real, torch.Tensor)
            ):
                raise TypeError(
                    f"observation_df must be None or a positive number, got {observation_df!r}"
                )
            if not float(observation_df) > 0:
                raise ValueError(f"observation_df must be positive, got {observation_df}")
        self.observation_df = observation_df
        names, seen = [], {}
        for c in components:
            k = seen.get(c.name, 0)
            seen[c.name] = k + 1
            names.append(c.name if k == 0 else f"{c.name}_{k}")
        self.names = names
        self.state_dim = sum(c.state_dim for c in components)
        self.state_names = [f"{n}.{s}" for n, c in zip(names, components) for s in c.state_names]

    def _assemble(self, num_steps, observation_precision=None, future=None):
        """Stacked matrices, whether they carry a time axis, and their batch shape."""
        if future is None:
            blocks = [c.block(num_steps) for c in self.components]
        else:
            blocks = [
                c.future_block(num_steps, future.get(n))
                for n, c in zip(self.names, self.components)
            ]
        inits = [c.init(self.observation_scale) for c in self.components]
        G, F, W, m0, P0, tv = _stack(blocks, inits, num_steps)
        V = self.observation_scale.pow(2)[..., None, None].to(G.dtype)
        if observation_precision is not None:
            # V_t = V / lambda_t puts a time axis on every matrix.
            V = V.unsqueeze(-3) / observation_precision[..., None, None]
            if not tv:
                G, F, W = [
                    x.unsqueeze(-3).expand(*x.shape[:-2], num_steps, *x.shape[-2:])
                    for x in (G, F, W)
                ]
            tv = True
        elif tv:
            # A time-varying component (a regression) puts a time axis on G, F, W: V gets
            # one too, or a batched observation scale would read as one.
            V = V.unsqueeze(-3).expand(*V.shape[:-2], num_steps, 1, 1)
        k = 3 if tv else 2
        batch = broadcast_shapes(
            *[x.shape[:-k] for x in (G, F, W, V)], m0.shape[:-1], P0.shape[:-2]
        )
        return StateSpaceMatrices(G, F, W, V, m0, P0), tv, batch

    def matrices(
        self, num_steps: int, observation_precision: torch.Tensor | None = None
    ) -> StateSpaceMatrices:
        """The stacked :class:`~pyro_ext.timeseries.kalman.StateSpaceMatrices` for
        ``num_steps`` steps, the argument of the ``kalman_*`` functions besides the data."""
        return self._assemble(num_steps, observation_precision)[0]

    def _args(self, y, observation_precision=None, strict_batch=False):
        """Arguments ``(y, matrices)`` of the ``kalman_*`` functions: ``y`` ``(..., T)`` as
        ``(..., T, 1)`` and the :class:`StateSpaceMatrices`. ``strict_batch`` refuses a
        ``y`` whose batch dims do not broadcast to the parameters' batch shape."""
        if not torch.is_tensor(y):
            raise TypeError(f"y must be a tensor of shape (..., T), got {type(y).__name__}")
        check_real_tensor(y, "y")
        if y.dim() < 1:
            raise ValueError(f"y must be a tensor of shape (..., T), got {tuple(y.shape)}")
        if not y.is_floating_point():
            # NaN marks a missing value, which an integer tensor cannot hold: refused, as
            # kalman_filter refuses it, rather than silently cast.
            raise TypeError(
                f"y must be a floating-point tensor (NaN marks a missing value), got dtype "
                f"{y.dtype}; convert it with y.to(torch.get_default_dtype())"
            )
        T = y.shape[-1]
        mats, tv, batch = self._assemble(T, observation_precision)
        if strict_batch and broadcast_shapes(batch, y.shape[:-1]) != batch:
            # A univariate series is (T,): a 2-D y is read as a batch of series, which is
            # almost always a (T, k) table passed by mistake unless the parameters are
            # batched the same way.
            raise ValueError(
                f"y has shape {tuple(y.shape)}, read as a batch {tuple(y.shape[:-1])} of "
                f"series of {T} steps, but this DLM's parameters have batch shape "
                f"{tuple(batch)}: y must be one univariate series (T,) or (*batch, T) with "
                f"batch broadcasting to {tuple(batch)}; for several series with shared "
                f"parameters call log_likelihood on each"
            )
        # kalman_* read the batch shape from y, so y is expanded over the parameters' batch
        # and time-varying matrices over y's batch.
        batch = broadcast_shapes(batch, y.shape[:-1])
        G, F, W, V, m0, P0 = mats
        if tv:
            G, F, W, V = [x.expand(*batch, *x.shape[-3:]) for x in (G, F, W, V)]
        yy = y.unsqueeze(-1).to(G.dtype).expand(*batch, T, 1)
        return yy, StateSpaceMatrices(G, F, W, V, m0, P0)

    def log_likelihood(
        self, y: torch.Tensor, observation_precision: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Exact ``log p(y_{1:T})`` (conditional on ``observation_precision`` if given).

        :param y: ``(T,)`` floating-point observations, ``NaN`` where missing, or
            ``(*batch, T)`` with ``batch`` broadcasting to the parameters' batch shape.
        :raises TypeError: if ``y`` is not a floating-point tensor.
        :raises ValueError: if ``y``'s batch dims go beyond the parameters' batch shape
            (e.g. a ``(T, 2)`` table for a univariate DLM).
        """
        return kalman_log_likelihood(*self._args(y, observation_precision, strict_batch=True))

    def whiten(
        self,
        series: torch.Tensor,
        observation_precision: torch.Tensor | None = None,
        block_size: int | None = None,
    ) -> KalmanWhitening:
        r"""Whiten ``n`` series ``(..., T, n)`` by the covariance ``Sigma = L L^T`` of the
        observations ``y_{1:T}`` (:func:`~pyro_ext.timeseries.kalman.kalman_whiten`): the
        Kalman filter's standardised prediction errors, equal to ``L^{-1}`` of each series
        with ``L`` the dense Cholesky factor, without forming ``Sigma``.  For regressions on
        several columns with this DLM's noise (one filter pass serves all of them).

        Only the covariance is used: the initial state's mean is not subtracted.  A week
        that is ``NaN`` in any series is missing in all of them (whitened value 0).
        ``observation_precision`` ``(..., T)`` scales the observation variance to
        ``V / lambda_t`` (Student-t noise given its precisions).

        :param block_size: steps per block of the blocked filter (``None``: the default of
            :func:`~pyro_ext.timeseries.kalman.kalman_whiten`).
        :returns: :class:`~pyro_ext.timeseries.kalman.KalmanWhitening` with ``whitened``
            ``(..., T, n)``, ``log_det`` and ``num_observed`` ``(...)``.
        """
        if not torch.is_tensor(series) or series.dim() < 2:
            raise ValueError("series must be a tensor of shape (..., T, num_series)")
        T = series.shape[-2]
        (G, F, W, V, m0, P0), tv, batch = self._assemble(T)
        batch = broadcast_shapes(batch, series.shape[:-2])
        if observation_precision is not None:
            # V / lambda_t on a time axis; G, F and W stay static (the blocked filter).
            batch = broadcast_shapes(batch, observation_precision.shape[:-1])
            V = (V if tv else V.unsqueeze(-3)) / observation_precision[..., None, None]
            V = V.expand(*batch, *V.shape[-3:])
        if tv:
            G, F, W, V = [x.expand(*batch, *x.shape[-3:]) for x in (G, F, W, V)]
        series = series.to(G.dtype).expand(*batch, *series.shape[-2:]).unsqueeze(-2)
        matrices = StateSpaceMatrices(G, F, W, V, m0, P0)  # kalman_whiten ignores m0
        result = kalman_whiten(series, matrices, block_size=block_size)
        return result._replace(whitened=result.whitened.squeeze(-2))

    def signal_covariance(self, num_steps: int) -> torch.Tensor:
        r"""
        The dense covariance ``(..., T, T)`` of the noise-free signal ``F x_t`` over
        ``num_steps`` steps of a time-invariant DLM whose initial mean is 0 (add the
        observation noise to get ``Cov(y)``): ``Cov(F x_t, F x_s) = F G^{t-s} P_s F'`` for
        ``t >= s``, with ``P_s = G^{s-1} P_1 G^{s-1}' + sum_{k<s-1} G^k W G^k'``.

        Built without a loop over steps (the powers of ``G`` by doubling, ``P_s`` by a
        cumulative sum), so a dense Gaussian (Cholesky of ``T x T``) can replace the Kalman
        filter where many right-hand sides share one model: ``T`` of a few hundred.
        :meth:`whiten` gives the same whitening by the Kalman filter without the ``T x T``
        matrix (faster at every length measured, 26 to 520 steps of a BSTS's DLM).
        """
        T = check_int(num_steps, "num_steps", low=1)
        (G, F, W, _, m0, P0), tv, _ = self._assemble(T)
        if tv:
            raise ValueError("signal_covariance needs a time-invariant DLM (no Regression)")
        # Value checks follow the global validation switch (vmap cannot branch on values).
        if values_checked() and bool((m0 != 0).any()):
            raise ValueError("signal_covariance needs a zero initial mean")
        S = G.shape[-1]
        eye = torch.eye(S, dtype=G.dtype, device=G.device).expand(G.shape)
        powers = eye.unsqueeze(-3)  # G^0 .. G^{n-1}, (..., n, S, S)
        step = G
        while powers.shape[-3] < T:
            powers = torch.cat([powers, step.unsqueeze(-3) @ powers], -3)
            step = step @ step
        powers = powers[..., :T, :, :]
        # P_s for s = 1..T: G^{s-1} P_1 G^{s-1}' plus the accumulated transition noise.
        noise = powers @ W.unsqueeze(-3) @ powers.mT  # G^k W G^k'
        accumulated = torch.cumsum(noise, -3) - noise  # sum over k < s - 1
        P = powers @ P0.unsqueeze(-3) @ powers.mT + accumulated  # (..., T, S, S)
        H = F.unsqueeze(-3) @ powers  # F G^d, (..., T, 1, S)
        PF = (P @ F.mT.unsqueeze(-3)).squeeze(-1)  # P_s F', (..., T, S)
        t = torch.arange(T, device=G.device)
        lag = (t.unsqueeze(-1) - t).clamp(min=0)  # t - s where t >= s
        lower = (H[..., 0, :][..., lag, :] * PF.unsqueeze(-3)).sum(-1)  # [t, s]
        lower = torch.tril(lower)
        return lower + torch.tril(lower, -1).mT

    def filter(self, y: torch.Tensor) -> KalmanFilterResult:
        """:class:`~pyro_ext.timeseries.kalman.KalmanFilterResult` of the stacked model."""
        return kalman_filter(*self._args(y))

    def smooth(self, y: torch.Tensor) -> KalmanSmootherResult:
        """:class:`~pyro_ext.timeseries.kalman.KalmanSmootherResult` of the stacked model."""
        return kalman_smoother(*self._args(y))

    def sample_states(self, y: torch.Tensor, num_samples: int = 1) -> torch.Tensor:
        """Joint posterior state draws ``(num_samples, ..., T, S)``."""
        return kalman_sample(*self._args(y), num_samples=num_samples)

    def decompose(
        self, y: torch.Tensor, observation_precision: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """Smoothed contribution ``F_{c,t} E[x_{c,t} | y]`` of each component, ``(..., T)``.

        The contributions sum to the smoothed signal ``F_t E[x_t | y]``. With Student-t
        observations (``observation_df``), ``observation_precision`` ``(..., T)`` gives the
        weekly precision multipliers of the scale mixture (e.g. posterior draws of the
        ``"<name>_precision"`` site): the smoother is then exact given them.
        """
        yy, matrices = self._args(y, observation_precision)
        F = matrices.observation_matrix
        ms = kalman_smoother(yy, matrices).smoothed_means
        out, start = {}, 0
        for name, c in zip(self.names, self.components):
            sl = slice(start, start + c.state_dim)
            Fc = F[..., 0, sl] if F.dim() == ms.dim() + 1 else F[..., 0, sl].unsqueeze(-2)
            out[name] = (Fc * ms[..., sl]).sum(-1)
            start += c.state_dim
        return out

    def forecast(
        self, y: torch.Tensor, num_steps: int, covariates: torch.Tensor | None = None
    ) -> KalmanForecast:
        """Predictive moments of ``y_{T+1..T+h}``; ``covariates`` maps component names to
        their future inputs (future ``X`` for :class:`Regression`, ``(G, F, W)`` for a
        time-varying :class:`LinearGaussian`).
        """
        num_steps = check_int(num_steps, "num_steps", low=1)
        covariates = covariates or {}
        unknown = set(covariates) - set(self.names)
        if unknown:
            raise ValueError(f"covariates has unknown component names {sorted(unknown)}")
        result = self.filter(y)
        matrices, tv, _ = self._assemble(num_steps, future=covariates)
        batch = result.filtered_means.shape[:-2]
        k = 3 if tv else 2
        G, F, W = [x.expand(*batch, *x.shape[-k:]) for x in matrices[:3]]
        matrices = matrices._replace(transition_matrix=G, observation_matrix=F, transition_cov=W)
        return kalman_forecast(result, num_steps, matrices)


class _RealOrNaN(constraints.Constraint):
    """Real numbers or NaN (NaN marks a missing observation)."""

    def check(self, value):
        return ~torch.isinf(value)


class DLMDistribution(dist.TorchDistribution):
    r"""Marginal law of ``y_{1:T}`` under a :class:`DLM`, states integrated out exactly.

    ``log_prob(y)`` is the Kalman log-likelihood, so
    ``pyro.sample("obs", DLMDistribution(dlm, T), obs=y)`` works under SVI, NUTS and
    SG-MCMC with the DLM's scales as latent variables.  ``observation_precision``
    (``(..., T)``) scales the observation variance to ``V / lambda_t``.

    :param dlm: a :class:`DLM`.
    :param num_steps: ``T``.
    """

    arg_constraints = {}
    support = constraints.independent(_RealOrNaN(), 1)
    has_rsample = False

    def __init__(
        self,
        dlm: DLM,
        num_steps: int,
        observation_precision: torch.Tensor | None = None,
        validate_args: bool | None = None,
    ):
        if not isinstance(dlm, DLM):
            raise TypeError(f"dlm must be a DLM, got {type(dlm).__name__}")
        self.dlm, self.num_steps = dlm, check_int(num_steps, "num_steps", low=1)
        self.observation_precision = observation_precision
        mats, _, batch = dlm._assemble(self.num_steps, observation_precision)
        self._dtype = mats.transition_matrix.dtype
        super().__init__(batch, torch.Size([self.num_steps]), validate_args=validate_args)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        # value may carry sample dims beyond the batch shape: the lenient _args.
        ll = kalman_log_likelihood(*self.dlm._args(value, self.observation_precision))
        return ll.expand(broadcast_shapes(ll.shape, self.batch_shape))

    def sample(self, sample_shape=torch.Size()):
        n = int(torch.Size(sample_shape).numel())
        y = torch.full(
            (*self.batch_shape, self.num_steps),
            0.0,  # unused by the prior simulation; NaN would mark every step missing
            dtype=self._dtype,
            device=self.dlm.observation_scale.device,
        )
        with torch.no_grad():
            ssm = prepare_state_space(*self.dlm._args(y, self.observation_precision))
            _, yy = simulate_prior(ssm, n)
        # (T, n, *batch, 1) -> (*sample_shape, *batch, T)
        yy = yy[..., 0].movedim(0, -1)
        return yy.reshape(*sample_shape, *self.batch_shape, self.num_steps)


def dlm_observe(name: str, dlm: DLM, y: torch.Tensor) -> torch.Tensor:
    """Observe ``y`` under ``dlm`` inside a Pyro model, with Student-t noise if requested.

    When ``dlm.observation_df = nu`` is set, samples the latent site ``f"{name}_precision"``
    ``lambda_t ~ Gamma(nu/2, nu/2)`` (``(..., T)``, one per step) and observes
    ``DLMDistribution`` with ``V_t = V / lambda_t``: marginally over ``lambda_t`` the
    observation noise is ``StudentT(nu, 0, observation_scale)``.  Exact conditionally on
    ``lambda``; the outer inference (SVI guide, NUTS, Gibbs) handles ``lambda``.

    :param name: the observed site's name (a string).
    :param dlm: a :class:`DLM`.
    :param y: ``(..., T)`` floating-point observations, ``NaN`` where missing.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string (the observed site's name), got {name!r}")
    if not isinstance(dlm, DLM):
        raise TypeError(f"dlm must be a DLM, got {type(dlm).__name__}")
    if not torch.is_tensor(y):
        raise TypeError(f"y must be a tensor of shape (..., T), got {type(y).__name__}")
    if y.dim() < 1:
        raise ValueError(f"y must be a tensor of shape (..., T), got {tuple(y.shape)}")
    T = y.shape[-1]
    precision = None
    if dlm.observation_df is not None:
        half = torch.as_tensor(dlm.observation_df / 2, dtype=y.dtype, device=y.device)
        precision = pyro.sample(f"{name}_precision", dist.Gamma(half, half).expand([T]).to_event(1))
    return pyro.sample(name, DLMDistribution(dlm, T, precision), obs=y)
