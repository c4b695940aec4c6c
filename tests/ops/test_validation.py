"""The package's argument checks: TypeError for a wrong type, ValueError for a wrong value."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyro_ext.ops.validation import (
    as_real_tensor,
    broadcast_shapes,
    check_choice,
    check_int,
    check_positive,
    check_real,
    check_real_tensor,
    check_same_device,
    same_device,
)

FAST = settings(max_examples=50, deadline=None)

NOT_NUMBERS = [None, "1", b"1", [1], (1,), {1: 1}, object(), 1j, torch.tensor([1.0, 2.0])]


# ---------------------------------------------------------------- check_int


@pytest.mark.parametrize(
    "value", [3, np.int8(3), np.int32(3), np.int64(3), np.uint16(3), torch.tensor(3)]
)
def test_int_accepts_integers_and_returns_a_python_int(value):
    result = check_int(value, "n", low=1)
    assert result == 3 and type(result) is int


@pytest.mark.parametrize(
    "value",
    [True, False, np.bool_(True), torch.tensor(True), 3.0, np.float64(3.0), Fraction(3)]
    + [torch.tensor(3.0), torch.tensor([3]), np.array([3])]
    + NOT_NUMBERS,
)
def test_int_rejects_other_types_with_a_type_error(value):
    with pytest.raises(TypeError, match=r"^num_samples must be an integer >= 1, got .*\(\w+\)$"):
        check_int(value, "num_samples", low=1)


def test_int_message_names_the_argument_and_the_bounds():
    with pytest.raises(ValueError, match=r"^num_samples must be an integer >= 1, got 0$"):
        check_int(0, "num_samples", low=1)
    with pytest.raises(ValueError, match=r"^k must be an integer <= 4, got 5$"):
        check_int(5, "k", high=4)
    with pytest.raises(ValueError, match=r"^k must be an integer in \[0, 4\], got -1$"):
        check_int(np.int64(-1), "k", 0, 4)
    with pytest.raises(TypeError, match=r"^k must be an integer in \[0, 4\] or None, got 2.5"):
        check_int(2.5, "k", 0, 4, allow_none=True)
    with pytest.raises(TypeError, match=r"^k must be an integer, got None \(NoneType\)$"):
        check_int(None, "k")


@FAST
@given(
    value=st.integers(-(10**30), 10**30),
    low=st.none() | st.integers(-100, 100),
    high=st.none() | st.integers(-100, 100),
)
def test_int_bounds_are_closed(value, low, high):
    inside = (low is None or value >= low) and (high is None or value <= high)
    if inside:
        assert check_int(value, "n", low, high) == value
    else:
        with pytest.raises(ValueError, match="^n must be an integer"):
            check_int(value, "n", low, high)


def test_int_none_passes_only_with_allow_none():
    assert check_int(None, "n", low=1, allow_none=True) is None
    with pytest.raises(TypeError, match="n must be an integer >= 1, got None"):
        check_int(None, "n", low=1)


# ---------------------------------------------------------------- check_real


@pytest.mark.parametrize(
    "value", [0.5, 1, np.float32(0.5), np.float64(0.5), np.int64(1), Fraction(1, 2)]
)
def test_real_accepts_numbers_and_returns_a_python_float(value):
    result = check_real(value, "x", 0, 1)
    assert result == float(value) and type(result) is float


@pytest.mark.parametrize("value", [True, False, np.bool_(False), torch.tensor(0.5)] + NOT_NUMBERS)
def test_real_rejects_other_types_with_a_type_error(value):
    with pytest.raises(TypeError, match=r"^lr must be a finite number > 0, got .*\(\w+\)$"):
        check_real(value, "lr", low=0, low_open=True)


@pytest.mark.parametrize(
    "value, kwargs, interval",
    [
        (-7, dict(low=0), ">= 0"),
        (0, dict(low=0, low_open=True), "> 0"),
        (7, dict(high=1), "<= 1"),
        (1, dict(high=1, high_open=True), "< 1"),
        (7, dict(low=0, high=1), r"in \[0, 1\]"),
        (0, dict(low=0, high=1, low_open=True), r"in \(0, 1\]"),
        (1, dict(low=0, high=1, high_open=True), r"in \[0, 1\)"),
        (-1, dict(low=-1, high=0, low_open=True, high_open=True), r"in \(-1, 0\)"),
    ],
)
def test_real_message_shows_the_interval(value, kwargs, interval):
    match = rf"^beta must be a finite number {interval}, got {value}$"
    with pytest.raises(ValueError, match=match):
        check_real(value, "beta", **kwargs)


@FAST
@given(
    value=st.floats(-3, 3) | st.sampled_from([-1.0, 0.0, 1.0]),
    low_open=st.booleans(),
    high_open=st.booleans(),
)
def test_real_open_and_closed_ends(value, low_open, high_open):
    above = value > -1 if low_open else value >= -1
    below = value < 1 if high_open else value <= 1
    if above and below:
        assert check_real(value, "x", -1, 1, low_open, high_open) == value
    else:
        with pytest.raises(ValueError, match="^x must be a finite number in "):
            check_real(value, "x", -1, 1, low_open, high_open)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, np.float32("inf"), 10**400])
def test_real_rejects_non_finite_values(value):
    with pytest.raises(ValueError, match="^x must be a finite number, got"):
        check_real(value, "x")


def test_real_finite_false_allows_infinities_but_never_nan():
    assert check_real(math.inf, "df", low=2, low_open=True, finite=False) == math.inf
    assert check_real(-math.inf, "x", finite=False) == -math.inf
    with pytest.raises(ValueError, match="^x must be a number, got nan$"):
        check_real(math.nan, "x", finite=False)
    with pytest.raises(ValueError, match="^x must be a number >= 0, got -inf$"):
        check_real(-math.inf, "x", low=0, finite=False)


def test_real_none_passes_only_with_allow_none():
    assert check_real(None, "ess", low=0, low_open=True, allow_none=True) is None
    with pytest.raises(TypeError, match=r"^ess must be a finite number > 0 or None, got '1'"):
        check_real("1", "ess", low=0, low_open=True, allow_none=True)


def test_real_message_shows_the_value_as_given():
    with pytest.raises(ValueError, match=r"got 0$"):
        check_real(0, "alpha", low=0, low_open=True)
    with pytest.raises(ValueError, match=r"got 0\.0$"):
        check_real(np.float32(0), "alpha", low=0, low_open=True)


@FAST
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_positive_is_a_finite_number_above_zero(value):
    if math.isfinite(value) and value > 0:
        assert check_positive(value, "step_size") == value
    else:
        with pytest.raises(ValueError, match="^step_size must be a finite number > 0, got"):
            check_positive(value, "step_size")


def test_positive_types_and_none():
    with pytest.raises(TypeError, match="^step_size must be a finite number > 0, got True"):
        check_positive(True, "step_size")
    assert check_positive(None, "bandwidth", allow_none=True) is None


# ---------------------------------------------------------------- check_choice


def test_choice_returns_the_choice():
    assert check_choice("vogn", "method", ("ivon", "vogn", "von")) == "vogn"
    assert check_choice(None, "compile_mode", ("default",), allow_none=True) is None


def test_choice_lists_the_choices():
    match = r"^method must be one of 'ivon', 'vogn', 'von'; got 'adam'$"
    with pytest.raises(ValueError, match=match):
        check_choice("adam", "method", ("ivon", "vogn", "von"))
    with pytest.raises(ValueError, match="^mode must be one of 'a', 'b' or None; got 'c'$"):
        check_choice("c", "mode", ["a", "b"], allow_none=True)


@pytest.mark.parametrize("value", [1, True, None, b"ivon", ["ivon"], ("ivon",)])
def test_choice_rejects_non_strings_with_a_type_error(value):
    match = r"^method must be a string, one of 'ivon', 'vogn'; got .*\(\w+\)$"
    with pytest.raises(TypeError, match=match):
        check_choice(value, "method", ("ivon", "vogn"))


@FAST
@given(st.text(max_size=8))
def test_choice_accepts_exactly_the_choices(value):
    choices = ("linf", "l2", "l1")
    if value in choices:
        assert check_choice(value, "norm", choices) == value
    else:
        with pytest.raises(ValueError, match="^norm must be one of 'linf', 'l2', 'l1'; got"):
            check_choice(value, "norm", choices)


# ---------------------------------------------------------------- check_real_tensor


@pytest.mark.parametrize(
    "value", [torch.zeros(2), torch.zeros(2, dtype=torch.int64), torch.tensor([True])]
)
def test_real_tensor_accepts_real_dtypes_and_returns_the_tensor(value):
    assert check_real_tensor(value, "G") is value


@pytest.mark.parametrize(
    "value, match",
    [
        ([1.0], r"^G must be a torch.Tensor, got list$"),
        (torch.zeros(2, dtype=torch.complex64), r"^G must be a real tensor, got dtype"),
        (torch.zeros(2, dtype=torch.uint8), r"^G must be a real tensor, got dtype"),
    ],
)
def test_real_tensor_rejects_other_types_with_a_type_error(value, match):
    with pytest.raises(TypeError, match=match):
        check_real_tensor(value, "G")


# ---------------------------------------------------------------- devices
# "meta" stands in for a second device on a CPU-only machine.


def test_as_real_tensor_places_lists_and_refuses_tensors_elsewhere(device):
    made = as_real_tensor([1.0, 2.0], "spend", device)
    assert made.device == device and made.tolist() == [1.0, 2.0]
    assert as_real_tensor(np.ones(2), "spend", device).device == device
    there = torch.ones(2, device=device)
    assert as_real_tensor(there, "spend", device) is there
    with pytest.raises(ValueError, match=r"spend must be on meta.*got " + device.type):
        as_real_tensor(there, "spend", "meta")
    assert as_real_tensor(there, "spend").device == device  # no device: left where it is
    with pytest.raises(TypeError, match="spend must be a real tensor"):
        as_real_tensor("12", "spend", device)


def test_check_same_device_names_the_tensor_elsewhere():
    a, b = torch.ones(2), torch.ones(2, device="meta")
    assert check_same_device(samples=a, score=a.clone(), none=None) == a.device
    assert check_same_device() is None
    with pytest.raises(ValueError, match=r"score must be on the device of samples \(cpu\)"):
        check_same_device(samples=a, score=b)


def test_same_device_reads_cuda_as_the_current_one():
    assert same_device("cpu", torch.device("cpu")) and not same_device("cpu", "meta")
    assert same_device("cuda", "cuda:0") == (
        not torch.cuda.is_available() or torch.cuda.current_device() == 0
    )
    assert not same_device("cuda:0", "cuda:1")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.integers(0, 3),
            st.lists(st.sampled_from([0, 1, 1, 2, 3]), max_size=4).map(tuple),
        ),
        max_size=4,
    )
)
def test_broadcast_shapes_is_torchs(shapes):
    try:
        expected = torch.broadcast_shapes(*shapes)
    except RuntimeError:
        with pytest.raises(RuntimeError, match="cannot be broadcast"):
            broadcast_shapes(*shapes)
        return
    assert broadcast_shapes(*shapes) == expected
    assert isinstance(broadcast_shapes(*shapes), torch.Size)


def test_value_checks_follow_pyros_switch_not_torch_distributions_default():
    # The first torch.compile of a process turns torch.distributions' default validation
    # off for good (TorchDynamo's TorchPatcher); the package's value checks follow Pyro's
    # switch, which that leaves on, and still refuse a NaN.
    import pyro
    from torch.distributions import Distribution

    from pyro_ext.ops.validation import values_checked
    from pyro_ext.timeseries import hmm_log_likelihood

    torch.compile(lambda x: x + 1, backend="eager")(torch.zeros(2))
    Distribution.set_default_validate_args(False)  # what the patch leaves, whenever it ran
    try:
        assert values_checked()
        with pytest.raises(ValueError, match="init_logits"):
            hmm_log_likelihood(
                torch.tensor([0.0, math.nan, 0.0]), torch.zeros(3, 3), torch.zeros(4, 3)
            )
        with pyro.validation_enabled(False):
            assert not values_checked()
    finally:
        Distribution.set_default_validate_args(True)


def test_first_nonfinite_is_exact_when_the_sum_overflows():
    # The check sums first (a finite sum has no bad entry); a sum that overflows is no bad
    # entry, and a bad entry beside huge ones, or two infinities that cancel to NaN, is
    # still found at its index.
    from pyro_ext.ops.validation import first_nonfinite

    huge = torch.full((2, 3), 3e38, dtype=torch.float32)
    assert first_nonfinite(huge) is None
    for bad, index in [(math.inf, (1, 2)), (math.nan, (0, 1)), (-math.inf, (1, 0))]:
        x = huge.clone()
        x[index] = bad
        assert first_nonfinite(x) == index
    cancelling = torch.tensor([1.0, math.inf, -math.inf])
    assert first_nonfinite(cancelling) == (1,)
    assert first_nonfinite(torch.tensor([1, 2])) is None
