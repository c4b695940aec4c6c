"""Chapter ``distributed``: SG-MCMC with particles and data sharded over torch.distributed."""

import time

import pyro
import pyro.distributions as dist
import torch

from pyro_ext.infer import MCMC, SGLD

FIGURES = ("distributed_draws",)


def _logistic_data(size=4000, dim=10):
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(size, dim, generator=generator)
    logits = x @ torch.randn(dim, generator=generator)
    return x, torch.bernoulli(torch.sigmoid(logits), generator=generator)


def _logistic_model(x, y, batch):
    w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[1]), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=batch) as idx:
        pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])


def _sharded_chain(shard, steps, world_size):
    """SGLD+R with 8 particles: its draws ``(8, steps, D)`` and seconds per step."""
    x, y = _logistic_data()
    # Data sharding: the plate's minibatch is each rank's share of the 200 rows.
    batch = 200 // world_size if shard == "data" else 200
    kernel = SGLD(_logistic_model, 1e-2, num_particles=8, repulsion="rbf", shard=shard)
    mcmc = MCMC(kernel, num_samples=steps, warmup_steps=0, disable_progbar=True)
    pyro.set_rng_seed(0)  # the same seed on every rank
    start = time.perf_counter()
    mcmc.run(x, y, batch)
    return mcmc.get_samples(group_by_chain=True)["w"], (time.perf_counter() - start) / steps


def _mean_gap(draws, reference):
    """The largest gap between two runs' means over their second halves, in posterior sd."""
    half = draws.shape[1] // 2
    gap = draws[:, half:].mean((0, 1)) - reference[:, half:].mean((0, 1))
    return float((gap.abs() / reference[:, half:].std((0, 1))).max())


def _distributed_worker(rank, world_size, init_file, shard, steps, queue):
    import torch.distributed as dist_c10d

    torch.set_num_threads(1)
    dist_c10d.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    try:
        draws, seconds = _sharded_chain(shard, steps, world_size)
        # NumPy, not a tensor: a tensor would travel as shared memory that dies with this process.
        queue.put((rank, draws.numpy(), seconds))
    finally:
        dist_c10d.destroy_process_group()


def run(quick=False, figures=None):
    """Particles and minibatches sharded over two gloo processes, against one process."""
    import tempfile

    import torch.multiprocessing as mp

    print("== Chapter: SG-MCMC over torch.distributed (particles and data sharded) ==")
    steps = 100 if quick else 500
    world_size = 2
    single, seconds = _sharded_chain(None, steps, 1)
    print(
        f"  SGLD+R, 8 particles, logistic regression (minibatch 200), {steps} steps; "
        f"one process: {seconds * 1e3:.1f} ms per step"
    )
    context = mp.get_context("spawn")
    sharded = {}
    for shard in ("particles", "data"):
        queue = context.Queue()
        with tempfile.TemporaryDirectory() as folder:
            processes = [
                context.Process(
                    target=_distributed_worker,
                    args=(rank, world_size, f"{folder}/init", shard, steps, queue),
                )
                for rank in range(world_size)
            ]
            for process in processes:
                process.start()
            results = sorted((queue.get(timeout=600) for _ in processes), key=lambda r: r[0])
            for process in processes:
                process.join()
        (_, draws, seconds), (_, other, _) = results
        draws, other = torch.from_numpy(draws), torch.from_numpy(other)
        sharded[shard] = draws
        what = "4 particles per rank" if shard == "particles" else "100 rows per rank"
        print(
            f"  shard={shard!r:12s} 2 processes ({what}): {seconds * 1e3:.1f} ms per step; "
            f"the ranks hold identical draws: {torch.equal(draws, other)}"
        )
        difference = (draws - single).abs().amax((0, 2))
        # Summing a minibatch in two halves rounds differently; repulsive noise amplifies
        # round-off from step to step, so such chains part while their posteriors agree.
        print(
            f"    draws differ from one process by {difference[0]:.0e} after 1 step, "
            f"{difference[9]:.0e} after 10, {difference[-1]:.0e} after {steps}; posterior means "
            f"over the second half differ by {_mean_gap(draws, single):.2f} posterior sd"
        )
    print(
        "  (a model this small is faster in one process: the collectives cost more than the "
        "gradients they share; see benchmarks/results/distributed.md)"
    )
    if figures is None:
        return
    with figures.figure("distributed_draws", 1, 2) as (trace, gap):
        step = torch.arange(1, steps + 1)
        trace.plot(step, single[0, :, 0], lw=1.2, label="one process")
        for shard, draws in sharded.items():
            trace.plot(step, draws[0, :, 0], lw=0.8, ls="--", label=f"2 processes, {shard}")
            difference = (draws - single).abs().amax((0, 2))
            exact = " (0: floored at 1e-9)" if not difference.any() else ""
            gap.semilogy(step, difference.clamp_min(1e-9), label=f"shard={shard!r}{exact}")
        trace.set_xlabel("step")
        trace.set_ylabel("w[0], particle 0")
        trace.set_title("SGLD+R, 8 particles, same seed")
        trace.legend(fontsize="small")
        gap.set_xlabel("step")
        gap.set_ylabel("max |2 processes - 1 process|")
        gap.set_title("distance from the one-process chain")
        gap.legend(fontsize="small")
