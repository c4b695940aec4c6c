"""Time series, the RL update functions, the ops and the BNN / VAE models refuse wrong input,
naming the argument (issue 32): one test per case of the bad-input probe."""

import math

import pyro
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pyro_ext.models as models
import pyro_ext.ops as ops
import pyro_ext.rl as rl
import pyro_ext.timeseries as ts

SETTINGS = settings(max_examples=15, deadline=None, derandomize=True)
FEW = settings(max_examples=8, deadline=None, derandomize=True)


def ssm():
    return ts.StateSpaceMatrices(
        transition_matrix=torch.eye(2),
        observation_matrix=torch.ones(1, 2),
        transition_cov=0.1 * torch.eye(2),
        observation_cov=torch.eye(1),
        init_mean=torch.zeros(2),
        init_cov=torch.eye(2),
    )


def dlm():
    return ts.DLM(ts.LocalLevel(torch.tensor(0.3)), torch.tensor(1.0))


def with_value(t, index, value):
    t = t.clone()
    t.view(-1)[index] = value
    return t


# ----------------------------------------------------------------- timeseries: Kalman


@pytest.mark.parametrize("dtype", [torch.long, torch.int32, torch.bool])
def test_kalman_filter_int_y(dtype):
    # NaN marks a missing value, which an integer tensor cannot hold: refused, not cast.
    with pytest.raises(TypeError, match=r"y must be a floating-point tensor.*y\.to\("):
        ts.kalman_filter(torch.ones(6, 1, dtype=dtype), ssm())


def test_kalman_sample_num_samples_0():
    with pytest.raises(ValueError, match="num_samples must be an integer >= 1"):
        ts.kalman_sample(torch.randn(6, 1), ssm(), num_samples=0)


@SETTINGS
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3))
def test_forecast_interval_covs_wrong_shape(shape):
    means = torch.zeros(3, 1)
    covs = torch.ones(shape)
    fits = len(shape) >= 2 and shape[-2:] == [1, 1] and (len(shape) == 2 or shape[-3] in (1, 3))
    if fits:
        lower, upper = ts.forecast_interval(means, covs)
        assert lower.shape == upper.shape
    else:
        with pytest.raises(ValueError, match="covs"):
            ts.forecast_interval(means, covs)


# ----------------------------------------------------------------- timeseries: HMM


def hmm_log_prob(y):
    model = ts.HiddenMarkovModel(3, "categorical", num_symbols=3)
    return pyro.poutine.trace(model).get_trace(y).log_prob_sum()


@SETTINGS
@given(index=st.integers(0, 4), symbol=st.integers(3, 1000))
def test_hidden_markov_model_symbol_5_of_3(index, symbol):
    y = with_value(torch.tensor([0.0, 1.0, 2.0, 1.0, 0.0]), index, float(symbol))
    with pytest.raises(
        ValueError, match=rf"y must hold integer symbols in \[0, 3\).*index {index}"
    ):
        hmm_log_prob(y)


@SETTINGS
@given(index=st.integers(0, 4), symbol=st.integers(-1000, -1))
def test_hidden_markov_model_symbol_minus_1(index, symbol):
    y = with_value(torch.tensor([0.0, 1.0, 2.0, 1.0, 0.0]), index, float(symbol))
    with pytest.raises(ValueError, match=rf"y must hold integer symbols.*index {index}"):
        hmm_log_prob(y)


@SETTINGS
@given(index=st.integers(0, 4), symbol=st.floats(0.01, 2.99).filter(lambda v: v != round(v)))
def test_hidden_markov_model_symbol_0_5(index, symbol):
    y = with_value(torch.tensor([0.0, 1.0, 2.0, 1.0, 0.0]), index, symbol)
    with pytest.raises(ValueError, match=rf"y must hold integer symbols.*index {index}"):
        hmm_log_prob(y)


def test_hidden_markov_model_symbols_of_several_series_name_the_index():
    with pytest.raises(ValueError, match=r"y must hold integer symbols.*index \(1, 1\)"):
        hmm_log_prob(torch.tensor([[0, 1], [2, 3]]))


def test_hidden_markov_model_nan_in_y_is_a_missing_value():
    # Documented (HiddenMarkovModel.forward): NaN marks a missing value, marginalised out,
    # so it is not an error: a missing step contributes nothing to the log-likelihood.
    model = ts.HiddenMarkovModel(
        3,
        num_symbols=3,
        init_probs=torch.ones(3) / 3,
        transition_probs=torch.ones(3, 3) / 3,
        emission_params={"emission_probs": torch.ones(3, 3) / 3},
    )
    tr = pyro.poutine.trace(model).get_trace(torch.tensor([0.0, math.nan, 2.0]))
    assert torch.allclose(tr.log_prob_sum(), torch.tensor(2 * math.log(1 / 3)))


# ----------------------------------------------------------------- timeseries: DLM


@pytest.mark.parametrize("dtype", [torch.long, torch.int32])
def test_dlm_log_likelihood_int_y(dtype):
    with pytest.raises(TypeError, match="y must be a floating-point tensor"):
        dlm().log_likelihood(torch.arange(6, dtype=dtype))


@FEW
@given(rows=st.integers(2, 8), columns=st.integers(1, 4))
def test_dlm_log_likelihood_y_shaped_6_2(rows, columns):
    with pytest.raises(ValueError, match=r"y has shape .* univariate series \(T,\)"):
        dlm().log_likelihood(torch.randn(rows, columns))
    # A batch of y matching batched parameters stays fine.
    batched = ts.DLM(ts.LocalLevel(torch.full((rows,), 0.3)), torch.tensor(1.0))
    assert batched.log_likelihood(torch.randn(rows, columns)).shape == (rows,)


@SETTINGS
@given(index=st.integers(0, 11), value=st.sampled_from([math.nan, math.inf, -math.inf]))
def test_regression_nan_in_x(index, value):
    X = with_value(torch.randn(6, 2), index, value)
    with pytest.raises(ValueError, match=r"X contains NaN or infinite values \(first at index"):
        ts.Regression(X)


@pytest.mark.parametrize("y", ["y", [0.1, 0.2], None])
def test_dlm_observe_y_a_string(y):
    with pytest.raises(TypeError, match="y must be a tensor"):
        ts.dlm_observe("y", dlm(), y)


@pytest.mark.parametrize("name", [3, None, b"y"])
def test_dlm_observe_name_not_a_string(name):
    with pytest.raises(TypeError, match="name must be a string"):
        ts.dlm_observe(name, dlm(), torch.randn(6))


# ----------------------------------------------------------------- rl


@SETTINGS
@given(epsilon=st.floats(allow_nan=True).filter(lambda e: not 0 <= e <= 1))
def test_epsilon_greedy_probs_epsilon_2(epsilon):
    with pytest.raises(ValueError, match="epsilon"):
        rl.epsilon_greedy_probs(torch.zeros(3, 2), epsilon)


@SETTINGS
@given(temperature=st.floats(max_value=0.0))
def test_softmax_probs_temperature_0(temperature):
    with pytest.raises(ValueError, match="temperature"):
        rl.softmax_probs(torch.zeros(3, 2), temperature)


@pytest.mark.parametrize("policy", ["bogus", "greedy", 3])
def test_policy_probs_policy_unknown(policy):
    with pytest.raises((ValueError, TypeError), match="policy must be"):
        rl.policy_probs(torch.zeros(3, 2), policy, 0.1, 1.0)


def q_update_args(state=0, lr=0.1, opponent_probs=None):
    return (
        torch.zeros(1, 3, 2),
        torch.tensor([state]),
        torch.tensor([0]),
        torch.tensor([1.0]),
        torch.tensor([0]),
        lr,
        0.9,
    )


@SETTINGS
@given(lr=st.floats(max_value=-1e-9))
def test_q_update_lr_negative(lr):
    with pytest.raises(ValueError, match="lr must be"):
        rl.q_update(*q_update_args(lr=lr))


@SETTINGS
@given(
    probs=st.lists(st.floats(0, 10), min_size=2, max_size=4),
    index=st.integers(0, 3),
    negative=st.floats(-10, -1e-3),
)
def test_sample_with_negative_probs(probs, index, negative):
    probs[index % len(probs)] = negative
    with pytest.raises(ValueError, match=r"probs must be finite and non-negative.*row \(0,\)"):
        rl.sample(torch.tensor([probs]), torch.Generator())


@SETTINGS
@given(forget=st.floats(allow_nan=True).filter(lambda f: not 0 <= f <= 1))
def test_dirichlet_forget_update_forget_2(forget):
    with pytest.raises(ValueError, match="forget"):
        rl.dirichlet_forget_update(torch.ones(2, 2), torch.tensor([0, 1]), forget=forget)


@SETTINGS
@given(scale=st.floats(max_value=0.0))
def test_gaussian_score_scale_negative(scale):
    with pytest.raises(ValueError, match="scale"):
        rl.gaussian_score(torch.tensor(0.1), torch.tensor(0.0), scale)


@SETTINGS
@given(state=st.integers(3, 10**6) | st.integers(-(10**6), -1))
def test_q_update_state_5_of_3(state):
    with pytest.raises(ValueError, match=rf"state must lie in \[0, 3\), got {state} at row 0"):
        rl.q_update(*q_update_args(state=state))


@SETTINGS
@given(n=st.integers(1, 6).filter(lambda n: n != 2))
def test_expected_q_opponent_probs_of_length_3_for_2_actions(n):
    with pytest.raises(ValueError, match=r"opponent_probs must have shape \(B, 2\)"):
        rl.expected_q(torch.zeros(1, 2, 2), torch.ones(1, n) / n)


def test_learners_still_run_with_the_unchecked_updates():
    out = rl.play(
        rl.FriendOrFoe(), rl.QLearner(0.1, 0.1, 0.8), rl.ExponentialSmootherAdversary(0.75), 2, 0
    )
    assert torch.isfinite(torch.as_tensor(out)).all()


# ----------------------------------------------------------------- ops


def test_split_rhat_one_draw_per_chain_is_nan_as_documented():
    # Documented and pinned by tests/ops/test_stats.py: chains too short to split give NaN
    # (a diagnostic never stops a short run), so this case is not an error.
    assert torch.isnan(ops.split_rhat(torch.randn(2, 1))).all()


@SETTINGS
@given(index=st.integers(0, 19), value=st.sampled_from([math.nan, math.inf, -math.inf]))
def test_split_rhat_nan_in_samples(index, value):
    samples = with_value(torch.randn(2, 10), index, value)
    at = (index // 10, index % 10)
    with pytest.raises(ValueError, match=rf"samples contains NaN.*index \({at[0]}, {at[1]}\)"):
        ops.split_rhat(samples)


@SETTINGS
@given(chain_dim=st.integers(2, 50) | st.integers(-50, -3))
def test_split_rhat_chain_dim_5(chain_dim):
    with pytest.raises(ValueError, match="chain_dim must be an integer in"):
        ops.split_rhat(torch.randn(2, 10), chain_dim=chain_dim)


@pytest.mark.parametrize("samples", [[[0.1, 0.2], [0.3, 0.4]], None, "x"])
def test_split_rhat_samples_a_list(samples):
    with pytest.raises(TypeError, match="samples must be a torch.Tensor"):
        ops.split_rhat(samples)


@SETTINGS
@given(truth=st.lists(st.integers(1, 4), min_size=1, max_size=2), draws=st.integers(1, 4))
def test_sbc_ranks_shapes_that_do_not_match(truth, draws):
    other = [s + 1 for s in truth]
    with pytest.raises(ValueError, match=r"draws without its draw dim .* truth's shape"):
        ops.sbc_ranks(torch.zeros(truth), torch.randn(draws, *other))


@pytest.mark.parametrize("fn", ["f", None, 3])
def test_hessian_diagonal_fn_not_callable(fn):
    with pytest.raises(TypeError, match="fn must be a callable"):
        ops.hessian_diagonal(fn, torch.zeros(2, 3))


@pytest.mark.parametrize("dtype", [torch.long, torch.int32, torch.bool])
def test_hessian_diagonal_int_points(dtype):
    with pytest.raises(TypeError, match="points must be a floating-point tensor"):
        ops.hessian_diagonal(lambda p: (p**2).sum(-1), torch.zeros(2, 3, dtype=dtype))


@pytest.mark.parametrize("combine", ["add", None, 1.0])
def test_associative_scan_combine_not_callable(combine):
    with pytest.raises(TypeError, match="combine must be a callable"):
        ops.associative_scan(combine, (torch.arange(4.0),))


@FEW
@given(vector=st.integers(1, 5), matrix=st.integers(1, 5), n=st.integers(1, 6))
def test_vector_scan_matrices_that_do_not_fit_the_vector(vector, matrix, n):
    def vec_mat(v, m):
        return (torch.einsum("ni,nij->nj", v[0], m[0]),)

    def mat_mat(a, b):
        return (a[0] @ b[0],)

    args = ((torch.ones(vector),), (torch.eye(matrix).expand(n, matrix, matrix),))
    if vector == matrix:
        assert ops.vector_scan(*args, vec_mat, mat_mat)[0].shape == (n + 1, vector)
    else:
        with pytest.raises(ValueError, match="matrices fit the vector"):
            ops.vector_scan(*args, vec_mat, mat_mat)


# ----------------------------------------------------------------- models: BNN


def mlp_log_prob(net, x, y):
    return pyro.poutine.trace(net).get_trace(x, y).log_prob_sum()


def mlp(**kwargs):
    return models.BayesianMLP(2, hidden=(3,), **kwargs)


@SETTINGS
@given(index=st.integers(0, 11), value=st.sampled_from([math.nan, math.inf, -math.inf]))
def test_bayesian_mlp_nan_in_x(index, value):
    x = with_value(torch.randn(6, 2), index, value)
    with pytest.raises(ValueError, match=rf"x must be finite.*index \({index // 2}, {index % 2}\)"):
        mlp_log_prob(mlp(), x, torch.randn(6))


@SETTINGS
@given(index=st.integers(0, 5), value=st.sampled_from([math.nan, math.inf, -math.inf]))
def test_bayesian_mlp_nan_in_y(index, value):
    y = with_value(torch.randn(6), index, value)
    with pytest.raises(ValueError, match=rf"y must be finite.*at index {index}\n"):
        mlp_log_prob(mlp(), torch.randn(6, 2), y)


def test_bayesian_mlp_empty_data():
    with pytest.raises(ValueError, match="x and y are empty"):
        mlp_log_prob(mlp(), torch.zeros(0, 2), torch.zeros(0))


@SETTINGS
@given(index=st.integers(0, 5), label=st.integers(3, 1000) | st.integers(-1000, -1))
def test_bayesian_mlp_class_label_3_of_3(index, label):
    y = with_value(torch.tensor([0, 1, 2, 0, 1, 2]), index, label)
    net = mlp(out_features=3, likelihood="categorical")
    with pytest.raises(
        ValueError, match=rf"y must hold class labels that lie in \[0, 3\).*index {index}"
    ):
        mlp_log_prob(net, torch.randn(6, 2), y)


def test_bayesian_mlp_good_data_still_runs_with_validation_off():
    with pyro.validation_enabled(False):
        assert torch.isfinite(mlp_log_prob(mlp(), torch.randn(6, 2), torch.randn(6)))


@SETTINGS
@given(index=st.integers(0, 1), label=st.integers(2, 1000) | st.integers(-1000, -1))
def test_expected_calibration_error_label_5_of_2_classes(index, label):
    labels = with_value(torch.tensor([0, 1]), index, label)
    with pytest.raises(ValueError, match=rf"labels must be integer class labels.*index {index}"):
        models.expected_calibration_error(torch.tensor([[0.2, 0.8], [0.6, 0.4]]), labels)


# ----------------------------------------------------------------- models: VAE


def vae_log_prob(x):
    net = models.VAE(x_dim=4, z_dim=2, hidden=3)
    return pyro.poutine.trace(net.model).get_trace(x).log_prob_sum()


@SETTINGS
@given(index=st.integers(0, 11), pixel=st.floats(1.0001, 1e6))
def test_vae_model_pixel_2(index, pixel):
    x = with_value(torch.bernoulli(torch.full((3, 4), 0.5)), index, pixel)
    with pytest.raises(
        ValueError, match=rf"x must hold binary pixels.*\({index // 4}, {index % 4}\)"
    ):
        vae_log_prob(x)


@SETTINGS
@given(index=st.integers(0, 11), pixel=st.floats(-1e6, -1e-4) | st.floats(0.01, 0.99))
def test_vae_model_pixel_minus_1(index, pixel):
    x = with_value(torch.bernoulli(torch.full((3, 4), 0.5)), index, pixel)
    with pytest.raises(ValueError, match=r"x must hold binary pixels 0 or 1"):
        vae_log_prob(x)


def test_vae_model_empty_x():
    with pytest.raises(ValueError, match="x is empty"):
        vae_log_prob(torch.zeros(0, 4))


@pytest.mark.parametrize("draws", ["draws", (torch.zeros(2, 1, 3),), None])
def test_importance_log_likelihood_proposal_draws_a_string(draws):
    with pytest.raises(TypeError, match=r"proposal_draws must be a pair \(z, log_q\)"):
        models.importance_log_likelihood(lambda z: z.sum(-1), draws)


@SETTINGS
@given(step_size=st.floats(max_value=-1e-9))
def test_refined_mean_proposal_step_size_negative(step_size):
    with pytest.raises(ValueError, match="step_size must be"):
        models.refined_mean_proposal(
            lambda z: -(z**2).sum(-1), torch.zeros(2), torch.ones(2), step_size, 2
        )


@SETTINGS
@given(num_steps=st.integers(max_value=-1))
def test_refined_mean_proposal_num_steps_minus_1(num_steps):
    with pytest.raises(ValueError, match="num_steps must be an integer >= 0"):
        models.refined_mean_proposal(
            lambda z: -(z**2).sum(-1), torch.zeros(2), torch.ones(2), 0.1, num_steps
        )
