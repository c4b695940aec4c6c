r"""Q-learning agents for threatened Markov decision processes (Gallego, 2021, chapter 4).

Tabular learners keep, for ``B`` independent runs, a table ``q`` of shape
``(B, num_states, num_actions[, num_opponent_actions])``. The TMDP learners (FPQ, level-k,
opponent averaging, multiple opponents) share one update, eq. (4.2), and one decision rule,
eq. (4.3); they differ only in their *opponent model* :math:`p_A(b | s)`:

* :class:`FPQLearner` -- a Dirichlet model of a non-strategic opponent (Section 4.3.1), with
  the forget factor of Algorithm 4.4;
* :class:`LevelKQLearner` -- the opponent is a level-(k-1) learner whose Q-function is
  estimated from his rewards (Algorithm 4.1), built recursively down to level 1;
* :class:`OpponentAveragingQLearner` -- a Dirichlet posterior over several opponent models
  (Algorithm 4.2);
* :class:`MultiOpponentQLearner` -- conditionally independent opponents (Section 4.3.5);
* :class:`ApproximateLevel2QLearner` -- level-2 thinking with linear or neural Q-functions
  (Algorithm 4.3).

:class:`ApproximateQLearner` is the independent (level-0) learner with the same function
approximation, the L0 player of the coin game (figure 4.10).
"""

import math
from abc import abstractmethod

import torch

from ..ops.validation import check_int, check_positive, check_real
from .base import Agent
from .policies import check_policy, policy_probs

__all__ = [
    "q_update",
    "tmdp_q_update",
    "expected_q",
    "dirichlet_forget_update",
    "QLearner",
    "TMDPQLearner",
    "FPQLearner",
    "LevelKQLearner",
    "OpponentAveragingQLearner",
    "MultiOpponentQLearner",
    "ApproximateQLearner",
    "ApproximateLevel2QLearner",
    "DirichletOpponentModel",
    "AgentOpponentModel",
    "MixtureOpponentModel",
]


def _rows(n, device):
    return torch.arange(n, device=device)


def _keep(mask, done, like):
    """Bootstrap factor ``1 - done`` and row mask (True = update) as tensors like ``like``."""
    notdone = torch.ones_like(like) if done is None else (~done).to(like.dtype)
    mask = torch.ones_like(like, dtype=torch.bool) if mask is None else mask
    return notdone, mask


def q_update(q, state, action, reward, next_state, lr, gamma, done=None, mask=None):
    r"""Q-learning, eq. (4.1), in place on ``q`` of shape ``(B, S, A)``:

    .. math:: Q(s,a) := (1-\alpha) Q(s,a) + \alpha (r + \gamma \max_{a'} Q(s', a')).

    ``done`` (bool ``(B,)``) drops the bootstrap; rows where ``mask`` is False are kept.
    """
    rows = _rows(q.shape[0], q.device)
    reward = reward.to(q.dtype)
    notdone, mask = _keep(mask, done, reward)
    target = reward + gamma * notdone * q[rows, next_state].max(dim=-1).values
    old = q[rows, state, action]
    q[rows, state, action] = torch.where(mask, (1 - lr) * old + lr * target, old)
    return q


def expected_q(q_s, opponent_probs):
    r"""Eq. (4.3): :math:`\psi(a) = \mathbb{E}_{p_A(b|s)}[Q(s,a,b)]`.

    Shapes: ``q_s (B, A, n)`` and ``opponent_probs (B, n)`` give ``(B, A)``.
    """
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
    rows = _rows(q.shape[0], q.device)
    reward = reward.to(q.dtype)
    notdone, mask = _keep(mask, done, reward)
    value_next = expected_q(q[rows, next_state], opponent_probs).max(dim=-1).values
    target = reward + gamma * notdone * value_next
    old = q[rows, state, action, opponent_action]
    q[rows, state, action, opponent_action] = torch.where(mask, (1 - lr) * old + lr * target, old)
    return q


def dirichlet_forget_update(counts, observed, forget=None, mask=None):
    r"""Algorithm 4.4, in place on pseudo-counts ``counts`` of shape ``(B, n)``:
    :math:`\boldsymbol\alpha^t = \lambda \boldsymbol\alpha^{t-1}`, then
    :math:`\alpha^t_i \mathrel{+}= 1` for the observed action ``i``. ``forget=None`` is the
    plain conjugate update of Section 4.3.1 (:math:`\lambda = 1`)."""
    rows = _rows(counts.shape[0], counts.device)
    new = counts if forget is None else counts * forget
    new = new.clone()
    new[rows, observed] += 1.0
    if mask is not None:
        new = torch.where(mask.unsqueeze(-1), new, counts)
    counts.copy_(new)
    return counts


class _Learner(Agent):
    """Shared validation of ``epsilon`` in [0, 1], ``lr`` in (0, 1] and ``gamma`` in [0, 1)."""

    def __init__(
        self,
        epsilon,
        lr,
        gamma,
        policy="epsilon_greedy",
        temperature=1.0,
        num_actions=None,
        num_opponent_actions=None,
    ):
        super().__init__(num_actions, num_opponent_actions)
        self.epsilon, self.temperature = check_policy(policy, epsilon, temperature)
        self.policy = policy
        self.lr = check_real(lr, "lr", 0, 1, low_open=True)
        self.gamma = check_real(gamma, "gamma", 0, 1, high_open=True)

    @abstractmethod
    def q_values(self, state):
        """:math:`\\psi(s, \\cdot)`, the values the policy acts on, ``(B,) -> (B, A)``."""

    def action_probs(self, state):
        return policy_probs(self.q_values(state), self.policy, self.epsilon, self.temperature)


class QLearner(_Learner):
    r"""Independent (opponent-unaware) Q-learner, eq. (4.1): the baseline of figure 4.3."""

    def reset(self, batch_size, generator):
        super().reset(batch_size, generator)
        self.q = torch.zeros(batch_size, self.num_states, self.num_actions, device=self.device)
        return self

    def q_values(self, state):
        return self.q[_rows(self.batch_size, self.device), state]

    def update(
        self,
        state,
        action,
        opponent_action,
        reward,
        next_state,
        opponent_reward=None,
        done=None,
        mask=None,
    ):
        self.check_transition(action, opponent_action)
        q_update(self.q, state, action, reward, next_state, self.lr, self.gamma, done, mask)


class DirichletOpponentModel:
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

    def attach(self, num_states, num_opponent_actions, num_actions):
        self.num_states, self.num_outcomes = num_states, num_opponent_actions
        return self

    def reset(self, batch_size, generator):
        slots = self.num_states if self.state_conditional else 1
        self.counts = torch.full(
            (batch_size, slots, self.num_outcomes), self.prior, device=generator.device
        )
        self.rows = _rows(batch_size, generator.device)
        return self

    def _slot(self, state):
        return state if self.state_conditional else torch.zeros_like(state)

    def probs(self, state):
        counts = self.counts[self.rows, self._slot(state)]
        return counts / counts.sum(dim=-1, keepdim=True)

    def observe(
        self, state, action, opponent_action, reward, opponent_reward, next_state, done, mask
    ):
        slot = self._slot(state)
        counts = self.counts[self.rows, slot]
        dirichlet_forget_update(counts, opponent_action, self.forget, mask)
        self.counts[self.rows, slot] = counts


class AgentOpponentModel:
    r"""Model of a strategic opponent as a learning agent seen from *his* side: it learns
    from ``(s, b, a, r_B, r_A, s')`` and predicts :math:`p_A(b|s)` by his estimated
    (ε-greedy or softmax) policy, Algorithm 4.1 lines 3-4."""

    def __init__(self, agent):
        if not isinstance(agent, Agent):
            raise TypeError(f"opponent model must be an Agent, got {type(agent).__name__}")
        self.agent = agent

    def attach(self, num_states, num_opponent_actions, num_actions):
        self.agent.attach(num_states, num_opponent_actions, num_actions)
        return self

    def reset(self, batch_size, generator):
        self.agent.reset(batch_size, generator)
        return self

    def probs(self, state):
        return self.agent.action_probs(state)

    def observe(
        self, state, action, opponent_action, reward, opponent_reward, next_state, done, mask
    ):
        if opponent_reward is None:
            raise ValueError(
                "opponent_reward is required to learn a strategic opponent model (Algorithm 4.1 "
                "uses r_B); the environment returns it from step()"
            )
        self.agent.update(
            state,
            opponent_action,
            action,
            opponent_reward,
            next_state,
            opponent_reward=reward,
            done=done,
            mask=mask,
        )


class MixtureOpponentModel:
    r"""Opponent averaging, Algorithm 4.2: a Dirichlet posterior :math:`p(M_i | H) \propto n_i`
    over opponent models; a model's count grows when its predicted (most likely) action
    equals the observed one, and :math:`p_A(b|s) = \sum_i p(M_i|H)\, p_{M_i}(b|s)`."""

    def __init__(self, models, prior=1.0):
        models = list(models)
        if not models:
            raise ValueError("opponent_models must hold at least one model")
        self.models = [AgentOpponentModel(m) if isinstance(m, Agent) else m for m in models]
        self.prior = check_positive(prior, "prior")

    def attach(self, num_states, num_opponent_actions, num_actions):
        for model in self.models:
            model.attach(num_states, num_opponent_actions, num_actions)
        return self

    def reset(self, batch_size, generator):
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

    def observe(
        self, state, action, opponent_action, reward, opponent_reward, next_state, done, mask
    ):
        predicted = torch.stack([m.probs(state).argmax(dim=-1) for m in self.models], dim=1)
        hits = (predicted == opponent_action.unsqueeze(-1)).to(self.counts.dtype)
        if mask is not None:
            hits = hits * mask.unsqueeze(-1)
        self.counts += hits
        for model in self.models:
            model.observe(
                state, action, opponent_action, reward, opponent_reward, next_state, done, mask
            )


class TMDPQLearner(_Learner):
    r"""Q-learner of a TMDP with a pluggable opponent model :math:`p_A(b|s)`.

    Decisions maximise eq. (4.3), :math:`\psi(s,a) = \mathbb{E}_{p_A(b|s)} Q(s,a,b)`; after
    the opponent model has learned from the transition, ``Q`` follows eq. (4.2) with
    :math:`p_A(b|s')` from the updated model (Algorithm 4.1 order).
    """

    def __init__(self, opponent_model, epsilon, lr, gamma, **kwargs):
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
        q_s = self.q[_rows(self.batch_size, self.device), state]
        return expected_q(q_s, self.opponent_probs(state))

    def update(
        self,
        state,
        action,
        opponent_action,
        reward,
        next_state,
        opponent_reward=None,
        done=None,
        mask=None,
    ):
        self.check_transition(action, opponent_action)
        self.opponent_model.observe(
            state, action, opponent_action, reward, opponent_reward, next_state, done, mask
        )
        tmdp_q_update(
            self.q,
            state,
            action,
            opponent_action,
            reward,
            next_state,
            self.opponent_probs(next_state),
            self.lr,
            self.gamma,
            done,
            mask,
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
    for the level-3 DM of figure 4.6(d)); :attr:`model_probs` is the posterior over them."""

    def __init__(self, opponent_models, epsilon, lr, gamma, prior=1.0, **kwargs):
        super().__init__(MixtureOpponentModel(opponent_models, prior), epsilon, lr, gamma, **kwargs)

    @property
    def model_probs(self):
        return self.opponent_model.model_probs


class MultiOpponentQLearner(_Learner):
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
        q_s = self.q[_rows(self.batch_size, self.device), state]
        return expected_q(q_s, self.opponent_probs(state))

    def check_transition(self, action, opponent_action):
        super().check_transition(action, opponent_action)
        if opponent_action.dim() != 2 or opponent_action.shape[-1] != self.num_opponents:
            raise ValueError(
                f"opponent_action must have shape (B, {self.num_opponents}), "
                f"got {tuple(opponent_action.shape)}"
            )

    def update(
        self,
        state,
        action,
        opponent_action,
        reward,
        next_state,
        opponent_reward=None,
        done=None,
        mask=None,
    ):
        self.check_transition(action, opponent_action)
        for i, model in enumerate(self.models):
            model.observe(
                state, action, opponent_action[:, i], reward, None, next_state, done, mask
            )
        tmdp_q_update(
            self.q,
            state,
            action,
            self.joint_index(opponent_action),
            reward,
            next_state,
            self.opponent_probs(next_state),
            self.lr,
            self.gamma,
            done,
            mask,
        )


class _BatchedQNetwork:
    """Per-run Q-function approximator ``features (B, F) -> (B, rows, cols)``: linear
    (:math:`Q(s,\\cdot) = W^\\top \\phi(s)`, as in Section 4.4.3) or a one-hidden-layer tanh
    network when ``hidden`` is given; run ``i`` only ever uses its own parameters."""

    def __init__(self, batch_size, num_features, rows, cols, hidden, generator):
        self.shape = (rows, cols)
        out = rows * cols
        device = generator.device
        if hidden is None:
            self.params = [torch.zeros(batch_size, num_features, out, device=device)]
        else:
            w1 = torch.randn(batch_size, num_features, hidden, generator=generator, device=device)
            self.params = [
                w1 / math.sqrt(num_features),
                torch.zeros(batch_size, hidden, device=device),
                torch.zeros(batch_size, hidden, out, device=device),
            ]

    def __call__(self, x, params=None):
        params = self.params if params is None else params
        if len(params) == 1:
            out = torch.bmm(x.unsqueeze(1), params[0])
        else:
            h = torch.tanh(torch.bmm(x.unsqueeze(1), params[0]) + params[1].unsqueeze(1))
            out = torch.bmm(h, params[2])
        return out.view(x.shape[0], *self.shape)

    def sgd_step(self, x, index, target, lr, mask):
        r"""Semi-gradient step :math:`\phi := \phi - \alpha \partial_\phi Q (Q - y)` per run."""
        params = [p.detach().requires_grad_(True) for p in self.params]
        with torch.enable_grad():
            q = self(x, params).flatten(1).gather(1, index.unsqueeze(1)).squeeze(1)
            error = (q - target) * mask.to(q.dtype)
            grads = torch.autograd.grad(0.5 * (error * (q - target)).sum(), params)
        self.params = [p.detach() - lr * g for p, g in zip(params, grads)]


def _state_features(features, num_states, state):
    """``features(state)``, or one-hot states when no feature map is given."""
    if features is None:
        return torch.nn.functional.one_hot(state, num_states).to(torch.get_default_dtype())
    return features(state)


def _check_features(features, num_features):
    if (features is None) != (num_features is None):
        raise ValueError("features and num_features must be given together")
    return check_int(num_features, "num_features", low=1, allow_none=True)


class ApproximateQLearner(_Learner):
    r"""Independent (opponent-unaware) Q-learner with function approximation: eq. (4.1) as
    semi-gradient steps on :math:`Q_\phi(s, a)`, linear in ``features(state)``
    (``hidden=None``, the L0 player of the coin game, Section 4.4.3) or a one-hidden-layer
    network. With one-hot features and ``hidden=None`` it coincides with :class:`QLearner`.

    :param features: callable ``state (B,) -> (B, num_features)``; default one-hot states.
    """

    def __init__(self, epsilon, lr, gamma, features=None, num_features=None, hidden=None, **kwargs):
        super().__init__(epsilon, lr, gamma, **kwargs)
        self.num_features = _check_features(features, num_features)
        self.features = features
        self.hidden = check_int(hidden, "hidden", low=1, allow_none=True)

    def reset(self, batch_size, generator):
        super().reset(batch_size, generator)
        nf = self.num_states if self.features is None else self.num_features
        self.q = _BatchedQNetwork(batch_size, nf, self.num_actions, 1, self.hidden, generator)
        return self

    def _phi(self, state):
        return _state_features(self.features, self.num_states, state)

    def q_values(self, state):
        return self.q(self._phi(state)).squeeze(-1)

    def update(
        self,
        state,
        action,
        opponent_action,
        reward,
        next_state,
        opponent_reward=None,
        done=None,
        mask=None,
    ):
        self.check_transition(action, opponent_action)
        reward = reward.to(torch.get_default_dtype())
        notdone, mask = _keep(mask, done, reward)
        value = self.q_values(next_state).max(dim=-1).values
        self.q.sgd_step(
            self._phi(state), action, reward + self.gamma * notdone * value, self.lr, mask
        )


class ApproximateLevel2QLearner(_Learner):
    r"""Level-2 Q-learner with function approximation, Section 4.3.4 and Algorithm 4.3.

    The DM's :math:`Q_{\phi_A}(s, a, b)` and her estimate :math:`\hat Q_{\phi_B}(s, b, a)` of
    a level-1 opponent are linear in ``features(state)`` (``hidden=None``, Section 4.4.3) or
    one-hidden-layer networks; the opponent's belief :math:`p_B(a)` about the DM is a
    Dirichlet model. Each update takes the semi-gradient steps of lines 3 and 5 with learning
    rates ``opponent_lr`` (:math:`\alpha_1`) and ``lr`` (:math:`\alpha_2`). With one-hot
    features and ``hidden=None`` it coincides with the tabular ``LevelKQLearner(2, ...)``.

    :param features: callable ``state (B,) -> (B, num_features)``; default one-hot states.
    """

    def __init__(
        self,
        epsilon,
        lr,
        gamma,
        features=None,
        num_features=None,
        hidden=None,
        opponent_epsilon=None,
        opponent_lr=None,
        prior=1.0,
        **kwargs,
    ):
        super().__init__(epsilon, lr, gamma, **kwargs)
        self.num_features = _check_features(features, num_features)
        self.features = features
        self.hidden = check_int(hidden, "hidden", low=1, allow_none=True)
        self.opponent_epsilon = self.epsilon
        if opponent_epsilon is not None:
            self.opponent_epsilon = check_real(opponent_epsilon, "opponent_epsilon", 0, 1)
        self.opponent_lr = self.lr
        if opponent_lr is not None:
            self.opponent_lr = check_real(opponent_lr, "opponent_lr", 0, 1, low_open=True)
        self.belief = DirichletOpponentModel(prior=prior)

    def attach(self, num_states, num_actions, num_opponent_actions):
        super().attach(num_states, num_actions, num_opponent_actions)
        self.belief.attach(num_states, num_actions, num_opponent_actions)
        return self

    def reset(self, batch_size, generator):
        super().reset(batch_size, generator)
        nf = self.num_states if self.features is None else self.num_features
        na, nb = self.num_actions, self.num_opponent_actions
        self.q_a = _BatchedQNetwork(batch_size, nf, na, nb, self.hidden, generator)
        self.q_b = _BatchedQNetwork(batch_size, nf, nb, na, self.hidden, generator)
        self.belief.reset(batch_size, generator)
        return self

    def _phi(self, state):
        return _state_features(self.features, self.num_states, state)

    def opponent_probs(self, state, phi=None):
        """Line 4: the level-1 opponent's estimated policy :math:`p_A(b | s)`."""
        phi = self._phi(state) if phi is None else phi
        psi_b = expected_q(self.q_b(phi), self.belief.probs(state))
        return policy_probs(psi_b, self.policy, self.opponent_epsilon, self.temperature)

    def q_values(self, state):
        phi = self._phi(state)
        return expected_q(self.q_a(phi), self.opponent_probs(state, phi))

    def update(
        self,
        state,
        action,
        opponent_action,
        reward,
        next_state,
        opponent_reward=None,
        done=None,
        mask=None,
    ):
        self.check_transition(action, opponent_action)
        if opponent_reward is None:
            raise ValueError("opponent_reward is required: Algorithm 4.3 learns from r_B")
        dtype = torch.get_default_dtype()
        reward, opponent_reward = reward.to(dtype), opponent_reward.to(dtype)
        notdone, mask = _keep(mask, done, reward)
        phi, phi_next = self._phi(state), self._phi(next_state)
        na, nb = self.num_actions, self.num_opponent_actions
        # Line 3: the opponent (level-1) learns from r_B with his Dirichlet belief p_B(a|s').
        self.belief.observe(state, opponent_action, action, None, None, next_state, done, mask)
        value_b = expected_q(self.q_b(phi_next), self.belief.probs(next_state)).max(dim=-1).values
        self.q_b.sgd_step(
            phi,
            opponent_action * na + action,
            opponent_reward + self.gamma * notdone * value_b,
            self.opponent_lr,
            mask,
        )
        # Lines 4-5: the DM learns with the updated opponent policy p_A(b|s').
        value_a = expected_q(self.q_a(phi_next), self.opponent_probs(next_state, phi_next))
        self.q_a.sgd_step(
            phi,
            action * nb + opponent_action,
            reward + self.gamma * notdone * value_a.max(dim=-1).values,
            self.lr,
            mask,
        )
