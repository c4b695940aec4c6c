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


def epsilon_greedy_probs(q, epsilon):
    r"""ε-greedy policy of Section 4.3: with probability :math:`1-\epsilon` take
    :math:`\arg\max_a Q(s, a)`, with probability :math:`\epsilon` a uniformly random action."""
    num_actions = q.shape[-1]
    return (1.0 - epsilon) * greedy_probs(q) + epsilon / num_actions


def softmax_probs(q, temperature=1.0):
    r"""Softmax policy (figure 4.4): :math:`\pi(a|s) \propto \exp(Q(s, a) / \tau)`."""
    return torch.softmax(q / temperature, dim=-1)


def policy_probs(q, policy, epsilon, temperature):
    """Dispatch on ``policy`` (``"epsilon_greedy"`` or ``"softmax"``)."""
    if policy == "epsilon_greedy":
        return epsilon_greedy_probs(q, epsilon)
    return softmax_probs(q, temperature)


def sample(probs, generator):
    """Draw one index per row of ``probs`` (``(..., n) -> (...)``) with ``generator``."""
    u = torch.rand(probs.shape[:-1] + (1,), generator=generator, device=probs.device)
    cdf = probs.cumsum(dim=-1)
    index = (cdf < u * cdf[..., -1:]).sum(dim=-1)
    return index.clamp_(max=probs.shape[-1] - 1)


def check_policy(policy, epsilon, temperature):
    """Validate the policy hyperparameters shared by every learner."""
    check_choice(policy, "policy", POLICIES)
    return check_real(epsilon, "epsilon", 0, 1), check_positive(temperature, "temperature")
