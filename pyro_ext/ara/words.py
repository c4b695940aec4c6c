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
    "attack_candidates",
    "check_budget",
    "good_word_insertion",
    "originating_instances",
    "word_deletion",
]

# Rows of candidates scored by one call of the classifier: large batches amortise the
# per-call overhead of sklearn models without holding more than a few MB of features.
_BATCH_ROWS = 1 << 16


def check_budget(n, num_features):
    """The attacker budget ``n`` as an ``int``: at least 0 and at most ``num_features``."""
    n = check_int(n, "attacker budget n", low=0)
    if n > num_features:
        raise ValueError(f"attacker budget n={n} exceeds the {num_features} features")
    return n


@functools.lru_cache(maxsize=256)
def _subsets(size, n):
    """All subsets of ``range(size)`` with at most ``n`` elements, as a padded index matrix
    ``(M, n)`` (padding ``size`` points at a dummy column) ordered by subset size."""
    rows = [torch.full((1, n), size, dtype=torch.long)]
    for k in range(1, min(n, size) + 1):
        combos = torch.combinations(torch.arange(size), r=k).reshape(-1, k)
        rows.append(torch.cat([combos, torch.full((combos.shape[0], n - k), size)], -1))
    return torch.cat(rows)


def attack_candidates(x, n, insert=True):
    """
    All instances reachable from one row ``x`` by flipping at most ``n`` of its zeros to one
    (``insert=True``, word insertion) or of its ones to zero (``insert=False``, deletion).

    :param torch.Tensor x: A binary row, shape ``(D,)``.
    :param int n: Attacker budget (maximum number of flipped words).
    :param bool insert: Insert absent words (``True``) or delete present ones (``False``).
    :returns: Candidates ``(M, D)``, ``x`` itself first, then by number of flips.
    """
    check_binary(x)
    if x.dim() != 1:
        raise ValueError(f"x must be a single row of shape (D,), got {tuple(x.shape)}")
    check_budget(n, x.shape[-1])
    source = 0 if insert else 1
    positions = (x == source).nonzero().squeeze(-1)
    subsets = _subsets(positions.shape[0], n).to(x.device)
    # The padding index selects an extra column that is dropped afterwards.
    padded = torch.cat([x, x.new_zeros(1)]).expand(subsets.shape[0], -1).clone()
    columns = torch.cat([positions, positions.new_full((1,), x.shape[-1])])[subsets]
    padded.scatter_(-1, columns, 1 - source)
    return padded[:, :-1]


def originating_instances(x_attacked, n):
    """
    The set :math:`\\mathcal X'(x')` of eq. (3.8) for n-GWI: every ``x`` that an attacker
    inserting at most ``n`` words could have turned into ``x'`` (``x <= x'`` coordinatewise,
    Hamming distance ``<= n``).

    :param torch.Tensor x_attacked: The observed row ``x'``, shape ``(D,)``.
    :returns: Instances ``(M, D)``, ``x'`` itself first.
    """
    return attack_candidates(x_attacked, n, insert=False)


def _attack(x, predict_proba, n, y, insert):
    check_binary(x)
    if x.dim() != 2:
        raise ValueError(f"x must have shape (N, D), got {tuple(x.shape)}")
    check_budget(n, x.shape[-1])
    attacked = x.clone()
    if y is None:
        rows = torch.arange(x.shape[0], device=x.device)
    else:
        check_labels(y, x.shape[0])
        rows = (y == 1).nonzero().squeeze(-1)
    pending, pending_rows = [], 0
    for i in rows.tolist() + [None]:
        if i is not None:
            pending.append((i, attack_candidates(x[i], n, insert)))
            pending_rows += pending[-1][1].shape[0]
        if pending and (i is None or pending_rows >= _BATCH_ROWS):
            scores = torch.as_tensor(predict_proba(torch.cat([c for _, c in pending])))
            start = 0
            for j, candidates in pending:
                # argmin keeps the first minimiser: ties go to the fewest changes.
                best = scores[start : start + candidates.shape[0]].argmin()
                attacked[j] = candidates[best]
                start += candidates.shape[0]
            pending, pending_rows = [], 0
    return attacked


def good_word_insertion(x, predict_proba, n, y=None):
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
    :returns: The attacked features, a new tensor shaped like ``x``.
    """
    return _attack(x, predict_proba, n, y, insert=True)


def word_deletion(x, predict_proba, n, y=None):
    """
    Bad word deletion: as :func:`good_word_insertion`, but deleting at most ``n`` present
    words.
    """
    return _attack(x, predict_proba, n, y, insert=False)
