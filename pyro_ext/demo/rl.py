"""Chapter ``rl``: threatened Markov decision processes (thesis chapter 4)."""

FIGURES = ("rl_reward_curves",)


def run(quick=False, figures=None):
    """Thesis figure 4.3: the friend-or-foe game against an adaptive adversary."""
    from pyro_ext.rl import (
        ExponentialSmootherAdversary,
        FPQLearner,
        FriendOrFoe,
        LevelKQLearner,
        QLearner,
        play_many,
        plot_reward_curves,
    )

    print("== Chapter: threatened Markov decision processes (thesis chapter 4) ==")
    episodes, runs = (1000, 5) if quick else (5000, 20)
    epsilon, lr, gamma = 0.1, 0.1, 0.8
    print(
        f"  stateless friend-or-foe (+-50) vs an exponential-smoother adversary (beta 0.75),"
        f" {episodes} episodes, {runs} runs; mean reward of the last {episodes // 5} episodes"
    )
    agents = {
        "Q-learner (ignores the opponent)": lambda: QLearner(epsilon, lr, gamma),
        "FPQ-learner, forget 0.8 (level 1)": lambda: FPQLearner(epsilon, lr, gamma, forget=0.8),
        "level-2 Q-learner": lambda: LevelKQLearner(2, epsilon, lr, gamma),
    }
    rewards = {}
    for name, make_agent in agents.items():
        curves = play_many(
            FriendOrFoe(),
            make_agent,
            lambda: ExponentialSmootherAdversary(0.75),
            episodes,
            runs,
            seed=0,
        )
        rewards[name] = curves
        last = curves[:, -(episodes // 5) :].mean(1)
        print(f"    {name:36s} {last.mean():6.1f} +- {last.std():4.1f}")
    print("    (thesis figure 4.3: about -20, 0 and +40)")
    if figures is None:
        return
    with figures.figure("rl_reward_curves", panel_size=(7.0, 4.2)) as ax:
        plot_reward_curves(
            rewards,
            window=episodes // 20,
            ax=ax,
            title=f"friend-or-foe vs an exponential smoother: mean +- sd over {runs} runs",
        )
        ax.axhline(0, color="k", lw=0.6)
