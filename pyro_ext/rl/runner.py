"""Play agents against opponents, many independent runs at once, and plot reward curves."""

import torch

from ..ops.validation import check_int
from .base import Agent, Environment, Transition

__all__ = ["play", "play_many", "plot_reward_curves", "seeded_generator"]


def _opponents(env, opponent):
    if not isinstance(env, Environment):
        raise TypeError(f"env must be an Environment, got {type(env).__name__}")
    opponents = [opponent] if isinstance(opponent, Agent) else list(opponent)
    if len(opponents) != env.num_opponents or not all(isinstance(o, Agent) for o in opponents):
        raise ValueError(
            f"{type(env).__name__} has {env.num_opponents} opponent(s); pass that many Agents, "
            f"got {opponent!r}"
        )
    return opponents


def seeded_generator(seed, device):
    """A :class:`torch.Generator` on ``device`` (the CPU for ``None``) seeded with ``seed``."""
    seed = check_int(seed, "seed")
    generator = torch.Generator(device=torch.device("cpu") if device is None else device)
    generator.manual_seed(seed)
    return generator


def _run(env, agent, opponents, num_episodes, num_runs, generator):
    if not isinstance(agent, Agent):
        raise TypeError(f"agent must be an Agent, got {type(agent).__name__}")
    num_episodes = check_int(num_episodes, "num_episodes", low=1)
    agent.attach(env.num_states, env.num_actions, env.num_opponent_actions)
    agent.reset(num_runs, generator)
    for opponent in opponents:
        opponent.attach(env.num_states, env.num_opponent_actions, env.num_actions)
        opponent.reset(num_runs, generator)
    multi = env.num_opponents > 1
    curves = torch.zeros(num_runs, num_episodes, device=generator.device)
    for episode in range(num_episodes):
        state = env.reset(num_runs, generator)
        active = torch.ones(num_runs, dtype=torch.bool, device=generator.device)
        for _ in range(env.horizon):
            action = agent.act(state)
            opp_actions = [o.act(state) for o in opponents]
            opponent_action = torch.stack(opp_actions, dim=-1) if multi else opp_actions[0]
            next_state, reward, opponent_reward, done = env.step(action, opponent_action)
            transition = Transition(
                state, action, opponent_action, reward, next_state, opponent_reward, done, active
            )
            agent.update(transition)
            for i, opponent in enumerate(opponents):
                opponent.update(transition.swap_players(i if multi else None))
            curves[:, episode] += torch.where(active, reward, torch.zeros_like(reward))
            active = active & ~done
            state = next_state
            if env.horizon > 1 and not bool(active.any()):
                break
    return curves


def play(env, agent, opponent, num_episodes, seed, device=None):
    """Play ``num_episodes`` episodes of ``agent`` against ``opponent`` (an Agent, or a list of
    Agents for environments with several opponents), both learning online.

    :returns: the agent's total reward per episode, a tensor of shape ``(num_episodes,)``.
    """
    generator = seeded_generator(seed, device)
    return _run(env, agent, _opponents(env, opponent), num_episodes, 1, generator)[0]


def play_many(env, make_agent, make_opponent, num_episodes, num_runs, seed, device=None):
    """Run ``num_runs`` independent repetitions in parallel as a batch dimension: one agent and
    one opponent (from the zero-argument factories) hold ``num_runs`` independent tables.

    :returns: reward curves of shape ``(num_runs, num_episodes)``.
    """
    num_runs = check_int(num_runs, "num_runs", low=1)
    generator = seeded_generator(seed, device)
    opponents = _opponents(env, make_opponent())
    return _run(env, make_agent(), opponents, num_episodes, num_runs, generator)


def plot_reward_curves(curves, window=50, ax=None, title=None):
    """Plot mean (line) and standard deviation (band) over runs of moving-average rewards.

    :param curves: mapping ``label -> tensor (num_runs, num_episodes)`` (or ``(num_episodes,)``).
    :param window: moving-average window in episodes.
    :returns: the matplotlib axes.
    """
    import matplotlib.pyplot as plt

    window = check_int(window, "window", low=1)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for label, curve in curves.items():
        curve = torch.as_tensor(curve, dtype=torch.get_default_dtype()).detach().cpu()
        curve = curve.reshape(-1, curve.shape[-1])
        w = min(window, curve.shape[-1])
        smooth = curve.unfold(-1, w, 1).mean(-1)
        mean, std = smooth.mean(0), smooth.std(0, unbiased=False)
        x = torch.arange(w, curve.shape[-1] + 1)
        ax.plot(x, mean, label=label)
        ax.fill_between(x, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("episode")
    ax.set_ylabel(f"reward (moving average, {window} episodes)")
    if title is not None:
        ax.set_title(title)
    ax.legend()
    return ax
