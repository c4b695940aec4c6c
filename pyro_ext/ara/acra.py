"""
Adversarial risk analysis for adversarial classification with a generative classifier
(ACRA, Naveiro et al. 2019; thesis section 3.4.1, eqs. 3.8-3.12 and Algorithm 3.1).

The defender observes a possibly attacked instance :math:`x'` and decides its class with
eq. (3.9), where the unknown attack enters through the attacker model
:math:`p_C(x' \\mid x, y_1)`: the attacker inserts at most ``n`` words choosing
:math:`\\arg\\min_z P^A_z` (eq. 3.11) with random :math:`P^A_z \\sim \\mathcal{B}e` of mean
:math:`r(z) = p_C(y_1 \\mid z)`.
"""

import functools
import itertools
import math

import numpy as np
import pyro
import pyro.distributions as dist
import scipy.special as sc
import torch
from pyro.distributions import TorchDistribution
from pyro.infer.importance import vectorized_importance_weights
from torch.distributions import constraints

from ..ops.validation import check_choice, check_int, check_real, check_real_tensor
from .naive_bayes import BernoulliNaiveBayes, check_binary
from .words import (
    _EXACT_COUNT_TERMS,
    MAX_ENUMERATION,
    _attack_candidates,
    _check_candidates,
    check_budget,
    check_enumeration,
    check_max_enumeration,
    count_subsets,
    originating_instances,
)

__all__ = [
    "ACRA",
    "RandomWordInsertionAttack",
    "attack_log_probs",
    "attack_mc_probs",
    "attack_prob_bounds",
    "beta_concentrations",
    "count_acra_candidates",
]

METHODS = ("bounded", "exact", "mc", "sequential", "importance")
# Mass of the chosen candidate's Beta left outside the quadrature range, and the threshold
# below which a CDF counts as 0 (the absolute error of a probability is a few times this).
TAIL = 1e-12
# Beyond +20 the Beta's mass sits within 1e-9 of 1, which float64 cannot resolve; beyond -300
# its second concentration overflows. (The reference code clamps r at 1 - 1e-4.)
LOGIT_RANGE = (-300.0, 20.0)
_MC_CHUNK = 1 << 22  # Beta draws held in memory at once by the Monte Carlo estimate
# Logit grids of attack_prob_bounds, coarse to fine, that method="bounded" tries in turn.
BOUND_STEPS = (0.5, 0.125, 0.03125)
# Slack of the bounds: the absolute and relative error granted to scipy's Beta CDF, the
# rounding between two evaluations of one logit (at least; more for float32 classifiers),
# and the relative rounding of a quadrature value or a sum of them.
_CDF_ATOL, _CDF_RTOL = 1e-12, 1e-9
_LOGIT_ATOL = 1e-9
_SUM_RTOL = 1e-9
_MIN_LOG = -1e250  # stands for log 0 in the tables (0 * -inf would be NaN)
_BOUND_ROWS = 1 << 16  # competitors scored by one call of a classifier without weights


def _gauss_legendre_panels():
    """Panels ``(u, log_weight, upper)`` covering ``[TAIL, 1 - TAIL]`` in increasing ``u``;
    for the upper half the nodes are stored as ``1 - u``, which keeps them exact near 1."""
    # Refined geometrically towards u = 0 and u = 1, where a competitor whose mean lies a few
    # standard deviations away switches from irrelevant to decisive.
    edges = [TAIL, 1e-9, 1e-6, 1e-4, 1e-3, 1e-2, 0.05, 0.15, 0.3, 0.5]
    nodes, weights = np.polynomial.legendre.leggauss(8)
    lower = [
        ((b - a) / 2 * nodes + (a + b) / 2, np.log((b - a) / 2 * weights))
        for a, b in zip(edges, edges[1:])
    ]
    upper = [(u[::-1], log_w[::-1]) for u, log_w in reversed(lower)]
    return [(u, log_w, False) for u, log_w in lower] + [(u, log_w, True) for u, log_w in upper]


_PANELS = _gauss_legendre_panels()


def check_var(var):
    """``var``, a proportion of the largest unimodal Beta variance, in ``(0, 1]``."""
    return check_real(var, "var (a proportion of the maximum variance)", 0, 1, low_open=True)


def beta_concentrations(logit, var):
    """
    Concentrations :math:`(\\delta_1, \\delta_2)` of the attacker's random probability
    :math:`P^A_z \\sim \\mathcal{B}e(\\delta_1, \\delta_2)` (section 3.4.1, below eq. 3.11) with
    mean :math:`r = \\sigma(\\text{logit})` and variance ``var`` times
    :math:`r \\min\\{r(1-r)/(1+r), (1-r)^2/(2-r)\\}`, the largest variance of a unimodal Beta
    (:math:`\\delta_1, \\delta_2 \\ge 1`) with mean :math:`r` -- the rule of the authors' code
    (roinaveiro/ACRA_spam_experiment), which keeps every ``var`` in (0, 1] feasible.

    :param torch.Tensor logit: Log-odds :math:`\\log r/(1-r)`; clamped to ``LOGIT_RANGE``.
    :param float var: Proportion of the maximum variance, in (0, 1]. ``var -> 0`` is the
        deterministic attacker of common knowledge.
    :returns: ``(delta1, delta2)``, float64 tensors shaped like ``logit``.
    """
    logit = logit.to(torch.float64).clamp(*LOGIT_RANGE)
    r, s = torch.sigmoid(logit), torch.sigmoid(-logit)  # s = 1 - r without cancellation
    max_share = torch.minimum(r * s / (1 + r), s * s / (2 - r))
    delta1 = r * s / (var * max_share) - r
    return delta1, delta1 * s / r


def _numpy(t):
    return t.detach().cpu().numpy()


def _log_argmin_probs(chosen, alpha, beta, logit, row, num_rows):
    """
    :math:`\\log \\Pr(\\arg\\min_z P_z = z^*)` for independent Beta variables, by the
    one-dimensional integral :math:`\\int_0^1 h(u)\\, du`,
    :math:`h(u) = \\prod_{z \\ne z^*} (1 - F_z(Q^*(u)))` with :math:`Q^*` the chosen
    candidate's quantile function: Gauss-Legendre on panels in ``u``, the product in log space.

    ``h`` decreases in ``u``, which bounds what is left of the integral and lets a row stop
    once that rest is below ``TAIL``; competitors whose CDF is below ``TAIL`` over the whole range
    are left out. Stopping and screening change a probability by at most a few ``TAIL``
    (absolute); the 8-point rule on each panel is less accurate where ``h`` falls steeply
    (a few ``1e-8`` absolute on the 5-word model of the tests, against an adaptive
    quadrature).

    :param tuple chosen: ``(delta1, delta2)`` of :math:`z^*`, shared by every row.
    :param alpha, beta: Competitors' concentrations, flat numpy arrays.
    :param logit: Competitors' log-odds, to screen out sure losers cheaply.
    :param row: The row (set of candidates) each competitor belongs to.
    :returns: numpy array ``(num_rows,)``.
    """
    a_star, b_star = chosen
    p_lo, p_hi = sc.betaincinv(a_star, b_star, TAIL), sc.betainccinv(a_star, b_star, TAIL)
    log_tail = math.log(TAIL)
    # A competitor almost surely below the whole range of P* makes z* a sure loser; the one
    # of smallest mean is the natural suspect, and one CDF per row settles it.
    lowest = np.full(num_rows, np.inf)
    np.minimum.at(lowest, row, logit)
    suspect = logit == lowest[row]
    done = np.zeros(num_rows, bool)
    np.logical_or.at(done, row[suspect], sc.betaincc(alpha[suspect], beta[suspect], p_lo) < TAIL)
    # Competitors almost surely above the range never beat z*: their factor is 1.
    keep = ~done[row]
    keep[keep] = sc.betainc(alpha[keep], beta[keep], p_hi) >= TAIL
    alpha, beta, row = alpha[keep], beta[keep], row[keep]
    # h(TAIL) bounds the whole integral.
    with np.errstate(divide="ignore"):
        log_h = np.zeros(num_rows)
        np.add.at(log_h, row, np.log(sc.betaincc(alpha, beta, p_lo)))
    done |= log_h < log_tail
    log_integral = np.full(num_rows, -np.inf)
    for u, log_w, upper in _PANELS:
        if done.all():
            break
        active = ~done[row]
        quantile = sc.betainccinv if upper else sc.betaincinv
        nodes = quantile(a_star, b_star, u)
        log_h = np.zeros((num_rows, u.size))
        with np.errstate(divide="ignore"):
            terms = np.log(sc.betaincc(alpha[active, None], beta[active, None], nodes))
        np.add.at(log_h, row[active], terms)
        panel = sc.logsumexp(log_h + log_w, axis=-1)
        log_integral[~done] = np.logaddexp(log_integral, panel)[~done]
        done |= log_h[:, -1] + math.log(u[-1] if upper else 1 - u[-1]) < log_tail
    return log_integral


def _candidate_sets(originals, n, insert):
    """Flat attack candidates of every original row, with the row index of each."""
    sets = [_attack_candidates(x, n, insert) for x in originals]
    sizes = torch.tensor([c.shape[0] for c in sets], device=originals.device)
    row = torch.repeat_interleave(torch.arange(len(sets), device=originals.device), sizes)
    return torch.cat(sets), row, sizes


def count_acra_candidates(num_present, num_absent, n, limit=None):
    """
    The attack candidates that ACRA scores for one observed row with ``num_present`` words
    present and ``num_absent`` absent: for each originating instance (``k <= n`` present
    words deleted, :math:`\\binom{num\\_present}{k}` of them) every instance an ``n``-word
    insertion reaches from it, :math:`\\sum_{k \\le n} \\binom{p}{k} \\sum_{j \\le n}
    \\binom{a + k}{j}`. It bounds the work of every method of :class:`ACRA` (``"bounded"``
    tables and pairs are smaller; ``"mc"`` draws ``num_mc`` Beta variables per candidate).
    Counting stops once the sum exceeds ``limit``.
    """
    total = 0
    for k in range(min(n, num_present) + 1):
        total += math.comb(num_present, k) * count_subsets(num_absent + k, n, limit)
        if limit is not None and total > limit:
            break
    return total


def _float_rows(x):
    """0/1 rows of an integer or bool dtype as floating point (the quadrature writes
    ``-inf`` log-probabilities, and means, into tensors of the rows' dtype)."""
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())


def _check_rows(x, name, dims):
    check_binary(x, name)
    if x.dim() != dims:
        shape = "a single row of shape (D,)" if dims == 1 else "shape (N, D)"
        raise ValueError(f"{name} must be {shape}, got {tuple(x.shape)}")
    return _float_rows(x)


def _check_attack_arguments(x_prime, originals, logit_fn, n, var, insert, max_enumeration):
    """The checks of the public quadrature and Monte Carlo functions, before any work."""
    x_prime = _check_rows(x_prime, "x_prime", 1)
    originals = _check_rows(originals, "originals", 2)
    if originals.shape[-1] != x_prime.shape[-1]:
        raise ValueError(
            f"originals must have the {x_prime.shape[-1]} features of x_prime, got "
            f"{originals.shape[-1]}"
        )
    if not callable(logit_fn):
        raise TypeError(
            f"logit_fn must be a callable (M, D) -> (M,), got {type(logit_fn).__name__}"
        )
    n = check_budget(n, x_prime.shape[-1])
    var = check_var(var)
    _check_candidates(originals, n, insert, check_max_enumeration(max_enumeration), "originals")
    return x_prime, originals.to(x_prime.dtype), n, var


def attack_log_probs(
    x_prime, originals, logit_fn, n, var, insert=True, *, max_enumeration=MAX_ENUMERATION
):
    """
    Exact :math:`\\log p_C(x' \\mid x, y_1)` (the limit of eq. 3.12) for one observed
    ``x_prime`` and each row ``x`` of ``originals``, by quadrature.

    :param torch.Tensor x_prime: Observed row ``(D,)``.
    :param torch.Tensor originals: Candidate originating rows ``(B, D)``.
    :param callable logit_fn: Maps ``(M, D)`` rows to the log-odds of :math:`r(z)`.
    :param int max_enumeration: Most candidates one row of ``originals`` may have (see
        :func:`~pyro_ext.ara.words.attack_candidates`), checked before any is built.
    :returns: Tensor ``(B,)``, dtype (floating point) and device of ``originals``; ``-inf``
        where ``x_prime`` is not reachable from ``x``.
    """
    x_prime, originals, n, var = _check_attack_arguments(
        x_prime, originals, logit_fn, n, var, insert, max_enumeration
    )
    return _attack_log_probs(x_prime, originals, logit_fn, n, var, insert)


def _check_logits(logit, what="logit_fn"):
    """Log-odds as a float64 tensor without NaN (a NaN Beta mean makes every probability
    NaN), checked once per vectorised call."""
    try:
        logit = torch.as_tensor(logit)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(
            f"{what} must return a tensor of log-odds, got {type(logit).__name__}"
        ) from None
    logit = logit.double()
    nan = torch.isnan(logit)
    if nan.any():
        raise ValueError(
            f"{what} returned NaN log-odds (first at candidate row "
            f"{int(nan.reshape(-1).nonzero()[0, 0])}); the attacker model needs numbers"
        )
    return logit


def _attack_log_probs(x_prime, originals, logit_fn, n, var, insert=True, what="logit_fn"):
    """:func:`attack_log_probs` without the checks; ``what`` names ``logit_fn`` in errors."""
    unique, inverse = torch.unique(originals, dim=0, return_inverse=True)
    candidates, row, _ = _candidate_sets(unique, n, insert)
    is_star = (candidates == x_prime).all(-1)
    logit = _check_logits(logit_fn(candidates), what)
    if logit.shape != (candidates.shape[0],):
        raise ValueError(
            f"{what} must return one log-odds per row, shape ({candidates.shape[0]},), "
            f"got {tuple(logit.shape)}"
        )
    logit = logit.clamp(*LOGIT_RANGE)
    alpha, beta = beta_concentrations(logit, var)
    chosen = beta_concentrations(_check_logits(logit_fn(x_prime.unsqueeze(0)), what), var)
    others = _numpy(~is_star)
    result = _log_argmin_probs(
        (_numpy(chosen[0])[0], _numpy(chosen[1])[0]),
        _numpy(alpha)[others],
        _numpy(beta)[others],
        _numpy(logit)[others],
        _numpy(row)[others],
        unique.shape[0],
    )
    reachable = torch.zeros(unique.shape[0], dtype=torch.bool, device=row.device)
    reachable.index_put_((row[is_star],), torch.ones_like(row[is_star], dtype=torch.bool))
    result = torch.as_tensor(result, dtype=originals.dtype, device=originals.device)
    return result.masked_fill(~reachable, -math.inf)[inverse]


@functools.lru_cache(maxsize=256)
def _subset_table(size, n):
    """
    The subsets of ``range(size)`` with at most ``n`` elements in the order of
    :func:`~pyro_ext.ara.words.attack_candidates` (by size, then lexicographic):
    ``(subsets, index, sizes)``, a tuple of tuples, the same as a padded index matrix
    ``(M, n)`` (padding ``size``) and the sizes ``(M,)``.
    """
    subsets = tuple(
        subset for k in range(min(n, size) + 1) for subset in itertools.combinations(range(size), k)
    )
    index = np.full((len(subsets), n), size, dtype=np.int64)
    for i, subset in enumerate(subsets):
        index[i, : len(subset)] = subset
    return subsets, index, np.array([len(subset) for subset in subsets])


@functools.lru_cache(maxsize=256)
def _subset_pairs(size, n):
    """
    For every subset ``A`` of :func:`_subset_table` (an originating instance, ``A`` its
    deleted words) each ``A' <= A`` with the cap ``n - |A| + |A'|`` on the words the attacker
    adds outside ``A``: ``(sub, cap, starts)``, grouped by ``A`` (``starts`` opens each group).
    """
    subsets = _subset_table(size, n)[0]
    index = {subset: i for i, subset in enumerate(subsets)}
    sub, cap, starts = [], [], []
    for subset in subsets:
        starts.append(len(sub))
        for k in range(len(subset) + 1):
            for part in itertools.combinations(subset, k):
                sub.append(index[part])
                cap.append(n - len(subset) + k)
    return np.array(sub), np.array(cap), np.array(starts)


def _quadrature_nodes(chosen):
    """The nodes ``Q*(u)`` of every panel of :func:`_log_argmin_probs` and their log weights."""
    a_star, b_star = chosen
    nodes = [
        (sc.betainccinv if upper else sc.betaincinv)(a_star, b_star, u) for u, _, upper in _PANELS
    ]
    return np.concatenate(nodes), np.concatenate([log_w for _, log_w, _ in _PANELS])


def _log_survival_brackets(logit, nodes, var):
    """``(lower, upper)`` bounds on :math:`\\log(1 - F_L(q))` for the Beta of log-odds ``L``,
    shapes ``(len(logit), len(nodes))``, granting scipy's ``betainc`` an error of
    ``_CDF_RTOL`` (relative) plus ``_CDF_ATOL``. (Its complement ``betaincc`` is accurate in
    relative terms but ten to forty times slower.)"""
    alpha, beta = (_numpy(t)[:, None] for t in beta_concentrations(torch.as_tensor(logit), var))
    cdf = sc.betainc(alpha, beta, nodes)
    high = np.minimum(1.0, cdf * (1 + _CDF_RTOL) + _CDF_ATOL)
    low = np.maximum(0.0, cdf * (1 - _CDF_RTOL) - _CDF_ATOL)
    with np.errstate(divide="ignore"):
        return np.maximum(np.log1p(-high), _MIN_LOG), np.log1p(-low)


class _AttackBounds:
    """
    Bounds on what :func:`attack_log_probs` returns, :math:`p_C(x' \\mid x, y_1)` for every
    originating instance ``x`` of one observed ``x'`` (see :func:`attack_prob_bounds`).

    The competitors of ``x = x' - A`` (``A`` the words the attacker would have inserted,
    ``|A| <= n``) are ``x' - A' + B'`` with ``A' <= A`` and ``B'`` absent from ``x'``,
    ``|A - A'| + |B'| <= n``, except ``x'`` itself; their log-odds form one matrix over
    ``(A', B')`` (``|A'|, |B'| <= n``), shared by all the originating instances.
    """

    def __init__(self, x_prime, logit_fn, n, var, weights=None):
        self.n, self.var = n, var
        x_np = _numpy(x_prime).astype(bool)
        ones, zeros = np.flatnonzero(x_np), np.flatnonzero(~x_np)
        self.num_ones = ones.size
        deleted = _subset_table(ones.size, n)[1]
        added, self.sizes = _subset_table(zeros.size, n)[1:]
        # The chosen candidate's log-odds as attack_log_probs computes them.
        logit_star = torch.as_tensor(logit_fn(x_prime.unsqueeze(0)))
        _check_logits(logit_star)
        eps = torch.finfo(logit_star.dtype).eps if logit_star.is_floating_point() else 0.0
        logit_star = float(logit_star[0])
        if weights is not None:
            # Log-odds affine in the words: the matrix is an outer sum.
            w = _numpy(weights).astype(np.float64)
            w_del = np.append(w[ones], 0.0)[deleted].sum(-1)
            w_add = np.append(w[zeros], 0.0)[added].sum(-1)
            offset = w_add[None, :] - w_del[:, None]
            logits = logit_star + offset
        else:
            offset, logits = None, self._logits(x_prime, logit_fn, ones, zeros, deleted, added)
        low, high = LOGIT_RANGE
        self.logit_star = min(max(logit_star, low), high)
        if offset is not None and low <= logits.min() and logits.max() <= high:
            self.delta = offset  # no clamping: the offsets without cancellation
        else:
            self.delta = np.clip(logits, low, high) - self.logit_star
        # Two evaluations of a competitor's log-odds (ours, that of attack_log_probs) differ
        # by rounding, of the classifier's dtype.
        self.logit_atol = max(_LOGIT_ATOL, 1024 * eps * (1 + float(np.abs(logits).max())))
        chosen = beta_concentrations(torch.tensor([logit_star], dtype=torch.float64), var)
        self.nodes, self.log_w = _quadrature_nodes((_numpy(chosen[0])[0], _numpy(chosen[1])[0]))
        self._range = None

    @staticmethod
    def _logits(x_prime, logit_fn, ones, zeros, deleted, added):
        """The classifier's log-odds of every ``x' - A' + B'``, ``(len(deleted), len(added))``."""
        num_features = x_prime.shape[-1]

        def flips(positions, subsets):
            # One row per subset with its words set; the padding index hits a dropped column.
            index = torch.as_tensor(np.append(positions, num_features)[subsets])
            rows = x_prime.new_zeros((len(subsets), num_features + 1))
            return rows.scatter_(1, index.to(x_prime.device), 1)

        plus, minus = flips(zeros, added), flips(ones, deleted)
        rows = []
        chunk = max(1, _BOUND_ROWS // len(added))
        for start in range(0, len(deleted), chunk):
            z = x_prime - minus[start : start + chunk, None, :-1] + plus[None, :, :-1]
            logits = torch.as_tensor(logit_fn(z.reshape(-1, num_features)))
            _check_logits(logits)
            rows.append(_numpy(logits).astype(np.float64).reshape(-1, len(added)))
        return np.concatenate(rows)

    def _counts(self, column, width):
        """Competitors of every originating instance per column, ``(num_orig, width)``."""
        num_sets = self.delta.shape[0]
        flat = (np.arange(num_sets)[:, None] * (self.n + 1) + self.sizes) * width + column
        hist = np.bincount(flat.ravel(), minlength=num_sets * (self.n + 1) * width)
        hist = hist.reshape(num_sets, self.n + 1, width).cumsum(1)  # |B'| <= cap
        sub, cap, starts = _subset_pairs(self.num_ones, self.n)
        counts = np.add.reduceat(hist[sub, cap], starts, axis=0)
        counts[:, column[0, 0]] -= 1  # x' itself, (A', B') = (0, 0), is not a competitor
        return counts.astype(np.float64)

    def _decided_range(self):
        """The grid's range of offsets: the competitors' own, cut where a competitor's factor
        is 1 (above) or 0 (below) to double precision at every node (probed every 0.5), and
        at +-64. Only the tightness of the bounds depends on it."""
        if self._range is None:
            probes = 0.5 * np.arange(1, 129)
            limits = []
            for sign, extreme, node in ((1, self.delta.max(), -1), (-1, self.delta.min(), 0)):
                offsets = sign * probes[probes < sign * extreme]
                logits = np.clip(self.logit_star + offsets, *LOGIT_RANGE)
                concentrations = beta_concentrations(torch.as_tensor(logits), self.var)
                cdf = sc.betainc(*(_numpy(t) for t in concentrations), self.nodes[node])
                decided = np.flatnonzero(cdf <= 1e-16 if sign > 0 else cdf >= 1.0)
                limits.append(
                    offsets[decided[0]] if decided.size else sign * min(sign * extreme, 64.0)
                )
            self._range = (limits[1], limits[0])
        return self._range

    def at(self, step):
        """``(lower, upper)`` numpy bounds with competitors on a grid of log-odds ``step``."""
        # Grid points L* + step (j + 1/2), j = first..last; a competitor of offset d counts,
        # in the lower bound, as the grid point at or below d - logit_atol (column 0: below
        # the grid, factor 0) and, in the upper bound, as the one at or above
        # d + logit_atol (last column: above the grid, factor 1). Valid because the factor
        # 1 - F_L(q) grows with L (the Beta's first concentration grows with its mean and
        # the second shrinks), and so do h and its quadrature.
        low, high = self._decided_range()
        first, last = math.floor(low / step - 0.5), math.ceil(high / step - 0.5)
        grid = self.logit_star + step * (np.arange(first, last + 1) + 0.5)
        log_low, log_high = _log_survival_brackets(
            np.clip(grid, *LOGIT_RANGE), self.nodes, self.var
        )
        width = last - first + 2
        low_table = np.concatenate([np.full((1, self.nodes.size), _MIN_LOG), log_low])
        high_table = np.concatenate([log_high, np.zeros((1, self.nodes.size))])

        def column(slack):
            cell = np.floor((self.delta + slack) / step - 0.5) - (first - 1)
            return np.clip(cell, 0, width - 1).astype(np.int64)

        low_column, high_column = column(-self.logit_atol), column(self.logit_atol)
        low_counts = self._counts(low_column, width)
        # With the grid between the offsets (the chosen one, 0, sits mid-cell) both columns
        # agree, unless an offset lies within the rounding of a grid point.
        same = np.array_equal(low_column, high_column)
        high_counts = low_counts if same else self._counts(high_column, width)
        log_low_q = _logsumexp(low_counts @ low_table + self.log_w)
        log_high_q = _logsumexp(high_counts @ high_table + self.log_w)
        # attack_log_probs leaves out competitors whose factor is at least 1 - TAIL over the
        # whole range (at most the total count of them) and stops a row once what is left of
        # its integral is below TAIL: the quadrature of every competitor minus TAIL bounds it
        # from below.
        num_competitors = high_counts.sum(-1)
        lower = np.maximum(0.0, np.exp(log_low_q) * (1 - _SUM_RTOL) - TAIL * (1 + _SUM_RTOL))
        upper = np.exp(log_high_q + num_competitors * TAIL * (1 + _SUM_RTOL)) * (1 + _SUM_RTOL)
        return lower, np.minimum(upper, 1.0)


def _logsumexp(x):
    """``log(sum(exp(x), -1))`` for finite ``x``, without scipy's overhead."""
    top = x.max(-1, keepdims=True)
    return np.log(np.exp(x - top).sum(-1)) + top[..., 0]


def attack_prob_bounds(
    x_prime,
    logit_fn,
    n,
    var,
    step=BOUND_STEPS[0],
    weights=None,
    *,
    max_enumeration=MAX_ENUMERATION,
):
    """
    Guaranteed bounds on :func:`attack_log_probs` ``(x_prime, originating_instances(x_prime,
    n), ...)``, the quadrature value of :math:`p_C(x' \\mid x, y_1)` for every ``x`` that an
    ``n``-word insertion could have turned into ``x'``, at a cost that does not grow with
    the number of competitors.

    Competitor ``z`` enters the integrand :math:`\\prod_z (1 - F_z(q))` through its log-odds
    alone, and :math:`1 - F_z(q)` grows with them (:func:`beta_concentrations`: the first
    concentration grows with the mean, the second shrinks). Rounding each competitor's
    log-odds down (up) to a grid of spacing ``step`` around the chosen candidate's gives
    a lower (upper) bound at every quadrature node, with one Beta CDF per grid point and
    node instead of per competitor and node. The lower bound subtracts ``TAIL`` for the
    quadrature's early stop; both carry a slack for rounding and for scipy's ``betainc``
    (a relative ``1e-9`` and an absolute ``1e-12``).

    :param torch.Tensor x_prime: Observed row ``(D,)``.
    :param callable logit_fn: Maps ``(M, D)`` rows to the log-odds of :math:`r(z)`.
    :param float step: Grid spacing in log-odds.
    :param torch.Tensor weights: Optional ``(D,)``: the change of the log-odds when a word is
        added, for a classifier whose log-odds are affine in the words (naive Bayes); the
        competitors' log-odds then come without calling ``logit_fn`` on each of them.
    :param int max_enumeration: Most candidates allowed, counted as by
        :func:`count_acra_candidates` (which bounds the tables built here).
    :returns: ``(lower, upper)``, float64 tensors ``(M,)`` on the device of ``x_prime``.
    """
    x_prime = _check_rows(x_prime, "x_prime", 1)
    n = check_budget(n, x_prime.shape[-1])
    var = check_var(var)
    step = check_real(step, "step", 0, low_open=True)
    if not callable(logit_fn):
        raise TypeError(
            f"logit_fn must be a callable (M, D) -> (M,), got {type(logit_fn).__name__}"
        )
    if weights is not None:
        weights = check_real_tensor(weights, "weights")
        if weights.shape != x_prime.shape:
            raise ValueError(
                f"weights must have shape {tuple(x_prime.shape)} (one per word), got "
                f"{tuple(weights.shape)}"
            )
        if not torch.isfinite(weights).all():
            raise ValueError("weights must be finite")
    present = int(x_prime.sum())
    max_enumeration = check_max_enumeration(max_enumeration)
    count = count_acra_candidates(present, x_prime.shape[-1] - present, n, max_enumeration)
    check_enumeration(
        count, max_enumeration, f"attack_prob_bounds with n={n} on x_prime", "lower n"
    )
    bounds = _AttackBounds(x_prime, logit_fn, n, var, weights).at(step)
    return tuple(torch.as_tensor(b, device=x_prime.device) for b in bounds)


def attack_mc_probs(
    x_prime,
    originals,
    logit_fn,
    n,
    var,
    num_samples,
    insert=True,
    *,
    max_enumeration=MAX_ENUMERATION,
):
    """
    The Monte Carlo estimate (3.12) of :math:`p_C(x' \\mid x, y_1)`: the share of ``num_samples``
    draws of :math:`(P^A_z)_z` whose argmin is ``x_prime``, and its standard error.

    :param int max_enumeration: As for :func:`attack_log_probs`; the draws number
        ``num_samples`` per candidate.
    :returns: ``(estimate, stderr)``, tensors ``(B,)`` like ``originals`` (floating point).
    """
    x_prime, originals, n, var = _check_attack_arguments(
        x_prime, originals, logit_fn, n, var, insert, max_enumeration
    )
    num_samples = check_int(num_samples, "num_samples", low=1)
    return _attack_mc_probs(x_prime, originals, logit_fn, n, var, num_samples, insert)


def _attack_mc_probs(
    x_prime, originals, logit_fn, n, var, num_samples, insert=True, what="logit_fn"
):
    """:func:`attack_mc_probs` without the checks; ``what`` names ``logit_fn`` in errors."""
    candidates, row, sizes = _candidate_sets(originals, n, insert)
    alpha, beta = beta_concentrations(_check_logits(logit_fn(candidates), what), var)
    is_star = (candidates == x_prime).all(-1)
    # Pad each row's candidates to a rectangle; padded P's are +inf and never the argmin.
    width = int(sizes.max())
    slot = torch.arange(candidates.shape[0], device=row.device) - (sizes.cumsum(0) - sizes)[row]
    shape = (originals.shape[0], width)
    pad_alpha = alpha.new_ones(shape).index_put_((row, slot), alpha)
    pad_beta = beta.new_ones(shape).index_put_((row, slot), beta)
    valid = torch.zeros(shape, dtype=torch.bool, device=row.device).index_put_(
        (row, slot), torch.ones_like(row, dtype=torch.bool)
    )
    star = torch.full((shape[0],), -1, dtype=torch.long, device=row.device).index_put_(
        (row[is_star],), slot[is_star]
    )
    hits = []
    chunk = max(1, _MC_CHUNK // (num_samples * width))
    for start in range(0, shape[0], chunk):
        block = slice(start, start + chunk)
        draws = dist.Beta(pad_alpha[block], pad_beta[block]).sample((num_samples,))
        winners = draws.masked_fill(~valid[block], math.inf).argmin(-1)
        hits.append((winners == star[block]).to(originals.dtype).mean(0))
    estimate = torch.cat(hits)
    return estimate, (estimate * (1 - estimate) / num_samples).sqrt()


class RandomWordInsertionAttack(TorchDistribution):
    """
    The defender's model :math:`p_C(x' \\mid x, y_1)` of an n-GWI attacker without common
    knowledge (eq. 3.11): for each candidate :math:`z` reachable from the original ``x`` by at
    most ``n`` insertions, :math:`P^A_z \\sim \\mathcal{B}e` with mean :math:`r(z)` (the
    defender's :math:`p_C(y_1 \\mid z)`) and variance set by ``var`` (see
    :func:`beta_concentrations`), independently; the attack is
    :math:`x' = \\arg\\min_z P^A_z`.

    :meth:`log_prob` is exact (one-dimensional quadrature); :meth:`mc_probability` is the
    Monte Carlo estimate (3.12) of the thesis.

    :param torch.Tensor x: Original (malicious) rows, shape ``batch_shape + (D,)``.
    :param callable predict_proba: ``(M, D) -> (M,)`` classifier probabilities :math:`r(z)`.
    :param int n: Attacker budget.
    :param float var: Proportion of the maximum Beta variance, in (0, 1].
    :param callable predict_logit: Alternative to ``predict_proba`` returning log-odds, which
        keeps precision where :math:`r(z)` rounds to 0 or 1.
    :param bool insert: Word insertion (``True``) or deletion (``False``).
    :param int max_enumeration: Most candidates one row of ``x`` may have (default
        :data:`~pyro_ext.ara.words.MAX_ENUMERATION`): every method enumerates them, so a
        larger count is refused here, before any work.
    """

    arg_constraints = {}
    support = constraints.independent(constraints.boolean, 1)

    def __init__(
        self,
        x,
        predict_proba=None,
        n=2,
        var=0.1,
        *,
        predict_logit=None,
        insert=True,
        max_enumeration=MAX_ENUMERATION,
        validate_args=None,
    ):
        check_binary(x)
        if x.dim() < 1:
            raise ValueError("x must have a feature dimension")
        n = check_budget(n, x.shape[-1])
        var = check_var(var)
        if (predict_proba is None) == (predict_logit is None):
            raise ValueError("give exactly one of predict_proba and predict_logit")
        for name, fn in (("predict_proba", predict_proba), ("predict_logit", predict_logit)):
            if fn is not None and not callable(fn):
                raise TypeError(
                    f"{name} must be a callable (M, D) -> (M,), got {type(fn).__name__}"
                )
        if not isinstance(insert, bool):
            raise TypeError(f"insert must be a bool, got {type(insert).__name__}")
        self.max_enumeration = check_max_enumeration(max_enumeration)
        _check_candidates(x, n, insert, self.max_enumeration)
        self.x, self.n, self.var, self.insert = x, n, var, insert
        self.predict_proba, self.predict_logit = predict_proba, predict_logit
        super().__init__(x.shape[:-1], x.shape[-1:], validate_args=validate_args)

    @property
    def _logit_name(self):
        return "predict_logit" if self.predict_logit is not None else "predict_proba"

    def _logit(self, z):
        if self.predict_logit is not None:
            return torch.as_tensor(self.predict_logit(z), device=z.device)
        return torch.logit(torch.as_tensor(self.predict_proba(z), device=z.device).double())

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        return type(self)(
            self.x.expand(batch_shape + self.event_shape),
            self.predict_proba,
            self.n,
            self.var,
            predict_logit=self.predict_logit,
            insert=self.insert,
            max_enumeration=self.max_enumeration,
            validate_args=self._validate_args if _instance is None else None,
        )

    def sample(self, sample_shape=torch.Size()):
        rows = []
        for x in self.x.reshape(-1, self.x.shape[-1]):
            candidates = _attack_candidates(x, self.n, self.insert)
            logit = _check_logits(self._logit(candidates), self._logit_name)
            alpha, beta = beta_concentrations(logit, self.var)
            rows.append(candidates[dist.Beta(alpha, beta).sample(sample_shape).argmin(-1)])
        return torch.stack(rows, -2).reshape(self._extended_shape(sample_shape))

    def _per_observation(self, value, fn, num_outputs):
        # Rows sharing an observation share the quadrature nodes of its Beta: group them.
        value, x = torch.broadcast_tensors(value.to(self.x.dtype), self.x)
        flat_value, flat_x = value.reshape(-1, x.shape[-1]), x.reshape(-1, x.shape[-1])
        unique, inverse = torch.unique(flat_value, dim=0, return_inverse=True)
        dtype = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
        outputs = [x.new_empty(flat_x.shape[0], dtype=dtype) for _ in range(num_outputs)]
        for k, x_prime in enumerate(unique):
            rows = inverse == k
            for out, part in zip(outputs, fn(x_prime, flat_x[rows].to(dtype))):
                out[rows] = part
        return [out.reshape(value.shape[:-1]) for out in outputs]

    def log_prob(self, value):
        """Exact :math:`\\log p_C(x' = \\text{value} \\mid x, y_1)` by quadrature."""
        if self._validate_args:
            self._validate_sample(value)
        (log_prob,) = self._per_observation(
            value,
            lambda x_prime, x: (
                _attack_log_probs(
                    x_prime, x, self._logit, self.n, self.var, self.insert, self._logit_name
                ),
            ),
            1,
        )
        return log_prob

    def mc_probability(self, x_prime, num_samples=1000):
        """
        The Monte Carlo estimate (3.12) of :math:`p_C(x' \\mid x, y_1)` with ``num_samples``
        draws :math:`(P^A_z)_z`.

        :returns: ``(estimate, stderr)``, each shaped ``batch_shape``.
        """
        num_samples = check_int(num_samples, "num_samples", low=1)
        return tuple(
            self._per_observation(
                x_prime,
                lambda v, x: _attack_mc_probs(
                    v,
                    x,
                    self._logit,
                    self.n,
                    self.var,
                    num_samples,
                    self.insert,
                    self._logit_name,
                ),
                2,
            )
        )


class ACRA:
    """
    Adversarial classification risk analysis for a generative classifier (Algorithm 3.1,
    thesis eqs. 3.8-3.9). On observing :math:`x'` the defender uses

    .. math:: p_C(x' \\mid y_1) = \\sum_{x \\in \\mathcal X'(x')} p_C(x' \\mid x, y_1)\\,
        p_C(x \\mid y_1), \\qquad p_C(x' \\mid y_0) = p_C(x = x' \\mid y_0),

    (integrity attacks leave innocent instances untouched) and picks the class of maximum
    posterior expected utility. :math:`\\mathcal X'(x')` is enumerated exactly for n-GWI.

    Methods for the sum over :math:`\\mathcal X'(x')`:

    * ``"bounded"`` (default): the decisions of ``"exact"``, proven with bounds, at a small
      fraction of its cost. Writing the sum as :math:`S = \\sum_x m_x p_x`
      (:math:`m_x = p_C(x, y_1)`, :math:`p_x` the quadrature value of
      :math:`p_C(x' \\mid x, y_1)` that ``"exact"`` computes), the expected utility
      difference of the two decisions is linear in :math:`S`, so an interval
      :math:`[\\sum_x m_x l_x, \\sum_x m_x u_x]` with :math:`l_x \\le p_x \\le u_x` that keeps
      its sign settles the decision. The bounds are refined until it does: first
      :math:`[0, 1]` (most innocent-looking rows stop here), then
      :func:`attack_prob_bounds` on log-odds grids of step 0.5, 0.125 and 1/32 (cost
      independent of the number of competitors), then the exact :math:`p_x` of the
      originating instances with the widest :math:`m_x (u_x - l_x)`, in doubling batches.
      A decision is only taken when the margin exceeds ``1e-9`` (float64 inputs; ``2000``
      machine epsilons otherwise) times :math:`\\max |U| (S + p_C(x', y_0))`, which covers the
      rounding of both methods; a row whose margin stays below that after every
      :math:`p_x` is exact is decided by ``"exact"`` itself. :meth:`predict_proba`
      refines the same way until the posterior is known within ``proba_tol`` and returns
      the middle of its interval; :meth:`log_evidence` is that of ``"exact"``.
    * ``"exact"``: every term, :math:`p_C(x' \\mid x, y_1)` by quadrature.
    * ``"mc"``: every term, :math:`p_C(x' \\mid x, y_1)` by the ``num_mc``-draw Monte Carlo
      estimate (3.12), as in the thesis.
    * ``"sequential"``: terms in decreasing order of :math:`p_C(x \\mid y_1)`, stopping once
      the decision is settled: with partial sum :math:`S_k` and remaining prior mass
      :math:`R_k = \\sum_{\\text{rest}} p_C(x \\mid y_1)`, the sum lies in
      :math:`[S_k, S_k + R_k]` because :math:`p_C(x' \\mid x, y_1) \\le 1`, and the expected
      utility difference is linear in it. Decisions equal ``"exact"``; :meth:`predict_proba`
      returns the posterior of :math:`S_k`, a lower bound on the exact one.
    * ``"importance"``: ``num_proposals`` originating instances drawn from
      :math:`q(x) \\propto p_C(x \\mid y_1)` on :math:`\\mathcal X'(x')` (the :meth:`guide`) weigh
      the :meth:`model` with Pyro's importance sampling; the estimate of the sum is unbiased.

    :param generative_classifier: Fitted model with ``log_joint(x) -> (..., 2)`` returning
        :math:`\\log p_C(x \\mid y) + \\log p_C(y)`, e.g.
        :class:`~pyro_ext.ara.naive_bayes.BernoulliNaiveBayes`.
    :param int n: Attacker budget (words inserted).
    :param float var: Attacker uncertainty, a proportion of the maximum Beta variance.
    :param int num_mc: Monte Carlo draws ``K`` of eq. (3.12) (``method="mc"``).
    :param utility: ``(2, 2)`` matrix, ``utility[i, j]`` the defender's utility of deciding
        ``i`` when the class is ``j``; default the 0-1 utility.
    :param str method: One of ``"bounded"``, ``"exact"``, ``"mc"``, ``"sequential"``,
        ``"importance"``.
    :param int num_proposals: Importance samples per observed row (``method="importance"``).
    :param float proba_tol: Absolute error allowed to :meth:`predict_proba` with
        ``method="bounded"``, in (0, 1).
    :param int max_enumeration: Most attack candidates one observed row may need, counted
        by :func:`count_acra_candidates` (an upper bound on the work of every method) before
        any is built; a row beyond it is refused with ``ValueError``, as an exact answer
        would take hours or never come (n = 20 insertions into 40 absent words: 6.2e11).
        ``"bounded"`` still decides such a row when the trivial bounds
        :math:`0 \\le p_x \\le 1` settle it, which costs only its originating instances
        (counted too), and refuses it otherwise.
        The default, :data:`~pyro_ext.ara.words.MAX_ENUMERATION` = ``10**6``, covers every
        row of the thesis' n <= 2 attacks on Spambase's 54 words (at most 1.65e5) and keeps
        the worst admitted row of ``"exact"`` to seconds (3-20 s per 1e6 candidates on one
        CPU core); ``"mc"`` draws ``num_mc`` Beta variables per candidate on top.

    The classifier's ``log_joint`` is checked on the observed rows of every call (a
    floating-point tensor of shape ``(N, 2)``, finite), and on every later batch of
    candidates for NaN, so a broken classifier raises instead of deciding silently.
    """

    def __init__(
        self,
        generative_classifier,
        n=2,
        var=0.1,
        num_mc=1000,
        utility=None,
        method="bounded",
        num_proposals=100,
        proba_tol=1e-6,
        max_enumeration=MAX_ENUMERATION,
    ):
        if not callable(getattr(generative_classifier, "log_joint", None)):
            raise TypeError(
                "generative_classifier must provide a method log_joint(x) -> (..., 2), such as "
                f"BernoulliNaiveBayes; got {type(generative_classifier).__name__}"
            )
        n = check_int(n, "attacker budget n", low=0)
        var = check_var(var)
        num_mc = check_int(num_mc, "num_mc", low=1)
        num_proposals = check_int(num_proposals, "num_proposals", low=1)
        check_choice(method, "method", METHODS)
        proba_tol = check_real(proba_tol, "proba_tol", 0, 1, low_open=True, high_open=True)
        self.max_enumeration = check_max_enumeration(max_enumeration)
        try:
            utility = torch.eye(2) if utility is None else torch.as_tensor(utility)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(
                f"utility must be a (2, 2) matrix of numbers, got {type(utility).__name__}"
            ) from None
        if utility.is_complex() or utility.dtype == torch.bool:
            raise TypeError(f"utility must hold real numbers, got dtype {utility.dtype}")
        if utility.shape != (2, 2) or not torch.isfinite(utility).all():
            raise ValueError(
                f"utility must be a finite (2, 2) matrix, got shape {tuple(utility.shape)}"
                + ("" if utility.shape != (2, 2) else " with non-finite entries")
            )
        self.classifier = generative_classifier
        self.n, self.var, self.num_mc, self.method = n, var, num_mc, method
        self.num_proposals, self.proba_tol = num_proposals, proba_tol
        self.utility = utility.double()

    def _log_joint(self, z):
        """The classifier's ``log_joint(z)``, checked once per call: a floating-point tensor
        ``z.shape[:-1] + (2,)`` without NaN (a scan as cheap as the call itself)."""
        log_joint = self.classifier.log_joint(z)
        expected = tuple(z.shape[:-1]) + (2,)
        what = "generative_classifier.log_joint"
        if not torch.is_tensor(log_joint):
            raise TypeError(
                f"{what} must return a tensor of shape {expected} (log p(x, y) for y = 0, 1), "
                f"got {type(log_joint).__name__}"
            )
        if not log_joint.is_floating_point():
            raise TypeError(f"{what} must return floating-point values, got {log_joint.dtype}")
        if tuple(log_joint.shape) != expected:
            raise ValueError(
                f"{what} must return shape {expected}, one log p(x, y) per row and each of the "
                f"2 classes, got {tuple(log_joint.shape)}"
            )
        nan = torch.isnan(log_joint)
        if nan.any():
            row = int(nan.reshape(-1, 2).any(-1).nonzero()[0, 0])
            raise ValueError(f"{what} returned NaN (first at row {row} of its input {expected})")
        return log_joint

    def _logit(self, z):
        log_joint = self._log_joint(z)
        return log_joint[..., 1] - log_joint[..., 0]

    def attacker(self, x):
        """The attacker model :math:`p_C(x' \\mid x, y_1)` for original rows ``x``."""
        return RandomWordInsertionAttack(
            x,
            n=self.n,
            var=self.var,
            predict_logit=self._logit,
            max_enumeration=self.max_enumeration,
        )

    def _originals(self, x_observed):
        originals = originating_instances(x_observed, self.n, max_enumeration=self.max_enumeration)
        return originals, self._log_joint(originals)[:, 1]

    def model(self, x_observed):
        """
        The malicious branch of eq. (3.8) as a Pyro program: the clean instance ``x`` is drawn
        from :math:`p_C(x, y_1)` restricted to :math:`\\mathcal X'(x')`, then ``x'`` is observed
        from the attacker model. Its evidence is :math:`p_C(y_1)\\, p_C(x' \\mid y_1)`.
        """
        originals, log_joint = self._originals(x_observed)
        pyro.factor("restricted_mass", log_joint.logsumexp(0))
        index = pyro.sample("x", dist.Categorical(logits=log_joint))
        pyro.sample("x_prime", self.attacker(originals[index]), obs=x_observed)

    def guide(self, x_observed):
        """Proposes originating instances :math:`x \\propto p_C(x \\mid y_1)` on
        :math:`\\mathcal X'(x')`."""
        _, log_joint = self._originals(x_observed)
        pyro.sample("x", dist.Categorical(logits=log_joint))

    def _log_malicious(self, x_observed, originals, log_joint, log_innocent, method):
        if method == "importance":
            log_weights, _, _ = vectorized_importance_weights(
                self.model,
                self.guide,
                x_observed,
                num_samples=self.num_proposals,
                max_plate_nesting=0,
            )
            return log_weights.logsumexp(0) - math.log(self.num_proposals)
        if method == "sequential":
            return self._log_malicious_sequential(x_observed, originals, log_joint, log_innocent)
        if method == "mc":
            estimate, _ = _attack_mc_probs(
                x_observed, originals, self._logit, self.n, self.var, self.num_mc
            )
            log_attack = estimate.log()
        else:
            log_attack = _attack_log_probs(x_observed, originals, self._logit, self.n, self.var)
        return (log_joint + log_attack).logsumexp(0)

    def _log_malicious_sequential(self, x_observed, originals, log_joint, log_innocent):
        log_joint, order = log_joint.double().sort(descending=True)
        originals = originals[order]
        # Common scale so that the terms and the innocent evidence are O(1).
        shift = torch.maximum(log_joint.logsumexp(0), log_innocent.double())
        mass = (log_joint - shift).exp()
        remaining = mass.flip(0).cumsum(0).flip(0).tolist() + [0.0]
        innocent = float((log_innocent - shift).exp())
        u = self.utility.tolist()

        def gain(total):
            # Expected utility of deciding 1 minus deciding 0, linear in the malicious sum.
            return (u[1][1] - u[0][1]) * total + (u[1][0] - u[0][0]) * innocent

        total, start, size = 0.0, 0, 1
        while start < len(mass):
            stop = min(start + size, len(mass))
            log_attack = _attack_log_probs(
                x_observed, originals[start:stop], self._logit, self.n, self.var
            )
            total += float((mass[start:stop] * log_attack.double().exp()).sum())
            low, high = gain(total), gain(total + remaining[stop])
            # Geometric batches keep the loop short and each quadrature call vectorised.
            start, size = stop, 2 * size
            if (low > 0) == (high > 0):
                break
        return torch.tensor(total, dtype=torch.float64).log().to(log_joint) + shift

    def _weights(self):
        """The change of the log-odds per added word when they are affine in the words
        (:class:`BernoulliNaiveBayes`), else ``None``."""
        nb = self.classifier
        own = all(
            getattr(type(nb), name, None) is getattr(BernoulliNaiveBayes, name)
            for name in ("log_joint", "log_likelihood", "_check_input")
        )
        if not own or nb.log_prior is None:
            return None
        log_odds = nb.feature_log_prob - nb.feature_log1m_prob
        return log_odds[1] - log_odds[0]

    def _rows(self, x_observed, bounded=False):
        """
        The checks of every entry point, before any enumeration: binary rows ``(N, D)`` (an
        integer or bool dtype becomes floating point), the budget ``n``, the work of each row
        against ``max_enumeration``, and the classifier's ``log_joint`` on the rows.

        With ``bounded``, a row whose full count is over the budget but whose originating
        instances fit is let through, flagged in the returned list: ``method="bounded"``
        decides it if the trivial bounds :math:`0 \\le p_x \\le 1` settle it (cost: the
        originating instances) and refuses it otherwise (:meth:`_refuse`).
        :returns: ``(x, over)``, ``over[i]`` the refusal of row ``i`` or ``None``.
        """
        x_observed = _check_rows(x_observed, "x", 2)
        n = check_budget(self.n, x_observed.shape[-1])
        num_features = x_observed.shape[-1]
        present = x_observed.sum(-1).long()
        over = [None] * x_observed.shape[0]
        for count in torch.unique(present).tolist():
            work = count_acra_candidates(count, num_features - count, n, self.max_enumeration)
            if work <= self.max_enumeration:
                continue
            rows = (present == count).nonzero()[:, 0].tolist()
            # The exact count for the message, unless its sum is itself long.
            exact = (min(n, count) + 1) * (n + 1) <= _EXACT_COUNT_TERMS
            if exact:
                work = count_acra_candidates(count, num_features - count, n)
            refusal = functools.partial(
                check_enumeration,
                work,
                self.max_enumeration,
                f"ACRA with n={n} on x row {rows[0]} ({count} words present, "
                f"{num_features - count} absent)",
                "lower n (the sum of eq. 3.8 runs over every n-word insertion)",
                exact,
            )
            if not bounded or count_subsets(count, n, self.max_enumeration) > (
                self.max_enumeration
            ):
                refusal()
            for row in rows:
                over[row] = refusal
        if x_observed.shape[0]:
            log_joint = self._log_joint(x_observed)
            finite = torch.isfinite(log_joint)
            if not finite.all():
                row, col = (int(i) for i in (~finite).nonzero()[0])
                raise ValueError(
                    "generative_classifier.log_joint must be finite on the observed rows, got "
                    f"{float(log_joint[row, col])} for row {row} of x and class {col}: the "
                    "defender's decision weighs p(x, y) of both classes"
                )
        return x_observed, over

    def _exact_row(self, x_prime, method="exact"):
        log_innocent = self._log_joint(x_prime)[0]
        originals, log_joint = self._originals(x_prime)
        log_malicious = self._log_malicious(x_prime, originals, log_joint, log_innocent, method)
        return torch.stack([log_innocent, log_malicious.to(log_innocent)])

    def _rounding(self, x_observed):
        """Relative margin below which a bound-based decision defers to ``"exact"``."""
        if x_observed.dtype == torch.float64 or not x_observed.is_floating_point():
            return 1e-9
        return max(1e-9, 2000 * torch.finfo(x_observed.dtype).eps)

    def _bounded(self, x_prime, settled, refusal=None):
        """
        Bounds ``(innocent, low, high)`` on the evidence of one row, ``p_C(x', y_0)`` and
        :math:`S`, both scaled by a common factor, refined until ``settled(innocent, low,
        high)`` holds; ``None`` if it never does (see ``method="bounded"``). A row over the
        enumeration budget calls ``refusal`` (which raises) where the trivial bounds
        ``[0, 1]`` do not settle it, before any competitor is enumerated.
        """
        log_innocent = float(self._log_joint(x_prime)[0])
        originals, log_joint = self._originals(x_prime)
        log_joint = _numpy(log_joint).astype(np.float64)
        shift = max(float(sc.logsumexp(log_joint)), log_innocent)
        if not math.isfinite(shift):
            if refusal is not None:
                refusal()
            return None
        mass, innocent = np.exp(log_joint - shift), math.exp(log_innocent - shift)
        lower, upper = np.zeros_like(mass), np.ones_like(mass)

        def check():
            low, high = mass @ lower * (1 - _SUM_RTOL), mass @ upper * (1 + _SUM_RTOL)
            return (innocent, low, high) if settled(innocent, low, high) else None

        result = check()
        if result is not None:
            return result
        if refusal is not None:
            refusal()
        bounds = _AttackBounds(x_prime, self._logit, self.n, self.var, self._weights())
        for step in BOUND_STEPS:
            low, high = bounds.at(step)
            np.maximum(lower, low, out=lower)
            np.minimum(upper, high, out=upper)
            result = check()
            if result is not None:
                return result
        pending, size = np.ones(mass.size, dtype=bool), 1
        while pending.any():
            gap = np.where(pending, mass * (upper - lower), -1.0)
            pick = np.argsort(-gap, kind="stable")[: min(size, int(pending.sum()))]
            log_attack = _attack_log_probs(
                x_prime, originals[torch.as_tensor(pick, device=originals.device)],
                self._logit, self.n, self.var,
            )  # fmt: skip
            lower[pick] = upper[pick] = np.exp(_numpy(log_attack).astype(np.float64))
            pending[pick] = False
            size *= 2
            result = check()
            if result is not None:
                return result
        return None

    def _gain(self):
        """``(c1, c0, scale)``: deciding 1 minus deciding 0 is ``c1 S + c0 p_C(x', y_0)``."""
        u = self.utility.tolist()
        scale = float(self.utility.abs().max())
        return u[1][1] - u[0][1], u[1][0] - u[0][0], scale

    def log_evidence(self, x_observed):
        """
        :param torch.Tensor x_observed: Observed (possibly attacked) binary rows ``(N, D)``.
        :returns: :math:`\\log p_C(y) + \\log p_C(X' = x' \\mid y)` for ``y = 0, 1``, ``(N, 2)``;
            with ``method="bounded"`` that of ``"exact"``.
        """
        x_observed, _ = self._rows(x_observed)
        method = "exact" if self.method == "bounded" else self.method
        rows = [self._exact_row(x_prime, method) for x_prime in x_observed]
        return torch.stack(rows) if rows else x_observed.new_zeros((0, 2))

    def predict_proba(self, x_observed):
        """
        :returns: The defender's :math:`p_C(y_1 \\mid X' = x')`, accounting for the attack,
            shape ``(N,)``; with ``method="bounded"`` within ``proba_tol`` of ``"exact"``'s
            (the middle of a guaranteed interval at most ``2 proba_tol`` wide).
        """
        if self.method != "bounded":
            return self.log_evidence(x_observed).softmax(-1)[:, 1]
        x_observed, over = self._rows(x_observed, bounded=True)
        tol = self.proba_tol

        def posterior(innocent, total):
            return total / (total + innocent) if total + innocent > 0 else math.nan

        def settled(innocent, low, high):
            return posterior(innocent, high) - posterior(innocent, low) <= 2 * tol

        probs = []
        for x_prime, refusal in zip(x_observed, over):
            result = self._bounded(x_prime, settled, refusal)
            if result is None:
                probs.append(float(self._exact_row(x_prime).softmax(-1)[1]))
            else:
                innocent, low, high = result
                probs.append((posterior(innocent, low) + posterior(innocent, high)) / 2)
        return torch.tensor(probs, dtype=torch.float64, device=x_observed.device)

    def predict(self, x_observed):
        """
        Decisions maximising posterior expected utility (Algorithm 3.1), ``(N,)``; with
        ``method="bounded"`` provably those of ``"exact"`` (see the class docstring).
        """
        if self.method != "bounded":
            return self._decide(self.log_evidence(x_observed))
        x_observed, over = self._rows(x_observed, bounded=True)
        c1, c0, scale = self._gain()
        scale *= self._rounding(x_observed)

        def settled(innocent, low, high):
            gains = (c1 * low + c0 * innocent, c1 * high + c0 * innocent)
            margin = scale * (high + innocent)
            return min(gains) > margin or max(gains) < -margin

        decisions = []
        for x_prime, refusal in zip(x_observed, over):
            result = self._bounded(x_prime, settled, refusal)
            if result is None:
                decisions.append(int(self._decide(self._exact_row(x_prime).unsqueeze(0))[0]))
            else:
                innocent, low, _ = result
                decisions.append(int(c1 * low + c0 * innocent > 0))
        return torch.tensor(decisions, dtype=torch.long, device=x_observed.device)

    def _decide(self, log_evidence):
        posterior = log_evidence.softmax(-1).double()
        expected_utility = posterior @ self.utility.to(posterior.device).T
        return expected_utility.argmax(-1)
