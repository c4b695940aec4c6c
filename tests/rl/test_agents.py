import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pyro_ext.rl as rl
from pyro_ext.rl import (
    AgentOpponentModel,
    ApproximateLevel2QLearner,
    DirichletOpponentModel,
    ExponentialSmootherAdversary,
    FixedPolicyOpponent,
    FPQLearner,
    FriendOrFoe,
    LevelKQLearner,
    MultiOpponentQLearner,
    OpponentAveragingQLearner,
    OpponentModel,
    QLearner,
    TMDPQLearner,
    Transition,
    dirichlet_forget_update,
    epsilon_greedy_probs,
    play_many,
    q_update,
    softmax_probs,
    tmdp_q_update,
)

FAST = settings(max_examples=25, deadline=None)


@FAST
@given(
    st.integers(1, 4),
    st.integers(1, 5),
    st.integers(2, 4),
    st.integers(1, 4),
    st.integers(0, 2**31 - 1),
)
def test_tmdp_update_with_point_mass_is_q_learning(batch, num_states, num_actions, n, seed):
    g = torch.Generator().manual_seed(seed)
    b_star = int(torch.randint(n, (), generator=g))
    q_tmdp = torch.randn(batch, num_states, num_actions, n, generator=g)
    q_plain = q_tmdp[..., b_star].clone()
    point = torch.nn.functional.one_hot(torch.full((batch,), b_star), n).float()
    for _ in range(20):
        s = torch.randint(num_states, (batch,), generator=g)
        a = torch.randint(num_actions, (batch,), generator=g)
        s2 = torch.randint(num_states, (batch,), generator=g)
        r = torch.randn(batch, generator=g)
        done = torch.rand(batch, generator=g) < 0.2
        b = torch.full((batch,), b_star)
        tmdp_q_update(q_tmdp, s, a, b, r, s2, point, 0.3, 0.9, done)
        q_update(q_plain, s, a, r, s2, 0.3, 0.9, done)
        torch.testing.assert_close(q_tmdp[..., b_star], q_plain)


@FAST
@given(
    st.integers(1, 6), st.floats(0.05, 0.95), st.lists(st.integers(0, 5), min_size=1, max_size=30)
)
def test_dirichlet_forget_matches_algorithm_4_4(n, forget, observations):
    counts = torch.full((1, n), 0.5, dtype=torch.float64)
    alpha = [0.5] * n  # Algorithm 4.4 written out with Python floats
    for obs in observations:
        i = obs % n
        alpha = [forget * x for x in alpha]
        alpha[i] += 1.0
        dirichlet_forget_update(counts, torch.tensor([i]), forget)
        assert counts[0].tolist() == pytest.approx(alpha, rel=1e-12)


def test_dirichlet_without_forget_counts_and_mask():
    counts = torch.ones(3, 2)
    dirichlet_forget_update(counts, torch.tensor([0, 1, 1]), mask=torch.tensor([True, True, False]))
    assert counts.tolist() == [[2.0, 1.0], [1.0, 2.0], [1.0, 1.0]]


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_level_k_recursion_depth(k):
    agent = LevelKQLearner(k, 0.1, 0.1, 0.8)
    assert agent.depth == k
    levels, model = [agent.k], agent.opponent_model
    while not isinstance(model, DirichletOpponentModel):
        levels.append(model.agent.k)
        model = model.agent.opponent_model
    assert levels == list(range(k, 0, -1))
    # k Q-tables are allocated, alternating the roles of the players.
    agent.attach(1, 2, 3).reset(4, torch.Generator())
    shapes, node = [], agent
    while True:
        shapes.append(tuple(node.q.shape))
        if isinstance(node.opponent_model, DirichletOpponentModel):
            break
        node = node.opponent_model.agent
    assert shapes == [(4, 1, 2, 3) if i % 2 == 0 else (4, 1, 3, 2) for i in range(k)]


def test_level_1_equals_fpq(device):
    env, opp = FriendOrFoe(), lambda: FixedPolicyOpponent([0.3, 0.7])
    a = play_many(env, lambda: LevelKQLearner(1, 0.1, 0.1, 0.8, forget=0.8), opp, 200, 3, 7, device)
    b = play_many(env, lambda: FPQLearner(0.1, 0.1, 0.8, forget=0.8), opp, 200, 3, 7, device)
    torch.testing.assert_close(a, b)


def test_fpq_converges_to_closed_form_q(device):
    """Stateless TMDP, fixed opponent p(b): Q*(a,b) = r(a,b) + g/(1-g) max_a' sum_b p(b) r(a',b)."""
    gamma, p = 0.5, torch.tensor([0.3, 0.7])
    r = torch.tensor([[1.0, -1.0], [-2.0, 2.0]])  # FriendOrFoe-like, asymmetric payoffs
    q_star = r + gamma / (1 - gamma) * (r @ p).max()
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.zeros(256, 1, 2, 2, device=device)
    counts = torch.ones(256, 2, device=device)
    zeros = torch.zeros(256, dtype=torch.long, device=device)
    for _ in range(3000):
        a = torch.randint(2, (256,), generator=g, device=device)
        b = (torch.rand(256, generator=g, device=device) < p[1]).long()
        dirichlet_forget_update(counts, b)
        probs = counts / counts.sum(-1, keepdim=True)
        tmdp_q_update(q, zeros, a, b, r.to(device)[a, b], zeros, probs, 0.05, gamma)
    torch.testing.assert_close(q.mean(0)[0].cpu(), q_star, atol=0.05, rtol=0)


def test_q_learner_converges_to_closed_form(device):
    """One state, fixed opponent: Q*(a) = rbar(a) + g/(1-g) max rbar."""
    env = FriendOrFoe(payoff=1.0)
    agent = QLearner(1.0, 0.02, 0.5)  # uniform exploration visits both actions
    play_many(env, lambda: agent, lambda: FixedPolicyOpponent([0.2, 0.8]), 2000, 64, 0, device)
    rbar = torch.tensor([0.2 - 0.8, 0.8 - 0.2])
    q_star = rbar + 0.5 / 0.5 * rbar.max()
    torch.testing.assert_close(agent.q.mean(0)[0].cpu(), q_star, atol=0.05, rtol=0)


def test_opponent_averaging_counts_models_that_predicted(device):
    env = FriendOrFoe()
    agent = OpponentAveragingQLearner(
        [FixedPolicyOpponent([1.0, 0.0]), FixedPolicyOpponent([0.0, 1.0])], 0.1, 0.1, 0.8
    )
    play_many(env, lambda: agent, lambda: FixedPolicyOpponent([0.0, 1.0]), 50, 2, 0, device)
    assert agent.opponent_model.counts.tolist() == [[1.0, 51.0], [1.0, 51.0]]
    assert agent.model_probs[:, 1].min() > 0.95
    state = torch.zeros(2, dtype=torch.long, device=device)
    assert torch.allclose(agent.opponent_probs(state)[:, 1], agent.model_probs[:, 1])


def test_multi_opponent_joint_probs_factorise():
    agent = MultiOpponentQLearner(2, 0.1, 0.1, 0.9).attach(1, 3, 2).reset(1, torch.Generator())
    agent.update(
        Transition(
            torch.zeros(1, dtype=torch.long),
            torch.tensor([0]),
            torch.tensor([[1, 0]]),
            torch.tensor([1.0]),
            torch.zeros(1, dtype=torch.long),
        )
    )
    p1, p2 = torch.tensor([1 / 3, 2 / 3]), torch.tensor([2 / 3, 1 / 3])
    joint = agent.opponent_probs(torch.zeros(1, dtype=torch.long))[0]
    torch.testing.assert_close(joint, torch.outer(p1, p2).flatten())
    assert agent.q[0, 0, 0, agent.joint_index(torch.tensor([[1, 0]]))].item() == pytest.approx(0.1)


def test_approximate_linear_level2_matches_tabular(device):
    env = FriendOrFoe()
    opp = lambda: FixedPolicyOpponent([0.4, 0.6])  # noqa: E731
    tab = play_many(env, lambda: LevelKQLearner(2, 0.1, 0.1, 0.8), opp, 300, 4, 3, device)
    approx = play_many(
        env, lambda: ApproximateLevel2QLearner(0.1, 0.1, 0.8), opp, 300, 4, 3, device
    )
    torch.testing.assert_close(tab, approx)


def test_approximate_neural_level2_exploits_smoother(device):
    curves = play_many(
        FriendOrFoe(),
        lambda: ApproximateLevel2QLearner(0.1, 0.05, 0.8, hidden=8),
        lambda: ExponentialSmootherAdversary(0.75),
        600,
        4,
        0,
        device,
    )
    assert curves.shape == (4, 600)
    assert curves[:, -200:].mean() > 25  # level-2 thinking exploits the adversary (figure 4.3)


@FAST
@given(st.lists(st.floats(-10, 10), min_size=1, max_size=6), st.floats(0, 1), st.floats(0.1, 5))
def test_policies_are_distributions(values, epsilon, temperature):
    q = torch.tensor(values)
    for probs in (epsilon_greedy_probs(q, epsilon), softmax_probs(q, temperature)):
        assert probs.min() >= 0
        assert probs.sum().item() == pytest.approx(1.0, abs=1e-5)
    greedy = epsilon_greedy_probs(q, 0.0)
    assert greedy[q.argmax()] > 0 and (greedy[q < q.max()] == 0).all()


class _PointMassModel(OpponentModel):
    """A user-defined opponent model: always forecasts action ``b``."""

    def __init__(self, b):
        self.b, self.seen = b, 0

    def probs(self, state):
        return torch.nn.functional.one_hot(
            torch.full_like(state, self.b), self.num_opponent_actions
        ).float()

    def observe(self, transition):
        self.seen += 1


def test_tmdp_learner_takes_an_opponent_model():
    assert {"OpponentModel", "Transition"} <= set(rl.__all__)
    with pytest.raises(TypeError, match="opponent_model must be an OpponentModel"):
        TMDPQLearner(FixedPolicyOpponent([0.5, 0.5]), 0.1, 0.1, 0.8)
    with pytest.raises(TypeError, match="Agents or OpponentModels"):
        OpponentAveragingQLearner(["level-1"], 0.1, 0.1, 0.8)
    with pytest.raises(TypeError, match="abstract"):
        OpponentModel()
    for model in (DirichletOpponentModel(), AgentOpponentModel(QLearner(0.1, 0.1, 0.8))):
        assert isinstance(model, OpponentModel)
    model = _PointMassModel(1)
    agent = TMDPQLearner(model, 0.0, 0.5, 0.8)
    play_many(FriendOrFoe(), lambda: agent, lambda: FixedPolicyOpponent([0.0, 1.0]), 5, 2, 0)
    assert model.seen == 5 and agent.q[:, 0, :, 0].abs().sum() == 0  # b = 0 never observed
    state = torch.zeros(2, dtype=torch.long)
    torch.testing.assert_close(agent.q_values(state), agent.q[:, 0, :, 1])


def test_transition_swap_players_and_type_check():
    a, r = torch.tensor([0, 1]), torch.ones(2)
    b, rb = torch.tensor([[1, 2], [0, 1]]), -torch.ones(2, 2)  # two opponents
    s, done = torch.zeros(2, dtype=torch.long), torch.tensor([False, True])
    t = Transition(s, a, b, r, s, rb, done)
    assert t.mask is None and t.swap_players(1).action.tolist() == [2, 1]
    swapped = t.swap_players(0)
    assert swapped.opponent_action is a and swapped.opponent_reward is r
    assert swapped.reward.tolist() == [-1.0, -1.0] and swapped.done is done
    single = t._replace(opponent_action=b[:, 0], opponent_reward=rb[:, 0])
    assert single.swap_players().swap_players() == single
    assert Transition(s, a, b[:, 0], r, s).swap_players().reward is None
    agent = QLearner(0.1, 0.1, 0.8).attach(1, 2, 3).reset(2, torch.Generator())
    with pytest.raises(TypeError, match="takes a Transition"):
        agent.update((s, a, b[:, 0], r, s))
