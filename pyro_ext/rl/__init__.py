"""Threatened Markov decision processes: opponent-aware Q-learning (Gallego, 2021, chapter 4).

Example: reward curves of independent Q-learners against tit-for-tat in the data-sharing game,
``(num_runs, num_episodes)``:

>>> from pyro_ext.rl import DataSharingGame, QLearner, TitForTat, play_many
>>> curves = play_many(DataSharingGame(horizon=5), lambda: QLearner(0.1, 0.5, 0.9), TitForTat, 3, 2, 0)
>>> curves.shape
torch.Size([2, 3])

Quick start (figure 4.3)::

    from pyro_ext.rl import FriendOrFoe, ExponentialSmootherAdversary, LevelKQLearner, play
    rewards = play(FriendOrFoe(), LevelKQLearner(2, 0.1, 0.1, 0.8),
                   ExponentialSmootherAdversary(0.75), num_episodes=5000, seed=0)

Layout: :mod:`~pyro_ext.rl.base` holds the :class:`Agent` and :class:`Environment` APIs and the
:class:`Transition` every learner updates from; :mod:`~pyro_ext.rl.updates` the pure update
functions (eqs. 4.1-4.3, Algorithm 4.4, REINFORCE); :mod:`~pyro_ext.rl.opponent_models` the
:class:`OpponentModel` classes :math:`p_A(b|s)`; :mod:`~pyro_ext.rl.tabular` and
:mod:`~pyro_ext.rl.approximate` the tabular and the function-approximation Q-learners;
:mod:`~pyro_ext.rl.opponents`, :mod:`~pyro_ext.rl.envs`, :mod:`~pyro_ext.rl.policy_gradient`
and :mod:`~pyro_ext.rl.runner` the opponents, games, policy-gradient players and play loops.
"""

from .approximate import ApproximateLevel2QLearner, ApproximateQLearner
from .base import Agent, Environment, Transition, ValueLearner
from .envs import (
    Blotto,
    CoinGame,
    DataSharingGame,
    FriendOrFoe,
    SpatialFriendOrFoe,
    regulated_payoffs,
)
from .opponent_models import (
    AgentOpponentModel,
    DirichletOpponentModel,
    MixtureOpponentModel,
    OpponentModel,
)
from .opponents import ExponentialSmootherAdversary, FixedPolicyOpponent, TitForTat
from .policies import epsilon_greedy_probs, greedy_probs, policy_probs, sample, softmax_probs
from .policy_gradient import (
    CategoricalTaxPolicy,
    GaussianTaxPolicy,
    PolicyGradientAgent,
    Regulator,
    play_regulated,
)
from .runner import play, play_many, plot_reward_curves
from .tabular import (
    FPQLearner,
    LevelKQLearner,
    MultiOpponentQLearner,
    OpponentAveragingQLearner,
    QLearner,
    TMDPQLearner,
)
from .updates import (
    dirichlet_forget_update,
    expected_q,
    gaussian_score,
    q_update,
    reinforce_update,
    softmax_score,
    tmdp_q_update,
)

__all__ = [
    "Agent",
    "AgentOpponentModel",
    "ApproximateLevel2QLearner",
    "ApproximateQLearner",
    "Blotto",
    "CategoricalTaxPolicy",
    "CoinGame",
    "DataSharingGame",
    "DirichletOpponentModel",
    "Environment",
    "ExponentialSmootherAdversary",
    "FPQLearner",
    "FixedPolicyOpponent",
    "FriendOrFoe",
    "GaussianTaxPolicy",
    "LevelKQLearner",
    "MixtureOpponentModel",
    "MultiOpponentQLearner",
    "OpponentAveragingQLearner",
    "OpponentModel",
    "PolicyGradientAgent",
    "QLearner",
    "Regulator",
    "SpatialFriendOrFoe",
    "TMDPQLearner",
    "TitForTat",
    "Transition",
    "ValueLearner",
    "dirichlet_forget_update",
    "epsilon_greedy_probs",
    "expected_q",
    "gaussian_score",
    "greedy_probs",
    "play",
    "play_many",
    "play_regulated",
    "plot_reward_curves",
    "policy_probs",
    "q_update",
    "regulated_payoffs",
    "reinforce_update",
    "sample",
    "softmax_probs",
    "softmax_score",
    "tmdp_q_update",
]
