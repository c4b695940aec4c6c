"""Baum-Welch: exact E-step statistics (brute-force enumeration), the M-step of hmmlearn
from the same start, recovery of simulated parameters, missing values, fixed parameters."""

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_hmm import _log_joints, _model  # same directory: pytest puts it on sys.path

from pyro_ext.timeseries import HiddenMarkovModel, fit_hmm_em, hmm_expected_statistics


def _brute_statistics(init, trans, obs, mask=None):
    """Posterior marginals and per-step two-slice marginals of one series, by enumeration."""
    paths, joints = _log_joints(init, trans, obs, mask)
    post = torch.softmax(joints, 0)
    num_steps, num_states = obs.shape
    gamma = torch.zeros(num_steps, num_states, dtype=obs.dtype)
    xi = torch.zeros(max(num_steps - 1, 0), num_states, num_states, dtype=obs.dtype)
    for path, weight in zip(paths.tolist(), post):
        for t in range(num_steps):
            gamma[t, path[t]] += weight
        for t in range(num_steps - 1):
            xi[t, path[t], path[t + 1]] += weight
    return gamma, xi


@settings(max_examples=30, deadline=None)
@given(
    num_states=st.integers(1, 3),
    num_steps=st.integers(1, 5),
    batch=st.sampled_from([(), (2,)]),
    time_varying=st.booleans(),
    shared_trans=st.booleans(),
    masked=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_expected_statistics_equal_enumeration(
    num_states, num_steps, batch, time_varying, shared_trans, masked, seed
):
    init, trans, obs = _model(seed, num_states, num_steps, batch, time_varying)
    shared_trans = shared_trans and bool(batch) and not time_varying
    if shared_trans:
        trans = trans[0]  # one matrix for every series: counts sum over the batch
    mask = None
    if masked:
        mask = torch.rand(batch + (num_steps,), generator=torch.Generator().manual_seed(seed)) < 0.6
    stats = hmm_expected_statistics(init, trans, obs, mask)
    assert stats.posterior.shape == batch + (num_steps, num_states)
    assert stats.transition_counts.shape == trans.shape
    expected_counts = torch.zeros(trans.shape, dtype=obs.dtype)
    for idx in itertools.product(*map(range, batch)):
        series_trans = trans if shared_trans else trans[idx]
        gamma, xi = _brute_statistics(
            init[idx], series_trans, obs[idx], None if mask is None else mask[idx]
        )
        assert torch.allclose(stats.posterior[idx], gamma, atol=1e-10)
        counts = xi if time_varying else xi.sum(0)
        if shared_trans:
            expected_counts += counts
        else:
            expected_counts[idx] = counts
    assert torch.allclose(stats.transition_counts, expected_counts, atol=1e-10)


def _simulate(trans, emit, num_steps, seed):
    generator = torch.Generator().manual_seed(seed)
    z = [0]
    for _ in range(num_steps - 1):
        z.append(int(torch.multinomial(trans[z[-1]], 1, generator=generator)))
    z = torch.tensor(z)
    return emit(z, generator)


TRANS = torch.tensor([[0.9, 0.05, 0.05], [0.1, 0.8, 0.1], [0.05, 0.15, 0.8]], dtype=torch.float64)


@pytest.mark.parametrize("emission", ["categorical", "poisson"])
def test_em_iterations_equal_hmmlearn_from_the_same_start(emission):
    # hmmlearn's priors default to none for these families: both run maximum likelihood.
    hmm = pytest.importorskip("hmmlearn.hmm")
    if emission == "categorical":
        probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]]).double()
        # Symbols as float64, so that both libraries compute in double precision.
        y = _simulate(TRANS, lambda z, g: torch.multinomial(probs[z], 1, generator=g)[:, 0], 400, 0)
        y = y.double()
        start = {
            "emission_probs": torch.tensor([[0.5, 0.3, 0.2], [0.3, 0.4, 0.3], [0.2, 0.3, 0.5]])
        }
        peer = hmm.CategoricalHMM(3, n_features=3, init_params="", params="ste")
        peer.emissionprob_ = start["emission_probs"].numpy()
    else:
        rates = torch.tensor([1.0, 5.0, 12.0]).double()
        y = _simulate(TRANS, lambda z, g: torch.poisson(rates[z], generator=g), 400, 1)
        start = {"emission_rates": torch.tensor([2.0, 4.0, 8.0])}
        peer = hmm.PoissonHMM(3, init_params="", params="stl")
        peer.lambdas_ = start["emission_rates"].numpy()[:, None]
    start["init_probs"] = torch.tensor([0.5, 0.3, 0.2])
    start["transition_probs"] = torch.tensor([[0.6, 0.2, 0.2], [0.3, 0.5, 0.2], [0.2, 0.2, 0.6]])
    start = {name: value.double() for name, value in start.items()}  # both in float64
    if emission == "categorical":
        peer.emissionprob_ = start["emission_probs"].numpy()
    else:
        peer.lambdas_ = start["emission_rates"].numpy()[:, None]
    peer.startprob_ = start["init_probs"].numpy()
    peer.transmat_ = start["transition_probs"].numpy()
    model = HiddenMarkovModel(3, emission, num_symbols=3 if emission == "categorical" else None)
    for iterations in (1, 5):
        ours = model.fit(y, init=start, num_restarts=1, max_iterations=iterations, tolerance=1e-12)
        theirs = type(peer)(**peer.get_params()).set_params(n_iter=iterations, tol=0.0)
        for name in ("startprob_", "transmat_", "emissionprob_", "lambdas_"):
            if hasattr(peer, name):
                setattr(theirs, name, getattr(peer, name))
        if emission == "categorical":
            theirs.n_features = 3
        theirs.fit(y.long().numpy()[:, None] if emission == "categorical" else y.numpy()[:, None])
        assert ours.num_iterations == iterations
        np.testing.assert_allclose(ours.params["init_probs"], theirs.startprob_, atol=1e-10)
        np.testing.assert_allclose(ours.params["transition_probs"], theirs.transmat_, atol=1e-10)
        if emission == "categorical":
            np.testing.assert_allclose(
                ours.params["emission_probs"], theirs.emissionprob_, atol=1e-10
            )
        else:
            np.testing.assert_allclose(
                ours.params["emission_rates"], theirs.lambdas_[:, 0], rtol=1e-8
            )
        data = y.long().numpy()[:, None] if emission == "categorical" else y.numpy()[:, None]
        # 400 terms summed in different orders: 1e-9 relative.
        assert ours.log_likelihood == pytest.approx(theirs.score(data), rel=1e-9)


def test_default_fit_recovers_a_simulated_gaussian_hmm():
    locs, scales = torch.tensor([-2.0, 0.0, 3.0]).double(), torch.tensor([0.5, 0.4, 0.6]).double()
    y = _simulate(
        TRANS, lambda z, g: locs[z] + scales[z] * torch.randn(len(z), generator=g).double(), 3000, 2
    )
    fit = HiddenMarkovModel(3, "gaussian").fit(y)
    assert fit.converged
    order = fit.params["emission_loc"].argsort()
    assert torch.allclose(fit.params["emission_loc"][order], locs, atol=0.1)
    assert torch.allclose(fit.params["emission_scale"][order], scales, atol=0.05)
    trans = fit.params["transition_probs"][order][:, order]
    assert torch.allclose(trans, TRANS, atol=0.05)
    # The kept start is the best, and its log-likelihood is the model's at its parameters.
    assert fit.log_likelihood == max(fit.restart_log_likelihoods)
    model = HiddenMarkovModel(3, "gaussian")
    exact = float(model.distribution(fit.params, y).log_prob(y))
    assert fit.log_likelihood == pytest.approx(exact, rel=1e-10)


def test_missing_values_several_series_and_fixed_parameters():
    rates = torch.tensor([2.0, 9.0]).double()
    trans = torch.tensor([[0.9, 0.1], [0.2, 0.8]]).double()
    y = torch.stack(
        [
            _simulate(trans, lambda z, g: torch.poisson(rates[z], generator=g), 500, s)
            for s in (3, 4)
        ]
    )
    y[0, 10:20] = float("nan")
    fixed = torch.tensor([0.5, 0.5]).double()
    model = HiddenMarkovModel(2, "poisson", init_probs=fixed)
    fit = model.fit(y)
    assert torch.equal(fit.params["init_probs"], fixed)
    order = fit.params["emission_rates"].argsort()
    assert torch.allclose(fit.params["emission_rates"][order], rates, rtol=0.1)
    exact = float(model.distribution(fit.params, y).log_prob(y).sum())
    assert fit.log_likelihood == pytest.approx(exact, rel=1e-10)


def test_fit_refuses_what_it_cannot_fit():
    y = torch.tensor([0.0, 1.0, 1.0])
    custom = HiddenMarkovModel(2, emission=lambda: torch.distributions.Normal(torch.zeros(2), 1.0))
    with pytest.raises(ValueError, match="closed-form"):
        custom.fit(y)
    with pytest.raises(ValueError, match="no observed value"):
        fit_hmm_em(torch.full((4,), float("nan")), 2, "gaussian")
    with pytest.raises(TypeError, match="y must be a torch.Tensor"):
        fit_hmm_em([0.0, 1.0], 2, "gaussian")
    with pytest.raises(TypeError, match="y must be a torch.Tensor"):
        HiddenMarkovModel(2, "gaussian").fit([0.0, 1.0])
    with pytest.raises(TypeError, match="num_restarts must be an integer"):
        fit_hmm_em(y, 2, "gaussian", num_restarts=1.5)
    with pytest.raises(ValueError, match="emission="):
        fit_hmm_em(y, 2, "student")


@pytest.mark.parametrize(
    "emission, y, message",
    [
        ("categorical", [0.0, 1.5, 2.0], r"integer symbols in \[0, 3\).*got 1.5 at index 1"),
        ("categorical", [0.0, 1.0, 3.0], r"integer symbols in \[0, 3\).*got 3.0 at index 2"),
        ("poisson", [2.0, -1.0, 0.0], r"non-negative integer counts.*got -1.0 at index 1"),
        ("poisson", [2.0, 0.5, 0.0], r"non-negative integer counts.*got 0.5 at index 1"),
        ("gaussian", [0.3, float("inf"), 1.0], r"finite values.*got inf at index 1"),
    ],
)
def test_fit_hmm_em_refuses_values_outside_the_emissions_support(emission, y, message):
    # Named as HiddenMarkovModel.fit names them (one check for both); a fractional symbol
    # was truncated silently before, a symbol out of range failed deep in the recursions.
    y = torch.tensor(y)
    with pytest.raises(ValueError, match=message):
        fit_hmm_em(y, 2, emission, num_symbols=3)
    with pytest.raises(ValueError, match=message):
        HiddenMarkovModel(2, emission, num_symbols=3).fit(y)


def test_fit_hmm_em_needs_num_symbols_for_categorical_emissions():
    with pytest.raises(TypeError, match="num_symbols must be an integer"):
        fit_hmm_em(torch.tensor([0.0, 1.0, 2.0]), 2, "categorical")


@pytest.mark.parametrize("emission", ["categorical", "poisson", "gaussian"])
def test_the_precomputed_emission_terms_equal_torch_distributions_log_prob(emission):
    # EM's emission log-densities are computed from terms made once per fit (log y! for the
    # Poisson); they equal torch.distributions' log_prob at every iteration's parameters,
    # with 0 at a missing value.
    from pyro_ext.timeseries.em import _EmissionTerms

    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (2, 50), generator=g).double()
    if emission == "gaussian":
        y = torch.randn(2, 50, generator=g, dtype=torch.float64)
    y[0, 7] = y[1, 0] = float("nan")
    present = ~torch.isnan(y)
    params = {
        "emission_probs": torch.rand(3, 4, generator=g, dtype=torch.float64).softmax(-1),
        "emission_rates": torch.tensor([0.5, 2.0, 7.0], dtype=torch.float64),
        "emission_loc": torch.tensor([-1.0, 0.2, 1.5], dtype=torch.float64),
        "emission_scale": torch.tensor([0.3, 1.0, 2.5], dtype=torch.float64),
    }
    filled = torch.where(present, y, torch.zeros_like(y)).unsqueeze(-1)
    if emission == "categorical":
        expected = torch.distributions.Categorical(params["emission_probs"]).log_prob(filled)
    elif emission == "poisson":
        expected = torch.distributions.Poisson(params["emission_rates"]).log_prob(filled)
    else:
        expected = torch.distributions.Normal(
            params["emission_loc"], params["emission_scale"]
        ).log_prob(filled)
    expected = torch.where(present.unsqueeze(-1), expected, torch.zeros_like(expected))
    got = _EmissionTerms(emission, y, present).log_probs(params)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
    assert bool((got[0, 7] == 0).all()) and bool((got[1, 0] == 0).all())
