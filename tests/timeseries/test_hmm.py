"""
Ground-truth tests for :mod:`pyro_ext.timeseries.hmm`: brute-force enumeration over all
K^T paths, sequential recursions on long series, pyro's DiscreteHMM and hmmlearn.
"""

import itertools

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from pyro_ext.infer.tracing import trace_pure
from pyro_ext.timeseries.hmm import (
    HiddenMarkovDistribution,
    check_stochastic_matrix,
    hmm_filter,
    hmm_log_likelihood,
    hmm_predict,
    hmm_sample_paths,
    hmm_smooth,
    hmm_viterbi,
)


def _log_joints(init, trans, obs, mask=None):
    """All paths and their log joints log p(x, z) of one unbatched model."""
    num_steps, num_states = obs.shape
    log_init = torch.log_softmax(init, -1)
    log_trans = torch.log_softmax(trans, -1)
    if mask is not None:
        obs = obs.masked_fill(~mask[:, None], 0.0)
    paths = list(itertools.product(range(num_states), repeat=num_steps))
    joints = []
    for z in paths:
        total = log_init[z[0]] + obs[0, z[0]]
        for t in range(1, num_steps):
            step = log_trans[t - 1] if log_trans.dim() == 3 else log_trans
            total = total + step[z[t - 1], z[t]] + obs[t, z[t]]
        joints.append(total)
    return torch.tensor(paths), torch.stack(joints)


def _brute(init, trans, obs, mask=None):
    """log p(x), smoothed marginals, best path and its score, by enumeration."""
    paths, joints = _log_joints(init, trans, obs, mask)
    num_states = obs.shape[-1]
    post = torch.softmax(joints, 0)
    zeros = torch.zeros(num_states, dtype=obs.dtype)
    smoothed = torch.stack([zeros.index_add(0, paths[:, t], post) for t in range(obs.shape[0])])
    best = joints.argmax()
    return joints.logsumexp(0), smoothed, paths[best], joints[best]


def _model(seed, num_states, num_steps, batch, time_varying, dtype=torch.float64, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    trans_shape = batch + ((num_steps - 1,) if time_varying else ()) + (num_states, num_states)
    init = torch.randn(batch + (num_states,), generator=gen, dtype=dtype)
    trans = 2 * torch.randn(trans_shape, generator=gen, dtype=dtype)
    obs = 2 * torch.randn(batch + (num_steps, num_states), generator=gen, dtype=dtype)
    return init.to(device), trans.to(device), obs.to(device)


@settings(max_examples=40, deadline=None)
@given(
    num_states=st.integers(1, 3),
    num_steps=st.integers(1, 5),
    batch=st.sampled_from([(), (2,), (2, 1)]),
    time_varying=st.booleans(),
    masked=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
@pytest.mark.parametrize("engine", ["sequential", "scan"])
def test_matches_brute_force(
    run_on, engine, num_states, num_steps, batch, time_varying, masked, seed
):
    with run_on(engine):
        _check_brute_force(num_states, num_steps, batch, time_varying, masked, seed)


def _check_brute_force(num_states, num_steps, batch, time_varying, masked, seed):
    init, trans, obs = _model(seed, num_states, num_steps, batch, time_varying)
    mask = None
    if masked:
        mask = torch.rand(batch + (num_steps,), generator=torch.Generator().manual_seed(seed)) < 0.6
        obs = obs.masked_fill(~mask.unsqueeze(-1), float("nan"))  # masked NaN is allowed
    loglik = hmm_log_likelihood(init, trans, obs, mask)
    filtered = hmm_filter(init, trans, obs, mask)
    smoothed = hmm_smooth(init, trans, obs, mask)
    path, score = hmm_viterbi(init, trans, obs, mask)
    assert loglik.shape == score.shape == batch
    assert filtered.shape == smoothed.shape == batch + (num_steps, num_states)
    assert path.shape == batch + (num_steps,) and path.dtype == torch.long
    for idx in itertools.product(*map(range, batch)):
        args = [init[idx], trans[idx], obs[idx], None if mask is None else mask[idx]]
        expected_ll, expected_sm, best, best_score = _brute(*args)
        assert torch.allclose(loglik[idx], expected_ll, atol=1e-10)
        assert torch.allclose(smoothed[idx], expected_sm, atol=1e-10)
        assert torch.allclose(score[idx], best_score, atol=1e-10)
        # Ties aside, the path must be the argmax; in any case it must attain the score.
        paths, joints = _log_joints(*args)
        hit = (paths == path[idx]).all(-1)
        assert torch.allclose(joints[hit], best_score, atol=1e-10)
        for t in range(num_steps):
            trans_t = args[1][:t] if time_varying else args[1]
            prefix_mask = None if args[3] is None else args[3][: t + 1]
            _, prefix_sm, _, _ = _brute(args[0], trans_t, args[2][: t + 1], prefix_mask)
            assert torch.allclose(filtered[idx][t], prefix_sm[t], atol=1e-10)
        if not time_varying:
            pred = hmm_predict(*args[:3], num_steps=3, mask=args[3])
            probs = torch.softmax(args[1], -1)
            for h in range(3):
                expected = expected_sm[-1] @ torch.linalg.matrix_power(probs, h + 1)
                assert torch.allclose(pred[h], expected, atol=1e-10)


def test_core_on_device(device):
    init, trans, obs = _model(1, 3, 6, (2,), False, device=device)
    outputs = [
        hmm_log_likelihood(init, trans, obs),
        hmm_smooth(init, trans, obs),
        hmm_viterbi(init, trans, obs)[0],
        hmm_sample_paths(init, trans, obs, 3),
    ]
    for out in outputs:
        assert out.device == init.device
    expected_ll, expected_sm, best, _ = _brute(init[0].cpu(), trans[0].cpu(), obs[0].cpu())
    assert torch.allclose(hmm_log_likelihood(init, trans, obs)[0].cpu(), expected_ll, atol=1e-10)
    assert torch.allclose(hmm_smooth(init, trans, obs)[0].cpu(), expected_sm, atol=1e-10)
    assert (hmm_viterbi(init, trans, obs)[0][0].cpu() == best).all()


@pytest.mark.parametrize("engine", ["sequential", "scan"])
def test_float32_long_series_precision(device, run_on, engine):
    init, trans, obs = _model(2, 4, 3000, (), False, device=device)
    expected = hmm_log_likelihood(init, trans, obs)
    with run_on(engine):
        got = hmm_log_likelihood(init.float(), trans.float(), obs.float())
    assert got.dtype == torch.float32
    assert abs(got.double().item() - expected.item()) < 1e-5 * abs(expected.item())


def test_ffbs_matches_exact_posterior():
    init, trans, obs = _model(3, 2, 4, (), True)
    paths, joints = _log_joints(init, trans, obs)
    num_samples = 20000
    draws = hmm_sample_paths(init, trans, obs, num_samples)
    assert draws.shape == (num_samples, 4)
    codes = (draws * torch.tensor([8, 4, 2, 1])).sum(-1)
    counts = torch.bincount(codes, minlength=16).double()
    order = torch.argsort((paths * torch.tensor([8, 4, 2, 1])).sum(-1))
    expected = torch.softmax(joints, 0)[order]
    # Pearson chi-square with 15 dof; the seed is fixed, so p < 1e-3 means a real bias.
    chi2 = ((counts - num_samples * expected) ** 2 / (num_samples * expected)).sum().item()
    assert stats.chi2.sf(chi2, df=15) > 1e-3


def test_ffbs_batched_with_mask():
    init, trans, obs = _model(4, 3, 3, (2,), False)
    mask = torch.tensor([[True, False, True], [False, False, False]])
    draws = hmm_sample_paths(init, trans, obs, 4000, mask=mask)
    assert draws.shape == (4000, 2, 3)
    for b in range(2):
        _, smoothed, _, _ = _brute(init[b], trans[b], obs[b], mask[b])
        freq = torch.nn.functional.one_hot(draws[:, b], 3).double().mean(0)
        assert (freq - smoothed).abs().max() < 0.04  # 5 standard errors at 4000 draws


def _to_pyro_init(init, trans):
    """Our p(z_1) from DiscreteHMM's pre-transition state: pyro's z_1 = z_0 @ A."""
    joint = torch.log_softmax(init, -1)[..., :, None] + torch.log_softmax(trans, -1)
    return torch.logsumexp(joint, -2)


@pytest.mark.parametrize("engine", ["sequential", "scan"])
def test_agrees_with_discrete_hmm_and_gradients(run_on, engine):
    with run_on(engine):
        _check_discrete_hmm_and_gradients()


def _check_discrete_hmm_and_gradients():
    init, trans, _ = _model(5, 3, 7, (2,), False)
    locs = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    init.requires_grad_()
    trans.requires_grad_()
    data = torch.randn(2, 7, dtype=torch.float64)
    obs_dist = dist.Normal(locs, 1.0)
    # DiscreteHMM reads the rightmost batch dim before (K,) / (K, K) as time: give it size 1.
    pyro_obs = dist.Normal(locs.unsqueeze(-2), 1.0)
    expected = dist.DiscreteHMM(init, trans.unsqueeze(-3), pyro_obs).log_prob(data)
    ours = HiddenMarkovDistribution(_to_pyro_init(init, trans), trans, obs_dist).log_prob(data)
    assert torch.allclose(ours, expected, atol=1e-10)
    grads = torch.autograd.grad(expected.sum(), [init, trans, locs])
    ours_grads = torch.autograd.grad(ours.sum(), [init, trans, locs])
    for g, h in zip(grads, ours_grads):
        assert torch.allclose(g, h, atol=1e-10)


def _sequential_forward(init, trans, obs):
    log_init, log_trans = np.log(_softmax(init)), np.log(_softmax(trans))
    alpha = log_init + obs[0]
    for t in range(1, len(obs)):
        m = alpha.max()
        alpha = m + np.log(np.exp(alpha - m) @ np.exp(log_trans)) + obs[t]
    m = alpha.max()
    return m + np.log(np.exp(alpha - m).sum())


def _sequential_viterbi(init, trans, obs):
    log_init, log_trans = np.log(_softmax(init)), np.log(_softmax(trans))
    delta = log_init + obs[0]
    pointers = []
    for t in range(1, len(obs)):
        scores = delta[:, None] + log_trans
        pointers.append(scores.argmax(0))
        delta = scores.max(0) + obs[t]
    path = [int(delta.argmax())]
    for bp in reversed(pointers):
        path.append(int(bp[path[-1]]))
    return np.array(path[::-1]), delta.max()


def _softmax(x):
    x = np.exp(x - x.max(-1, keepdims=True))
    return x / x.sum(-1, keepdims=True)


@pytest.mark.parametrize("engine", ["sequential", "scan"])
def test_long_series_matches_sequential_recursions(run_on, engine):
    with run_on(engine):
        _check_long_series()


def _check_long_series():
    init, trans, obs = _model(6, 4, 20000, (), False)
    expected = _sequential_forward(init.numpy(), trans.numpy(), obs.numpy())
    assert abs(hmm_log_likelihood(init, trans, obs).item() - expected) < 1e-8 * abs(expected)
    path, score = hmm_viterbi(init, trans, obs)
    expected_path, expected_score = _sequential_viterbi(init.numpy(), trans.numpy(), obs.numpy())
    assert np.array_equal(path.numpy(), expected_path)
    assert abs(score.item() - expected_score) < 1e-8 * abs(expected_score)
    ones = torch.ones(20000, dtype=torch.float64)
    assert torch.allclose(hmm_smooth(init, trans, obs).sum(-1), ones)


def _path_log_joint(init, trans, obs, path):
    log_init, log_trans = torch.log_softmax(init, -1), torch.log_softmax(trans, -1)
    steps = torch.arange(len(path))
    return log_init[path[0]] + log_trans[path[:-1], path[1:]].sum() + obs[steps, path].sum()


@pytest.mark.parametrize("spread", [0.0, 0.01, 1.0])
def test_speculative_viterbi_backpointers_where_chunks_reconverge(run_on, spread):
    # With (near-)uniform transitions the max-plus messages of every chunk come back into
    # line after one step, from a different best predecessor than the speculative start
    # had: the backpointers there must come from the corrected message (they once did
    # not, and the path was wrong at every chunk boundary while its score was right).
    K, T = 4, 20000
    g = torch.Generator().manual_seed(5)
    init = torch.zeros(K, dtype=torch.float64)
    trans = spread * torch.randn(K, K, generator=g, dtype=torch.float64)
    obs = torch.randn(T, K, generator=g, dtype=torch.float64)
    with run_on("scan"):
        path, score = hmm_viterbi(init, trans, obs)
    expected_path, expected_score = _sequential_viterbi(init.numpy(), trans.numpy(), obs.numpy())
    assert np.array_equal(path.numpy(), expected_path)
    assert abs(score.item() - expected_score) < 1e-9 * abs(expected_score)
    assert abs(_path_log_joint(init, trans, obs, path).item() - score.item()) < 1e-6


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    K=st.integers(2, 5),
    temperature=st.sampled_from([0.0, 1e-3, 0.3, 3.0]),
    sticky=st.sampled_from([0.0, 4.0]),
)
def test_speculative_viterbi_path_is_optimal(run_on, seed, K, temperature, sticky):
    # Long enough for the speculative chunked pass; whatever the transitions (uniform,
    # nearly so, peaked, sticky), the returned path's log joint is the optimal score.
    T = max(5000, 16384 // K**2 + 2)
    g = torch.Generator().manual_seed(seed)
    init = torch.randn(K, generator=g, dtype=torch.float64)
    trans = temperature * torch.randn(K, K, generator=g, dtype=torch.float64)
    trans = trans + sticky * torch.eye(K, dtype=torch.float64)
    obs = torch.randn(T, K, generator=g, dtype=torch.float64)
    with run_on("scan"):
        path, score = hmm_viterbi(init, trans, obs)
    _, expected_score = _sequential_viterbi(init.numpy(), trans.numpy(), obs.numpy())
    assert abs(score.item() - expected_score) < 1e-9 * abs(expected_score)
    joint = _path_log_joint(init, trans, obs, path).item()
    assert abs(joint - expected_score) < 1e-9 * abs(expected_score)


@pytest.mark.parametrize("engine", ["sequential", "scan"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("stay", [0.9, 1 - 1e-6])
def test_chunked_rescale_interval_keeps_precision(run_on, engine, dtype, stay):
    # The chunked pass rescales its products only every few factors (how many follows from
    # min(A) and A's column sums). Rare transitions (1e-6 / 2 per step) and emissions that
    # favour a different state every few steps push the row maxima down as fast as A allows.
    K, T = 3, 4000
    g = torch.Generator().manual_seed(1)
    trans = torch.full((K, K), (1 - stay) / (K - 1), dtype=torch.float64)
    trans.fill_diagonal_(stay)
    init = torch.zeros(K, dtype=torch.float64)
    favoured = torch.randint(0, K, (T // 5,), generator=g).repeat_interleave(5)
    obs = torch.full((T, K), -30.0, dtype=torch.float64)
    obs[torch.arange(T), favoured] = 0.0
    obs = obs + torch.randn(T, K, generator=g, dtype=torch.float64)
    expected = _sequential_forward(init.numpy(), trans.log().numpy(), obs.numpy())
    with run_on(engine):
        ours = hmm_log_likelihood(init.to(dtype), trans.log().to(dtype), obs.to(dtype))
    rtol = 1e-10 if dtype == torch.float64 else 1e-5
    assert abs(ours.item() - expected) <= rtol * abs(expected)


def test_hmmlearn_categorical_and_gaussian():
    hmm = pytest.importorskip("hmmlearn.hmm")
    rng = np.random.RandomState(0)
    start = np.array([0.6, 0.3, 0.1])
    transmat = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]])
    emission = np.array([[0.5, 0.4, 0.1], [0.1, 0.2, 0.7], [0.3, 0.3, 0.4]])
    cat = hmm.CategoricalHMM(n_components=3)
    cat.startprob_, cat.transmat_, cat.emissionprob_ = start, transmat, emission
    x = rng.randint(0, 3, size=(50, 1))
    init, trans = torch.tensor(np.log(start)), torch.tensor(np.log(transmat))
    obs = torch.tensor(np.log(emission))[:, x[:, 0]].T
    assert abs(hmm_log_likelihood(init, trans, obs).item() - cat.score(x)) < 1e-9
    score, states = cat.decode(x, algorithm="viterbi")
    path, ours = hmm_viterbi(init, trans, obs)
    assert np.array_equal(path.numpy(), states) and abs(ours.item() - score) < 1e-9
    assert np.allclose(hmm_smooth(init, trans, obs).numpy(), cat.predict_proba(x))

    gauss = hmm.GaussianHMM(n_components=3, covariance_type="diag")
    gauss.startprob_, gauss.transmat_ = start, transmat
    gauss.n_features = 1
    gauss.means_ = np.array([[-1.0], [0.0], [2.0]])
    variances = np.array([0.5, 1.0, 0.3])
    gauss.covars_ = variances[:, None]
    y = rng.randn(40, 1)
    scales = torch.tensor(np.sqrt(variances))
    obs_dist = dist.Normal(torch.tensor(gauss.means_[:, 0]), scales)
    d = HiddenMarkovDistribution(init, trans, obs_dist)
    assert abs(d.log_prob(torch.tensor(y[:, 0])).item() - gauss.score(y)) < 1e-9
    assert np.array_equal(d.viterbi(torch.tensor(y[:, 0]))[0].numpy(), gauss.decode(y)[1])


BAD_INPUTS = [
    (dict(init_logits=torch.zeros(())), "init_logits"),
    (
        dict(
            init_logits=torch.zeros(0),
            trans_logits=torch.zeros(0, 0),
            obs_log_probs=torch.zeros(2, 0),
        ),
        "init_logits",
    ),
    (dict(trans_logits=torch.zeros(3, 2)), "trans_logits"),
    (dict(trans_logits=torch.zeros(3)), "trans_logits"),
    (dict(obs_log_probs=torch.zeros(4, 2)), "obs_log_probs"),
    (dict(obs_log_probs=torch.zeros(0, 3)), "obs_log_probs"),
    (dict(trans_logits=torch.zeros(5, 3, 3)), "trans_logits"),  # T-1 = 3 expected
    (dict(trans_logits=torch.zeros(1, 1, 3, 3, 3)), "trans_logits"),
    (dict(init_logits=torch.tensor([0.0, float("nan"), 0.0])), "init_logits"),
    (dict(trans_logits=torch.full((3, 3), float("inf"))), "trans_logits"),
    (dict(obs_log_probs=torch.tensor([[float("nan"), 0, 0]] * 4)), "obs_log_probs"),
    (dict(obs_log_probs=torch.tensor([[float("inf"), 0, 0]] * 4)), "obs_log_probs"),
    (dict(mask=torch.ones(3, dtype=torch.bool)), "mask"),
    (dict(mask=torch.ones(4)), "mask"),
    (dict(init_logits=torch.zeros(2, 3), obs_log_probs=torch.zeros(5, 4, 3)), "broadcast"),
    (dict(init_logits=torch.zeros(3, dtype=torch.long)), "init_logits"),
]


@pytest.mark.parametrize("bad, name", BAD_INPUTS)
def test_bad_inputs_raise_naming_argument(bad, name):
    kwargs = dict(
        init_logits=torch.zeros(3), trans_logits=torch.zeros(3, 3), obs_log_probs=torch.zeros(4, 3)
    )
    kwargs.update(bad)
    for fn in [hmm_log_likelihood, hmm_filter, hmm_smooth, hmm_viterbi]:
        with pytest.raises(ValueError, match=name):
            fn(**kwargs)


def test_bad_counts_and_time_varying_predict():
    init, trans, obs = torch.zeros(3), torch.zeros(3, 3), torch.zeros(4, 3)
    with pytest.raises(ValueError, match="num_samples must be an integer >= 1, got 0"):
        hmm_sample_paths(init, trans, obs, 0)
    with pytest.raises(TypeError, match="num_samples must be an integer >= 1"):
        hmm_sample_paths(init, trans, obs, True)
    with pytest.raises(TypeError, match="num_steps must be an integer >= 1"):
        hmm_predict(init, trans, obs, 1.5)
    with pytest.raises(ValueError, match="num_steps must be an integer >= 1, got 0"):
        hmm_predict(init, trans, obs, 0)
    with pytest.raises(ValueError, match="trans_logits"):
        hmm_predict(init, torch.zeros(3, 3, 3), obs, 2)
    masked = obs.clone()
    masked[1, 0] = float("nan")
    with pytest.raises(ValueError, match="obs_log_probs"):
        hmm_log_likelihood(init, trans, masked, mask=torch.ones(4, dtype=torch.bool))


def test_check_stochastic_matrix():
    good = torch.tensor([[0.2, 0.8], [1.0, 0.0]])
    assert check_stochastic_matrix("transmat", good) is not None
    bads = [
        torch.tensor([[0.2, 0.7], [1.0, 0.0]]),
        torch.tensor([[1.2, -0.2], [1.0, 0.0]]),
        torch.tensor([[float("nan"), 1.0]]),
        torch.zeros(2, 0),
        torch.tensor([[1, 0]]),
    ]
    for bad in bads:
        with pytest.raises(ValueError, match="transmat"):
            check_stochastic_matrix("transmat", bad)


def test_distribution_missing_values_and_shapes(device):
    init, trans, _ = _model(7, 3, 6, (2,), True, device=device)
    locs = torch.randn(2, 3, 2, dtype=torch.float64, device=device)
    obs_dist = dist.Normal(locs, 1.0).to_event(1)
    d = HiddenMarkovDistribution(init, trans, obs_dist)
    assert d.batch_shape == (2,) and d.event_shape == (6, 2)
    x = d.sample((4,))
    assert x.shape == (4, 2, 6, 2) and d.log_prob(x).shape == (4, 2)
    x[..., 1, 0] = float("nan")
    x[..., 4, :] = float("nan")
    mask = torch.ones(6, dtype=torch.bool, device=device)
    mask[[1, 4]] = False
    per_state = dist.Normal(locs.unsqueeze(-3), 1.0).to_event(1)
    obs_lp = per_state.log_prob(torch.nan_to_num(x).unsqueeze(-2))
    expected = hmm_log_likelihood(init, trans.unsqueeze(0), obs_lp, mask)
    assert torch.allclose(d.log_prob(x), expected, atol=1e-10)
    expected_smooth = hmm_smooth(init, trans.unsqueeze(0), obs_lp, mask)
    assert torch.allclose(d.smooth(x), expected_smooth, atol=1e-10)
    assert d.viterbi(x)[0].shape == (4, 2, 6) and d.sample_paths(x, 5).shape == (5, 4, 2, 6)
    homogeneous = HiddenMarkovDistribution(init, trans[:, 0], obs_dist)
    assert homogeneous.predict(x, 2).shape == (4, 2, 2, 3)


def test_distribution_sample_frequencies():
    init, trans = torch.tensor([0.0, -1.0]), torch.tensor([[1.0, -1.0], [-2.0, 0.5]])
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8]])
    d = HiddenMarkovDistribution(init, trans, dist.Categorical(probs), duration=3)
    x = d.sample((20000,))
    assert x.shape == (20000, 3)
    codes = (x * torch.tensor([4, 2, 1])).sum(-1)
    freq = torch.bincount(codes, minlength=8).double() / 20000
    values = torch.tensor(list(itertools.product(range(2), repeat=3)))
    exact = d.log_prob(values).exp().double()
    assert torch.allclose(exact.sum(), torch.tensor(1.0, dtype=torch.float64), atol=1e-6)
    assert (freq - exact).abs().max() < 0.015  # ~4 standard errors at 20000 draws


def test_svi_gaussian_emissions():
    data = torch.cat([torch.randn(30) - 2.0, torch.randn(30) + 2.0])
    data[[5, 40]] = float("nan")

    def model(y):
        locs = pyro.param("locs", torch.tensor([-0.5, 0.5]))
        trans = pyro.param("trans", torch.zeros(2, 2))
        hmm = HiddenMarkovDistribution(torch.zeros(2), trans, dist.Normal(locs, 1.0))
        pyro.sample("obs", hmm, obs=y)

    optim = pyro.optim.Adam({"lr": 0.1})
    svi = pyro.infer.SVI(model, lambda y: None, optim, pyro.infer.Trace_ELBO())
    losses = [svi.step(data) for _ in range(60)]
    assert losses[-1] < losses[0] - 20
    locs = pyro.param("locs").detach()
    assert locs[0] < -1.0 and locs[1] > 1.0


@pytest.mark.parametrize("engine", ["sequential", "scan"])
@pytest.mark.parametrize("sparsity", ["dense", "cyclic", "identity"])
def test_chunked_paths_match_sequential_recursions(run_on, engine, sparsity):
    # Long enough for the chunked likelihood and the speculative Viterbi with fix-up
    # passes; the identity chain never forgets its start, so Viterbi falls back to the scan.
    with run_on(engine):
        _check_chunked_paths(sparsity)


def _check_chunked_paths(sparsity):
    init, trans, obs = _model(8, 5, 3001, (), False)
    allowed = torch.eye(5, dtype=torch.bool)
    if sparsity == "cyclic":
        allowed = allowed | allowed.roll(1, -1)
    if sparsity != "dense":
        trans = trans.masked_fill(~allowed, float("-inf"))
    expected = _sequential_forward(init.numpy(), trans.numpy(), obs.numpy())
    assert abs(hmm_log_likelihood(init, trans, obs).item() - expected) < 1e-8 * abs(expected)
    path, score = hmm_viterbi(init, trans, obs)
    expected_path, expected_score = _sequential_viterbi(init.numpy(), trans.numpy(), obs.numpy())
    assert np.array_equal(path.numpy(), expected_path)
    assert abs(score.item() - expected_score) < 1e-8 * abs(expected_score)
    # Batched and time-varying inputs agree with the unbatched, homogeneous call.
    steps = trans.expand(3000, 5, 5)
    batched = hmm_viterbi(init.expand(2, 5), steps.expand(2, 3000, 5, 5), obs.expand(2, 3001, 5))
    assert (batched[0] == path).all() and torch.allclose(batched[1], score.expand(2))
    loglik = hmm_log_likelihood(init, steps, obs)
    assert abs(loglik.item() - expected) < 1e-8 * abs(expected)


def test_distribution_log_prob_vmaps_with_validation_off_missing_values_included():
    """What the samplers do: validation off, ``torch.func.vmap`` over the parameters, or
    the step traced into a graph. ``log_prob`` then reads no data on the host (the
    missing-value check included) and equals the per-parameter loop, with and without NaN
    observations, whatever data the graph was traced with."""
    g = torch.Generator().manual_seed(0)
    init = torch.randn(3, generator=g).log_softmax(-1)
    trans = torch.randn(3, 3, generator=g).log_softmax(-1)
    locs = torch.randn(4, 3, generator=g)
    x = torch.randn(40, generator=g)
    with_gaps = x.clone()
    with_gaps[[3, 17]] = float("nan")

    def log_prob(loc, value):
        emission = dist.Normal(loc, 1.0)
        return HiddenMarkovDistribution(init, trans, emission, validate_args=False).log_prob(value)

    for value in (x, with_gaps):
        with pyro.validation_enabled(False):
            batched = torch.func.vmap(log_prob, in_dims=(0, None))(locs, value)
        looped = torch.stack([log_prob(loc, value) for loc in locs])
        torch.testing.assert_close(batched, looped)
    # A traced (compiled) step's graph: traced on complete data, it still masks gaps.
    traced = trace_pure(lambda loc, value: (log_prob(loc, value),), [locs[0], x])
    for value in (x, with_gaps):
        torch.testing.assert_close(traced(locs[0], value)[0], log_prob(locs[0], value))
    # The gaps are skipped: the same as the series without those steps' emissions.
    observed = torch.ones(40, dtype=torch.bool)
    observed[[3, 17]] = False
    emissions = dist.Normal(locs[0], 1.0).log_prob(x.nan_to_num()[:, None])
    expected = hmm_log_likelihood(init, trans, emissions, mask=observed)
    torch.testing.assert_close(log_prob(locs[0], with_gaps), expected)
