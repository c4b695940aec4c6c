r"""Q-learning agents with function approximation (Gallego, 2021, Sections 4.3.4 and 4.4.3).

The Q-functions are linear in state features :math:`\phi(s)` or one-hidden-layer tanh
networks, one set of parameters per independent run, learned by semi-gradient steps:

* :class:`ApproximateQLearner` -- the independent (level-0) learner, eq. (4.1), the L0 player
  of the coin game (figure 4.10);
* :class:`ApproximateLevel2QLearner` -- level-2 thinking, Algorithm 4.3.

With one-hot features and no hidden layer they coincide with the tabular
:class:`~pyro_ext.rl.tabular.QLearner` and ``LevelKQLearner(2, ...)``.
"""

import math

import torch

from ..ops.validation import check_int, check_real
from .base import ValueLearner
from .opponent_models import DirichletOpponentModel
from .policies import policy_probs
from .updates import bootstrap_and_mask, expected_q

__all__ = ["ApproximateQLearner", "ApproximateLevel2QLearner"]


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


class ApproximateQLearner(ValueLearner):
    r"""Independent (opponent-unaware) Q-learner with function approximation: eq. (4.1) as
    semi-gradient steps on :math:`Q_\phi(s, a)`, linear in ``features(state)``
    (``hidden=None``, the L0 player of the coin game, Section 4.4.3) or a one-hidden-layer
    network. With one-hot features and ``hidden=None`` it coincides with
    :class:`~pyro_ext.rl.tabular.QLearner`.

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

    def update(self, transition):
        self.check_transition(transition)
        t = transition
        reward = t.reward.to(torch.get_default_dtype())
        notdone, mask = bootstrap_and_mask(t.mask, t.done, reward)
        value = self.q_values(t.next_state).max(dim=-1).values
        self.q.sgd_step(
            self._phi(t.state), t.action, reward + self.gamma * notdone * value, self.lr, mask
        )


class ApproximateLevel2QLearner(ValueLearner):
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

    def update(self, transition):
        self.check_transition(transition)
        t = transition
        if t.opponent_reward is None:
            raise ValueError("opponent_reward is required: Algorithm 4.3 learns from r_B")
        dtype = torch.get_default_dtype()
        reward, opponent_reward = t.reward.to(dtype), t.opponent_reward.to(dtype)
        notdone, mask = bootstrap_and_mask(t.mask, t.done, reward)
        phi, phi_next = self._phi(t.state), self._phi(t.next_state)
        na, nb = self.num_actions, self.num_opponent_actions
        # Line 3: the opponent (level-1) learns from r_B with his Dirichlet belief p_B(a|s').
        self.belief.observe(t.swap_players())
        value_b = expected_q(self.q_b(phi_next), self.belief.probs(t.next_state)).max(dim=-1).values
        self.q_b.sgd_step(
            phi,
            t.opponent_action * na + t.action,
            opponent_reward + self.gamma * notdone * value_b,
            self.opponent_lr,
            mask,
        )
        # Lines 4-5: the DM learns with the updated opponent policy p_A(b|s').
        value_a = expected_q(self.q_a(phi_next), self.opponent_probs(t.next_state, phi_next))
        self.q_a.sgd_step(
            phi,
            t.action * nb + t.opponent_action,
            reward + self.gamma * notdone * value_a.max(dim=-1).values,
            self.lr,
            mask,
        )
