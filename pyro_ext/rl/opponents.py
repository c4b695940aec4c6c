r"""Non-learning and adaptive opponents, used through the :class:`~pyro_ext.rl.base.Agent` API
from the opponent's side (his ``action`` is the DM's ``opponent_action`` and vice versa)."""

import torch

from ..ops.validation import check_real
from .base import Agent, Transition
from .envs import DataSharingGame
from .policies import greedy_probs

__all__ = ["ExponentialSmootherAdversary", "FixedPolicyOpponent", "TitForTat"]


class ExponentialSmootherAdversary(Agent):
    r"""The adaptive adversary of the friend-or-foe game (Section 4.4.1, figure 4.3).

    He estimates the DM's choice frequencies :math:`\boldsymbol p` (initially uniform) with
    an exponential smoother, :math:`\boldsymbol p := \beta \boldsymbol p + (1-\beta)
    \boldsymbol a`, and places the positive reward (his action) at
    :math:`\arg\min_i p_i` (ties split evenly).

    :param beta: smoothing rate :math:`\beta \in (0, 1)` (weight of the old estimate).
    :param encode: optional callable ``(dm_action, next_state) -> (x, valid)`` mapping the DM's
        move to the vector :math:`\boldsymbol a` (``(B, num_actions)``) and a bool ``(B,)``
        telling whether she committed to a target this step; by default ``a`` is the one-hot
        DM action (which then must range over the adversary's targets). The environments
        provide encoders: :meth:`SpatialFriendOrFoe.target_reached
        <pyro_ext.rl.envs.SpatialFriendOrFoe.target_reached>`, :meth:`Blotto.allocation_share
        <pyro_ext.rl.envs.Blotto.allocation_share>`.
    """

    def __init__(self, beta, encode=None, num_actions=None):
        super().__init__(num_actions)
        self.beta = check_real(beta, "beta", 0, 1, low_open=True, high_open=True)
        self.encode = encode

    def attach(self, num_states, num_actions, num_opponent_actions):
        if self.encode is None and num_actions != num_opponent_actions:
            raise ValueError(
                f"ExponentialSmootherAdversary without encode needs the DM to choose among its "
                f"{num_actions} targets, but she has {num_opponent_actions} actions; pass encode="
            )
        return super().attach(num_states, num_actions, num_opponent_actions)

    def reset(self, batch_size, generator):
        super().reset(batch_size, generator)
        shape = (batch_size, self.num_actions)
        self.p = torch.full(shape, 1.0 / self.num_actions, device=self.device)
        return self

    def action_probs(self, state):
        return greedy_probs(-self.p)

    def update(self, transition):
        opponent_action, mask = transition.opponent_action, transition.mask
        if self.encode is None:
            self.check_transition(transition)
            x = torch.nn.functional.one_hot(opponent_action, self.num_actions).to(self.p.dtype)
            valid = torch.ones_like(opponent_action, dtype=torch.bool)
        else:
            if not isinstance(transition, Transition):
                raise TypeError(
                    f"{type(self).__name__}.update takes a Transition, got "
                    f"{type(transition).__name__}"
                )
            x, valid = self.encode(opponent_action, transition.next_state)
        if mask is not None:
            valid = valid & mask
        smoothed = self.beta * self.p + (1.0 - self.beta) * x
        self.p = torch.where(valid.unsqueeze(-1), smoothed, self.p)


class FixedPolicyOpponent(Agent):
    r"""A non-strategic (level-0) opponent with a fixed policy: ``probs`` of shape ``(n,)``
    (stateless) or ``(num_states, n)``, e.g. ``[0., 1.]`` for an always-defecting DDO
    (Section 4.5.4) or a uniformly random player."""

    def __init__(self, probs):
        probs = torch.as_tensor(probs, dtype=torch.get_default_dtype())
        if (
            probs.dim() not in (1, 2)
            or bool((probs < 0).any())
            or not bool(torch.allclose(probs.sum(-1), torch.ones(())))
        ):
            raise ValueError("probs must be a (num_states?, n) tensor of probability vectors")
        super().__init__(probs.shape[-1])
        self.probs = probs

    def attach(self, num_states, num_actions, num_opponent_actions):
        if self.probs.dim() == 2 and self.probs.shape[0] != num_states:
            raise ValueError(
                f"probs has {self.probs.shape[0]} rows but the game has num_states={num_states}"
            )
        return super().attach(num_states, num_actions, num_opponent_actions)

    def action_probs(self, state):
        probs = self.probs.to(state.device)
        return probs[state] if probs.dim() == 2 else probs.expand(state.shape[0], -1)

    def update(self, transition):
        self.check_transition(transition)


class TitForTat(Agent):
    r"""Tit-for-tat DDO of the data sharing game (Section 4.5.4): cooperate first, then copy the
    citizen's previous action; with probability ``forgive`` cooperate anyway (the forgiving
    DDO of figure 4.13). It reads the previous actions from the state of
    :class:`~pyro_ext.rl.envs.DataSharingGame` and plays as its column player."""

    def __init__(self, forgive=0.0):
        super().__init__(num_actions=2, num_opponent_actions=2)
        self.forgive = check_real(forgive, "forgive", 0, 1)

    def action_probs(self, state):
        citizen_prev, _ = DataSharingGame.previous_actions(state)
        defect = (citizen_prev == DataSharingGame.DEFECT).to(torch.get_default_dtype())
        defect = defect * (1.0 - self.forgive)
        return torch.stack([1.0 - defect, defect], dim=-1)

    def update(self, transition):
        self.check_transition(transition)
