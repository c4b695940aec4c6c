r"""Opponent models :math:`p_A(b | s)` of the TMDP learners (Gallego, 2021, Section 4.3).

A TMDP learner (:class:`~pyro_ext.rl.tabular.TMDPQLearner`) decides by eq. (4.3) and learns
by eq. (4.2), both under its forecast :math:`p_A(b|s)` of the opponent's next action. That
forecast is an :class:`OpponentModel`: it is attached to the game and reset like an agent,
predicts :meth:`~OpponentModel.probs` and learns from every :class:`~pyro_ext.rl.base.Transition`
(seen from the DM's side) in :meth:`~OpponentModel.observe`. The thesis' models:

* :class:`DirichletOpponentModel` -- a non-strategic (level-0) opponent, Section 4.3.1 and
  Algorithm 4.4;
* :class:`AgentOpponentModel` -- a strategic opponent simulated as a learning agent from his
  side, Algorithm 4.1 (the level-k recursion);
* :class:`MixtureOpponentModel` -- a Dirichlet posterior over several models, opponent
  averaging, Algorithm 4.2.
"""

from abc import ABC, abstractmethod

import torch

from ..ops.validation import check_int, check_positive, check_real
from .base import Agent
from .updates import batch_rows, dirichlet_forget_update

__all__ = [
    "OpponentModel",
    "DirichletOpponentModel",
    "AgentOpponentModel",
    "MixtureOpponentModel",
]


class OpponentModel(ABC):
    r"""A (batched) forecast :math:`p_A(b | s)` of the opponent's action, learned online.

    Lifecycle, as for an :class:`~pyro_ext.rl.base.Agent`: :meth:`attach` fixes the game
    sizes, :meth:`reset` allocates the state of ``batch_size`` independent runs, then
    :meth:`probs` and :meth:`observe` alternate. Subclasses implement :meth:`probs` and
    :meth:`observe`, and extend :meth:`attach` and :meth:`reset` when they hold tables.
    """

    num_states = num_opponent_actions = num_actions = batch_size = None

    def attach(self, num_states, num_opponent_actions, num_actions):
        """Fix the sizes of the game: states, the opponent's actions (the outcomes the model
        forecasts) and the DM's actions."""
        self.num_states = check_int(num_states, "num_states", low=1)
        self.num_opponent_actions = check_int(num_opponent_actions, "num_opponent_actions", low=1)
        self.num_actions = check_int(num_actions, "num_actions", low=1)
        return self

    def reset(self, batch_size, generator):
        """Start ``batch_size`` independent runs on ``generator.device``."""
        self.batch_size = check_int(batch_size, "batch_size", low=1)
        return self

    @abstractmethod
    def probs(self, state):
        """:math:`p_A(b | s)` of every run, ``(B,) -> (B, num_opponent_actions)``."""

    @abstractmethod
    def observe(self, transition):
        """Learn from a :class:`~pyro_ext.rl.base.Transition` seen from the DM's side (its
        ``opponent_action`` is the action to forecast); rows where ``transition.mask`` is
        False are left untouched."""


class DirichletOpponentModel(OpponentModel):
    r"""Level-0 model of a non-strategic opponent (Section 4.3.1): a Dirichlet posterior
    :math:`\mathcal{D}(\alpha_1 + h_1, \ldots, \alpha_n + h_n)` whose mean is
    :math:`p_A(b)` (or :math:`p_A(b|s)` with ``state_conditional=True``, one Dirichlet per
    state, as the FPM citizen of Section 4.5.4); the counts are discounted by the forget
    factor :math:`\lambda` of Algorithm 4.4 when ``forget`` is given."""

    def __init__(self, forget=None, prior=1.0, state_conditional=False):
        self.forget = check_real(
            forget, "forget", 0, 1, low_open=True, high_open=True, allow_none=True
        )
        self.prior = check_positive(prior, "prior")
        self.state_conditional = bool(state_conditional)

    @property
    def num_outcomes(self):
        """Number of forecast outcomes (the opponent's actions)."""
        return self.num_opponent_actions

    def reset(self, batch_size, generator):
        super().reset(batch_size, generator)
        slots = self.num_states if self.state_conditional else 1
        self.counts = torch.full(
            (batch_size, slots, self.num_outcomes), self.prior, device=generator.device
        )
        self.rows = batch_rows(batch_size, generator.device)
        return self

    def _slot(self, state):
        return state if self.state_conditional else torch.zeros_like(state)

    def probs(self, state):
        counts = self.counts[self.rows, self._slot(state)]
        return counts / counts.sum(dim=-1, keepdim=True)

    def observe(self, transition):
        slot = self._slot(transition.state)
        counts = self.counts[self.rows, slot]
        dirichlet_forget_update(counts, transition.opponent_action, self.forget, transition.mask)
        self.counts[self.rows, slot] = counts


class AgentOpponentModel(OpponentModel):
    r"""Model of a strategic opponent as a learning agent seen from *his* side: it learns
    from ``(s, b, a, r_B, r_A, s')`` (:meth:`Transition.swap_players
    <pyro_ext.rl.base.Transition.swap_players>`) and predicts :math:`p_A(b|s)` by his
    estimated (ε-greedy or softmax) policy, Algorithm 4.1 lines 3-4."""

    def __init__(self, agent):
        if not isinstance(agent, Agent):
            raise TypeError(f"opponent model must be an Agent, got {type(agent).__name__}")
        self.agent = agent

    def attach(self, num_states, num_opponent_actions, num_actions):
        super().attach(num_states, num_opponent_actions, num_actions)
        self.agent.attach(num_states, num_opponent_actions, num_actions)
        return self

    def reset(self, batch_size, generator):
        super().reset(batch_size, generator)
        self.agent.reset(batch_size, generator)
        return self

    def probs(self, state):
        return self.agent.action_probs(state)

    def observe(self, transition):
        if transition.opponent_reward is None:
            raise ValueError(
                "opponent_reward is required to learn a strategic opponent model (Algorithm 4.1 "
                "uses r_B); the environment returns it from step()"
            )
        self.agent.update(transition.swap_players())


class MixtureOpponentModel(OpponentModel):
    r"""Opponent averaging, Algorithm 4.2: a Dirichlet posterior :math:`p(M_i | H) \propto n_i`
    over opponent models; a model's count grows when its predicted (most likely) action
    equals the observed one, and :math:`p_A(b|s) = \sum_i p(M_i|H)\, p_{M_i}(b|s)`.

    :param models: :class:`OpponentModel` instances, or :class:`~pyro_ext.rl.base.Agent`
        instances from the opponent's side (wrapped in :class:`AgentOpponentModel`).
    """

    def __init__(self, models, prior=1.0):
        models = list(models)
        if not models:
            raise ValueError("opponent_models must hold at least one model")
        wrapped = []
        for model in models:
            if isinstance(model, Agent):
                model = AgentOpponentModel(model)
            elif not isinstance(model, OpponentModel):
                raise TypeError(
                    f"opponent_models must hold Agents or OpponentModels, got "
                    f"{type(model).__name__}"
                )
            wrapped.append(model)
        self.models = wrapped
        self.prior = check_positive(prior, "prior")

    def attach(self, num_states, num_opponent_actions, num_actions):
        super().attach(num_states, num_opponent_actions, num_actions)
        for model in self.models:
            model.attach(num_states, num_opponent_actions, num_actions)
        return self

    def reset(self, batch_size, generator):
        super().reset(batch_size, generator)
        for model in self.models:
            model.reset(batch_size, generator)
        shape = (batch_size, len(self.models))
        self.counts = torch.full(shape, self.prior, device=generator.device)
        return self

    @property
    def model_probs(self):
        """Posterior mean :math:`p(M_i | H)`, shape ``(B, m)``."""
        return self.counts / self.counts.sum(dim=-1, keepdim=True)

    def probs(self, state):
        each = torch.stack([model.probs(state) for model in self.models], dim=1)  # (B, m, n)
        return (self.model_probs.unsqueeze(-1) * each).sum(dim=1)

    def observe(self, transition):
        state, opponent_action, mask = transition.state, transition.opponent_action, transition.mask
        predicted = torch.stack([m.probs(state).argmax(dim=-1) for m in self.models], dim=1)
        hits = (predicted == opponent_action.unsqueeze(-1)).to(self.counts.dtype)
        if mask is not None:
            hits = hits * mask.unsqueeze(-1)
        self.counts += hits
        for model in self.models:
            model.observe(transition)
