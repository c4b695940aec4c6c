"""
Per-step speed of the stochastic-gradient MCMC kernels of ``pyro_ext.infer``, as ratios
against baselines timed in the same run.

Model: a Bayesian MLP on UCI kin8nm (split 0, standardised): 8 inputs, one hidden layer of
50 ReLU units, N(0, 1) priors on all weights (D = 501), Gaussian likelihood with fixed noise
``NOISE``, minibatches of 100 drawn with ``randperm`` and scaled by N / 100. The Pyro model is
written idiomatically (``pyro.sample(...).to_event()``, ``pyro.plate(subsample_size=100)``);
the baselines compute the same log density by hand (checked equal, value and gradient,
before timing).

Tables (each ratio is the median over repeats of ours / baseline, the two timed back to back
in every repeat; times are medians in microseconds per step):

1. ``MCMC(SGLD|SGHMC|AdamSGLD)`` vs a hand-written PyTorch loop with autograd (the loop keeps
   a copy of every state, as MCMC does); 10 particles vs the loop under ``torch.func.vmap``.
2. ``SGLD(repulsion="rbf")`` vs ``SGLD(repulsion=None)`` at L = 10, 50, 200, and the peak
   memory of ``RBFKernel().coupling(z)`` vs ``pyro.infer.svgd.RBFSteinKernel()
   .log_kernel_and_grad(z)`` for z of shape (L, D), against the O(L^2 + LD) and O(L^2 D)
   predictions (CPU: allocator events of ``torch.profiler``; CUDA: ``max_memory_allocated``).
3. Peers on the same model: ``posteriors`` SGLD / SGHMC and BlackJAX SGLD (jitted step; its
   minibatch indices come from NumPy's ``permutation``, as ``jax.random.permutation`` of the
   7373 rows alone costs milliseconds on CPU). A peer that is not importable gets a
   "not installed" row.

Each timed run takes ``warmup`` untimed steps, then ``steps`` timed ones; ``MCMC`` is timed
from its ``hook_fn`` so that setup and the final collection of samples are excluded. CPU runs
use one intra-op thread (``--threads``): the per-step tensors are tiny, and extra threads
only add synchronisation noise, worst on a shared machine.

Run from the repository root::

    python benchmarks/sgmcmc_speed.py            # full: 5 repeats of 200 steps, a few minutes
    python benchmarks/sgmcmc_speed.py --quick    # 2 repeats of 20 steps, under a minute
    python benchmarks/sgmcmc_speed.py --device cuda

Data are read from ``$PYRO_EXT_DATA`` (default: ``../shared/data`` next to the repository).
The tables are printed and written to ``benchmarks/results/sgmcmc_speed.md``.
"""

import argparse
import math
import os
import statistics
import time
import warnings
from importlib.metadata import version
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("PYRO_EXT_DATA", str(REPO.parent / "shared" / "data"))

import numpy as np  # noqa: E402
import pyro  # noqa: E402
import pyro.distributions as dist  # noqa: E402
import torch  # noqa: E402
from pyro.infer.svgd import RBFSteinKernel  # noqa: E402

from pyro_ext.datasets import load_uci, standardize_split  # noqa: E402
from pyro_ext.infer import MCMC, SGHMC, SGLD, AdamSGLD  # noqa: E402
from pyro_ext.infer.sgmcmc import ParticlePotential  # noqa: E402
from pyro_ext.infer.sgmcmc.repulsion import RBFKernel  # noqa: E402

from _report import markdown, write_report  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "sgmcmc_speed.md"
HIDDEN = 50
BATCH = 100
NOISE = 0.5
STEP_SIZE = 1e-8
FRICTION = 0.1
BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
REPULSION_PARTICLES = (10, 50, 200)


class Budget(NamedTuple):
    warmup: int
    steps: int
    repeats: int


FULL = Budget(warmup=20, steps=200, repeats=5)
QUICK = Budget(warmup=5, steps=20, repeats=2)


# -- model and data ------------------------------------------------------------------------
def bnn_model(x, y):
    prior = dist.Normal(x.new_zeros(()), 1.0)
    w1 = pyro.sample("w1", prior.expand([x.shape[-1], HIDDEN]).to_event(2))
    b1 = pyro.sample("b1", prior.expand([HIDDEN]).to_event(1))
    w2 = pyro.sample("w2", prior.expand([HIDDEN]).to_event(1))
    b2 = pyro.sample("b2", prior)
    with pyro.plate("data", x.shape[0], subsample_size=BATCH) as idx:
        mean = torch.relu(x[idx] @ w1 + b1) @ w2 + b2
        pyro.sample("obs", dist.Normal(mean, NOISE), obs=y[idx])


def load_data(device):
    split, _, _ = standardize_split(load_uci("kin8nm", 0, device=device))
    return split.x_train, split.y_train


def param_shapes(x):
    return [(x.shape[-1], HIDDEN), (HIDDEN,), (HIDDEN,), ()]


# -- hand-written baselines ----------------------------------------------------------------
def bnn_log_joint(params, x_batch, y_batch, scale):
    """The model's log density written out, for one particle."""
    w1, b1, w2, b2 = params
    mean = torch.relu(x_batch @ w1 + b1) @ w2 + b2
    log_lik = -0.5 * ((y_batch - mean) / NOISE).pow(2) - math.log(NOISE) - HALF_LOG_2PI
    log_prior = sum(-0.5 * p.pow(2).sum() - HALF_LOG_2PI * p.numel() for p in params)
    return scale * log_lik.sum() + log_prior


def hand_log_joint(num_particles):
    """Summed log density of ``num_particles`` particles (leading dim) when more than one."""
    if num_particles == 1:
        return bnn_log_joint
    batched = torch.func.vmap(bnn_log_joint, in_dims=(0, None, None, None))
    return lambda *args: batched(*args).sum()


def init_params(x, num_particles, requires_grad=True):
    lead = () if num_particles == 1 else (num_particles,)
    return [
        torch.empty(lead + shape, device=x.device).uniform_(-2, 2).requires_grad_(requires_grad)
        for shape in param_shapes(x)
    ]


def minibatch(x, y):
    idx = torch.randperm(x.shape[0], device=x.device)[:BATCH]
    return x[idx], y[idx]


def sgld_step(params, grads, state, adapting):
    for p, g in zip(params, grads):
        p.add_(STEP_SIZE * g + math.sqrt(2 * STEP_SIZE) * torch.randn_like(p))


def sghmc_step(params, grads, state, adapting):
    noise_scale = math.sqrt(2 * FRICTION * STEP_SIZE)
    for p, g, v in zip(params, grads, state["velocity"]):
        v.mul_(1 - FRICTION).add_(STEP_SIZE * g + noise_scale * torch.randn_like(p))
        p.add_(v)


def adam_sgld_step(params, grads, state, adapting):
    """Adam+N as in AdamSGLD: the mass adapts during warmup, then stays frozen."""
    beta1, beta2 = BETAS
    if adapting:
        state["count"] += 1
        for i, (s, g) in enumerate(zip(state["second_moment"], grads)):
            s.mul_(beta2).add_((1 - beta2) * g * g)
            state["mass"][i] = (s / (1 - beta2 ** state["count"])).sqrt() + ADAM_EPS
    noise_scale = math.sqrt(2 * (1 - beta1) * STEP_SIZE)
    for p, g, u, m in zip(params, grads, state["velocity"], state["mass"]):
        u.mul_(beta1).add_(STEP_SIZE * g + noise_scale * m.sqrt() * torch.randn_like(p))
        p.add_(u / m)


def hand_state(params):
    keys = ("velocity", "second_moment", "mass")
    state = {key: [torch.zeros_like(p) for p in params] for key in keys}
    state["count"] = 0
    return state


HAND_STEPS = {"SGLD": sgld_step, "SGHMC": sghmc_step, "AdamSGLD": adam_sgld_step}
KERNELS = {
    "SGLD": lambda **kw: SGLD(bnn_model, STEP_SIZE, **kw),
    "SGHMC": lambda **kw: SGHMC(bnn_model, STEP_SIZE, friction=FRICTION, **kw),
    "AdamSGLD": lambda **kw: AdamSGLD(bnn_model, STEP_SIZE, betas=BETAS, eps=ADAM_EPS, **kw),
}


# -- timing --------------------------------------------------------------------------------
def clock(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def time_loop(step, budget, device, sync=lambda result: None):
    """
    Seconds per call of ``step(t)`` over ``budget.steps`` calls after the warm-up ones;
    ``sync(result)`` waits for asynchronous work (JAX) before each clock reading.
    """
    for t in range(budget.warmup):
        result = step(t)
    sync(result)
    start = clock(device)
    for t in range(budget.warmup, budget.warmup + budget.steps):
        result = step(t)
    sync(result)
    return (clock(device) - start) / budget.steps


def time_ours(sampler, data, budget, **kernel_kwargs):
    device = data[0].device
    calls = 0
    stamps = []

    def hook(kernel, params, stage, index):
        nonlocal calls
        calls += 1
        if calls in (budget.warmup, budget.warmup + budget.steps):
            stamps.append(clock(device))

    kernel = KERNELS[sampler](**kernel_kwargs)
    mcmc = MCMC(
        kernel, budget.steps, warmup_steps=budget.warmup, disable_progbar=True, hook_fn=hook
    )
    mcmc.run(*data)
    return (stamps[1] - stamps[0]) / budget.steps


def time_hand(sampler, data, budget, num_particles=1):
    x, y = data
    params = init_params(x, num_particles)
    state = hand_state(params)
    log_joint = hand_log_joint(num_particles)
    scale = x.shape[0] / BATCH
    update = HAND_STEPS[sampler]
    draws = []

    def step(t):
        grads = torch.autograd.grad(log_joint(params, *minibatch(x, y), scale), params)
        with torch.no_grad():
            update(params, grads, state, adapting=t < budget.warmup or state["count"] == 0)
            draws.append([p.clone() for p in params])

    return time_loop(step, budget, x.device)


def compare(ours, theirs, budget):
    """Median seconds per step of each, and the median of the paired ratios ours/theirs."""
    pairs = [(ours(), theirs()) for _ in range(budget.repeats)]
    return (
        statistics.median(a for a, _ in pairs),
        statistics.median(b for _, b in pairs),
        statistics.median(a / b for a, b in pairs),
    )


def check_same_density(data, num_particles):
    """The hand-written log density and gradient equal the Pyro model's."""
    x, y = data
    potential = ParticlePotential(bnn_model, (x, y))
    z = torch.empty(num_particles, potential.dim, device=x.device).uniform_(-2, 2)
    subsamples = potential.draw_subsamples(x.device)
    ours, grad = potential.log_density_and_grad(z, subsamples)
    values = potential.unflatten(z)
    params = [values[name].squeeze(0).requires_grad_() for name in ("w1", "b1", "w2", "b2")]
    idx = subsamples["data"]
    log_joint = hand_log_joint(num_particles)(params, x[idx], y[idx], x.shape[0] / BATCH)
    hand_grads = torch.autograd.grad(log_joint, params)
    hand_grad = torch.cat([g.reshape(num_particles, -1) for g in hand_grads], -1)
    torch.testing.assert_close(ours.sum(), log_joint.detach(), rtol=1e-5, atol=1e-2)
    torch.testing.assert_close(grad, hand_grad, rtol=1e-4, atol=1e-2)


# -- memory --------------------------------------------------------------------------------
def peak_bytes(fn, z):
    """Peak bytes allocated while ``fn(z)`` runs, its outputs included."""
    if z.is_cuda:
        torch.cuda.synchronize(z.device)
        torch.cuda.reset_peak_memory_stats(z.device)
        base = torch.cuda.memory_allocated(z.device)
        fn(z)
        torch.cuda.synchronize(z.device)
        return torch.cuda.max_memory_allocated(z.device) - base
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        fn(z)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


# -- peers ---------------------------------------------------------------------------------
def import_posteriors():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import posteriors
    return posteriors


def time_posteriors(sampler, data, budget):
    posteriors = import_posteriors()
    x, y = data
    scale = x.shape[0] / BATCH

    def log_posterior(params, batch):
        return bnn_log_joint(params, *batch, scale), torch.tensor(())

    if sampler == "SGLD":
        transform = posteriors.sgmcmc.sgld.build(log_posterior, lr=STEP_SIZE)
    else:  # v = lr * m turns posteriors' SGHMC into ours: lr^2 = step size, lr * alpha = friction
        lr = math.sqrt(STEP_SIZE)
        transform = posteriors.sgmcmc.sghmc.build(log_posterior, lr=lr, alpha=FRICTION / lr)
    state = transform.init(tuple(init_params(x, 1, requires_grad=False)))
    draws = []

    def step(t):
        nonlocal state
        state, _ = transform.update(state, minibatch(x, y))
        draws.append(state.params)

    return time_loop(step, budget, x.device)


def blackjax_sgld_step(data):
    """A jitted BlackJAX SGLD step ``(key, position, idx) -> (key, position)``, and its start."""
    import blackjax
    import jax
    import jax.numpy as jnp

    x, y = (jnp.asarray(t.cpu().numpy()) for t in data)
    norm = jax.scipy.stats.norm

    def log_prior(position):
        return sum(norm.logpdf(p).sum() for p in position)

    def log_lik(position, datum):
        w1, b1, w2, b2 = position
        x_i, y_i = datum
        return norm.logpdf(y_i, jax.nn.relu(x_i @ w1 + b1) @ w2 + b2, NOISE)

    sgld = blackjax.sgld(blackjax.sgmcmc.gradients.grad_estimator(log_prior, log_lik, x.shape[0]))

    @jax.jit
    def step(key, position, idx):
        key, noise_key = jax.random.split(key)
        return key, sgld.step(noise_key, position, (x[idx], y[idx]), STEP_SIZE)

    start = [jnp.asarray(p.numpy()) for p in init_params(data[0].cpu(), 1, requires_grad=False)]
    return step, (jax.random.PRNGKey(0), sgld.init(start))


def time_blackjax(data, budget):
    import jax

    jax_step, carry = blackjax_sgld_step(data)
    size = data[0].shape[0]
    rng = np.random.default_rng(0)
    draws = []

    def step(t):
        nonlocal carry
        carry = jax_step(*carry, rng.permutation(size)[:BATCH])
        draws.append(carry[1])
        return carry

    return time_loop(step, budget, torch.device("cpu"), sync=jax.block_until_ready)


# -- tables --------------------------------------------------------------------------------
def fmt_us(seconds):
    return f"{seconds * 1e6:,.0f}"


def verdict(ratio, target):
    return f"<= {target}: {'yes' if ratio <= target else 'NO'}"


def table_baselines(data, budget):
    rows = []
    for sampler, num_particles, jit_compile, target in [
        ("SGLD", 1, False, 1.3),
        ("SGLD", 1, True, 1.3),
        ("SGHMC", 1, False, 1.3),
        ("SGHMC", 1, True, 1.3),
        ("AdamSGLD", 1, False, 1.3),
        ("AdamSGLD", 1, True, 1.3),
        ("SGLD", 10, False, None),
    ]:
        ours, hand, ratio = compare(
            lambda: time_ours(
                sampler, data, budget, num_particles=num_particles, jit_compile=jit_compile
            ),
            lambda: time_hand(sampler, data, budget, num_particles),
            budget,
        )
        baseline = "loop" if num_particles == 1 else "vmap loop"
        rows.append([sampler, num_particles, "yes" if jit_compile else "no", baseline,
                     fmt_us(ours), fmt_us(hand), f"{ratio:.2f}",
                     "-" if target is None else verdict(ratio, target)])
    header = ["sampler", "L", "jit_compile", "baseline", "ours µs/step", "hand-written µs/step",
              "ratio", "target"]
    return "## 1. MCMC(kernel) vs hand-written PyTorch loop\n\n" + markdown(header, rows)


def table_repulsion(data, budget):
    rows = []
    for num_particles in REPULSION_PARTICLES:
        rbf, independent, ratio = compare(
            lambda: time_ours("SGLD", data, budget, num_particles=num_particles, repulsion="rbf"),
            lambda: time_ours("SGLD", data, budget, num_particles=num_particles),
            budget,
        )
        target = verdict(ratio, 2) if num_particles <= 50 else "-"
        rows.append([num_particles, fmt_us(independent), fmt_us(rbf), f"{ratio:.2f}", target])
    header = ["L", "independent µs/step", "rbf µs/step", "ratio rbf / independent", "target"]
    return "## 2a. SGLD repulsion='rbf' vs None\n\n" + markdown(header, rows)


def table_memory(data):
    dim = ParticlePotential(bnn_model, data).dim
    rows = []
    for num_particles in REPULSION_PARTICLES:
        z = torch.randn(num_particles, dim, device=data[0].device)
        size = z.element_size()
        ours = peak_bytes(RBFKernel().coupling, z)
        pyro_kernel = peak_bytes(RBFSteinKernel().log_kernel_and_grad, z)
        small = size * (num_particles**2 + num_particles * dim)
        large = size * num_particles**2 * dim
        rows.append([num_particles, dim, f"{ours:,}", f"{small:,}", f"{ours / small:.2f}",
                     f"{pyro_kernel:,}", f"{large:,}", f"{pyro_kernel / large:.2f}"])
    header = ["L", "D", "RBFKernel.coupling bytes", "(L²+LD)·itemsize", "ratio",
              "RBFSteinKernel.log_kernel_and_grad bytes", "L²D·itemsize", "ratio"]
    note = ("Peak bytes allocated during the call, outputs included; itemsize = 4 (float32). "
            "A ratio that stays flat as L grows confirms the predicted order.")
    return "## 2b. Repulsion memory, z of shape (L, D)\n\n" + note + "\n\n" + markdown(header, rows)


def peer_rows(data, budget):
    peers = [
        ("posteriors", "SGLD", lambda: time_posteriors("SGLD", data, budget), import_posteriors),
        ("posteriors", "SGHMC", lambda: time_posteriors("SGHMC", data, budget), import_posteriors),
        ("blackjax", "SGLD", lambda: time_blackjax(data, budget), lambda: __import__("blackjax")),
    ]
    for peer, sampler, theirs, load in peers:
        try:
            load()
        except ImportError:
            yield [peer, "not installed", sampler, "-", "-", "-"]
            continue
        if peer == "blackjax" and data[0].is_cuda:
            yield [peer, version(peer), sampler, "-", "-", "skipped: timed on CPU only"]
            continue
        ours, other, ratio = compare(lambda: time_ours(sampler, data, budget), theirs, budget)
        yield [peer, version(peer), sampler, fmt_us(ours), fmt_us(other), f"{ratio:.2f}"]


def table_peers(data, budget):
    header = ["peer", "version", "sampler", "ours µs/step", "theirs µs/step", "ratio ours / theirs"]
    return "## 3. Peers, L = 1\n\n" + markdown(header, list(peer_rows(data, budget)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=RESULTS, help="where the tables are written")
    parser.add_argument("--quick", action="store_true", help="few steps, 2 repeats")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads on CPU")
    args = parser.parse_args()
    budget = QUICK if args.quick else FULL
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    pyro.set_rng_seed(0)
    data = load_data(device)
    for num_particles in (1, 10):
        check_same_density(data, num_particles)
    started = time.perf_counter()
    sections = [
        table_baselines(data, budget),
        table_repulsion(data, budget),
        table_memory(data),
        table_peers(data, budget),
    ]
    preamble = (
        f"# SG-MCMC per-step speed ({'quick' if args.quick else 'full'} run)\n\n"
        f"BNN 8-{HIDDEN}-1 on kin8nm (N = {data[0].shape[0]}, batch {BATCH}), device {device}, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), pyro {pyro.__version__}; "
        f"{budget.repeats} repeats of {budget.steps} steps after {budget.warmup} warm-up steps; "
        f"times are medians, ratios medians of per-repeat ratios. "
        f"Total {time.perf_counter() - started:.0f} s."
    )
    write_report(preamble, sections, args.output)

if __name__ == "__main__":
    main()
