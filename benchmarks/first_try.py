"""
A new user's first try (issue 20): a Bayesian neural network sampled with only the
required arguments, before and after the package's default start, and with the step size
that ``pyro_ext.infer.tune_step_size`` picks.

Data: scikit-learn's diabetes set (442 rows, 10 features, shipped with scikit-learn), a
random 354 / 88 split per seed, features and target standardised on the training rows;
RMSE in the target's units. Model: ``BayesianMLP(10, hidden=(50,))`` wrapped as a user
writes it, ``lambda x, y=None: net(x, y, subsample_size=64)``. Sampler: ``SGLD(...,
num_particles=10, repulsion="rbf")``, 1000 warm-up steps and 200 draws per particle.

Rows:
* ``init_to_uniform``: each unconstrained coordinate uniform in (-2, 2), Pyro's default
  and the package's before this change (passed explicitly here);
* ``default``: no ``init_strategy``; the network declares its start from inside the
  wrapped model (``infer={"default_init_strategy": ...}`` on its observation site);
* ``tune_step_size``: the default start with the step size that
  ``tune_step_size(lambda h: SGLD(model, step_size=h, ...), x, y)`` picks from its
  default grid (half-decades 1e-6 .. 1e-1, 300-step pilots).

Baselines: predicting the training mean, and ridge regression (closed form, the penalty
of the smallest leave-one-out error over a grid).
"""

import time

import _common  # noqa: F401  (sets $PYRO_EXT_DATA's default)
import pyro
import torch
from _common import REPO, argument_parser, command_line_args, markdown, mean_sd, write_report
from pyro.infer.autoguide import init_to_uniform

from pyro_ext.infer import MCMC, SGLD, SamplerDivergenceError, tune_step_size
from pyro_ext.models import BayesianMLP
from pyro_ext.models.bnn import rmse


def diabetes_split(seed):
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    x, y = torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    train, test = order[:354], order[354:]
    loc, scale = x[train].mean(0), x[train].std(0)
    y_loc, y_scale = y[train].mean(), y[train].std()
    return (
        (x[train] - loc) / scale,
        (y[train] - y_loc) / y_scale,
        (x[test] - loc) / scale,
        (y[test] - y_loc) / y_scale,
        float(y_scale),
    )


def ridge_rmse(x, y, x_test, y_test):
    """Ridge with an intercept, its penalty by leave-one-out error over a grid."""
    design = torch.cat([x, torch.ones(len(x), 1)], 1).double()
    test = torch.cat([x_test, torch.ones(len(x_test), 1)], 1).double()
    best = None
    for penalty in torch.logspace(-3, 3, 25).tolist():
        gram = design.T @ design + penalty * torch.diag(torch.tensor([1.0] * x.shape[1] + [0.0]))
        hat = design @ torch.linalg.solve(gram.double(), design.T)
        loo = ((y.double() - hat @ y.double()) / (1 - hat.diagonal())).pow(2).mean()
        if best is None or loo < best[0]:
            best = (loo, torch.linalg.solve(gram.double(), design.T @ y.double()))
    return float((test @ best[1] - y_test.double()).pow(2).mean().sqrt())


def bnn_rmse(x, y, x_test, y_test, step_size, init_strategy, args, seed):
    """(test RMSE in standardised units or None, the divergence step or None, seconds)."""
    pyro.set_rng_seed(seed)
    net = BayesianMLP(10, hidden=(50,))
    model = lambda x, y=None: net(x, y, subsample_size=64)  # noqa: E731  (as a user writes it)
    kernel = SGLD(
        model,
        step_size=step_size,
        num_particles=10,
        repulsion="rbf",
        **({} if init_strategy is None else {"init_strategy": init_strategy}),
    )
    mcmc = MCMC(kernel, num_samples=args.samples, warmup_steps=args.warmup, disable_progbar=True)
    start = time.perf_counter()
    try:
        mcmc.run(x, y)
    except SamplerDivergenceError as error:
        return None, error.step, time.perf_counter() - start
    error = float(rmse(net, mcmc.get_samples(), x_test, y_test))
    return error, None, time.perf_counter() - start


def tuned_step_size(x, y, args, seed):
    net = BayesianMLP(10, hidden=(50,))
    model = lambda x, y=None: net(x, y, subsample_size=64)  # noqa: E731

    def factory(step_size):
        return SGLD(model, step_size=step_size, num_particles=10, repulsion="rbf")

    start = time.perf_counter()
    kwargs = {"num_steps": args.pilot_steps, "seed": seed}
    if args.quick:
        kwargs["candidates"] = [1e-4, 1e-3, 1e-2]
    tuning = tune_step_size(factory, x, y, **kwargs)
    return tuning, time.perf_counter() - start


def main():
    parser = argument_parser(
        __doc__,
        REPO / "benchmarks" / "results" / "first_try.md",
        quick="smoke test: 1 seed, 100 warm-up steps, 20 draws, 3 tuning candidates",
        seeds="number of splits/seeds (default 3; quick 1)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    num_seeds = args.seeds or (1 if args.quick else 3)
    args.warmup, args.samples = (100, 20) if args.quick else (1000, 200)
    args.pilot_steps = 40 if args.quick else 300
    rows = {}
    tunings = []
    started = time.perf_counter()
    for seed in range(num_seeds):
        x, y, x_test, y_test, y_scale = diabetes_split(seed)
        cases = [
            ("init_to_uniform (Pyro's default, the package's before)", 1e-4, init_to_uniform),
            ("init_to_uniform (Pyro's default, the package's before)", 1e-3, init_to_uniform),
            ("default (the network's declared start)", 1e-4, None),
            ("default (the network's declared start)", 1e-3, None),
        ]
        tuning, tune_seconds = tuned_step_size(x, y, args, seed)
        tunings.append((tuning.step_size, tune_seconds))
        cases.append(("default start, tune_step_size's pick", tuning.step_size, None))
        for label, step_size, init in cases:
            error, diverged, seconds = bnn_rmse(x, y, x_test, y_test, step_size, init, args, seed)
            key = (label, step_size if "pick" not in label else "picked")
            rows.setdefault(key, []).append(
                (None if error is None else error * y_scale, diverged, seconds)
            )
        mean_error = float((y_test - y.mean()).pow(2).mean().sqrt()) * y_scale
        rows.setdefault(("predict the training mean", "-"), []).append((mean_error, None, 0.0))
        ridge = ridge_rmse(x, y, x_test, y_test) * y_scale
        rows.setdefault(("ridge regression (LOO penalty)", "-"), []).append((ridge, None, 0.0))

    table = []
    for (label, step_size), results in rows.items():
        errors = [r[0] for r in results if r[0] is not None]
        diverged = [r[1] for r in results if r[1] is not None]
        step = step_size if isinstance(step_size, str) else f"{step_size:.0e}"
        if step == "picked":
            step = ", ".join(f"{h:.0e}" for h, _ in tunings)
        table.append(
            [
                label,
                step,
                mean_sd(errors, 1) if errors else "--",
                f"{len(diverged)} (at step {', '.join(map(str, diverged))})" if diverged else "0",
                mean_sd([r[2] for r in results], 1) if results[0][2] else "--",
            ]
        )
    preamble = (
        "# A new user's first try: a BNN sampled with only the required arguments\n\n"
        f"Command: `python benchmarks/first_try.py {command_line_args()}`. {num_seeds} "
        f"split(s)/seed(s); SGLD+R, 10 particles, {args.warmup} warm-up steps, "
        f"{args.samples} draws per particle, minibatch 64 of 354 rows. torch "
        f"{torch.__version__}, 1 thread. Total {time.perf_counter() - started:.0f} s. "
        "Protocol in the script's docstring."
    )
    section = (
        "## Diabetes: test RMSE (mean ± sd over splits)\n\n"
        + markdown(["start", "step size", "test RMSE", "diverged runs", "seconds"], table)
        + "\n\ntune_step_size: "
        + "; ".join(f"picked {h:.0e} in {s:.0f} s" for h, s in tunings)
        + "."
    )
    write_report(preamble, [section], args.output)


if __name__ == "__main__":
    main()
