r"""Tabular Q-learning agents for threatened Markov decision processes (Gallego, 2021,
chapter 4).

Each learner keeps, for ``B`` independent runs, a table ``q`` of shape
``(B, num_states, num_actions[, num_opponent_actions])``. The TMDP learners (FPQ, level-k,
opponent averaging, multiple opponents) share one update, eq. (4.2), and one decision rule,
eq. (4.3); they differ only in their *opponent model* :math:`p_A(b | s)`
(:mod:`~pyro_ext.rl.opponent_models`):

* :class:`QLearner` -- the independent, opponent-unaware learner of eq. (4.1);
* :class:`TMDPQLearner` -- any :class:`~pyro_ext.rl.opponent_models.OpponentModel`;
* :class:`FPQLearner` -- a Dirichlet model of a non-strategic opponent (Section 4.3.1), with
  the forget factor of Algorithm 4.4;
* :class:`LevelKQLearner` -- the opponent is a level-(k-1) learner whose Q-function is
  estimated from his rewards (Algorithm 4.1), built recursively down to level 1;
* :class:`OpponentAveragingQLearner` -- a Dirichlet posterior over several opponent models
  (Algorithm 4.2);
* :class:`MultiOpponentQLearner` -- conditionally independent opponents (Section 4.3.5).

The learners with function approximation are in :mod:`~pyro_ext.rl.approximate`.
"""

import torch

from ..ops.validation import check_int
from .base import ValueLearner
from .opponent_models import (
    AgentOpponentModel,
    DirichletOpponentModel,
    MixtureOpponentModel,
    OpponentModel,
)
from .updates import batch_rows, expected_q, q_update_unchecked, tmdp_q_update

__all__ = [
    "QLearner",
    "TMDPQLearner",
    "FPQLearner",
    "LevelKQLearner",
    "OpponentAveragingQLearner",
    "MultiOpponentQLearner",
]


class QLearner(ValueLearner):
    r"""Independent (opponent-unaware) Q-learner, eq. (4.1): the baseline of figure 4.3."""

    def reset(self, batch_size, generator):
        super().reset(batch_size, generator)
        self.q = torch.zeros(batch_size, self.num_states, self.num_actions, device=self.device)
        return self

    def q_values(self, state):
        return self.q[batch_rows(self.batch_size, self.device), state]

    def update(self, transition):
        self.check_transition(transition)
        t = transition
        q_update_unchecked(
            self.q, t.state, t.action, t.reward, t.next_state, self.lr, self.gamma, t.done, t.mask
        )


class TMDPQLearner(ValueLearner):
    r"""Q-learner of a TMDP with a pluggable opponent model :math:`p_A(b|s)`.

    Decisions maximise eq. (4.3), :math:`\psi(s,a) = \mathbb{E}_{p_A(b|s)} Q(s,a,b)`; after
    the opponent model has learned from the transition, ``Q`` follows eq. (4.2) with
    :math:`p_A(b|s')` from the updated model (Algorithm 4.1 order).

    :param opponent_model: an :class:`~pyro_ext.rl.opponent_models.OpponentModel` (wrap an
        :class:`~pyro_ext.rl.base.Agent` from the opponent's side in
        :class:`~pyro_ext.rl.opponent_models.AgentOpponentModel`).
    """

    def __init__(self, opponent_model, epsilon, lr, gamma, **kwargs):
        if not isinstance(opponent_model, OpponentModel):
            raise TypeError(
                f"opponent_model must be an OpponentModel (wrap an Agent in AgentOpponentModel), "
                f"got {type(opponent_model).__name__}"
            )
        super().__init__(epsilon, lr, gamma, **kwargs)
        self.opponent_model = opponent_model

    def attach(self, num_states, num_actions, num_opponent_actions):
        super().attach(num_states, num_actions, num_opponent_actions)
        self.opponent_model.attach(num_states, num_opponent_actions, num_actions)
        return self

    def reset(self, batch_size, generator):
        super().reset(batch_size, generator)
        shape = (batch_size, self.num_states, self.num_actions, self.num_opponent_actions)
        self.q = torch.zeros(shape, device=self.device)
        self.opponent_model.reset(batch_size, generator)
        return self

    def opponent_probs(self, state):
        """The opponent model :math:`p_A(b | s)`, shape ``(B, num_opponent_actions)``."""
        return self.opponent_model.probs(state)

    def q_values(self, state):
        q_s = self.q[batch_rows(self.batch_size, self.device), state]
        return expected_q(q_s, self.opponent_probs(state))

    def update(self, transition):
        self.check_transition(transition)
        self.opponent_model.observe(transition)
        t = transition
        tmdp_q_update(
            self.q,
            t.state,
            t.action,
            t.opponent_action,
            t.reward,
            t.next_state,
            self.opponent_probs(t.next_state),
            self.lr,
            self.gamma,
            t.done,
            t.mask,
        )


class FPQLearner(TMDPQLearner):
    r"""FPQ-learner (level-1), Section 4.3.1: eqs. (4.2)-(4.3) with a Dirichlet opponent model
    of prior pseudo-count ``prior``; ``forget`` is the factor :math:`\lambda \in (0, 1)` of
    Algorithm 4.4 (``None``: no forgetting); ``state_conditional`` keeps one Dirichlet per state."""

    def __init__(
        self, epsilon, lr, gamma, forget=None, prior=1.0, state_conditional=False, **kwargs
    ):
        model = DirichletOpponentModel(forget, prior, state_conditional)
        super().__init__(model, epsilon, lr, gamma, **kwargs)
        self.forget = model.forget


class LevelKQLearner(TMDPQLearner):
    r"""Level-k Q-learner, Section 4.3.2 and Algorithm 4.1, for any ``k >= 1``.

    Level 1 is the FPQ-learner (Dirichlet model of a level-0 opponent, ``forget`` as in
    Algorithm 4.4). For ``k >= 2`` the opponent is modelled as a level-(k-1) learner seen
    from his side, trained on his rewards :math:`r_B` with ``opponent_epsilon`` and
    ``opponent_lr`` (default: ``epsilon`` and ``lr``), whose ε-greedy policy gives
    :math:`p_A(b|s)`; that model in turn holds a level-(k-2) model, down to level 1, so the
    chain ``TMDP_A^k -> TMDP_B^{k-1} -> ...`` stores exactly ``k`` Q-tables.
    """

    def __init__(
        self,
        k,
        epsilon,
        lr,
        gamma,
        forget=None,
        prior=1.0,
        opponent_epsilon=None,
        opponent_lr=None,
        **kwargs,
    ):
        k = check_int(k, "k", low=1)
        if k == 1:
            model = DirichletOpponentModel(forget, prior)
        else:
            inner = LevelKQLearner(
                k - 1,
                epsilon if opponent_epsilon is None else opponent_epsilon,
                lr if opponent_lr is None else opponent_lr,
                gamma,
                forget=forget,
                prior=prior,
                opponent_epsilon=opponent_epsilon,
                opponent_lr=opponent_lr,
                policy=kwargs.get("policy", "epsilon_greedy"),
                temperature=kwargs.get("temperature", 1.0),
            )
            model = AgentOpponentModel(inner)
        super().__init__(model, epsilon, lr, gamma, **kwargs)
        self.k = k

    @property
    def depth(self):
        """Number of nested Q-functions (own one included); equals ``k``."""
        model = self.opponent_model
        return 1 if isinstance(model, DirichletOpponentModel) else 1 + model.agent.depth


class OpponentAveragingQLearner(TMDPQLearner):
    r"""Opponent averaging, Section 4.3.3 and Algorithm 4.2: ``opponent_models`` are agents
    *from the opponent's side* (e.g. ``[LevelKQLearner(1, ...), LevelKQLearner(2, ...)]``
    for the level-3 DM of figure 4.6(d)) or
    :class:`~pyro_ext.rl.opponent_models.OpponentModel` instances; :attr:`model_probs` is the
    posterior over them."""

    def __init__(self, opponent_models, epsilon, lr, gamma, prior=1.0, **kwargs):
        super().__init__(MixtureOpponentModel(opponent_models, prior), epsilon, lr, gamma, **kwargs)

    @property
    def model_probs(self):
        return self.opponent_model.model_probs


class MultiOpponentQLearner(ValueLearner):
    r"""FPQ-learner facing ``num_opponents`` conditionally independent opponents, Section 4.3.5:
    ``Q(s, a, b^1, ..., b^M)`` is averaged over
    :math:`p_A(b^1,\ldots,b^M|s) = \prod_i p_A(b^i|s)`, each factor a Dirichlet model
    (with Algorithm 4.4's ``forget``). ``opponent_action`` has shape ``(B, M)``."""

    def __init__(self, num_opponents, epsilon, lr, gamma, forget=None, prior=1.0, **kwargs):
        super().__init__(epsilon, lr, gamma, **kwargs)
        self.num_opponents = check_int(num_opponents, "num_opponents", low=1)
        self.models = [DirichletOpponentModel(forget, prior) for _ in range(self.num_opponents)]

    def attach(self, num_states, num_actions, num_opponent_actions):
        super().attach(num_states, num_actions, num_opponent_actions)
        for model in self.models:
            model.attach(num_states, num_opponent_actions, num_actions)
        return self

    def reset(self, batch_size, generator):
        super().reset(batch_size, generator)
        joint = self.num_opponent_actions**self.num_opponents
        shape = (batch_size, self.num_states, self.num_actions, joint)
        self.q = torch.zeros(shape, device=self.device)
        for model in self.models:
            model.reset(batch_size, generator)
        return self

    def opponent_probs(self, state):
        """Joint :math:`p_A(b^1, \\ldots, b^M | s)`, flattened to ``(B, n^M)`` (row-major)."""
        joint = self.models[0].probs(state)
        for model in self.models[1:]:
            joint = (joint.unsqueeze(-1) * model.probs(state).unsqueeze(-2)).flatten(-2)
        return joint

    def joint_index(self, opponent_action):
        weights = self.num_opponent_actions ** torch.arange(
            self.num_opponents - 1, -1, -1, device=opponent_action.device
        )
        return (opponent_action * weights).sum(dim=-1)

    def q_values(self, state):
        q_s = self.q[batch_rows(self.batch_size, self.device), state]
        return expected_q(q_s, self.opponent_probs(state))

    def check_transition(self, transition):
        super().check_transition(transition)
        opponent_action = transition.opponent_action
        if opponent_action.dim() != 2 or opponent_action.shape[-1] != self.num_opponents:
            raise ValueError(
                f"opponent_action must have shape (B, {self.num_opponents}), "
                f"got {tuple(opponent_action.shape)}"
            )

    def update(self, transition):
        self.check_transition(transition)
        t = transition
        for i, model in enumerate(self.models):
            model.observe(t._replace(opponent_action=t.opponent_action[:, i], opponent_reward=None))
        tmdp_q_update(
            self.q,
            t.state,
            t.action,
            self.joint_index(t.opponent_action),
            t.reward,
            t.next_state,
            self.opponent_probs(t.next_state),
            self.lr,
            self.gamma,
            t.done,
            t.mask,
        )
