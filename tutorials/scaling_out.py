"""
Scaling out: SGLD+R on a Bayesian neural network, sharded over torch.distributed.

The same script runs in one process or in many; launch it with ``torchrun`` (from the
repository root, with ``$PYRO_EXT_DATA`` pointing at the data folder)::

    python tutorials/scaling_out.py                                    # one process
    torchrun --standalone --nproc-per-node=2 tutorials/scaling_out.py  # particles sharded
    torchrun --standalone --nproc-per-node=2 tutorials/scaling_out.py --shard data
    torchrun --standalone --nproc-per-node=8 tutorials/scaling_out.py --backend nccl

With ``--shard particles`` (the default under a process group) each rank holds
``particles / R`` of the particles; with ``--shard data`` every rank holds all of them and
evaluates them on its ``1 / R`` share of the minibatch. Every rank draws the same random
numbers, so all of these runs give the single-process chain (up to float32 round-off) and
print the same test RMSE; rank 0 prints the report.
"""

import argparse
import datetime
import os

import pyro
import torch
import torch.distributed as dist

from pyro_ext.datasets import load_uci, standardize_split
from pyro_ext.infer import MCMC, SGLD
from pyro_ext.models import BayesianMLP, predictive_moments


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shard", choices=["particles", "data"], default="particles")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--particles", type=int, default=16)
    parser.add_argument("--batch", type=int, default=100, help="minibatch size of the run")
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--quick", action="store_true", help="a few steps, to try the launch")
    args = parser.parse_args()
    torch.set_num_threads(1)

    launched = "WORLD_SIZE" in os.environ  # torchrun (or another launcher) set the group up
    device = torch.device("cpu")
    if launched:
        # A timeout turns a rank that hangs into an error on the others.
        dist.init_process_group(args.backend, timeout=datetime.timedelta(minutes=5))
        if args.backend == "nccl":
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device)
    world_size = dist.get_world_size() if launched else 1
    rank = dist.get_rank() if launched else 0

    split, _, y_std = standardize_split(load_uci("kin8nm", 0, device=device))
    # The plate's subsample_size is the per-rank minibatch when the data are sharded.
    per_rank_batch = args.batch // world_size if args.shard == "data" and launched else args.batch
    steps = 20 if args.quick else args.steps

    pyro.set_rng_seed(0)  # the same seed on every rank
    net = BayesianMLP(split.x_train.shape[1], hidden=(50,), full_output=False)
    kernel = SGLD(
        net,
        # SGLD+R averages the drift over particles: the step grows with L (see SGLD).
        step_size=3e-2 / split.x_train.shape[0] * args.particles,
        num_particles=args.particles,
        repulsion="rbf",
        shard=args.shard if launched else None,
    )
    mcmc = MCMC(kernel, num_samples=10, warmup_steps=steps // 2, thinning=max(1, steps // 20))
    mcmc.run(split.x_train, split.y_train, subsample_size=per_rank_batch)

    # Every rank holds all particles' draws.
    mean, _ = predictive_moments(net, mcmc.get_samples(), split.x_test)
    rmse = float((mean - split.y_test).pow(2).mean().sqrt() * y_std)
    print(f"rank {rank} of {world_size}: test RMSE {rmse:.4f}")
    if rank == 0:
        print(
            f"{args.particles} particles, shard={getattr(kernel.shard, 'mode', None)!r} over "
            f"{world_size} process(es): {kernel.num_local_particles} particles on this rank"
        )
    if launched:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
