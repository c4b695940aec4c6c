"""RetailBSTS refuses wrong input at set-up, naming the argument (issue 32).

Every check here fires before any sampling, except those of a fitted model's forecasts,
which share one tiny fit (30 weeks, 2 particles, 2 + 2 steps, no AutoNormal start).
"""

import re
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyro_ext.models.bsts import RetailBSTS, simulate_retail

FAST = dict(num_samples=2, warmup_steps=2, num_particles=2, map_init_steps=0, rhat_target=None)
SETTINGS = settings(max_examples=20, deadline=None, derandomize=True)
WEEKS, K, P = 30, 5, 7


@pytest.fixture(scope="module")
def data():
    return simulate_retail(num_weeks=WEEKS, seed=1, noise="gaussian")


def small(**kwargs):
    return RetailBSTS(noise="gaussian", seasonal_harmonics=0, **kwargs)


@pytest.fixture(scope="module")
def fitted(data):
    # SSVS has no indicator sites: the fit is one SG-MCMC run of a few steps. A fixed lag:
    # spend_lag="auto" would first fit an AutoNormal per lag (about 10 s), which
    # tests/models/test_bsts.py covers; the checks here are the fitted model's inputs.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = small(selection="ssvs", spend_lag=1)
        return model.fit(data.sales, data.spend, data.covariates, **FAST)


# ----------------------------------------------------------------- the cases
def test_forecast_with_horizon_zero_names_the_horizon(fitted):
    # was: RuntimeError "stack expects a non-empty TensorList"
    with pytest.raises(ValueError, match=r"spend_future has 0 rows: the horizon .* positive int"):
        fitted.forecast(torch.zeros(0, K))
    with pytest.raises(ValueError, match="horizon"):
        fitted.sales_moments(torch.zeros(0, K))
    with pytest.raises(ValueError, match="horizon"):
        fitted.sample_sales(torch.zeros(0, K))


def test_forecast_with_max_draws_zero_names_max_draws(fitted):
    # was: RuntimeError "MKL FFT error"
    with pytest.raises(ValueError, match="max_draws must be an integer >= 1, got 0"):
        fitted.forecast(torch.ones(2, K), max_draws=0)


@SETTINGS
@given(
    max_draws=st.one_of(
        st.integers(max_value=0),
        st.floats(allow_nan=True),
        st.text(max_size=3),
        st.none(),
    )
)
def test_forecast_bad_max_draws_is_refused(fitted, max_draws):
    error = ValueError if isinstance(max_draws, int) else TypeError
    with pytest.raises(error, match="max_draws"):
        fitted.forecast(torch.ones(2, K), max_draws=max_draws)


@SETTINGS
@given(
    horizon=st.integers(1, 4),
    cell=st.tuples(st.integers(0, 3), st.integers(0, P - 1)),
    bad=st.sampled_from([float("nan"), float("inf"), -float("inf")]),
)
def test_forecast_with_nan_future_covariates_names_the_first_bad_entry(
    fitted, data, horizon, cell, bad
):
    # was: NaN forecasts, silently (fit refuses NaN covariates)
    t, j = cell[0] % horizon, cell[1]
    covariates = data.covariates[:horizon].clone()
    covariates[t, j] = bad
    match = re.escape(f"covariates_future[{t}, {j}] is {bad}")
    with pytest.raises(ValueError, match=match):
        fitted.forecast(data.spend[:horizon], covariates)


@SETTINGS
@given(shape=st.lists(st.integers(0, 8), min_size=1, max_size=3).filter(lambda s: s != [2, P]))
def test_forecast_with_future_covariates_of_the_wrong_shape_is_refused(fitted, shape):
    with pytest.raises(ValueError, match=r"covariates_future must have shape \(2, 7\)"):
        fitted.forecast(torch.ones(2, K), torch.ones(shape))


@SETTINGS
@given(shape=st.lists(st.integers(0, 6), min_size=0, max_size=3))
def test_forecast_with_spend_of_the_wrong_shape_is_refused(fitted, shape):
    if len(shape) == 2 and shape[1] == K:
        match = "horizon" if shape[0] == 0 else None
        if match is None:
            return  # a valid spend_future
        with pytest.raises(ValueError, match=match):
            fitted.forecast(torch.ones(shape))
        return
    with pytest.raises(ValueError, match=r"spend_future must have shape \(h, 5\)"):
        fitted.forecast(torch.ones(shape))


def test_ssvs_with_moves_is_refused_naming_both(data):
    # was: moves silently ignored (SSVS sums the indicators out)
    model = small(selection="ssvs")
    with pytest.raises(ValueError, match=r"moves='mh-flip'.*selection='ssvs'"):
        model.fit(data.sales, data.spend, data.covariates, moves="mh-flip", **FAST)


def test_moves_of_a_model_without_indicators_or_unknown_moves_are_refused(data):
    # variant B: every coefficient is forced in, no indicator to move
    with pytest.raises(ValueError, match="moves='gibbs' has nothing to move"):
        small(variant="B").fit(data.sales, data.spend, data.covariates, moves="gibbs", **FAST)
    with pytest.raises(ValueError, match="moves must be one of"):
        small().fit(data.sales, data.spend, data.covariates, moves="flip", **FAST)
    with pytest.raises(TypeError, match="moves must be one of"):
        small().fit(data.sales, data.spend, data.covariates, moves=3, **FAST)


def test_expected_model_size_above_the_number_of_covariates_is_refused(data):
    # was: expected_model_size=50 with 7 covariates gave every covariate inclusion 1.0
    model = small(expected_model_size=50)
    with pytest.raises(
        ValueError,
        match=r"expected_model_size=50 exceeds the 7 covariates .* must be in \(0, 7\]",
    ):
        model.fit(data.sales, data.spend, data.covariates, **FAST)


@SETTINGS
@given(excess=st.floats(0.01, 100.0))
def test_expected_model_size_above_the_regressors_of_the_variant_is_refused(data, excess):
    # RA selects among the 5 channels and the 7 covariates
    model = small(variant="RA", expected_model_size=K + P + excess)
    with pytest.raises(ValueError, match=r"12 channels and covariates .* \(0, 12\]"):
        model.fit(data.sales, data.spend, data.covariates, **FAST)


def test_default_expected_model_size_is_still_capped(data):
    # The default (5) with 3 covariates forces them in as before: no error at set-up.
    model = small(variant="RF")
    assert model.expected_model_size == 5
    model._check_expected_model_size(K, 3)


# ----------------------------------------------------------------- constructor
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"delta_prior": 2.0}, TypeError, "delta_prior must be a pair"),
        ({"delta_prior": (1.0, 2.0, 3.0)}, ValueError, "delta_prior must be a pair"),
        ({"delta_range": 0.5}, TypeError, "delta_range must be a pair"),
        ({"delta_range": "ab"}, TypeError, "delta_range must be a pair"),
        ({"holidays": 3}, TypeError, "holidays must be a list"),
        ({"holidays": "hols"}, TypeError, "holidays must be a list"),
        ({"holidays": [1.5]}, TypeError, r"holidays \(each index\)"),
        ({"holidays": [-1]}, ValueError, r"holidays \(each index\)"),
        ({"prior_scales": [1.0]}, TypeError, "prior_scales must be a dict"),
        ({"prior_scales": {"sigma_obs": -1.0}}, ValueError, r"prior_scales\['sigma_obs'\]"),
        ({"prior_scales": {"sigma_obs": float("nan")}}, ValueError, r"prior_scales\['sigma_obs'\]"),
        ({"prior_scales": {"sigma_x": 1.0}}, ValueError, "prior_scales has unknown keys"),
        ({"expected_model_size": 0}, ValueError, "expected_model_size"),
        ({"expected_model_size": "5"}, TypeError, "expected_model_size"),
        ({"spend_lag": "weekly"}, ValueError, "spend_lag must be 0, 1 or 'auto'"),
        ({"spend_lag": 2}, ValueError, "spend_lag"),
        ({"carryover": "per-channel"}, ValueError, "carryover must be one of"),
        ({"carryover": None}, TypeError, "carryover must be a string"),
        ({"effects": "positive"}, ValueError, "effects must be one of"),
        ({"variant": "RA", "effects": "non_negative"}, ValueError, "variant='RA'"),
        ({"saturation": "logistic"}, ValueError, "saturation must be one of 'hill' or None"),
        ({"saturation": 1}, TypeError, "saturation must be a string"),
        ({"saturation": "hill", "saturation_scale": -1.0}, ValueError, "saturation_scale"),
        ({"saturation": "hill", "saturation_scale": "1"}, TypeError, "saturation_scale"),
        ({"roas_prior": (2.0, 0.5)}, TypeError, "roas_prior must be a dict"),
        ({"roas_prior": {"tv": 2.0}}, TypeError, r"roas_prior\['tv'\] must be a pair"),
        ({"roas_prior": {"tv": (2.0, -0.5)}}, ValueError, r"roas_prior\['tv'\]\[1\]"),
        ({"roas_prior": {"tv": (0.0, 0.5)}}, ValueError, r"roas_prior\['tv'\]\[0\]"),
        ({"roas_prior": {1.5: (2.0, 0.5)}}, TypeError, r"roas_prior \(each channel index\)"),
        ({"roas_prior": {"tv": (2, 1)}, "effects": "real"}, ValueError, "non-negative"),
        ({"roas_prior": {"tv": (2, 1)}, "variant": "RA"}, ValueError, "non-negative"),
    ],
)
def test_constructor_arguments_name_themselves(kwargs, error, match):
    with pytest.raises(error, match=match):
        RetailBSTS(**kwargs)


@pytest.mark.parametrize(
    "roas_prior, match",
    [
        ({"cinema": (2.0, 0.5)}, "roas_prior names unknown channel 'cinema'"),
        ({7: (2.0, 0.5)}, "roas_prior index 7 is out of range for 5 channels"),
        ({"tv": (2.0, 0.5), 0: (1.0, 0.5)}, "roas_prior gives channel 'tv' twice"),
    ],
)
def test_roas_prior_channels_are_checked_at_fit(data, roas_prior, match):
    with pytest.raises(ValueError, match=match):
        small(roas_prior=roas_prior, spend_lag=1).fit(
            data.sales, data.spend, data.covariates, channel_names=data.channel_names, **FAST
        )


def test_roas_prior_of_a_channel_that_never_spent_is_refused(data):
    spend = data.spend.clone()
    spend[:, 2] = 0.0
    with pytest.raises(ValueError, match="spent nothing in the training weeks"):
        small(roas_prior={2: (1.0, 0.5)}, spend_lag=1).fit(
            data.sales, spend, data.covariates, **FAST
        )


# ----------------------------------------------------------------- fit, before sampling
@SETTINGS
@given(
    cell=st.tuples(st.integers(0, WEEKS - 1), st.integers(0, P - 1)),
    bad=st.sampled_from([float("nan"), float("inf")]),
)
def test_fit_names_the_first_non_finite_covariate(data, cell, bad):
    covariates = data.covariates.clone()
    covariates[cell] = bad
    match = re.escape(f"covariates[{cell[0]}, {cell[1]}] is {bad}")
    with pytest.raises(ValueError, match=match):
        small().fit(data.sales, data.spend, covariates, **FAST)


@SETTINGS
@given(
    cell=st.tuples(st.integers(0, WEEKS - 1), st.integers(0, K - 1)),
    bad=st.sampled_from([float("nan"), float("inf"), -1.0]),
)
def test_fit_names_the_first_bad_spend(data, cell, bad):
    spend = data.spend.clone()
    spend[cell] = bad
    match = re.escape(f"spend[{cell[0]}, {cell[1]}] is {bad}")
    with pytest.raises(ValueError, match=match):
        small().fit(data.sales, spend, data.covariates, **FAST)


@pytest.mark.parametrize(
    "change, error, match",
    [
        # was: "MKL FFT error"
        ({"spend": torch.zeros(WEEKS, 0)}, ValueError, "spend has 0 columns"),
        ({"sales": "abc"}, TypeError, "sales must be a real tensor"),
        ({"spend": [[1.0, 2.0], [3.0]]}, TypeError, "spend must be a real tensor"),
        ({"seed": -1}, ValueError, "seed must be an integer"),
        ({"seed": "a"}, TypeError, "seed must be an integer"),
        ({"standardize": "no"}, TypeError, "standardize must be a bool"),
        ({"channel_names": "abcde"}, TypeError, "channel_names must be a list"),
        ({"channel_names": ["a"]}, ValueError, "channel_names has 1 names for 5 channels"),
        ({"covariate_names": "abcdefg"}, TypeError, "covariate_names must be a list"),
        ({"holidays_model": ["zz"]}, ValueError, "holidays names unknown covariate 'zz'"),
        ({"holidays_model": [7]}, ValueError, r"holidays index 7 is out of range .* \(0 to 6\)"),
    ],
)
def test_fit_arguments_name_themselves(data, change, error, match):
    args = dict(sales=data.sales, spend=data.spend, covariates=data.covariates)
    holidays = change.pop("holidays_model", None)
    args.update(change)
    with pytest.raises(error, match=match):
        small(holidays=holidays).fit(**args, **FAST)


# ----------------------------------------------------------------- the fitted model
def test_sample_sales_num_samples_must_be_positive(fitted):
    with pytest.raises(ValueError, match="num_samples must be an integer >= 1"):
        fitted.sample_sales(torch.ones(2, K), num_samples=0)


def test_forecast_spend_of_the_wrong_type_names_it(fitted):
    with pytest.raises(TypeError, match="spend_future must be a real tensor"):
        fitted.forecast("abc")
    with pytest.raises(TypeError, match="covariates_future must be a real tensor"):
        fitted.forecast(torch.ones(2, K), "abc")


@pytest.mark.parametrize(
    "change, match",
    [
        # was: silent NaN predictions
        ({"spend": "nan"}, re.escape("spend[0, 0] is nan")),
        ({"covariates": "nan"}, re.escape("covariates[0, 0] is nan")),
        # was: "The size of tensor a (29) must match the size of tensor b (30)"
        ({"spend": "short"}, r"spend must have shape \(30, 5\)"),
        ({"covariates": "narrow"}, r"covariates must have shape \(30, 7\)"),
        ({"sales": "short"}, r"spend must have shape \(5, 5\)"),
        ({"max_draws": 0}, "max_draws"),
    ],
)
def test_one_step_predictions_check_their_inputs(fitted, data, change, match):
    args = dict(sales=data.sales, spend=data.spend, covariates=data.covariates)
    for key, how in change.items():
        if how == "nan":
            args[key] = torch.full_like(args[key], float("nan"))
        elif how == "short":
            args[key] = args[key][:-1] if key == "spend" else args[key][:5]
        elif how == "narrow":
            args[key] = args[key][:, :2]
        else:
            args[key] = how
    with pytest.raises(ValueError, match=match):
        fitted.one_step_predictions(**args)


def test_a_valid_forecast_still_works(fitted, data):
    draws = fitted.forecast(data.spend[:3], data.covariates[:3], max_draws=3)
    assert draws.shape == (3, 3) and bool(torch.isfinite(draws).all())


def test_properties_of_an_unfitted_model_say_to_fit_first():
    # was: AttributeError "'RetailBSTS' object has no attribute '_p'"
    model = RetailBSTS()
    with pytest.raises(ValueError, match=r"discrete_sites .* call fit\(\) first"):
        getattr(model, "discrete_sites")  # noqa: B009
    with pytest.raises(ValueError, match=r"uses_covariates .* call fit\(\) first"):
        getattr(model, "uses_covariates")  # noqa: B009


# ----------------------------------------------------------------- simulate_retail
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"q": (0.1, 0.2)}, ValueError, r"q must have 5 entries .* got shape \(2,\)"),
        ({"beta": (0.1,)}, ValueError, r"beta must have 7 entries"),
        ({"q": [0.1, float("nan"), 0, 0, 0]}, ValueError, re.escape("q[1] is nan")),
        ({"beta": "abc"}, TypeError, "beta must be 7 numbers"),
        ({"seed": "a"}, TypeError, "seed must be an integer"),
        ({"noise_scale": -1.0}, ValueError, "noise_scale must be a finite number >= 0"),
        ({"goodwill_scale": float("nan")}, ValueError, "goodwill_scale"),
        ({"level_scale": -0.1}, ValueError, "level_scale"),
        ({"noise": "student_t", "df": 0.0}, ValueError, "df must be"),
        ({"dtype": "float32"}, TypeError, "dtype must be None or a torch.dtype"),
        ({"dtype": torch.int64}, ValueError, "dtype must be a floating point"),
    ],
)
def test_simulate_retail_arguments_name_themselves(kwargs, error, match):
    # were: silent (NaN q, negative scales, integer dtype) or cryptic ("Invalid device
    # string: 'float32'", "invalid literal for int()")
    with pytest.raises(error, match=match):
        simulate_retail(num_weeks=10, **kwargs)


@pytest.mark.parametrize("name", ["num_samples", "num_particles"])
def test_fit_with_no_draws_or_no_particles_is_refused(data, name):
    # was: num_particles=0 gave "IndexError: list index out of range" after the start
    with pytest.raises(ValueError, match=rf"{name} must be an integer >= 1, got 0"):
        small().fit(data.sales, data.spend, data.covariates, **{**FAST, name: 0})


def test_tensors_on_another_device_than_the_data_are_refused(data, fitted):
    # "meta" stands in for a second device: each argument that meets the data names itself
    # and where to move it (on CUDA the mix failed deep inside torch, naming neither).
    elsewhere = {name: getattr(data, name).to("meta") for name in ("spend", "covariates")}
    for name in ("spend", "covariates"):
        columns = dict(sales=data.sales, spend=data.spend, covariates=data.covariates)
        columns[name] = elsewhere[name]
        with pytest.raises(ValueError, match=rf"{name} must be on cpu, .* got meta"):
            small().fit(**columns, **FAST)
    future = data.spend[-3:].to("meta")
    with pytest.raises(ValueError, match=r"spend_future must be on cpu.*spend_future.to\('cpu'\)"):
        fitted.forecast(future)
    with pytest.raises(ValueError, match=r"covariates_future must be on cpu"):
        fitted.forecast(data.spend[-3:], data.covariates[-3:].to("meta"))
    with pytest.raises(ValueError, match=r"spend must be on cpu"):
        fitted.response_curves(torch.ones(2, device="meta"))
    # Lists and arrays are placed on the data's device.
    assert fitted.forecast(data.spend[-3:].tolist()).device == data.spend.device
