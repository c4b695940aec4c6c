"""
The compiled sequential HMM kernels (:mod:`pyro_ext.timeseries._hmm_sequential`, the CPU
default) against the torch scans and brute-force enumeration: values, gradients, second
derivatives, the log-space fallback where probability space underflows, and the scans
taking over under ``torch.func``.
"""

import itertools
import math

import pyro
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from pyro_ext.timeseries import _hmm_sequential, sequential_kernels
from pyro_ext.timeseries.hmm import (
    hmm_expected_statistics,
    hmm_filter,
    hmm_log_likelihood,
    hmm_smooth,
    hmm_viterbi,
)

FUNCTIONS = [hmm_log_likelihood, hmm_filter, hmm_smooth, hmm_expected_statistics, hmm_viterbi]


def _inputs(seed, batch, num_steps, num_states, time_varying, masked, dtype):
    g = torch.Generator().manual_seed(seed)
    steps = (num_steps - 1,) if time_varying else ()
    init = torch.randn(batch + (num_states,), generator=g, dtype=dtype)
    trans = 2 * torch.randn(batch + steps + (num_states, num_states), generator=g, dtype=dtype)
    obs = 3 * torch.randn(batch + (num_steps, num_states), generator=g, dtype=dtype)
    mask = None
    if masked:
        mask = torch.rand(batch + (num_steps,), generator=g) < 0.7
    return init, trans, obs, mask


def _run_both(run_on, fn, *args):
    with run_on("sequential"):
        ours = fn(*args)
    with run_on("scan"):
        scans = fn(*args)
    return ours, scans


def _close(a, b, rtol, atol):
    if isinstance(a, tuple):
        for x, y in zip(a, b):
            _close(x, y, rtol, atol)
        return
    assert a.shape == b.shape and a.dtype == b.dtype
    if a.dtype == torch.long:
        assert torch.equal(a, b)
    else:
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.sampled_from([(), (3,), (2, 2)]),
    num_steps=st.sampled_from([1, 2, 7, 300]),
    num_states=st.integers(1, 6),
    time_varying=st.booleans(),
    masked=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_sequential_kernels_equal_the_scans(
    run_on, seed, batch, num_steps, num_states, time_varying, masked, dtype
):
    args = _inputs(seed, batch, num_steps, num_states, time_varying, masked, dtype)
    rtol, atol = (1e-10, 1e-10) if dtype == torch.float64 else (1e-4, 1e-4)
    for fn in FUNCTIONS:
        ours, scans = _run_both(run_on, fn, *args)
        if fn is hmm_viterbi:
            # Ties (masked steps reorder the same transitions; float32 near-ties, which the
            # kernels add in float64) may resolve either way: the path must attain the score.
            _close(ours[1], scans[1], rtol, atol * num_steps)
            joint = _path_log_joint(*args, ours[0])
            torch.testing.assert_close(joint, ours[1].double(), rtol=rtol, atol=atol * num_steps)
            continue
        _close(ours, scans, rtol, atol * max(1, num_steps))
    # Gradients (the sequential path's are the expected counts).
    leaves = [x.clone().requires_grad_() for x in args[:3]]
    grads = []
    for engine in ("sequential", "scan"):
        with run_on(engine):
            value = hmm_log_likelihood(*leaves, args[3]).sum()
            grads.append(torch.autograd.grad(value, leaves, allow_unused=True))
    for g, h in zip(*grads):
        if g is None or h is None:  # T = 1: trans_logits does not enter
            assert num_steps == 1
            continue
        torch.testing.assert_close(g, h, rtol=rtol, atol=atol)


def _path_log_joint(init, trans, obs, mask, path):
    """log p(x, z = path) in float64, batched like ``path`` ``(..., T)``."""
    batch, (num_steps, num_states) = path.shape[:-1], obs.shape[-2:]
    init, trans, obs = (x.double() for x in (init, trans, obs))
    if mask is not None:
        obs = obs.masked_fill(~mask.unsqueeze(-1), 0.0)
    time_varying = trans.dim() == obs.dim() + 1
    init = torch.log_softmax(init, -1).expand(batch + (num_states,))
    steps = (num_steps - 1,) if time_varying else ()
    trans = torch.log_softmax(trans, -1).expand(batch + steps + (num_states, num_states))
    obs = obs.expand(batch + (num_steps, num_states))
    out = torch.empty(batch, dtype=torch.float64)
    for idx in itertools.product(*map(range, batch)):
        z = path[idx]
        total = init[idx][z[0]] + obs[idx][torch.arange(num_steps), z].sum()
        for t in range(1, num_steps):
            step = trans[idx][t - 1] if time_varying else trans[idx]
            total = total + step[z[t - 1], z[t]]
        out[idx] = total
    return out


def _brute(init, trans, obs):
    """log p(x), smoothed marginals and the best path's score by enumerating all paths."""
    num_steps, num_states = obs.shape
    log_init, log_trans = torch.log_softmax(init, -1), torch.log_softmax(trans, -1)
    paths = torch.tensor(list(itertools.product(range(num_states), repeat=num_steps)))
    joints = log_init[paths[:, 0]] + obs[0, paths[:, 0]]
    for t in range(1, num_steps):
        joints = joints + log_trans[paths[:, t - 1], paths[:, t]] + obs[t, paths[:, t]]
    post = torch.softmax(joints, 0)
    smoothed = torch.stack(
        [
            torch.zeros(num_states, dtype=obs.dtype).index_add(0, paths[:, t], post)
            for t in range(num_steps)
        ]
    )
    return joints.logsumexp(0), smoothed, joints.max()


@pytest.mark.parametrize("rare", [1e-300, 1e-200, 0.0])
def test_underflowing_steps_fall_back_to_log_space(run_on, rare):
    # A chain that almost never switches (probability `rare`, or never), observed in the
    # state it is not in: in probability space the step's normaliser is ~1e-300 * e^-900
    # (zero in float64); the kernels redo such steps in log space.
    logit = math.log(rare) if rare > 0 else -math.inf
    trans = torch.tensor([[0.0, logit], [logit, 0.0]], dtype=torch.float64)
    init = torch.tensor([0.0, -800.0], dtype=torch.float64)
    obs = torch.tensor(
        [[0.0, -900.0], [-900.0, 0.0], [-900.0, 0.0], [0.0, -5.0], [-3.0, 0.0], [0.0, -700.0]],
        dtype=torch.float64,
    )
    expected_ll, expected_smoothed, expected_score = _brute(init, trans, obs)
    with run_on("sequential"):
        loglik = hmm_log_likelihood(init, trans, obs)
        smoothed = hmm_smooth(init, trans, obs)
        _, score = hmm_viterbi(init, trans, obs)
        stats = hmm_expected_statistics(init, trans, obs)
    assert torch.isfinite(loglik)
    torch.testing.assert_close(loglik, expected_ll, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(score, expected_score, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(smoothed, expected_smoothed, rtol=0, atol=1e-12)
    torch.testing.assert_close(stats.posterior, expected_smoothed, rtol=0, atol=1e-12)
    torch.testing.assert_close(stats.transition_counts.sum(), torch.tensor(5.0).double())


def test_second_derivatives_go_through_the_scans(run_on):
    # The compiled path's backward is the expected counts, not itself differentiable: with
    # create_graph=True it differentiates the scans, so Hessians (Laplace, curvature) work.
    init, trans, obs, _ = _inputs(3, (), 9, 3, False, False, torch.float64)

    def loglik(o):
        return hmm_log_likelihood(init, trans, o)

    with run_on("sequential"):
        ours = torch.autograd.functional.hessian(loglik, obs)
    with run_on("scan"):
        scans = torch.autograd.functional.hessian(loglik, obs)
    torch.testing.assert_close(ours, scans, rtol=1e-10, atol=1e-12)
    assert ours.abs().sum() > 0


def test_torch_func_transforms_use_the_scans(run_on):
    init, trans, obs, _ = _inputs(4, (5,), 20, 3, False, False, torch.float64)

    def loglik(o):
        return hmm_log_likelihood(init[0], trans[0], o)

    # Value checks branch on data, which vmap cannot trace: vectorised callers turn them off.
    with run_on("sequential"), pyro.validation_enabled(False):
        batched = torch.func.vmap(loglik)(obs)
        grads = torch.func.vmap(torch.func.grad(loglik))(obs)
    with run_on("sequential"):
        leaf = obs.clone().requires_grad_()
        direct = hmm_log_likelihood(init[0], trans[0], leaf)
        direct_grads = torch.autograd.grad(direct.sum(), leaf)[0]
    torch.testing.assert_close(batched, direct, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads, direct_grads, rtol=1e-12, atol=1e-12)


def test_available_only_on_cpu_untraced_and_switched_on():
    cpu = torch.zeros(2)
    assert _hmm_sequential.available(cpu)
    with sequential_kernels(False):
        assert not _hmm_sequential.available(cpu)
        with sequential_kernels():
            assert _hmm_sequential.available(cpu)
        assert not _hmm_sequential.available(cpu)
    assert _hmm_sequential.available(cpu)
    with pytest.raises(TypeError, match="enabled must be a bool"):
        sequential_kernels(0)
    assert not _hmm_sequential.available(torch.zeros(2, device="meta"))
    assert not torch.func.vmap(lambda x: x * 0 + float(_hmm_sequential.available(x)))(
        torch.zeros(3, 1)
    ).any()
    # make_fx (the compiled SG-MCMC step's and online update's tracer) would keep the
    # kernels' result as a constant of the graph.
    seen = []
    make_fx(lambda x: seen.append(_hmm_sequential.available(x)) or x * 2)(cpu)
    assert seen == [False]


def test_the_kernels_exponential_is_exact_to_one_ulp():
    """The vectorised ``exp`` of the kernels against numpy's: within 2 ulp wherever
    ``exp(x)`` is a normal float above ``exp(-708)``, 0 below that (the underflow the log
    space steps handle), ``exp(-inf) = 0``, NaN kept, at any length (the blocks' tails)."""
    np = pytest.importorskip("numpy")
    kernels = pytest.importorskip("pyro_ext.timeseries._hmm_kernels")
    rng = np.random.default_rng(0)
    edges = [0.0, -0.0, -1e-300, -math.log(2) / 2, math.log(2) / 2, -1.0, -707.99, -708.0]
    edges += [-708.01, -745.2, -1e6, -math.inf, math.nan, 1.0, 700.0]
    for size in (0, 1, 255, 256, 257, 10_000):
        x = np.concatenate([edges, -np.abs(rng.standard_cauchy(size)) * 10])
        got = x.copy()
        kernels._exp_in_place(got)
        want = np.exp(x)
        normal = (x > -708) & np.isfinite(x)
        ulps = np.abs(got[normal] - want[normal]) / np.spacing(want[normal])
        assert ulps.max() <= 2, f"{ulps.max()} ulp at x = {x[normal][ulps.argmax()]}"
        assert (got[x <= -708] == 0).all()
        assert np.isnan(got[np.isnan(x)]).all()
