"""Every inference family's divergence error is a DivergenceError (issue 31)."""

import pickle

import pytest

import pyro_ext.infer
from pyro_ext.infer import (
    DivergenceError,
    NGVIDivergenceError,
    SamplerDivergenceError,
    VISDivergenceError,
)
from pyro_ext.online import OnlineDivergenceError

ERRORS = {
    "sampler": lambda: SamplerDivergenceError(3, ["mu"], [0, 1]),
    "sampler, model error": lambda: SamplerDivergenceError.from_model_error(
        2, 4, RuntimeError("cholesky failed")
    ),
    "vis": lambda: VISDivergenceError(1, ["z"], [0], reason="the gradient", iteration=5),
    "ngvi": lambda: NGVIDivergenceError(7, "the posterior mean"),
    "online": lambda: OnlineDivergenceError(4, "the belief is not finite"),
}


@pytest.mark.parametrize("make", ERRORS.values(), ids=ERRORS.keys())
def test_one_except_catches_every_family(make):
    error = make()
    assert isinstance(error, DivergenceError)
    assert isinstance(error, FloatingPointError)  # what NGVI's and the filters' always were
    try:
        raise error
    except DivergenceError as caught:  # anything else propagates and fails the test
        assert caught is error
    assert isinstance(error.step, int)


@pytest.mark.parametrize("make", [ERRORS["sampler"], ERRORS["vis"]], ids=["sampler", "vis"])
def test_sampler_errors_stay_runtime_errors_and_pickle(make):
    # `except RuntimeError` callers (and Pyro's trace handler, which re-raises RuntimeErrors
    # raised inside a model or guide) keep working.
    error = make()
    assert isinstance(error, RuntimeError)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error)
    assert (copy.step, copy.sites, copy.particles) == (error.step, error.sites, error.particles)


def test_divergence_error_is_exported():
    assert "DivergenceError" in pyro_ext.infer.__all__
    assert pyro_ext.infer.DivergenceError is DivergenceError
