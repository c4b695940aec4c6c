"""
Discrete attacks on binary word-presence features (thesis section 3.2.2): n good word
insertion (n-GWI) and bad word deletion, and the sets of instances they relate.

Label 1 is malicious (spam). Integrity-violation attacks modify only malicious rows.
"""

import functools

import torch

from ..ops.validation import check_int
from .naive_bayes import check_binary, check_labels

__all__ = [
    "MAX_ENUMERATION",
    "attack_candidates",
    "check_budget",
    "check_enumeration",
    "count_subsets",
    "good_word_insertion",
    "originating_instances",
    "word_deletion",
]

# Rows of candidates scored by one call of the classifier: large batches amortise the
# per-call overhead of sklearn models without holding more than a few MB of features.
_BATCH_ROWS = 1 << 16
# Default cap on the instances one row may enumerate (attack candidates scored by the
# classifier). Every n <= 2 attack on the 54 words of Spambase (thesis section 3.2.2) needs
# at most 1.65e5 for ACRA's sum (eq. 3.8) and 1486 for n-GWI; 1e6 leaves a margin of six
# while keeping a refused count from running for more than seconds (ACRA's "exact"
# quadrature scores 1e6 candidates in 3-20 s on one CPU core); n = 3 needs up to 1.5e7.
MAX_ENUMERATION = 10**6
# Most terms summed to state the exact count of a refused enumeration in its message.
_EXACT_COUNT_TERMS = 10**4


def check_budget(n, num_features):
    """The attacker budget ``n`` as an ``int``: at least 0 and at most ``num_features``."""
    n = check_int(n, "attacker budget n", low=0)
    if n > num_features:
        raise ValueError(f"attacker budget n={n} exceeds the {num_features} features")
    return n


def check_max_enumeration(value):
    """``max_enumeration`` as an ``int >= 1``; an integral float such as ``1e7`` is accepted."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return check_int(value, "max_enumeration", low=1)


def count_subsets(size, n, limit=None):
    """
    The number of subsets of ``size`` items with at most ``n`` elements,
    :math:`\\sum_{k \\le n} \\binom{size}{k}`, exactly (Python integers); once the partial sum
    exceeds ``limit`` the loop stops and returns it, so counting never costs more than the
    enumeration it guards.
    """
    if n >= size:
        return 1 << size
    total, term = 0, 1
    for k in range(n + 1):
        total += term
        if limit is not None and total > limit:
            break
        term = term * (size - k) // (k + 1)
    return total


def check_enumeration(count, max_enumeration, what, fix, exact=True):
    """Raise ``ValueError`` when ``count`` exceeds ``max_enumeration``, before any work;
    ``exact=False`` says the count is a partial sum (the message then says "over")."""
    if count > max_enumeration:
        raise ValueError(
            f"{what} would enumerate {'' if exact else 'over '}{count:,} instances, more than "
            "max_enumeration="
            f"{max_enumeration:,}; {fix}, or pass a larger max_enumeration (the work, and for "
            "the candidate tensors the memory, grow linearly with it)"
        )


def _check_candidates(x, n, insert, max_enumeration, name="x"):
    """Refuse rows of ``x`` (``(..., D)``) whose candidate sets exceed the budget: the
    counts depend only on the number of flippable words, so one pass over distinct counts."""
    flippable = (x == (0 if insert else 1)).sum(-1).reshape(-1)
    for size in torch.unique(flippable).tolist():
        count = count_subsets(size, n, max_enumeration)
        if count > max_enumeration:
            # The exact count for the message, unless its big-integer sum is itself long.
            exact = n <= _EXACT_COUNT_TERMS
            count = count_subsets(size, n) if exact else count
            row = int((flippable == size).nonzero()[0, 0])
            verb = "inserting" if insert else "deleting"
            check_enumeration(
                count,
                max_enumeration,
                f"{verb} up to n={n} of the {size} {'absent' if insert else 'present'} words "
                f"of {name} row {row}",
                "lower n",
                exact,
            )


@functools.lru_cache(maxsize=256)
def _subsets(size, n):
    """All subsets of ``range(size)`` with at most ``n`` elements, as a padded index matrix
    ``(M, n)`` (padding ``size`` points at a dummy column) ordered by subset size."""
    rows = [torch.full((1, n), size, dtype=torch.long)]
    for k in range(1, min(n, size) + 1):
        combos = torch.combinations(torch.arange(size), r=k).reshape(-1, k)
        rows.append(torch.cat([combos, torch.full((combos.shape[0], n - k), size)], -1))
    return torch.cat(rows)


def attack_candidates(x, n, insert=True, *, max_enumeration=MAX_ENUMERATION):
    """
    All instances reachable from one row ``x`` by flipping at most ``n`` of its zeros to one
    (``insert=True``, word insertion) or of its ones to zero (``insert=False``, deletion).

    :param torch.Tensor x: A binary row, shape ``(D,)``.
    :param int n: Attacker budget (maximum number of flipped words).
    :param bool insert: Insert absent words (``True``) or delete present ones (``False``).
    :param int max_enumeration: Most candidates ``M`` allowed (default
        :data:`MAX_ENUMERATION`); a larger count is refused with ``ValueError`` before any is
        built, as their number, :math:`\\sum_{k \\le n} \\binom{m}{k}` for ``m`` flippable
        words, explodes with ``n``.
    :returns: Candidates ``(M, D)``, ``x`` itself first, then by number of flips.
    """
    check_binary(x)
    if x.dim() != 1:
        raise ValueError(f"x must be a single row of shape (D,), got {tuple(x.shape)}")
    n = check_budget(n, x.shape[-1])
    _check_candidates(x, n, insert, check_max_enumeration(max_enumeration))
    return _attack_candidates(x, n, insert)


def _attack_candidates(x, n, insert=True):
    """:func:`attack_candidates` without the checks, for callers that made them."""
    source = 0 if insert else 1
    positions = (x == source).nonzero().squeeze(-1)
    subsets = _subsets(positions.shape[0], n).to(x.device)
    # The padding index selects an extra column that is dropped afterwards.
    padded = torch.cat([x, x.new_zeros(1)]).expand(subsets.shape[0], -1).clone()
    columns = torch.cat([positions, positions.new_full((1,), x.shape[-1])])[subsets]
    padded.scatter_(-1, columns, 1 - source)
    return padded[:, :-1]


def originating_instances(x_attacked, n, *, max_enumeration=MAX_ENUMERATION):
    """
    The set :math:`\\mathcal X'(x')` of eq. (3.8) for n-GWI: every ``x`` that an attacker
    inserting at most ``n`` words could have turned into ``x'`` (``x <= x'`` coordinatewise,
    Hamming distance ``<= n``).

    :param torch.Tensor x_attacked: The observed row ``x'``, shape ``(D,)``.
    :param int max_enumeration: As for :func:`attack_candidates`.
    :returns: Instances ``(M, D)``, ``x'`` itself first.
    """
    check_binary(x_attacked, "x_attacked")
    if x_attacked.dim() != 1:
        raise ValueError(
            f"x_attacked must be a single row of shape (D,), got {tuple(x_attacked.shape)}"
        )
    n = check_budget(n, x_attacked.shape[-1])
    max_enumeration = check_max_enumeration(max_enumeration)
    _check_candidates(x_attacked, n, False, max_enumeration, "x_attacked")
    return _attack_candidates(x_attacked, n, insert=False)


def _attack(x, predict_proba, n, y, insert, max_enumeration):
    check_binary(x)
    if x.dim() != 2:
        raise ValueError(f"x must have shape (N, D), got {tuple(x.shape)}")
    if not callable(predict_proba):
        raise TypeError(
            f"predict_proba must be a callable (M, D) -> (M,), got {type(predict_proba).__name__}"
        )
    n = check_budget(n, x.shape[-1])
    max_enumeration = check_max_enumeration(max_enumeration)
    attacked = x.clone()
    if y is None:
        rows = torch.arange(x.shape[0], device=x.device)
    else:
        check_labels(y, x.shape[0])
        rows = (y == 1).nonzero().squeeze(-1)
    # Each attacked row's candidates counted before any is built or scored.
    _check_candidates(x[rows], n, insert, max_enumeration)
    pending, pending_rows = [], 0
    for i in rows.tolist() + [None]:
        if i is not None:
            pending.append((i, _attack_candidates(x[i], n, insert)))
            pending_rows += pending[-1][1].shape[0]
        if pending and (i is None or pending_rows >= _BATCH_ROWS):
            batch = torch.cat([c for _, c in pending])
            scores = _check_scores(predict_proba(batch), batch.shape[0])
            start = 0
            for j, candidates in pending:
                # argmin keeps the first minimiser: ties go to the fewest changes.
                best = scores[start : start + candidates.shape[0]].argmin()
                attacked[j] = candidates[best]
                start += candidates.shape[0]
            pending, pending_rows = [], 0
    return attacked


def _check_scores(scores, num_rows):
    """``predict_proba``'s output on ``num_rows`` candidates as a tensor ``(num_rows,)``
    without NaN (argmin would pick a NaN as the attack), checked once per batch."""
    try:
        scores = torch.as_tensor(scores)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(
            f"predict_proba must return a tensor of shape (M,), got {type(scores).__name__}"
        ) from None
    if scores.shape != (num_rows,):
        raise ValueError(
            f"predict_proba must return one score per candidate row, shape ({num_rows},), "
            f"got {tuple(scores.shape)}"
        )
    if scores.is_complex() or scores.dtype == torch.bool:
        raise TypeError(f"predict_proba must return real scores, got dtype {scores.dtype}")
    nan = torch.isnan(scores) if scores.is_floating_point() else None
    if nan is not None and nan.any():
        raise ValueError(
            "predict_proba returned NaN scores (first at candidate "
            f"{int(nan.nonzero()[0, 0])} of {num_rows}); the attack minimises them, so they "
            "must be numbers"
        )
    return scores


def good_word_insertion(x, predict_proba, n, y=None, *, max_enumeration=MAX_ENUMERATION):
    """
    n good word insertion (n-GWI, thesis section 3.2.2): each malicious row becomes the
    instance, among those with at most ``n`` absent words inserted, that minimises the
    classifier's ``predict_proba`` -- the attacker's problem (3.11) under common knowledge
    (:math:`P^A_z = r(z)` deterministic). The search over all subsets is exact and batched.

    :param torch.Tensor x: Binary features ``(N, D)``.
    :param callable predict_proba: Maps ``(M, D)`` features to ``p(y=1 | z)``, shape ``(M,)``.
    :param int n: Maximum number of inserted words.
    :param torch.Tensor y: Optional labels ``(N,)``; only rows with ``y == 1`` are attacked.
        If ``None``, every row is attacked as if malicious.
    :param int max_enumeration: Most candidates one attacked row may have (default
        :data:`MAX_ENUMERATION`), checked for every row before any is scored.
    :returns: The attacked features, a new tensor shaped like ``x``.
    """
    return _attack(x, predict_proba, n, y, True, max_enumeration)


def word_deletion(x, predict_proba, n, y=None, *, max_enumeration=MAX_ENUMERATION):
    """
    Bad word deletion: as :func:`good_word_insertion`, but deleting at most ``n`` present
    words.
    """
    return _attack(x, predict_proba, n, y, False, max_enumeration)
