"""
The observed-data contract of the shared potential (issue 32, "every wrong input refused"):
every entry point built on :class:`~pyro_ext.infer.potential.ParticlePotential` (the SG-MCMC
kernels, natural-gradient VI, the online filters, step-size tuning) refuses, at set-up,
observations its model cannot take: outside the distribution's support, of an integer
dtype where the distribution needs floats, of a shape that would broadcast silently,
empty, or with a plate that subsamples more rows than it has. The error is a
``ValueError`` (``TypeError`` for the dtype) naming the observed site and the model
argument, not a torch error from inside the model, and not a silently wrong posterior.
"""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyro_ext.infer import MCMC, SGLD, NaturalGradientVI, tune_step_size
from pyro_ext.infer.potential import density
from pyro_ext.online import BONG
from pyro_ext.timeseries import DLM, DLMDistribution, LocalLevel

N = 8
SETTINGS = settings(max_examples=20, deadline=None, derandomize=True)


# -- models -------------------------------------------------------------------------------


def linear(x, y=None):
    """The issue's model: w ~ N(0, I_3), y ~ N(x @ w, 0.5) in a plate over the rows of x."""
    w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]):
        return pyro.sample("y", dist.Normal(x @ w, 0.5), obs=y)


def logistic(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]):
        return pyro.sample("y", dist.Bernoulli(logits=x @ w), obs=y)


def poisson(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]):
        return pyro.sample("y", dist.Poisson((x @ w).clamp(-10, 10).exp()), obs=y)


def categorical(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(3, 4), 1.0).to_event(2))
    with pyro.plate("data", x.shape[0]):
        return pyro.sample("y", dist.Categorical(logits=x @ w), obs=y)


def rows_of_y(x, y):
    """A plate sized by y: a y of the wrong length fails inside the model's run."""
    w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    with pyro.plate("data", len(y)):
        pyro.sample("y", dist.Normal(x @ w, 0.5), obs=y)


def subsampled(x, y, batch=4):
    w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=batch) as i:
        pyro.sample("y", dist.Normal(x[i] @ w, 0.5), obs=y[i])


def data(n=N):
    x = torch.randn(n, 3)
    return x, x @ torch.tensor([1.0, -1.0, 0.5]) + 0.5 * torch.randn(n)


def labels(n=N):
    return torch.randn(n, 3), torch.randint(0, 2, (n,)).float()


# -- the public entry points ----------------------------------------------------------------


def sgld(model, *args):
    SGLD(model, step_size=1e-3, num_particles=2).setup(0, *args)


def sgld_mcmc(model, *args):
    kernel = SGLD(model, step_size=1e-3, num_particles=2)
    MCMC(kernel, num_samples=2, warmup_steps=0, disable_progbar=True).run(*args)


def ngvi(model, *args):
    NaturalGradientVI(model, ess=N).step(*args)


def bong(model, *args):
    BONG(model).update(*args)


ENTRIES = {"sgld": sgld, "ngvi": ngvi, "bong": bong}


def entries(*names):
    return pytest.mark.parametrize("fit", [ENTRIES[n] for n in names], ids=names)


# -- out of the support -----------------------------------------------------------------------


@entries("sgld", "ngvi", "bong")
def test_bernoulli_label_2_is_refused(fit):
    x, y = labels()
    y[3] = 2.0
    # The site, the argument, the first bad index and value, the support: in any order.
    with pytest.raises(ValueError, match=r"(?=.*'y')(?=.*index \(3,\))(?=.*2\.0)(?=.*Boolean)"):
        fit(logistic, x, y)


@entries("sgld", "ngvi", "bong")
def test_poisson_negative_count_is_refused(fit):
    x, _ = data()
    y = torch.ones(N)
    y[5] = -1.0
    with pytest.raises(ValueError, match=r"(?=.*'y')(?=.*index \(5,\))(?=.*-1\.0)(?=.*Poisson)"):
        fit(poisson, x, y)


@entries("sgld", "ngvi", "bong")
def test_poisson_fractional_count_is_refused(fit):
    x, _ = data()
    y = torch.ones(N)
    y[0] = 0.5
    with pytest.raises(ValueError, match=r"(?=.*'y')(?=.*index \(0,\))(?=.*0\.5)(?=.*Poisson)"):
        fit(poisson, x, y)


@entries("sgld", "ngvi", "bong")
def test_categorical_label_7_of_4_categories_is_refused(fit):
    x = torch.randn(N, 3)
    y = torch.zeros(N, dtype=torch.long)
    y[2] = 7
    with pytest.raises(
        ValueError, match=r"(?=.*'y')(?=.*index \(2,\))(?=.*\b7\b)(?=.*Categorical)"
    ):
        fit(categorical, x, y)


def test_sgld_run_through_mcmc_refuses_out_of_support_data():
    x, y = labels()
    y[1] = 2.0
    with pytest.raises(ValueError, match=r"site 'y' \(the model's argument 'y'\)"):
        sgld_mcmc(logistic, x, y)


def test_tune_step_size_refuses_out_of_support_data():
    x, y = labels()
    y[1] = 2.0
    with pytest.raises(ValueError, match=r"site 'y' \(the model's argument 'y'\)"):
        tune_step_size(lambda h: SGLD(logistic, step_size=h), x, y, candidates=[1e-3])


# -- dtype --------------------------------------------------------------------------------------


@entries("sgld", "ngvi", "bong")
def test_int64_labels_for_bernoulli_are_refused_with_a_type_error(fit):
    x, y = labels()
    with pytest.raises(TypeError, match=r"site 'y' \(the model's argument 'y'\).*int64.*y\.float"):
        fit(logistic, x, y.long())


def test_float_categorical_labels_are_accepted_when_integral_as_categorical_log_prob_does():
    # Categorical.log_prob takes integral floats (it casts them), so they are fine here too;
    # a fractional "label" is outside the support.
    x = torch.randn(N, 3)
    y = torch.randint(0, 4, (N,))
    sgld(categorical, x, y.float())
    assert torch.equal(
        dist.Categorical(logits=torch.zeros(4)).log_prob(y.float()),
        dist.Categorical(logits=torch.zeros(4)).log_prob(y),
    )
    y = y.float()
    y[4] = 1.5
    with pytest.raises(ValueError, match=r"'y'.*Categorical.*index \(4,\)"):
        sgld(categorical, x, y)


# -- shapes -------------------------------------------------------------------------------------


@entries("sgld", "ngvi", "bong")
def test_y_expanded_to_n_by_n_outer_product_is_refused(fit):
    x, y = data()
    with pytest.raises(
        ValueError, match=r"site 'y' \(the model's argument 'y'\) has shape \(8, 8\)"
    ):
        fit(linear, x, y[:, None].expand(N, N))


@entries("sgld", "bong")
def test_y_of_one_row_broadcast_up_to_the_plate_is_refused(fit):
    x, y = data()
    with pytest.raises(ValueError, match=r"'y'\) has shape \(1,\).*shape \(8,\).*broadcast"):
        fit(linear, x, y[:1])


@entries("sgld", "ngvi", "bong")
def test_wrong_length_y_is_refused_naming_both_shapes(fit):
    x, y = data(5)
    with pytest.raises(ValueError, match=r"'y'\) has shape \(4,\).*shape \(5,\)"):
        fit(linear, x, y[:4])


@entries("sgld", "ngvi")
def test_wrong_length_y_failing_inside_the_model_is_refused_naming_the_arguments(fit):
    # The plate takes its size from y: torch's "size of tensor a (5) must match" is raised
    # in the model's first run, before any trace exists.
    x, y = data(5)
    with pytest.raises(ValueError, match=r"'x' of shape \(5, 3\), 'y' of shape \(4,\)"):
        fit(rows_of_y, x, y[:4])


# -- empty data, subsample size -----------------------------------------------------------------


@entries("sgld", "ngvi", "bong")
def test_empty_data_n0_is_refused(fit):
    x, y = data(0)
    with pytest.raises(ValueError, match=r"(?=.*'data'|.*'y')(?=.*empty)"):
        fit(linear, x, y)
    if fit is not bong:  # the filter reads its batch itself, and says so its own way
        with pytest.raises(ValueError, match=r"plate 'data' has size 0.*empty.*'y' of shape"):
            fit(linear, x, y)


def test_empty_observation_without_a_plate_is_refused():
    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y)

    with pytest.raises(ValueError, match=r"site 'obs' \(the model's argument 'y'\) is empty"):
        sgld(model, torch.zeros(0))


@entries("sgld", "ngvi")
def test_subsample_size_larger_than_n_is_refused(fit):
    x, y = data()
    with pytest.raises(ValueError, match=r"plate 'data'.*subsample_size=50.*size 8"):
        fit(lambda x, y: subsampled(x, y, batch=50), x, y)


def test_out_of_support_row_that_no_set_up_minibatch_draws_is_found():
    # The set-up trace holds one minibatch; the contract is checked on every row.
    x, _ = data()
    y = torch.ones(N)
    y[6] = -1.0

    def model(x, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
        with pyro.plate("data", N, subsample_size=2) as i:
            pyro.sample("y", dist.Poisson((x[i] @ w).exp()), obs=y[i])

    with pytest.raises(ValueError, match=r"'y'.*Poisson.*rows 6-7 of plate 'data'"):
        sgld(model, x, y)


# -- generated bad data ------------------------------------------------------------------------


def _family_model(family):
    def model(y):
        w = pyro.sample("w", dist.Normal(torch.zeros(2), 1.0).to_event(1))
        with pyro.plate("data", N):
            if family == "bernoulli":
                fn = dist.Bernoulli(logits=w[0].expand(N))
            elif family == "poisson":
                fn = dist.Poisson(w[0].exp().expand(N))
            elif family == "categorical":
                fn = dist.Categorical(logits=torch.stack([w[0], w[1], -w[0], -w[1]]).expand(N, 4))
            elif family == "beta":
                fn = dist.Beta(w[0].exp().expand(N), w[1].exp())
            elif family == "exponential":
                fn = dist.Exponential(w[0].exp().expand(N))
            elif family == "gamma":
                fn = dist.Gamma(w[0].exp().expand(N), w[1].exp())
            else:
                fn = dist.Binomial(total_count=5, logits=w[0].expand(N))
            pyro.sample("y", fn, obs=y)

    return model


VALID = {
    "bernoulli": torch.ones(N),
    "poisson": torch.full((N,), 3.0),
    "categorical": torch.full((N,), 2),
    "beta": torch.full((N,), 0.5),
    "exponential": torch.full((N,), 2.0),
    "gamma": torch.full((N,), 2.0),
    "binomial": torch.full((N,), 4.0),
}
finite = st.floats(-1e6, 1e6, allow_nan=False, width=32)  # as torch.float32 holds them
OUTSIDE = {
    "bernoulli": finite.filter(lambda v: v not in (0.0, 1.0)),
    "poisson": finite.filter(lambda v: v < 0 or v != math.floor(v)),
    "categorical": st.integers(-1000, 1000).filter(lambda v: not 0 <= v <= 3),
    "beta": finite.filter(lambda v: not 0 <= v <= 1),
    "exponential": st.floats(-1e6, -0.5, width=32),
    "gamma": st.floats(-1e6, -0.5, width=32),
    "binomial": finite.filter(lambda v: not (0 <= v <= 5 and v == math.floor(v))),
}


@SETTINGS
@given(
    case=st.sampled_from(sorted(VALID)).flatmap(lambda f: st.tuples(st.just(f), OUTSIDE[f])),
    position=st.integers(0, N - 1),
)
def test_random_out_of_support_values_are_refused_at_their_index(case, position):
    family, value = case
    y = VALID[family].clone()
    y[position] = value
    with pytest.raises(ValueError, match=rf"'y'.*outside the support.*index \({position},\)"):
        sgld(_family_model(family), y)


def test_valid_values_of_every_family_are_accepted():
    for family, y in VALID.items():
        sgld(_family_model(family), y)


@SETTINGS
@given(
    positions=st.lists(st.integers(0, N - 1), min_size=1, max_size=4, unique=True),
    bad=st.sampled_from([math.nan, math.inf, -math.inf]),
)
def test_random_nan_or_inf_positions_are_refused_at_the_first(positions, bad):
    x, y = data()
    y[positions] = bad
    with pytest.raises(ValueError, match=rf"'y' has .* first at index \({min(positions)},\)"):
        sgld(linear, x, y)


@SETTINGS
@given(shape=st.sampled_from([(1,), (N, N), (1, N), (N, 1), (2, N), (3, 1, N), (N, 2)]))
def test_random_broadcastable_wrong_shapes_are_refused(shape):
    x, _ = data()
    y = torch.randn(shape)
    with pytest.raises(ValueError, match=r"site 'y' \(the model's argument 'y'\) has shape"):
        sgld(linear, x, y)


# -- still accepted ----------------------------------------------------------------------------


def test_valid_models_are_still_accepted():
    x, y = data()

    def scalar_parameter(y):  # the Pyro idiom: a scalar mean observing a vector, no plate
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y)

    def to_event(x, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
        pyro.sample("y", dist.Normal(x @ w, 0.5).to_event(1), obs=y)

    def masked(x, y, mask):  # masked-out entries may hold anything (here -1 counts)
        w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
        with pyro.plate("data", x.shape[0]), pyro.poutine.mask(mask=mask):
            pyro.sample("y", dist.Poisson((x @ w).exp()), obs=y)

    def obs_mask(x, y, mask):
        w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(x @ w, 0.5), obs=y, obs_mask=mask)

    def factor(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        pyro.factor("penalty", -(mu**2))
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y)

    def missing(y):  # DLMDistribution's support admits NaN, a missing observation
        sigma = pyro.sample("sigma", dist.LogNormal(y.new_zeros(()), 1.0))
        dlm = DLM(LocalLevel(y.new_tensor(0.3)), observation_scale=sigma)
        pyro.sample("obs", DLMDistribution(dlm, len(y)), obs=y)

    counts = torch.ones(N)
    counts[2] = -1.0
    mask = torch.ones(N, dtype=torch.bool)
    mask[2] = False
    series = torch.randn(20, dtype=torch.float64).cumsum(0)
    series[[3, 11]] = math.nan
    sgld(scalar_parameter, y)
    sgld(to_event, x, y)
    sgld(subsampled, x, y)
    sgld(masked, x, counts, mask)
    sgld(obs_mask, x, y, mask)
    sgld(factor, y)
    sgld(missing, series)
    ngvi(linear, x, y)
    bong(linear, x, y)


def test_bong_still_skips_nan_observations_as_missing():
    x, y = labels()
    y[3] = math.nan
    BONG(logistic).update(x, y)


def test_new_data_of_the_same_shapes_are_checked_again():
    x, y = labels()
    kernel = SGLD(logistic, step_size=1e-3, num_particles=2)
    kernel.setup(0, x, y)
    kernel.set_data(x, y.clone())  # fine: the same contract
    bad = y.clone()
    bad[5] = 2.0
    with pytest.raises(ValueError, match=r"(?=.*'y')(?=.*index \(5,\))(?=.*Boolean)"):
        kernel.set_data(x, bad)


# -- no per-step cost -------------------------------------------------------------------------


def test_unchanged_data_are_checked_once_not_at_every_step(monkeypatch):
    calls = []
    check = density.check_model_data
    monkeypatch.setattr(
        density, "check_model_data", lambda *a, **k: (calls.append(1), check(*a, **k))[1]
    )
    x, y = data()
    vi = NaturalGradientVI(linear, ess=N)
    vi.step(x, y)
    at_setup = len(calls)
    for _ in range(3):
        vi.step(x, y)
    assert at_setup >= 1 and len(calls) == at_setup
    y2 = y.clone()
    y2[0] = 2.0  # new data: checked once more
    vi.step(x, y2)
    assert len(calls) == at_setup + 1
