"""
Forecasts of a fitted :class:`~pyro_ext.models.bsts.RetailBSTS`: the posterior predictive
of future sales given future spend (and covariates), its moments in closed form through
the Kalman filter's end state, draws of sales paths, and one-step-ahead predictions on new
data. A mixin of :class:`~pyro_ext.models.bsts.RetailBSTS`, kept apart from the model
function and the fit as Pyro's ``contrib.forecast`` keeps its ``Forecaster``.
"""

import pyro.distributions as dist
import torch

from ...ops.validation import as_real_tensor, check_int
from ...timeseries.kalman import kalman_filter


class Forecasting:
    """The forecasting methods of :class:`~pyro_ext.models.bsts.RetailBSTS`."""

    def _draw_subset(self, max_draws):
        max_draws = check_int(max_draws, "max_draws", low=1)
        delta = self.samples["delta"]
        n = delta.shape[0]
        idx = torch.linspace(0, n - 1, min(n, max_draws), device=delta.device).round().long()
        return {k: v[idx] for k, v in self.samples.items()}

    def _future_inputs(self, spend_future, covariates_future, max_draws=1):
        """The standardised future inputs, checked once per call (before any draw)."""
        # max_draws first: it is cheap, and a call with two bad arguments names the first.
        check_int(max_draws, "max_draws", low=1)
        spend_future = as_real_tensor(spend_future, "spend_future", self.device)
        spend_future = spend_future.to(torch.float64)
        if spend_future.dim() != 2 or spend_future.shape[1] != self.num_channels:
            raise ValueError(
                f"spend_future must have shape (h, {self.num_channels}): h weeks (the horizon) "
                f"by the {self.num_channels} channels, got {tuple(spend_future.shape)}"
            )
        h = spend_future.shape[0]
        if h == 0:
            raise ValueError(
                "spend_future has 0 rows: the horizon (its number of rows, the weeks to "
                "predict) must be a positive int"
            )
        with torch.no_grad():
            self._check_spend(spend_future, "spend_future")
        uf = spend_future.to(torch.float64) / self._u_scale
        if covariates_future is None:
            Xf = self._x_loc.new_zeros(h, self._p)
        else:
            Xf = as_real_tensor(covariates_future, "covariates_future", self.device)
            Xf = Xf.to(torch.float64)
            if Xf.shape != (h, self._p):
                raise ValueError(
                    f"covariates_future must have shape ({h}, {self._p}): the {h} weeks of "
                    f"spend_future by the {self._p} covariates of the fit, got {tuple(Xf.shape)}"
                )
            self._check_covariates(Xf, "covariates_future")
            Xf = (Xf - self._x_loc) / self._x_scale
        return uf, Xf

    def _cached_end_state(self, max_draws):
        """Draws and their filtered end-of-training state; the allocator asks for these at
        every candidate spend, and they do not depend on it."""
        cache = getattr(self, "_end_state_cache", None)
        if cache is None or cache[0] is not self.samples or cache[1] != max_draws:
            draws = self._draw_subset(max_draws)
            with torch.no_grad():
                state = self._end_state(draws)
            self._end_state_cache = cache = (self.samples, max_draws, draws, state)
        return cache[2], cache[3]

    def _end_state(self, draws):
        """Per draw: filtered ``x_T`` moments, each channel's goodwill stock ``S_T`` and the DLM."""
        y, u, X = self._data
        params = {n: v for n, v in draws.items() if n != "obs_precision"}
        offset = self._mean_offset(params, u, X)
        dlm = self.state_space(params)
        prec = draws.get("obs_precision")
        res = kalman_filter(*dlm._args(y - offset, prec))
        mT, PT = res.filtered_means[..., -1, :], res.filtered_covs[..., -1, :, :]
        G, F, W, V, _, _ = dlm.matrices(1)
        S = self._stock(params, u)  # (..., T, k), before q and the saturation curve
        if self._lag():
            # S_{T+1} per channel
            S_T = self._channel_phi(params) * S[..., -1, :] + u[-1]
        else:
            S_T = S[..., -1, :]
        var_obs = params["sigma_obs"] ** 2
        if self.noise == "student_t":
            var_obs = var_obs * self.df / (self.df - 2)
        # The filtered level holds mu + D_1 (the likelihood's goodwill is D_t - D_1).
        D_1 = self._goodwill(params, u)[..., 0]
        return mT, PT, G, F[0], W, var_obs, S_T, D_1, params

    def _future_offset(self, params, S_T, D_1, uf, Xf):
        """``D_{T+j} - D_1 + x_{T+j}' beta`` for ``j = 1..h`` (standardised), ``(n, h)``,
        from each channel's goodwill stock ``S_T`` ``(n, k)`` (``S_{T+1}`` for
        ``spend_lag=1``), ``D = q f(S)``, and the first training week's ``D_1`` ``(n,)``,
        which the filtered level holds."""
        phi = self._channel_phi(params)  # (n, k) or (n, 1)
        h = uf.shape[0]
        out = []
        if self._lag():
            stock = S_T  # S_{T+1}
            for j in range(h):
                out.append(stock)
                stock = phi * stock + uf[..., j, :]
        else:
            stock = S_T  # S_T
            for j in range(h):
                stock = phi * stock + uf[..., j, :]
                out.append(stock)
        stocks = torch.stack(out, -2)  # (n, h, k)
        off = (self._saturate(params, stocks) * params["q"].unsqueeze(-2)).sum(-1)
        off = off - D_1.unsqueeze(-1)
        if "beta" in params:
            off = off + (Xf * params["beta"].unsqueeze(-2)).sum(-1)
        return off

    def sales_moments(self, spend_future, covariates_future=None, max_draws=500):
        r"""Per-draw predictive mean and variance of TOTAL sales over ``h`` weeks.

        Exact Gaussian moments given each posterior draw (states integrated by the Kalman
        filter to the end of training, then propagated).  With Student-t noise the
        observation variance is moment-matched, ``nu / (nu - 2) sigma^2`` (and the
        filtering is conditional on the draw's precisions).  Differentiable w.r.t.
        ``spend_future`` (which enters the mean linearly through ``q`` and ``delta``).
        With ``spend_lag=1`` the last week's spend of the horizon does not affect the
        horizon's sales.

        :param spend_future: ``(h, k)`` non-negative spend, original units.
        :param covariates_future: ``(h, p)`` or ``None`` (the training means).
        :returns: ``(means, variances)``, each ``(num_draws,)``, original units.
        """
        self._check_fitted()
        uf, Xf = self._future_inputs(spend_future, covariates_future, max_draws)
        draws, (mT, PT, G, F, W, var_obs, S_T, D_1, params) = self._cached_end_state(max_draws)
        h = uf.shape[0]
        n, S = mT.shape
        Gb = G.expand(n, S, S)
        Fb = F.expand(n, 1, S) if F.dim() == 2 else F
        a = [Fb]  # a_0 = F
        for _ in range(h):
            a.append(a[-1] @ Gb)
        # total = sum_{k=1..h} F x_{T+k} + noise; x_{T+k} = G^k x_T + sum_{l<=k} G^{k-l} w_l
        c = torch.stack(a[1:], 0).sum(0)  # (n, 1, S)
        mean_state = (c @ mT.unsqueeze(-1)).reshape(n)
        var = (c @ PT @ c.mT).reshape(n)
        Wb = W.expand(n, S, S)
        cum = torch.cumsum(torch.stack(a[:h], 0), 0)  # b_l = sum_{j=0}^{h-l} a_j
        for lag in range(1, h + 1):
            b = cum[h - lag]
            var = var + (b @ Wb @ b.mT).reshape(n)
        var = var + h * var_obs.reshape(n)
        off = self._future_offset(params, S_T, D_1, uf, Xf).sum(-1)
        means = h * self._y_loc + self._y_scale * (mean_state + off)
        return means, self._y_scale**2 * var

    def _simulate_future(self, uf, Xf, max_draws, num_samples=1):
        draws, (mT, PT, G, F, W, var_obs, S_T, D_1, params) = self._cached_end_state(max_draws)
        with torch.no_grad():
            off = self._future_offset(params, S_T, D_1, uf, Xf)  # (n, h)
            n, S = mT.shape
            h = uf.shape[0]

            def sqrtm(P):
                e, v = torch.linalg.eigh(P)
                return v * e.clamp(min=0).sqrt().unsqueeze(-2)

            LP, LW = sqrtm(PT), sqrtm(W.expand(n, S, S))

            def normal(*shape):
                return torch.randn(*shape, dtype=mT.dtype, device=mT.device)

            x = mT + (LP @ normal(num_samples, n, S, 1)).squeeze(-1)
            F = F.reshape(S)
            paths = []
            sig = draws["sigma_obs"]
            for j in range(h):
                x = (G @ x.unsqueeze(-1)).squeeze(-1) + (LW @ normal(num_samples, n, S, 1)).squeeze(
                    -1
                )
                if self.noise == "student_t":
                    eps = dist.StudentT(self.df, 0.0, sig).sample((num_samples,))
                else:
                    eps = sig * normal(num_samples, n)
                paths.append(x @ F + off[:, j] + eps)
            paths = torch.stack(paths, -1)  # (num_samples, n, h)
        return self._y_loc + self._y_scale * paths

    def one_step_predictions(self, sales, spend, covariates=None, max_draws=200):
        """Mean and sd of the one-step-ahead predictive ``y_t | y_{1:t-1}`` for every week
        of ``sales`` (the training weeks and any weeks after them), original units, with the
        static parameters from the fitted posterior: a mixture over ``max_draws`` draws of
        the Kalman filter's predictive densities (the MAPE of thesis section 1.2.4).
        Gaussian noise only (for Student-t noise the filter needs the future precisions).

        :returns: ``(mean, sd)``, each ``(T,)``.
        """
        self._check_fitted()
        if self.noise != "gaussian":
            raise ValueError("one_step_predictions needs noise='gaussian'")
        check_int(max_draws, "max_draws", low=1)
        sales = self._tensor(sales, "sales", 1, self.device)
        self._check_sales(sales)
        T = sales.shape[0]
        # One row per week of sales, one column per channel / covariate of the fit.
        columns = {"spend": (spend, self.num_channels, "channels")}
        if covariates is not None:
            columns["covariates"] = (covariates, self._p, "covariates")
        for name, (value, width, what) in columns.items():
            value = self._tensor(value, name, 2, self.device)
            if value.shape != (T, width):
                raise ValueError(
                    f"{name} must have shape ({T}, {width}): the {T} weeks of sales by the "
                    f"{width} {what} of the fit, got {tuple(value.shape)}"
                )
            columns[name] = value
        spend = columns["spend"]
        self._check_spend(spend)
        if covariates is not None:
            covariates = columns["covariates"]
            self._check_covariates(covariates)
        draws = self._draw_subset(max_draws)
        params = {n: v for n, v in draws.items() if n != "obs_precision"}
        y = (sales - self._y_loc) / self._y_scale
        u = spend / self._u_scale
        X = y.new_zeros(y.shape[0], self._p)
        if covariates is not None:
            X = (covariates - self._x_loc) / self._x_scale
        with torch.no_grad():
            offset = self._mean_offset(params, u, X)  # (n, T)
            dlm = self.state_space(params)
            filtered = kalman_filter(*dlm._args(y - offset))
            F = dlm.matrices(1).observation_matrix[..., 0, :]
            F = F.expand(offset.shape[0], F.shape[-1])
            means = (filtered.predicted_means * F[:, None, :]).sum(-1) + offset
            variances = torch.einsum("ns,ntsr,nr->nt", F, filtered.predicted_covs, F)
            variances = variances + params["sigma_obs"].pow(2)[:, None]
        mean = means.mean(0)
        # Moments of the mixture over draws (law of total variance).
        variance = variances.mean(0) + (means - mean).pow(2).mean(0)
        return self._y_loc + self._y_scale * mean, self._y_scale * variance.sqrt()

    def forecast(self, spend_future, covariates_future=None, max_draws=500):
        """Posterior predictive draws ``(num_draws, h)`` of weekly sales, original units
        (one path per posterior draw, observation noise included)."""
        self._check_fitted()
        uf, Xf = self._future_inputs(spend_future, covariates_future, max_draws)
        return self._simulate_future(uf.detach(), Xf, max_draws)[0]

    def sample_sales(self, spend_future, covariates_future=None, num_samples=1, max_draws=500):
        """Monte Carlo draws of TOTAL sales over the horizon, ``(num_draws * num_samples,)``
        (``num_samples`` paths per posterior draw; not differentiable)."""
        self._check_fitted()
        num_samples = check_int(num_samples, "num_samples", low=1)
        uf, Xf = self._future_inputs(spend_future, covariates_future, max_draws)
        return self._simulate_future(uf.detach(), Xf, max_draws, num_samples).sum(-1).reshape(-1)
