"""
Fitting discrete HMMs by EM: ``HiddenMarkovModel.fit`` (exact Baum-Welch) against
``hmmlearn``'s EM (C forward-backward) and dynamax's ``fit_em``, on series simulated from
known parameters (issue 36: "fitting, not only inference").

For each emission family (Gaussian, Poisson, categorical; K = 3 states, T = ``--length``
steps, a sticky transition matrix) and each of ``--seeds`` simulated series:

1. **Same start**: both libraries run EM from the same parameters (a random draw) to
   convergence (tolerance 1e-4 on the total log-likelihood for both, at most 500
   iterations): the log-likelihood each reaches, the difference, the iterations and the
   wall time. With the same start and the same updates they should reach the same optimum.
   The same against dynamax's ``fit_em`` (the ``bench`` extra; its priors made flat), per
   EM iteration and per fit (:func:`dynamax_fit` says how each is timed).
2. **Defaults**: what a user gets with only the required arguments. Ours: ``fit(y)`` (5
   starts, the first at the data's quantiles). hmmlearn: ``GaussianHMM(3)`` (k-means start),
   ``PoissonHMM(3)``, ``CategoricalHMM(3)`` with ``fit(y)`` (one start). The
   log-likelihood reached, and the largest error of the recovered emission parameters
   (states matched by sorting the means / rates / the probability of symbol 0).

Wall times are medians over seeds, with mean / p90 / max beside them; one thread.

Run from the repository root::

    python benchmarks/hmm_fit.py            # 5 seeds, T = 2000
    python benchmarks/hmm_fit.py --quick    # smoke test

The tables are printed and written to ``benchmarks/results/hmm_fit.md``.
"""

import time

import numpy as np
import torch
from _common import REPO, argument_parser, markdown, spread, write_report

from pyro_ext.timeseries import HiddenMarkovModel, hmm_log_likelihood

RESULTS = REPO / "benchmarks" / "results" / "hmm_fit.md"
TRANS = torch.tensor([[0.9, 0.05, 0.05], [0.1, 0.8, 0.1], [0.05, 0.15, 0.8]], dtype=torch.float64)
TRUTH = {
    "gaussian": {
        "emission_loc": torch.tensor([-2.0, 0.0, 3.0]),
        "emission_scale": torch.tensor([0.5, 0.4, 0.6]),
    },
    "poisson": {"emission_rates": torch.tensor([1.0, 5.0, 12.0])},
    "categorical": {
        "emission_probs": torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]])
    },
}
TOLERANCE, MAX_ITER = 1e-4, 500


def simulate(emission, length, seed):
    generator = torch.Generator().manual_seed(seed)
    z = [0]
    for _ in range(length - 1):
        z.append(int(torch.multinomial(TRANS[z[-1]], 1, generator=generator)))
    z = torch.tensor(z)
    truth = TRUTH[emission]
    if emission == "gaussian":
        noise = torch.randn(length, generator=generator, dtype=torch.float64)
        return truth["emission_loc"].double()[z] + truth["emission_scale"].double()[z] * noise
    if emission == "poisson":
        return torch.poisson(truth["emission_rates"].double()[z], generator=generator)
    return torch.multinomial(truth["emission_probs"].double()[z], 1, generator=generator)[:, 0]


def random_start(emission, seed):
    generator = torch.Generator().manual_seed(10_000 + seed)

    def rows(shape):
        draw = torch.rand(shape, generator=generator, dtype=torch.float64) + 0.5
        return draw / draw.sum(-1, keepdim=True)

    start = {"init_probs": rows((3,)), "transition_probs": rows((3, 3))}
    if emission == "gaussian":
        start["emission_loc"] = torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64)
        start["emission_scale"] = torch.ones(3, dtype=torch.float64)
    elif emission == "poisson":
        start["emission_rates"] = torch.tensor([2.0, 4.0, 8.0], dtype=torch.float64)
    else:
        start["emission_probs"] = rows((3, 3))
    return start


def peer(emission, start=None):
    from hmmlearn import hmm

    options = dict(n_iter=MAX_ITER, tol=TOLERANCE)
    if start is not None:
        options["init_params"] = ""
    if emission == "gaussian":
        # No prior on the variances: maximum likelihood, as ours.
        model = hmm.GaussianHMM(3, covariance_type="diag", covars_prior=0.0, **options)
    elif emission == "poisson":
        model = hmm.PoissonHMM(3, **options)
    else:
        model = hmm.CategoricalHMM(3, n_features=3, **options)
    if start is not None:
        model.startprob_ = start["init_probs"].numpy()
        model.transmat_ = start["transition_probs"].numpy()
        if emission == "gaussian":
            model.means_ = start["emission_loc"].numpy()[:, None]
            model.covars_ = start["emission_scale"].numpy()[:, None] ** 2
        elif emission == "poisson":
            model.lambdas_ = start["emission_rates"].numpy()[:, None]
        else:
            model.emissionprob_ = start["emission_probs"].numpy()
    return model


#: dynamax's priors made (nearly) flat, so that its EM's MAP is the maximum-likelihood
#: estimate ours and hmmlearn's reach: Dirichlet and gamma shapes of 1 + 1e-6 (exactly 1 puts
#: 0 * log 0 = NaN in its log-prior once a probability reaches 0), a gamma rate of 1e-12.
#: Its Gaussian emissions keep their default normal-inverse-Wishart prior (weak: a
#: concentration and scale of 1e-4), which has no flat setting.
DYNAMAX_FLAT = 1.0 + 1e-6


def dynamax_fit(emission, y, start):
    """dynamax's ``fit_em`` from ``start``: ``(log-likelihood, iterations, seconds per
    call, seconds per iteration)``, or ``None`` without dynamax. ``fit_em`` runs a fixed
    number of iterations and jits its EM step afresh at every call: a call of ``MAX_ITER``
    iterations finds where its objective stops rising by ``TOLERANCE`` (the iterations
    reported), and its difference from a call of one iteration, per further iteration, is
    the EM step's own time (its jit excluded); a call of the iterations reported is what a
    user's fit costs."""
    try:
        import jax

        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        from dynamax.hidden_markov_model import CategoricalHMM, GaussianHMM, PoissonHMM
    except ImportError:
        return None
    flat = dict(
        initial_probs_concentration=DYNAMAX_FLAT, transition_matrix_concentration=DYNAMAX_FLAT
    )
    probs = dict(
        initial_probs=jnp.asarray(start["init_probs"].numpy()),
        transition_matrix=jnp.asarray(start["transition_probs"].numpy()),
    )
    if emission == "gaussian":
        model = GaussianHMM(3, 1, **flat)
        params, props = model.initialize(
            **probs,
            emission_means=jnp.asarray(start["emission_loc"].numpy())[:, None],
            emission_covariances=jnp.asarray(start["emission_scale"].numpy() ** 2)[:, None, None],
        )
    elif emission == "poisson":
        model = PoissonHMM(
            3, 1, emission_prior_concentration=DYNAMAX_FLAT, emission_prior_rate=1e-12, **flat
        )
        params, props = model.initialize(
            **probs, emission_rates=jnp.asarray(start["emission_rates"].numpy())[:, None]
        )
    else:
        model = CategoricalHMM(3, 1, 3, emission_prior_concentration=DYNAMAX_FLAT, **flat)
        params, props = model.initialize(
            **probs, emission_probs=jnp.asarray(start["emission_probs"].numpy())[:, None, :]
        )
    data = jnp.asarray((y.long() if emission == "categorical" else y).numpy())[:, None]

    def fit(num_iters):
        fitted, objective = model.fit_em(params, props, data, num_iters=num_iters, verbose=False)
        return jax.block_until_ready(fitted), np.asarray(objective)

    fit(1)  # jax's own first-call set-up, which a user pays once per process
    (_, objective), full = timed(fit, MAX_ITER)
    one = timed(fit, 1)[1]
    gains = np.diff(objective)
    iterations = int(np.argmax(gains < TOLERANCE)) + 2 if (gains < TOLERANCE).any() else MAX_ITER
    (fitted, _), seconds = timed(fit, iterations)
    # Over MAX_ITER - 1 iterations, the jit's run-to-run spread (tens of ms) stays small.
    per_iteration = (full - one) / (MAX_ITER - 1)
    return float(model.marginal_log_prob(fitted, data)), iterations, seconds, per_iteration


def as_peer_data(emission, y):
    return y.long().numpy()[:, None] if emission == "categorical" else y.numpy()[:, None]


def emission_error(emission, params):
    """The largest absolute error of the emission parameters, states matched by sorting."""
    truth = TRUTH[emission]
    if emission == "categorical":
        probs = torch.as_tensor(params["emission_probs"]).double()
        order = probs[:, 0].argsort(descending=True)
        true_order = truth["emission_probs"][:, 0].argsort(descending=True)
        return float((probs[order] - truth["emission_probs"].double()[true_order]).abs().max())
    errors = []
    key = "emission_loc" if emission == "gaussian" else "emission_rates"
    order = torch.as_tensor(params[key]).argsort()
    for name, value in truth.items():
        fitted = torch.as_tensor(params[name]).double()[order]
        errors.append(float((fitted - value.double()).abs().max()))
    return max(errors)


def peer_params(emission, model):
    if emission == "gaussian":
        return {
            "emission_loc": model.means_[:, 0],
            "emission_scale": np.sqrt(model.covars_.reshape(3, -1)[:, 0]),
        }
    if emission == "poisson":
        return {"emission_rates": model.lambdas_[:, 0]}
    return {"emission_probs": model.emissionprob_}


def timed(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), wall seconds)``."""
    began = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - began


def run(emission, seeds, length):
    num_symbols = 3 if emission == "categorical" else None
    rows = {"same": [], "default": [], "dynamax": []}
    for seed in seeds:
        y = simulate(emission, length, seed)
        data = as_peer_data(emission, y)
        model = HiddenMarkovModel(3, emission, num_symbols=num_symbols)
        start = random_start(emission, seed)
        # The same start: a total-log-likelihood tolerance for both.
        ours, our_seconds = timed(
            model.fit,
            y,
            init=start,
            num_restarts=1,
            max_iterations=MAX_ITER,
            tolerance=TOLERANCE / length,
        )
        theirs = peer(emission, start)
        their_seconds = timed(theirs.fit, data)[1]
        dynamax = dynamax_fit(emission, y, start)
        if dynamax is not None:
            # Ours per iteration, as dynamax's: the difference from a fit of one iteration.
            one = timed(
                model.fit, y, init=start, num_restarts=1, max_iterations=1, tolerance=1e-300
            )[1]
            per_iteration = (our_seconds - one) / max(ours.num_iterations - 1, 1)
            rows["dynamax"].append(
                (ours.log_likelihood, ours.num_iterations, our_seconds, *dynamax, per_iteration)
            )
        rows["same"].append(
            (
                ours.log_likelihood,
                theirs.score(data),
                ours.num_iterations,
                len(theirs.monitor_.history),
                our_seconds,
                their_seconds,
            )
        )
        # Defaults.
        ours, our_seconds = timed(model.fit, y)
        theirs = peer(emission).set_params(random_state=seed)
        their_seconds = timed(theirs.fit, data)[1]
        rows["default"].append(
            (
                ours.log_likelihood,
                theirs.score(data),
                emission_error(emission, ours.params),
                emission_error(emission, peer_params(emission, theirs)),
                our_seconds,
                their_seconds,
            )
        )
    return rows


def main(argv=None):
    parser = argument_parser(__doc__, RESULTS, quick="2 seeds, T = 300", seeds="seeds (default 5)")
    parser.add_argument("--length", type=int, default=None, help="steps per series (2000)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    seeds = list(range(args.seeds or (2 if args.quick else 5)))
    length = args.length or (300 if args.quick else 2000)
    # The first HMM call of a process loads numba and the cached compiled kernels (the fast
    # extra; compiling them, on a fresh install, takes seconds more): timed here, once, and
    # kept out of the fits' times, as hmmlearn's import is.
    began = time.perf_counter()
    hmm_log_likelihood(torch.zeros(2), torch.zeros(2, 2), torch.zeros(3, 2))
    first_call = time.perf_counter() - began
    same_rows, default_rows, dynamax_rows = [], [], []
    for emission in ("gaussian", "poisson", "categorical"):
        rows = run(emission, seeds, length)
        lls = [(o, t) for o, t, *_ in rows["same"]]
        same_rows.append(
            [
                emission,
                f"{np.median([o for o, _ in lls]):.2f}",
                f"{min(o - t for o, t in lls):+.1e} / {max(o - t for o, t in lls):+.1e}",
                f"{np.median([r[2] for r in rows['same']]):.0f} / "
                f"{np.median([r[3] for r in rows['same']]):.0f}",
                spread([r[4] for r in rows["same"]], 1e3),
                spread([r[5] for r in rows["same"]], 1e3),
                f"{np.median([r[4] / r[5] for r in rows['same']]):.1f}",
            ]
        )
        default_rows.append(
            [
                emission,
                f"{np.median([r[0] - r[1] for r in rows['default']]):+.2f} "
                f"(min {min(r[0] - r[1] for r in rows['default']):+.2f})",
                f"{np.median([r[2] for r in rows['default']]):.3f} / "
                f"{max(r[2] for r in rows['default']):.3f}",
                f"{np.median([r[3] for r in rows['default']]):.3f} / "
                f"{max(r[3] for r in rows['default']):.3f}",
                spread([r[4] for r in rows["default"]], 1e3),
                spread([r[5] for r in rows["default"]], 1e3),
            ]
        )
        if rows["dynamax"]:
            runs = rows["dynamax"]
            dynamax_rows.append(
                [
                    emission,
                    f"{min(r[0] - r[3] for r in runs):+.1e} / {max(r[0] - r[3] for r in runs):+.1e}",
                    f"{np.median([r[1] for r in runs]):.0f} / {np.median([r[4] for r in runs]):.0f}",
                    spread([r[7] for r in runs], 1e3, "{:.2f}"),
                    spread([r[6] for r in runs], 1e3, "{:.2f}"),
                    f"{np.median([r[7] / r[6] for r in runs]):.2f}",
                    spread([r[2] for r in runs], 1e3),
                    spread([r[5] for r in runs], 1e3),
                ]
            )
        print(f"  {emission} done", flush=True)
    from hmmlearn import __version__ as hmmlearn_version

    try:
        from dynamax import __version__ as dynamax_version
    except ImportError:
        dynamax_version = None

    preamble = (
        "# Fitting discrete HMMs by EM, against hmmlearn and dynamax\n\n"
        f"`python benchmarks/hmm_fit.py {'--quick' if args.quick else ''}`: K = 3, T = {length}, "
        f"{len(seeds)} simulated series per family; torch {torch.__version__}, hmmlearn "
        f"{hmmlearn_version}; one thread. The E-step runs on the compiled sequential kernels "
        f"(numba; the process's first HMM call, {first_call:.2f} s, loads them and is not in "
        "the times)."
    )
    sections = [
        "## The same start, to convergence\n\n"
        + markdown(
            [
                "emission",
                "log-likelihood (median)",
                "ours - hmmlearn (min / max)",
                "iterations ours / hmmlearn (median)",
                "ours ms (median / mean / p90 / max)",
                "hmmlearn ms",
                "time ratio (median)",
            ],
            same_rows,
        ),
        "## Defaults (only the required arguments)\n\n"
        "Ours: `HiddenMarkovModel(3, emission).fit(y)`, 5 starts. hmmlearn: the family's class "
        "with `n_components=3` (one start; k-means for Gaussian means).\n\n"
        + markdown(
            [
                "emission",
                "log-likelihood ours - hmmlearn (median, min)",
                "emission error ours (median / max)",
                "emission error hmmlearn (median / max)",
                "ours ms (median / mean / p90 / max)",
                "hmmlearn ms",
            ],
            default_rows,
        ),
    ]
    if not dynamax_rows:
        sections.insert(
            1,
            "## The same start, against dynamax's `fit_em`\n\n"
            'dynamax is not installed here (`pip install -e ".[bench]"`): no rows.',
        )
    else:
        sections.insert(
            1,
            f"## The same start, against dynamax {dynamax_version}'s `fit_em`\n\n"
            "dynamax's priors made flat (Dirichlet and gamma shapes 1 + 1e-6, gamma rate "
            "1e-12), so that its EM's MAP is the maximum-likelihood estimate; its Gaussian "
            "emissions keep their default normal-inverse-Wishart prior (concentration and "
            "scale 1e-4), which has no flat setting, so its Gaussian optimum sits slightly "
            "below. The log-likelihoods are `marginal_log_prob` (dynamax) and `fit`'s "
            "(ours), both exact. `fit_em` runs a fixed number of iterations: its iterations "
            "are where its objective stops rising by 1e-4, as ours stops. Per iteration: "
            "ours, the difference between the fit and a fit of one iteration from the same "
            "start, per further iteration; dynamax's, the difference between calls of 500 "
            "iterations and of one, per further iteration (its jit excluded). Per fit: the wall time of the call, which for `fit_em` includes "
            "the jit of its EM step, done afresh at every call (float64, one process).\n\n"
            + markdown(
                [
                    "emission",
                    "log-likelihood ours - dynamax (min / max)",
                    "iterations ours / dynamax (median)",
                    "ours ms per iteration (median / mean / p90 / max)",
                    "dynamax ms per iteration",
                    "per-iteration ratio (median)",
                    "ours ms per fit",
                    "dynamax ms per fit_em call",
                ],
                dynamax_rows,
            ),
        )
    write_report(preamble, sections, args.output)


if __name__ == "__main__":
    main()
