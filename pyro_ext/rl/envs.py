r"""Environments of Gallego (2021), chapter 4, behind the batched API of
:class:`~pyro_ext.rl.base.Environment`. The supported agent (DM) is always the first player."""

import itertools

import torch

from ..ops.validation import check_int, check_real
from .base import Environment

__all__ = [
    "FriendOrFoe",
    "SpatialFriendOrFoe",
    "Blotto",
    "CoinGame",
    "DataSharingGame",
    "regulated_payoffs",
]


def _zeros_long(batch_size, generator):
    return torch.zeros(batch_size, dtype=torch.long, device=generator.device)


class FriendOrFoe(Environment):
    r"""Stateless friend-or-foe game (Section 4.4.1, figure 4.3): the DM picks one of two
    targets, the adversary picks the one hiding the positive reward; the DM gets ``+payoff``
    if they match and ``-payoff`` otherwise, the adversary the opposite (zero-sum, as the
    level-2 DM assumes). It is a *repeated* game with a single state: each round is an
    episode (``horizon=1``) and no state is terminal, so the discount factor still applies
    across rounds, as in the thesis (:math:`\gamma = 0.8`)."""

    num_states, num_actions, num_opponent_actions, horizon = 1, 2, 2, 1

    def __init__(self, payoff=50.0):
        self.payoff = check_real(payoff, "payoff")

    def reset(self, batch_size, generator):
        return _zeros_long(batch_size, generator)

    def step(self, action, opponent_action):
        self.check_actions(action, opponent_action)
        match = action == opponent_action
        reward = torch.where(match, self.payoff, -self.payoff)
        return torch.zeros_like(action), reward, -reward, torch.zeros_like(match)


class SpatialFriendOrFoe(Environment):
    r"""Spatial friend-or-foe gridworld (figure 4.2): a room of ``4 x 3`` cells with the two
    targets in the top corners ``(0, 0)`` and ``(0, 2)`` and the DM starting at ``(3, 1)``.
    DM actions: up, right, down, left (moves into a wall leave her in place); the adversary's
    action is the target hiding the positive reward. Each step costs ``-1``; reaching a target
    ends the episode with ``+-50`` more for the DM (``-+50`` for the adversary); episodes are
    truncated after ``horizon=50`` steps. States are cell indices ``row * 3 + col``."""

    height, width = 4, 3
    targets = ((0, 0), (0, 2))
    start = (3, 1)
    num_actions, num_opponent_actions = 4, 2
    MOVES = ((-1, 0), (0, 1), (1, 0), (0, -1))

    def __init__(self, payoff=50.0, step_cost=1.0, horizon=50):
        self.payoff = check_real(payoff, "payoff")
        self.step_cost = check_real(step_cost, "step_cost")
        self.horizon = check_int(horizon, "horizon", low=1)
        self.num_states = self.height * self.width
        self.target_states = [r * self.width + c for r, c in self.targets]

    def reset(self, batch_size, generator):
        self.state = _zeros_long(batch_size, generator) + self.start[0] * self.width + self.start[1]
        return self.state

    def step(self, action, opponent_action):
        self.check_actions(action, opponent_action)
        moves = torch.tensor(self.MOVES, device=action.device)[action]
        row = (self.state // self.width + moves[:, 0]).clamp(0, self.height - 1)
        col = (self.state % self.width + moves[:, 1]).clamp(0, self.width - 1)
        self.state = row * self.width + col
        target, reached = self._target(self.state)
        prize = torch.where(target == opponent_action, self.payoff, -self.payoff)
        prize = torch.where(reached, prize, torch.zeros_like(prize))
        return self.state, prize - self.step_cost, -prize, reached

    def _target(self, state):
        target = torch.full_like(state, -1)
        for i, cell in enumerate(self.target_states):
            target = torch.where(state == cell, i, target)
        return target, target >= 0

    def target_reached(self, dm_action, next_state):
        """Encoder for :class:`ExponentialSmootherAdversary`: the one-hot target the DM
        reached (and whether she reached one) -- the adversary only learns on arrival."""
        target, reached = self._target(next_state)
        x = torch.nn.functional.one_hot(target.clamp(min=0), 2).to(torch.get_default_dtype())
        return x, reached


class Blotto(Environment):
    r"""Blotto resource allocation game with several attackers (Section 4.4.2).

    The DM spreads ``num_resources`` units over ``num_positions`` positions (her actions index
    the allocations in :attr:`allocations`); each of the ``num_attackers`` attackers attacks one
    position with one unit. At every attacked position the DM wins ``+1`` if she deployed more
    units than the attackers there (who split ``-1`` equally), loses ``-1`` if fewer (they split
    ``+1``) and nobody gets anything on a draw. A single-state repeated game (``horizon=1``).
    Opponent actions and rewards have shape ``(B, num_attackers)``.
    """

    num_states, horizon = 1, 1

    def __init__(self, num_positions=3, num_resources=2, num_attackers=2):
        self.num_positions = check_int(num_positions, "num_positions", low=1)
        self.num_resources = check_int(num_resources, "num_resources", low=1)
        self.num_opponents = check_int(num_attackers, "num_attackers", low=1)
        self.allocations = torch.tensor(
            [
                c
                for c in itertools.product(range(num_resources + 1), repeat=num_positions)
                if sum(c) == num_resources
            ]
        )
        self.num_actions = self.allocations.shape[0]
        self.num_opponent_actions = self.num_positions

    def reset(self, batch_size, generator):
        return _zeros_long(batch_size, generator)

    def step(self, action, opponent_action):
        self.check_actions(action, opponent_action)
        dtype = torch.get_default_dtype()
        alloc = self.allocations.to(action.device)[action]  # (B, P)
        attacks = torch.nn.functional.one_hot(opponent_action, self.num_positions)  # (B, M, P)
        attackers = attacks.sum(dim=1)  # (B, P)
        won = ((alloc > attackers) & (attackers > 0)).to(dtype)
        lost = (alloc < attackers).to(dtype)
        reward = (won - lost).sum(dim=-1)
        share = (lost - won) / attackers.clamp(min=1).to(dtype)  # per attacker at each position
        opponent_reward = (attacks.to(dtype) * share.unsqueeze(1)).sum(dim=-1)
        done = torch.zeros_like(action, dtype=torch.bool)
        return torch.zeros_like(action), reward, opponent_reward, done

    def allocation_share(self, dm_action, next_state):
        """Encoder for :class:`ExponentialSmootherAdversary`: the share of the DM's resources
        at each position (the attackers smooth it and attack its minimiser)."""
        alloc = self.allocations.to(dm_action.device)[dm_action].to(torch.get_default_dtype())
        return alloc / self.num_resources, torch.ones_like(dm_action, dtype=torch.bool)


class CoinGame(Environment):
    r"""Coin game on an ``size x size`` grid (Section 4.4.3, figure 4.9).

    Both players move up/right/down/left (staying inside the grid) chasing two coins; a coin
    is worth 1 to the player that picks it alone and 0.5 to each if both arrive together, and
    disappears once picked. Players and coins start on distinct random cells; the episode is
    truncated after ``horizon=12`` steps and terminates once both coins are gone. The state
    index encodes (DM cell, opponent cell, coin cells), a coin cell ``size**2`` meaning
    "picked"; :meth:`features` gives the ``4 * size**2`` one-hot slices of the thesis.
    """

    num_actions = num_opponent_actions = 4
    MOVES = SpatialFriendOrFoe.MOVES

    def __init__(self, size=5, horizon=12):
        self.size = check_int(size, "size", low=2)
        self.horizon = check_int(horizon, "horizon", low=1)
        self.cells = self.size**2
        self.num_states = self.cells**2 * (self.cells + 1) ** 2

    @property
    def num_features(self):
        return 4 * self.cells

    def encode(self, dm, opponent, coin1, coin2):
        n = self.cells
        return dm + n * (opponent + n * (coin1 + (n + 1) * coin2))

    def decode(self, state):
        n = self.cells
        dm, rest = state % n, state // n
        opponent, rest = rest % n, rest // n
        return dm, opponent, rest % (n + 1), rest // (n + 1)

    def features(self, state):
        dtype = torch.get_default_dtype()
        parts = [
            torch.nn.functional.one_hot(p, self.cells + 1)[:, : self.cells].to(dtype)
            for p in self.decode(state)
        ]
        return torch.cat(parts, dim=-1)

    def reset(self, batch_size, generator):
        scores = torch.rand(batch_size, self.cells, generator=generator, device=generator.device)
        cells = scores.argsort(dim=-1)[:, :4]
        self.state = self.encode(*cells.unbind(-1))
        return self.state

    def _move(self, cell, action):
        moves = torch.tensor(self.MOVES, device=cell.device)[action]
        row = (cell // self.size + moves[:, 0]).clamp(0, self.size - 1)
        col = (cell % self.size + moves[:, 1]).clamp(0, self.size - 1)
        return row * self.size + col

    def step(self, action, opponent_action):
        self.check_actions(action, opponent_action)
        dm, opp, *coins = self.decode(self.state)
        dm, opp = self._move(dm, action), self._move(opp, opponent_action)
        dtype = torch.get_default_dtype()
        reward = torch.zeros(action.shape, dtype=dtype, device=action.device)
        opponent_reward = torch.zeros_like(reward)
        for i, coin in enumerate(coins):
            dm_on, opp_on = dm == coin, opp == coin
            both = (dm_on & opp_on).to(dtype)
            reward += dm_on.to(dtype) - 0.5 * both
            opponent_reward += opp_on.to(dtype) - 0.5 * both
            coins[i] = torch.where(dm_on | opp_on, self.cells, coin)
        self.state = self.encode(dm, opp, *coins)
        done = (coins[0] == self.cells) & (coins[1] == self.cells)
        return self.state, reward, opponent_reward, done


def regulated_payoffs(both, mutual, tax, incentive):
    r"""The regulator's transfer of Section 4.5.4 on the raw payoffs ``both`` ``(B, 2)``: add the
    incentive :math:`I` to both players on mutual cooperation (bool ``(B,)``, Table 4.5), then
    collect the tax of rate :math:`x` (a float or ``(B,)``) and redistribute it evenly,
    :math:`\tilde r_a = r_a - x r_a + \tfrac{1}{2} \sum_{a'} x r_{a'}`, which leaves the sum
    of the two rewards, hence the social utility (4.4), unchanged."""
    tax = torch.as_tensor(tax, dtype=both.dtype, device=both.device).reshape(-1, 1)
    both = both + incentive * mutual.unsqueeze(-1).to(both.dtype)
    return both - tax * both + 0.5 * tax * both.sum(dim=-1, keepdim=True)


class DataSharingGame(Environment):
    r"""Iterated prisoner's dilemma between a Citizen (DM, row player) and a DDO (Section 4.5).

    Actions ``0 = cooperate``, ``1 = defect``; payoffs of Table 4.3 with ``T, R, P, S`` (default
    6, 5, 1, 0). The state is the previous joint action (``1 + 2 a + b``; ``0`` at the start),
    so memory-1 agents (the FPM citizen: ``FPQLearner(..., state_conditional=True)``) can react.
    An optional regulator adds ``incentive`` :math:`I` to both players on mutual cooperation
    (Table 4.5) and collects a tax of rate ``tax`` :math:`x` on each reward, redistributed
    evenly: :math:`\tilde r_a = r_a - x r_a + \tfrac{1}{2} \sum_{a'} x r_{a'}` (Section 4.5.4),
    which leaves the social utility (4.4) unchanged. Episodes last ``horizon`` rounds.
    """

    COOPERATE, DEFECT = 0, 1
    num_states, num_actions, num_opponent_actions = 5, 2, 2

    def __init__(
        self,
        temptation=6.0,
        reward=5.0,
        punishment=1.0,
        sucker=0.0,
        tax=0.0,
        incentive=0.0,
        horizon=100,
    ):
        names = ("temptation", "reward", "punishment", "sucker")
        values = (temptation, reward, punishment, sucker)
        t, r, p, s = (check_real(v, n) for v, n in zip(values, names))
        if not (t > r > p > s and 2 * r > t + s):
            raise ValueError(
                f"payoffs must satisfy T > R > P > S and 2R > T + S, got T={t}, R={r}, P={p}, S={s}"
            )
        self.payoffs = torch.tensor([[[r, r], [s, t]], [[t, s], [p, p]]])  # [a, b] -> (r_C, r_DDO)
        self.tax = check_real(tax, "tax", 0, 1)
        self.incentive = check_real(incentive, "incentive")
        self.horizon = check_int(horizon, "horizon", low=1)

    @staticmethod
    def previous_actions(state):
        """``(citizen, ddo)`` actions of the previous round, ``-1`` at the initial state."""
        initial = state == 0
        citizen = torch.where(initial, -1, (state - 1) // 2)
        ddo = torch.where(initial, -1, (state - 1) % 2)
        return citizen, ddo

    @staticmethod
    def social_utility(reward, opponent_reward):
        """Eq. (4.4): :math:`SU_t = (r_{C,t} + r_{DDO,t}) / 2`."""
        return 0.5 * (reward + opponent_reward)

    def reset(self, batch_size, generator):
        return _zeros_long(batch_size, generator)

    def step(self, action, opponent_action):
        self.check_actions(action, opponent_action)
        both = self.payoffs.to(action.device)[action, opponent_action]  # (B, 2)
        mutual = (action == self.COOPERATE) & (opponent_action == self.COOPERATE)
        both = regulated_payoffs(both, mutual, self.tax, self.incentive)
        next_state = 1 + 2 * action + opponent_action
        return next_state, both[:, 0], both[:, 1], torch.zeros_like(mutual)
