"""Every wrong input to pyro_ext.online is refused at set-up with an error that names it."""

import functools
import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyro_ext.online import (
    BONG,
    GaussianBandit,
    LinearContextualBandit,
    ThompsonBandit,
    bayes_opt_1d,
    bernoulli_arms_model,
    gaussian_arms_model,
    linear_contextual_model,
    neural_contextual_model,
)

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True)
N, D = 6, 2


def linear(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(D), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.Normal(x @ w, 0.5), obs=y)


def linear_named_v(x, y=None):
    # The same number of parameters as ``linear``, another site.
    v = pyro.sample("v", dist.Normal(torch.zeros(D), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.Normal(x @ v, 0.5), obs=y)


def linear_as_a_row(x, y=None):
    # The same site name and number of parameters as ``linear``, another shape.
    w = pyro.sample("w", dist.Normal(torch.zeros(1, D), 1.0).to_event(2))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.Normal(x @ w[0], 0.5), obs=y)


def data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, D, generator=g), torch.randn(N, generator=g)


@functools.lru_cache
def fitted():
    """A filter after one update (a refused update leaves it as it was)."""
    x, y = data()
    return BONG(linear).update(x, y)


@functools.lru_cache
def fitted_traced():
    """A traced filter after two updates: the second traced the graph of this batch
    shape, so the next update of that shape checks its values inside the graph."""
    x, y = data()
    return BONG(linear, jit_compile="trace").update(x, y).update(x, y)


@functools.lru_cache
def contextual_agent(policy):
    agent = ThompsonBandit(lambda: BONG(linear_contextual_model(D, 3)), 3, policy=policy)
    return agent.observe(torch.ones(D), 0, 1.0)


def with_value(tensor, position, value):
    tensor = tensor.clone()
    tensor.view(-1)[position % tensor.numel()] = value
    return tensor


nonfinite = st.sampled_from([math.nan, math.inf, -math.inf])


# -- the issue's cases ------------------------------------------------------------------------
def test_update_without_the_observation_names_the_missing_argument():
    x, y = data()
    with pytest.raises(ValueError, match=r"observation.*argument\(s\) 'y' are None"):
        BONG(linear).update(x)
    # and once the filter has a belief
    f = BONG(linear).update(x, y)
    with pytest.raises(ValueError, match=r"argument\(s\) 'y' are None"):
        f.update(x)
    assert f.num_updates == 1


def test_update_with_a_nan_covariate_names_the_argument_and_first_index():
    x, y = data()
    x[2, 1] = math.nan
    with pytest.raises(ValueError, match=r"argument 'x' has NaN first at index \(2, 1\)"):
        BONG(linear).update(x, y)
    with pytest.raises(ValueError, match=r"update 1 refused: .*'x' has NaN first at index"):
        fitted().update(x, y)
    assert fitted().num_updates == 1


def test_update_with_zero_rows_is_refused_as_empty_data():
    x, y = data()
    with pytest.raises(ValueError, match=r"no data.*'x', 'y' are empty"):
        BONG(linear).update(x[:0], y[:0])
    with pytest.raises(ValueError, match="no data"):
        fitted().update(x[:0], y[:0])


def test_load_state_dict_from_another_model_with_the_same_dimension_is_refused():
    state = fitted().state_dict()
    x, _ = data()
    with pytest.raises(ValueError, match=r"latent sites \['w'\].*\['v'\]"):
        BONG(linear_named_v).load_state_dict(state).update(x, data()[1])
    with pytest.raises(ValueError, match=r"another model: latent site 'w' has"):
        BONG(linear_as_a_row).setup(x, data()[1]).load_state_dict(state)
    # another filter: the hyperparameter that differs is named
    with pytest.raises(ValueError, match="learning_rate=1.0, this one has learning_rate=0.5"):
        BONG(linear, learning_rate=0.5).load_state_dict(state)
    with pytest.raises(ValueError, match="family"):
        BONG(linear, family="diag").load_state_dict(state)


def test_load_state_dict_with_a_nan_mean_is_refused():
    state = fitted().state_dict()
    state["belief"]["mean"][1] = math.nan
    with pytest.raises(ValueError, match=r"state\['belief'\]\['mean'\] is not finite.*\(1,\)"):
        BONG(linear).load_state_dict(state)


def test_load_state_dict_with_a_missing_key_names_it():
    state = fitted().state_dict()
    del state["num_updates"]
    with pytest.raises(ValueError, match="no key 'num_updates'"):
        BONG(linear).load_state_dict(state)


def test_load_state_dict_refuses_extra_keys_wrong_types_and_shapes():
    good = fitted().state_dict()
    with pytest.raises(ValueError, match="unknown key 'extra'"):
        BONG(linear).load_state_dict({**good, "extra": 1})
    with pytest.raises(TypeError, match="state must be a dict"):
        BONG(linear).load_state_dict([good])
    with pytest.raises(TypeError, match=r"state\['num_updates'\]"):
        BONG(linear).load_state_dict({**good, "num_updates": "1"})
    belief = dict(good["belief"])
    with pytest.raises(TypeError, match=r"state\['belief'\]\['mean'\] must be a tensor"):
        BONG(linear).load_state_dict({**good, "belief": {**belief, "mean": [0.0, 0.0]}})
    with pytest.raises(ValueError, match=r"state\['belief'\] has no key 'covariance'"):
        BONG(linear).load_state_dict({**good, "belief": {"mean": belief["mean"]}})
    with pytest.raises(ValueError, match=r"\['covariance'\] has shape \(3, 3\)"):
        BONG(linear).load_state_dict({**good, "belief": {**belief, "covariance": torch.eye(3)}})
    with pytest.raises(ValueError, match="positive-definite"):
        BONG(linear).load_state_dict({**good, "belief": {**belief, "covariance": -torch.eye(D)}})
    # a state saved when the full family kept its precision says how to convert it
    old_format = {"mean": belief["mean"], "precision": torch.eye(D)}
    with pytest.raises(ValueError, match=r"saved before .*torch.linalg.inv"):
        BONG(linear).load_state_dict({**good, "belief": old_format})
    # the state of the same filter still resumes it
    x, y = data()
    resumed = BONG(linear).load_state_dict(good).update(x, y)
    assert resumed.num_updates == 2


def test_predictive_at_a_nan_input_names_the_argument():
    x, _ = data()
    x[3, 0] = math.nan
    with pytest.raises(ValueError, match=r"predictive\(\): .*'x' has NaN first at index \(3, 0\)"):
        fitted().predictive(x)
    with pytest.raises(ValueError, match="'x' has NaN"):
        BONG(linear).predictive(x)


def test_thompson_bandit_with_fewer_arms_than_its_model_is_refused():
    with pytest.raises(ValueError, match="num_arms is 3, but the filter's reward model has 5"):
        ThompsonBandit(lambda: BONG(gaussian_arms_model(5)), 3)
    with pytest.raises(TypeError, match="filter_factory"):
        ThompsonBandit(BONG(gaussian_arms_model(5)), 3)


def test_thompson_bandit_with_more_arms_than_its_model_is_refused():
    with pytest.raises(ValueError, match="num_arms is 5, but the filter's reward model has 3"):
        ThompsonBandit(lambda: BONG(gaussian_arms_model(3)), 5)


def test_act_with_a_nan_context_is_refused():
    context = torch.tensor([math.nan, 1.0])
    with pytest.raises(ValueError, match=r"context must be finite.*index \(0,\)"):
        contextual_agent("thompson").act(context)
    fresh = ThompsonBandit(lambda: BONG(linear_contextual_model(D, 3)), 3)
    with pytest.raises(ValueError, match="context must be finite"):
        fresh.act(context)


@pytest.mark.parametrize(
    "bad, index", [(math.inf, 1), (-math.inf, 0), (math.nan, 1)], ids=["inf", "-inf", "nan"]
)
def test_a_context_whose_sum_overflows_is_finite_and_a_bad_entry_is_named(bad, index):
    # The check sums the entries first (a finite sum has no bad entry); a sum that
    # overflows is not a bad entry, and a bad entry beside huge ones is still named.
    huge = torch.tensor([3e38, 3e38], dtype=torch.float32)
    agent = contextual_agent("thompson")
    assert 0 <= agent.act(huge) < 3
    context = huge.clone()
    context[index] = bad
    with pytest.raises(ValueError, match=rf"context must be finite.*index \({index},\)"):
        agent.act(context)


def test_act_with_a_nan_context_under_ucb_is_refused():
    with pytest.raises(ValueError, match="context must be finite"):
        contextual_agent("ucb").act(torch.tensor([1.0, math.nan]))


@pytest.mark.parametrize("reward", [5.0, -3.0])
def test_bernoulli_reward_outside_its_support_is_refused(reward):
    agent = ThompsonBandit(lambda: BONG(bernoulli_arms_model(3), family="diag"), 3)
    with pytest.raises(ValueError, match=r"argument 'reward'\).*outside the support Boolean"):
        agent.observe(None, 0, reward)
    assert agent.filter.num_updates == 0


def test_bayes_opt_objective_returning_a_vector_is_refused():
    with pytest.raises(
        ValueError, match=r"objective returned a tensor of shape \(3,\).*finite float"
    ):
        bayes_opt_1d(lambda x: torch.ones(3), (0.0, 1.0), num_steps=2, hidden=4, grid_size=5)


def test_bayes_opt_objective_returning_a_string_is_refused():
    with pytest.raises(TypeError, match=r"objective returned 'a' \(str\).*finite float"):
        bayes_opt_1d(lambda x: "a", (0.0, 1.0), num_steps=2, hidden=4, grid_size=5)


def test_bayes_opt_bounds_beyond_the_float_range_are_refused():
    with pytest.raises(ValueError, match="bounds .* more than torch.float64 can represent"):
        bayes_opt_1d(float, (-1e308, 1e308), num_steps=2, hidden=4, grid_size=5)
    with pytest.raises(ValueError, match="bounds .* too close for torch.float32"):
        bayes_opt_1d(float, (1.0, 1.0 + 1e-9), grid_size=5, dtype=torch.float32)


def test_bayes_opt_empty_hidden_is_refused():
    with pytest.raises(ValueError, match="hidden must name at least one hidden layer"):
        bayes_opt_1d(float, (0.0, 1.0), num_steps=2, hidden=[], grid_size=5)
    with pytest.raises(ValueError, match="hidden"):
        neural_contextual_model(D, 3, hidden=())


# -- the rest of the public API --------------------------------------------------------------
def test_update_with_observations_of_the_wrong_shape_names_the_argument():
    x, y = data()
    with pytest.raises(ValueError, match=r"argument 'y'\) has shape \(5,\)"):
        BONG(linear).update(x, y[:5])
    # a column would broadcast against the rows: every example against every other
    with pytest.raises(ValueError, match=r"argument 'y'\) has shape \(6, 1\)"):
        fitted().update(x, y.unsqueeze(-1))


def test_update_with_inputs_the_model_cannot_take_names_them():
    x, y = data()
    with pytest.raises(ValueError, match=r"model failed .*x: \(6, 3\)"):
        fitted().update(torch.randn(N, 3), y)
    with pytest.raises(TypeError, match="cannot take them"):
        fitted().update(x, y, torch.ones(1))
    with pytest.raises(ValueError, match=r"model failed .*x: \(3, 3\)"):
        fitted().predictive(torch.randn(3, 3))


def test_filter_sample_and_marginals_check_their_arguments():
    with pytest.raises(TypeError, match="generator"):
        fitted().sample(3, generator=3)
    with pytest.raises(ValueError, match="num_samples"):
        fitted().site_posteriors(-1)
    with pytest.raises(TypeError, match="num_samples"):
        fitted().site_posteriors("a")


def test_bandit_agent_checks_context_shape_reward_and_theta():
    agent = contextual_agent("thompson")
    with pytest.raises(ValueError, match=r"context must have shape \(2,\)"):
        agent.act(torch.ones(3))
    with pytest.raises(ValueError, match=r"context must have shape \(2, 2\)"):
        agent.observe(torch.ones(2), torch.tensor([0, 1]), torch.ones(2))
    with pytest.raises(TypeError, match="context must be a tensor"):
        agent.act(None)
    with pytest.raises(ValueError, match="theta must be finite"):
        agent.expected_rewards(torch.ones(D), theta=torch.full((3 * D,), math.nan))
    with pytest.raises(ValueError, match=r"theta must have shape \(6,\)"):
        agent.expected_rewards(torch.ones(D), theta=torch.ones(5))
    arms = ThompsonBandit(lambda: BONG(gaussian_arms_model(3)), 3)
    with pytest.raises(ValueError, match="context must be None"):
        arms.act(torch.ones(2))
    with pytest.raises(ValueError, match="empty"):
        arms.observe(None, torch.zeros(0, dtype=torch.long), torch.zeros(0))
    shared = BONG(gaussian_arms_model(3))
    reused = ThompsonBandit(lambda: shared, 3)
    reused.observe(None, 0, 1.0)
    with pytest.raises(ValueError, match="already holds a belief"):
        reused.reset()


def test_environments_refuse_non_finite_parameters():
    with pytest.raises(ValueError, match=r"means must be finite.*index \(1,\)"):
        GaussianBandit(torch.tensor([0.0, math.nan]))
    with pytest.raises(ValueError, match="weights must be finite"):
        LinearContextualBandit(torch.tensor([[0.0, math.inf], [1.0, 1.0]]))
    env = LinearContextualBandit(torch.ones(2, 2))
    with pytest.raises(ValueError, match="context must be finite"):
        env.reward(torch.tensor([math.nan, 0.0]), 0)


def test_bayes_opt_objective_returning_nan_or_none_is_refused():
    with pytest.raises(ValueError, match="objective returned nan"):
        bayes_opt_1d(lambda x: math.nan, (0.0, 1.0), num_steps=2, hidden=4, grid_size=5)
    with pytest.raises(TypeError, match=r"objective returned None"):
        bayes_opt_1d(lambda x: None, (0.0, 1.0), num_steps=2, hidden=4, grid_size=5)
    with pytest.raises(TypeError, match="device"):
        bayes_opt_1d(float, (0.0, 1.0), device=3.0)


# -- generated bad inputs ---------------------------------------------------------------------
@pytest.mark.parametrize("made", [fitted, fitted_traced], ids=["eager", "traced"])
@SETTINGS
@given(position=st.integers(0, N * D - 1), value=nonfinite)
def test_update_refuses_a_non_finite_covariate_anywhere(made, position, value):
    x, y = data()
    x = with_value(x, position, value)
    index = rf"\({position // D}, {position % D}\)"
    updates_before = made().num_updates
    with pytest.raises(ValueError, match=rf"argument 'x' has .* first at index {index}"):
        made().update(x, y)
    assert made().num_updates == updates_before


@pytest.mark.parametrize("made", [fitted, fitted_traced], ids=["eager", "traced"])
@SETTINGS
@given(position=st.integers(0, N - 1), sign=st.sampled_from([1.0, -1.0]))
def test_update_refuses_an_infinite_observation_anywhere(made, position, sign):
    x, y = data()
    y = with_value(y, position, sign * math.inf)
    with pytest.raises(ValueError, match=rf"argument 'y' has an infinite value .*\({position},\)"):
        made().update(x, y)


@SETTINGS
@given(length=st.integers(0, 2 * N).filter(lambda n: n != N))
def test_update_refuses_observations_of_another_length(length):
    x, _ = data()
    with pytest.raises(ValueError, match=r"argument 'y'\) has shape|no data"):
        fitted().update(x, torch.zeros(length))


@SETTINGS
@given(position=st.integers(0, N * D - 1), value=nonfinite)
def test_predictive_refuses_a_non_finite_input_anywhere(position, value):
    x = with_value(data()[0], position, value)
    with pytest.raises(ValueError, match="argument 'x' has"):
        fitted().predictive(x)


@SETTINGS
@given(
    position=st.integers(0, D - 1),
    value=nonfinite,
    policy=st.sampled_from(["thompson", "ucb", "greedy"]),
)
def test_act_refuses_a_non_finite_context_anywhere(position, value, policy):
    context = with_value(torch.ones(D), position, value)
    with pytest.raises(ValueError, match=rf"context must be finite.*\({position},\)"):
        contextual_agent(policy).act(context)


@SETTINGS
@given(rounds=st.integers(1, 4), data_=st.data())
def test_observe_refuses_non_finite_rewards_and_contexts_anywhere(rounds, data_):
    agent = contextual_agent("thompson")
    action = torch.zeros(rounds, dtype=torch.long)
    position = data_.draw(st.integers(0, rounds - 1))
    value = data_.draw(nonfinite)
    with pytest.raises(ValueError, match="reward must be finite"):
        agent.observe(
            torch.ones(rounds, D), action, with_value(torch.ones(rounds), position, value)
        )
    context = with_value(torch.ones(rounds, D), data_.draw(st.integers(0, rounds * D - 1)), value)
    with pytest.raises(ValueError, match="context must be finite"):
        agent.observe(context, action, torch.ones(rounds))
    assert agent.filter.num_updates == 1


@SETTINGS
@given(reward=st.one_of(st.floats(-10, -0.01), st.floats(0.01, 0.99), st.floats(1.01, 10)))
def test_bernoulli_rewards_outside_zero_one_are_refused(reward):
    agent = ThompsonBandit(lambda: BONG(bernoulli_arms_model(2), family="diag"), 2)
    with pytest.raises(ValueError, match="'reward'.*outside the support"):
        agent.observe(None, 1, reward)


@SETTINGS
@given(
    key=st.sampled_from(["mean", "covariance"]),
    position=st.integers(0, D * D - 1),
    value=nonfinite,
)
def test_load_state_dict_refuses_a_non_finite_belief_anywhere(key, position, value):
    state = fitted().state_dict()
    state["belief"][key] = with_value(state["belief"][key], position, value)
    with pytest.raises(ValueError, match=rf"state\['belief'\]\['{key}'\] is not finite"):
        BONG(linear).load_state_dict(state)


@SETTINGS
@given(num_arms=st.integers(2, 8), model_arms=st.integers(2, 8))
def test_agent_and_model_must_agree_on_the_number_of_arms(num_arms, model_arms):
    def factory():
        return BONG(gaussian_arms_model(model_arms))

    if num_arms == model_arms:
        ThompsonBandit(factory, num_arms)
        return
    with pytest.raises(ValueError, match=rf"num_arms is {num_arms}, .* has {model_arms} arms"):
        ThompsonBandit(factory, num_arms)
