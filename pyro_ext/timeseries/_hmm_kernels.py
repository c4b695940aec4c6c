"""The numba kernels of :mod:`._hmm_sequential` (imported only when numba is installed).

Module-level functions, so that numba's on-disk cache (``cache=True``) serves every later
process. Everything is written as explicit loops: numba's array expressions and slice
assignments cost seconds each to compile (a process's first call, and every fresh install,
waits for them) and run no faster here.

Shapes: ``B`` series, ``T`` steps, ``K`` states, ``n = 1`` (homogeneous) or ``T - 1``
transition matrices. ``log_trans``/``trans`` are ``(B, n, K, K)`` indexed ``[from, to]``,
``*_t`` the same transposed to ``[to, from]`` (so every inner loop reads memory in order).
``obs`` ``(B, T, K)`` holds the log emissions, ``shift`` ``(B, T)`` their per-step maximum
(0 where every state is impossible) and ``emit = exp(obs - shift)``.
"""

import math

import numba
import numpy as np

from ._kernel_loops import copy_matrix, fill
from ._kernel_loops import jit as _jit

# Below this, a probability-space step's normaliser may have lost digits to underflow (its
# terms below ~1e-308 flushed to zero), so the step is redone in log space.
_UNDERFLOW = 1e-250
# The product of step normalisers (each in (1e-250, 1]) is folded into the log once it
# leaves [1e-50, 1e50]: one log per many steps instead of one per step.
_FOLD = 1e-50

# Without fast-math: :func:`_exp_into`'s range reduction is exact only as written.
_exact_jit = numba.njit(cache=True, nogil=True)

# exp(x) = 2^k exp(r), k = round(x / ln 2), r = x - k ln 2 in [-ln 2 / 2, ln 2 / 2]
# (Cody & Waite 1980: ln 2 split in two so that k ln2_hi is exact).
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
# Adding 1.5 * 2^52 rounds to an integer and leaves it in the low bits of the mantissa.
_ROUND = 6755399441055744.0
_ROUND_BITS = 0x4338000000000000
# Below this exp(x) < 2^-1021 (near the smallest normal float), returned as 0: a term that
# small only matters where a normaliser falls below _UNDERFLOW, and every such step is
# redone in log space from the log emissions themselves.
_EXP_FLOOR = -708.0
_EXP_CEIL = 709.0


@_exact_jit
def _exp_in_place(x):
    """``x = exp(x)`` over a 1-d array, to 1 ulp for ``x <= 709`` (the kernels' arguments
    are log-probabilities shifted to at most 0), with 0 below ``exp(-708)`` and NaN kept.
    Branch-free loops over blocks that LLVM vectorises: numba's ``math.exp`` is a scalar
    libm call per element, 2-3x slower, and the forward pass of a small-K chain is mostly
    these exponentials."""
    block = 256
    scale = np.empty(block)
    bits = scale.view(np.int64)
    for start in range(0, x.shape[0], block):
        chunk = x[start : start + block]
        size = chunk.shape[0]
        for i in range(size):
            v = chunk[i]
            clamped = min(max(v, _EXP_FLOOR), _EXP_CEIL)
            rounded = clamped * _LOG2E + _ROUND
            k = rounded - _ROUND
            r = clamped - k * _LN2_HI
            r = r - k * _LN2_LO
            # Taylor to degree 13: the remainder is below 4e-18 on |r| <= ln 2 / 2.
            p = 1.0 / 6227020800.0
            p = p * r + 1.0 / 479001600.0
            p = p * r + 1.0 / 39916800.0
            p = p * r + 1.0 / 3628800.0
            p = p * r + 1.0 / 362880.0
            p = p * r + 1.0 / 40320.0
            p = p * r + 1.0 / 5040.0
            p = p * r + 1.0 / 720.0
            p = p * r + 1.0 / 120.0
            p = p * r + 1.0 / 24.0
            p = p * r + 1.0 / 6.0
            p = p * r + 0.5
            p = p * r + 1.0
            p = p * r + 1.0
            chunk[i] = p if v > _EXP_FLOOR else (0.0 if v == v else v)
            scale[i] = rounded
        # 2^k assembled from its bits: exponent field k + 1023.
        for i in range(size):
            bits[i] = (bits[i] - _ROUND_BITS + 1023) << 52
        for i in range(size):
            chunk[i] *= scale[i]


@_jit
def _log_sum_exp(v):
    m = v.max()
    if m == -np.inf:
        return -np.inf
    s = 0.0
    for i in range(v.shape[0]):
        s += math.exp(v[i] - m)
    return m + math.log(s)


@_jit
def _transposed(log_trans):
    """``log_trans`` with its last two axes swapped, C-ordered."""
    num_batch, count, k_states, _ = log_trans.shape
    out = np.empty(log_trans.shape)
    for b in range(num_batch):
        for a in range(count):
            for i in range(k_states):
                for j in range(k_states):
                    out[b, a, j, i] = log_trans[b, a, i, j]
    return out


@_jit
def _exp(x):
    """``exp`` of a C-ordered array of any rank, by :func:`_exp_in_place`."""
    out = x.copy()
    _exp_in_place(out.reshape(out.size))
    return out


@_jit
def prepare(log_trans, obs):
    """``(log_trans_t, trans, trans_t, emit, shift)`` from ``log_trans`` and ``obs``."""
    num_batch, duration, k_states = obs.shape
    log_trans_t = _transposed(log_trans)
    shift = np.empty((num_batch, duration))
    emit = np.empty(obs.shape)
    for b in range(num_batch):
        for t in range(duration):
            top = obs[b, t, 0]
            for k in range(1, k_states):
                if obs[b, t, k] > top:
                    top = obs[b, t, k]
            if top == -np.inf:
                top = 0.0
            shift[b, t] = top
            for k in range(k_states):
                emit[b, t, k] = obs[b, t, k] - top
    _exp_in_place(emit.reshape(emit.size))
    return log_trans_t, _exp(log_trans), _exp(log_trans_t), emit, shift


@_jit
def log_likelihood(log_init, log_trans, obs, out):
    """``out[b] = log p(x_{1:T})``."""
    log_trans_t, _, trans_t, emit, shift = prepare(log_trans, obs)
    # Empty placeholders, C-ordered like :func:`filtered`'s outputs, so that both callers
    # share one compiled ``forward``.
    forward(
        log_init,
        log_trans_t,
        trans_t,
        obs,
        emit,
        shift,
        np.empty((obs.shape[0], 0, obs.shape[2])),
        np.empty((obs.shape[0], 0)),
        out,
    )


@_jit
def filtered(log_init, log_trans, obs, probs, log_norms, out):
    """The filtered probabilities ``(B, T, K)``, running log normalisers ``(B, T)`` and
    ``log p(x)``."""
    log_trans_t, _, trans_t, emit, shift = prepare(log_trans, obs)
    forward(log_init, log_trans_t, trans_t, obs, emit, shift, probs, log_norms, out)


@_jit
def forward(log_init, log_trans_t, trans_t, obs, emit, shift, filtered, log_norms, out):
    """Scaled forward pass: ``out[b] = log p(x_{1:T})``; where ``filtered`` is ``(B, T,
    K)`` (not a ``(B, 0, K)`` placeholder) also the filtered probabilities and the running
    ``log p(x_{1:t})`` in ``log_norms`` ``(B, T)``. A step whose normaliser would underflow
    is redone in log space; an impossible prefix gives ``-inf`` and zero probabilities."""
    num_batch, duration, k_states = obs.shape
    store = filtered.shape[1] == duration
    time_varying = trans_t.shape[1] > 1
    alpha = np.empty(k_states)
    new = np.empty(k_states)
    terms = np.empty(k_states)
    for b in range(num_batch):
        for i in range(k_states):
            new[i] = log_init[b, i] + obs[b, 0, i]
        log_total = _log_sum_exp(new)
        dead_from = duration
        if log_total == -np.inf:
            dead_from = 0
        else:
            for i in range(k_states):
                alpha[i] = math.exp(new[i] - log_total)
            if store:
                for i in range(k_states):
                    filtered[b, 0, i] = alpha[i]
                log_norms[b, 0] = log_total
        scale = 1.0
        for t in range(1, dead_from):
            a = t - 1 if time_varying else 0
            total = 0.0
            for i in range(k_states):
                acc = 0.0
                for j in range(k_states):
                    acc += trans_t[b, a, i, j] * alpha[j]
                acc *= emit[b, t, i]
                new[i] = acc
                total += acc
            if total > _UNDERFLOW:
                inv = 1.0 / total
                for i in range(k_states):
                    alpha[i] = new[i] * inv
                log_total += shift[b, t]
                scale *= total
                if scale < _FOLD or scale > 1.0 / _FOLD:
                    log_total += math.log(scale)
                    scale = 1.0
            else:
                # Log space: nothing flushed to zero is lost here.
                for i in range(k_states):
                    for j in range(k_states):
                        la = math.log(alpha[j]) if alpha[j] > 0 else -np.inf
                        terms[j] = la + log_trans_t[b, a, i, j]
                    new[i] = _log_sum_exp(terms) + obs[b, t, i] - shift[b, t]
                step = _log_sum_exp(new)
                if step == -np.inf:
                    dead_from = t
                    break
                for i in range(k_states):
                    alpha[i] = math.exp(new[i] - step)
                log_total += shift[b, t] + step
            if store:
                for i in range(k_states):
                    filtered[b, t, i] = alpha[i]
                log_norms[b, t] = log_total + math.log(scale)
        if dead_from < duration:
            out[b] = -np.inf
            if store:
                for t in range(dead_from, duration):
                    for i in range(k_states):
                        filtered[b, t, i] = 0.0
                    log_norms[b, t] = -np.inf
        else:
            out[b] = log_total + math.log(scale)


@_jit
def backward(log_trans, trans, obs, emit, shift, beta):
    """Backward messages ``(B, T, K)``, each step rescaled to max one (their scale cancels
    in every normalised marginal), with the forward pass's log-space fallback."""
    num_batch, duration, k_states = obs.shape
    time_varying = trans.shape[1] > 1
    weighted = np.empty(k_states)
    new = np.empty(k_states)
    terms = np.empty(k_states)
    for b in range(num_batch):
        for k in range(k_states):
            beta[b, duration - 1, k] = 1.0
        for t in range(duration - 2, -1, -1):
            a = t if time_varying else 0
            for k in range(k_states):
                weighted[k] = emit[b, t + 1, k] * beta[b, t + 1, k]
            top = 0.0
            for j in range(k_states):
                acc = 0.0
                for k in range(k_states):
                    acc += trans[b, a, j, k] * weighted[k]
                new[j] = acc
                if acc > top:
                    top = acc
            if top > _UNDERFLOW:
                inv = 1.0 / top
                for j in range(k_states):
                    beta[b, t, j] = new[j] * inv
            else:
                for j in range(k_states):
                    for k in range(k_states):
                        lb = math.log(beta[b, t + 1, k]) if beta[b, t + 1, k] > 0 else -np.inf
                        terms[k] = log_trans[b, a, j, k] + obs[b, t + 1, k] - shift[b, t + 1] + lb
                    new[j] = _log_sum_exp(terms)
                top_log = new.max()
                if top_log == -np.inf:
                    for s in range(t + 1):
                        for j in range(k_states):
                            beta[b, s, j] = np.nan
                    break
                for j in range(k_states):
                    beta[b, t, j] = math.exp(new[j] - top_log)


@_jit
def expected_statistics(log_init, log_trans, obs, posterior, pairs, out):
    """Posterior marginals ``(B, T, K)``, two-slice marginals ``pairs`` shaped as
    ``log_trans`` (per step, or summed over the steps of a homogeneous chain; a ``(B, 0, K,
    K)`` placeholder skips them) and ``log p(x)`` in ``out`` ``(B,)``, by one forward and
    one backward pass.

    The two messages are each normalised, so a state can underflow in one of them (a
    weight below ~1e-308 of its best) and still carry the posterior once multiplied by the
    other. A series where some marginal's normaliser comes out below ``_UNDERFLOW`` (the
    only way such a loss can matter) is redone in log space by
    :func:`_log_space_statistics`."""
    num_batch, duration, k_states = obs.shape
    log_trans_t, trans, trans_t, emit, shift = prepare(log_trans, obs)
    time_varying = trans.shape[1] > 1
    want_pairs = pairs.shape[1] > 0
    per_step = pairs.shape[1] > 1
    filtered = np.empty((num_batch, duration, k_states))
    log_norms = np.empty((num_batch, duration))
    forward(log_init, log_trans_t, trans_t, obs, emit, shift, filtered, log_norms, out)
    beta = np.empty((num_batch, duration, k_states))
    backward(log_trans, trans, obs, emit, shift, beta)
    weights = np.empty(k_states)
    summed = np.empty((k_states, k_states))
    for b in range(num_batch):
        fill(pairs[b], 0.0)
        if out[b] == -np.inf:
            fill(posterior[b], np.nan)
            fill(pairs[b], np.nan)
            continue
        exact = True
        for t in range(duration):
            total = 0.0
            for k in range(k_states):
                posterior[b, t, k] = filtered[b, t, k] * beta[b, t, k]
                total += posterior[b, t, k]
            if not total > _UNDERFLOW:
                exact = False
                break
            inv = 1.0 / total
            for k in range(k_states):
                posterior[b, t, k] *= inv
        fill(summed, 0.0)
        # xi_t[j, k] = filtered_t[j] A[j, k] emit_{t+1}[k] beta_{t+1}[k] / normaliser.
        for t in range(duration - 1 if exact and want_pairs else 0):
            a = t if time_varying else 0
            for k in range(k_states):
                weights[k] = emit[b, t + 1, k] * beta[b, t + 1, k]
            total = 0.0
            for j in range(k_states):
                acc = 0.0
                for k in range(k_states):
                    acc += trans[b, a, j, k] * weights[k]
                total += filtered[b, t, j] * acc
            if not total > _UNDERFLOW:
                exact = False
                break
            inv = 1.0 / total
            for j in range(k_states):
                f = filtered[b, t, j] * inv
                if per_step:
                    for k in range(k_states):
                        pairs[b, t, j, k] = f * trans[b, a, j, k] * weights[k]
                else:
                    for k in range(k_states):
                        summed[j, k] += f * trans[b, a, j, k] * weights[k]
        if not exact:
            fill(pairs[b], 0.0)
            _log_space_statistics(log_init, log_trans, obs, b, posterior, pairs)
        elif want_pairs and not per_step:
            copy_matrix(summed, pairs[b, 0])


@_jit
def _log_space_statistics(log_init, log_trans, obs, b, posterior, pairs):
    """Forward-backward of series ``b`` in log space (``K^2`` exponentials per step): the
    exact fallback of :func:`expected_statistics`."""
    _, duration, k_states = obs.shape
    time_varying = log_trans.shape[1] > 1
    per_step = pairs.shape[1] > 1
    log_alpha = np.empty((duration, k_states))
    log_beta = np.empty((duration, k_states))
    terms = np.empty(k_states)
    for k in range(k_states):
        log_alpha[0, k] = log_init[b, k] + obs[b, 0, k]
    for t in range(1, duration):
        a = t - 1 if time_varying else 0
        for k in range(k_states):
            for j in range(k_states):
                terms[j] = log_alpha[t - 1, j] + log_trans[b, a, j, k]
            log_alpha[t, k] = _log_sum_exp(terms) + obs[b, t, k]
    for k in range(k_states):
        log_beta[duration - 1, k] = 0.0
    for t in range(duration - 2, -1, -1):
        a = t if time_varying else 0
        for j in range(k_states):
            for k in range(k_states):
                terms[k] = log_trans[b, a, j, k] + obs[b, t + 1, k] + log_beta[t + 1, k]
            log_beta[t, j] = _log_sum_exp(terms)
    log_norm = _log_sum_exp(log_alpha[duration - 1])
    for t in range(duration):
        for k in range(k_states):
            posterior[b, t, k] = math.exp(log_alpha[t, k] + log_beta[t, k] - log_norm)
    for t in range(duration - 1 if pairs.shape[1] > 0 else 0):
        a = t if time_varying else 0
        row = t if per_step else 0
        for j in range(k_states):
            for k in range(k_states):
                v = log_alpha[t, j] + log_trans[b, a, j, k] + obs[b, t + 1, k]
                pairs[b, row, j, k] += math.exp(v + log_beta[t + 1, k] - log_norm)


@_jit
def viterbi(log_init, log_trans, obs, path, log_score):
    """Most probable path ``(B, T)`` (first index on ties, as ``argmax``) and its log joint
    ``(B,)``; messages shifted to max 0 per step."""
    num_batch, duration, k_states = obs.shape
    log_trans_t = _transposed(log_trans)
    time_varying = log_trans_t.shape[1] > 1
    delta = np.empty(k_states)
    new = np.empty(k_states)
    pointers = np.empty((duration, k_states), dtype=np.int64)
    for b in range(num_batch):
        for k in range(k_states):
            delta[k] = log_init[b, k] + obs[b, 0, k]
        offset = delta.max()
        if offset == -np.inf:
            for t in range(duration):
                path[b, t] = 0
            log_score[b] = -np.inf
            continue
        for k in range(k_states):
            delta[k] -= offset
        for t in range(1, duration):
            a = t - 1 if time_varying else 0
            top = -np.inf
            for i in range(k_states):
                best = delta[0] + log_trans_t[b, a, i, 0]
                arg = 0
                for j in range(1, k_states):
                    v = delta[j] + log_trans_t[b, a, i, j]
                    if v > best:
                        best = v
                        arg = j
                best += obs[b, t, i]
                new[i] = best
                pointers[t, i] = arg
                if best > top:
                    top = best
            if top == -np.inf:
                offset = -np.inf
                break
            for i in range(k_states):
                delta[i] = new[i] - top
            offset += top
        log_score[b] = offset
        if offset == -np.inf:
            for t in range(duration):
                path[b, t] = 0
            continue
        state = 0
        for k in range(1, k_states):
            if delta[k] > delta[state]:
                state = k
        path[b, duration - 1] = state
        for t in range(duration - 1, 0, -1):
            state = pointers[t, state]
            path[b, t - 1] = state
