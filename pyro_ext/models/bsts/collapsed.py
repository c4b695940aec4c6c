"""
The collapsed point-mass likelihood of :class:`~pyro_ext.models.bsts.RetailBSTS`: with the
spike-and-slab's indicators given, the regression coefficients (``beta``, and ``q`` with
real effects) are integrated out of the Kalman filter's likelihood in closed form (one
Kalman whitening of the design per particle, then ``p x p`` algebra), as R's ``bsts``
does; and the collapsed scan that draws each indicator from its exact conditional. A mixin
of :class:`~pyro_ext.models.bsts.RetailBSTS`.
"""

import math

import torch

from ...ops.validation import broadcast_shapes


class CollapsedLikelihood:
    """The collapsed point-mass likelihood and indicator moves of
    :class:`~pyro_ext.models.bsts.RetailBSTS`."""

    def _whitened_statistics(self, dlm, resid, X, precision=None):
        """
        Whiten the residual ``r = y - (D - D_1)`` and the design ``X`` by the DLM's covariance
        ``Sigma = L L'`` (signal plus observation noise, with ``obs_precision`` if given):
        the log-likelihood of ``r`` under the DLM without regression, ``M = Z' Z`` and
        ``b = Z' L^{-1} r`` with ``Z = L^{-1} X``. ``L^{-1}`` comes from one Kalman filter
        pass over the ``1 + p`` series at once (:meth:`~pyro_ext.timeseries.DLM.whiten`:
        the gains do not depend on the data; blocks of steps, so ``O(T)`` rather than the
        dense ``O(T^3)``). Missing weeks drop out. For one draw of the parameters:
        ``resid`` ``(T,)``, ``X`` ``(T, p)``.
        """
        batch = broadcast_shapes(resid.shape[:-1], X.shape[:-2])
        T, p = X.shape[-2:]
        series = torch.cat([resid.expand(*batch, T).unsqueeze(-1), X.expand(*batch, T, p)], -1)
        white = dlm.whiten(series, precision)
        z = white.whitened  # (T, 1 + p)
        log_likelihood = -0.5 * (
            z[..., 0].pow(2).sum(-1) + white.log_det + white.num_observed * math.log(2 * math.pi)
        )
        Z = z[..., 1:]
        return log_likelihood, Z.mT @ Z, (Z.mT @ z[..., :1]).squeeze(-1)

    def _collapsed_log_likelihood(self, stats, gamma=None):
        """``log p(y | gamma, theta)`` with ``beta_gamma ~ N(0, slab^2 I)`` integrated out:
        ``l_r - log det(A) / 2 + b_g' A^{-1} b_g / 2`` with ``A = I + S M S``, ``b_g = S b``,
        ``S = diag(prior sd * gamma)`` (Sylvester and Woodbury on the whitened model
        ``W r = Z beta + N(0, I)``). Batched over leading dims of ``stats`` and ``gamma``."""
        log_likelihood, M, b = stats
        if M.shape[-1] == 0:
            return log_likelihood  # nothing to integrate out
        scale = self._slab_variances().to(M).sqrt()  # the prior sd of each coefficient
        if gamma is not None:
            scale = scale * gamma
        # With S = diag(scale * gamma): A = I + S M S, and b_g = S b.
        M = M * scale.unsqueeze(-1) * scale.unsqueeze(-2)
        b = b * scale
        eye = torch.eye(M.shape[-1], dtype=M.dtype, device=M.device)
        chol = torch.linalg.cholesky(eye + M)
        log_det = 2 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        solved = torch.linalg.solve_triangular(chol, b.unsqueeze(-1), upper=False)
        return log_likelihood - 0.5 * log_det + 0.5 * solved.pow(2).sum((-2, -1))

    def _params_of(self, values):
        """The model's parameters from site values (``(..., ...)``), as the model has them."""
        params = dict(values)
        scales = params["noise_scales"]
        params["sigma_obs"], params["sigma_goodwill"] = scales[..., 0], scales[..., 1]
        return params

    def _statistics_of(self, values, y, u, X):
        """Whitened statistics of the point mass's regression for one draw of the values."""
        params = self._params_of(values)
        return self._whitened_statistics(
            self.state_space(params),
            self._response(params, y, u),
            self._design(params, u, X),
            params.get("obs_precision"),
        )

    def _indicator_move(self, site):
        """The collapsed Gibbs scan over the indicator site ``site`` (``"gamma_q"`` or
        ``"gamma"``), as :class:`~pyro_ext.infer.Gibbs` takes a move."""
        return lambda values, y, u, X: self._collapsed_scan(values, y, u, X, site)[site]

    def _collapsed_scan(self, values, y, u, X, site=None):
        """
        The collapsed Gibbs scan of R's ``bsts`` over the indicators ``[gamma_q, gamma]``:
        one Kalman whitening per particle gives ``M`` and ``b`` of the regression on
        ``[adstocked spend, covariates]``; each indicator is then drawn from its exact full
        conditional, ``logit p(gamma_j = 1 | ...) = logit pi_j + l(gamma_j = 1) -
        l(gamma_j = 0)``, with ``(k + p)``-square algebra (no further filtering). Returns
        the new values of both sites (the other site's indicators are left as they are).
        """
        sites = [n for n in ("gamma_q", "gamma") if n in values]
        stats = torch.func.vmap(lambda v: self._statistics_of(v, y, u, X))(
            {n: v for n, v in values.items() if n not in sites}
        )
        gamma = self._indicators(values).clone()
        k = self._design_channels
        pi = torch.cat([self._pi_q[:k], self._pi_b[: gamma.shape[-1] - k]]).to(gamma)
        movable = (pi < 1).nonzero().flatten().tolist()
        if site is not None:
            movable = [j for j in movable if (j < k) == (site == "gamma_q")]
        prior_logit = torch.log(pi) - torch.log1p(-pi)
        for j in movable:
            with_j, without_j = gamma.clone(), gamma.clone()
            with_j[:, j], without_j[:, j] = 1.0, 0.0
            logit = (
                prior_logit[j]
                + self._collapsed_log_likelihood(stats, with_j)
                - self._collapsed_log_likelihood(stats, without_j)
            )
            gamma[:, j] = (torch.rand_like(logit) < torch.sigmoid(logit)).to(gamma.dtype)
        return {"gamma_q": gamma[:, :k], "gamma": gamma[:, k:]}
