r"""
Semirings for discrete hidden Markov models, the algebra of :mod:`pyro_ext.timeseries.hmm`.

A discrete HMM factorises as a chain of :math:`K \times K` factors, and every exact
query is a product of that chain in some semiring: the *sum-product* semiring gives the
forward–backward algorithm (likelihood, filtering, smoothing; Rabiner 1989), the
*max-product* semiring gives the Viterbi algorithm (Viterbi 1967), and composition of
index maps backtracks Viterbi paths and forward-filter backward-sample (FFBS; Frühwirth-
Schnatter 1994) draws. Products are associative, so they are evaluated with
:math:`O(\log T)` depth by :func:`~pyro_ext.ops.vector_reduce` and
:func:`~pyro_ext.ops.vector_scan`, which take the ``vec_mat`` and ``mat_mat``
products defined here (tuples of tensors whose dim 0 is time); a vector–matrix product
costs :math:`K^2` against a matrix product's :math:`K^3`. Three semirings are provided:

**Scaled sum-product.** Exponentiating once and multiplying in linear space is much
cheaper than ``logsumexp`` over ``(n, K, K, K)``. A matrix is stored as
``(mat, row_scale, offset)`` meaning ``log X[i, j] = offset + row_scale[i] +
log mat[i, j]`` with ``max_j mat[i, j] = 1`` and ``max_i row_scale[i] = 0``; a vector is
``(probs, log_norm)`` with ``probs`` summing to one. The large accumulated magnitudes live
only in ``offset``/``log_norm``, which are only ever added, so float32 keeps its relative
precision over long series. *Underflow limits*: within one product, row scales are
exponentiated, so from-states whose best continuation is more than ~700 nats (float64) or
~87 nats (float32) worse than the best from-state contribute zero; this matters only when
a message puts all of its mass on such states, where the result becomes ``-inf``.

**Max-plus** in log space, stored as ``(log_mat, offset)`` with the matrix maximum
shifted to zero (again so that float32 keeps precision along long series).

**Index-map composition**: a "matrix" is a map ``(K,)`` of state indices, a "vector" a
single state; used for pointer-jumping backtracking (``log T`` levels of gathers).
"""

import torch

from .scan import vector_scan

__all__ = [
    "finite_min",
    "scaled_matrix",
    "scaled_vector",
    "scaled_mat_mat",
    "scaled_vec_mat",
    "maxplus_matrix",
    "maxplus_vector",
    "maxplus_mat_mat",
    "maxplus_vec_mat",
    "map_mat_mat",
    "map_vec_mat",
    "compose_maps",
]


def finite_min(x):
    """The most negative finite value of ``x``'s dtype: ``y - m.clamp(min=finite_min(m))``
    subtracts a maximum ``m`` without turning an all ``-inf`` row into ``nan``."""
    return torch.finfo(x.dtype).min


# ---------------------------------------------------------------- scaled sum-product


def scaled_matrix(log_mat):
    """Log-space ``(..., K, K)`` → ``(mat, row_scale, offset)``; exponentiates once."""
    rows = log_mat.amax(-1)
    # Clamping keeps all -inf rows at exp(-inf) = 0 instead of exp(nan).
    mat = torch.exp(log_mat - rows.clamp(min=finite_min(rows)).unsqueeze(-1))
    offset = rows.amax(-1)
    return mat, rows - offset.clamp(min=finite_min(rows)).unsqueeze(-1), offset


def scaled_vector(log_vec):
    """Log-space ``(..., K)`` → ``(probs, log_norm)``."""
    log_norm = torch.logsumexp(log_vec, -1)
    probs = torch.exp(log_vec - log_norm.clamp(min=finite_min(log_norm)).unsqueeze(-1))
    return probs, log_norm


def scaled_mat_mat(a, b):
    """The sum-product ``a @ b`` of two scaled matrices."""
    a_mat, a_rows, a_off = a
    b_mat, b_rows, b_off = b
    # Folding b's row scales into a's columns is the same product and keeps b untouched.
    mat = torch.matmul(a_mat * torch.exp(b_rows).unsqueeze(-2), b_mat)
    row_max = mat.amax(-1)
    mat = mat / row_max.clamp(min=torch.finfo(mat.dtype).tiny).unsqueeze(-1)
    rows = a_rows + torch.log(row_max)
    shift = rows.amax(-1)
    rows = rows - shift.clamp(min=finite_min(rows)).unsqueeze(-1)
    return mat, rows, a_off + b_off + shift


def scaled_vec_mat(v, m):
    """The sum-product ``v @ m`` of a scaled vector and a scaled matrix."""
    probs, log_norm = v
    mat, rows, off = m
    w = probs * torch.exp(rows)
    out = torch.matmul(w.unsqueeze(-2), mat).squeeze(-2)
    total = out.sum(-1)
    out = out / total.clamp(min=torch.finfo(out.dtype).tiny).unsqueeze(-1)
    return out, log_norm + off + torch.log(total)


# ---------------------------------------------------------------- max-plus


def maxplus_matrix(log_mat):
    """Log-space ``(..., K, K)`` → ``(shifted_log_mat, offset)``."""
    offset = log_mat.amax((-2, -1))
    return log_mat - offset.clamp(min=finite_min(offset))[..., None, None], offset


def maxplus_vector(log_vec):
    """Log-space ``(..., K)`` → ``(shifted_log_vec, offset)``."""
    offset = log_vec.amax(-1)
    return log_vec - offset.clamp(min=finite_min(offset)).unsqueeze(-1), offset


def _maxplus_matmul(a, b):
    # Looping over the contracted index keeps memory at (n, K, K) instead of (n, K, K, K);
    # measured faster than the broadcast-and-amax form even at K = 3.
    out = a[..., :, 0, None] + b[..., None, 0, :]
    tmp = torch.empty_like(out)
    for j in range(1, a.shape[-1]):
        torch.add(a[..., :, j, None], b[..., None, j, :], out=tmp)
        torch.maximum(out, tmp, out=out)
    return out


def maxplus_mat_mat(a, b):
    """The max-product ``a @ b`` of two max-plus matrices."""
    mat = _maxplus_matmul(a[0], b[0])
    shift = mat.amax((-2, -1))
    mat = mat - shift.clamp(min=finite_min(shift))[..., None, None]
    return mat, a[1] + b[1] + shift


def maxplus_vec_mat(v, m):
    """The max-product ``v @ m`` of a max-plus vector and a max-plus matrix."""
    out = (v[0].unsqueeze(-1) + m[0]).amax(-2)
    shift = out.amax(-1)
    out = out - shift.clamp(min=finite_min(shift)).unsqueeze(-1)
    return out, v[1] + m[1] + shift


# ---------------------------------------------------------------- index maps


def map_mat_mat(a, b):
    """Compose maps: state ``k`` goes to ``b[a[k]]``."""
    return (torch.gather(b[0], -1, a[0]),)


def map_vec_mat(v, m):
    """Apply a map to a state: ``m[v]``."""
    return (torch.gather(m[0], -1, v[0].unsqueeze(-1)).squeeze(-1),)


def compose_maps(start, maps):
    """
    Pointer jumping: ``z_0 = start``, ``z_i = maps[i-1][z_{i-1}]`` for all ``i`` at once.

    :param torch.Tensor start: ``(...)`` long states.
    :param torch.Tensor maps: ``(n, ..., K)`` long maps.
    :returns: ``(n + 1, ...)`` long.
    """
    return vector_scan((start,), (maps,), map_vec_mat, map_mat_mat)[0]
