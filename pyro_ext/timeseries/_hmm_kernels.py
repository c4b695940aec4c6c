"""The numba kernels of :mod:`._hmm_sequential` (imported only when numba is installed).

Module-level functions, so that numba's on-disk cache (``cache=True``) serves every later
process: compiling them takes seconds, loading them milliseconds.

Shapes: ``B`` series, ``T`` steps, ``K`` states, ``n = 1`` (homogeneous) or ``T - 1``
transition matrices. ``log_trans``/``trans`` are ``(B, n, K, K)`` indexed ``[from, to]``,
``*_t`` the same transposed to ``[to, from]`` (so every inner loop reads memory in order).
``obs`` ``(B, T, K)`` holds the log emissions, ``shift`` ``(B, T)`` their per-step maximum
(0 where every state is impossible) and ``emit = exp(obs - shift)``.
"""

import math

import numba
import numpy as np

# Below this, a probability-space step's normaliser may have lost digits to underflow (its
# terms below ~1e-308 flushed to zero), so the step is redone in log space.
_UNDERFLOW = 1e-250
# The product of step normalisers (each in (1e-250, 1]) is folded into the log once it
# leaves [1e-50, 1e50]: one log per many steps instead of one per step.
_FOLD = 1e-50

# Reassociation lets LLVM vectorise the inner products; no flag assumes finite values, so
# the -inf of impossible states keeps its meaning.
_jit = numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})


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
def prepare(log_trans, obs):
    """``(log_trans_t, trans, trans_t, emit, shift)`` from ``log_trans`` and ``obs``."""
    num_batch, duration, k_states = obs.shape
    log_trans_t = np.ascontiguousarray(log_trans.transpose(0, 1, 3, 2))
    trans = np.exp(log_trans)
    trans_t = np.exp(log_trans_t)
    emit = np.empty(obs.shape)
    shift = np.empty((num_batch, duration))
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
                emit[b, t, k] = math.exp(obs[b, t, k] - top)
    return log_trans_t, trans, trans_t, emit, shift


@_jit
def log_likelihood(log_init, log_trans, obs, out):
    """``out[b] = log p(x_{1:T})``."""
    log_trans_t, _, trans_t, emit, shift = prepare(log_trans, obs)
    none = np.empty((obs.shape[0], 0, obs.shape[2]))
    forward(log_init, log_trans_t, trans_t, obs, emit, shift, none, none[:, :, 0], out)


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
                filtered[b, 0, :] = alpha
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
                filtered[b, t, :] = alpha
                log_norms[b, t] = log_total + math.log(scale)
        if dead_from < duration:
            out[b] = -np.inf
            if store:
                filtered[b, dead_from:, :] = 0.0
                log_norms[b, dead_from:] = -np.inf
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
        beta[b, duration - 1, :] = 1.0
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
                    beta[b, : t + 1, :] = np.nan
                    break
                for j in range(k_states):
                    beta[b, t, j] = math.exp(new[j] - top_log)


@_jit
def expected_statistics(log_init, log_trans, obs, posterior, pairs, out):
    """Posterior marginals ``(B, T, K)``, two-slice marginals ``pairs`` shaped as
    ``log_trans`` (per step, or summed over the steps of a homogeneous chain) and ``log
    p(x)`` in ``out`` ``(B,)``, by one forward and one backward pass.

    The two messages are each normalised, so a state can underflow in one of them (a
    weight below ~1e-308 of its best) and still carry the posterior once multiplied by the
    other. A series where some marginal's normaliser comes out below ``_UNDERFLOW`` (the
    only way such a loss can matter) is redone in log space by
    :func:`_log_space_statistics`."""
    num_batch, duration, k_states = obs.shape
    log_trans_t, trans, trans_t, emit, shift = prepare(log_trans, obs)
    time_varying = trans.shape[1] > 1
    per_step = pairs.shape[1] > 1
    filtered = np.empty((num_batch, duration, k_states))
    log_norms = np.empty((num_batch, duration))
    forward(log_init, log_trans_t, trans_t, obs, emit, shift, filtered, log_norms, out)
    beta = np.empty((num_batch, duration, k_states))
    backward(log_trans, trans, obs, emit, shift, beta)
    pairs[:] = 0.0
    for b in range(num_batch):
        if out[b] == -np.inf:
            posterior[b] = np.nan
            pairs[b] = np.nan
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
        for t in range(duration - 1 if exact else 0):
            a = t if time_varying else 0
            row = t if per_step else 0
            total = 0.0
            for j in range(k_states):
                for k in range(k_states):
                    total += (
                        filtered[b, t, j]
                        * trans[b, a, j, k]
                        * emit[b, t + 1, k]
                        * beta[b, t + 1, k]
                    )
            if not total > _UNDERFLOW:
                exact = False
                break
            inv = 1.0 / total
            for j in range(k_states):
                f = filtered[b, t, j] * inv
                for k in range(k_states):
                    pairs[b, row, j, k] += (
                        f * trans[b, a, j, k] * emit[b, t + 1, k] * beta[b, t + 1, k]
                    )
        if not exact:
            pairs[b] = 0.0
            _log_space_statistics(log_init, log_trans, obs, b, posterior, pairs)


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
    log_beta[duration - 1, :] = 0.0
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
    for t in range(duration - 1):
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
    log_trans_t = np.ascontiguousarray(log_trans.transpose(0, 1, 3, 2))
    time_varying = log_trans_t.shape[1] > 1
    delta = np.empty(k_states)
    new = np.empty(k_states)
    pointers = np.empty((duration, k_states), dtype=np.int64)
    for b in range(num_batch):
        for k in range(k_states):
            delta[k] = log_init[b, k] + obs[b, 0, k]
        offset = delta.max()
        if offset == -np.inf:
            path[b, :] = 0
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
            path[b, :] = 0
            continue
        state = 0
        for k in range(1, k_states):
            if delta[k] > delta[state]:
                state = k
        path[b, duration - 1] = state
        for t in range(duration - 1, 0, -1):
            state = pointers[t, state]
            path[b, t - 1] = state
