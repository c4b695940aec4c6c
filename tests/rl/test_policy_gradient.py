import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyro_ext.rl import (
    ApproximateQLearner,
    CategoricalTaxPolicy,
    CoinGame,
    DataSharingGame,
    FixedPolicyOpponent,
    GaussianTaxPolicy,
    PolicyGradientAgent,
    QLearner,
    Regulator,
    gaussian_score,
    play_many,
    play_regulated,
    regulated_payoffs,
    reinforce_update,
    softmax_score,
)

FAST = settings(max_examples=25, deadline=None)


@FAST
@given(
    st.lists(st.floats(-5, 5), min_size=2, max_size=5),
    st.integers(0, 4),
    st.floats(-3, 3),
    st.floats(0.01, 2),
)
def test_scores_are_autograd_log_prob_gradients(logits, action, decision, scale):
    action = action % len(logits)
    theta = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    log_prob = torch.distributions.Categorical(logits=theta).log_prob(torch.tensor(action))
    (grad,) = torch.autograd.grad(log_prob, theta)
    torch.testing.assert_close(softmax_score(theta.detach()[None], torch.tensor([action]))[0], grad)
    mean = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    d = torch.tensor(decision, dtype=torch.float64)
    (grad,) = torch.autograd.grad(torch.distributions.Normal(mean, scale).log_prob(d), mean)
    torch.testing.assert_close(gaussian_score(d, mean.detach(), scale), grad)


@FAST
@given(
    st.floats(0, 0.99),
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 1), st.floats(-2, 2)), min_size=1, max_size=15
    ),
)
def test_reinforce_update_matches_eligibility_trace_written_out(gamma, steps):
    logits = torch.zeros(1, 3, 2, dtype=torch.float64)
    trace = torch.zeros_like(logits)
    theta = [[0.0, 0.0] for _ in range(3)]  # the same recursion with Python floats
    z = [[0.0, 0.0] for _ in range(3)]
    lr = 0.1
    for s, a, r in steps:
        reinforce_update(
            logits,
            trace,
            torch.tensor([s]),
            torch.tensor([a]),
            torch.tensor([r], dtype=torch.float64),
            lr,
            gamma,
        )
        e0, e1 = (torch.tensor(theta[s], dtype=torch.float64).softmax(0)).tolist()
        z = [[gamma * v for v in row] for row in z]
        z[s][0] += (a == 0) - e0
        z[s][1] += (a == 1) - e1
        theta = [[t + lr * r * v for t, v in zip(trow, zrow)] for trow, zrow in zip(theta, z)]
    torch.testing.assert_close(logits[0], torch.tensor(theta, dtype=torch.float64))


def test_reinforce_update_respects_mask():
    logits, trace = torch.zeros(2, 1, 2), torch.zeros(2, 1, 2)
    reinforce_update(
        logits,
        trace,
        torch.tensor([0, 0]),
        torch.tensor([1, 1]),
        torch.tensor([1.0, 1.0]),
        0.5,
        0.9,
        mask=torch.tensor([True, False]),
    )
    assert logits[0, 0, 1] > 0 and (logits[1] == 0).all() and (trace[1] == 0).all()


def test_policy_gradient_citizen_learns_to_defect_against_always_defect(device):
    # Against an always-defecting DDO defecting pays P = 1 > S = 0: REINFORCE must find it.
    agents = {}

    def citizen():
        agents["c"] = PolicyGradientAgent(0.05)
        return agents["c"]

    play_many(
        DataSharingGame(horizon=50),
        citizen,
        lambda: FixedPolicyOpponent([0.0, 1.0]),
        4,
        8,
        0,
        device,
    )
    probs = agents["c"].action_probs(torch.zeros(8, dtype=torch.long, device=device))
    assert (probs[:, DataSharingGame.DEFECT] > 0.8).all()
    assert agents["c"].logits.shape == (8, 1, 2)


def test_regulated_payoffs_keep_social_utility_and_match_environment():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randint(2, (64,), generator=g), torch.randint(2, (64,), generator=g)
    tax = torch.rand(64, generator=g) * 0.5
    raw = DataSharingGame().payoffs[a, b]
    mutual = (a == 0) & (b == 0)
    out = regulated_payoffs(raw, mutual, tax, 0.0)
    torch.testing.assert_close(out.sum(-1), raw.sum(-1))
    env = DataSharingGame(tax=0.3, incentive=1.0)
    _, r_c, r_d, _ = env.step(a, b)
    torch.testing.assert_close(
        torch.stack([r_c, r_d], -1), regulated_payoffs(raw, mutual, 0.3, 1.0)
    )


def test_gaussian_tax_policy_takes_the_reinforce_step():
    policy = GaussianTaxPolicy(0.1, scale=0.5, init=0.2, period=2)
    policy.reset(3, torch.Generator().manual_seed(1))
    first = policy.decision.clone()
    assert torch.allclose(policy.rate, 0.5 * torch.sigmoid(first))
    for su in (1.0, 2.0):  # first period: no baseline yet, so no step
        policy.observe(torch.full((3,), su))
    torch.testing.assert_close(policy.theta, torch.full((3,), 0.2))
    second = policy.decision.clone()
    for su in (3.0, 4.0):  # mean 3.5, baseline 1.5
        policy.observe(torch.full((3,), su))
    torch.testing.assert_close(policy.theta, 0.2 + 0.1 * 2.0 * (second - 0.2) / 0.25)


def test_categorical_tax_policy_rates_and_validation():
    policy = CategoricalTaxPolicy(0.1, period=1).reset(500, torch.Generator().manual_seed(0))
    rates = torch.tensor([0.0, 0.15, 0.30, 0.50])
    assert (policy.rate.unsqueeze(-1) == rates).any(-1).all() and policy.theta.shape == (500, 4)
    assert len(policy.rate.unique()) == 4
    with pytest.raises(ValueError, match="rates"):
        CategoricalTaxPolicy(0.1, rates=(0.2, 1.5))
    with pytest.raises(ValueError, match="scale"):
        GaussianTaxPolicy(0.1, scale=0.0)
    with pytest.raises(ValueError, match="lr must be a finite number > 0, got -1.0"):
        PolicyGradientAgent(-1.0)
    with pytest.raises(TypeError, match="lr must be a finite number > 0"):
        PolicyGradientAgent("0.1")
    with pytest.raises(TypeError, match="scale must be a finite number > 0"):
        GaussianTaxPolicy(0.1, scale=None)
    with pytest.raises(TypeError, match="init must be a finite number"):
        GaussianTaxPolicy(0.1, init="0")
    with pytest.raises(ValueError, match="init must be a finite number, got inf"):
        GaussianTaxPolicy(0.1, init=float("inf"))
    with pytest.raises(TypeError, match="period must be an integer >= 1"):
        CategoricalTaxPolicy(0.1, period=1.0)
    with pytest.raises(TypeError, match="incentive must be a finite number >= 0"):
        Regulator(incentive="1")
    with pytest.raises(TypeError, match="env must be a DataSharingGame"):
        play_regulated("env", QLearner(0.1, 0.1, 0.8), QLearner(0.1, 0.1, 0.8), 2, 1)


def test_play_regulated_shapes_incentive_schedule_and_errors(device):
    regulator = Regulator(GaussianTaxPolicy(0.005), incentive=1.0, incentive_rounds=20)
    su, tax = play_regulated(
        DataSharingGame(),
        PolicyGradientAgent(0.01),
        PolicyGradientAgent(0.01, state_conditional=True),
        regulator,
        num_rounds=60,
        num_runs=3,
        seed=0,
        device=device,
    )
    assert su.shape == tax.shape == (3, 60)
    assert ((su >= 0) & (su <= 5)).all() and ((tax >= 0) & (tax <= 0.5)).all()
    raw = torch.tensor([[5.0, 5.0]], device=device)
    mutual = torch.tensor([True], device=device)
    assert regulator.rewards(19, raw, mutual).sum() > regulator.rewards(20, raw, mutual).sum()
    with pytest.raises(ValueError, match="tax=0"):
        play_regulated(
            DataSharingGame(tax=0.2), PolicyGradientAgent(0.01), PolicyGradientAgent(0.01)
        )


def test_unregulated_policy_gradient_players_defect():
    # Figure 4.14, no intervention: independent PG learners fall into (D, D), SU -> 1.
    su, tax = play_regulated(
        DataSharingGame(),
        PolicyGradientAgent(0.05),
        PolicyGradientAgent(0.05),
        None,
        num_rounds=400,
        num_runs=8,
        seed=0,
    )
    assert (tax == 0).all()
    assert su[:, -100:].mean() < 1.6 < su[:, :20].mean()


def test_linear_q_learner_with_one_hot_features_is_tabular(device):
    env = DataSharingGame(horizon=20)
    opp = lambda: FixedPolicyOpponent([0.3, 0.7])  # noqa: E731
    tab = play_many(env, lambda: QLearner(0.1, 0.2, 0.9), opp, 5, 3, 7, device)
    lin = play_many(env, lambda: ApproximateQLearner(0.1, 0.2, 0.9), opp, 5, 3, 7, device)
    torch.testing.assert_close(tab, lin)


def test_linear_q_learner_on_coin_game_features(device):
    env = CoinGame(size=3, horizon=6)
    agents = {}

    def make():
        agents["q"] = ApproximateQLearner(
            0.1, 0.05, 0.9, features=env.features, num_features=env.num_features
        )
        return agents["q"]

    curves = play_many(env, make, lambda: QLearner(0.1, 0.05, 0.9), 20, 2, 0, device)
    assert curves.shape == (2, 20) and torch.isfinite(curves).all()
    assert agents["q"].q.params[0].shape == (2, env.num_features, env.num_actions)
    with pytest.raises(ValueError, match="together"):
        ApproximateQLearner(0.1, 0.1, 0.9, features=env.features)
