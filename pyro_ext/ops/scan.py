r"""
Parallel prefix scans and reductions along dim 0, with :math:`O(\log n)` depth.

An associative product of ``n`` elements is evaluated level by level (Blelloch 1990;
Särkkä & García-Fernández 2021, "Temporal parallelization of Bayesian smoothers"), each
level one batched call of the product over all pairs, never with a Python loop over the
elements. Elements are tuples of tensors whose dim 0 indexes the sequence, so one element
may hold several tensors (a Gaussian's moments, a scaled matrix and its log-scales):

* :func:`vector_reduce` — ``v @ X_1 @ ... @ X_n`` by pairwise tree reduction.
* :func:`vector_scan` — all prefixes ``v @ X_1 @ ... @ X_i`` with the odd–even scheme
  (pair up neighbours, recurse on the half-length sequence, then fix up the remaining
  prefixes with one vector–matrix product each): :math:`O(n)` matrix products in total,
  and the fix-ups are vector–matrix, so when a vector is cheaper than a matrix (a row of
  :math:`K` states against a :math:`K \times K` factor) only the pairing pays for matrices.
* :func:`associative_scan` — the inclusive scan ``e_0, e_0 e_1, ..., e_0 ... e_{n-1}`` of
  elements of one kind: :func:`vector_scan` from the identity, with one product in both
  roles.

The products only need to be associative, not commutative: ``combine(a, b)`` is ``a``
followed by ``b``. :mod:`pyro_ext.ops.semiring` provides the discrete-HMM semirings, and
the Kalman filter and smoother of :mod:`pyro_ext.timeseries.kalman` combine Gaussian
elements with :func:`associative_scan`.
"""

import torch

__all__ = ["associative_scan", "vector_reduce", "vector_scan"]


def _slice(elements, index):
    return tuple(x[index] for x in elements)


def _interleave(evens, odds):
    """``evens[0], odds[0], evens[1], ...``; ``evens`` is as long as ``odds`` or one longer."""
    n = odds.shape[0]
    # stack/cat rather than strided writes into a new tensor: torch.func.vmap cannot write
    # a batched tensor into an unbatched one.
    pairs = torch.stack([evens[:n], odds], 1).reshape(2 * n, *evens.shape[1:])
    return torch.cat([pairs, evens[n:]]) if evens.shape[0] > n else pairs


def vector_reduce(vector, matrices, vec_mat, mat_mat):
    """
    ``vector @ matrices[0] @ ... @ matrices[n-1]`` by pairwise tree reduction.

    :param tuple vector: the vector's tensors, without a dim for the sequence.
    :param tuple matrices: the matrices' tensors, the sequence on dim 0 (may have length 0).
    :param callable vec_mat: ``vec_mat(vector, matrix)``, the product of a vector and a
        matrix (each a tuple of tensors), without a sequence dim.
    :param callable mat_mat: ``mat_mat(a, b)``, the associative product of two matrices.
    :returns: the vector's tensors.
    """
    while matrices[0].shape[0] > 0:
        if matrices[0].shape[0] % 2:
            # Absorb the odd leading matrix into the vector so the rest pairs up evenly.
            vector = vec_mat(vector, _slice(matrices, 0))
            matrices = _slice(matrices, slice(1, None))
            if matrices[0].shape[0] == 0:
                break
        matrices = mat_mat(_slice(matrices, slice(0, None, 2)), _slice(matrices, slice(1, None, 2)))
    return vector


def _check_scan_args(vector, matrices, vec_mat, mat_mat, names):
    """Types of the scan arguments (``names``: how the caller calls them)."""
    for fn, name in ((vec_mat, names[2]), (mat_mat, names[3])):
        if not callable(fn):
            raise TypeError(f"{name} must be a callable, got {fn!r}")
    for value, name in ((vector, names[0]), (matrices, names[1])):
        if value is None and name == names[0]:
            continue
        if not isinstance(value, (tuple, list)) or not value:
            raise TypeError(f"{name} must be a non-empty tuple of tensors, got {value!r}")
        for x in value:
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{name} must be a tuple of tensors, got an element {x!r}")


def _shapes(elements):
    return None if elements is None else [tuple(x.shape) for x in elements]


def vector_scan(vector, matrices, vec_mat, mat_mat):
    """
    All prefixes ``p_0 = vector``, ``p_i = p_{i-1} @ matrices[i-1]`` (odd–even scan).

    The recursion halves the length each level, so its depth is ``log2(n)``; it calls
    ``mat_mat`` and ``vec_mat`` once per level, on all pairs at once.

    :param tuple vector: the vector's tensors, without a dim for the sequence; ``None``
        stands for the identity, whose products are skipped (then ``vec_mat`` takes
        matrices: :func:`associative_scan`).
    :param tuple matrices: the matrices' tensors, the sequence on dim 0 (may have length 0).
    :param callable vec_mat: ``vec_mat(vectors, matrices)``, the products of vectors and
        matrices, with a sequence dim on both.
    :param callable mat_mat: ``mat_mat(a, b)``, the associative product of matrices, with a
        sequence dim on both.
    :returns: a tuple of tensors with a leading dim of length ``n + 1`` (``p_0 ... p_n``),
        or ``n`` (``p_1 ... p_n``) when ``vector`` is ``None``.
    :raises TypeError: if ``vec_mat`` / ``mat_mat`` is not callable or ``vector`` /
        ``matrices`` not a tuple of tensors.
    :raises ValueError: if the products fail on the shapes of their arguments (matrices
        that do not fit the vector).
    """
    _check_scan_args(
        vector, matrices, vec_mat, mat_mat, ("vector", "matrices", "vec_mat", "mat_mat")
    )
    try:
        return _vector_scan(vector, matrices, vec_mat, mat_mat)
    except RuntimeError as error:
        if isinstance(error, torch.linalg.LinAlgError):
            raise
        # A shape mismatch inside the products: say which arguments did not fit (no cost
        # on success, the products are not re-run).
        raise ValueError(
            f"vector_scan: the products failed on vector of shapes {_shapes(vector)} and "
            f"matrices of shapes {_shapes(matrices)}; check that the matrices fit the vector "
            f"and each other ({error})"
        ) from error


def _vector_scan(vector, matrices, vec_mat, mat_mat):
    """:func:`vector_scan` without its argument checks (its recursion)."""
    n = matrices[0].shape[0]
    if vector is None and n < 2:
        return matrices
    if n == 0:
        return tuple(x.unsqueeze(0) for x in vector)
    half = n // 2
    lefts, rights = _slice(matrices, slice(0, 2 * half, 2)), _slice(matrices, slice(1, 2 * half, 2))
    pairs = mat_mat(lefts, rights)
    evens = _vector_scan(vector, pairs, vec_mat, mat_mat)  # [p_0,] p_2, p_4, ...
    if vector is not None:
        odds = vec_mat(_slice(evens, slice(0, (n + 1) // 2)), _slice(matrices, slice(0, None, 2)))
        return tuple(_interleave(e, o) for e, o in zip(evens, odds))
    # p_1 is the first matrix itself; the other odd prefixes need one product each.
    odds = vec_mat(_slice(evens, slice(0, (n - 1) // 2)), _slice(matrices, slice(2, None, 2)))
    odds = tuple(torch.cat([m[:1], o]) for m, o in zip(matrices, odds))
    return tuple(_interleave(o, e) for o, e in zip(odds, evens))


def associative_scan(combine, elems):
    """
    Inclusive prefix scan along dim 0: ``out[i] = combine(...combine(e_0, e_1)..., e_i)``,
    evaluated in :math:`O(\\log n)` depth: :func:`vector_scan` from the identity, with
    ``combine`` in both roles.

    :param callable combine: an associative (not necessarily commutative) product of two
        elements, ``combine(earlier, later)``, batched over dim 0; it returns tensors of the
        shapes of its arguments.
    :param tuple elems: the elements' tensors, the sequence on dim 0 (may have length 0).
    :returns: a tuple of tensors of the shapes of ``elems``, the prefixes on dim 0.
    :raises TypeError: if ``combine`` is not callable or ``elems`` not a tuple of tensors.
    """
    if not callable(combine):
        raise TypeError(
            f"combine must be a callable combine(earlier, later) of two elements, got {combine!r}"
        )
    _check_scan_args(None, elems, combine, combine, ("vector", "elems", "combine", "combine"))
    return _vector_scan(None, elems, combine, combine)
