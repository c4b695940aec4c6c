"""RetailBSTS(**THESIS_MODEL, selection="point_mass"): beta integrated out exactly, indicators by Gibbs."""

import itertools

import pyro
import pytest
import torch

from pyro_ext.models.bsts import THESIS_MODEL, RetailBSTS, simulate_retail

torch.set_num_threads(1)


def _set_up(
    noise, p_missing=(), variant="RF", expected_model_size=2, weeks=80, seed=3, model=THESIS_MODEL
):
    """A model read for data (as fit does), the standardised data and one prior draw."""
    d = simulate_retail(num_weeks=weeks, seed=seed, noise=noise)
    m = RetailBSTS(**model, variant=variant, expected_model_size=expected_model_size, noise=noise)
    m.fit(
        d.sales,
        d.spend,
        d.covariates,
        num_samples=2,
        warmup_steps=2,
        num_particles=2,
        map_init_steps=1,
        rhat_target=None,
    )
    y, u, X = (t.clone() for t in m._data)
    for week in p_missing:
        y[week] = float("nan")
    trace = pyro.poutine.trace(m.model).get_trace(y, u, X)
    values = {
        name: site["value"]
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"]
    }
    return m, (y, u, X), values


# The three tests that read this fit (200 steps of 4 particles on 104 weeks, about 30 s of CPU)
# are in the integration run (`make test-integration`, CI); the default run keeps
# test_point_mass_draws_are_exactly_zero_where_excluded, on a short fit.
@pytest.fixture(scope="module")
def point_mass_fit():
    d = simulate_retail(num_weeks=104, seed=21, noise="gaussian")
    m = RetailBSTS(**THESIS_MODEL, variant="RF", expected_model_size=2, noise="gaussian")
    m.fit(
        d.sales,
        d.spend,
        d.covariates,
        num_samples=100,
        warmup_steps=100,
        num_particles=4,
        seed=0,
        covariate_names=d.covariate_names,
    )
    return m, d


@pytest.mark.parametrize("noise", ["gaussian", "student_t"])
def test_collapsed_likelihood_equals_kalman_with_regression_states(noise):
    # q and beta integrated out (the goodwill is linear in q given delta): the dense
    # whitening (Sylvester + Woodbury) against the Kalman filter with static regression
    # states on [adstocked spend, X] * gamma, prior N(0, 1) (q_scale = slab_scale = 1).
    m, (y, u, X), values = _set_up(noise, p_missing=(5, 40))
    params = m._params_of(values)
    design = m._design(params, u, X)
    precision = params.get("obs_precision")
    stats = m._whitened_statistics(m.state_space(params), y, design, precision)
    ones = torch.ones(5, dtype=torch.float64)
    for gamma in ([1.0, 0, 0, 1, 0, 1, 1], [0.0] * 7, [1.0] * 7):
        gamma = torch.cat([ones, torch.tensor(gamma, dtype=torch.float64)])
        collapsed = m._collapsed_log_likelihood(stats, gamma)
        kalman = m.state_space(params, design * gamma).log_likelihood(y, precision)
        assert torch.allclose(collapsed, kalman, rtol=1e-9, atol=1e-8)


@pytest.mark.integration  # reads point_mass_fit (see there)
def test_collapsed_gibbs_move_matches_enumeration(point_mass_fit):
    # theta fixed at a posterior draw: the indicator scan's stationary law is
    # p(gamma | theta, y), here enumerated over all 2^7 models with the Kalman likelihood
    # of each (regression states on [adstocked spend, X * gamma]).
    m, _ = point_mass_fit
    y, u, X = m._data
    sites = ("delta", "noise_scales", "sigma_level", "sigma_season")
    values = {name: m.samples[name][7] for name in sites}
    params = m._params_of(values)
    design = m._design(params, u, X)
    pi = m._pi_b
    ones = torch.ones(5, dtype=torch.float64)
    models = torch.tensor(list(itertools.product([0.0, 1.0], repeat=7)), dtype=torch.float64)
    log_posterior = torch.stack(
        [
            m.state_space(params, design * torch.cat([ones, g])).log_likelihood(y)
            + torch.distributions.Bernoulli(pi).log_prob(g).sum()
            for g in models
        ]
    )
    exact = (log_posterior.softmax(0)[:, None] * models).sum(0)
    # The check bites: some covariate's inclusion is uncertain given this theta.
    assert ((exact > 0.1) & (exact < 0.9)).any(), exact
    num_particles = 200
    batch = {n: v.expand(num_particles, *v.shape).clone() for n, v in values.items()}
    batch["gamma"] = torch.zeros(num_particles, 7, dtype=torch.float64)
    move = m._indicator_move("gamma")
    frequency = torch.zeros(7, dtype=torch.float64)
    sweeps = 40
    with pyro.validation_enabled(False):
        for sweep in range(sweeps + 5):
            batch["gamma"] = move(batch, y, u, X)
            if sweep >= 5:
                frequency += batch["gamma"].mean(0) / sweeps
    assert (frequency - exact).abs().max() < 0.03, (frequency, exact)


@pytest.mark.integration  # reads point_mass_fit (see there)
def test_point_mass_is_the_default_and_reports_indicator_draws(point_mass_fit):
    m, d = point_mass_fit
    assert m.selection == "point_mass" and m.discrete_sites == ["gamma"]
    gamma, beta = m.samples["gamma"], m.samples["beta"]
    assert set(gamma.unique().tolist()) <= {0.0, 1.0}
    # beta is exactly 0 in the draws that exclude a covariate, and nonzero elsewhere.
    assert (beta[gamma == 0] == 0).all() and (beta[gamma == 1] != 0).all()
    assert torch.equal(m.inclusion_probabilities(), gamma.mean(0))
    draws = m.coefficient_draws()
    assert draws["beta"].shape == gamma.shape
    assert torch.equal(draws["beta"] == 0, gamma == 0)
    rhat = m.rhat()
    assert {"gamma", "beta", "delta", "q"} <= set(rhat)
    assert all(torch.isfinite(v).all() for v in rhat.values())
    assert m.channel_inclusion_probabilities().tolist() == [1.0] * 5


@pytest.mark.integration  # a recovery; reads point_mass_fit (see there)
def test_point_mass_finds_the_strong_covariate_and_drops_random_walks(point_mass_fit):
    m, d = point_mass_fit
    inclusion = dict(zip(d.covariate_names, m.inclusion_probabilities().tolist()))
    assert inclusion["hols"] > 0.9  # beta 2.5 noise sds
    for null in ("unemp_ix", "price_ix", "cc_ix"):  # random walks, beta 0
        assert inclusion[null] < 0.2, inclusion
    forecast = m.forecast(d.spend[:4], d.covariates[:4])
    assert forecast.shape[1] == 4 and torch.isfinite(forecast).all()


# In the integration run (`make test-integration`, CI): an end-to-end fit judged by its
# R-hat (about 13 s of CPU); test_bsts.py::test_variants_and_pi fits variant RA in the
# default run.
@pytest.mark.integration
def test_variant_ra_moves_channel_indicators_too():
    d = simulate_retail(num_weeks=60, seed=4, noise="gaussian")
    m = RetailBSTS(
        **THESIS_MODEL,
        variant="RA",
        expected_model_size=3,
        noise="gaussian",
        seasonal_harmonics=1,
    )
    m.fit(d.sales, d.spend, d.covariates, num_samples=20, warmup_steps=20, num_particles=2)
    assert m.discrete_sites == ["gamma", "gamma_q"]
    channels = m.channel_inclusion_probabilities()
    assert channels.shape == (5,) and ((channels >= 0) & (channels <= 1)).all()
    # q is drawn from its exact conditional: 0 where a channel is excluded.
    assert (m.samples["q"][m.samples["gamma_q"] == 0] == 0).all()
    assert (m.samples["q"][m.samples["gamma_q"] == 1] != 0).all()
    assert float(max(r.max() for r in m.rhat().values())) < 1.5


def test_point_mass_draws_are_exactly_zero_where_excluded():
    # The default run's check of the point-mass draws (the tests on point_mass_fit are in
    # the integration run): beta is exactly 0 where gamma excludes a covariate and nonzero
    # elsewhere, in the samples and in coefficient_draws; inclusion is gamma's mean.
    d = simulate_retail(num_weeks=40, seed=2, noise="gaussian")
    m = RetailBSTS(
        **THESIS_MODEL,
        variant="RF",
        expected_model_size=2,
        noise="gaussian",
        seasonal_harmonics=0,
    )
    m.fit(
        d.sales,
        d.spend,
        d.covariates,
        num_samples=10,
        warmup_steps=5,
        num_particles=2,
        map_init_steps=1,
        rhat_target=None,
    )
    assert m.selection == "point_mass" and m.discrete_sites == ["gamma"]
    gamma, beta = m.samples["gamma"], m.samples["beta"]
    assert gamma.shape == beta.shape == (20, 7)
    assert set(gamma.unique().tolist()) == {0.0, 1.0}  # both, so that the next line bites
    assert (beta[gamma == 0] == 0).all() and (beta[gamma == 1] != 0).all()
    assert torch.equal(m.inclusion_probabilities(), gamma.mean(0))
    draws = m.coefficient_draws()
    assert torch.equal(draws["beta"] == 0, gamma == 0)
    assert m.channel_inclusion_probabilities().tolist() == [1.0] * 5


def test_forced_covariates_need_no_indicators():
    d = simulate_retail(num_weeks=40, seed=2, noise="gaussian")
    m = RetailBSTS(
        **THESIS_MODEL,
        variant="RF",
        expected_model_size=7,
        noise="gaussian",
        seasonal_harmonics=0,
    )
    m.fit(d.sales, d.spend, d.covariates, num_samples=10, warmup_steps=10, num_particles=2)
    assert m.discrete_sites == []
    assert m.inclusion_probabilities().tolist() == [1.0] * 7
    assert m.samples["beta"].shape[-1] == 7 and (m.samples["beta"] != 0).all()


def test_methods_that_cannot_move_indicators_say_what_to_do():
    d = simulate_retail(num_weeks=30, seed=2, noise="gaussian")
    for method in ("nuts", "vis"):
        with pytest.raises(ValueError, match="selection='ssvs'"):
            RetailBSTS(**THESIS_MODEL, expected_model_size=2).fit(
                d.sales, d.spend, d.covariates, method=method
            )
    with pytest.raises(ValueError, match="selection must be one of"):
        RetailBSTS(**THESIS_MODEL, selection="spike")


def test_no_covariates_prepare_without_warnings():
    import warnings

    d = simulate_retail(num_weeks=30, seed=1, noise="gaussian")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, _, X = RetailBSTS(**THESIS_MODEL, noise="gaussian")._prepare(
            d.sales, d.spend, None, True
        )
    assert X.shape == (30, 0)


def test_unconverged_chains_are_reported():
    d = simulate_retail(num_weeks=40, seed=2, noise="gaussian")
    m = RetailBSTS(
        **THESIS_MODEL,
        variant="RF",
        expected_model_size=2,
        noise="gaussian",
        seasonal_harmonics=0,
    )
    with pytest.warns(RuntimeWarning, match="have not converged: the largest split-R-hat"):
        m.fit(
            d.sales,
            d.spend,
            d.covariates,
            num_samples=4,
            warmup_steps=2,
            num_particles=2,
            map_init_steps=1,
            rhat_target=1.0001,
            max_samples=4,
        )


@pytest.mark.parametrize(
    "variant, k, p, expected",
    [
        ("RF", 5, 2, 0.5),
        ("RF", 5, 7, 0.5),
        ("RF", 5, 20, 0.25),
        ("RA", 5, 2, 0.5),
        ("RA", 5, 15, 0.25),
    ],
)
def test_default_expected_model_size_adapts_to_the_candidates(variant, k, p, expected):
    # A fixed 5 gave pi = 1 with 2 candidate controls: every one "included" with
    # probability 1.0, silently. The default is min(5, n / 2) of the n candidates.
    m = RetailBSTS(variant=variant)
    m._holiday_idx = []
    pi_q, pi_b = m._priors_pi(k, p)
    assert torch.allclose(pi_b, torch.full((p,), expected, dtype=torch.float64))
    assert torch.allclose(pi_q, torch.full((k,), expected if variant == "RA" else 1.0).double())
    # Asked for, it is used as given (and refused above n by fit).
    asked = RetailBSTS(variant=variant, expected_model_size=2)
    asked._holiday_idx = []
    assert float(asked._priors_pi(k, p)[1][0]) == pytest.approx(
        min(1.0, 2 / (p if variant == "RF" else k + p))
    )


@pytest.mark.parametrize("noise", ["gaussian", "student_t"])
def test_non_negative_effects_are_sampled_and_beta_still_integrated_out(noise):
    # effects="non_negative" (the default): q is a HalfNormal site the sampler moves, its
    # goodwill is known given the draw, and the point mass integrates only beta out: the
    # collapsed likelihood of y - D on X * gamma is the Kalman filter's with static
    # regression states on X * gamma.
    m, (y, u, X), values = _set_up(noise, model={"spend_lag": 1})
    assert m.effects == "non_negative"
    trace = pyro.poutine.trace(m.model).get_trace(y, u, X)
    assert isinstance(trace.nodes["q"]["fn"].base_dist, pyro.distributions.HalfNormal)
    params = m._params_of(values)
    design = m._design(params, u, X)
    assert design.shape == X.shape  # only the covariates
    precision = params.get("obs_precision")
    resid = y - m._goodwill(params, u)
    stats = m._whitened_statistics(m.state_space(params), resid, design, precision)
    for gamma in ([1.0, 0, 0, 1, 0, 1, 1], [0.0] * 7, [1.0] * 7):
        gamma = torch.tensor(gamma, dtype=torch.float64)
        collapsed = m._collapsed_log_likelihood(stats, gamma)
        kalman = m.state_space(params, design * gamma).log_likelihood(resid, precision)
        assert torch.allclose(collapsed, kalman, rtol=1e-9, atol=1e-8)
    # The draws: q never negative; beta exactly 0 where excluded.
    draws = m.coefficient_draws()
    assert bool((draws["q"] >= 0).all())
    excluded = m.samples["gamma"] == 0
    assert bool((m.samples["beta"][excluded] == 0).all())
    # Without covariates there is nothing left to integrate out.
    d = simulate_retail(num_weeks=80, seed=3, noise=noise)
    b = RetailBSTS(variant="B", noise=noise, spend_lag=0, seasonal_harmonics=0).fit(
        d.sales,
        d.spend,
        None,
        num_samples=2,
        warmup_steps=2,
        num_particles=2,
        map_init_steps=1,
        rhat_target=None,
    )
    assert bool((b.coefficient_draws()["q"] >= 0).all()) and "beta" not in b.samples


def test_non_negative_effects_refused_with_the_channel_spike_and_slab():
    with pytest.raises(
        ValueError, match="effects='non_negative' cannot be combined with variant='RA'"
    ):
        RetailBSTS(variant="RA", effects="non_negative")
    assert RetailBSTS(variant="RA").effects == "real"
    with pytest.raises(TypeError, match="effects must be a string"):
        RetailBSTS(effects=1)
    with pytest.raises(ValueError, match="effects must be one of"):
        RetailBSTS(effects="positive")
