r"""Pure update functions of the TMDP learners (Gallego, 2021, chapter 4).

Each function takes the tables of ``B`` independent runs (a leading batch dimension) and
one transition of every run, and updates the tables *in place* (returning them too), as
the learners in :mod:`~pyro_ext.rl.tabular`, :mod:`~pyro_ext.rl.approximate`,
:mod:`~pyro_ext.rl.opponent_models` and :mod:`~pyro_ext.rl.policy_gradient` apply them.
No function draws random numbers or keeps state, so each is deterministic and testable on
its own against the equation it implements:

* :func:`q_update` -- Q-learning, eq. (4.1);
* :func:`expected_q` -- the expected Q-values of eq. (4.3) under an opponent model;
* :func:`tmdp_q_update` -- TMDP Q-learning, eq. (4.2);
* :func:`dirichlet_forget_update` -- the Dirichlet opponent model of Section 4.3.1 with the
  forget factor of Algorithm 4.4;
* :func:`softmax_score`, :func:`gaussian_score` and :func:`reinforce_update` -- the REINFORCE
  policy gradient of Section 4.5.3.

Masks: ``done`` (bool ``(B,)``) drops the bootstrap term where the next state is terminal;
rows where ``mask`` (bool ``(B,)``) is False, runs whose episode has already ended, are
left untouched. ``None`` means "nowhere" and "everywhere" respectively.
"""

import torch

from .policies import scalar_hyperparameter

__all__ = [
    "q_update",
    "expected_q",
    "tmdp_q_update",
    "dirichlet_forget_update",
    "softmax_score",
    "gaussian_score",
    "reinforce_update",
    "batch_rows",
    "bootstrap_and_mask",
]


def batch_rows(batch_size, device):
    """Row indices ``0, ..., B-1`` that pair every run with its own entry of a table."""
    return torch.arange(batch_size, device=device)


def bootstrap_and_mask(mask, done, like):
    """The bootstrap factor ``1 - done`` and the row mask (True = update) as tensors like
    ``like`` (``None`` gives all ones and all True)."""
    notdone = torch.ones_like(like) if done is None else (~done).to(like.dtype)
    mask = torch.ones_like(like, dtype=torch.bool) if mask is None else mask
    return notdone, mask


def _check_indices(x, name, size, batch):
    """``x`` an integer tensor ``(batch,)`` of indices in ``[0, size)``: one host read."""
    if not isinstance(x, torch.Tensor) or x.dtype.is_floating_point or x.dtype == torch.bool:
        what = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"{name} must be an integer tensor of shape ({batch},), got {what}")
    if tuple(x.shape) != (batch,):
        raise ValueError(f"{name} must have shape ({batch},) (one per run), got {tuple(x.shape)}")
    bad = (x < 0) | (x >= size)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"{name} must lie in [0, {size}), got {int(x[row])} at row {row} (the table has "
            f"{size} entries on that axis)"
        )


def q_update(q, state, action, reward, next_state, lr, gamma, done=None, mask=None):
    r"""Q-learning, eq. (4.1), in place on ``q`` of shape ``(B, S, A)``:

    .. math:: Q(s,a) := (1-\alpha) Q(s,a) + \alpha (r + \gamma \max_{a'} Q(s', a')).

    ``done`` (bool ``(B,)``) drops the bootstrap; rows where ``mask`` is False are kept.

    This public function checks its arguments (``lr`` in ``[0, 1]``, ``gamma`` in
    ``[0, 1]``, states and actions inside the table: one host read of the indices); the
    learners, which check their transitions once per step already, use the unchecked
    :func:`q_update_unchecked`.

    :raises TypeError: if ``q`` is not a floating-point ``(B, S, A)`` tensor or an index
        argument is not an integer tensor.
    :raises ValueError: naming the argument, for an out-of-range ``lr`` / ``gamma`` or an
        index outside the table.
    """
    if not isinstance(q, torch.Tensor) or not q.is_floating_point() or q.dim() != 3:
        what = tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__
        raise TypeError(f"q must be a floating-point tensor of shape (B, S, A), got {what}")
    scalar_hyperparameter(lr, "lr", low=0, high=1)
    scalar_hyperparameter(gamma, "gamma", low=0, high=1)
    B, S, A = q.shape
    _check_indices(state, "state", S, B)
    _check_indices(next_state, "next_state", S, B)
    _check_indices(action, "action", A, B)
    return q_update_unchecked(q, state, action, reward, next_state, lr, gamma, done, mask)


def q_update_unchecked(q, state, action, reward, next_state, lr, gamma, done=None, mask=None):
    """:func:`q_update` without its argument checks, for the learners' per-step updates."""
    rows = batch_rows(q.shape[0], q.device)
    reward = reward.to(q.dtype)
    notdone, mask = bootstrap_and_mask(mask, done, reward)
    target = reward + gamma * notdone * q[rows, next_state].max(dim=-1).values
    old = q[rows, state, action]
    q[rows, state, action] = torch.where(mask, (1 - lr) * old + lr * target, old)
    return q


def expected_q(q_s, opponent_probs):
    r"""Eq. (4.3): :math:`\psi(a) = \mathbb{E}_{p_A(b|s)}[Q(s,a,b)]`.

    Shapes: ``q_s (B, A, n)`` and ``opponent_probs (B, n)`` give ``(B, A)``.

    :raises ValueError: if ``opponent_probs`` does not have one probability per opponent
        action (a shape check, no read of the values).
    """
    if opponent_probs.shape[-1:] != q_s.shape[-1:] or opponent_probs.dim() < 1:
        raise ValueError(
            f"opponent_probs must have shape (B, {q_s.shape[-1]}), one probability per "
            f"opponent action of q_s {tuple(q_s.shape)}, got {tuple(opponent_probs.shape)}"
        )
    return (q_s * opponent_probs.unsqueeze(-2)).sum(dim=-1)


def tmdp_q_update(
    q,
    state,
    action,
    opponent_action,
    reward,
    next_state,
    opponent_probs,
    lr,
    gamma,
    done=None,
    mask=None,
):
    r"""TMDP Q-learning, eq. (4.2), in place on ``q`` of shape ``(B, S, A, n)``:

    .. math:: Q(s,a,b) := (1-\alpha) Q(s,a,b)
        + \alpha \big(r + \gamma \max_{a'} \mathbb{E}_{p_A(b'|s')} Q(s', a', b')\big),

    with ``opponent_probs`` :math:`= p_A(\cdot | s')` of shape ``(B, n)``.
    """
    rows = batch_rows(q.shape[0], q.device)
    reward = reward.to(q.dtype)
    notdone, mask = bootstrap_and_mask(mask, done, reward)
    value_next = expected_q(q[rows, next_state], opponent_probs).max(dim=-1).values
    target = reward + gamma * notdone * value_next
    old = q[rows, state, action, opponent_action]
    q[rows, state, action, opponent_action] = torch.where(mask, (1 - lr) * old + lr * target, old)
    return q


def dirichlet_forget_update(counts, observed, forget=None, mask=None):
    r"""Algorithm 4.4, in place on pseudo-counts ``counts`` of shape ``(B, n)``:
    :math:`\boldsymbol\alpha^t = \lambda \boldsymbol\alpha^{t-1}`, then
    :math:`\alpha^t_i \mathrel{+}= 1` for the observed action ``i``. ``forget=None`` is the
    plain conjugate update of Section 4.3.1 (:math:`\lambda = 1`).

    :raises ValueError: if ``forget`` (a number) is outside ``[0, 1]``.
    """
    if forget is not None:
        forget = scalar_hyperparameter(forget, "forget", low=0, high=1)
    rows = batch_rows(counts.shape[0], counts.device)
    new = counts if forget is None else counts * forget
    new = new.clone()
    new[rows, observed] += 1.0
    if mask is not None:
        new = torch.where(mask.unsqueeze(-1), new, counts)
    counts.copy_(new)
    return counts


def softmax_score(logits, action):
    r"""Score of a softmax policy (Section 4.5.3),
    :math:`\nabla_\theta \log \pi(a) = e_a - \mathrm{softmax}(\theta)`: ``logits (B, n)``
    and ``action (B,)`` give ``(B, n)``."""
    one_hot = torch.nn.functional.one_hot(action, logits.shape[-1]).to(logits.dtype)
    return one_hot - torch.softmax(logits, dim=-1)


def gaussian_score(decision, mean, scale):
    r"""Score of :math:`\mathcal{N}(d | \theta, \sigma^2)` in its mean, for the Gaussian
    regulator of figure 4.14: :math:`\nabla_\theta \log \pi(d) = (d - \theta) / \sigma^2`.

    :raises ValueError: if ``scale`` (a number) is not positive.
    """
    scale = scalar_hyperparameter(scale, "scale", low=0, low_open=True)
    return (decision - mean) / scale**2


def reinforce_update(logits, trace, state, action, reward, lr, gamma, mask=None):
    r"""Online REINFORCE step for :math:`\max_\theta \mathbb{E}_\pi[\sum_t \gamma^t r_t]`
    (Section 4.5.3), in place on ``logits`` and its eligibility ``trace``, both ``(B, S, n)``:

    .. math:: z := \gamma z + \nabla_\theta \log \pi(a_t | s_t), \qquad
        \theta := \theta + \eta\, r_t\, z.

    The trace credits the reward of round ``t`` to the earlier decisions it discounts back to;
    ``gamma = 0`` is the one-step (per-round) policy gradient. Rows where ``mask`` is False are
    left untouched.
    """
    rows = batch_rows(logits.shape[0], logits.device)
    score = torch.zeros_like(logits)
    score[rows, state] = softmax_score(logits[rows, state], action)
    new_trace = gamma * trace + score
    new_logits = logits + lr * reward.to(logits.dtype).view(-1, 1, 1) * new_trace
    keep = torch.ones_like(reward, dtype=torch.bool) if mask is None else mask
    keep = keep.view(-1, 1, 1)
    trace.copy_(torch.where(keep, new_trace, trace))
    logits.copy_(torch.where(keep, new_logits, logits))
    return logits
