"""
What the compiled SG-MCMC step (``jit_compile=True`` on ``SGLD``, ``SGHMC``, ``AdamSGLD``)
buys end to end, in real workloads, against the eager kernels (``jit_compile=False``) timed
in the same run: every eager and compiled figure below is measured by this script, in one
process, one after the other, from the same seed.

1. **ARA training per epoch** -- the MNIST defence of ``ara_scalable.py`` (figure 3.8):
   ``ARATrainer`` with a 784-200-200-10 ``BayesianMLP``, SGHMC (friction 0.5, step
   ``0.01 / N``), K = 5 particles, batches of 32, 1:1 clean rows and rows attacked by its
   ``LangevinAttacker`` (which runs eagerly in both). ``--train-size`` training images
   (10,000), ``--epochs`` epochs (3), eager vs ``jit_compile=True``: every epoch's seconds
   (the compiled first epoch includes the compilation, reported apart: the full batches and
   the last, smaller one are compiled once each), the mean of the epochs after the first
   and the ratio of those means; clean accuracy of both on the first test images.
2. **UCI BNN** -- ``uci.py``'s protocol (its ``_run_chain`` and ``_evaluate``, imported):
   one data set and split (``--dataset boston``, ``--split 0``), BNN in-50-1 with a learned
   noise precision, SGLD, 20 particles, batches of 100, ``--iterations`` 2000 of which
   half burn-in, a draw every 10; the step is fixed at ``--step`` / N (default 1e-2 / N, the
   step ``uci.py``'s validation chose for boston and SGLD in ``results/uci_thesis_protocol.md``; a setting,
   not a timing). Wall time of ``MCMC.run`` eager vs compiled, the compile seconds, and the
   test RMSE / log-likelihood of both (same model, same seed: they should agree closely).
3. **BSTS fit** -- ``RetailBSTS(variant="RF", noise="gaussian", **THESIS_MODEL).fit(method="sgld")`` on
   ``simulate_retail(num_weeks=104, seed=0)`` (the thesis' two training years), package
   sizes (200 draws after 200 warm-up steps, 8 particles, 150 MAP-init steps) with
   ``rhat_target=None`` so both fits draw the same number of samples; eager vs
   ``jit_compile=True`` (passed through ``fit``'s kernel options), for the default
   (preconditioned) kernel and for ``kernel="sgld"``. ``fit_seconds`` (MAP init included),
   the compile seconds, and the posterior mean of the channel coefficients q of both.
   A fit whose step cannot be compiled is reported with the reason the library gave
   (where tracing stopped), and its compiled columns stay empty.
4. **Where a compiled step's time goes** -- the BNN 8-50-1 of ``sgmcmc_speed.py`` (its
   ``kin8nm`` problem and ``KERNELS``), L = 1, SGLD compiled: the mean microseconds of
   ``kernel.sample`` under ``torch.profiler``, split into the minibatch draw
   (``aten::randperm``), the noise draw (``aten::randn_like`` / ``aten::normal_``), the
   compiled graph call (the ``CompiledFxGraph`` row) and the rest (Python bookkeeping:
   the total minus those three). Each event counts once (a nested one goes to its outermost
   counted ancestor). The same number of unprofiled steps of the compiled and the eager
   kernel give the per-step median / mean / p90 / max.

Compile seconds come from the kernels' ``compile_seconds`` property (trace + inductor). The
run starts with a fresh, empty inductor cache (removed at exit), so they are cold
compilations, as on a user's first run; set ``TORCHINDUCTOR_CACHE_DIR`` to reuse a cache.
CPU, ``--threads`` intra-op threads (default 1).

Run from the repository root::

    python benchmarks/compiled_end_to_end.py           # full run (about 2 minutes)
    python benchmarks/compiled_end_to_end.py --quick   # smoke test: tiny sizes, < 60 s

Data are read from ``$PYRO_EXT_DATA`` (default: ``../shared/data`` next to the repository).
The tables are printed and written to ``benchmarks/results/compiled_end_to_end.md``
(``--output PATH`` writes elsewhere).
"""

import math
import os
import platform
import re
import statistics
import time
import traceback
from pathlib import Path

from _common import REPO, fresh_inductor_cache  # noqa: E402  (sets $PYRO_EXT_DATA's default)

# A fresh inductor cache (before torch or sgmcmc_speed is imported), so that every compile
# time below is a cold one. Removed at exit.
fresh_inductor_cache("compiled_e2e_inductor_")

import pyro  # noqa: E402
import torch  # noqa: E402
import uci  # noqa: E402
from _common import (  # noqa: E402
    accuracy,
    argument_parser,
    command_line_args,
    markdown,
    write_report,
)
from _common import spread as timing_spread  # noqa: E402
from ara_scalable import ara_defense  # noqa: E402
from sgmcmc_speed import KERNELS, fmt_us, kin8nm, spread  # noqa: E402

from pyro_ext.datasets import load_mnist, load_uci, standardize_split  # noqa: E402
from pyro_ext.infer import SGLD, ModelNotTraceableError, SamplerDivergenceError  # noqa: E402
from pyro_ext.models.bsts import THESIS_MODEL, RetailBSTS, simulate_retail  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "compiled_end_to_end.md"
MODES = {False: "eager", True: "compiled"}
FULL = dict(
    train_size=10_000,
    test_size=1000,
    epochs=3,
    iterations=2000,
    burnin=1000,
    bsts_weeks=104,
    bsts=dict(num_samples=200, warmup_steps=200, num_particles=8, map_init_steps=150),
    profile_warmup=20,
    profile_steps=300,
)
QUICK = dict(
    train_size=256,  # 8 full batches: one compilation (per-particle attacks cost K times)
    test_size=200,
    epochs=2,
    iterations=200,
    burnin=100,
    bsts_weeks=60,
    bsts=dict(num_samples=20, warmup_steps=30, num_particles=4, map_init_steps=30),
    profile_warmup=3,
    profile_steps=20,
)
BSTS_KERNELS = (None, "sgld")  # None: fit's default kernel (preconditioned SGHMC)


def seconds_spread(values):
    """median / mean / p90 / max of ``values`` (seconds), as sgmcmc_speed's ``spread``."""
    return timing_spread(values, fmt="{:.2f}")


def ratio(compiled, eager):
    return f"{compiled / eager:.2f}" if eager > 0 else "-"


# -- 1. ARA training ------------------------------------------------------------------------
def ara_run(x, y, x_test, y_test, epochs, jit):
    """The ARA defence of ara_scalable.py; seconds and compile seconds of every epoch."""
    trainer = ara_defense(x.shape[0], jit)
    compile_seconds = []
    for epoch in range(epochs):
        before = 0.0 if trainer.kernel is None else trainer.kernel.compile_seconds
        trainer.fit(x, y, epochs=1)  # one epoch at a time: fit continues from the particles
        compile_seconds.append(trainer.kernel.compile_seconds - before)
        print(
            f"  ARA {MODES[jit]} epoch {epoch + 1}: {trainer.epoch_times[-1]:.2f} s "
            f"(compile {compile_seconds[-1]:.2f} s)",
            flush=True,
        )
    return trainer.epoch_times, compile_seconds, accuracy(trainer.predict_logits, x_test, y_test)


def ara_section(cfg):
    x, y = load_mnist("train", flatten=True)
    x_test, y_test = load_mnist("test", flatten=True)
    x, y = x[: cfg["train_size"]], y[: cfg["train_size"]]
    x_test, y_test = x_test[: cfg["test_size"]], y_test[: cfg["test_size"]]
    runs = {jit: ara_run(x, y, x_test, y_test, cfg["epochs"], jit) for jit in (False, True)}
    (eager, _, eager_acc), (fast, compiled, fast_acc) = runs[False], runs[True]
    rows = [
        [
            f"epoch {i + 1}" + (" (compiled: includes compilation)" if i == 0 else ""),
            f"{e:.2f}",
            f"{c:.2f}",
            f"{s:.2f}",
            ratio(c, e),
        ]
        for i, (e, c, s) in enumerate(zip(eager, fast, compiled))
    ]
    if len(eager) > 1:
        later = f"epochs 2-{len(eager)}" if len(eager) > 2 else "epoch 2"
        rows.append(
            [
                f"mean of {later}",
                f"{statistics.fmean(eager[1:]):.2f}",
                f"{statistics.fmean(fast[1:]):.2f}",
                f"{sum(compiled[1:]):.2f}",
                ratio(statistics.fmean(fast[1:]), statistics.fmean(eager[1:])),
            ]
        )
        rows.append(
            [
                f"{later}: median / mean / p90 / max",
                seconds_spread(eager[1:]),
                seconds_spread(fast[1:]),
                "-",
                "-",
            ]
        )
    else:
        rows.append(["mean of the epochs after the first", "- (one epoch)", "-", "-", "-"])
    rows.append(
        [
            "total",
            f"{sum(eager):.2f}",
            f"{sum(fast):.2f}",
            f"{sum(compiled):.2f}",
            ratio(sum(fast), sum(eager)),
        ]
    )
    header = ["", "eager s", "compiled s", "of which compile s", "compiled ÷ eager"]
    acc = markdown(
        ["clean test accuracy", "eager", "compiled"],
        [[f"first {cfg['test_size']} test images", f"{eager_acc:.3f}", f"{fast_acc:.3f}"]],
    )
    batches = math.ceil(cfg["train_size"] / 32)
    return (
        f"## 1. ARA training per epoch (MNIST, {cfg['train_size']} images, {cfg['epochs']} "
        f"epochs)\n\n784-200-200-10 BayesianMLP, SGHMC (friction 0.5, step 0.01 / N), K = 5 "
        f"particles, batches of 32 ({batches} steps per epoch), 1:1 clean / Langevin-attacked rows "
        "(the attack runs eagerly in both). Seconds per epoch (`ARATrainer.epoch_times`); the "
        "compiled first epoch includes the compilation of its step (once per batch shape), whose "
        "seconds (`kernel.compile_seconds`) are listed apart. The ratio that answers what "
        "compilation buys is the one of the means after the first epoch.\n\n"
        + markdown(header, rows)
        + "\n\n"
        + acc
    )


# -- 2. UCI BNN -----------------------------------------------------------------------------
def _recording(cls, kernels):
    """A kernel factory for uci.SAMPLERS that keeps each kernel (for its compile seconds)."""

    def make(*args, **kwargs):
        kernels.append(cls(*args, **kwargs))
        return kernels[-1]

    return make


def uci_run(name, split, step, cfg, jit):
    """One chain of uci.py's protocol on the whole training part, scored on the test part."""
    data, _, y_std = standardize_split(load_uci(name, split))
    y_std = float(y_std)
    kernels = []
    key = f"sgld, {MODES[jit]}"  # the "sgld" entry of uci.py, with its kernels recorded
    uci.SAMPLERS[key] = ("SGLD", _recording(SGLD, kernels)) + uci.SAMPLERS["sgld"][2:]
    n = data.x_train.shape[0]
    net, samples, seconds, _ = uci._run_chain(
        key,
        data.x_train,
        data.y_train,
        step / (n if uci._per_row(key) else 1),
        dict(cfg, jit=jit),
        seed=10_000 + split,  # as uci.run_task
    )
    ll, err = uci._evaluate(net, samples, data.x_test, data.y_test)
    result = dict(
        seconds=seconds,
        compile=kernels[-1].compile_seconds,
        ll=ll - math.log(y_std),
        rmse=err * y_std,
        n=n,
    )
    print(
        f"  UCI {name} split {split} {MODES[jit]}: {seconds:.2f} s (compile "
        f"{result['compile']:.2f} s), test LL {result['ll']:.3f}, RMSE {result['rmse']:.3f}",
        flush=True,
    )
    return result


def uci_section(args, cfg):
    name = uci._dataset_name(args.dataset)
    chain = dict(
        hidden=50,
        particles=20,
        batch=100,
        iterations=cfg["iterations"],
        burnin=cfg["burnin"],
        thinning=10,
    )
    eager, fast = (uci_run(name, args.split, args.step, chain, jit) for jit in (False, True))
    net_seconds = fast["seconds"] - fast["compile"]
    rows = [
        [
            "MCMC.run wall time s",
            f"{eager['seconds']:.2f}",
            f"{fast['seconds']:.2f}",
            ratio(fast["seconds"], eager["seconds"]),
        ],
        ["of which compile s", f"{eager['compile']:.2f}", f"{fast['compile']:.2f}", "-"],
        [
            "wall time without compile s",
            f"{eager['seconds'] - eager['compile']:.2f}",
            f"{net_seconds:.2f}",
            ratio(net_seconds, eager["seconds"] - eager["compile"]),
        ],
        [
            "µs per iteration without compile",
            fmt_us((eager["seconds"] - eager["compile"]) / chain["iterations"]),
            fmt_us(net_seconds / chain["iterations"]),
            ratio(net_seconds, eager["seconds"] - eager["compile"]),
        ],
    ]
    metrics = [
        [
            "test LL",
            f"{eager['ll']:.3f}",
            f"{fast['ll']:.3f}",
            f"{fast['ll'] - eager['ll']:+.3f}",
        ],
        [
            "test RMSE",
            f"{eager['rmse']:.3f}",
            f"{fast['rmse']:.3f}",
            f"{fast['rmse'] - eager['rmse']:+.3f}",
        ],
    ]
    draws = (chain["iterations"] - chain["burnin"]) // chain["thinning"] * chain["particles"]
    return (
        f"## 2. UCI BNN ({name}, split {args.split}, SGLD)\n\n"
        f"`uci.py`'s protocol on one split ({eager['n']} training rows): BNN in-50-1 ReLU, learned noise "
        f"precision, {chain['particles']} particles, batches of {chain['batch']}, "
        f"{chain['iterations']} iterations ({chain['burnin']} burn-in, a draw every "
        f"{chain['thinning']}: {draws} draws), step {args.step:g} / N (N = {eager['n']}), seed "
        f"{10_000 + args.split}. Wall time of `MCMC.run` (uci.py's chain seconds); metrics on the "
        "test part in original units.\n\n"
        + markdown(["", "eager", "compiled", "compiled ÷ eager"], rows)
        + "\n\n"
        + markdown(["posterior predictive", "eager", "compiled", "compiled − eager"], metrics)
    )


# -- 3. BSTS fit ----------------------------------------------------------------------------
def _why_not_compiled(error):
    """The library's reason, and for a failed trace the model line where tracing stopped."""
    # Its first sentence (a full stop followed by a capital: "e.g. int(...)" stays whole).
    message = re.split(r"(?<=[a-z)])\. (?=[A-Z])", str(error))[0]
    cause = error.__cause__
    if isinstance(error, ModelNotTraceableError) and cause is not None:
        frames = [
            f
            for f in traceback.extract_tb(cause.__traceback__)
            if "pyro_ext" in f.filename and f"pyro_ext{os.sep}infer" not in f.filename
        ]
        if frames:
            where = frames[-1]
            path = Path(where.filename).resolve()
            path = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
            message += f" (tracing stopped at {path}:{where.lineno}, `{where.line}`)"
    return f"{type(error).__name__}: {message}"


def bsts_fit(data, kernel, jit, sizes):
    model = RetailBSTS(**THESIS_MODEL, variant="RF", noise="gaussian")
    options = dict(sizes, rhat_target=None, jit_compile=jit)
    if kernel is not None:
        options["kernel"] = kernel
    try:
        model.fit(
            data.sales,
            data.spend,
            data.covariates,
            method="sgld",
            seed=0,
            channel_names=data.channel_names,
            covariate_names=data.covariate_names,
            **options,
        )
    except (ValueError, ModelNotTraceableError, SamplerDivergenceError) as error:
        if not jit and not isinstance(error, SamplerDivergenceError):
            raise
        reason = _why_not_compiled(error)
        print(f"  BSTS {kernel or 'default'} {MODES[jit]}: not run ({reason})", flush=True)
        return dict(failed=reason)
    q = model.coefficients()["q"]
    result = dict(
        seconds=model.fit_seconds,
        compile=model._mcmc.kernel.compile_seconds,
        q_mean=q["mean"],
        q_sd=q["sd"],
        retries=model.divergence_retries,
    )
    print(
        f"  BSTS {kernel or 'default'} {MODES[jit]}: {result['seconds']:.2f} s "
        f"(compile {result['compile']:.2f} s), mean q {result['q_mean'].tolist()}",
        flush=True,
    )
    return result


def _vector(values):
    return "(" + ", ".join(f"{v:.4f}" for v in values.tolist()) + ")"


def bsts_section(cfg):
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # as benchmarks/bsts.py
    try:
        data = simulate_retail(num_weeks=cfg["bsts_weeks"], seed=0, dtype=torch.float64)
        fits = {
            (kernel, jit): bsts_fit(data, kernel, jit, cfg["bsts"])
            for kernel in BSTS_KERNELS
            for jit in (False, True)
        }
    finally:
        torch.set_default_dtype(dtype)
    rows, reasons = [], []
    for kernel in BSTS_KERNELS:
        eager, fast = fits[kernel, False], fits[kernel, True]
        label = f"`{kernel}`" if kernel else "default (`preconditioned`)"
        row = [label, f"{eager['seconds']:.2f}" if "seconds" in eager else eager["failed"]]
        if "failed" in fast or "failed" in eager:
            if "failed" in fast:
                reasons.append(f"- {label}, `jit_compile=True`: {fast['failed']}")
            row += ["not compiled (see below)"] + ["-"] * 3
        else:
            gap = ((fast["q_mean"] - eager["q_mean"]).abs() / eager["q_sd"]).max()
            row += [
                f"{fast['seconds']:.2f}",
                ratio(fast["seconds"], eager["seconds"]),
                f"{fast['compile']:.2f}",
                f"{float(gap):.2f}",
            ]
        row += [
            _vector(eager["q_mean"]) if "q_mean" in eager else "-",
            _vector(fast["q_mean"]) if "q_mean" in fast else "-",
        ]
        rows.append(row)
    header = [
        "kernel",
        "eager fit s",
        "compiled fit s",
        "compiled ÷ eager",
        "compile s",
        "max |Δ mean q| / posterior sd",
        "eager mean q",
        "compiled mean q",
    ]
    sizes = cfg["bsts"]
    text = (
        f"## 3. BSTS fit (RetailBSTS RF, simulate_retail({cfg['bsts_weeks']} weeks, seed 0))\n\n"
        f'`fit(method="sgld", num_samples={sizes["num_samples"]}, warmup_steps='
        f"{sizes['warmup_steps']}, num_particles={sizes['num_particles']}, map_init_steps="
        f"{sizes['map_init_steps']}, rhat_target=None, jit_compile=...)`, Gaussian noise, seed 0. "
        "`fit_seconds` includes the MAP-init SVI fit, which runs eagerly in both. Mean q: posterior "
        "means of the channel coefficients in original units (tv, ooh, online, search, radio; "
        "true (0.02, 0.03, 0.05, 0.04, 0)); the gap is the largest difference of the two means in "
        "units of the eager posterior sd.\n\n" + markdown(header, rows)
    )
    if reasons:
        text += (
            "\n\nWhy a compiled fit is missing (the error the library raised, caught by this "
            "script; the eager fit of the same kernel is measured):\n\n" + "\n".join(reasons)
        )
    return text, reasons


# -- 4. Where a compiled step's time goes ----------------------------------------------------
PARTS = (
    ("minibatch draw (`aten::randperm`)", lambda name: name == "aten::randperm"),
    (
        "noise draw (`aten::randn_like` / `aten::normal_`)",
        lambda name: name in ("aten::randn_like", "aten::normal_"),
    ),
    ("compiled graph call (`CompiledFxGraph`)", lambda name: "CompiledFxGraph" in name),
)
SAMPLE_LABEL = "kernel.sample"


def _part(name):
    for i, (_, matches) in enumerate(PARTS):
        if matches(name):
            return i
    return None


def profile_breakdown(events, steps):
    """Mean µs per step of each part inside ``kernel.sample``; an event counts once, in
    its outermost counted ancestor (e.g. randn_like's normal_ goes to randn_like)."""
    totals = [0.0] * len(PARTS)
    sample = 0.0
    for event in events:
        if event.name == SAMPLE_LABEL:
            sample += event.cpu_time_total
            continue
        part = _part(event.name)
        if part is None:
            continue
        parent, inside = event.cpu_parent, False
        while parent is not None:
            if _part(parent.name) is not None:
                break
            inside = inside or parent.name == SAMPLE_LABEL
            parent = parent.cpu_parent
        else:
            if inside:
                totals[part] += event.cpu_time_total
    return [t / steps for t in totals], sample / steps


def time_steps(kernel, params, steps):
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        params = kernel.sample(params)
        times.append(time.perf_counter() - start)
    return times, params


def profile_section(cfg):
    problem = kin8nm(torch.device("cpu"))
    warmup, steps = cfg["profile_warmup"], cfg["profile_steps"]
    times, kernels, states = {}, {}, {}
    for jit in (False, True):
        pyro.set_rng_seed(0)
        kernel = KERNELS["SGLD"](problem.model, jit_compile=jit)
        kernel.setup(0, *problem.data)
        params = kernel.initial_params
        for _ in range(warmup):  # the compiled kernel compiles in the first step
            params = kernel.sample(params)
        times[jit], states[jit] = time_steps(kernel, params, steps)
        kernels[jit] = kernel
    kernel, params = kernels[True], states[True]
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            with torch.profiler.record_function(SAMPLE_LABEL):
                params = kernel.sample(params)
    parts, total = profile_breakdown(prof.events(), steps)
    rows = [
        [label, f"{us:,.1f}", f"{100 * us / total:.0f} %"] for (label, _), us in zip(PARTS, parts)
    ]
    rest = total - sum(parts)
    rows.append(
        [
            "rest: Python bookkeeping (total − the above)",
            f"{rest:,.1f}",
            f"{100 * rest / total:.0f} %",
        ]
    )
    rows.append([f"total (`{SAMPLE_LABEL}`, profiled)", f"{total:,.1f}", "100 %"])
    unprofiled = [
        [
            "SGLD",
            MODES[jit],
            spread(times[jit]),
            f"{kernels[jit].compile_seconds:.2f}",
            ratio(statistics.fmean(times[jit]), statistics.fmean(times[False])),
        ]
        for jit in (False, True)
    ]
    return (
        f"## 4. Where a compiled step's time goes ({problem.name}, L = 1, SGLD)\n\n"
        f"`sgmcmc_speed.py`'s BNN (N = {problem.data[0].shape[0]}, batch {problem.batch}), "
        f"`kernel.sample` called directly, {warmup} warm-up steps (the compilation) then {steps} "
        f"profiled steps (`torch.profiler`, CPU). Mean µs per step; an event counts once, in its "
        "outermost counted ancestor. The rest is the kernel's Python (step-size schedule, state "
        "bookkeeping, the finiteness flag read, the particles' dict) and inductor's runtime "
        "wrapper around the graph call; the profiler's own overhead inflates every row.\n\n"
        + markdown(["part of `kernel.sample`", "µs / step (mean)", "share"], rows)
        + f"\n\nThe same kernels unprofiled, {steps} steps each after the warm-up:\n\n"
        + markdown(
            [
                "sampler",
                "kernel",
                "µs/step: median / mean / p90 / max",
                "compile s",
                "÷ eager (means)",
            ],
            unprofiled,
        )
    )


def main():
    parser = argument_parser(__doc__, RESULTS, quick="tiny sizes: a smoke test, < 60 s", threads=1)
    parser.add_argument("--train-size", type=int, help="MNIST images for ARA (10000; quick 512)")
    parser.add_argument("--epochs", type=int, help="ARA epochs (3; quick 2)")
    parser.add_argument("--dataset", default="boston", help="UCI data set (name or uci.py alias)")
    parser.add_argument("--split", type=int, default=0, help="UCI split")
    parser.add_argument("--iterations", type=int, help="UCI iterations (2000; quick 200)")
    parser.add_argument(
        "--step", type=float, default=1e-2, help="UCI SGLD step, divided by the training rows"
    )
    parser.add_argument("--steps", type=int, help="profiled steps of section 4 (300; quick 20)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = dict(QUICK if args.quick else FULL)
    for key, value in (
        ("train_size", args.train_size),
        ("epochs", args.epochs),
        ("iterations", args.iterations),
        ("profile_steps", args.steps),
    ):
        if value is not None:
            cfg[key] = value
    if args.iterations is not None:
        cfg["burnin"] = args.iterations // 2
    started = time.perf_counter()
    sections = [ara_section(cfg), uci_section(args, cfg)]
    bsts, missing = bsts_section(cfg)
    sections += [bsts, profile_section(cfg)]
    total = time.perf_counter() - started
    not_compiled = (
        f" Missing rows: {len(missing)} BSTS fit(s) could not be compiled; section 3 gives the "
        "library's reason and the eager fit."
        if missing
        else ""
    )
    sizes = (
        f"ARA {cfg['train_size']} MNIST images x {cfg['epochs']} epochs; UCI {cfg['iterations']} "
        f"iterations; BSTS {cfg['bsts_weeks']} weeks, {cfg['bsts']['num_samples']} draws after "
        f"{cfg['bsts']['warmup_steps']} warm-up steps, {cfg['bsts']['num_particles']} particles; "
        f"{cfg['profile_steps']} profiled steps"
    )
    preamble = (
        f"# Compiled SG-MCMC end to end ({'quick run: sizes too small to mean anything' if args.quick else 'full run'})\n\n"
        f"`python benchmarks/compiled_end_to_end.py {command_line_args()}`. Device: CPU "
        f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores), torch "
        f"{torch.__version__} with {torch.get_num_threads()} intra-op thread(s), pyro "
        f"{pyro.__version__}. Eager (`jit_compile=False`) and compiled (`jit_compile=True`) are "
        "both measured in this run, one after the other, from the same seeds. Compile seconds "
        "(the kernels' `compile_seconds`) are cold compilations: the run starts with an empty "
        f"inductor cache. Sizes: {sizes}. Total {total:.0f} s.{not_compiled}"
    )
    write_report(preamble, sections, args.output)


if __name__ == "__main__":
    main()
