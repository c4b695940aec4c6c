"""
The Kalman log-likelihood's gradient on CPU: the compiled kernels' closed-form score against
the torch scans' autograd, by state dimension and series length (issue 36: fitting at
compiled speed).

``kalman_log_likelihood`` with a gradient wanted can take it two ways on CPU:

* **score**: the compiled filter and RTS smoother (numba) and a third kernel that forms the
  exact gradient with respect to ``y`` and all six matrices from their moments (Fisher's
  identity; ``pyro_ext.timeseries.kalman._score_terms``), no autograd tape. Its work grows as
  ``T S^3``.
* **scans**: autograd through the torch scans, the engine of CUDA and ``torch.func`` calls:
  the blocked filter for static matrices (``~sqrt(T)`` blocks), the per-step associative scan
  for time-varying ones.

The default takes the score for time-varying matrices and, for static ones, while ``batch x
T x S^3`` is at most ``_SCORE_WORK_LIMIT`` (4e6); this table is the measurement that sets
that limit. Model: a dense random stable DLM (``G = 0.5 I + 0.7 Z / sqrt(S)``, shrunk to spectral radius
0.95 where larger; ``W = A A^T + 0.05 I``, ``F`` ``(1, S)`` Gaussian, ``V = b^2 + 0.1``), one observed series, float64, one CPU
thread; the timed call builds the matrices from a scale with ``requires_grad`` and runs
``kalman_log_likelihood`` and ``torch.autograd.grad``. Both engines are checked to give the
same gradient (relative 1e-6) before timing. Times in ms per call, median / mean / p90 / max
over the repeats (each repeat a batch of back-to-back calls lasting at least 20 ms); ratio:
median over repeats of score / scans, timed back to back.

A second table times ``fit_dlm``'s evaluation where ``W`` and ``V`` are linear in the squared
scales: the forward-mode filter (``tangent_filter``: the log-likelihood and its derivatives
along each squared scale in one pass, what an L-BFGS evaluation runs, its ``W`` and ``V``
assembly included) against the filter, RTS smoother and score kernels on the same arrays
(what it ran before), on a local level (S = 1, 2 scales) and a local linear trend with a
12-season component (S = 13, 4 scales), a Gaussian random walk observed. The two gradients
are checked to agree (relative 1e-8) before timing.
"""

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import argument_parser, markdown, spread, write_report  # noqa: E402
from timeseries_speed import timed_pair  # noqa: E402

from pyro_ext.timeseries import (  # noqa: E402
    DLM,
    LocalLevel,
    LocalLinearTrend,
    Seasonal,
    StateSpaceMatrices,
    dlm_fit,  # noqa: E402
    kalman_log_likelihood,
    sequential_kernels,
)
from pyro_ext.timeseries import kalman as kalman_module  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "kalman_gradient.md"
D = torch.float64


def random_model(S, T, time_varying, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, generator=g, dtype=D)

    steps = (T,) if time_varying else ()
    G = 0.7 * rn(*steps, S, S) / S**0.5 + 0.5 * torch.eye(S, dtype=D)
    # Stable (spectral radius at most 0.95): the blocked scan loses digits on explosive
    # models, and the two engines are compared before timing.
    radius = torch.linalg.eigvals(G).abs().amax(-1)[..., None, None]
    G = G * (0.95 / radius).clamp(max=1.0)
    A = rn(*steps, S, S)
    W = A @ A.mT + 0.05 * torch.eye(S, dtype=D)
    F = rn(*steps, 1, S)
    V = rn(*steps, 1, 1).square() + 0.1
    y = rn(T, 1)
    return y, StateSpaceMatrices(G, F, W, V, torch.zeros(S, dtype=D), torch.eye(S, dtype=D))


def gradient_call(y, matrices):
    scale = torch.tensor(1.0, dtype=D, requires_grad=True)

    def call():
        ll = kalman_log_likelihood(
            y, matrices._replace(transition_cov=matrices.transition_cov * scale)
        )
        return torch.autograd.grad(ll, scale)[0]

    return call


class _ScoreAtAnySize:
    """Within the block, the score path regardless of its work limit."""

    def __enter__(self):
        self.limit = kalman_module._SCORE_WORK_LIMIT
        kalman_module._SCORE_WORK_LIMIT = float("inf")

    def __exit__(self, *exc):
        kalman_module._SCORE_WORK_LIMIT = self.limit


def score_call(call):
    def run():
        with _ScoreAtAnySize():
            return call()

    return run


def scans_call(call):
    def run():
        with sequential_kernels(False):
            return call()

    return run


def _dlm(name):
    """``(names, log-scales -> DLM)`` of the one-pass table's models."""
    if name == "local level":
        names = ["level", "obs"]

        def make(s):
            return DLM(LocalLevel(s["level"], init_scale=1e4), s["obs"])

    else:
        names = ["level", "slope", "season", "obs"]

        def make(s):
            trend = LocalLinearTrend(s["level"], s["slope"], init_scale=10.0)
            return DLM([trend, Seasonal(12, s["season"], init_scale=10.0)], s["obs"])

    return names, lambda log_s: make({n: log_s[i].exp() for i, n in enumerate(names)})


def one_pass_rows(cases, repeats):
    """fit_dlm's evaluation: the one-pass forward-mode filter against the three kernels."""
    rows = []
    for name, T in cases:
        names, build = _dlm(name)
        y = torch.randn(T, generator=torch.Generator().manual_seed(0), dtype=D).cumsum(0)
        point = torch.full((len(names),), -0.5, dtype=D)
        scored = dlm_fit._kernel_score(build, point, y)
        linear, _ = dlm_fit._linear_in_squared_scales(build, point, T)
        inputs = dlm_fit._KernelInputs.of(linear, y)
        x = point.numpy()
        squared = inputs.at(x)
        run = inputs.run
        assert run.score()
        three = (
            2
            * squared
            * (
                inputs.state @ run.grads[3][0, 0].diagonal()
                + inputs.observation * run.grads[4][0, 0, 0, 0]
            )
        )
        _, one = scored(x)
        if not torch.allclose(
            torch.from_numpy(one), torch.from_numpy(three), rtol=1e-8, atol=1e-10
        ):
            raise RuntimeError(f"the two gradients disagree on {name}, T={T}: {one} vs {three}")
        t_one, t_three, ratio = timed_pair(lambda: scored(x), run.score, repeats, y.device)
        S = run.arrays[5].shape[-1]
        rows.append(
            [
                name,
                S,
                len(names),
                f"{T:,}",
                spread(t_one, 1e3, "{:.3f}"),
                spread(t_three, 1e3, "{:.3f}"),
                f"{ratio:.2f}",
            ]
        )
        print(rows[-1], flush=True)
    return rows


def main(argv=None):
    parser = argument_parser(__doc__, RESULTS, quick="two small sizes, 2 repeats (smoke test)")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    repeats = args.repeats or (2 if args.quick else 5)
    if args.quick:
        cases = [(False, 1, 100), (False, 4, 100), (True, 4, 100)]
    else:
        cases = [(False, S, T) for S in (1, 2, 4, 8, 13, 20) for T in (100, 1000, 10000)]
        cases += [(True, S, T) for S in (4, 13, 20) for T in (100, 1000)] + [(True, 4, 10000)]
    started = time.perf_counter()
    rows = []
    for time_varying, S, T in cases:
        y, matrices = random_model(S, T, time_varying)
        call = gradient_call(y, matrices)
        ours, theirs = score_call(call)(), scans_call(call)()
        if not torch.allclose(ours, theirs, rtol=1e-6, atol=1e-9):
            raise RuntimeError(f"the engines disagree at S={S}, T={T}: {ours} vs {theirs}")
        work = T * S**3
        default = "score" if time_varying or work <= kalman_module._SCORE_WORK_LIMIT else "scans"
        t_score, t_scans, ratio = timed_pair(score_call(call), scans_call(call), repeats, y.device)
        rows.append(
            [
                "time-varying" if time_varying else "static",
                S,
                f"{T:.0e}",
                f"{work:.1e}",
                spread(t_score, 1e3, "{:.2f}"),
                spread(t_scans, 1e3, "{:.2f}"),
                f"{ratio:.2f}",
                default,
            ]
        )
        print(rows[-1], flush=True)
    header = [
        "matrices",
        "S",
        "T",
        "T S^3",
        "score ms (median / mean / p90 / max)",
        "scans ms (median / mean / p90 / max)",
        "score / scans",
        "default engine",
    ]
    one_pass_cases = (
        [("local level", 100), ("trend + 12 seasons", 100)]
        if args.quick
        else [("local level", 100), ("local level", 1000), ("trend + 12 seasons", 500)]
        + [("trend + 12 seasons", 5000)]
    )
    one_pass = one_pass_rows(one_pass_cases, repeats)
    one_pass_header = [
        "model",
        "S",
        "scales",
        "T",
        "one pass ms (median / mean / p90 / max)",
        "filter + smoother + score ms (median / mean / p90 / max)",
        "one pass / three",
    ]
    preamble = (
        "# The Kalman log-likelihood's gradient: the kernels' score vs the scans' autograd\n\n"
        f"{'Quick mode (numbers not meaningful). ' if args.quick else ''}torch "
        f"{torch.__version__}, CPU, 1 thread, float64, {repeats} repeats; "
        f"{time.perf_counter() - started:.0f} s. Generated by `python "
        f"benchmarks/kalman_gradient.py{' --quick' if args.quick else ''}`. Protocol: the "
        "script's docstring. Ratio < 1: the score is faster."
    )
    write_report(
        preamble,
        [
            "## Gradient of log p(y), one series\n\n" + markdown(header, rows),
            "## fit_dlm's evaluation: one forward pass against the filter, smoother and score\n\n"
            + markdown(one_pass_header, one_pass),
        ],
        args.output,
    )


if __name__ == "__main__":
    main()
