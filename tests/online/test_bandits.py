import math

import pyro
import pytest
import torch

from pyro_ext.online import (
    BONG,
    BernoulliBandit,
    GaussianBandit,
    LinearContextualBandit,
    LoFi,
    LogisticContextualBandit,
    ThompsonBandit,
    bayes_opt_1d,
    bernoulli_arms_model,
    gaussian_arms_model,
    linear_contextual_model,
    logistic_contextual_model,
    neural_contextual_model,
    updates,
)


def _slope(cumulative, start, end):
    """Least-squares slope of log cumulative regret against log t over t in [start, end]."""
    t = torch.arange(start, end + 1, dtype=torch.float64)
    x, y = t.log(), cumulative[start - 1 : end].double().log()
    x, y = x - x.mean(), y - y.mean()
    return float((x * y).sum() / x.square().sum())


# In the integration run (`make test-integration`, CI): the 5,000-step reproduction
# (about 20 s of CPU); test_gaussian_bandit_policies keeps Thompson sampling in the default run.
@pytest.mark.integration
def test_thompson_bernoulli_regret_is_sublinear():
    # The test: 10-armed Bernoulli bandit, Thompson sampling with a diagonal BONG
    # belief over the per-arm logits, 5,000 steps.
    probs = torch.tensor([0.1, 0.2, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7])
    model = bernoulli_arms_model(10)
    agent = ThompsonBandit(lambda: BONG(model, family="diag"), num_arms=10)
    history = agent.run(BernoulliBandit(probs), num_steps=5000, seed=0)
    cumulative = history.regrets.cumsum(0)
    assert _slope(cumulative, 100, 5000) < 0.8
    # The best arm dominates the second half; uniform play would lose 0.245 a step.
    assert (history.actions[2500:] == 9).float().mean() > 0.8
    assert cumulative[-1] < 0.1 * 0.245 * 5000


# About 15 s of bandit rounds: in the integration run; the default run keeps the other
# policy tests of this module.
@pytest.mark.integration
def test_gaussian_bandit_policies():
    means = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0])
    env = GaussianBandit(means, scale=1.0)
    model = gaussian_arms_model(5, noise_scale=1.0)
    num_steps, seeds = 200, range(3)
    uniform = float(means.max() - means.mean()) * num_steps

    def mean_regret(**kwargs):
        agent = ThompsonBandit(lambda: BONG(model, family="diag"), 5, **kwargs)
        return sum(float(agent.run(env, num_steps, seed=s).regrets.sum()) for s in seeds) / 3

    assert mean_regret(policy="thompson") < 0.4 * uniform
    assert mean_regret(policy="ucb", ucb_scale=2.0) < 0.5 * uniform
    assert mean_regret(policy="epsilon_greedy", epsilon=0.1) < 0.5 * uniform
    # epsilon = 1 is uniform play.
    assert mean_regret(policy="epsilon_greedy", epsilon=1.0) == pytest.approx(uniform, rel=0.15)


def test_ucb_bonus_is_the_epistemic_spread():
    # For the conjugate Gaussian arms the expected reward's posterior variance is the
    # predictive variance less the noise variance.
    model = gaussian_arms_model(3, noise_scale=0.5)
    agent = ThompsonBandit(lambda: BONG(model, family="full"), 3, policy="ucb", ucb_scale=2.0)
    agent.observe(None, torch.tensor([0, 0, 1]), torch.tensor([0.3, 0.5, -1.0]))
    mean, variance = agent.filter.predictive(None, torch.arange(3))
    expected = mean + 2.0 * (variance - 0.25).sqrt()
    assert torch.allclose(agent._scores(None), expected, atol=1e-5)
    assert agent.act() == 2  # never pulled: the widest bonus
    assert torch.allclose(agent.expected_rewards(), mean)


def test_linear_contextual_thompson_learns_the_weights():
    pyro.set_rng_seed(0)
    weights = torch.randn(4, 3)
    env = LinearContextualBandit(weights, noise_scale=0.5)
    model = linear_contextual_model(3, 4, noise_scale=0.5)
    thompson = ThompsonBandit(lambda: BONG(model, family="full"), 4)
    history = thompson.run(env, 500, seed=1)
    uniform = ThompsonBandit(lambda: BONG(model, family="full"), 4, "epsilon_greedy", epsilon=1.0)
    baseline = uniform.run(env, 500, seed=1)
    assert history.regrets.sum() < 0.2 * baseline.regrets.sum()
    loc, scale = thompson.filter.site_posteriors()["weights"]
    assert (loc - weights).abs().max() < 0.3
    assert ((loc - weights).abs() < 3 * scale + 0.05).all()
    # The factored prior stays factored: no covariance between different arms' weights.
    covariance = thompson.filter.covariance().reshape(4, 3, 4, 3)
    off_diagonal = covariance.clone()
    for arm in range(4):
        off_diagonal[arm, :, arm, :] = 0
    assert off_diagonal.abs().max() < 1e-5


def test_logistic_and_neural_contextual_bandits_beat_uniform():
    pyro.set_rng_seed(0)
    weights = torch.randn(4, 3)
    cases = [
        (LogisticContextualBandit(2 * weights), lambda: BONG(logistic_contextual_model(3, 4))),
        (
            LinearContextualBandit(weights, noise_scale=0.5),
            lambda: LoFi(neural_contextual_model(3, 4, hidden=16, noise_scale=0.5), rank=10),
        ),
    ]
    for env, factory in cases:
        regret = ThompsonBandit(factory, 4).run(env, 300, seed=1).regrets.sum()
        uniform = ThompsonBandit(factory, 4, "epsilon_greedy", epsilon=1.0).run(env, 300, seed=1)
        assert regret < 0.4 * uniform.regrets.sum()


def _two_bumps(x):
    # The global maximum (about 1) at x = 1.5, a wider local one (0.7) at x = -1.5.
    return torch.exp(-((x - 1.5) ** 2) / (2 * 0.3**2)) + 0.7 * torch.exp(
        -((x + 1.5) ** 2) / (2 * 0.6**2)
    )


def test_bayes_opt_1d_finds_the_global_maximum():
    best_value = float(_two_bumps(torch.linspace(-3, 3, 100001)).max())
    regrets = []
    for seed in range(5):
        result = bayes_opt_1d(_two_bumps, (-3.0, 3.0), num_steps=40, seed=seed)
        assert result.xs.shape == result.ys.shape == (40,)
        assert torch.allclose(result.ys, _two_bumps(result.xs))
        assert result.best_y == result.ys.max() and -3 <= result.best_x <= 3
        assert abs(float(result.best_x) - 1.5) < 0.1  # the global bump, not the local one
        regrets.append(best_value - float(result.best_y))
    # Forty uniform random queries: their best is typically (median) 0.016 short.
    generator = torch.Generator().manual_seed(0)
    random_best = _two_bumps(torch.rand(2000, 40, generator=generator) * 6 - 3).amax(-1)
    random_regret = float((best_value - random_best).median())
    assert random_regret > 0.01
    assert max(regrets) < 0.1 * random_regret


def test_run_is_reproducible_and_resets():
    model = bernoulli_arms_model(3)
    agent = ThompsonBandit(lambda: BONG(model, family="diag"), 3)
    env = BernoulliBandit(torch.tensor([0.2, 0.5, 0.8]))
    first = agent.run(env, 50, seed=3)
    assert agent.filter.num_updates == 50
    second = agent.run(env, 50, seed=3)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    assert first.actions.dtype == torch.long and first.rewards.shape == (50,)
    agent.reset()
    assert agent.filter.belief is None
    assert 0 <= agent.act() < 3  # before any observation: a uniformly random arm


def test_batched_observation_equals_sequential():
    model = linear_contextual_model(2, 3, noise_scale=0.5)
    contexts = torch.randn(6, 2)
    actions = torch.tensor([0, 1, 2, 0, 1, 2])
    rewards = torch.randn(6)
    one = ThompsonBandit(lambda: BONG(model, family="full"), 3)
    one.observe(contexts, actions, rewards)
    many = ThompsonBandit(lambda: BONG(model, family="full"), 3)
    for context, action, reward in zip(contexts, actions.tolist(), rewards):
        many.observe(context, action, reward)
    # The Kalman update is exact: the order and batching do not matter.
    assert torch.allclose(one.filter.mean, many.filter.mean, atol=1e-5)
    assert torch.allclose(one.filter.covariance(), many.filter.covariance(), atol=1e-6)


def test_thompson_draws_follow_the_belief():
    # With one arm clearly better in the belief, Thompson picks it about as often as
    # the belief says it is the best.
    model = gaussian_arms_model(2, noise_scale=1.0)
    agent = ThompsonBandit(lambda: BONG(model, family="diag"), 2)
    agent.observe(None, torch.tensor([0, 1]), torch.tensor([0.0, 1.0]))
    loc = agent.filter.mean
    sd = updates.marginal_variance(agent.filter.belief).sqrt()
    p_second = 0.5 * (
        1 + math.erf(float(loc[1] - loc[0]) / (2 * float(sd[0].square() + sd[1].square())) ** 0.5)
    )
    picks = torch.tensor([agent.act() for _ in range(2000)], dtype=torch.float)
    assert float(picks.mean()) == pytest.approx(p_second, abs=0.04)


def test_runs_on_the_device_of_the_data(device):
    env = BernoulliBandit(torch.tensor([0.2, 0.8], device=device))
    agent = ThompsonBandit(lambda: BONG(bernoulli_arms_model(2), family="diag"), 2)
    history = agent.run(env, 20, seed=0)
    assert agent.filter.mean.device.type == device.type
    assert history.regrets.device.type == device.type
    contextual = ThompsonBandit(lambda: BONG(linear_contextual_model(2, 2)), 2, policy="ucb")
    contextual.run(LinearContextualBandit(torch.randn(2, 2, device=device)), 10, seed=0)
    assert contextual.filter.mean.device.type == device.type


def test_errors():
    model = bernoulli_arms_model(3)

    def factory():
        return BONG(model, family="diag")

    with pytest.raises(ValueError, match="num_arms"):
        ThompsonBandit(factory, 1)
    with pytest.raises(TypeError, match="num_arms"):
        ThompsonBandit(factory, 2.0)
    with pytest.raises(TypeError, match="filter_factory"):
        ThompsonBandit(BONG(model), 3)
    with pytest.raises(TypeError, match="BONG filter"):
        ThompsonBandit(lambda: model, 3)
    with pytest.raises(ValueError, match="policy"):
        ThompsonBandit(factory, 3, policy="softmax")
    with pytest.raises(TypeError, match="policy"):
        ThompsonBandit(factory, 3, policy=None)
    with pytest.raises(ValueError, match="epsilon"):
        ThompsonBandit(factory, 3, policy="epsilon_greedy", epsilon=1.5)
    with pytest.raises(TypeError, match="epsilon"):
        ThompsonBandit(factory, 3, epsilon="0.1")
    with pytest.raises(ValueError, match="ucb_scale"):
        ThompsonBandit(factory, 3, policy="ucb", ucb_scale=-1.0)

    agent = ThompsonBandit(factory, 3)
    with pytest.raises(ValueError, match=r"action must lie in \[0, 3\)"):
        agent.observe(None, 3, 1.0)
    with pytest.raises(ValueError, match="action must lie"):
        agent.observe(None, torch.tensor([0, -1]), torch.tensor([1.0, 0.0]))
    with pytest.raises(TypeError, match="action"):
        agent.observe(None, 1.0, 1.0)
    with pytest.raises(TypeError, match="action"):
        agent.observe(None, torch.tensor(1.0), 1.0)
    with pytest.raises(TypeError, match="reward"):
        agent.observe(None, 1, "1")
    with pytest.raises(ValueError, match="shape of action"):
        agent.observe(None, torch.tensor([0, 1]), torch.tensor([1.0]))
    with pytest.raises(TypeError, match="context"):
        agent.act(context=[1.0, 2.0])
    with pytest.raises(RuntimeError, match="no belief"):
        agent.expected_rewards()
    with pytest.raises(ValueError, match="without context"):
        agent.observe(torch.ones(2), 1, 1.0)
    with pytest.raises(ValueError, match="arms"):
        agent.run(BernoulliBandit(torch.tensor([0.1, 0.9])), 10)
    with pytest.raises(TypeError, match="environment"):
        agent.run(object(), 10)
    with pytest.raises(ValueError, match="num_steps"):
        agent.run(BernoulliBandit(torch.tensor([0.1, 0.5, 0.9])), 0)

    contextual = ThompsonBandit(lambda: BONG(linear_contextual_model(2, 3)), 3)
    with pytest.raises(TypeError, match="context tensor"):
        contextual.observe(None, 0, 1.0)
    with pytest.raises(ValueError, match=r"context must have shape"):
        contextual.observe(torch.ones(3), 0, 1.0)

    # Environments and model helpers.
    with pytest.raises(ValueError, match="at least 2 arms"):
        BernoulliBandit(torch.tensor([0.5]))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        BernoulliBandit(torch.tensor([0.5, 1.5]))
    with pytest.raises(TypeError, match="tensor"):
        GaussianBandit([0.0, 1.0])
    with pytest.raises(ValueError, match="scale"):
        GaussianBandit(torch.tensor([0.0, 1.0]), scale=0.0)
    with pytest.raises(ValueError, match="dimension"):
        LinearContextualBandit(torch.ones(3))
    with pytest.raises(ValueError, match="action must lie"):
        BernoulliBandit(torch.tensor([0.1, 0.9])).reward(None, 2)
    with pytest.raises(ValueError, match="num_arms"):
        bernoulli_arms_model(1)
    with pytest.raises(TypeError, match="num_arms"):
        gaussian_arms_model("3")
    with pytest.raises(ValueError, match="noise_scale"):
        linear_contextual_model(2, 3, noise_scale=-1.0)
    with pytest.raises(ValueError, match="context_dim"):
        logistic_contextual_model(0, 3)
    with pytest.raises(TypeError, match="hidden"):
        neural_contextual_model(2, 3, hidden="32")
    with pytest.raises(ValueError, match="hidden width"):
        neural_contextual_model(2, 3, hidden=(0,))

    # Bayesian optimisation.
    with pytest.raises(TypeError, match="objective"):
        bayes_opt_1d(3.0, (0.0, 1.0))
    with pytest.raises(ValueError, match="low < high"):
        bayes_opt_1d(_two_bumps, (1.0, 0.0))
    with pytest.raises(ValueError, match="finite"):
        bayes_opt_1d(_two_bumps, (0.0, math.inf))
    with pytest.raises(TypeError, match="bounds"):
        bayes_opt_1d(_two_bumps, 1.0)
    with pytest.raises(ValueError, match="grid_size"):
        bayes_opt_1d(_two_bumps, (0.0, 1.0), grid_size=1)
    with pytest.raises(TypeError, match="dtype"):
        bayes_opt_1d(_two_bumps, (0.0, 1.0), dtype=torch.long)
    with pytest.raises(ValueError, match="objective returned nan"):
        bayes_opt_1d(lambda x: math.nan, (0.0, 1.0), num_steps=2)


@pytest.mark.parametrize(
    "policy, make",
    [
        ("thompson", lambda model, jit: LoFi(model, 4, jit_compile=jit)),
        ("greedy", lambda model, jit: LoFi(model, 4, jit_compile=jit)),
        # A full covariance with drift: the draw factorises the predicted covariance
        # inside the graph, its check deferred to the graph's flag.
        (
            "thompson",
            lambda model, jit: BONG(model, dynamics=("random_walk", 1e-3), jit_compile=jit),
        ),
    ],
)
def test_a_traced_agent_plays_the_eager_agents_game(policy, make):
    # The compiled filter's update and the traced scoring of the arms: the same draws, so
    # the same actions and the same belief as the eager agent, round after round.
    env = LinearContextualBandit(torch.randn(3, 4, generator=torch.Generator().manual_seed(0)))
    model = neural_contextual_model(4, 3, hidden=(8,))
    histories, beliefs = [], []
    for jit in (False, "trace"):
        agent = ThompsonBandit(lambda jit=jit: make(model, jit), 3, policy=policy)
        histories.append(agent.run(env, num_steps=40, seed=3))
        beliefs.append(agent.filter.mean)
        if jit:
            assert len(agent.filter._graphs) == 1
            assert [g is not False for g in agent._score_graphs.values()] == [True]
    assert torch.equal(histories[0].actions, histories[1].actions)
    torch.testing.assert_close(beliefs[1], beliefs[0], atol=1e-5, rtol=1e-5)


def test_a_compiled_agent_scores_a_strided_context():
    # The scoring graph is compiled for the first context's layout; a context of the same
    # shape read from a column-major table (strided) gives the same draw and action.
    env = LinearContextualBandit(torch.randn(3, 4, generator=torch.Generator().manual_seed(0)))
    agent = ThompsonBandit(
        lambda: LoFi(neural_contextual_model(4, 3, hidden=(8,)), 4, jit_compile=True), 3
    )
    agent.run(env, num_steps=5, seed=1)
    table = torch.randn(4, 6, generator=torch.Generator().manual_seed(2)).T  # column-major
    assert not table[0].is_contiguous()
    actions = []
    for context in (table[0], table[0].contiguous()):
        pyro.set_rng_seed(4)
        actions.append((agent.act(context), agent._scores(context)))
    assert actions[0][0] == actions[1][0]
    torch.testing.assert_close(actions[0][1], actions[1][1])
