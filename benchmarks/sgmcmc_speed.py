"""
Per-step speed of the stochastic-gradient MCMC kernels of ``pyro_ext.infer``, eager and
compiled, as ratios against baselines timed in the same run.

Model: a Bayesian MLP on UCI kin8nm (split 0, standardised): 8 inputs, one hidden layer of
50 ReLU units, N(0, 1) priors on all weights (D = 501), Gaussian likelihood with fixed noise
``NOISE``, minibatches of 100 drawn with ``randperm`` and scaled by N / 100. The Pyro model is
written idiomatically (``pyro.sample(...).to_event()``, ``pyro.plate(subsample_size=100)``);
the baselines compute the same log density by hand (checked equal, value and gradient,
before timing). A bigger network shows the ratios where arithmetic dominates: 784-400-400-10
on MNIST, batch 128, L = 10 particles.

Our kernel runs in three ways: ``eager`` (``jit_compile=False``), ``trace`` (the traced
step run as a graph, no compilation) and ``compile`` (``jit_compile=True``: the traced
step through ``torch.compile``). Baselines:

- **hand loop**: a hand-written PyTorch loop with autograd and in-place updates (it keeps
  a copy of every state, as MCMC does); ``torch.func.vmap`` over particles when L > 1;
- **floor**: the same step written as one pure function with ``torch.func.grad`` and
  ``torch.compile``d; its noise and minibatch indices are drawn with ``torch.randn`` /
  ``randperm`` and passed in, as ours are (inductor's in-kernel CPU random numbers are
  slower: 224 against 85 ms per step on the MNIST network below);
- **peers**: ``posteriors`` SGLD / SGHMC and BlackJAX SGLD (jitted step; its minibatch
  indices come from NumPy's ``permutation``, as ``jax.random.permutation`` of the 7373 rows
  alone costs milliseconds on CPU). A peer that is not importable gets a "not installed" row.

Every step is timed (a clock reading per step; CUDA synchronises there), after ``warmup``
untimed steps, which hold the compilation: compile time is reported apart, with the number
of steps after which compiling pays off. Times are in microseconds per step: the median,
mean, p90 and max over all timed steps of all repeats; a ratio is the median over repeats
of ours / baseline (mean step times), the two timed back to back in every repeat. ``MCMC``
is timed from its ``hook_fn``, so setup and the final collection of samples are excluded.
CPU runs use one intra-op thread (``--threads``).

Run from the repository root::

    python benchmarks/sgmcmc_speed.py            # full: 5 repeats of 300 steps, ~10 minutes
    python benchmarks/sgmcmc_speed.py --quick    # 2 repeats of 20 steps, no MNIST and peers
    python benchmarks/sgmcmc_speed.py --device cuda   # compile_mode "reduce-overhead"

Data are read from ``$PYRO_EXT_DATA`` (default: ``../shared/data`` next to the repository).
The tables are printed and written to ``benchmarks/results/sgmcmc_speed.md`` (CUDA:
``sgmcmc_speed_cuda.md``).
"""

import math
import statistics
import time
import warnings
from importlib.metadata import version
from typing import NamedTuple

from _common import REPO, fresh_inductor_cache  # noqa: E402  (sets $PYRO_EXT_DATA's default)

# A fresh inductor cache, so that the first compilation of this run is a cold one (what a
# user meets the first time); later ones of the same graph hit the on-disk cache. Removed
# at exit.
fresh_inductor_cache("sgmcmc_speed_inductor_")

import numpy as np  # noqa: E402
import pyro  # noqa: E402
import pyro.distributions as dist  # noqa: E402
import torch  # noqa: E402
from _common import argument_parser, markdown, write_report  # noqa: E402
from _common import spread as timing_spread  # noqa: E402
from pyro.infer.svgd import RBFSteinKernel  # noqa: E402

from pyro_ext.datasets import load_mnist, load_uci, standardize_split  # noqa: E402
from pyro_ext.infer import MCMC, SGHMC, SGLD, AdamSGLD  # noqa: E402
from pyro_ext.infer.sgmcmc import ParticlePotential  # noqa: E402
from pyro_ext.infer.sgmcmc.repulsion import RBFKernel  # noqa: E402

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
MNIST_HIDDEN = (400, 400)
MNIST_BATCH = 128
MNIST_PARTICLES = 10
JIT = {"eager": False, "trace": "trace", "compile": True}


class Budget(NamedTuple):
    warmup: int
    steps: int
    repeats: int


FULL = Budget(warmup=20, steps=300, repeats=5)
QUICK = Budget(warmup=3, steps=20, repeats=2)


class Problem(NamedTuple):
    """A Pyro model, its data, and the same log density written by hand for one particle."""

    name: str
    model: object
    data: tuple
    log_joint: object  # (params, x_batch, y_batch, scale) -> scalar
    shapes: list
    batch: int


# -- models and data -----------------------------------------------------------------------
def bnn_model(x, y):
    prior = dist.Normal(x.new_zeros(()), 1.0)
    w1 = pyro.sample("w1", prior.expand([x.shape[-1], HIDDEN]).to_event(2))
    b1 = pyro.sample("b1", prior.expand([HIDDEN]).to_event(1))
    w2 = pyro.sample("w2", prior.expand([HIDDEN]).to_event(1))
    b2 = pyro.sample("b2", prior)
    with pyro.plate("data", x.shape[0], subsample_size=BATCH) as idx:
        mean = torch.relu(x[idx] @ w1 + b1) @ w2 + b2
        pyro.sample("obs", dist.Normal(mean, NOISE), obs=y[idx])


def bnn_log_joint(params, x_batch, y_batch, scale):
    """The model's log density written out, for one particle."""
    w1, b1, w2, b2 = params
    mean = torch.relu(x_batch @ w1 + b1) @ w2 + b2
    log_lik = -0.5 * ((y_batch - mean) / NOISE).pow(2) - math.log(NOISE) - HALF_LOG_2PI
    log_prior = sum(-0.5 * p.pow(2).sum() - HALF_LOG_2PI * p.numel() for p in params)
    return scale * log_lik.sum() + log_prior


def mnist_model(x, y):
    prior = dist.Normal(x.new_zeros(()), 1.0)
    sizes = (x.shape[-1],) + MNIST_HIDDEN + (10,)
    weights = [
        (
            pyro.sample(f"w{i}", prior.expand([fan_in, fan_out]).to_event(2)),
            pyro.sample(f"b{i}", prior.expand([fan_out]).to_event(1)),
        )
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:]))
    ]
    with pyro.plate("data", x.shape[0], subsample_size=MNIST_BATCH) as idx:
        h = x[idx]
        for i, (w, b) in enumerate(weights):
            h = h @ w + b
            if i < len(weights) - 1:
                h = torch.relu(h)
        pyro.sample("obs", dist.Categorical(logits=h), obs=y[idx])


def mnist_log_joint(params, x_batch, y_batch, scale):
    h = x_batch
    for i in range(0, len(params), 2):
        h = h @ params[i] + params[i + 1]
        if i < len(params) - 2:
            h = torch.relu(h)
    log_lik = torch.log_softmax(h, -1).gather(-1, y_batch.unsqueeze(-1)).sum()
    log_prior = sum(-0.5 * p.pow(2).sum() - HALF_LOG_2PI * p.numel() for p in params)
    return scale * log_lik + log_prior


def kin8nm(device):
    split, _, _ = standardize_split(load_uci("kin8nm", 0, device=device))
    x = split.x_train
    shapes = [(x.shape[-1], HIDDEN), (HIDDEN,), (HIDDEN,), ()]
    return Problem(
        "BNN 8-50-1, kin8nm", bnn_model, (x, split.y_train), bnn_log_joint, shapes, BATCH
    )


def mnist(device):
    x, y = load_mnist("train", device=device, flatten=True)
    sizes = (x.shape[-1],) + MNIST_HIDDEN + (10,)
    shapes = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        shapes += [(fan_in, fan_out), (fan_out,)]
    return Problem(
        "BNN 784-400-400-10, MNIST", mnist_model, (x, y), mnist_log_joint, shapes, MNIST_BATCH
    )


# -- hand-written baselines ----------------------------------------------------------------
def summed_log_joint(problem, num_particles):
    """Summed log density of ``num_particles`` particles (leading dim) when more than one."""
    if num_particles == 1:
        return problem.log_joint
    batched = torch.func.vmap(problem.log_joint, in_dims=(0, None, None, None))
    return lambda *args: batched(*args).sum()


def init_params(problem, num_particles, requires_grad=True, scale=2.0):
    x = problem.data[0]
    lead = () if num_particles == 1 else (num_particles,)
    return [
        torch.empty(lead + shape, device=x.device)
        .uniform_(-scale, scale)
        .requires_grad_(requires_grad)
        for shape in problem.shapes
    ]


def minibatch(problem):
    x, y = problem.data
    idx = torch.randperm(x.shape[0], device=x.device)[: problem.batch]
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
    "SGLD": lambda model, **kw: SGLD(model, STEP_SIZE, **kw),
    "SGHMC": lambda model, **kw: SGHMC(model, STEP_SIZE, friction=FRICTION, **kw),
    "AdamSGLD": lambda model, **kw: AdamSGLD(model, STEP_SIZE, betas=BETAS, eps=ADAM_EPS, **kw),
}


# -- the floor: a pure step, torch.compile'd ----------------------------------------------
def floor_step(sampler, problem, num_particles):
    """``step(params, state, idx, adapt) -> (params, state)``, compiled, for one sampler."""
    x, y = problem.data
    scale = x.shape[0] / problem.batch
    grad = torch.func.grad(summed_log_joint(problem, num_particles))
    beta1, beta2 = BETAS

    def step(params, state, idx, noise, adapt):
        grads = grad(params, x[idx], y[idx], scale)
        if sampler == "SGLD":
            scale_ = math.sqrt(2 * STEP_SIZE)
            return [p + STEP_SIZE * g + scale_ * n for p, g, n in zip(params, grads, noise)], state
        if sampler == "SGHMC":
            scale_ = math.sqrt(2 * FRICTION * STEP_SIZE)
            velocity = [
                (1 - FRICTION) * v + STEP_SIZE * g + scale_ * n
                for v, g, n in zip(state["velocity"], grads, noise)
            ]
            return [p + v for p, v in zip(params, velocity)], dict(state, velocity=velocity)
        count = state["count"] + adapt.long()
        second = [
            torch.where(adapt, beta2 * s + (1 - beta2) * g * g, s)
            for s, g in zip(state["second_moment"], grads)
        ]
        mass = [(s / (1 - beta2**count)).sqrt() + ADAM_EPS for s in second]
        scale_ = math.sqrt(2 * (1 - beta1) * STEP_SIZE)
        velocity = [
            beta1 * u + STEP_SIZE * g + scale_ * m.sqrt() * n
            for u, g, m, n in zip(state["velocity"], grads, mass, noise)
        ]
        params = [p + u / m for p, u, m in zip(params, velocity, mass)]
        return params, dict(state, velocity=velocity, second_moment=second, count=count)

    return torch.compile(step, fullgraph=True, dynamic=False)


# -- timing --------------------------------------------------------------------------------
def clock(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def time_loop(step, budget, device, sync=lambda result: None):
    """
    Seconds of each of ``budget.steps`` calls of ``step(t)`` after the warm-up ones;
    ``sync(result)`` waits for asynchronous work (JAX) before each clock reading.
    """
    for t in range(budget.warmup):
        result = step(t)
    sync(result)
    stamps = [clock(device)]
    for t in range(budget.warmup, budget.warmup + budget.steps):
        sync(step(t))
        stamps.append(clock(device))
    return [b - a for a, b in zip(stamps[:-1], stamps[1:])]


def time_ours(sampler, problem, budget, jit="eager", **kernel_kwargs):
    """Per-step seconds of ``MCMC(kernel)``, and the kernel (for its compile time)."""
    device = problem.data[0].device
    stamps = []

    def hook(kernel, params, stage, index):
        if stage == "Sample":
            stamps.append(clock(device))

    kernel = KERNELS[sampler](problem.model, jit_compile=JIT[jit], **kernel_kwargs)
    mcmc = MCMC(
        kernel, budget.steps + 1, warmup_steps=budget.warmup, disable_progbar=True, hook_fn=hook
    )
    mcmc.run(*problem.data)
    return [b - a for a, b in zip(stamps[:-1], stamps[1:])], kernel


def time_hand(sampler, problem, budget, num_particles=1):
    params = init_params(problem, num_particles)
    state = hand_state(params)
    log_joint = summed_log_joint(problem, num_particles)
    scale = problem.data[0].shape[0] / problem.batch
    update = HAND_STEPS[sampler]
    draws = []

    def step(t):
        grads = torch.autograd.grad(log_joint(params, *minibatch(problem), scale), params)
        with torch.no_grad():
            update(params, grads, state, adapting=t < budget.warmup or state["count"] == 0)
            draws.append([p.clone() for p in params])

    return time_loop(step, budget, problem.data[0].device)


def time_floor(sampler, problem, budget, num_particles=1, compiled=None):
    x = problem.data[0]
    step = compiled or floor_step(sampler, problem, num_particles)
    params = init_params(problem, num_particles, requires_grad=False)
    zeros = [torch.zeros_like(p) for p in params]
    state = {
        "velocity": zeros,
        "second_moment": [z.clone() for z in zeros],
        "count": torch.zeros((), dtype=torch.long, device=x.device),
    }
    flags = torch.tensor(True, device=x.device), torch.tensor(False, device=x.device)
    draws = []
    first_call = []

    def step_t(t):
        nonlocal params, state
        started = clock(x.device) if t == 0 else None
        idx = torch.randperm(x.shape[0], device=x.device)[: problem.batch]
        noise = [torch.randn_like(p) for p in params]
        params, state = step(params, state, idx, noise, flags[0] if t < budget.warmup else flags[1])
        draws.append([p.clone() for p in params])
        if started is not None:
            first_call.append(clock(x.device) - started)

    return time_loop(step_t, budget, x.device), step, first_call[0]


class Timing(NamedTuple):
    steps: list  # seconds of every timed step of every repeat
    means: list  # mean seconds per step of each repeat


def compare(runs, budget):
    """
    Run each of ``runs`` (name -> () -> per-step seconds) back to back in every repeat.
    Returns name -> :class:`Timing`.
    """
    timings = {name: Timing([], []) for name in runs}
    for _ in range(budget.repeats):
        for name, run in runs.items():
            steps = run()
            timings[name].steps.extend(steps)
            timings[name].means.append(statistics.fmean(steps))
    return timings


def ratio(timings, ours, baseline):
    return statistics.median(a / b for a, b in zip(timings[ours].means, timings[baseline].means))


def fmt_us(seconds):
    return f"{seconds * 1e6:,.0f}"


def spread(steps):
    """median / mean / p90 / max of per-step times, in microseconds."""
    return timing_spread(steps, scale=1e6)


def verdict(value, target):
    return f"<= {target}: {'yes' if value <= target else 'NO'}"


def check_same_density(problem, num_particles):
    """The hand-written log density and gradient equal the Pyro model's."""
    x, y = problem.data
    potential = ParticlePotential(problem.model, (x, y))
    z = torch.empty(num_particles, potential.dim, device=x.device).uniform_(-0.1, 0.1)
    subsamples = potential.draw_subsamples(x.device)
    ours, grad = potential.log_density_and_grad(z, subsamples)
    # Both models draw their sites in the order of problem.shapes, the hand-written order.
    values = potential.unflatten(z)
    params = [values[name].squeeze(0).requires_grad_() for name in potential.layout]
    idx = subsamples["data"]
    log_joint = summed_log_joint(problem, num_particles)(
        params, x[idx], y[idx], x.shape[0] / problem.batch
    )
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


def time_posteriors(sampler, problem, budget):
    posteriors = import_posteriors()
    scale = problem.data[0].shape[0] / problem.batch

    def log_posterior(params, batch):
        return problem.log_joint(params, *batch, scale), torch.tensor(())

    if sampler == "SGLD":
        transform = posteriors.sgmcmc.sgld.build(log_posterior, lr=STEP_SIZE)
    else:  # v = lr * m turns posteriors' SGHMC into ours: lr^2 = step size, lr * alpha = friction
        lr = math.sqrt(STEP_SIZE)
        transform = posteriors.sgmcmc.sghmc.build(log_posterior, lr=lr, alpha=FRICTION / lr)
    state = transform.init(tuple(init_params(problem, 1, requires_grad=False)))
    draws = []

    def step(t):
        nonlocal state
        state, _ = transform.update(state, minibatch(problem))
        draws.append(state.params)

    return time_loop(step, budget, problem.data[0].device)


def blackjax_sgld_step(problem):
    """A jitted BlackJAX SGLD step ``(key, position, idx) -> (key, position)``, and its start."""
    import blackjax
    import jax
    import jax.numpy as jnp

    x, y = (jnp.asarray(t.cpu().numpy()) for t in problem.data)
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

    start = [
        jnp.asarray(p.detach().cpu().numpy()) for p in init_params(problem, 1, requires_grad=False)
    ]
    return step, (jax.random.PRNGKey(0), sgld.init(start))


def time_blackjax(problem, budget):
    import jax

    jax_step, carry = blackjax_sgld_step(problem)
    size = problem.data[0].shape[0]
    rng = np.random.default_rng(0)
    draws = []

    def step(t):
        nonlocal carry
        carry = jax_step(*carry, rng.permutation(size)[: problem.batch])
        draws.append(carry[1])
        return carry

    return time_loop(step, budget, torch.device("cpu"), sync=jax.block_until_ready)


# -- tables --------------------------------------------------------------------------------
def sampler_runs(sampler, problem, budget, num_particles, jits, compile_seconds):
    runs = {}
    for jit in jits:

        def run(jit=jit):
            steps, kernel = time_ours(
                sampler, problem, budget, jit=jit, num_particles=num_particles
            )
            if jit == "compile":
                compile_seconds.append(kernel.compile_seconds)
            return steps

        runs[jit] = run
    runs["hand loop"] = lambda: time_hand(sampler, problem, budget, num_particles)
    floor = {}

    def run_floor():
        steps, floor["step"], first_call = time_floor(
            sampler, problem, budget, num_particles, floor.get("step")
        )
        floor.setdefault("seconds", first_call)  # the first repeat's first call compiles
        return steps

    runs["floor"] = run_floor
    return runs, floor


def table_baselines(
    problem,
    budget,
    jits,
    samplers=("SGLD", "SGHMC", "AdamSGLD"),
    num_particles=1,
    compile_rows=None,
):
    rows, spreads = [], []
    for sampler in samplers:
        compile_seconds = []
        runs, floor = sampler_runs(sampler, problem, budget, num_particles, jits, compile_seconds)
        timings = compare(runs, budget)
        for jit in jits:
            row = [
                sampler,
                num_particles,
                jit,
                spread(timings[jit].steps),
                f"{ratio(timings, jit, 'hand loop'):.2f}",
                f"{ratio(timings, jit, 'floor'):.2f}",
            ]
            if jit == "eager":
                row.append(verdict(ratio(timings, jit, "hand loop"), 1.5) + " (vs loop)")
            elif jit == "compile":
                r_floor, r_loop = ratio(timings, jit, "floor"), ratio(timings, jit, "hand loop")
                row.append(f"{verdict(r_floor, 1.2)} (vs floor); {verdict(r_loop, 0.5)} (vs loop)")
            else:
                row.append("-")
            rows.append(row)
        spreads.append(
            [
                sampler,
                num_particles,
                spread(timings["hand loop"].steps),
                spread(timings["floor"].steps),
            ]
        )
        if compile_rows is not None and "compile" in jits:
            eager = statistics.fmean(timings["eager"].steps) if "eager" in timings else None
            fast = statistics.fmean(timings["compile"].steps)
            first, warm = (
                compile_seconds[0],
                statistics.median(compile_seconds[1:] or compile_seconds),
            )

            def breakeven(seconds):
                return "-" if eager is None or eager <= fast else f"{seconds / (eager - fast):,.0f}"

            compile_rows.append(
                [
                    problem.name,
                    sampler,
                    num_particles,
                    f"{first:.1f}",
                    f"{warm:.1f}",
                    f"{floor['seconds']:.1f}",
                    fmt_us(eager) if eager else "-",
                    fmt_us(fast),
                    breakeven(first),
                    breakeven(warm),
                ]
            )
    header = [
        "sampler",
        "L",
        "ours",
        "ours µs/step: median / mean / p90 / max",
        "÷ hand loop",
        "÷ floor",
        "target",
    ]
    base_header = [
        "sampler",
        "L",
        "hand loop µs/step: median / mean / p90 / max",
        "floor µs/step: median / mean / p90 / max",
    ]
    return (
        markdown(header, rows)
        + "\n\nBaselines of the same repeats:\n\n"
        + markdown(base_header, spreads)
    )


def coupling_floor(num_particles, dim, budget, device):
    """
    Per-step seconds of the arithmetic no RBF coupling can skip: the Gram product
    ``z z^T``, one product of the kernel matrix with the ``(L, D)`` drift, its Cholesky
    factor, and the factor times the ``(L, D)`` noise (three ``L x L x D`` products).
    """
    z, g, noise = (torch.randn(num_particles, dim, device=device) for _ in range(3))
    eye = torch.eye(num_particles, device=device)

    def step(t):
        gram = z @ z.T
        matrix = torch.exp(-gram / gram.mean())
        chol = torch.linalg.cholesky_ex(matrix + eye)[0]
        return matrix @ g + chol @ noise

    return time_loop(step, budget, device)


def table_repulsion(problem, budget, jit):
    rows = []
    dim = ParticlePotential(problem.model, problem.data).dim
    device = problem.data[0].device
    for num_particles in REPULSION_PARTICLES:
        timings = compare(
            {
                "rbf": lambda: time_ours(
                    "SGLD", problem, budget, jit=jit, num_particles=num_particles, repulsion="rbf"
                )[0],
                "independent": lambda: time_ours(
                    "SGLD", problem, budget, jit=jit, num_particles=num_particles
                )[0],
            },
            budget,
        )
        r = ratio(timings, "rbf", "independent")
        per_particle = statistics.fmean(timings["rbf"].steps) / num_particles
        floor = statistics.median(coupling_floor(num_particles, dim, budget, device))
        best = 1 + floor / statistics.median(timings["independent"].steps)
        target = (
            verdict(r, 1.3) if jit == "compile" else verdict(r, 2) if num_particles <= 50 else "-"
        )
        rows.append(
            [
                num_particles,
                jit,
                spread(timings["independent"].steps),
                spread(timings["rbf"].steps),
                fmt_us(per_particle),
                fmt_us(floor),
                f"{best:.2f}",
                f"{r:.2f}",
                target,
            ]
        )
    header = [
        "L",
        "ours",
        "independent µs/step: median / mean / p90 / max",
        "rbf µs/step: median / mean / p90 / max",
        "rbf µs per particle-step",
        "coupling arithmetic µs (median)",
        "best possible ratio",
        "rbf / independent",
        "target",
    ]
    return markdown(header, rows)


def table_contract(problem, budget):
    """
    The input contract's cost (issue 32): ``check_model_data`` runs at set-up, once on the
    full data, and never in a step. Set-up and step times of eager SGLD, L = 1, with the
    contract and with it replaced by a no-op, interleaved over the repeats.
    """
    from pyro_ext.infer.potential import density

    original = density.check_model_data
    setup_s = {True: [], False: []}
    steps = {True: [], False: []}
    ratios = []
    for _ in range(budget.repeats):
        means = {}
        for contract in (True, False):
            density.check_model_data = original if contract else lambda *args, **kwargs: None
            try:
                kernel = KERNELS["SGLD"](problem.model)
                started = time.perf_counter()
                kernel.setup(0, *problem.data)
                setup_s[contract].append(time.perf_counter() - started)
                timed, _ = time_ours("SGLD", problem, budget)
            finally:
                density.check_model_data = original
            steps[contract] += timed
            means[contract] = statistics.fmean(timed)
        ratios.append(means[True] / means[False])
    rows = [
        [
            "with the contract" if contract else "contract replaced by a no-op",
            f"{1e3 * statistics.median(setup_s[contract]):,.1f}",
            spread(steps[contract]),
        ]
        for contract in (True, False)
    ]
    return (
        markdown(["SGLD, L = 1, eager", "set-up ms (median)", "µs/step"], rows)
        + f"\n\nStep time with ÷ without the contract: {statistics.median(ratios):.3f} "
        f"(median over {budget.repeats} interleaved repeats; 1 is no cost). The contract "
        "runs in set-up only; a step reads no data check."
    )


def table_memory(problem):
    dim = ParticlePotential(problem.model, problem.data).dim
    rows = []
    for num_particles in REPULSION_PARTICLES:
        z = torch.randn(num_particles, dim, device=problem.data[0].device)
        size = z.element_size()
        ours = peak_bytes(RBFKernel().coupling, z)
        pyro_kernel = peak_bytes(RBFSteinKernel().log_kernel_and_grad, z)
        small = size * (num_particles**2 + num_particles * dim)
        large = size * num_particles**2 * dim
        rows.append(
            [
                num_particles,
                dim,
                f"{ours:,}",
                f"{small:,}",
                f"{ours / small:.2f}",
                f"{pyro_kernel:,}",
                f"{large:,}",
                f"{pyro_kernel / large:.2f}",
            ]
        )
    header = [
        "L",
        "D",
        "RBFKernel.coupling bytes",
        "(L²+LD)·itemsize",
        "ratio",
        "RBFSteinKernel.log_kernel_and_grad bytes",
        "L²D·itemsize",
        "ratio",
    ]
    note = (
        "Peak bytes allocated during the call, outputs included; itemsize = 4 (float32). "
        "A ratio that stays flat as L grows confirms the predicted order."
    )
    return note + "\n\n" + markdown(header, rows)


def peer_rows(problem, budget):
    peers = [
        ("posteriors", "SGLD", lambda: time_posteriors("SGLD", problem, budget), import_posteriors),
        (
            "posteriors",
            "SGHMC",
            lambda: time_posteriors("SGHMC", problem, budget),
            import_posteriors,
        ),
        (
            "blackjax",
            "SGLD",
            lambda: time_blackjax(problem, budget),
            lambda: __import__("blackjax"),
        ),
    ]
    for peer, sampler, theirs, load in peers:
        try:
            load()
        except ImportError:
            yield [peer, "not installed", sampler, "-", "-", "-", "-", "-"]
            continue
        if peer == "blackjax" and problem.data[0].is_cuda:
            yield [peer, version(peer), sampler, "-", "-", "-", "-", "skipped: timed on CPU only"]
            continue
        timings = compare(
            {
                "compile": lambda: time_ours(sampler, problem, budget, jit="compile")[0],
                "eager": lambda: time_ours(sampler, problem, budget, jit="eager")[0],
                "peer": theirs,
            },
            budget,
        )
        yield [
            peer,
            version(peer),
            sampler,
            spread(timings["compile"].steps),
            spread(timings["eager"].steps),
            spread(timings["peer"].steps),
            f"{ratio(timings, 'compile', 'peer'):.2f}",
            f"{ratio(timings, 'eager', 'peer'):.2f}",
        ]


def table_peers(problem, budget):
    header = [
        "peer",
        "version",
        "sampler",
        "ours compiled µs/step: median / mean / p90 / max",
        "ours eager µs/step",
        "theirs µs/step",
        "compiled ÷ theirs",
        "eager ÷ theirs",
    ]
    return markdown(header, list(peer_rows(problem, budget)))


def main():
    parser = argument_parser(
        __doc__,
        None,
        quick="few steps, 2 repeats, no MNIST or peers",
        output_help="where the report is written (default benchmarks/results/sgmcmc_speed.md; "
        "with --device cuda, sgmcmc_speed_cuda.md)",
        threads=1,
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    budget = QUICK if args.quick else FULL
    device = torch.device(args.device)
    output = args.output or (
        RESULTS if device.type == "cpu" else RESULTS.with_name("sgmcmc_speed_cuda.md")
    )
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    pyro.set_rng_seed(0)
    started = time.perf_counter()
    small = kin8nm(device)
    for num_particles in (1, 10):
        check_same_density(small, num_particles)
    compile_rows = []
    jits = ("eager", "compile") if args.quick else ("eager", "trace", "compile")
    samplers = ("SGLD",) if args.quick else ("SGLD", "SGHMC", "AdamSGLD")
    sections = [
        "## 1. One particle: ours vs the hand loop and the compiled floor\n\n"
        + table_baselines(small, budget, jits, samplers, compile_rows=compile_rows),
        "## 2. Ten particles (vmapped potential; the hand loop and the floor vmap too)\n\n"
        + table_baselines(
            small,
            budget,
            ("eager", "compile"),
            ("SGLD",),
            num_particles=10,
            compile_rows=compile_rows,
        ),
        "## 3. Repulsion: SGLD repulsion='rbf' vs independent particles\n\n"
        + "\n\n".join(
            table_repulsion(small, budget, jit)
            for jit in ("compile",) + (() if args.quick else ("eager",))
        ),
        "## 4. Repulsion memory, z of shape (L, D)\n\n" + table_memory(small),
    ]
    if not args.quick:
        big = mnist(device)
        check_same_density(big, 2)
        big_budget = Budget(warmup=10, steps=50, repeats=3)
        sections.append(
            f"## 5. {big.name}, batch {MNIST_BATCH}, L = {MNIST_PARTICLES}: where arithmetic dominates\n\n"
            + table_baselines(
                big,
                big_budget,
                ("eager", "compile"),
                ("SGLD",),
                num_particles=MNIST_PARTICLES,
                compile_rows=compile_rows,
            )
        )
        sections.append("## 6. Peers, L = 1 (kin8nm BNN)\n\n" + table_peers(small, budget))
    sections.append(
        "## 7. Compile time and break-even\n\n"
        "Seconds `jit_compile=True` spends tracing and compiling, once per run: the first "
        "repeat's with inductor's on-disk cache empty for this graph (a user's first run), then "
        "the median of the other repeats, which hit that cache (a later run of the same model and "
        "shapes). The floor's first call (its torch.compile) for comparison, and the number of "
        "steps after which compiling beats the eager kernel (compile seconds ÷ eager-minus-compiled "
        "seconds per step).\n\n"
        + markdown(
            [
                "model",
                "sampler",
                "L",
                "compile s, cold",
                "compile s, cached",
                "floor first call s",
                "eager µs/step",
                "compiled µs/step",
                "break-even steps, cold",
                "break-even, cached",
            ],
            compile_rows,
        )
    )
    sections.append("## 8. The input contract's cost\n\n" + table_contract(small, budget))
    preamble = (
        f"# SG-MCMC per-step speed ({'quick' if args.quick else 'full'} run)\n\n"
        f"{small.name} (N = {small.data[0].shape[0]}, batch {BATCH}), device {device}, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), pyro {pyro.__version__}; "
        f"{budget.repeats} repeats of {budget.steps} steps after {budget.warmup} warm-up steps. "
        f"Per-step times in µs as median / mean / p90 / max over all timed steps; ratios are medians "
        f"of per-repeat ratios of mean step times. Total {time.perf_counter() - started:.0f} s."
    )
    write_report(preamble, sections, output)


if __name__ == "__main__":
    main()
