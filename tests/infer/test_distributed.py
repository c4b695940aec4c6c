"""
SG-MCMC sharded over torch.distributed: two CPU processes with gloo against one process.

Each test spawns two ranks (``torch.multiprocessing`` with the ``spawn`` start method) that
run a list of scenarios in one process group and report back through a queue; the
single-process reference runs in the test process with the same seed.
"""

import os
import re
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.distributed as dist_c10d
import torch.multiprocessing as mp
from pyro.ops.streaming import CountMeanVarianceStats, StatsOfDict

from pyro_ext.infer import MCMC, EscapedParticleWarning, Gibbs, SamplerDivergenceError
from pyro_ext.infer.sgmcmc import KERNELS
from pyro_ext.infer.sgmcmc.distributed import RankFailedError

pytestmark = pytest.mark.skipif(
    not dist_c10d.is_available(), reason="torch.distributed is not available"
)

WORLD_SIZE = 2
NUM_PARTICLES = 8
NUM_DATA = 64
#: a spawned rank that has not reported by then has hung
TIMEOUT_S = 120


def regression(x, y, batch):
    w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", x.shape[0], subsample_size=batch) as idx:
        pyro.sample("obs", dist.Normal(x[idx] @ w, s), obs=y[idx])


def regression_with_extra_site(x, y, batch):
    pyro.sample("extra", dist.Normal(0.0, 1.0))
    regression(x, y, batch)


def data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(NUM_DATA, 3, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3 * torch.randn(NUM_DATA, generator=generator)
    return x, y


#: (sampler, shard, repulsion, jit_compile, minibatch of the single-process run)
CONFIGS = [
    ("sgld", "particles", None, False),
    ("sgld", "particles", "rbf", False),
    ("sghmc", "particles", "rbf", False),
    ("adam", "particles", "rbf", "trace"),
    ("sghmc", "particles", "rbf", True),
    ("sgld", "data", None, False),
    ("sghmc", "data", "rbf", "trace"),
]
STEP_SIZES = {"sgld": 2e-3, "sghmc": 1e-3, "adam": 1e-2, "preconditioned_sghmc": 1e-3}


def run_chain(
    sampler,
    shard,
    repulsion,
    jit_compile,
    batch,
    statistics=False,
    default_step=False,
    **mcmc_kwargs,
):
    pyro.set_rng_seed(1)
    x, y = data()
    kernel = KERNELS[sampler](
        regression,
        step_size=None if default_step else STEP_SIZES[sampler],
        num_particles=NUM_PARTICLES,
        repulsion=repulsion,
        jit_compile=jit_compile,
        shard=shard,
    )
    options = dict(num_samples=10, warmup_steps=10, thinning=2, disable_progbar=True)
    if statistics:
        options["statistics"] = StatsOfDict(default=CountMeanVarianceStats)
    mcmc = MCMC(kernel, **{**options, **mcmc_kwargs})
    mcmc.run(x, y, batch)
    return mcmc


def as_numpy(samples):
    return {name: value.detach().numpy() for name, value in samples.items()}


def reference(sampler, shard, repulsion, jit_compile, default_step=False):
    # The data shards' minibatches together are the single process's minibatch.
    batch = 16 if shard == "particles" else 8 * WORLD_SIZE
    mcmc = run_chain(sampler, None, repulsion, False, batch, default_step=default_step)
    return as_numpy(mcmc.get_samples(group_by_chain=True))


# -- scenarios, run on every rank -------------------------------------------------------------
def scenario_equal(rank):
    results = []
    for sampler, shard, repulsion, jit_compile in CONFIGS:
        batch = 16 if shard == "particles" else 8
        mcmc = run_chain(sampler, shard, repulsion, jit_compile, batch)
        results.append(as_numpy(mcmc.get_samples(group_by_chain=True)))
    diagnostics = run_chain("sgld", "particles", "rbf", False, 16).diagnostics()
    stats = run_chain("sgld", "particles", None, False, 16, statistics=True)
    means = {k: v["mean"].numpy() for k, v in stats.get_statistics(group_by_chain=False).items()}
    keys = sorted(stats.get_statistics(group_by_chain=True))
    r_hat = {k: diagnostics[k]["r_hat"].numpy() for k in ("w", "s")}
    return results, r_hat, means, keys


# The default step size (step_size=None): its power iterations and the repulsion's
# eigenvalue see every particle, and the data shards' estimates average to the minibatch's.
DEFAULT_STEP_CONFIGS = [
    ("sgld", "particles", "rbf", False),
    ("adam", "particles", None, False),
    ("sghmc", "data", None, False),
]


def scenario_default_step(rank):
    results = []
    for sampler, shard, repulsion, jit_compile in DEFAULT_STEP_CONFIGS:
        batch = 16 if shard == "particles" else 8
        mcmc = run_chain(sampler, shard, repulsion, jit_compile, batch, default_step=True)
        results.append(as_numpy(mcmc.get_samples(group_by_chain=True)))
    return results


def diverging(x, y, batch):
    # Particle 7 (rank 1's) starts near 40 and climbs; the log density is NaN past 40.
    u = pyro.sample("u", dist.Normal(0.0, 100.0))
    pyro.factor("push", 5.0 * u + torch.where(u > 40.0, torch.nan, 0.0))
    regression(x, y, batch)


def scenario_divergence(rank):
    pyro.set_rng_seed(1)
    x, y = data()
    u = torch.zeros(NUM_PARTICLES)
    u[7] = 39.0
    init = {"u": u, "w": torch.zeros(NUM_PARTICLES, 3), "s": torch.zeros(NUM_PARTICLES)}
    kernel = KERNELS["sgld"](diverging, 0.1, num_particles=NUM_PARTICLES)
    mcmc = MCMC(kernel, num_samples=20, warmup_steps=0, disable_progbar=True, initial_params=init)
    try:
        mcmc.run(x, y, 16)
    except SamplerDivergenceError as error:
        kept = mcmc.get_samples(group_by_chain=True)["u"].shape
        return type(error).__name__, error.step, error.particles, error.sites, tuple(kept)
    return "no error", None, None, None, None


def escaping(x, y, batch):
    # Negligible mass (weight e^-1000) spread wide: a particle at u = 1000 stays there,
    # finite, a thousand nats below the others (whose spread, 40 steps from their start,
    # is tens of nats).
    wide_tail = dist.MixtureSameFamily(
        dist.Categorical(logits=torch.tensor([0.0, -1000.0])),
        dist.Normal(torch.zeros(2), torch.tensor([1.0, 1e4])),
    )
    pyro.sample("u", wide_tail)
    regression(x, y, batch)


def scenario_escape(rank):
    pyro.set_rng_seed(1)
    x, y = data()
    u = torch.zeros(NUM_PARTICLES)
    u[7] = 1000.0  # rank 1's
    init = {"u": u, "w": torch.zeros(NUM_PARTICLES, 3), "s": torch.zeros(NUM_PARTICLES)}
    kernel = KERNELS["sgld"](escaping, 2e-3, num_particles=NUM_PARTICLES, shard="particles")
    mcmc = MCMC(kernel, num_samples=40, warmup_steps=10, disable_progbar=True, initial_params=init)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(x, y, 16)
    warned = sum(issubclass(w.category, EscapedParticleWarning) for w in caught)
    return mcmc.escaped_particles, warned


class _Interrupt(Exception):
    """A simulated crash in the middle of the sampling stage, on every rank."""


def scenario_checkpoint(rank, path):
    def crash(kernel, params, stage, index):
        if stage == "Sample" and index == 6:
            raise _Interrupt

    options = dict(checkpoint_path=path, checkpoint_every=4)
    with pytest.raises(_Interrupt):  # the run stops at sampling step 6, after a checkpoint
        run_chain("sghmc", "particles", "rbf", False, 16, hook_fn=crash, **options)
    x, y = data()
    pyro.set_rng_seed(123)  # resume restores the random state of the checkpoint
    kernel = KERNELS["sghmc"](
        regression, STEP_SIZES["sghmc"], num_particles=NUM_PARTICLES, repulsion="rbf"
    )
    mcmc = MCMC(
        kernel, num_samples=10, warmup_steps=10, thinning=2, disable_progbar=True, **options
    )
    mcmc.resume(x, y, 16)
    files = sorted(os.listdir(os.path.dirname(path)))
    return as_numpy(mcmc.get_samples(group_by_chain=True)), files


def scenario_preconditioned(rank):
    # Warm-up 40: the mass window [10, 20) gathers both ranks' draws and gradient sums.
    mcmc = run_chain("preconditioned_sghmc", "particles", "rbf", False, 16, warmup_steps=40)
    return as_numpy(mcmc.get_samples(group_by_chain=True)), mcmc.kernel.state.mass.numpy()


def scenario_extend(rank):
    mcmc = run_chain("sghmc", "particles", "rbf", False, 16, draws_device="cpu")
    mcmc.extend(5)
    return as_numpy(mcmc.get_samples(group_by_chain=True))


def _error_of(fn):
    try:
        fn()
    except (TypeError, ValueError) as error:
        return type(error).__name__, str(error)
    return "no error", ""


def scenario_bad_input(rank):
    x, y = data()

    def run(model=regression, seed=1, num_particles=NUM_PARTICLES, shard="auto", batch=16):
        pyro.set_rng_seed(seed)
        kernel = KERNELS["sgld"](model, 1e-3, num_particles=num_particles, shard=shard)
        MCMC(kernel, num_samples=2, warmup_steps=0, disable_progbar=True).run(x, y, batch)

    def unsupported_backend():
        original = dist_c10d.get_backend
        dist_c10d.get_backend = lambda group=None: "mpi"
        try:
            run()
        finally:
            dist_c10d.get_backend = original

    def sharded_gibbs():
        def mixture(x, y, batch):
            pyro.sample("z", dist.Bernoulli(0.5))
            regression(x, y, batch)

        kernel = Gibbs(KERNELS["sgld"](mixture, 1e-3, num_particles=NUM_PARTICLES), ["z"])
        MCMC(kernel, num_samples=2, warmup_steps=0, disable_progbar=True).run(x, y, 16)

    return {
        "indivisible": _error_of(lambda: run(num_particles=7)),
        "seeds": _error_of(lambda: run(seed=rank)),
        "models": _error_of(lambda: run(model=regression_with_extra_site if rank else regression)),
        "backend": _error_of(unsupported_backend),
        "data plate too small": _error_of(lambda: run(shard="data", batch=40)),
        "gibbs": _error_of(sharded_gibbs),
        "shard type": _error_of(lambda: KERNELS["sgld"](regression, 1e-3, shard=2)),
        "shard value": _error_of(lambda: KERNELS["sgld"](regression, 1e-3, shard="rows")),
    }


def scenario_pieces(rank):
    """Eager gloo gathers sent in pieces smaller than a row's bytes, and in uneven ones."""
    from pyro_ext.infer.sgmcmc import distributed

    distributed.GLOO_PIECE_BYTES = 40  # rows of 5 float32 numbers: pieces of 2 rows, then 1
    shard = distributed.Shard("particles", 6)
    mine = 100.0 * rank + torch.arange(15.0).reshape(3, 5)
    pending = shard.start_gather(mine)
    pieces = len(pending.works)
    gathered = shard.wait(pending).numpy()
    distributed.GLOO_PIECE_BYTES = 1  # the chain's rows (z, grad, velocity) one at a time
    mcmc = run_chain("sghmc", "particles", "rbf", False, 16)
    return pieces, gathered, as_numpy(mcmc.get_samples(group_by_chain=True))


def scenario_kill(rank):
    def die(kernel, params, stage, index):
        if rank == 1 and index == 3:
            os._exit(1)  # a killed rank: no exception, no clean-up

    try:
        run_chain("sgld", "particles", "rbf", False, 16, hook_fn=die)
    except RankFailedError as error:
        return type(error).__name__, str(error)
    return "no error", ""


# -- the launcher ------------------------------------------------------------------------------
def _worker(rank, init_file, scenario, args, queue):
    torch.set_num_threads(1)
    try:
        dist_c10d.init_process_group(
            "gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE
        )
        result = globals()[scenario](rank, *args)
        queue.put((rank, "ok", result))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist_c10d.is_initialized():
            dist_c10d.destroy_process_group()


def spawn(tmp_path, scenario, *args, expect=WORLD_SIZE):
    """Run ``scenario`` on two ranks; their results by rank (``expect`` of them report)."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    init_file = tmp_path / "init"
    processes = [
        context.Process(target=_worker, args=(rank, str(init_file), scenario, args, queue))
        for rank in range(WORLD_SIZE)
    ]
    for process in processes:
        process.start()
    results = {}
    try:
        for _ in range(expect):
            rank, status, result = queue.get(timeout=TIMEOUT_S)
            assert status == "ok", f"rank {rank} failed:\n{result}"
            results[rank] = result
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    return results


def assert_close(actual, expected):
    assert actual.keys() == expected.keys()
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-4, atol=1e-5)


# -- tests -----------------------------------------------------------------------------------
# Seven sharded configurations and two extra runs on each rank (about 40 s): in the
# integration run. The default run keeps sharded == single-process through the default
# step, checkpoint-resume and extend tests below.
@pytest.mark.integration
def test_two_ranks_run_the_single_process_chain(tmp_path):
    results = spawn(tmp_path, "scenario_equal")
    for rank in range(WORLD_SIZE):
        draws, r_hat, means, keys = results[rank]
        for config, sharded in zip(CONFIGS, draws):
            expected = reference(*config)
            assert sharded["w"].shape == (NUM_PARTICLES, 10, 3), config
            assert_close(sharded, expected)
        # Every rank holds every particle's draws, summary and statistics.
        for name in r_hat:
            np.testing.assert_array_equal(r_hat[name], results[0][1][name])
        assert keys == sorted((p, n) for p in range(NUM_PARTICLES) for n in ("s", "w"))
        single = run_chain("sgld", None, None, False, 16, statistics=True)
        for name, stats in single.get_statistics(group_by_chain=False).items():
            np.testing.assert_allclose(means[name], stats["mean"].numpy(), rtol=1e-4, atol=1e-5)


# 10-30 s: in the integration run (`make test-integration`, CI), not the default one.
@pytest.mark.integration
def test_two_ranks_set_the_single_process_default_step(tmp_path):
    results = spawn(tmp_path, "scenario_default_step")
    for rank in range(WORLD_SIZE):
        for config, sharded in zip(DEFAULT_STEP_CONFIGS, results[rank]):
            assert_close(sharded, reference(*config, default_step=True))


def test_a_divergence_on_one_rank_stops_both_with_the_same_error(tmp_path):
    results = spawn(tmp_path, "scenario_divergence")
    assert results[0] == results[1]
    name, step, particles, sites, kept = results[0]
    assert name == "SamplerDivergenceError"
    assert particles == [7]
    assert sites == ["push"]
    assert 0 < step < 20
    assert kept == (NUM_PARTICLES, step)  # the draws before the divergent step, all particles


@pytest.mark.integration
def test_preconditioned_sghmc_on_two_ranks_gives_the_single_process_chain(tmp_path):
    results = spawn(tmp_path, "scenario_preconditioned")
    single = run_chain("preconditioned_sghmc", None, "rbf", False, 16, warmup_steps=40)
    expected = as_numpy(single.get_samples(group_by_chain=True))
    mass = single.kernel.state.mass.numpy()
    assert not np.allclose(mass, 1.0)  # the window set it
    for rank in range(WORLD_SIZE):
        samples, local_mass = results[rank]
        assert_close(samples, expected)
        np.testing.assert_allclose(local_mass, mass[rank * 4 : (rank + 1) * 4], rtol=1e-6)


@pytest.mark.integration
def test_an_escaped_particle_on_one_rank_is_reported_by_every_rank_warned_once(tmp_path):
    results = spawn(tmp_path, "scenario_escape")
    assert results[0] == ([7], 1)  # rank 0 warns for the run
    assert results[1] == ([7], 0)


# About 12-15 s of spawned ranks: in the integration run (make test stays near 5 minutes);
# the default run keeps the sharded chain equal to the single process through the
# default-step test.
@pytest.mark.integration
def test_checkpoint_resume_on_two_ranks_gives_the_same_draws(tmp_path):
    results = spawn(tmp_path, "scenario_checkpoint", str(tmp_path / "run.pt"))
    expected = reference("sghmc", "particles", "rbf", False)
    for rank in range(WORLD_SIZE):
        draws, files = results[rank]
        assert_close(draws, expected)
        assert {"run.pt.rank0", "run.pt.rank1"} <= set(files)
    for name in expected:
        np.testing.assert_array_equal(results[0][0][name], results[1][0][name])


def test_eager_gloo_gathers_in_pieces_give_the_gather_and_the_single_process_chain(tmp_path):
    results = spawn(tmp_path, "scenario_pieces")
    rows = np.arange(15.0).reshape(3, 5)
    expected = reference("sghmc", "particles", "rbf", False)
    for rank in range(WORLD_SIZE):
        pieces, gathered, draws = results[rank]
        assert pieces == 2
        np.testing.assert_array_equal(gathered, np.concatenate([rows, 100.0 + rows]))
        assert_close(draws, expected)


def test_bad_sharded_input_gets_the_same_clear_error_on_every_rank(tmp_path):
    results = spawn(tmp_path, "scenario_bad_input")
    assert results[0].keys() == results[1].keys()
    expected = {
        "indivisible": ("ValueError", "num_particles=7 is not divisible by the world size 2"),
        "seeds": ("ValueError", "initial particles"),
        "models": ("ValueError", "latent sites"),
        "backend": ("ValueError", "backend is 'mpi'"),
        "data plate too small": ("ValueError", "subsample_size=40"),
        "gibbs": ("ValueError", "shard=None"),
        "shard type": ("TypeError", "shard"),
        "shard value": ("ValueError", "shard"),
    }
    for rank in range(WORLD_SIZE):
        for case, (kind, text) in expected.items():
            got_kind, message = results[rank][case]
            assert got_kind == kind, (rank, case, message)
            assert text in message, (rank, case, message)


def test_a_killed_rank_makes_the_other_fail_instead_of_hanging(tmp_path):
    results = spawn(tmp_path, "scenario_kill", expect=1)
    name, message = results[0]
    assert name == "RankFailedError"
    assert "rank 0 of 2" in message and "restart" in message


# In the integration run (`make test-integration`, CI): end to end, the tutorial script run
# three times in fresh interpreters (once alone, twice under torchrun), about 40 s of CPU.
@pytest.mark.integration
def test_the_example_script_launched_by_torchrun_gives_the_single_process_answer():
    script = Path(__file__).resolve().parents[2] / "tutorials" / "scaling_out.py"

    def rmse(*launcher, shard="particles"):
        command = [*launcher, str(script), "--quick", "--shard", shard]
        result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert result.returncode == 0, result.stderr[-2000:]
        return sorted(re.findall(r"rank (\d) of (\d): test RMSE ([\d.]+)", result.stdout))

    single = rmse(sys.executable)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert len(single) == 1
    for shard in ("particles", "data"):
        ranks = rmse(*torchrun, shard=shard)
        assert [(r, w) for r, w, _ in ranks] == [("0", "2"), ("1", "2")]
        for _, _, value in ranks:
            assert abs(float(value) - float(single[0][2])) < 1e-3, (shard, ranks, single)


# About 12-15 s of spawned ranks: in the integration run (make test stays near 5 minutes);
# the default run keeps the sharded chain equal to the single process through the
# default-step test.
@pytest.mark.integration
def test_extend_and_draws_device_on_two_ranks_give_the_single_process_draws(tmp_path):
    results = spawn(tmp_path, "scenario_extend")
    single = run_chain("sghmc", None, "rbf", False, 16, draws_device="cpu")
    single.extend(5)
    expected = as_numpy(single.get_samples(group_by_chain=True))
    assert expected["w"].shape == (NUM_PARTICLES, 15, 3)
    for rank in range(WORLD_SIZE):
        assert_close(results[rank], expected)


# -- the row-sharded coupling's algebra, in one process ---------------------------------------
@pytest.mark.parametrize("bandwidth", [None, 0.7])
def test_a_ranks_rows_of_the_coupling_are_the_whole_couplings_rows(device, bandwidth):
    # What each rank computes from its rows (issue 34): the drift, K v / L and the
    # correlated noise are the single-process coupling's rows, to round-off.
    from pyro_ext.infer.sgmcmc.distributed import RowCoupling
    from pyro_ext.infer.sgmcmc.repulsion import RBFKernel

    generator = torch.Generator().manual_seed(0)
    z, grad, velocity, noise = (
        torch.randn(8, 5, generator=generator, dtype=torch.float64).to(device) for _ in range(4)
    )
    kernel = RBFKernel(bandwidth)
    whole = kernel.coupling(z)
    for rows in (slice(0, 4), slice(4, 8)):
        sq_rows = kernel.squared_distance_rows(z, rows)
        sq = kernel._squared_distances(z)
        assert torch.allclose(sq_rows, sq[rows], atol=1e-12)
        h, a, b = kernel.bandwidth_and_pair(sq)
        matrix = torch.exp(-sq / h)
        term = None if bandwidth else kernel.bandwidth_term(matrix[rows], sq_rows, h, a, b, z)
        part = RowCoupling(
            matrix, 2.0 / h * z, term, rows, grad, noise, gather=lambda v, rows=rows: velocity
        )
        assert torch.allclose(part.drift(grad[rows]), whole.drift(grad)[rows], atol=1e-12)
        assert torch.allclose(part.repulsion, whole.repulsion[rows], atol=1e-12)
        assert torch.allclose(part.couple(velocity[rows]), whole.couple(velocity)[rows])
        assert torch.allclose(part.correlate(noise[rows]), whole.correlate(noise)[rows])
