import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from pyro_ext.rl import (  # noqa: E402
    ApproximateLevel2QLearner,
    Blotto,
    DataSharingGame,
    ExponentialSmootherAdversary,
    FixedPolicyOpponent,
    FPQLearner,
    FriendOrFoe,
    LevelKQLearner,
    OpponentAveragingQLearner,
    QLearner,
    SpatialFriendOrFoe,
    Transition,
    play,
    play_many,
    plot_reward_curves,
)


def test_api_floor():
    import pyro_ext.rl as rl

    for name in (
        "FriendOrFoe",
        "ExponentialSmootherAdversary",
        "QLearner",
        "FPQLearner",
        "LevelKQLearner",
        "play",
        "play_many",
        "plot_reward_curves",
    ):
        assert name in rl.__all__
    adv = ExponentialSmootherAdversary(0.75)
    rewards = play(FriendOrFoe(), QLearner(0.1, 0.1, 0.8), adv, 20, 0)
    assert rewards.shape == (20,) and set(rewards.tolist()) <= {-50.0, 50.0}


@pytest.mark.parametrize(
    "make_agent",
    [
        lambda: QLearner(0.1, 0.1, 0.8, policy="softmax", temperature=10.0),
        lambda: FPQLearner(0.1, 0.1, 0.8, forget=0.8),
        lambda: LevelKQLearner(3, 0.1, 0.1, 0.8),
        lambda: OpponentAveragingQLearner(
            [LevelKQLearner(1, 0.1, 0.1, 0.8), LevelKQLearner(2, 0.1, 0.1, 0.8)], 0.1, 0.1, 0.8
        ),
        lambda: ApproximateLevel2QLearner(0.1, 0.05, 0.8, hidden=4),
    ],
)
def test_same_seed_same_curves(make_agent, device):
    env, adv = FriendOrFoe(), lambda: ExponentialSmootherAdversary(0.75)
    a = play_many(env, make_agent, adv, 60, 3, seed=11, device=device)
    b = play_many(env, make_agent, adv, 60, 3, seed=11, device=device)
    c = play_many(env, make_agent, adv, 60, 3, seed=12, device=device)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.device.type == device.type


def test_runs_are_independent_rows():
    """A row of a batch behaves like a single run: all runs differ, yet each is reproducible."""
    env = SpatialFriendOrFoe()
    curves = play_many(
        env,
        lambda: LevelKQLearner(2, 0.2, 0.1, 0.8),
        lambda: ExponentialSmootherAdversary(0.75, encode=env.target_reached),
        20,
        4,
        0,
    )
    assert curves.shape == (4, 20) and len({tuple(r) for r in curves.tolist()}) > 1


def test_figure_4_3_ordering():
    """Short version of figure 4.3: Q-learner < FPQ with forget < level-2."""
    env, adv = FriendOrFoe(), lambda: ExponentialSmootherAdversary(0.75)
    score = {}
    for name, make in {
        "q": lambda: QLearner(0.1, 0.1, 0.8),
        "fpq": lambda: FPQLearner(0.1, 0.1, 0.8, forget=0.8),
        "l2": lambda: LevelKQLearner(2, 0.1, 0.1, 0.8),
    }.items():
        score[name] = play_many(env, make, adv, 1000, 8, 0)[:, -500:].mean().item()
    assert score["q"] < -5 < score["fpq"] < 10 < 30 < score["l2"]


def test_plot_reward_curves():
    ax = plot_reward_curves({"a": torch.randn(3, 40), "b": torch.randn(40)}, window=5, title="t")
    assert len(ax.lines) == 2 and ax.get_title() == "t"


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: LevelKQLearner(0, 0.1, 0.1, 0.8), "k must be an integer >= 1, got 0"),
        (lambda: FPQLearner(0.1, 0.1, 0.8, forget=1.0), "forget"),
        (lambda: FPQLearner(0.1, 0.1, 0.8, forget=0.0), "forget"),
        (lambda: QLearner(1.5, 0.1, 0.8), "epsilon"),
        (lambda: QLearner(0.1, 0.0, 0.8), "lr"),
        (lambda: QLearner(0.1, 1.5, 0.8), "lr"),
        (lambda: QLearner(0.1, 0.1, 1.0), "gamma"),
        (lambda: QLearner(0.1, 0.1, 0.8, policy="boltzmann"), "policy"),
        (lambda: QLearner(0.1, 0.1, 0.8, policy="softmax", temperature=0), "temperature"),
        (lambda: ExponentialSmootherAdversary(1.0), "beta"),
        (lambda: DataSharingGame(temptation=4.0), "T > R > P > S"),
        (lambda: DataSharingGame(tax=2.0), "tax"),
        (lambda: FixedPolicyOpponent([0.5, 0.6]), "probs"),
    ],
)
def test_bad_hyperparameters(build, match):
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: LevelKQLearner(1.5, 0.1, 0.1, 0.8), "k must be an integer >= 1"),
        (
            lambda: FPQLearner(0.1, 0.1, 0.8, forget="0.5"),
            r"forget must be a finite number in \(0, 1\)",
        ),
        (lambda: FPQLearner(0.1, 0.1, 0.8, prior=True), "prior must be a finite number > 0"),
        (lambda: QLearner(None, 0.1, 0.8), r"epsilon must be a finite number in \[0, 1\]"),
        (lambda: QLearner(0.1, 0.1, 0.8, policy=0), "policy must be a string"),
        (
            lambda: QLearner(0.1, 0.1, 0.8, temperature="1"),
            "temperature must be a finite number > 0",
        ),
        (lambda: QLearner(0.1, 0.1, 0.8, num_actions=2.0), "num_actions must be an integer >= 1"),
        (lambda: ExponentialSmootherAdversary("0.5"), "beta must be a finite number"),
        (lambda: FriendOrFoe(payoff="50"), "payoff must be a finite number"),
        (lambda: DataSharingGame(tax=True), r"tax must be a finite number in \[0, 1\]"),
    ],
)
def test_wrong_hyperparameter_types(build, match):
    with pytest.raises(TypeError, match=match):
        build()


def test_bad_actions_and_spaces():
    env = FriendOrFoe()
    env.reset(2, torch.Generator())
    with pytest.raises(ValueError, match="action must lie in"):
        env.step(torch.tensor([0, 2]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="opponent_action must lie in"):
        env.step(torch.tensor([0, 1]), torch.tensor([-1, 1]))
    agent = QLearner(0.1, 0.1, 0.8).attach(1, 2, 2).reset(2, torch.Generator())
    z = torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="action must lie in"):
        agent.update(Transition(z, torch.tensor([0, 3]), z, torch.zeros(2), z))
    with pytest.raises(ValueError, match="num_actions=3 but the game has num_actions=2"):
        play(env, QLearner(0.1, 0.1, 0.8, num_actions=3), ExponentialSmootherAdversary(0.75), 2, 0)
    with pytest.raises(ValueError, match="encode"):
        play(SpatialFriendOrFoe(), QLearner(0.1, 0.1, 0.8), ExponentialSmootherAdversary(0.5), 2, 0)
    with pytest.raises(ValueError, match="2 opponent"):
        play(Blotto(), QLearner(0.1, 0.1, 0.8), FixedPolicyOpponent([1 / 3] * 3), 2, 0)
    with pytest.raises(TypeError, match="seed must be an integer"):
        play(env, QLearner(0.1, 0.1, 0.8), ExponentialSmootherAdversary(0.75), 2, "0")
    with pytest.raises(TypeError, match="env must be an Environment"):
        play("env", QLearner(0.1, 0.1, 0.8), ExponentialSmootherAdversary(0.75), 2, 0)
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        QLearner(0.1, 0.1, 0.8).attach(1, 2, 2).reset(2, 0)
    with pytest.raises(ValueError, match="attach"):
        QLearner(0.1, 0.1, 0.8).reset(2, torch.Generator())
