r"""Common API of agents and environments for threatened Markov decision processes.

A TMDP (Gallego, 2021, Definition 4.1) is a tuple :math:`(\mathcal{S}, \mathcal{A},
\mathcal{B}, \mathcal{T}, R, p_A)`: the supported agent A (the decision maker, DM) picks
:math:`a \in \mathcal{A}`, her opponent B picks :math:`b \in \mathcal{B}`, and both the
transition and the reward depend on the pair :math:`(a, b)`.

Everything is batched: a leading dimension ``B`` indexes *independent runs* (independent
environments, each with its own agent tables), so that many seeds vectorise. States are
integer indices (``LongTensor`` of shape ``(B,)``), actions too.

One step of a game reaches a learner as a :class:`Transition`,
:math:`(s, a, b, r_A, s', r_B)` with the ``done`` and ``mask`` flags of every run;
:meth:`Transition.swap_players` gives the same step seen from the opponent's side.
"""

from abc import ABC, abstractmethod
from typing import NamedTuple

import torch

from ..ops.validation import check_int, check_real
from .policies import check_policy, policy_probs, sample_unchecked

__all__ = ["Agent", "Environment", "Transition", "ValueLearner"]


def check_actions(actions, num_actions, name):
    """Raise a ValueError if ``actions`` holds an index outside ``[0, num_actions)``."""
    if actions.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise ValueError(f"{name} must be an integer tensor, got dtype {actions.dtype}")
    if actions.numel() and (int(actions.min()) < 0 or int(actions.max()) >= num_actions):
        raise ValueError(
            f"{name} must lie in [0, {num_actions}), got values in "
            f"[{int(actions.min())}, {int(actions.max())}]"
        )


class Transition(NamedTuple):
    r"""One step :math:`(s, a, b, r_A, s', r_B)` of ``B`` independent runs, seen from the side
    of the agent that learns from it (its own ``action`` and ``reward`` first).

    The fields are tensors with a leading batch dimension ``B``; facing ``M`` opponents,
    ``opponent_action`` and ``opponent_reward`` carry a trailing dimension of size ``M``.
    """

    #: States :math:`s`, LongTensor ``(B,)``.
    state: torch.Tensor
    #: The agent's actions :math:`a`, LongTensor ``(B,)``.
    action: torch.Tensor
    #: The opponent's actions :math:`b`, LongTensor ``(B,)`` (``(B, M)`` for ``M`` opponents).
    opponent_action: torch.Tensor
    #: The agent's rewards :math:`r_A`, ``(B,)``.
    reward: torch.Tensor
    #: Next states :math:`s'`, LongTensor ``(B,)``.
    next_state: torch.Tensor
    #: The opponent's rewards :math:`r_B`, ``(B,)`` or ``(B, M)``; ``None`` if not observed.
    opponent_reward: torch.Tensor | None = None
    #: Bool ``(B,)``, True where ``next_state`` is terminal (no bootstrap); ``None``: nowhere.
    done: torch.Tensor | None = None
    #: Bool ``(B,)``; rows where it is False (runs whose episode has already ended) are left
    #: untouched; ``None``: every run learns.
    mask: torch.Tensor | None = None

    def swap_players(self, opponent=None):
        """The same step seen from the opponent's side: actions and rewards swapped.

        :param opponent: facing several opponents, the index (in the trailing dimension of
            ``opponent_action`` and ``opponent_reward``) of the one whose side to take.
        """
        opponent_action, opponent_reward = self.opponent_action, self.opponent_reward
        if opponent is not None:
            opponent_action = opponent_action[..., opponent]
            if opponent_reward is not None:
                opponent_reward = opponent_reward[..., opponent]
        return Transition(
            self.state,
            opponent_action,
            self.action,
            opponent_reward,
            self.next_state,
            self.reward,
            self.done,
            self.mask,
        )


class Agent(ABC):
    r"""A (batched) player of a two-player stochastic game.

    Lifecycle: :meth:`attach` fixes the sizes of the game *seen from this agent's side*
    (its own actions, its opponent's actions); :meth:`reset` allocates the tables of
    ``batch_size`` independent runs on ``generator.device``; then :meth:`act` and
    :meth:`update` alternate. An opponent uses the very same API from its own side, i.e.
    with ``action`` and ``opponent_action`` (and the two rewards) swapped
    (:meth:`Transition.swap_players`).

    Sizes given to the constructor (``num_actions``, ``num_opponent_actions``) are checked
    against the game in :meth:`attach`, so that a mismatched action space is a clear error.
    """

    def __init__(self, num_actions=None, num_opponent_actions=None):
        self._declared = {
            "num_actions": None
            if num_actions is None
            else check_int(num_actions, "num_actions", low=1),
            "num_opponent_actions": None
            if num_opponent_actions is None
            else check_int(num_opponent_actions, "num_opponent_actions", low=1),
        }
        self.num_states = self.num_actions = self.num_opponent_actions = None
        self.generator = None
        self.batch_size = None

    def attach(self, num_states, num_actions, num_opponent_actions):
        """Fix the game sizes seen from this agent's side; raise on mismatched spaces."""
        sizes = {"num_actions": num_actions, "num_opponent_actions": num_opponent_actions}
        for name, size in sizes.items():
            declared = self._declared[name]
            if declared is not None and declared != size:
                raise ValueError(
                    f"{type(self).__name__} was built for {name}={declared} but the game has "
                    f"{name}={size}"
                )
        self.num_states = check_int(num_states, "num_states", low=1)
        self.num_actions = check_int(num_actions, "num_actions", low=1)
        self.num_opponent_actions = check_int(num_opponent_actions, "num_opponent_actions", low=1)
        return self

    def reset(self, batch_size, generator):
        """Allocate the state of ``batch_size`` independent runs on ``generator.device``."""
        if self.num_actions is None:
            raise ValueError(f"{type(self).__name__}.attach(...) must be called before reset")
        self.batch_size = check_int(batch_size, "batch_size", low=1)
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator)}")
        self.generator = generator
        return self

    @property
    def device(self):
        return self.generator.device

    @abstractmethod
    def action_probs(self, state):
        """Policy :math:`\\pi(a | s)` of every run: ``(B,) -> (B, num_actions)``."""

    def act(self, state):
        """Sample an action for every run: LongTensor ``(B,) -> (B,)``."""
        return sample_unchecked(self.action_probs(state), self.generator)

    @abstractmethod
    def update(self, transition):
        """Learn from the :class:`Transition` ``(s, a, b, r_A, s', r_B)`` of every run, seen
        from this agent's side; runs where ``transition.mask`` is False are left untouched."""

    def check_transition(self, transition):
        """Raise a TypeError if ``transition`` is not a :class:`Transition`, and a ValueError
        if one of its actions lies outside this agent's action spaces."""
        if not isinstance(transition, Transition):
            raise TypeError(
                f"{type(self).__name__}.update takes a Transition, got {type(transition).__name__}"
            )
        check_actions(transition.action, self.num_actions, "action")
        check_actions(transition.opponent_action, self.num_opponent_actions, "opponent_action")


class ValueLearner(Agent):
    r"""An agent that learns values :math:`\psi(s, \cdot)` (:meth:`q_values`) and acts on them
    by the ε-greedy or softmax policy of Section 4.3: the common base of the tabular and the
    function-approximation learners. Validates ``epsilon`` in [0, 1], ``temperature`` > 0,
    ``lr`` in (0, 1] and ``gamma`` in [0, 1)."""

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


class Environment(ABC):
    """A batched two-player game with a small common API.

    Attributes: ``num_states``, ``num_actions`` (the supported agent's), ``num_opponent_actions``
    (each opponent's), ``num_opponents`` (1 unless several opponents act, then opponent
    actions and rewards carry a trailing dimension of that size) and ``horizon`` (maximum
    number of steps of an episode). ``done`` returned by :meth:`step` marks *terminal*
    states (no bootstrapping); reaching the horizon is a truncation, not a termination, so
    repeated games (one state, ``horizon=1``) keep discounting across rounds as in the thesis.
    """

    num_opponents = 1

    @abstractmethod
    def reset(self, batch_size, generator):
        """Start an episode in ``batch_size`` independent runs; return the states ``(B,)``."""

    @abstractmethod
    def step(self, action, opponent_action):
        """Return ``(next_state, reward, opponent_reward, done)`` for every run."""

    def features(self, state):
        """Real feature vectors of the states, ``(B,) -> (B, num_features)`` (default one-hot)."""
        return torch.nn.functional.one_hot(state, self.num_states).to(torch.get_default_dtype())

    @property
    def num_features(self):
        return self.num_states

    def check_actions(self, action, opponent_action):
        check_actions(action, self.num_actions, "action")
        check_actions(opponent_action, self.num_opponent_actions, "opponent_action")
        expected = action.shape if self.num_opponents == 1 else (*action.shape, self.num_opponents)
        if tuple(opponent_action.shape) != tuple(expected):
            raise ValueError(
                f"opponent_action must have shape {tuple(expected)}, "
                f"got {tuple(opponent_action.shape)}"
            )
