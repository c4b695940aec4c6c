"""The numba kernels of the Kalman filter and RTS smoother (imported only when numba is
installed; see :mod:`._sequential`).

Module-level functions, so that numba's on-disk cache serves every later process; explicit
loops rather than slice assignments, which cost seconds each to compile.

Shapes: ``B`` series, ``T`` steps, ``S`` states, ``p`` observed coordinates. The model's
matrices carry a step axis of length ``T`` (time-varying) or 1 (static): ``G (B, T|1, S,
S)``, ``F (B, T|1, p, S)``, ``W (B, T|1, S, S)``, ``V (B, T|1, p, p)``; ``m0 (B, S)``, ``P0
(B, S, S)``; ``y (B, T, p)`` with NaN where a coordinate is missing. As in
:mod:`~pyro_ext.timeseries.kalman`, entry ``t`` of ``G`` and ``W`` drives the transition into
step ``t`` (entry 0 is unused: the first state comes from the prior).
"""

import math

import numpy as np

from ._kernel_loops import copy_matrix, copy_vector
from ._kernel_loops import jit as _jit

_LOG_2PI = math.log(2.0 * math.pi)


@_jit
def _cholesky(a, n):
    """Lower Cholesky factor of ``a[:n, :n]`` in place; ``False`` if not positive definite."""
    for j in range(n):
        d = a[j, j]
        for k in range(j):
            d -= a[j, k] * a[j, k]
        if not d > 0.0:
            return False
        d = math.sqrt(d)
        a[j, j] = d
        for i in range(j + 1, n):
            s = a[i, j]
            for k in range(j):
                s -= a[i, k] * a[j, k]
            a[i, j] = s / d
    return True


@_jit
def _sandwich(a, b, c, work, out):
    """``out = a b a^T + (c + c^T) / 2`` for square matrices, exactly symmetric (the lower
    triangle computed and mirrored); ``work`` receives ``a b``."""
    S = a.shape[0]
    _product(a, b, work, S, S, S)
    for i in range(S):
        for j in range(i + 1):
            acc = 0.0
            for k in range(S):
                acc += work[i, k] * a[j, k]
            out[i, j] = acc + 0.5 * (c[i, j] + c[j, i])
            out[j, i] = out[i, j]


@_jit
def _product(a, b, out, rows, inner, cols):
    """``out[:rows, :cols] = a[:rows, :inner] b[:inner, :cols]``, row by row along
    contiguous rows of ``b``."""
    for i in range(rows):
        for j in range(cols):
            out[i, j] = 0.0
        for k in range(inner):
            aik = a[i, k]
            for j in range(cols):
                out[i, j] += aik * b[k, j]


@_jit
def _cholesky_solve(L, X, n, m):
    """Solve ``(L L^T) Z = X`` in place for the ``m`` columns of ``X[:n, :m]``, ``L`` the
    lower Cholesky factor in ``L[:n, :n]``: row by row, every column at once, so that the
    innermost loop runs along a contiguous row."""
    for i in range(n):
        for k in range(i):
            lik = L[i, k]
            for j in range(m):
                X[i, j] -= lik * X[k, j]
        inverse = 1.0 / L[i, i]
        for j in range(m):
            X[i, j] *= inverse
    for i in range(n - 1, -1, -1):
        for k in range(i + 1, n):
            lki = L[k, i]
            for j in range(m):
                X[i, j] -= lki * X[k, j]
        inverse = 1.0 / L[i, i]
        for j in range(m):
            X[i, j] *= inverse


#: The predicted covariance counts as converged (see :func:`filter`) once no entry moved by
#: more than this fraction of its largest diagonal entry in one step: a few dozen ulps of
#: float64, so that the steady-state steps differ from the full ones by round-off only.
STEADY_TOLERANCE = 1e-13


@_jit
def _converged(Pp, previous, S):
    """Whether ``Pp`` equals ``previous`` to :data:`STEADY_TOLERANCE` of its scale."""
    scale = 0.0
    for i in range(S):
        scale = max(scale, abs(Pp[i, i]))
    bound = STEADY_TOLERANCE * scale
    for i in range(S):
        for j in range(S):
            if not abs(Pp[i, j] - previous[i, j]) <= bound:
                return False
    return True


@_jit
def filter(y, G, F, W, V, m0, P0, ll, steady_steps, m_out, P_out, mp_out, Pp_out):
    """Covariance-form Kalman filter. Writes ``ll (B,)`` and, where ``m_out`` has ``T``
    steps (not a ``(B, 0, S)`` placeholder), the filtered and one-step predicted moments
    ``(B, T, S)`` / ``(B, T, S, S)``. Returns ``-1`` on success, else the flat index ``b * T
    + t`` of the first innovation covariance that is not positive definite.

    With static matrices, once the predicted covariance stops moving between two fully
    observed steps (:func:`_converged`), the covariances, the gain and the innovation
    covariance's factor are those of the Riccati recursion's fixed point, and each later
    fully observed step updates the mean only: ``O(S^2 + pS)`` instead of ``O(S^3)``, as
    statsmodels' steady-state switch does. A step with a missing coordinate leaves the
    steady state (its update runs in full) until the covariance converges again.
    ``steady_steps (B,)`` receives each series' number of mean-only steps."""
    num_batch, duration, p = y.shape
    S = m0.shape[1]
    store = m_out.shape[1] == duration
    static = G.shape[1] == 1 and F.shape[1] == 1 and W.shape[1] == 1 and V.shape[1] == 1
    m = np.empty(S)
    P = np.empty((S, S))
    mp = np.empty(S)
    Pp = np.empty((S, S))
    previous = np.empty((S, S))
    GP = np.empty((S, S))
    observed = np.empty(p, dtype=np.int64)
    FP = np.empty((p, S))
    L = np.empty((p, p))
    e = np.empty(p)
    for b in range(num_batch):
        total = 0.0
        # steady: FP holds the gain's factor Z = L^{-1} F P^-, L the innovation covariance's
        # factor, P and Pp the fixed point; settled: the last step was fully observed.
        steady = False
        settled = False
        half_log_det = 0.0
        steady_steps[b] = 0
        for t in range(duration):
            n = 0
            for i in range(p):
                if not math.isnan(y[b, t, i]):
                    observed[n] = i
                    n += 1
            switch = False  # whether this step's full update gives the fixed point
            if t == 0:
                copy_vector(m0[b], mp)
                copy_matrix(P0[b], Pp)
            else:
                g = G[b, t if G.shape[1] > 1 else 0]
                w = W[b, t if W.shape[1] > 1 else 0]
                for i in range(S):
                    acc = 0.0
                    for k in range(S):
                        acc += g[i, k] * m[k]
                    mp[i] = acc
                if not steady:
                    copy_matrix(Pp, previous)
                    _sandwich(g, P, w, GP, Pp)
                    switch = static and settled and n == p and _converged(Pp, previous, S)
            if n < p:
                steady = False  # Pp is still the fixed point's; this step updates in full
            if store:
                copy_vector(mp, mp_out[b, t])
                copy_matrix(Pp, Pp_out[b, t])
            copy_vector(mp, m)
            if steady:
                steady_steps[b] += 1
                f = F[b, 0]
                for a in range(p):
                    acc = 0.0
                    for k in range(S):
                        acc += f[a, k] * mp[k]
                    e[a] = y[b, t, a] - acc
                for a in range(p):
                    for c in range(a):
                        e[a] -= L[a, c] * e[c]
                    e[a] /= L[a, a]
                    total += -0.5 * e[a] * e[a]
                    for i in range(S):
                        m[i] += FP[a, i] * e[a]
                total -= half_log_det + 0.5 * p * _LOG_2PI
            else:
                copy_matrix(Pp, P)
            if n > 0 and not steady:
                f = F[b, t if F.shape[1] > 1 else 0]
                v = V[b, t if V.shape[1] > 1 else 0]
                # FP = F_o P^- (n x S); the innovation covariance F_o P^- F_o^T + V_oo.
                for a in range(n):
                    row = observed[a]
                    for j in range(S):
                        acc = 0.0
                        for k in range(S):
                            acc += f[row, k] * Pp[k, j]
                        FP[a, j] = acc
                    acc = 0.0
                    for k in range(S):
                        acc += f[row, k] * mp[k]
                    e[a] = y[b, t, row] - acc
                for a in range(n):
                    for c in range(a + 1):
                        acc = 0.0
                        for k in range(S):
                            acc += FP[a, k] * f[observed[c], k]
                        L[a, c] = acc + 0.5 * (
                            v[observed[a], observed[c]] + v[observed[c], observed[a]]
                        )
                if not _cholesky(L, n):
                    return b * duration + t
                # Z = L^{-1} F_o P^-, z = L^{-1} e (forward substitution, in place).
                half_log_det = 0.0
                for a in range(n):
                    d = L[a, a]
                    for c in range(a):
                        e[a] -= L[a, c] * e[c]
                        for j in range(S):
                            FP[a, j] -= L[a, c] * FP[c, j]
                    e[a] /= d
                    for j in range(S):
                        FP[a, j] /= d
                    half_log_det += math.log(d)
                    total += -0.5 * e[a] * e[a] - math.log(d) - 0.5 * _LOG_2PI
                # m = m^- + Z^T z, P = P^- - Z^T Z (exactly symmetric).
                for a in range(n):
                    for i in range(S):
                        m[i] += FP[a, i] * e[a]
                for i in range(S):
                    for j in range(i + 1):
                        acc = 0.0
                        for a in range(n):
                            acc += FP[a, i] * FP[a, j]
                        P[i, j] -= acc
                        P[j, i] = P[i, j]
            settled = n == p
            steady = steady or switch
            if store:
                copy_vector(m, m_out[b, t])
                copy_matrix(P, P_out[b, t])
        ll[b] = total
    return -1


@_jit
def _equal(a, b, S):
    """Whether the ``S x S`` matrices ``a`` and ``b`` are equal entry for entry."""
    for i in range(S):
        for j in range(S):
            if a[i, j] != b[i, j]:
                return False
    return True


@_jit
def smoother(G, m, P, mp, Pp, ms, Ps, gains):
    """Rauch-Tung-Striebel smoother from the filter's moments: ``ms (B, T, S)``, ``Ps (B,
    T, S, S)`` and the gains :math:`E_t = P_t G_{t+1}^T P_{t+1|t}^{-1}` ``(B, T-1, S, S)``.
    Where the filter's covariances repeat exactly (its steady state, with static ``G``), a
    gain is the next step's, copied rather than factorised again. Returns ``-1`` on success,
    else the flat index ``b * T + t`` of the first predicted covariance ``P_{t|t-1}`` that
    is not positive definite."""
    num_batch, duration, S = m.shape
    L = np.empty((S, S))
    X = np.empty((S, S))
    d = np.empty(S)
    D = np.empty((S, S))
    ED = np.empty((S, S))
    for b in range(num_batch):
        copy_vector(m[b, duration - 1], ms[b, duration - 1])
        copy_matrix(P[b, duration - 1], Ps[b, duration - 1])
        for t in range(duration - 2, -1, -1):
            if (
                G.shape[1] == 1
                and t + 2 < duration
                and _equal(P[b, t], P[b, t + 1], S)
                and _equal(Pp[b, t + 1], Pp[b, t + 2], S)
            ):
                # The filter's steady state (or any repeat of the same covariances): the
                # gain is the next step's, bit for bit, without its factorisation.
                copy_matrix(gains[b, t + 1], gains[b, t])
            else:
                g = G[b, t + 1 if G.shape[1] > 1 else 0]
                copy_matrix(Pp[b, t + 1], L)
                if not _cholesky(L, S):
                    return b * duration + t + 1
                # X = G P_t (S x S); solve P^-_{t+1} E^T = X, so E = X^T P^-_{t+1}^{-1}.
                _product(g, P[b, t], X, S, S, S)
                _cholesky_solve(L, X, S, S)
                for i in range(S):  # E = X^T
                    for j in range(S):
                        gains[b, t, i, j] = X[j, i]
            E = gains[b, t]
            for i in range(S):
                d[i] = ms[b, t + 1, i] - mp[b, t + 1, i]
                for j in range(S):
                    D[i, j] = Ps[b, t + 1, i, j] - Pp[b, t + 1, i, j]
            for i in range(S):
                acc = 0.0
                for k in range(S):
                    acc += E[i, k] * d[k]
                ms[b, t, i] = m[b, t, i] + acc
            _sandwich(E, D, P[b, t], ED, Ps[b, t])
    return -1


@_jit
def score(y, G, F, V, P, mp, Pp, ms, Ps, gains, g_y, g_G, g_F, g_W, g_V, g_m0, g_P0):
    r"""The gradient of :math:`\log p(y)` by Fisher's identity, from the filter's filtered
    (``P``) and predicted (``mp, Pp``) moments and the smoother's (``ms, Ps, gains``): see
    :func:`~pyro_ext.timeseries.kalman._score_terms` for the formulas. Adds into the
    zero-filled outputs, each shaped as its input (a static matrix's gradient is summed over
    the steps); ``g_m0 (B, S)``, ``g_P0 (B, S, S)``. Returns ``-1`` on success, else the flat
    index ``b * T + t`` of the first predicted or observation covariance (over the step's
    observed coordinates) that is not positive definite."""
    num_batch, duration, p = y.shape
    S = ms.shape[2]
    L = np.empty((S, S))
    r = np.empty((S, 1))
    X = np.empty((S, S))
    N = np.empty((S, S))
    A = np.empty((S, S))
    observed = np.empty(p, dtype=np.int64)
    Lv = np.empty((p, p))
    u = np.empty((p, 1))
    VF = np.empty((p, S))
    VFP = np.empty((p, S))
    Vi = np.empty((p, p))
    for b in range(num_batch):
        for t in range(duration):
            copy_matrix(Pp[b, t], L)
            if not _cholesky(L, S):
                return b * duration + t
            # r = P^-1 (x_hat - a); X = P^-1 (P - P_hat); N = X P^-1 (symmetric).
            for i in range(S):
                r[i, 0] = ms[b, t, i] - mp[b, t, i]
                for j in range(S):
                    X[i, j] = Pp[b, t, i, j] - Ps[b, t, i, j]
            _cholesky_solve(L, r, S, 1)
            _cholesky_solve(L, X, S, S)
            for i in range(S):
                for j in range(S):
                    N[i, j] = X[j, i]
            _cholesky_solve(L, N, S, S)
            for i in range(S):
                for j in range(i + 1):
                    A[i, j] = r[i, 0] * r[j, 0] - 0.5 * (N[i, j] + N[j, i])
                    A[j, i] = A[i, j]
            if t == 0:
                for i in range(S):
                    g_m0[b, i] = r[i, 0]
                    for j in range(S):
                        g_P0[b, i, j] = 0.5 * A[i, j]
            else:
                gw = g_W[b, t if g_W.shape[1] > 1 else 0]
                gg = g_G[b, t if g_G.shape[1] > 1 else 0]
                E = gains[b, t - 1]
                # d/dG_t = r_t x_hat_{t-1}^T - N_t G_t P_{t-1|t-1}, and N_t G_t P_{t-1|t-1}
                # = X_t E_{t-1}^T (the smoother's gain E_{t-1} = P_{t-1|t-1} G_t^T P_t^-1).
                for i in range(S):
                    for j in range(S):
                        gw[i, j] += 0.5 * A[i, j]
                        acc = 0.0
                        for k in range(S):
                            acc += X[i, k] * E[j, k]
                        gg[i, j] += r[i, 0] * ms[b, t - 1, j] - acc
            n = 0
            for i in range(p):
                if not math.isnan(y[b, t, i]):
                    observed[n] = i
                    n += 1
            if n == 0:
                continue
            f = F[b, t if F.shape[1] > 1 else 0]
            v = V[b, t if V.shape[1] > 1 else 0]
            gf = g_F[b, t if g_F.shape[1] > 1 else 0]
            gv = g_V[b, t if g_V.shape[1] > 1 else 0]
            for a in range(n):
                row = observed[a]
                acc = 0.0
                for k in range(S):
                    acc += f[row, k] * ms[b, t, k]
                    VF[a, k] = f[row, k]
                u[a, 0] = y[b, t, row] - acc
                for c in range(n):
                    Lv[a, c] = 0.5 * (v[row, observed[c]] + v[observed[c], row])
                    Vi[a, c] = 1.0 if a == c else 0.0
            if not _cholesky(Lv, n):
                return b * duration + t
            _cholesky_solve(Lv, u, n, 1)
            _cholesky_solve(Lv, VF, n, S)
            _cholesky_solve(Lv, Vi, n, n)
            _product(VF, Ps[b, t], VFP, n, S, S)
            for a in range(n):
                row = observed[a]
                g_y[b, t, row] = -u[a, 0]
                for k in range(S):
                    gf[row, k] += u[a, 0] * ms[b, t, k] - VFP[a, k]
                for c in range(n):
                    acc = 0.0
                    for k in range(S):
                        acc += VFP[a, k] * VF[c, k]
                    gv[row, observed[c]] += 0.5 * (u[a, 0] * u[c, 0] - Vi[a, c] + acc)
    return -1


@_jit
def tangent_filter(y, G, F, W, v, m0, P0, dW, dV, out):
    """The log-likelihood of one series of scalar observations ``y (T,)`` (NaN where
    missing) under static ``G (S, S)``, ``F (S,)`` (the observation row), ``W (S, S)``
    (diagonal in ``fit_dlm``) and variance ``v``, and its derivatives along ``K``
    directions in which ``W``'s diagonal moves by ``dW[k] (S,)`` and ``v`` by ``dV[k]``: forward-mode sensitivities
    carried through the covariance-form filter with the moments (:func:`fit_dlm
    <pyro_ext.timeseries.fit_dlm>`'s gradient with respect to its squared scales, in one pass
    instead of the filter, the RTS smoother and the score). Writes ``out[0]`` the
    log-likelihood, ``out[1 + k]`` its derivative along direction ``k`` and ``out[1 + K]``
    the number of steady-state steps (below). Returns ``-1``, or the first step whose
    innovation variance is not positive.

    With ``h = P^- F^T``, ``s = F h + v``, ``e = y - F m^-``: ``d log p = -(ds / s + 2 e de /
    s - e^2 ds / s^2) / 2``, ``dm = dm^- + (dh / s - h ds / s^2) e + h de / s`` and ``dP =
    dP^- - (dh h^T + h dh^T) / s + h h^T ds / s^2``; the prediction carries ``dm^- = G dm``,
    ``dP^- = G dP G^T + diag(dW[k])``.

    As :func:`filter`, it switches to the steady state once the predicted covariance and
    its derivatives have all stopped moving between two observed steps (:func:`_converged`):
    later observed steps update the means and their derivatives only (``O(K S^2)`` instead
    of ``O(K S^3)``); a missing step leaves the steady state until they converge again."""
    duration = y.shape[0]
    S = m0.shape[0]
    K = dV.shape[0]
    m, mp, h = np.empty(S), np.empty(S), np.empty(S)
    P, Pp = np.empty((S, S)), np.empty((S, S))
    previous, work, zero = np.empty((S, S)), np.empty((S, S)), np.zeros((S, S))
    # The derivatives along each direction: of m, m^-, h, P, P^- and s.
    dm, dmp, dh = np.zeros((K, S)), np.zeros((K, S)), np.empty((K, S))
    dP, dPp, ds = np.zeros((K, S, S)), np.zeros((K, S, S)), np.empty(K)
    s = 1.0
    total = 0.0
    for k in range(K):
        out[1 + k] = 0.0
    steady = False
    settled = False
    steady_steps = 0
    for t in range(duration):
        observed = not math.isnan(y[t])
        switch = False
        if t == 0:
            copy_vector(m0, mp)
            copy_matrix(P0, Pp)
        else:
            for i in range(S):
                acc = 0.0
                for j in range(S):
                    acc += G[i, j] * m[j]
                mp[i] = acc
            for k in range(K):
                for i in range(S):
                    acc = 0.0
                    for j in range(S):
                        acc += G[i, j] * dm[k, j]
                    dmp[k, i] = acc
            if not steady:
                switch = settled and observed
                copy_matrix(Pp, previous)
                _sandwich(G, P, W, work, Pp)
                switch = switch and _converged(Pp, previous, S)
                for k in range(K):
                    copy_matrix(dPp[k], previous)
                    _sandwich(G, dP[k], zero, work, dPp[k])
                    for i in range(S):
                        dPp[k, i, i] += dW[k, i]
                    switch = switch and _converged(dPp[k], previous, S)
        if not observed:
            # The steady state's Pp and dPp are still the fixed point's; P and dP follow.
            steady = False
            settled = False
            copy_vector(mp, m)
            copy_matrix(Pp, P)
            for k in range(K):
                copy_vector(dmp[k], dm[k])
                copy_matrix(dPp[k], dP[k])
            continue
        e = y[t]
        for i in range(S):
            e -= F[i] * mp[i]
        if not steady:
            # h, s, dh and ds: the fixed point's once steady, so kept from here.
            s = v
            for i in range(S):
                acc = 0.0
                for j in range(S):
                    acc += Pp[i, j] * F[j]
                h[i] = acc
                s += F[i] * acc
            if not s > 0.0:
                return t
            for k in range(K):
                acc_s = dV[k]
                for i in range(S):
                    acc = 0.0
                    for j in range(S):
                        acc += dPp[k, i, j] * F[j]
                    dh[k, i] = acc
                    acc_s += F[i] * acc
                ds[k] = acc_s
        else:
            steady_steps += 1
        total += -0.5 * (_LOG_2PI + math.log(s) + e * e / s)
        for k in range(K):
            de = 0.0
            for i in range(S):
                de -= F[i] * dmp[k, i]
            out[1 + k] += -0.5 * (ds[k] / s + 2.0 * e * de / s - e * e * ds[k] / (s * s))
            for i in range(S):
                dm[k, i] = dmp[k, i] + (dh[k, i] / s - h[i] * ds[k] / (s * s)) * e + h[i] * (de / s)
        for i in range(S):
            m[i] = mp[i] + h[i] * (e / s)
        if not steady:
            for i in range(S):
                for j in range(S):
                    P[i, j] = Pp[i, j] - h[i] * h[j] / s
            for k in range(K):
                for i in range(S):
                    for j in range(S):
                        dP[k, i, j] = (
                            dPp[k, i, j]
                            - (dh[k, i] * h[j] + h[i] * dh[k, j]) / s
                            + h[i] * h[j] * ds[k] / (s * s)
                        )
        settled = True
        steady = steady or switch
    out[0] = total
    out[1 + K] = steady_steps
    return -1


@_jit
def em_statistics(y, G, F, ms, Ps, gains, state_totals):
    r"""EM's M-step sums (Shumway & Stoffer 1982) for one series of scalar observations
    ``y (T,)`` (NaN where missing) under a static ``G (S, S)`` and ``F (S,)``, from the
    smoothed moments ``ms (T, S)``, ``Ps (T, S, S)`` and the RTS gains ``(T - 1, S, S)``:
    ``state_totals[i]`` receives :math:`\sum_{t \ge 1} E[(x_t - G x_{t-1})_i^2 \mid y]`,
    with :math:`\mathrm{Cov}(x_t, x_{t-1} \mid y) = P_t E_{t-1}^\top`. Returns
    :math:`\sum_t E[(y_t - F x_t)^2 \mid y]` over the observed steps and their number."""
    duration, S = ms.shape
    for i in range(S):
        state_totals[i] = 0.0
    observation_total = 0.0
    observed = 0
    for t in range(duration):
        if not math.isnan(y[t]):
            fitted = 0.0
            spread = 0.0
            for j in range(S):
                fitted += F[j] * ms[t, j]
                acc = 0.0
                for k in range(S):
                    acc += Ps[t, j, k] * F[k]
                spread += F[j] * acc
            observation_total += (y[t] - fitted) ** 2 + spread
            observed += 1
        if t == 0:
            continue
        for i in range(S):
            residual = ms[t, i]
            propagated = 0.0  # (G P_{t-1} G^T)_ii
            crossed = 0.0  # (Cov(x_t, x_{t-1}) G^T)_ii
            for j in range(S):
                residual -= G[i, j] * ms[t - 1, j]
                gp = 0.0
                cross = 0.0
                for k in range(S):
                    gp += G[i, k] * Ps[t - 1, k, j]
                    cross += Ps[t, i, k] * gains[t - 1, j, k]
                propagated += gp * G[i, j]
                crossed += cross * G[i, j]
            state_totals[i] += residual * residual + Ps[t, i, i] + propagated - 2.0 * crossed
    return observation_total, observed
