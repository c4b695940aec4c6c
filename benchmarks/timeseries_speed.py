"""
Speed of the exact state-space inference of ``pyro_ext.timeseries`` against baselines timed in
the same run (issue: funsor-backed HMM and DLM inference).

Tables (ratio = median over repeats of ours / baseline, the two timed back to back in every
repeat; times in milliseconds per call, median / mean / p90 / max over the repeats; a repeat
times a batch of calls lasting at least 20 ms, so sub-millisecond calls are not timer
noise):

1. HMM log-likelihood, K in {3, 20} states, T in {1e3, 1e5} (and K = 10 at T = 1e5), Gaussian
   emissions:
   ``HiddenMarkovDistribution.log_prob`` vs ``pyro.distributions.DiscreteHMM.log_prob`` (same
   parameters after the first-state conversion, float32, as Pyro users run it) and
   ``hmm_log_likelihood`` (float64, emission log-densities included) vs ``hmmlearn``'s
   ``GaussianHMM.score`` (float64, C). A gradient row: log-likelihood + ``backward()`` vs the
   same for ``DiscreteHMM``.
2. Viterbi: ``hmm_viterbi`` (float64) vs ``hmmlearn``'s ``decode(algorithm="viterbi")``; and one
   ELBO evaluation of ``HiddenMarkovModel`` (default scan backend) vs the same model with the
   states enumerated under ``pyro.contrib.funsor.vectorized_markov`` and
   ``TraceMarkovEnum_ELBO`` (``backend="funsor"``), K=3, T=200.
   dynamax (when installed; float64 via ``jax_enable_x64``): ``hmm_filter``'s
   ``marginal_loglik``, ``hmm_posterior_mode`` and ``hmm_smoother``, jitted with the emission
   log-densities computed inside the call as ours computes them (compile excluded), checked
   to give our log-likelihood, our path and our marginals; and the engines alone ("log-densities
   given": the same precomputed emission log-densities handed to both). Smoothing also against hmmlearn's
   ``predict_proba``. On CPU, each of the log-likelihood, Viterbi and smoothing tables has a
   row of the engine a CPU call gets (the compiled sequential kernels, numba) against the
   torch scans that CUDA, ``torch.func`` and ``torch.compile`` calls get, on the same call.
3. Kalman log-likelihood of a local linear trend + seasonal(12) DLM (13 states) at T in
   {1e3, 1e4}: ``kalman_log_likelihood`` (float64, blocked filter) vs ``statsmodels``'
   ``UnobservedComponents.loglike`` (Cython; by default it switches to the steady-state filter
   once the covariance converges, an approximation we do not make), and ``kalman_filter`` (all
   filtered moments, parallel scan) vs ``UnobservedComponents.filter``; with gradient:
   log-likelihood + ``backward()`` w.r.t. the four variances (on CPU the kernels' closed-form
   score at T = 1e3 and the blocked scan's autograd at T = 1e4, as the default picks by size:
   ``benchmarks/kalman_gradient.py``) vs ``UnobservedComponents.score`` (numerical
   derivatives: what a statsmodels user gets).
   dynamax's jitted ``lgssm_filter`` (its log-likelihood; all its filtered moments) and
   ``lgssm_smoother`` against ``kalman_log_likelihood``, ``kalman_filter`` and
   ``kalman_smoother`` on the same model and series, checked to agree. On CPU, rows of the
   compiled sequential kernels (what a call without gradients gets) against the torch
   scans (blocked or parallel: what gradients, CUDA and torch.func get). The same rows on
   random dense static models at the issue's sizes (S = 8 and 20 states, p = 2 observed
   coordinates, T = 1e4; ``dense_state_space``).
4. DLM maximum likelihood: ``fit_dlm`` (L-BFGS through the exact Kalman likelihood, and EM
   with SQUAREM; its default 3 seeded starts, and 1) against statsmodels'
   ``UnobservedComponents(y, "local level").fit()`` on the Nile, with the estimates and
   log-likelihoods.

CPU runs use one intra-op thread (``--threads``). Peers that are not importable get a
"not installed" row (``pip install -c constraints.txt -e ".[bench]"`` installs them).

Run from the repository root::

    python benchmarks/timeseries_speed.py            # full: 7 repeats, about two minutes
    python benchmarks/timeseries_speed.py --quick    # smoke test: small T, 2 repeats
    python benchmarks/timeseries_speed.py --device cuda

The tables are printed and written to ``benchmarks/results/timeseries_speed.md``.
"""

import statistics
import time
import warnings
from importlib.metadata import PackageNotFoundError, version

import numpy as np
import pyro.distributions as dist
import torch
from _common import (
    REPO,  # noqa: E402
    argument_parser,
    markdown,
    spread,
    write_report,
)

from pyro_ext.timeseries import sequential_kernels
from pyro_ext.timeseries.hmm import (
    HiddenMarkovDistribution,
    hmm_log_likelihood,
    hmm_smooth,
    hmm_viterbi,
)
from pyro_ext.timeseries.kalman import (
    StateSpaceMatrices,
    kalman_filter,
    kalman_log_likelihood,
    kalman_smoother,
)

RESULTS = REPO / "benchmarks" / "results" / "timeseries_speed.md"
PERIOD = 12


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


#: a timed batch of calls lasts at least this long (s): a single sub-millisecond call's time
#: is mostly timer and cache noise.
MIN_BATCH_SECONDS = 0.02


def _calls_per_batch(fn, device):
    """How many back-to-back calls of ``fn`` fill :data:`MIN_BATCH_SECONDS` (timeit's
    autorange), from one timed call after warm-up."""
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return max(1, min(1000, int(MIN_BATCH_SECONDS / max(time.perf_counter() - start, 1e-7))))


def _per_call(fn, calls, device):
    _sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / calls


def timed_pair(ours, baseline, repeats, device):
    """Per-call times (s) of ``ours`` and ``baseline`` over the repeats, each repeat timing a
    batch of back-to-back calls of one then the other (long calls: a batch of one), and the
    median of the per-repeat ratios."""
    ours(), baseline()  # warm caches and lazy initialisation
    n_ours, n_base = _calls_per_batch(ours, device), _calls_per_batch(baseline, device)
    t_ours, t_base, ratios = [], [], []
    for _ in range(repeats):
        mine = _per_call(ours, n_ours, device)
        theirs = _per_call(baseline, n_base, device)
        t_ours.append(mine)
        t_base.append(theirs)
        ratios.append(mine / theirs)
    return t_ours, t_base, statistics.median(ratios)


def _on_scans(fn):
    """``fn`` run with the compiled sequential kernels off: the engine CUDA, torch.func and
    torch.compile calls get, for a row against the one a CPU call gets."""

    def run():
        with sequential_kernels(False):
            return fn()

    return run


def _row(name, setting, timing):
    ours, base, ratio = timing
    return [name, setting, spread(ours, 1e3, "{:.2f}"), spread(base, 1e3, "{:.2f}"), f"{ratio:.2f}"]


def _installed(module):
    try:
        return version(module)
    except PackageNotFoundError:
        return None


def _dynamax():
    """dynamax's HMM and linear-Gaussian inference in float64 (``jax_enable_x64``), or
    ``None`` when it is not installed."""
    try:
        import jax

        jax.config.update("jax_enable_x64", True)
        from dynamax.hidden_markov_model import hmm_filter, hmm_posterior_mode, hmm_smoother
        from dynamax.linear_gaussian_ssm import inference as lgssm
    except ImportError:
        return None
    return jax, hmm_filter, hmm_posterior_mode, lgssm, hmm_smoother


def _jax_timed(fn, *args):
    """``fn`` jitted, its compile done, as a zero-argument call that waits for the result."""
    import jax

    jitted = jax.jit(fn)
    jax.block_until_ready(jitted(*args))
    return lambda: jax.block_until_ready(jitted(*args))


def random_hmm(K, T, dtype, device, generator):
    """Pyro-convention initial logits (state before the first transition), transition logits
    with sticky rows, Gaussian emission means and a series drawn from well-separated states."""
    pyro_init = torch.randn(K, generator=generator, dtype=dtype).log_softmax(-1)
    trans = (
        torch.randn(K, K, generator=generator, dtype=dtype) + 2 * torch.eye(K, dtype=dtype)
    ).log_softmax(-1)
    locs = 3 * torch.randn(K, generator=generator, dtype=dtype)
    states = torch.randint(K, (T,), generator=generator)
    x = locs[states] + torch.randn(T, generator=generator, dtype=dtype)
    return tuple(t.to(device) for t in (pyro_init, trans, locs, x))


def hmm_tables(sizes, repeats, device):
    generator = torch.Generator().manual_seed(0)
    loglik_rows, grad_rows, viterbi_rows, smooth_rows = [], [], [], []
    have_hmmlearn = _installed("hmmlearn")
    peer = _dynamax()
    if have_hmmlearn:
        from hmmlearn.hmm import GaussianHMM
    for K, T in sizes:
        pyro_init, trans, locs, x = random_hmm(K, T, torch.float32, device, generator)
        # Pyro's initial distribution is the state before the first transition; ours is the
        # first state, its one-step push-forward.
        init = (pyro_init[:, None] + trans).logsumexp(0)
        ours = HiddenMarkovDistribution(init, trans, dist.Normal(locs, 1.0))
        theirs = dist.DiscreteHMM(pyro_init, trans, dist.Normal(locs, 1.0))
        setting = f"K={K}, T={T:.0e}"
        if not torch.allclose(ours.log_prob(x), theirs.log_prob(x), rtol=1e-4):
            raise AssertionError(
                f"log-likelihood mismatch with DiscreteHMM: {ours.log_prob(x)} vs "
                f"{theirs.log_prob(x)}"
            )
        loglik_rows.append(
            _row(
                "HiddenMarkovDistribution vs DiscreteHMM (f32)",
                setting,
                timed_pair(lambda: ours.log_prob(x), lambda: theirs.log_prob(x), repeats, device),
            )
        )

        locs_g = locs.clone().requires_grad_()
        trans_g = trans.clone().requires_grad_()

        def ours_grad():
            init_g = (pyro_init[:, None] + trans_g).logsumexp(0)
            HiddenMarkovDistribution(init_g, trans_g, dist.Normal(locs_g, 1.0)).log_prob(
                x
            ).backward()

        def theirs_grad():
            dist.DiscreteHMM(pyro_init, trans_g, dist.Normal(locs_g, 1.0)).log_prob(x).backward()

        grad_rows.append(
            _row(
                "log-lik + backward vs DiscreteHMM (f32)",
                setting,
                timed_pair(ours_grad, theirs_grad, repeats, device),
            )
        )

        # Renormalised in float64 so that hmmlearn gets exactly the distributions we use.
        init64, trans64 = init.double().log_softmax(-1), trans.double().log_softmax(-1)
        locs64, x64 = locs.double(), x.double()

        def ours_floor():
            obs_log_probs = dist.Normal(locs64, 1.0).log_prob(x64[:, None])
            return hmm_log_likelihood(init64, trans64, obs_log_probs)

        def ours_viterbi():
            obs_log_probs = dist.Normal(locs64, 1.0).log_prob(x64[:, None])
            return hmm_viterbi(init64, trans64, obs_log_probs)

        def ours_smooth():
            obs_log_probs = dist.Normal(locs64, 1.0).log_prob(x64[:, None])
            return hmm_smooth(init64, trans64, obs_log_probs)

        if device.type == "cpu":
            for rows, name, fn in (
                (loglik_rows, "hmm_log_likelihood", ours_floor),
                (viterbi_rows, "hmm_viterbi", ours_viterbi),
                (smooth_rows, "hmm_smooth", ours_smooth),
            ):
                rows.append(
                    _row(
                        f"{name}: compiled kernels vs torch scans (f64)",
                        setting,
                        timed_pair(fn, _on_scans(fn), repeats, device),
                    )
                )

        if not have_hmmlearn:
            loglik_rows.append(
                ["hmm_log_likelihood vs hmmlearn score (f64)", setting, "", "", "not installed"]
            )
            viterbi_rows.append(
                ["hmm_viterbi vs hmmlearn decode (f64)", setting, "", "", "not installed"]
            )
            smooth_rows.append(
                ["hmm_smooth vs hmmlearn predict_proba (f64)", setting, "", "", "not installed"]
            )
            continue
        model = GaussianHMM(K, covariance_type="diag", init_params="", params="")
        model.startprob_ = init64.exp().cpu().numpy()
        model.transmat_ = trans64.exp().cpu().numpy()
        model.means_ = locs64.cpu().numpy()[:, None]
        model.covars_ = np.ones((K, 1))
        X = x64.cpu().numpy()[:, None]
        ours_ll, ours_path = float(ours_floor()), ours_viterbi()
        if not np.isclose(ours_ll, model.score(X), rtol=1e-8, atol=1e-6):
            raise AssertionError(
                f"log-likelihood mismatch: ours {ours_ll}, hmmlearn {model.score(X)}"
            )
        loglik_rows.append(
            _row(
                "hmm_log_likelihood vs hmmlearn score (f64)",
                setting,
                timed_pair(ours_floor, lambda: model.score(X), repeats, device),
            )
        )
        their_score, their_path = model.decode(X, algorithm="viterbi")
        if not np.isclose(float(ours_path[1]), their_score, rtol=1e-8, atol=1e-6):
            raise AssertionError(
                f"Viterbi score mismatch: ours {float(ours_path[1])}, hmmlearn {their_score}"
            )
        viterbi_rows.append(
            _row(
                "hmm_viterbi vs hmmlearn decode (f64)",
                setting,
                timed_pair(
                    ours_viterbi, lambda: model.decode(X, algorithm="viterbi"), repeats, device
                ),
            )
        )
        their_post = model.predict_proba(X)
        if not np.allclose(ours_smooth().numpy(), their_post, atol=1e-8):
            raise AssertionError("smoothed marginals differ from hmmlearn's predict_proba")
        smooth_rows.append(
            _row(
                "hmm_smooth vs hmmlearn predict_proba (f64)",
                setting,
                timed_pair(ours_smooth, lambda: model.predict_proba(X), repeats, device),
            )
        )
        if peer is not None and device.type == "cpu":
            jax, hmm_filter, hmm_posterior_mode, _, hmm_smoother = peer
            jnp, norm = jax.numpy, jax.scipy.stats.norm
            p0, A = jnp.asarray(init64.exp().numpy()), jnp.asarray(trans64.exp().numpy())
            mu, xs = jnp.asarray(locs64.numpy()), jnp.asarray(x64.numpy())

            def emissions_inside(fn):
                """dynamax's ``fn(p0, A, log_likelihoods)`` jitted with the emission
                log-densities computed inside the call, as ours computes them."""
                return _jax_timed(
                    lambda p0, A, mu, xs: fn(p0, A, norm.logpdf(xs[:, None], mu, 1.0)),
                    p0,
                    A,
                    mu,
                    xs,
                )

            their_ll = emissions_inside(lambda *a: hmm_filter(*a).marginal_loglik)
            their_mode = emissions_inside(hmm_posterior_mode)
            if not np.isclose(ours_ll, float(their_ll()), rtol=1e-8, atol=1e-6):
                raise AssertionError(
                    f"log-likelihood mismatch: ours {ours_ll}, dynamax {their_ll()}"
                )
            agree = float((np.asarray(their_mode()) == ours_path[0].numpy()).mean())
            if agree < 0.999:
                raise AssertionError(f"Viterbi paths agree on only {agree:.4f} of the steps")
            their_smooth = emissions_inside(lambda *a: hmm_smoother(*a).smoothed_probs)
            if not np.allclose(np.asarray(their_smooth()), their_post, atol=1e-8):
                raise AssertionError("dynamax's smoothed marginals differ from ours")
            smooth_rows.append(
                _row(
                    "hmm_smooth vs dynamax hmm_smoother (f64, jit)",
                    setting,
                    timed_pair(ours_smooth, their_smooth, repeats, device),
                )
            )
            loglik_rows.append(
                _row(
                    "hmm_log_likelihood vs dynamax hmm_filter (f64, jit)",
                    setting,
                    timed_pair(ours_floor, their_ll, repeats, device),
                )
            )
            viterbi_rows.append(
                _row(
                    "hmm_viterbi vs dynamax hmm_posterior_mode (f64, jit)",
                    setting,
                    timed_pair(ours_viterbi, their_mode, repeats, device),
                )
            )
            # The engines alone: the same emission log-densities handed to both, so that
            # neither row carries its framework's elementwise cost (torch's eager
            # Normal.log_prob against XLA's fused logpdf).
            obs64 = dist.Normal(locs64, 1.0).log_prob(x64[:, None])
            given = jnp.asarray(obs64.numpy())
            for rows, name, ours_fn, theirs_fn in (
                (
                    loglik_rows,
                    "hmm_log_likelihood vs dynamax hmm_filter",
                    hmm_log_likelihood,
                    lambda *a: hmm_filter(*a).marginal_loglik,
                ),
                (
                    viterbi_rows,
                    "hmm_viterbi vs dynamax hmm_posterior_mode",
                    hmm_viterbi,
                    hmm_posterior_mode,
                ),
                (
                    smooth_rows,
                    "hmm_smooth vs dynamax hmm_smoother",
                    hmm_smooth,
                    lambda *a: hmm_smoother(*a).smoothed_probs,
                ),
            ):
                rows.append(
                    _row(
                        f"{name}, log-densities given (f64, jit)",
                        setting,
                        timed_pair(
                            lambda fn=ours_fn: fn(init64, trans64, obs64),
                            _jax_timed(theirs_fn, p0, A, given),
                            repeats,
                            device,
                        ),
                    )
                )
    return loglik_rows, grad_rows, viterbi_rows, smooth_rows


def enumeration_table(length, repeats, device):
    """One ELBO evaluation of ``HiddenMarkovModel``: scan backend vs funsor enumeration."""
    from pyro.contrib.funsor.infer import TraceMarkovEnum_ELBO
    from pyro.infer import Trace_ELBO

    from pyro_ext.timeseries.models import HiddenMarkovModel

    generator = torch.Generator().manual_seed(2)
    y = torch.randint(5, (length,), generator=generator).double().to(device)
    kwargs = dict(
        num_symbols=5,
        init_probs=torch.full((3,), 1 / 3, dtype=torch.float64, device=device),
        transition_probs=torch.full((3, 3), 1 / 3, dtype=torch.float64, device=device),
    )
    scan = HiddenMarkovModel(3, "categorical", **kwargs)
    enum = HiddenMarkovModel(3, "categorical", backend="funsor", **kwargs)
    enum_elbo = TraceMarkovEnum_ELBO(max_plate_nesting=1)

    def guide(y):
        """Every site of the model is observed or marginalised: nothing to guide."""

    timing = timed_pair(
        lambda: Trace_ELBO().differentiable_loss(scan, guide, y),
        lambda: enum_elbo.differentiable_loss(enum, guide, y),
        repeats,
        device,
    )
    return [
        _row(
            "HiddenMarkovModel ELBO: scan vs funsor TraceMarkovEnum_ELBO",
            f"K=3, T={length}",
            timing,
        )
    ]


def trend_seasonal_matrices(variances, dtype, device):
    """Local linear trend + dummy seasonal(12): G, F, W (diagonal), state dim 2 + 11."""
    level_var, slope_var, seasonal_var, obs_var = variances
    S = 2 + PERIOD - 1
    G = torch.zeros(S, S, dtype=dtype, device=device)
    G[0, 0] = G[0, 1] = G[1, 1] = 1.0
    G[2, 2:] = -1.0
    G[3:, 2:-1] += torch.eye(PERIOD - 2, dtype=dtype, device=device)
    F = torch.zeros(1, S, dtype=dtype, device=device)
    F[0, 0] = F[0, 2] = 1.0
    zero = torch.zeros((), dtype=dtype, device=device)
    W = torch.diag(torch.stack([level_var, slope_var, seasonal_var] + [zero] * (PERIOD - 2)))
    V = obs_var.reshape(1, 1)
    return G, F, W, V


def _dynamax_kalman_rows(peer, y, matrices, setting, repeats, device, ours, ours_filter):
    """Ours against dynamax's jitted ``lgssm_filter`` (log-likelihood; all filtered
    moments) and ``lgssm_smoother`` on the same static model (``matrices``) and series ``y``
    ``(T, p)``, checked to agree."""
    jax, _, _, lgssm, _ = peer
    jnp = jax.numpy
    G, F, W, V, init_mean, init_cov = matrices
    as_jax = lambda t: jnp.asarray(t.cpu().numpy())  # noqa: E731
    S, p = G.shape[0], F.shape[0]
    params = lgssm.ParamsLGSSM(
        initial=lgssm.ParamsLGSSMInitial(mean=as_jax(init_mean), cov=as_jax(init_cov)),
        dynamics=lgssm.ParamsLGSSMDynamics(
            weights=as_jax(G), bias=jnp.zeros(S), input_weights=jnp.zeros((S, 0)), cov=as_jax(W)
        ),
        emissions=lgssm.ParamsLGSSMEmissions(
            weights=as_jax(F), bias=jnp.zeros(p), input_weights=jnp.zeros((p, 0)), cov=as_jax(V)
        ),
    )
    emissions = as_jax(y)
    their_ll = _jax_timed(lambda e: lgssm.lgssm_filter(params, e).marginal_loglik, emissions)
    their_filter = _jax_timed(lambda e: lgssm.lgssm_filter(params, e), emissions)
    their_smoother = _jax_timed(lambda e: lgssm.lgssm_smoother(params, e), emissions)

    def ours_smoother():
        return kalman_smoother(y, matrices)

    if not np.isclose(float(ours()), float(their_ll()), rtol=1e-8, atol=1e-6):
        raise AssertionError(
            f"Kalman log-likelihood mismatch: ours {float(ours())}, dynamax {their_ll()}"
        )
    smoothed = np.asarray(their_smoother().smoothed_means)
    gap = np.abs(ours_smoother().smoothed_means.cpu().numpy() - smoothed).max()
    if gap > 1e-6 * max(1.0, np.abs(smoothed).max()):
        raise AssertionError(f"smoothed means differ from dynamax's by {gap}")
    return [
        _row(
            "kalman_log_likelihood vs dynamax lgssm_filter (f64, jit)",
            setting,
            timed_pair(ours, their_ll, repeats, device),
        ),
        _row(
            "kalman_filter (all moments) vs dynamax lgssm_filter",
            setting,
            timed_pair(ours_filter, their_filter, repeats, device),
        ),
        _row(
            "kalman_smoother vs dynamax lgssm_smoother",
            setting,
            timed_pair(ours_smoother, their_smoother, repeats, device),
        ),
    ]


def kalman_tables(lengths, repeats, device):
    rows, grad_rows = [], []
    have_statsmodels = _installed("statsmodels")
    peer = _dynamax()
    dtype = torch.float64
    truth = torch.tensor([0.1, 0.01, 0.05, 0.5], dtype=dtype)
    generator = torch.Generator().manual_seed(1)
    for T in lengths:
        season = torch.sin(2 * torch.pi * torch.arange(T, dtype=dtype) / PERIOD)
        trend = torch.cumsum(0.01 + 0.1 * torch.randn(T, generator=generator, dtype=dtype), 0)
        y = (trend + season + 0.7 * torch.randn(T, generator=generator, dtype=dtype)).to(device)
        S = 2 + PERIOD - 1
        init_mean = torch.zeros(S, dtype=dtype, device=device)
        init_cov = 10.0 * torch.eye(S, dtype=dtype, device=device)
        variances = truth.to(device)

        def ours():
            G, F, W, V = trend_seasonal_matrices(variances, dtype, device)
            matrices = StateSpaceMatrices(G, F, W, V, init_mean, init_cov)
            return kalman_log_likelihood(y[:, None], matrices)

        def ours_filter():
            G, F, W, V = trend_seasonal_matrices(variances, dtype, device)
            return kalman_filter(y[:, None], StateSpaceMatrices(G, F, W, V, init_mean, init_cov))

        leaf = variances.clone().requires_grad_()

        def ours_grad():
            G, F, W, V = trend_seasonal_matrices(leaf, dtype, device)
            matrices = StateSpaceMatrices(G, F, W, V, init_mean, init_cov)
            kalman_log_likelihood(y[:, None], matrices).backward()

        def ours_smoother():
            G, F, W, V = trend_seasonal_matrices(variances, dtype, device)
            return kalman_smoother(y[:, None], StateSpaceMatrices(G, F, W, V, init_mean, init_cov))

        setting = f"LLT + seasonal(12), T={T:.0e}"
        if device.type == "cpu":
            for name, fn in (
                ("kalman_log_likelihood", ours),
                ("kalman_filter", ours_filter),
                ("kalman_smoother", ours_smoother),
            ):
                rows.append(
                    _row(
                        f"{name}: compiled kernels vs torch scans (f64)",
                        setting,
                        timed_pair(fn, _on_scans(fn), repeats, device),
                    )
                )
        if peer is not None and device.type == "cpu":
            G, F, W, V = trend_seasonal_matrices(variances, dtype, device)
            matrices = StateSpaceMatrices(G, F, W, V, init_mean, init_cov)
            rows.extend(
                _dynamax_kalman_rows(
                    peer, y[:, None], matrices, setting, repeats, device, ours, ours_filter
                )
            )
        if not have_statsmodels:
            rows.append(
                [
                    "kalman_log_likelihood vs statsmodels loglike (f64)",
                    setting,
                    "",
                    "",
                    "not installed",
                ]
            )
            grad_rows.append(
                ["log-lik + backward vs statsmodels score", setting, "", "", "not installed"]
            )
            continue
        from statsmodels.tsa.statespace.structural import UnobservedComponents

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = UnobservedComponents(
                y.cpu().numpy(), level="local linear trend", seasonal=PERIOD
            )
            # statsmodels orders its parameters as (irregular, level, trend, seasonal) variances.
            params = np.array([0.5, 0.1, 0.01, 0.05])
            rows.append(
                _row(
                    "kalman_log_likelihood vs statsmodels loglike (f64)",
                    setting,
                    timed_pair(ours, lambda: model.loglike(params), repeats, device),
                )
            )
            # Filtered moments at every step: statsmodels' `filter` (the whole results object).
            rows.append(
                _row(
                    "kalman_filter (all moments) vs statsmodels filter",
                    setting,
                    timed_pair(ours_filter, lambda: model.filter(params), repeats, device),
                )
            )
            grad_rows.append(
                _row(
                    "log-lik + backward vs statsmodels score",
                    setting,
                    timed_pair(ours_grad, lambda: model.score(params), repeats, device),
                )
            )
    return rows, grad_rows


def dense_state_space(num_states, obs_dim, length, generator, dtype, device):
    """A random static model with dense matrices and a series drawn from it: ``G`` a
    random orthogonal matrix scaled to spectral radius 0.95, ``F`` standard normal, ``W``
    and ``V`` Wishart-like (``Q Q^T / S`` plus a small ridge), a prior of scale 1.
    ``(y (T, p), StateSpaceMatrices)``."""
    S, p = num_states, obs_dim
    g = lambda *shape: torch.randn(*shape, generator=generator, dtype=dtype)  # noqa: E731
    G = 0.95 * torch.linalg.qr(g(S, S))[0]
    F = g(p, S)
    W = (lambda q: q @ q.T / S + 0.01 * torch.eye(S, dtype=dtype))(g(S, S)) * 0.1
    V = (lambda q: q @ q.T / p + 0.1 * torch.eye(p, dtype=dtype))(g(p, p))
    x, ys = torch.zeros(S, dtype=dtype), []
    w_root, v_root = torch.linalg.cholesky(W), torch.linalg.cholesky(V)
    for _ in range(length):
        x = G @ x + w_root @ g(S)
        ys.append(F @ x + v_root @ g(p))
    prior = (torch.zeros(S, dtype=dtype), torch.eye(S, dtype=dtype))
    matrices = StateSpaceMatrices(G, F, W, V, *prior)
    return torch.stack(ys).to(device), StateSpaceMatrices(*(t.to(device) for t in matrices))


#: the issue's Kalman sizes against dynamax: (states S, observed coordinates p)
DENSE_SIZES = ((8, 2), (20, 2))


def dense_kalman_table(length, repeats, device):
    """``kalman_log_likelihood``, ``kalman_filter`` and ``kalman_smoother`` against
    dynamax's jitted ``lgssm_filter`` / ``lgssm_smoother`` on random dense static models at
    the issue's sizes (:data:`DENSE_SIZES`), T = ``length``; and the compiled kernels
    against the torch scans on the same calls."""
    peer = _dynamax()
    rows = []
    generator = torch.Generator().manual_seed(3)
    for S, p in DENSE_SIZES:
        y, matrices = dense_state_space(S, p, length, generator, torch.float64, device)
        setting = f"dense S={S}, p={p}, T={length:.0e}"

        def ours():
            return kalman_log_likelihood(y, matrices)

        def ours_filter():
            return kalman_filter(y, matrices)

        if device.type == "cpu":
            for name, fn in (
                ("kalman_log_likelihood", ours),
                ("kalman_filter", ours_filter),
                ("kalman_smoother", lambda: kalman_smoother(y, matrices)),
            ):
                rows.append(
                    _row(
                        f"{name}: compiled kernels vs torch scans (f64)",
                        setting,
                        timed_pair(fn, _on_scans(fn), repeats, device),
                    )
                )
        if peer is None or device.type != "cpu":
            rows.append(["dynamax lgssm_filter", setting, "", "", "not run"])
            continue
        rows.extend(
            _dynamax_kalman_rows(peer, y, matrices, setting, repeats, device, ours, ours_filter)
        )
    return rows


def dlm_fit_table(repeats, device):
    """``fit_dlm`` (its default 3 starts, and one) against statsmodels' ``fit`` of the
    local level model on the Nile, with the log-likelihood each reaches (ours evaluated
    at statsmodels' estimates, so that the two are on one scale)."""
    if not _installed("statsmodels") or device.type != "cpu":
        return [["fit_dlm vs statsmodels fit", "Nile local level", "", "", "not run"]], ""
    from statsmodels.tsa.statespace.structural import UnobservedComponents

    from pyro_ext.datasets import load_nile
    from pyro_ext.timeseries import DLM, LocalLevel, fit_dlm

    flow = load_nile(dtype=torch.float64)[1]

    def local_level(s):
        return DLM(LocalLevel(s["level"], init_scale=1e4), s["observation"])

    start = {"level": 10.0, "observation": 100.0}
    model = UnobservedComponents(flow.numpy(), "local level")

    def theirs():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return model.fit(disp=False)

    rows = []
    for method, restarts in (("lbfgs", 3), ("lbfgs", 1), ("em", 3), ("em", 1)):
        timing = timed_pair(
            lambda method=method, restarts=restarts: fit_dlm(
                local_level, flow, start, num_restarts=restarts, method=method
            ),
            theirs,
            repeats,
            device,
        )
        label = (
            f"fit_dlm (method={method!r}, {restarts} start{'s' if restarts > 1 else ''}) "
            "vs statsmodels fit"
        )
        rows.append(_row(label, "Nile local level (T = 100)", timing))
    ours = fit_dlm(local_level, flow, start)
    em = fit_dlm(local_level, flow, start, method="em")
    irregular, level = theirs().params
    at_theirs = local_level(
        {"level": torch.tensor(level**0.5), "observation": torch.tensor(irregular**0.5)}
    ).log_likelihood(flow)
    note = (
        f"Estimates (observation, level variances): ours {ours.scales['observation'] ** 2:.0f} / "
        f"{ours.scales['level'] ** 2:.1f}, statsmodels {irregular:.0f} / {level:.1f}; our "
        f"log-likelihood at ours {ours.log_likelihood:.4f}, at statsmodels' {float(at_theirs):.4f}; "
        f"EM's estimates {em.scales['observation'] ** 2:.0f} / {em.scales['level'] ** 2:.1f}, "
        f"log-likelihood {em.log_likelihood:.4f}."
    )
    return rows, note


def main(argv=None):
    parser = argument_parser(
        __doc__, RESULTS, quick="small sizes, 2 repeats (smoke test)", threads=1
    )
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    repeats = args.repeats or (2 if args.quick else 7)
    hmm_sizes = (
        [(3, 200), (20, 200)]
        if args.quick
        else [(3, 1000), (3, 100000), (10, 100000), (20, 1000), (20, 100000)]
    )
    kalman_lengths = [200] if args.quick else [1000, 10000]

    # Funsor first: once jax is imported (the dynamax rows), funsor's
    # is_jax_compiled_function fails on every call of a process that did not set its jax
    # backend (funsor 0.4.8).
    enum_rows = enumeration_table(200, repeats, device)
    loglik_rows, grad_rows, viterbi_rows, smooth_rows = hmm_tables(hmm_sizes, repeats, device)
    kalman_rows, kalman_grad_rows = kalman_tables(kalman_lengths, repeats, device)
    dense_rows = dense_kalman_table(200 if args.quick else 10000, repeats, device)
    fit_rows, fit_note = dlm_fit_table(repeats, device)
    header = [
        "ours vs baseline",
        "setting",
        "ours ms (median / mean / p90 / max)",
        "baseline ms (median / mean / p90 / max)",
        "ratio (median of the repeats' ratios)",
    ]
    peers = (
        ", ".join(
            f"{m} {_installed(m)}"
            for m in ("hmmlearn", "statsmodels", "dynamax", "jax")
            if _installed(m)
        )
        or "none"
    )
    preamble = (
        "# Exact state-space inference: speed against baselines\n\n"
        f"Device {device}, {args.threads} thread(s), {repeats} repeats; torch {torch.__version__}, "
        f"pyro-ppl {version('pyro-ppl')}; peers: {peers}. Ratio < 1 means ours is faster. "
        "Generated by `python benchmarks/timeseries_speed.py`."
    )
    sections = [
        "## HMM log-likelihood\n\n" + markdown(header, loglik_rows),
        "## HMM log-likelihood with gradient\n\n" + markdown(header, grad_rows),
        "## Viterbi\n\n" + markdown(header, viterbi_rows),
        "## Smoothing (forward-backward)\n\n" + markdown(header, smooth_rows),
        "## HMM as a Pyro model: exact marginal vs funsor enumeration\n\n"
        + markdown(header, enum_rows),
        "## Kalman log-likelihood\n\n" + markdown(header, kalman_rows),
        "## Kalman log-likelihood with gradient\n\n" + markdown(header, kalman_grad_rows),
        "## Kalman inference on dense models (the issue's sizes)\n\n"
        + markdown(header, dense_rows),
        "## DLM maximum likelihood\n\n" + markdown(header, fit_rows) + "\n\n" + fit_note,
    ]
    write_report(preamble, sections, args.output)


if __name__ == "__main__":
    main()
