"""Wrong types and values fail with an error naming the argument (issue 20, section 2)."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_ext.timeseries import (
    DLM,
    Autoregressive,
    DLMDistribution,
    HiddenMarkovDistribution,
    HiddenMarkovModel,
    LinearGaussian,
    LocalLevel,
    LocalLinearTrend,
    Regression,
    Seasonal,
    StateSpaceMatrices,
    hmm_filter,
    hmm_log_likelihood,
    hmm_predict,
    hmm_sample_paths,
    hmm_smooth,
    hmm_viterbi,
    kalman_filter,
    kalman_forecast,
    kalman_sample,
)

NEG_INF = -math.inf


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: LocalLevel("a"), TypeError, "level_scale must be a number or a real tensor"),
        (lambda: LocalLevel(None), TypeError, "level_scale"),
        (lambda: LocalLevel(1.0, init_scale="a"), TypeError, "init_scale"),
        (lambda: LocalLevel(1.0, init_scale=-1.0), ValueError, "init_scale"),
        (lambda: LocalLinearTrend(1.0, "a"), TypeError, "slope_scale"),
        (lambda: Seasonal("a", 1.0), TypeError, "period must be an integer"),
        (lambda: Seasonal(4.5, 1.0), ValueError, "period must be an integer"),
        (lambda: Seasonal(4, "a"), TypeError, "scale"),
        (lambda: Seasonal(4, 1.0, harmonics="x"), TypeError, "harmonics must be an integer"),
        (lambda: Seasonal(4, 1.0, harmonics=1.5), ValueError, "harmonics must be an integer"),
        (lambda: Regression([[1.0]]), TypeError, "X must be a torch.Tensor"),
        (lambda: Regression(torch.ones(5, 2), coef_scale="a"), TypeError, "coef_scale"),
        (lambda: Autoregressive([0.5], 1.0), TypeError, "coefs must be a torch.Tensor"),
        (lambda: Autoregressive(torch.tensor([0.5]), "a"), TypeError, "scale"),
        (lambda: LinearGaussian(1, 2, 3, 4, 5), TypeError, "G must be a torch.Tensor"),
        (lambda: DLM(LocalLevel(1.0), "a"), TypeError, "observation_scale"),
        (lambda: DLM(LocalLevel(1.0), 1.0, observation_df="a"), TypeError, "observation_df"),
        (lambda: DLM(5, 1.0), TypeError, "components"),
        (lambda: DLM([LocalLevel(1.0), "trend"], 1.0), TypeError, "components"),
        (lambda: DLMDistribution("a", 3), TypeError, "dlm must be a DLM"),
        (lambda: DLMDistribution(DLM(LocalLevel(1.0), 1.0), 2.5), TypeError, "num_steps"),
        (lambda: DLMDistribution(DLM(LocalLevel(1.0), 1.0), 0), ValueError, "num_steps"),
        (lambda: HiddenMarkovModel("a"), TypeError, "num_states must be an integer"),
        (lambda: HiddenMarkovModel(2.0), TypeError, "num_states must be an integer"),
        (lambda: HiddenMarkovModel(2, emission=3), TypeError, "emission must be one of"),
        (lambda: HiddenMarkovModel(2, num_symbols=2.0), TypeError, "num_symbols"),
        (lambda: HiddenMarkovModel(0), ValueError, "num_states must be an integer >= 1, got 0"),
        (
            lambda: HiddenMarkovModel(2, num_symbols=2, transition_concentration="a"),
            TypeError,
            "transition_concentration must be a finite number > 0",
        ),
        (
            lambda: HiddenMarkovModel(2, num_symbols=2, emission_concentration=0.0),
            ValueError,
            "emission_concentration must be a finite number > 0",
        ),
        (
            lambda: HiddenMarkovModel(2, num_symbols=2, backend="jax"),
            ValueError,
            "backend must be one of 'scan', 'funsor'",
        ),
        (
            lambda: HiddenMarkovModel(2, num_symbols=2, backend=None),
            TypeError,
            "backend must be a string",
        ),
        (lambda: Seasonal(4, 1.0, form="sine"), ValueError, "form must be one of 'dummy'"),
        (lambda: Seasonal(4, 1.0, form=1), TypeError, "form must be a string"),
    ],
)
def test_model_constructors_name_the_argument(build, error, match):
    with pytest.raises(error, match=match):
        build()


def _filtered():
    y = torch.randn(10, 1)
    eye = torch.eye(1)
    return kalman_filter(y, StateSpaceMatrices(eye, eye, eye, eye, torch.zeros(1), eye)), eye


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(num_steps=2.7), TypeError, "num_steps must be an integer >= 1, got 2.7"),
        (dict(num_steps="3"), TypeError, "num_steps must be an integer"),
        (dict(num_steps=True), TypeError, "num_steps must be an integer"),
        (dict(num_steps=0), ValueError, "num_steps must be an integer >= 1"),
        (dict(transition_matrix=math.nan), ValueError, "transition_matrix .* must be finite"),
        (dict(observation_matrix=math.inf), ValueError, "observation_matrix must be finite"),
    ],
)
def test_kalman_forecast_checks_like_kalman_filter(change, error, match):
    result, eye = _filtered()
    args = dict(
        num_steps=2,
        transition_matrix=eye,
        observation_matrix=eye,
        transition_cov=eye,
        observation_cov=eye,
    )
    for name, value in change.items():
        args[name] = torch.full((1, 1), value) if name.endswith("matrix") else value
    num_steps = args.pop("num_steps")
    matrices = StateSpaceMatrices(**args, init_mean=torch.zeros(1), init_cov=eye)
    with pytest.raises(error, match=match):
        kalman_forecast(result, num_steps, matrices)
    if "num_steps" not in change:
        # As in kalman_filter, the value check follows the validation switch.
        with pyro.validation_enabled(False):
            kalman_forecast(result, num_steps, matrices)


@pytest.mark.parametrize("num_steps", [2.7, "2"])
def test_dlm_forecast_and_sample_counts(num_steps):
    dlm = DLM(LocalLevel(1.0), 1.0)
    with pytest.raises(TypeError, match="num_steps must be an integer"):
        dlm.forecast(torch.randn(8), num_steps)
    with pytest.raises(TypeError, match="num_samples must be an integer"):
        dlm.sample_states(torch.randn(8), num_samples=num_steps)
    eye = torch.eye(1)
    with pytest.raises(ValueError, match="num_samples must be an integer >= 0"):
        matrices = StateSpaceMatrices(eye, eye, eye, eye, torch.zeros(1), eye)
        kalman_sample(torch.randn(8, 1), matrices, num_samples=-1)


# ---------------------------------------------------------------- HMM

HMM_QUERIES = {
    "log_likelihood": lambda i, t, o: hmm_log_likelihood(i, t, o),
    "filter": lambda i, t, o: hmm_filter(i, t, o),
    "smooth": lambda i, t, o: hmm_smooth(i, t, o),
    "viterbi": lambda i, t, o: hmm_viterbi(i, t, o),
    "sample_paths": lambda i, t, o: hmm_sample_paths(i, t, o, 3),
    "predict": lambda i, t, o: hmm_predict(i, t, o, 2),
}


@pytest.mark.parametrize("query", HMM_QUERIES)
@pytest.mark.parametrize("duration", [6, 3000])  # tree reductions, and the chunked passes
def test_hmm_transition_row_of_minus_inf(query, duration):
    init, obs = torch.zeros(3), torch.randn(duration, 3)
    trans = torch.zeros(3, 3)
    trans[1] = NEG_INF
    with pytest.raises(ValueError, match=r"trans_logits\[1\] is -inf for every next state"):
        HMM_QUERIES[query](init, trans, obs)
    with pytest.raises(ValueError, match="init_logits is -inf for every state"):
        HMM_QUERIES[query](torch.full((3,), NEG_INF), torch.zeros(3, 3), obs)


@pytest.mark.parametrize("query", [q for q in HMM_QUERIES if q != "log_likelihood"])
@pytest.mark.parametrize("duration, step", [(6, 3), (3000, 1700)])
def test_hmm_impossible_observation_names_the_time_step(query, duration, step):
    init, trans, obs = torch.zeros(2, 3), torch.randn(3, 3), torch.randn(2, duration, 3)
    obs[1, step] = NEG_INF
    obs[0, step + 1, 1:] = NEG_INF  # possible: state 0 can still emit it
    match = rf"observation at time step {step} \(0-based\) of batch element \(1,\) is impossible"
    with pytest.raises(ValueError, match=match):
        HMM_QUERIES[query](init, trans, obs)
    # log p(x) = -inf is the right answer for the likelihood itself.
    ll = hmm_log_likelihood(init, trans, obs)
    assert ll[0].isfinite() and ll[1] == NEG_INF
    # A missing observation is not impossible.
    mask = torch.ones(2, duration, dtype=torch.bool)
    mask[1, step] = False
    hmm_filter(init, trans, obs, mask=mask)


def test_hmm_observation_unreachable_through_the_chain():
    # State 0 is never entered, and the observation at step 2 is impossible in state 1.
    init = torch.tensor([NEG_INF, 0.0])
    trans = torch.tensor([[0.0, 0.0], [NEG_INF, 0.0]])
    obs = torch.zeros(4, 2)
    obs[2, 1] = NEG_INF
    with pytest.raises(ValueError, match="time step 2 "):
        hmm_smooth(init, trans, obs)
    with pyro.validation_enabled(False):  # value checks follow the validation switch
        assert hmm_filter(init, trans, obs)[3].sum() == 0


def test_hmm_distribution_refuses_a_dead_transition_row():
    trans = torch.tensor([[0.0, 0.0], [NEG_INF, NEG_INF]])
    with pytest.raises(ValueError, match=r"trans_logits\[1\]"):
        HiddenMarkovDistribution(
            torch.zeros(2), trans, dist.Normal(torch.zeros(2), 1.0), duration=4
        )


@pytest.mark.parametrize(
    "duration, error", [(2.5, TypeError), (True, TypeError), (0, ValueError), (-1, ValueError)]
)
def test_hmm_distribution_checks_duration(duration, error):
    with pytest.raises(error, match="duration must be an integer >= 1"):
        HiddenMarkovDistribution(
            torch.zeros(2), torch.zeros(2, 2), dist.Normal(torch.zeros(2), 1.0), duration=duration
        )
