"""Threatened Markov decision processes: opponent-aware Q-learning (Gallego, 2021, chapter 4).

Quick start (figure 4.3)::

    from pyro_ext.rl import FriendOrFoe, ExponentialSmootherAdversary, LevelKQLearner, play
    rewards = play(FriendOrFoe(), LevelKQLearner(2, 0.1, 0.1, 0.8),
                   ExponentialSmootherAdversary(0.75), num_episodes=5000, seed=0)
"""

from .agents import (
    AgentOpponentModel,
    ApproximateLevel2QLearner,
    ApproximateQLearner,
    DirichletOpponentModel,
    FPQLearner,
    LevelKQLearner,
    MixtureOpponentModel,
    MultiOpponentQLearner,
    OpponentAveragingQLearner,
    QLearner,
    TMDPQLearner,
    dirichlet_forget_update,
    expected_q,
    q_update,
    tmdp_q_update,
)
from .base import Agent, Environment
from .envs import (
    Blotto,
    CoinGame,
    DataSharingGame,
    FriendOrFoe,
    SpatialFriendOrFoe,
    regulated_payoffs,
)
from .opponents import ExponentialSmootherAdversary, FixedPolicyOpponent, TitForTat
from .policies import epsilon_greedy_probs, greedy_probs, policy_probs, sample, softmax_probs
from .policy_gradient import (
    CategoricalTaxPolicy,
    GaussianTaxPolicy,
    PolicyGradientAgent,
    Regulator,
    gaussian_score,
    play_regulated,
    reinforce_update,
    softmax_score,
)
from .runner import play, play_many, plot_reward_curves

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
    "PolicyGradientAgent",
    "QLearner",
    "Regulator",
    "SpatialFriendOrFoe",
    "TMDPQLearner",
    "TitForTat",
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
