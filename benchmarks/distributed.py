"""
SG-MCMC sharded over ``torch.distributed``: per-step time and communication share for 1
and 2 processes (gloo, one CPU thread each), and the communication arithmetic for 8 and 64
GPUs.

Models: the Bayesian MLPs of ``sgmcmc_speed.py``: 8-50-1 on UCI kin8nm (D = 501,
minibatch 100, Gaussian likelihood) and 784-400-400-10 on MNIST (D = 478,410, minibatch
128). Kernels: ``SGLD``, independent particles or ``repulsion="rbf"`` (SGLD+R), eager or
``jit_compile=True``; ``SGHMC`` with ``repulsion="rbf"`` (SGHMC+R), eager. The repulsive
samplers run sharded by rows of the kernel matrix (each rank its ``L / R`` rows of the
drift and of the correlated noise, see ``pyro_ext.infer.sgmcmc.distributed``).

- **strong scaling**: ``L`` fixed, split over ``R`` ranks (``shard="particles"``);
- **weak scaling**: ``L / R`` particles per rank fixed;
- **data sharding**: ``L`` fixed, every rank evaluates all particles on ``1 / R`` of the
  minibatch (``shard="data"``; per-rank minibatch = minibatch / R).

Each configuration is launched as ``R`` processes (``torch.multiprocessing``, spawn) in one
gloo process group; ``R = 1`` is the plain single-process kernel (no process group), the
baseline of the ratios. Per-step times are read by rank 0 from ``MCMC``'s ``hook_fn``
after warm-up steps (which hold the compilation): median / mean / p90 / max in ms.
"comm" is the time rank 0 spends blocked in the kernel's collectives per step (eager runs only: a
compiled step has them inside its graph), measured by wrapping
:class:`~pyro_ext.infer.sgmcmc.distributed.Shard`'s collectives; it includes waiting for
the slower rank. This machine has two cores, so ``R = 2`` is the most it can show.

Run from the repository root::

    python benchmarks/distributed.py            # full: both models, ~10 minutes
    python benchmarks/distributed.py --quick    # kin8nm, a few steps

The tables are printed and written to ``benchmarks/results/distributed.md``.
"""

import statistics
import tempfile
import time
import traceback
from importlib.metadata import version

from _common import (
    REPO,
    argument_parser,
    command_line_args,
    fresh_inductor_cache,
    markdown,
    write_report,
)

fresh_inductor_cache("distributed_inductor_")

import pyro  # noqa: E402
import pyro.distributions as dist  # noqa: E402
import torch  # noqa: E402
import torch.distributed as c10d  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from _common import spread  # noqa: E402

from pyro_ext.datasets import load_mnist, load_uci, standardize_split  # noqa: E402
from pyro_ext.infer import MCMC, SGHMC, SGLD  # noqa: E402
from pyro_ext.infer.sgmcmc import distributed  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "distributed.md"
PROBLEMS = {
    # name: (hidden sizes, minibatch, step size)
    "kin8nm": ((50,), 100, 1e-8),
    "mnist": ((400, 400), 128, 1e-8),
}
TITLES = {"kin8nm": "BNN 8-50-1, kin8nm", "mnist": "BNN 784-400-400-10, MNIST"}


def mlp_model(x, y, hidden, batch, classify):
    """A Bayesian MLP with N(0, 1) priors on every weight (as in ``sgmcmc_speed.py``)."""
    prior = dist.Normal(x.new_zeros(()), 1.0)
    sizes = (x.shape[-1],) + tuple(hidden) + ((10,) if classify else (1,))
    weights = [
        (
            pyro.sample(f"w{i}", prior.expand([fan_in, fan_out]).to_event(2)),
            pyro.sample(f"b{i}", prior.expand([fan_out]).to_event(1)),
        )
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:]))
    ]
    with pyro.plate("data", x.shape[0], subsample_size=batch) as idx:
        h = x[idx]
        for i, (w, b) in enumerate(weights):
            h = h @ w + b
            if i < len(weights) - 1:
                h = torch.relu(h)
        if classify:
            pyro.sample("obs", dist.Categorical(logits=h), obs=y[idx])
        else:
            pyro.sample("obs", dist.Normal(h.squeeze(-1), 0.5), obs=y[idx])


def load(problem):
    if problem == "kin8nm":
        split, _, _ = standardize_split(load_uci("kin8nm", 0))
        return split.x_train, split.y_train, False
    x, y = load_mnist("train", flatten=True)
    return x, y, True


def num_weights(problem):
    hidden, _, _ = PROBLEMS[problem]
    sizes = (
        ((8,) if problem == "kin8nm" else (784,))
        + hidden
        + ((1,) if problem == "kin8nm" else (10,))
    )
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))


class _CommTimer:
    """Wraps the collectives of :class:`Shard` with a clock (eager steps only)."""

    def __init__(self):
        self.seconds = 0.0

    def install(self):
        # Time blocked in collectives: a started gather is waited for in ``wait``.
        for name in ("wait", "mean", "all_true"):
            original = getattr(distributed.Shard, name)

            def timed(shard, tensor, _original=original):
                started = time.perf_counter()
                result = _original(shard, tensor)
                self.seconds += time.perf_counter() - started
                return result

            setattr(distributed.Shard, name, timed)


def run_config(rank, world_size, config, budget):
    problem, num_particles, shard, repulsion, jit_compile, sampler = config
    hidden, batch, step_size = PROBLEMS[problem]
    if shard == "data":
        batch //= world_size
    if shard is None:  # the control: unrelated processes, each with its share of L
        num_particles //= world_size
    x, y, classify = load(problem)
    timer = _CommTimer()
    if world_size > 1 and shard is not None and not jit_compile:
        timer.install()
    stamps, comm = [], []

    def hook(kernel, params, stage, index):
        stamps.append(time.perf_counter())
        comm.append(timer.seconds)

    pyro.set_rng_seed(0)
    kernel = {"SGLD": SGLD, "SGHMC": SGHMC}[sampler](
        lambda x, y: mlp_model(x, y, hidden, batch, classify),
        step_size=step_size,
        num_particles=num_particles,
        repulsion=repulsion,
        jit_compile=jit_compile,
        shard=shard if world_size > 1 else None,
    )
    warmup, steps = budget
    # One kept draw: the timing is of the steps, not of storing draws.
    mcmc = MCMC(
        kernel,
        num_samples=1,
        thinning=steps,
        warmup_steps=warmup,
        disable_progbar=True,
        hook_fn=hook,
    )
    mcmc.run(x, y)
    step_ms = [1e3 * (b - a) for a, b in zip(stamps[warmup:], stamps[warmup + 1 :])]
    comm_ms = [1e3 * (b - a) for a, b in zip(comm[warmup:], comm[warmup + 1 :])]
    return step_ms, comm_ms, kernel.compile_seconds


def _worker(rank, world_size, init_file, config, budget, queue):
    torch.set_num_threads(1)
    try:
        if world_size > 1 and config[2] is not None:
            c10d.init_process_group(
                "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
            )
        result = run_config(rank, world_size, config, budget)
        queue.put((rank, "ok", result))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if c10d.is_initialized():
            c10d.destroy_process_group()


def launch(world_size, config, budget):
    """Run ``config`` on ``world_size`` fresh processes; rank 0's timings."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        init_file = f"{folder}/init"
        processes = [
            context.Process(
                target=_worker, args=(rank, world_size, init_file, config, budget, queue)
            )
            for rank in range(world_size)
        ]
        for process in processes:
            process.start()
        results = {}
        for _ in range(world_size):
            rank, status, result = queue.get(timeout=1800)
            if status != "ok":
                raise RuntimeError(f"rank {rank} of {config} failed:\n{result}")
            results[rank] = result
        for process in processes:
            process.join()
    return results[0]


def plan(quick):
    problems = ["kin8nm"] if quick else ["kin8nm", "mnist"]
    rows = []  # (scaling, world_size, config)
    for problem in problems:
        jits = [False] if (quick or problem == "mnist") else [False, True]
        for jit in jits:
            samplers = [("SGLD", None), ("SGLD", "rbf")] + ([("SGHMC", "rbf")] if not jit else [])
            for sampler, repulsion in samplers:
                for world_size in (1, 2):
                    config = (problem, 16, "particles", repulsion, jit, sampler)
                    rows.append(("strong", world_size, config))
                # The machine's own parallelism: two unrelated single-process runs at once.
                rows.append(("control", 2, (problem, 32, None, repulsion, jit, sampler)))
                rows.append(("weak", 2, (problem, 32, "particles", repulsion, jit, sampler)))
                rows.append(("data", 2, (problem, 16, "data", repulsion, jit, sampler)))
    return rows


def arithmetic_table():
    """Bytes per step per rank of the collectives, their time at two link speeds, and the
    repulsive update's arithmetic per rank, replicated (the old sharding) and by rows."""
    links = {"NVLink 4 (450 GB/s)": 450e9, "100 Gb/s Ethernet (12.5 GB/s)": 12.5e9}
    rows = []
    for problem in ("kin8nm", "mnist"):
        d = num_weights(problem)
        for gpus in (8, 64):
            num_particles = 8 * gpus
            # (what, gathered (L, D) fields, collective factor, L x L products of the update)
            for what, fields, factor, products in (
                ("particles, independent", None, None, 0),
                # squared distances, K (grad - s), chol(K) noise
                ("particles, SGLD+R (z, grad; rows of sq)", 2, 1, 3),
                # squared distances, K (grad - s), K v
                ("particles, SGHMC+R (z, grad, v; rows of sq)", 3, 1, 3),
                ("data, L particles (grad all_reduce)", 1, 2, 0),
            ):
                if fields is None:
                    volume = 4.0  # one finiteness flag
                else:
                    # Ring all_gather moves (R-1)/R of the gathered tensor through each rank;
                    # ring all_reduce twice that. float32. The row-sharded samplers also
                    # gather the L x L squared distances.
                    gathered = num_particles * d * fields
                    if products:
                        gathered += num_particles**2
                    volume = factor * (gpus - 1) / gpus * gathered * 4.0
                times = [f"{1e3 * volume / bandwidth:,.3f}" for bandwidth in links.values()]
                # 2 L^2 D flops per L x L x D product; every rank did all of them before
                flops = 2.0 * products * num_particles**2 * d
                arithmetic = (
                    f"{flops / 1e9:,.1f} / {flops / gpus / 1e9:,.2f}" if products else "n/a"
                )
                rows.append(
                    [TITLES[problem], gpus, num_particles, what, f"{volume / 1e6:,.3f}"]
                    + times
                    + [arithmetic]
                )
    header = (
        ["model", "GPUs R", "L (8 per GPU)", "sharding", "MB per step per rank"]
        + [f"ms at {name}" for name in links]
        + ["update GFLOP per rank: replicated / by rows"]
    )
    return markdown(header, rows)


def main():
    parser = argument_parser(
        __doc__, RESULTS, quick="kin8nm only, eager, short timings (smoke test)"
    )
    args = parser.parse_args()
    budget = (3, 8) if args.quick else (5, 40)
    results = {}
    rows = []
    started = time.perf_counter()
    for scaling, world_size, config in plan(args.quick):
        key = (world_size, config)
        if key not in results:
            results[key] = launch(world_size, config, budget)
        step_ms, comm_ms, compile_s = results[key]
        problem, num_particles, shard, repulsion, jit, sampler = config
        per_rank = num_particles // world_size if scaling in ("weak", "control") else num_particles
        baseline_config = (problem, per_rank, "particles", repulsion, jit, sampler)
        baseline_key = (1, baseline_config)
        if baseline_key not in results:
            results[baseline_key] = launch(1, baseline_config, budget)
        base = statistics.fmean(results[baseline_key][0])
        mean = statistics.fmean(step_ms)
        ratio = base / mean
        # The job's time per particle (all L) over the single-process run's (its L).
        per_particle = (mean / num_particles) / (base / per_rank)
        timed_comm = shard is not None and world_size > 1 and not jit
        rows.append(
            [
                TITLES[problem],
                {"control": "2 independent processes"}.get(scaling, scaling)
                if world_size > 1
                else "1 process",
                world_size,
                num_particles,
                num_particles // world_size if shard != "data" else num_particles,
                sampler + ("+R" if repulsion else ""),
                "compile" if jit else "eager",
                spread(step_ms, fmt="{:,.1f}"),
                f"{ratio:.2f}×",
                f"{per_particle:.2f}×",
                spread(comm_ms, fmt="{:,.2f}") if timed_comm else "n/a",
                f"{100 * statistics.fmean(comm_ms) / mean:.0f} %" if timed_comm else "n/a",
            ]
        )
    header = [
        "model",
        "scaling",
        "R",
        "L",
        "L per rank",
        "sampler",
        "step",
        "ms per step (median / mean / p90 / max)",
        "speed-up vs 1 process",
        "time per particle ÷ 1 process's",
        "comm ms (median / mean / p90 / max)",
        "comm share (of the mean step)",
    ]
    preamble = (
        "# SG-MCMC sharded over torch.distributed\n\n"
        f"Mode: {'quick' if args.quick else 'full'}. torch {version('torch')}, gloo, one "
        f"CPU thread per process, {budget[1]} timed steps after {budget[0]} warm-up steps; "
        f"total {(time.perf_counter() - started) / 60:.1f} min. Generated by `python "
        f"benchmarks/distributed.py {command_line_args()}`.\n\n"
        "Speed-up: mean step time of the single-process run of the same L (strong, data) "
        "or of the same L per rank (weak, control: 1.00× is perfect weak scaling) / the "
        "sharded run's. Control: two unrelated single-process runs of L / 2 particles at "
        "once, no process group: what this machine's two cores give two processes that "
        "never communicate, the ceiling of the weak-scaling rows. Time per particle: the "
        "step time over the L particles of the whole run, divided by the single-process "
        "run's over its L (strong: 1 / speed-up; weak: L / R per rank, so 0.50× is perfect "
        "and 1.00× is no faster per particle than one process). Comm: rank 0's time in "
        "the collectives per step, waiting for the other rank included (eager only). The "
        "repulsive rows are sharded by rows of the kernel matrix. No GPU was available for "
        "this run: there are no NCCL rows."
    )
    arithmetic = (
        "## Communication arithmetic for 8 and 64 GPUs\n\n"
        "Bandwidth term only (latency ignored), ring collectives, float32, 8 particles per "
        "GPU; the time is the volume over one link of the given speed (a 64-GPU job "
        "spans nodes, so its inter-node link is the one that counts). Generated by this "
        "script from the models' sizes, not measured.\n\n" + arithmetic_table()
    )
    write_report(
        preamble, ["## Per-step time\n\n" + markdown(header, rows), arithmetic], args.output
    )


if __name__ == "__main__":
    main()
