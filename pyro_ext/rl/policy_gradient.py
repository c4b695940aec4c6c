r"""Policy-gradient players and a learning regulator for the data sharing game (Section 4.5.4).

The regulated game is a bi-level RL problem solved with policy gradients: the Citizen and the
DDO are REINFORCE learners of softmax policies (:class:`PolicyGradientAgent`), and a third
player, the :class:`Regulator`, transfers utility between them through taxes (and, optionally,
incentives). Its tax policy (:class:`GaussianTaxPolicy` or :class:`CategoricalTaxPolicy`) is
itself learned by REINFORCE on the social utility (4.4): a tax regime is drawn, the players
learn under it for ``period`` rounds (inner loop), then the regulator takes one gradient step
(outer loop). :func:`play_regulated` runs the three learners on
:class:`~pyro_ext.rl.envs.DataSharingGame`.

Quick start (figure 4.14, Gaussian regulator)::

    from pyro_ext.rl import (DataSharingGame, GaussianTaxPolicy, PolicyGradientAgent,
                             Regulator, play_regulated)
    su, tax = play_regulated(DataSharingGame(), PolicyGradientAgent(0.01),
                             PolicyGradientAgent(0.01), Regulator(GaussianTaxPolicy(0.005)),
                             num_rounds=1000, num_runs=5, seed=0)
"""

import torch

from ..ops.validation import check_int, check_positive, check_real
from .base import Agent, Transition
from .envs import DataSharingGame, regulated_payoffs
from .policies import sample_unchecked
from .runner import seeded_generator
from .updates import batch_rows, gaussian_score, reinforce_update, softmax_score

__all__ = [
    "PolicyGradientAgent",
    "GaussianTaxPolicy",
    "CategoricalTaxPolicy",
    "Regulator",
    "play_regulated",
]


class PolicyGradientAgent(Agent):
    r"""REINFORCE learner of a softmax policy :math:`\pi(a | s) \propto \exp \theta_{s,a}`, the
    players of the regulator experiments (Section 4.5.4): one parameter update per round,
    :func:`reinforce_update` with learning rate ``lr`` (:math:`\eta`) and discount ``gamma``.

    With ``state_conditional=False`` (default) the policy ignores the state, so that in the
    data sharing game :math:`\theta_a \in \mathbb{R}^2` are the logits of cooperate/defect, as
    in the thesis; ``state_conditional=True`` keeps one logit vector per state (memory-1 on
    :class:`~pyro_ext.rl.envs.DataSharingGame`). Logits start at zero (uniform policy).
    """

    def __init__(
        self, lr, gamma=0.0, state_conditional=False, num_actions=None, num_opponent_actions=None
    ):
        super().__init__(num_actions, num_opponent_actions)
        self.lr = check_positive(lr, "lr")
        self.gamma = check_real(gamma, "gamma", 0, 1, high_open=True)
        self.state_conditional = bool(state_conditional)

    def reset(self, batch_size, generator):
        super().reset(batch_size, generator)
        slots = self.num_states if self.state_conditional else 1
        self.logits = torch.zeros(batch_size, slots, self.num_actions, device=self.device)
        self.trace = torch.zeros_like(self.logits)
        self.rows = batch_rows(batch_size, self.device)
        return self

    def _slot(self, state):
        return state if self.state_conditional else torch.zeros_like(state)

    def action_probs(self, state):
        return torch.softmax(self.logits[self.rows, self._slot(state)], dim=-1)

    def update(self, transition):
        self.check_transition(transition)
        t = transition
        reinforce_update(
            self.logits,
            self.trace,
            self._slot(t.state),
            t.action,
            t.reward,
            self.lr,
            self.gamma,
            t.mask,
        )


class _PeriodicTaxPolicy:
    """A tax regime drawn every ``period`` rounds and improved by REINFORCE on the mean social
    utility of its period, with the previous period's mean as baseline (the first period,
    having none, does not move the parameters)."""

    def __init__(self, lr, period, max_tax):
        self.lr = check_real(lr, "lr", low=0)
        self.period = check_int(period, "period", low=1)
        self.max_tax = check_real(max_tax, "max_tax", 0, 1)

    def reset(self, batch_size, generator):
        self.generator = generator
        self.theta = self.initial_parameters(batch_size, generator.device)
        self.decision = self.draw()
        self.total = torch.zeros(batch_size, device=generator.device)
        self.rounds, self.previous = 0, None
        return self

    def observe(self, social_utility):
        """Accumulate one round's :math:`SU_t` ``(B,)``; at the end of a period take the outer
        step :math:`\\theta_R := \\theta_R + \\eta (\\overline{SU}_k - \\overline{SU}_{k-1})
        \\nabla \\log \\pi_R(d_R)` and draw the next regime."""
        self.total += social_utility
        self.rounds += 1
        if self.rounds < self.period:
            return
        mean = self.total / self.period
        if self.previous is not None:
            advantage = (mean - self.previous).view(-1, *([1] * (self.theta.dim() - 1)))
            self.theta = self.theta + self.lr * advantage * self.score()
        self.previous, self.rounds = mean, 0
        self.total = torch.zeros_like(mean)
        self.decision = self.draw()


class GaussianTaxPolicy(_PeriodicTaxPolicy):
    r"""The continuous regulator of figure 4.14: :math:`d_R \sim \mathcal{N}(\theta_R, \sigma^2)`
    with :math:`\sigma` = ``scale`` (0.05 in the thesis) and tax rate
    :math:`x = 0.5\,\mathrm{sigmoid}(d_R)` (``max_tax`` = 0.5), the same for both players.
    :math:`\theta_R` starts at ``init`` (0: the middle of the tax range)."""

    def __init__(self, lr, scale=0.05, init=0.0, period=50, max_tax=0.5):
        super().__init__(lr, period, max_tax)
        self.scale = check_positive(scale, "scale")
        self.init = check_real(init, "init")

    def initial_parameters(self, batch_size, device):
        return torch.full((batch_size,), self.init, device=device)

    def draw(self):
        noise = torch.randn(self.theta.shape, generator=self.generator, device=self.theta.device)
        return self.theta + self.scale * noise

    def score(self):
        return gaussian_score(self.decision, self.theta, self.scale)

    @property
    def rate(self):
        """Tax rate of the current regime, ``(B,)``."""
        return self.max_tax * torch.sigmoid(self.decision)


class CategoricalTaxPolicy(_PeriodicTaxPolicy):
    r"""The discrete regulator of figure 4.14: :math:`a_R` categorical with logits
    :math:`\theta_R \in \mathbb{R}^4` (zero at the start) over the tax rates ``rates``
    (0, 0.15, 0.30, 0.50 in the thesis)."""

    def __init__(self, lr, rates=(0.0, 0.15, 0.30, 0.50), period=50):
        rates = [check_real(r, "rates", 0, 1) for r in rates]
        if not rates:
            raise ValueError("rates must hold at least one tax rate")
        super().__init__(lr, period, max(rates))
        self.rates = torch.tensor(rates)

    def initial_parameters(self, batch_size, device):
        return torch.zeros(batch_size, len(self.rates), device=device)

    def draw(self):
        return sample_unchecked(torch.softmax(self.theta, dim=-1), self.generator)

    def score(self):
        return softmax_score(self.theta, self.decision)

    @property
    def rate(self):
        return self.rates.to(self.theta.device)[self.decision]


class Regulator:
    r"""Third player of the data sharing game (Section 4.5.4). Each round it pays the incentive
    :math:`I` (``incentive``) to both players on mutual cooperation during the first
    ``incentive_rounds`` rounds (every round when ``None``; figures 4.15-4.16), then collects
    the tax of its ``tax_policy`` (``None``: no taxes) and redistributes it evenly
    (:func:`~pyro_ext.rl.envs.regulated_payoffs`)."""

    def __init__(self, tax_policy=None, incentive=0.0, incentive_rounds=None):
        self.tax_policy = tax_policy
        self.incentive = check_real(incentive, "incentive", low=0)
        if incentive_rounds is not None:
            incentive_rounds = check_int(incentive_rounds, "incentive_rounds", low=0)
        self.incentive_rounds = incentive_rounds

    def reset(self, batch_size, generator):
        self.batch_size, self.device = batch_size, generator.device
        if self.tax_policy is not None:
            self.tax_policy.reset(batch_size, generator)
        return self

    @property
    def tax_rate(self):
        """The current tax rate of every run, ``(B,)``."""
        if self.tax_policy is None:
            return torch.zeros(self.batch_size, device=self.device)
        return self.tax_policy.rate

    def rewards(self, round, raw, mutual):
        """Perceived rewards ``(B, 2)`` of round ``round`` from the raw payoffs ``raw``."""
        paying = self.incentive_rounds is None or round < self.incentive_rounds
        return regulated_payoffs(raw, mutual, self.tax_rate, self.incentive if paying else 0.0)

    def observe(self, social_utility):
        """The regulator's reward, the raw social utility (4.4) of the round, ``(B,)``."""
        if self.tax_policy is not None:
            self.tax_policy.observe(social_utility)


def play_regulated(
    env, citizen, ddo, regulator=None, num_rounds=1000, num_runs=1, seed=0, device=None
):
    r"""Play ``num_rounds`` rounds of the data sharing game (one repeated game, no episode
    resets) between two learning agents under ``regulator`` (``None``: no regulation),
    ``num_runs`` independent runs batched.

    The regulator's transfers replace the environment's own, so ``env`` must be a
    :class:`~pyro_ext.rl.envs.DataSharingGame` with ``tax=0`` and ``incentive=0``.

    :returns: ``(social_utility, tax_rate)``, each ``(num_runs, num_rounds)``: the raw social
        utility (4.4) of every round (incentives excluded) and the tax rate in force.
    """
    if not isinstance(env, DataSharingGame):
        raise TypeError(f"env must be a DataSharingGame, got {type(env).__name__}")
    if env.tax != 0 or env.incentive != 0:
        raise ValueError("env must have tax=0 and incentive=0: the regulator applies transfers")
    for name, agent in (("citizen", citizen), ("ddo", ddo)):
        if not isinstance(agent, Agent):
            raise TypeError(f"{name} must be an Agent, got {type(agent).__name__}")
    num_rounds = check_int(num_rounds, "num_rounds", low=1)
    num_runs = check_int(num_runs, "num_runs", low=1)
    generator = seeded_generator(seed, device)
    regulator = Regulator() if regulator is None else regulator
    citizen.attach(env.num_states, env.num_actions, env.num_opponent_actions)
    ddo.attach(env.num_states, env.num_opponent_actions, env.num_actions)
    for player in (citizen, ddo, regulator):
        player.reset(num_runs, generator)
    social_utility = torch.zeros(num_runs, num_rounds, device=generator.device)
    tax_rate = torch.zeros_like(social_utility)
    state = env.reset(num_runs, generator)
    for t in range(num_rounds):
        action, opponent_action = citizen.act(state), ddo.act(state)
        next_state, reward, opponent_reward, _ = env.step(action, opponent_action)
        mutual = (action == env.COOPERATE) & (opponent_action == env.COOPERATE)
        tax_rate[:, t] = regulator.tax_rate
        perceived = regulator.rewards(t, torch.stack([reward, opponent_reward], dim=-1), mutual)
        transition = Transition(
            state, action, opponent_action, perceived[:, 0], next_state, perceived[:, 1]
        )
        citizen.update(transition)
        ddo.update(transition.swap_players())
        social_utility[:, t] = env.social_utility(reward, opponent_reward)
        regulator.observe(social_utility[:, t])
        state = next_state
    return social_utility, tax_rate
