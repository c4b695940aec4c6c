r"""Action-selection policies as pure functions of Q-values (Section 4.3).

All functions act on the last dimension of ``q`` and broadcast over the leading ones.
"""

import torch

from ..ops.validation import check_choice, check_positive, check_real

__all__ = ["greedy_probs", "epsilon_greedy_probs", "softmax_probs", "policy_probs", "sample"]

POLICIES = ("epsilon_greedy", "softmax")


def greedy_probs(q):
    """Uniform distribution over the maximisers of ``q`` (ties split evenly)."""
    best = q == q.max(dim=-1, keepdim=True).values
    best = best.to(q.dtype)
    return best / best.sum(dim=-1, keepdim=True)


def scalar_hyperparameter(value, name, **interval):
    """``value`` checked by :func:`~pyro_ext.ops.validation.check_real` over ``interval``
    when it is a Python number (a cheap host check, fine per step); a tensor passes as it
    is, since reading its value would cost a device sync per step (the learners check
    their hyperparameters once, in their constructors)."""
    if isinstance(value, torch.Tensor):
        return value
    return check_real(value, name, **interval)  # a TypeError naming ``name`` if no number


def epsilon_greedy_probs(q, epsilon):
    r"""ε-greedy policy of Section 4.3: with probability :math:`1-\epsilon` take
    :math:`\arg\max_a Q(s, a)`, with probability :math:`\epsilon` a uniformly random action.

    :raises ValueError: if ``epsilon`` (a number) is outside ``[0, 1]``.
    """
    epsilon = scalar_hyperparameter(epsilon, "epsilon", low=0, high=1)
    num_actions = q.shape[-1]
    return (1.0 - epsilon) * greedy_probs(q) + epsilon / num_actions


def softmax_probs(q, temperature=1.0):
    r"""Softmax policy (figure 4.4): :math:`\pi(a|s) \propto \exp(Q(s, a) / \tau)`.

    :raises ValueError: if ``temperature`` (a number) is not positive.
    """
    temperature = scalar_hyperparameter(temperature, "temperature", low=0, low_open=True)
    return torch.softmax(q / temperature, dim=-1)


def policy_probs(q, policy, epsilon, temperature):
    """Dispatch on ``policy`` (``"epsilon_greedy"`` or ``"softmax"``).

    :raises ValueError: if ``policy`` is neither.
    """
    if policy == "epsilon_greedy":
        return epsilon_greedy_probs(q, epsilon)
    if policy == "softmax":
        return softmax_probs(q, temperature)
    check_choice(policy, "policy", POLICIES)  # raises, naming policy and the choices


def sample(probs, generator):
    """Draw one index per row of ``probs`` (``(..., n) -> (...)``) with ``generator``.

    ``probs`` need not be normalised but must be finite and non-negative with a positive
    sum per row: this public entry point checks that (one host read of the values); the
    agents, whose probabilities come from the policies above, draw with the unchecked
    :func:`sample_unchecked` so that no step pays a device sync.

    :raises TypeError: if ``probs`` is not a floating-point tensor.
    :raises ValueError: if ``probs`` is empty or has a negative, non-finite or all-zero row.
    """
    if not isinstance(probs, torch.Tensor) or not probs.is_floating_point():
        raise TypeError(
            f"probs must be a floating-point tensor (..., n), got "
            f"{probs.dtype if isinstance(probs, torch.Tensor) else type(probs).__name__}"
        )
    if probs.dim() < 1 or probs.shape[-1] < 1:
        raise ValueError(f"probs must have shape (..., n) with n >= 1, got {tuple(probs.shape)}")
    bad = (probs < 0) | ~torch.isfinite(probs)
    bad_rows = bad.any(-1) | (probs.sum(-1) <= 0)
    if bool(bad_rows.any()):
        index = tuple(int(i) for i in bad_rows.nonzero()[0]) if bad_rows.dim() else ()
        raise ValueError(
            f"probs must be finite and non-negative with a positive sum in every row; "
            f"row {index} is {probs[index].tolist()}"
        )
    return sample_unchecked(probs, generator)


def sample_unchecked(probs, generator):
    """:func:`sample` without its value check, for the agents' per-step draws."""
    u = torch.rand(probs.shape[:-1] + (1,), generator=generator, device=probs.device)
    cdf = probs.cumsum(dim=-1)
    index = (cdf < u * cdf[..., -1:]).sum(dim=-1)
    return index.clamp_(max=probs.shape[-1] - 1)


def check_policy(policy, epsilon, temperature):
    """Validate the policy hyperparameters shared by every learner."""
    check_choice(policy, "policy", POLICIES)
    return check_real(epsilon, "epsilon", 0, 1), check_positive(temperature, "temperature")
