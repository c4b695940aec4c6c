"""
SGLD vs SGLD+R on the synthetic targets of thesis section 2.3 (Gallego, 2021): tables 2.1
and 2.2, and the SVGD vs SGLD+R example of section 2.3.1, printed beside the thesis' numbers.

Targets (each a Pyro model with one latent site ``x``):

- MoE, the mixture of exponentials p(x) = sum_i pi_i lambda_i exp(-lambda_i x) with
  lambda = (1.5, 0.5), pi = (1/3, 2/3). The site has positive support, so the kernels sample
  log x (with the log-Jacobian), the thesis' reparameterisation. L = 10 particles.
- MoG, the 3 x 3 grid of 2-D Gaussians centred at {-2, 0, 2}^2 with covariance 0.1 I and
  equal weights. L = 20 particles.

Protocol (thesis): 500 burn-in steps, then 500 steps keeping every 10th (50 draws per
particle), constant step size, particles drawn from a prior: log x ~ N(0, 1) for MoE,
x ~ N(0, I) for MoG. ``SGLD`` runs independent particles, ``SGLD+R`` the same kernel with
``repulsion="rbf"`` (median-heuristic bandwidth). Both methods get the same seeds, hence the
same initial particles. Per seed we measure

- the error |mean of the pooled draws - E[X]| (Euclidean norm for MoG); E[X] = sum_i
  pi_i / lambda_i for MoE and 0 for MoG;
- the ESS of x (``pyro.ops.stats.effective_sample_size``, particles as chains, mean over
  dimensions) and ESS/s, with the wall time of ``mcmc.run`` (one CPU thread: the tensors
  are tiny, and extra threads only add noise on a shared machine);
- the IMQ kernel Stein discrepancy (``pyro_ext.ops.kernel_stein_discrepancy``) of the pooled
  draws in the sampler's unconstrained space (log x for MoE, x for MoG), with the exact
  score from autograd of the sampler's own log density (log-Jacobian included). For MoE,
  x-space would not do: the density does not vanish at x = 0, so Stein's identity fails
  and even exact draws keep a KSD near 0.8.

We report mean +- sd over seeds, and medians with the interquartile range for timings.

Step sizes were picked per method and target from the grid ``STEP_GRID`` by the lowest mean
KSD over the pilot seeds ``PILOTS`` (disjoint from the reported seeds); ``--tune``
re-runs that search, prints it, and uses its choice. Per-method steps are needed because
SGLD+R's drift and noise carry the factor K/L of eq. (2.7): at equal step size each
particle's noise variance is L times smaller than under SGLD, and its drift up to L times.

Section 2.3.1 example: target N(0, I) in 2-D, L = 6 particles from N([3, 3], 0.25 I),
T = 200 steps of SVGD (``SGLD(repulsion="rbf", temperature=0)``) and SGLD+R at step size
``EXAMPLE_STEP`` -- the smallest of {0.06, 0.1, 0.2, 0.5, 1} for which the SVGD particles
reach the target's mean (norm < 0.05) within 100 steps, so the estimates come from a
converged population. Estimates pool all particles of the last 100 steps and are averaged
over seeds. The thesis' numbers for this example are printed, to the digit, by the
authors' notebook (github.com/vicgalle/sgmcmc-force, Gaussian_example_jax.ipynb), a
single run that differs from the text: it targets log p = -|z|^2, i.e. N(0, I/2) with
sigma = 0.71; it uses a fixed bandwidth h = 2, step 0.01 and no 1/L factor; its "mu" is
the signed mean of all coordinates; and it pools all 201 iterates, the transient from
(3, 3) included.

Run from the repository root::

    python benchmarks/sgmcmc_synthetic.py            # 10 seeds, about a minute
    python benchmarks/sgmcmc_synthetic.py --quick    # 2 seeds, about 20 s
    python benchmarks/sgmcmc_synthetic.py --tune     # step-size search first, +1 minute
    python benchmarks/sgmcmc_synthetic.py --step default   # each kernel's own step

The tables are printed and written to ``benchmarks/results/sgmcmc_synthetic.md``
(``--step default``: ``sgmcmc_synthetic_default.md``).
"""

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from _common import (
    argument_parser,
    command_line_args,
    markdown,
    mean_sd,
    spread,
    write_report,
)
from pyro.ops.stats import effective_sample_size

from pyro_ext.infer import MCMC, SGLD
from pyro_ext.infer.sgmcmc import ParticlePotential
from pyro_ext.ops import kernel_stein_discrepancy

RESULTS = Path(__file__).resolve().parent / "results" / "sgmcmc_synthetic.md"
WARMUP, KEPT_STEPS, THINNING = 500, 500, 10
METHODS = {"SGLD": None, "SGLD+R": "rbf"}
STEP_GRID = (0.01, 0.03, 0.1, 0.3, 1.0)
PILOTS = (1000, 1001, 1002)
EXAMPLE_STEP = 0.2
EXAMPLE_PARTICLES, EXAMPLE_STEPS, EXAMPLE_POOLED = 6, 200, 100
METRICS = {  # key: (label, digits, higher is better)
    "error": ("Error of E[X]", 2, False),
    "ess": ("ESS", 1, True),
    "ess_per_s": ("ESS/s", 1, True),
    "ksd": ("KSD", 3, False),
    "seconds": ("Wall time per run (s), median / mean / p90 / max", 2, False),
}
TIMINGS = ("seconds",)  # with their tail: median / mean / p90 / max


MOE_WEIGHTS = torch.tensor([1 / 3, 2 / 3])
MOE_RATES = torch.tensor([1.5, 0.5])
MOG_CENTRES = torch.tensor([[a, b] for a in (-2.0, 0.0, 2.0) for b in (-2.0, 0.0, 2.0)])


def moe_model():
    pyro.sample(
        "x", dist.MixtureSameFamily(dist.Categorical(MOE_WEIGHTS), dist.Exponential(MOE_RATES))
    )


def mog_model():
    components = dist.Normal(MOG_CENTRES, math.sqrt(0.1)).to_event(1)
    pyro.sample("x", dist.MixtureSameFamily(dist.Categorical(torch.full((9,), 1 / 9)), components))


def init_log_normal(site):
    return dist.LogNormal(0.0, 1.0).sample(site["fn"].shape())


def init_standard_normal(site):
    return dist.Normal(0.0, 1.0).sample(site["fn"].shape())


class Target(NamedTuple):
    name: str
    model: Callable
    init_strategy: Callable
    num_particles: int
    mean: torch.Tensor
    step_sizes: dict[str, float]
    thesis: dict[str, tuple[float, float]]


TARGETS = (
    Target(
        "MoE",
        moe_model,
        init_log_normal,
        10,
        (MOE_WEIGHTS / MOE_RATES).sum().reshape(1),
        {"SGLD": 0.1, "SGLD+R": 0.3},
        {"error": (0.39, 0.14), "ess": (44.3, 59.1), "ess_per_s": (51.5, 61.0)},
    ),
    Target(
        "MoG",
        mog_model,
        init_standard_normal,
        20,
        torch.zeros(2),
        {"SGLD": 0.03, "SGLD+R": 0.3},
        {"error": (1.42, 1.19), "ess": (151.3, 169.5), "ess_per_s": (36.3, 32.5)},
    ),
)


def run_target(target, method, step_size, seed):
    """The thesis protocol once; returns draws of x (L, 50, d) and the wall time of run()."""
    pyro.set_rng_seed(seed)
    kernel = SGLD(
        target.model,
        step_size,
        num_particles=target.num_particles,
        repulsion=METHODS[method],
        init_strategy=target.init_strategy,
    )
    mcmc = MCMC(
        kernel,
        num_samples=KEPT_STEPS // THINNING,
        warmup_steps=WARMUP,
        thinning=THINNING,
        disable_progbar=True,
    )
    start = time.perf_counter()
    mcmc.run()
    seconds = time.perf_counter() - start
    if step_size is None:
        FROZEN_STEPS.setdefault((target.name, method), []).append(kernel.diagnostics()["step_size"])
    draws = mcmc.get_samples(group_by_chain=True)["x"]
    return draws.reshape(draws.shape[:2] + (-1,)), seconds


DEFAULT_TITLE = ", each kernel's default step"

#: ``--step default``: the step each run's warm-up froze, per (target, method)
FROZEN_STEPS = {}


def evaluate(target, potential, draws, seconds):
    flat = draws.reshape(-1, draws.shape[-1])
    unconstrained = potential.transforms["x"](flat)
    _, score = potential.log_density_and_grad(unconstrained)
    ess = effective_sample_size(draws, chain_dim=0, sample_dim=1).mean().item()
    return {
        "error": (flat.mean(0) - target.mean).norm().item(),
        "ess": ess,
        "ess_per_s": ess / seconds,
        "ksd": kernel_stein_discrepancy(unconstrained, score).item(),
        "seconds": seconds,
    }


def pilot_ksd(target, potential, method, step_size, seed):
    """KSD of one pilot run; inf when the sampler diverges or leaves the support."""
    try:
        draws, seconds = run_target(target, method, step_size, seed)
        return evaluate(target, potential, draws, seconds)["ksd"]
    except (RuntimeError, ValueError):
        # RuntimeError: SamplerDivergenceError, or a kernel matrix that diverging particles
        # overflowed (its Cholesky fails first); ValueError: non-finite draws for the KSD.
        return math.inf


def tune(target):
    """Mean pilot KSD per (method, step size); returns it and the argmin step per method."""
    potential = ParticlePotential(target.model)
    grid = {
        (method, step): np.mean([pilot_ksd(target, potential, method, step, s) for s in PILOTS])
        for method in METHODS
        for step in STEP_GRID
    }
    best = {method: min(STEP_GRID, key=lambda step: grid[method, step]) for method in METHODS}
    return grid, best


def benchmark(target, seeds):
    """Per method, a dict metric -> list of per-seed values."""
    potential = ParticlePotential(target.model)
    results = {}
    for method in METHODS:
        step_size = target.step_sizes[method]
        runs = [
            evaluate(target, potential, *run_target(target, method, step_size, seed))
            for seed in seeds
        ]
        results[method] = {key: [run[key] for run in runs] for key in METRICS}
    return results


def standard_normal_model():
    pyro.sample("z", dist.Normal(torch.zeros(2), 1.0).to_event(1))


def init_near_three(site):
    return dist.Normal(torch.full((2,), 3.0), 0.5).sample()


def example_estimates(temperature, seed):
    """(|mean|, sigma_x, sigma_y) of all particles over the last EXAMPLE_POOLED steps."""
    pyro.set_rng_seed(seed)
    kernel = SGLD(
        standard_normal_model,
        EXAMPLE_STEP,
        num_particles=EXAMPLE_PARTICLES,
        repulsion="rbf",
        temperature=temperature,
        init_strategy=init_near_three,
    )
    mcmc = MCMC(
        kernel,
        num_samples=EXAMPLE_POOLED,
        warmup_steps=EXAMPLE_STEPS - EXAMPLE_POOLED,
        disable_progbar=True,
    )
    mcmc.run()
    pooled = mcmc.get_samples()["z"]
    std = pooled.std(0)
    return pooled.mean(0).norm().item(), std[0].item(), std[1].item()


def wins(ours, key, higher_is_better):
    """Seeds on which SGLD+R beats SGLD, paired by seed."""
    pairs = zip(ours["SGLD"][key], ours["SGLD+R"][key])
    count = sum((r > s) if higher_is_better else (r < s) for s, r in pairs)
    return f"{count}/{len(ours['SGLD'][key])}"


def timing_spread(values, digits):
    return spread(values, fmt=f"{{:.{digits}f}}")


def synthetic_rows(target, ours):
    for key, (label, digits, higher_is_better) in METRICS.items():
        summary = timing_spread if key in TIMINGS else mean_sd
        thesis = target.thesis.get(key)
        yield [
            target.name,
            label,
            *(["–", "–"] if thesis is None else [f"{value:.{digits}f}" for value in thesis]),
            *(summary(ours[method][key], digits) for method in METHODS),
            "–" if key == "seconds" else wins(ours, key, higher_is_better),
        ]


def _step_text(target, method):
    step = target.step_sizes[method]
    if step is not None:
        return f"{step:g}"
    frozen = FROZEN_STEPS[target.name, method]
    return f"default (frozen: median {np.median(frozen):.3g}, {min(frozen):.3g}-{max(frozen):.3g})"


def synthetic_section(targets, results, num_seeds):
    header = ["Target", "Metric", "SGLD (thesis)", "SGLD+R (thesis)"]
    header += ["SGLD (ours)", "SGLD+R (ours)", "SGLD+R better"]
    rows = [row for target in targets for row in synthetic_rows(target, results[target.name])]
    steps = "; ".join(
        f"{target.name} (L = {target.num_particles}): "
        + ", ".join(f"{method} {_step_text(target, method)}" for method in METHODS)
        for target in targets
    )
    return (
        f"## Tables 2.1 and 2.2: synthetic targets, {num_seeds} seeds\n\n"
        f"Step sizes: {steps}. Ours: mean ± sd over seeds; wall times median / mean / p90 / max over seeds. "
        "'SGLD+R better': seeds (paired) on which SGLD+R has the lower error / KSD or the "
        "higher ESS, ESS/s. ESS is of x, KSD of the pooled draws in the sampler's space "
        "(log x for MoE). The thesis reports no KSD or spread.\n\n" + markdown(header, rows)
    )


def example_section(seeds):
    ours = {
        name: np.array([example_estimates(temperature, seed) for seed in seeds])
        for name, temperature in (("SVGD", 0.0), ("SGLD+R", 1.0))
    }
    thesis = {"SVGD": (0.18, 0.70, 0.74), "SGLD+R": (0.08, 0.90, 0.87)}
    rows = [
        [label, f"{thesis['SVGD'][i]:.2f}", f"{thesis['SGLD+R'][i]:.2f}"]
        + [mean_sd(ours[name][:, i], 2) for name in ("SVGD", "SGLD+R")]
        + [target]
        for i, (label, target) in enumerate((("‖μ‖", "0"), ("σ_x", "1"), ("σ_y", "1")))
    ]
    header = ["Estimate", "SVGD (thesis)", "SGLD+R (thesis)"]
    header += ["SVGD (ours)", "SGLD+R (ours)", "Target"]
    return (
        f"## Section 2.3.1 example: N(0, I) target, {len(seeds)} seeds\n\n"
        f"L = {EXAMPLE_PARTICLES} particles from N([3, 3], 0.25 I), T = {EXAMPLE_STEPS} steps "
        f"of size {EXAMPLE_STEP:g}; estimates pool all particles of the last {EXAMPLE_POOLED} "
        "steps, mean ± sd over seeds. The thesis' values come from one run on N(0, I/2) "
        "(σ = 0.71) that pools all iterates, the transient included (see the script's "
        "docstring).\n\n" + markdown(header, rows)
    )


def tune_section(grids):
    header = ["Target", "Method"] + [f"ε = {step:g}" for step in STEP_GRID]
    rows = [
        [name, method] + [f"{grid[method, step]:.3f}" for step in STEP_GRID]
        for name, grid in grids.items()
        for method in METHODS
    ]
    return (
        f"## Step-size search: mean KSD over pilot seeds {', '.join(map(str, PILOTS))}\n\n"
        "inf: the sampler diverged or left the support (float32).\n\n" + markdown(header, rows)
    )


def main():
    parser = argument_parser(
        __doc__,
        RESULTS,
        quick="2 seeds (smoke test)",
        seeds="number of seeds (default 10; quick 2)",
    )
    parser.add_argument("--tune", action="store_true", help="re-run the step-size search first")
    parser.add_argument(
        "--step",
        choices=["tuned", "default"],
        default="tuned",
        help="tuned: the thesis protocol's steps (STEP_GRID's KSD pick); default: the kernels' "
        "own rule (step_size=None, set during warm-up), written to "
        "results/sgmcmc_synthetic_default.md unless --output says otherwise",
    )
    args = parser.parse_args()
    if args.step == "default":
        if args.tune:
            parser.error("--tune searches the steps that --step default leaves to the kernels")
        if args.output == RESULTS:
            args.output = RESULTS.with_name("sgmcmc_synthetic_default.md")
    num_seeds = args.seeds if args.seeds is not None else (2 if args.quick else 10)
    if num_seeds < 1:
        parser.error("--seeds must be at least 1")
    seeds = range(num_seeds)
    torch.set_num_threads(1)
    started = time.perf_counter()
    sections = []
    targets = TARGETS
    if args.step == "default":
        targets = [target._replace(step_sizes=dict.fromkeys(METHODS)) for target in TARGETS]
    if args.tune:
        tuned = {target.name: tune(target) for target in TARGETS}
        sections.append(tune_section({name: grid for name, (grid, _) in tuned.items()}))
        targets = [target._replace(step_sizes=tuned[target.name][1]) for target in TARGETS]
    results = {target.name: benchmark(target, seeds) for target in targets}
    sections += [synthetic_section(targets, results, num_seeds), example_section(seeds)]
    preamble = (
        f"# SGLD vs SGLD+R on synthetic targets ({'quick' if args.quick else 'full'} run"
        f"{', step sizes re-tuned' if args.tune else ''}"
        f"{DEFAULT_TITLE if args.step == 'default' else ''})\n\n"
        + (
            f"Command: `python benchmarks/sgmcmc_synthetic.py {command_line_args()}`. "
            "Step sizes: `step_size=None`, set during warm-up by the kernels' default rule "
            "(`bias_bound='auto'`, `bias_tolerance=0.05`) and frozen for sampling; the "
            "section 2.3.1 example keeps its fixed step. "
            if args.step == "default"
            else ""
        )
        + f"Thesis section 2.3 protocol: {WARMUP} burn-in steps, then {KEPT_STEPS} steps "
        f"thinned by {THINNING}; initial particles log x ~ N(0, 1) (MoE), x ~ N(0, I) (MoG). "
        f"Seeds 0–{num_seeds - 1}; torch {torch.__version__} on CPU "
        f"({torch.get_num_threads()} thread), pyro {pyro.__version__}. "
        f"Total {time.perf_counter() - started:.0f} s."
    )
    write_report(preamble, sections, args.output)


if __name__ == "__main__":
    main()
