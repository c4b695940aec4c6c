"""
One prepared run that settles what works on a CUDA device, and how fast, in at most eight
minutes on one H100 (``--budget-seconds 480``): the ``device``-fixture tests and the CUDA rows
of the benchmarks that have them, written to ``benchmarks/results/cuda.md`` with the device
name. It stops at the FIRST broken capability with a non-zero exit and a message naming the
stage and the error, instead of running on to the end of the budget; whatever it measured
until then is in the report.

Stages, in order, each with its share of ``--budget-seconds`` (a stage that outruns its share
is stopped and counts as broken: on a GPU a hang is the usual symptom of a broken capability):

0. **environment**: torch, CUDA, cuDNN, NCCL, pyro-ppl, funsor and pyro_ext versions, the
   device's name and memory, and one matrix product on it.
1. **tests**: ``pytest -x -m "not slow and not integration" -k <device>`` in a subprocess:
   ``tests/conftest.py`` parametrises the ``device`` fixture with "cpu" and, when present,
   "cuda", so ``-k cuda`` selects the CUDA parametrisations. The CPU smoke mode runs a few
   cheap files' ``-k cpu`` cases only.
2. **SG-MCMC step** (``sgmcmc_speed.py``'s functions on the device, kin8nm BNN, L = 1 and
   10): ``MCMC(SGLD)`` eager, and compiled with ``compile_mode="reduce-overhead"`` (one CUDA
   graph per step), against the hand-written loop and the ``torch.compile``d floor; cold and
   cached compile seconds; BlackJAX's row (skipped when not installed, or on CUDA, where
   ``sgmcmc_speed.py`` times it on CPU only).
3. **VIS cost** (``vis_cost.py``'s VAE and settings, on the device): SVI step time of VIS
   T = 5 over T = 0 (the thesis' 1.71 per epoch, the issue's target <= 1.7).
4. **IVON step** (``ngvi.py``'s MNIST protocol, on the device): a ``NaturalGradientVI``
   (IVON) step of the 784-400-400-10 BNN against an Adam step of the same network in plain
   torch (``ngvi.py``'s target: <= 1.3x Adam's).
5. **HMM / Kalman scans** (``timeseries_speed.py``'s tables on the device): HMM
   log-likelihood, gradient and Viterbi at T = 1e5, Kalman at T = 1e4, the funsor
   enumeration check, against Pyro's ``DiscreteHMM``, hmmlearn and statsmodels (peers that
   are not installed get a row saying so).
6. **distributed step** (``distributed.py``'s BNN and kernel): SGLD and SGLD+R with
   ``shard="particles"`` in a process group of this one process (NCCL on CUDA, gloo on CPU)
   against the same kernel unsharded. ``distributed.py`` launches CPU gloo ranks only; a
   machine with several GPUs still gets the one-rank group here (the report says so).

Timings synchronise the device at every clock reading. The benchmark scripts themselves
are not changed: ``sgmcmc_speed.py`` and ``timeseries_speed.py`` take ``--device`` and their
functions take the device (called here with small sizes); ``vis_cost.py``, ``ngvi.py``,
``compiled_end_to_end.py`` and ``distributed.py`` have no ``--device`` and build their
models on the CPU, so their GPU rows are built here from their models and settings.
``compiled_end_to_end.py`` (ARA, UCI and BSTS chains, all on the CPU) has no CUDA row: the
compiled step it measures end to end is stage 2's.

On the CPU (``--device cpu``, what the test suite runs with ``--quick``) every stage runs
its smallest size and the compiled rows run the traced graph (``jit_compile="trace"``)
instead of ``torch.compile``: a cold inductor compile takes over a minute on 2 CPU cores,
and the smoke mode is there to keep the code paths running, not to time them.

The script installs nothing and uses no network: on a machine without pyro-ppl and
funsor, install their wheels first (README, "Running on CUDA"). Data are read from
``$PYRO_EXT_DATA`` (kin8nm and MNIST).

Run from the repository root::

    python benchmarks/gpu_check.py                 # CUDA when present: benchmarks/results/cuda.md
    python benchmarks/gpu_check.py --device cpu --quick   # the smoke mode (< 90 s on 2 cores)
"""

import argparse
import faulthandler
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
# The benchmark modules (and _common) import as top-level modules, as when each script runs;
# the repository root makes pyro_ext importable without an install.
for _path in (str(HERE.parent), str(HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import torch  # noqa: E402
from _common import REPO, fresh_inductor_cache, markdown  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
DEFAULT_OUTPUT = {"cuda": RESULTS / "cuda.md", "cpu": RESULTS / "gpu_check_smoke.md"}
HEADER = ["what ran", "time", "key ratios", "result"]
#: seconds a stage may overrun its share before the process is ended with a traceback (a
#: hang inside a CUDA or NCCL call, which the stage's own alarm cannot interrupt)
HARD_KILL_GRACE = 60
#: the CPU smoke mode's test subset: cheap files with ``device`` parametrisations
SMOKE_TESTS = ["tests/ops/test_scan.py", "tests/timeseries/test_kalman.py"]


# -- the stage runner ------------------------------------------------------------------------
class StageTimeout(BaseException):
    """A stage outran its share of the budget (a BaseException, as KeyboardInterrupt is, so
    that no ``except Exception`` on the way swallows it)."""


class StageIncomplete(Exception):
    """A stage ran out of budget before it finished, with nothing failed until then (the
    test suite): the run goes on, and ends with exit status 2."""


class StageFailed(Exception):
    """A stage's own verdict that a capability is broken (its message says which)."""


class Stage(NamedTuple):
    name: str
    title: str
    share: float  # of --budget-seconds
    run: Callable  # run(ctx, record): appends rows to record.rows as it goes


class Record:
    """What one stage measured; rows are appended as they are measured, so that a stage
    stopped half-way still reports what it did."""

    def __init__(self, stage, budget):
        self.stage, self.budget = stage, budget
        self.rows, self.notes = [], []
        self.status, self.seconds, self.error = "not run", None, None
        self.started = None
        self.flush = lambda: None  # rewrites the report (set by run_stages)

    def row(self, what, seconds_text, ratios, result="pass"):
        self.rows.append([what, seconds_text, ratios, result])
        self.flush()  # a process killed later in the stage still leaves this row

    def elapsed(self):
        return time.perf_counter() - self.started

    def section(self, index):
        spent = "" if self.seconds is None else f", {self.seconds:.1f} s"
        head = f"## {index}. {self.stage.title}: {self.status}{spent} (budget {self.budget:.0f} s)"
        parts = [head]
        if self.rows:
            parts.append(markdown(HEADER, self.rows))
        if self.status == "running":
            parts.append("Running when this file was written: if the run ended here, it died here.")
        parts += self.notes
        if self.error:
            text = self.error.strip()
            if len(text) > 4000:  # the message (first) and the innermost frames (last)
                text = text[:1500] + "\n[...]\n" + text[-2500:]
            parts.append("Error:\n\n```\n" + text + "\n```")
        return "\n\n".join(parts)


class Context(NamedTuple):
    device: torch.device
    small: bool  # --quick or CPU: smallest sizes
    cpu: bool  # no torch.compile (traced graphs stand in)
    # --keep-going: every stage runs after a failure, and the tests run to the end (no -x)
    keep_going: bool = False


def _raise_timeout(signum, frame):
    raise StageTimeout()


def write_markdown(output, preamble, records):
    summary = markdown(
        ["stage", "result", "seconds", "budget s"],
        [
            [
                r.stage.name,
                r.status,
                "-" if r.seconds is None else f"{r.seconds:.1f}",
                f"{r.budget:.0f}",
            ]
            for r in records
        ],
    )
    sections = [r.section(i) for i, r in enumerate(records)]
    text = "\n\n".join([preamble, summary] + sections) + "\n"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    return text


def run_stages(stages, ctx, budget_seconds, output, preamble, hard_kill=False):
    """
    Run ``stages`` in order, each under its share of ``budget_seconds``, rewriting
    ``output`` before and after each one. Returns 0 when every stage passed; at the first
    stage that raises (or outruns its share) it prints which stage and why and returns 1,
    the later stages left "not run" (with ``ctx.keep_going`` the later stages run, and 1 is
    returned at the end); 2 when a stage raised :class:`StageIncomplete` (out of budget,
    nothing failed) and no stage failed.
    """
    records = [Record(stage, stage.share * budget_seconds) for stage in stages]

    def flush():
        write_markdown(output, preamble(), records)

    for record in records:
        record.flush = flush
    for index, record in enumerate(records):
        record.status, record.started = "running", time.perf_counter()
        flush()
        print(
            f"gpu_check: stage {index} ({record.stage.name}), budget {record.budget:.0f} s",
            flush=True,
        )
        previous = signal.signal(signal.SIGALRM, _raise_timeout)
        signal.setitimer(signal.ITIMER_REAL, max(record.budget, 1e-3))
        if hard_kill:
            faulthandler.dump_traceback_later(record.budget + HARD_KILL_GRACE, exit=True)
        try:
            record.stage.run(ctx, record)
            record.status = "PASS"
            if record.elapsed() > record.budget:  # an alarm lost inside a C call
                raise StageTimeout()
        except StageIncomplete as error:
            record.status = "INCOMPLETE"
            record.error = str(error)
        except StageTimeout:
            record.status = "FAIL"
            record.error = f"stopped: outran its budget of {record.budget:.0f} s"
        except Exception as error:  # every failure is reported, with the stage's name
            record.status = "FAIL"
            record.error = f"{type(error).__name__}: {error}\n\n{traceback.format_exc()}"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if hard_kill:
                faulthandler.cancel_dump_traceback_later()
            record.seconds = record.elapsed()
        flush()
        if record.status == "FAIL":
            first_line = record.error.strip().splitlines()[0]
            print(
                f"gpu_check: FAILED at stage {index} ({record.stage.name}: {record.stage.title}): "
                f"{first_line}\nThe report so far is in {output}.",
                file=sys.stderr,
                flush=True,
            )
            if not ctx.keep_going:
                return 1
    failed = [r.stage.name for r in records if r.status == "FAIL"]
    if failed:
        print(f"gpu_check: FAILED stages: {', '.join(failed)}", file=sys.stderr, flush=True)
        return 1
    incomplete = [r.stage.name for r in records if r.status == "INCOMPLETE"]
    if incomplete:
        print(
            f"gpu_check: no capability failed, but {', '.join(incomplete)} did not finish within "
            f"its budget (rerun with a larger --budget-seconds). The report is in {output}.",
            file=sys.stderr,
            flush=True,
        )
        return 2
    return 0


# -- timing helpers --------------------------------------------------------------------------
def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_times(step, device, warmup, steps):
    """Seconds of each of ``steps`` calls of ``step()`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        step()
    sync(device)
    times = []
    for _ in range(steps):
        begin = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - begin)
    return times


def ms(seconds):
    return f"{1e3 * seconds:.2f} ms"


def spread_us(times):
    from _common import spread

    return spread(times, scale=1e6) + " µs"


def verdict(value, target):
    return f"{value:.2f} (<= {target}: {'yes' if value <= target else 'NO'})"


def versions():
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("pyro-ppl", "funsor", "pyro-ext"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


# -- 0. environment --------------------------------------------------------------------------
def stage_environment(ctx, record):
    started = time.perf_counter()
    for module in ("pyro", "funsor", "pyro_ext.infer"):
        try:
            __import__(module)
        except ImportError as error:
            raise StageFailed(
                f"{module} is not importable ({error}): install pyro-ppl and funsor first "
                "(README, 'Running on CUDA'); this script installs nothing"
            ) from error
    found = versions()
    record.row(
        "imports: torch, pyro, funsor, pyro_ext",
        f"{time.perf_counter() - started:.1f} s",
        f"torch {torch.__version__}, pyro-ppl {found['pyro-ppl']}, funsor {found['funsor']}",
    )
    device = ctx.device
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise StageFailed("--device cuda, but torch.cuda.is_available() is False")
        props = torch.cuda.get_device_properties(device)
        nccl = torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else "?"
        record.row(
            f"device: {torch.cuda.get_device_name(device)}",
            "-",
            f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, NCCL "
            f"{'.'.join(map(str, nccl)) if isinstance(nccl, tuple) else nccl}, "
            f"{props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs, "
            f"capability {props.major}.{props.minor}, {torch.cuda.device_count()} GPU(s)",
        )
    else:
        record.row(
            f"device: cpu ({os.cpu_count()} cores)", "-", f"{torch.get_num_threads()} threads"
        )
    size = 256 if ctx.small else 4096
    a = torch.randn(size, size, device=device)
    times = step_times(lambda: a @ a, device, warmup=1, steps=3)
    product = a @ a
    sync(device)
    if not torch.isfinite(product).all():
        raise StageFailed(f"a {size}x{size} float32 matrix product on {device} is not finite")
    tflops = 2 * size**3 / statistics.median(times) / 1e12
    record.row(
        f"{size}x{size} float32 matmul", ms(statistics.median(times)), f"{tflops:.1f} TFLOP/s"
    )


# -- 1. the device-fixture tests --------------------------------------------------------------
def pytest_summary(output):
    """The closing counts line of a ``pytest -q`` run ("12 passed, 1 skipped in 3.1s")."""
    for line in reversed(output.strip().splitlines()):
        text = line.strip("= ").strip()
        if " in " in text and any(w in text for w in ("passed", "failed", "error", "deselected")):
            return text
    return "no summary line"


def stage_tests(ctx, record):
    param = ctx.device.type
    # Short tracebacks and no warnings summary: a failure's traceback is what a short GPU
    # lease must bring back (the report keeps the failures section, not the output's end).
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short"]
    command.append("--disable-warnings")
    if not ctx.keep_going:
        command.append("-x")
    command += ["-m", "not slow and not integration", "-k", param]
    if ctx.small:
        command += ["--maxfail=1"] + SMOKE_TESTS
    else:
        for plugin, options in (
            # workers share the GPU (each test is small; collection and Python dominate):
            # half the CPU cores, 4 to 8 of them
            ("xdist", ["-n", str(min(8, max(4, (os.cpu_count() or 8) // 2)))]),
            # a test that hangs fails under its own name instead of using up the stage
            ("pytest_timeout", ["--timeout=90"]),
        ):
            try:
                __import__(plugin)
                command += options
            except ImportError:  # the plugin is optional: run without its options
                pass
        command.append("tests")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    timeout = max(record.budget - record.elapsed() - 5, 1)
    started = time.perf_counter()
    shown = " ".join(command[1:]).replace(sys.executable, "python")
    try:
        done = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout or ""
        out = out.decode() if isinstance(out, bytes) else out
        failed = [line for line in out.splitlines() if line.startswith(("FAILED", "ERROR"))]
        if failed:
            record.row(f"`{shown}`", f"{timeout:.0f} s", "timed out after a failure", "FAIL")
            raise StageFailed(
                f"pytest failed and did not finish within {timeout:.0f} s:\n{out[-2000:]}"
            ) from None
        record.row(
            f"`{shown}`", f"{timeout:.0f} s", "timed out, no failure until then", "INCOMPLETE"
        )
        raise StageIncomplete(
            f"pytest did not finish within {timeout:.0f} s, with no failure until then; its "
            f"last output:\n{out[-2000:]}"
        ) from None
    seconds = time.perf_counter() - started
    summary = pytest_summary(done.stdout)
    if done.returncode == 0:
        record.row(f"`{shown}`", f"{seconds:.1f} s", summary)
        return
    failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    record.row(f"`{shown}`", f"{seconds:.1f} s", summary, "FAIL")
    reason = "no test selected" if done.returncode == 5 else (failed[:1] or ["see output"])[0]
    # Every failing test by name first (with --keep-going there can be many), then the
    # end of the output.
    listed = "\n".join(failed[1:]) + "\n" if len(failed) > 1 else ""
    raise StageFailed(
        f"pytest exited {done.returncode}: {reason}\n{listed}{failures_section(done.stdout)}\n"
        f"{done.stderr[-1000:]}"
    )


def failures_section(output, limit=8000):
    """The tracebacks of a ``pytest`` run's failures (its ``FAILURES`` and ``ERRORS``
    sections, up to the short summary), at most ``limit`` characters; the output's end
    when it has none."""
    lines = output.splitlines()
    start = next(
        (i for i, line in enumerate(lines) if line.strip("= ") in ("FAILURES", "ERRORS")), None
    )
    if start is None:
        return output[-3000:]
    end = next(
        (i for i in range(start, len(lines)) if "short test summary info" in lines[i]),
        len(lines),
    )
    section = "\n".join(lines[start:end])
    return section if len(section) <= limit else section[:limit] + "\n[... cut]"


# -- 2. the SG-MCMC step ---------------------------------------------------------------------
def stage_sgmcmc(ctx, record):
    import sgmcmc_speed as speed

    device = ctx.device
    problem = speed.kin8nm(device)
    budget = speed.Budget(2, 10, 1) if ctx.small else speed.Budget(10, 100, 2)
    if ctx.cpu:
        compiled, label = dict(jit="trace"), "traced (CPU smoke: no torch.compile)"
    else:
        compiled = dict(jit="compile", compile_mode="reduce-overhead")
        label = 'compiled, compile_mode="reduce-overhead"'
    for num_particles in (1, 10):
        if num_particles > 1 and record.elapsed() > 0.45 * record.budget:
            record.row(f"SGLD L = {num_particles}", "-", "-", "skipped: the stage's budget")
            continue
        began = time.perf_counter()
        speed.check_same_density(problem, num_particles)
        record.row(
            f"Pyro model's log density and gradient = hand-written, L = {num_particles}",
            f"{time.perf_counter() - began:.1f} s",
            "-",
        )
        compile_seconds, floor = [], {}

        def ours_compiled(num_particles=num_particles, compile_seconds=compile_seconds):
            times, kernel = speed.time_ours(
                "SGLD", problem, budget, num_particles=num_particles, **compiled
            )
            compile_seconds.append(kernel.compile_seconds)
            return times

        def run_floor(num_particles=num_particles, floor=floor):
            times, floor["step"], first = speed.time_floor(
                "SGLD", problem, budget, num_particles, floor.get("step")
            )
            floor.setdefault("seconds", first)
            return times

        runs = {
            "eager": lambda n=num_particles: speed.time_ours(
                "SGLD", problem, budget, jit="eager", num_particles=n
            )[0],
            "ours": ours_compiled,
            "hand loop": lambda n=num_particles: speed.time_hand("SGLD", problem, budget, n),
        }
        if not ctx.cpu:
            runs["floor"] = run_floor
        timings = speed.compare(runs, budget)
        name = f"MCMC(SGLD) L = {num_particles}"
        record.row(
            f"{name}, eager",
            spread_us(timings["eager"].steps),
            f"÷ hand loop {verdict(speed.ratio(timings, 'eager', 'hand loop'), 1.5)}",
        )
        ratios = [f"÷ eager {speed.ratio(timings, 'ours', 'eager'):.2f}"]
        ratios.append(f"÷ hand loop {speed.ratio(timings, 'ours', 'hand loop'):.2f}")
        if "floor" in timings:
            ratios.insert(0, f"÷ floor {verdict(speed.ratio(timings, 'ours', 'floor'), 1.2)}")
            seconds = [s for s in compile_seconds if s is not None]
            if seconds:
                ratios.append(
                    f"compile {seconds[0]:.1f} s cold, {statistics.median(seconds[1:] or seconds):.1f} s "
                    f"cached; floor's {floor['seconds']:.1f} s"
                )
        record.row(f"{name}, {label}", spread_us(timings["ours"].steps), "; ".join(ratios))
        record.row(f"{name}, hand loop", spread_us(timings["hand loop"].steps), "baseline")
        if "floor" in timings:
            record.row(
                f"{name}, compiled floor (torch.func + torch.compile)",
                spread_us(timings["floor"].steps),
                "baseline",
            )
        else:
            record.row(f"{name}, compiled floor", "-", "-", "skipped: CPU smoke (no compile)")
    try:
        import blackjax  # noqa: F401
    except ImportError:
        record.row("BlackJAX SGLD", "-", "-", "skipped: blackjax is not installed")
    else:
        record.row(
            "BlackJAX SGLD",
            "-",
            "-",
            "skipped: sgmcmc_speed.py times BlackJAX on CPU only (--device cpu)",
        )


# -- 3. VIS refinement cost -------------------------------------------------------------------
def stage_vis(ctx, record):
    import pyro
    import vis_cost
    from pyro.infer import SVI, Trace_ELBO

    from pyro_ext.infer.vis import VIS
    from pyro_ext.models.vae import VAE

    device = ctx.device
    warmup, steps = (1, 2) if ctx.small else (3, 30)
    x = torch.bernoulli(torch.full((vis_cost.BATCH, 784), 0.3, device=device))
    medians = {}
    for num_steps, gradient in ((0, None), (5, "fast"), (5, "full")):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        vae = VAE().to(device)
        guide = vae.guide
        if num_steps:  # vis_cost.make_svi's refined guide, on the device
            guide = VIS(
                vae.model,
                vae.guide,
                sampler="sgld",
                num_steps=num_steps,
                step_size=vis_cost.STEP_SIZE,
                entropy="mc",
                gradient=gradient,
            )
        svi = SVI(vae.model, guide, pyro.optim.Adam({"lr": vis_cost.LR}), Trace_ELBO())
        losses = []
        times = step_times(lambda svi=svi: losses.append(svi.step(x)), device, warmup, steps)
        if not all(math.isfinite(loss) for loss in losses):
            raise StageFailed(f"VIS T = {num_steps} ({gradient}): a non-finite ELBO on {device}")
        medians[num_steps, gradient] = statistics.median(times)
        base = medians[0, None]
        ratio = medians[num_steps, gradient] / base
        record.row(
            f"VAE SVI step, batch {vis_cost.BATCH}, T = {num_steps}"
            + (f", gradient={gradient!r}" if gradient else ""),
            ms(medians[num_steps, gradient]) + " (median)",
            "-" if not num_steps else f"÷ T = 0 {verdict(ratio, 1.7)}; thesis 1.71 per epoch",
        )


# -- 4. IVON vs Adam ---------------------------------------------------------------------------
def stage_ivon(ctx, record):
    import pyro

    from pyro_ext.datasets import load_mnist
    from pyro_ext.infer import NaturalGradientVI
    from pyro_ext.models import BayesianMLP

    device = ctx.device
    batch = 128
    # The CPU smoke mode: a 784-32-10 network on 512 test images (the 784-400-400-10 one's
    # first IVON step compiles it, tens of seconds on 2 CPU cores).
    hidden, split, size = ((32,), "test", 512) if ctx.cpu else ((400, 400), "train", 10000)
    warmup, steps = (1, 3) if ctx.small else (5, 50)
    x, y = load_mnist(split, device=device, flatten=True)
    x, y = x[:size], y[:size]
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    # ngvi.py's MNIST settings for IVON (its --mnist-lr, --mnist-hess-init, --mnist-beta2).
    net = BayesianMLP(784, hidden, 10, likelihood="categorical", full_output=False).to(device)
    vi = NaturalGradientVI(net, lr=0.5, hess_init=1.0, mc_samples=1, beta1=0.9, beta2=0.99999)
    losses = []

    def ivon_step():
        losses.append(vi.step(x, y, subsample_size=batch))

    began = time.perf_counter()
    ivon_step()
    sync(device)
    first = time.perf_counter() - began
    ivon = step_times(ivon_step, device, warmup, steps)
    if not all(math.isfinite(loss) for loss in losses):
        raise StageFailed(f"IVON: a non-finite loss on {device}")
    # ngvi.py's Adam (MAP) baseline: the same network in plain torch, weight decay 1 / N.
    widths = (784, *hidden, 10)
    layers = []
    for fan_in, fan_out in zip(widths[:-1], widths[1:]):
        layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.ReLU()]
    mlp = torch.nn.Sequential(*layers[:-1]).to(device)
    opt = torch.optim.Adam(mlp.parameters(), lr=1e-3, weight_decay=1.0 / size)

    def adam_step():
        rows = torch.randint(size, (batch,), device=device)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(mlp(x[rows]), y[rows]).backward()
        opt.step()

    adam = step_times(adam_step, device, warmup, steps)
    ratio = statistics.median(ivon) / statistics.median(adam)
    network = "-".join(map(str, widths))
    record.row(
        f"IVON step (NaturalGradientVI), BNN {network}, batch {batch}",
        spread_us(ivon),
        f"÷ Adam {verdict(ratio, 1.3)}; first step {first:.1f} s (compiles the step on a "
        "large network)",
    )
    record.row(f"Adam step, same network in torch, batch {batch}", spread_us(adam), "baseline")


# -- 5. HMM and Kalman scans -------------------------------------------------------------------
def stage_scans(ctx, record):
    import timeseries_speed as ts

    device = ctx.device
    repeats = 2 if ctx.small else 3
    hmm_sizes = [(3, 200)] if ctx.small else [(3, 100000), (20, 100000)]
    lengths = [200] if ctx.small else [10000]

    def add(rows):
        for name, setting, ours, theirs, ratio in rows:
            if ratio == "not installed":
                record.row(f"{name}, {setting}", "-", "-", "skipped: peer not installed")
            else:
                record.row(
                    f"{name}, {setting}", f"{ours} / {theirs} ms (ours / baseline)", f"{ratio}"
                )

    # Funsor's enumeration first: the HMM tables may import jax (dynamax rows on the CPU),
    # after which funsor 0.4.8's torch backend fails in this process.
    add(ts.enumeration_table(200, repeats, device))
    for rows in ts.hmm_tables(hmm_sizes, repeats, device):
        add(rows)
    for rows in ts.kalman_tables(lengths, repeats, device):
        add(rows)


# -- 5b. compiled online updates ---------------------------------------------------------------
def stage_online(ctx, record):
    import pyro
    import pyro.distributions as dist

    from pyro_ext.online import BONG, LoFi

    device = ctx.device
    hidden = 16 if ctx.small else 100
    steps = 12 if ctx.small else 60
    g = torch.Generator().manual_seed(0)
    x = torch.randn(steps, 2, generator=g).to(device)
    y = torch.sin(2 * x[:, 0]) + 0.3 * torch.randn(steps, generator=g).to(device)
    start = {
        "w1": torch.randn(2, hidden, generator=g).to(device),
        "b1": torch.randn(hidden, generator=g).to(device),
        "w2": torch.randn(hidden, generator=g).to(device),
    }

    def model(x, y=None):
        w1 = pyro.sample(
            "w1", dist.Normal(torch.zeros(2, hidden, device=x.device), 1.0).to_event(2)
        )
        b1 = pyro.sample("b1", dist.Normal(torch.zeros(hidden, device=x.device), 1.0).to_event(1))
        w2 = pyro.sample("w2", dist.Normal(torch.zeros(hidden, device=x.device), 1.0).to_event(1))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(torch.tanh(x @ w1 + b1) @ w2, 0.3), obs=y)

    init = pyro.infer.autoguide.initialization.init_to_value(values=start)
    dim = 2 * hidden + hidden + hidden
    for label, make in (
        ("BONG full", lambda jit: BONG(model, init_strategy=init, jit_compile=jit)),
        ("LoFi rank 10", lambda jit: LoFi(model, 10, init_strategy=init, jit_compile=jit)),
    ):
        times, means = {}, {}
        for jit in (False, True):
            f = make(jit)
            f.update(x[:1], y[:1])
            began = time.perf_counter()
            f.update(x[1:2], y[1:2])  # compiles (CUDA: at this first call)
            sync(device)
            first = time.perf_counter() - began
            per = []
            for t in range(2, steps):
                began = time.perf_counter()
                f.update(x[t : t + 1], y[t : t + 1])
                sync(device)
                per.append(time.perf_counter() - began)
            times[jit], means[jit] = per, f.mean
            if jit:
                compile_note = f"the update that compiled: {first:.1f} s"
        gap = float((means[True] - means[False]).abs().max())
        if not gap < 1e-3:
            raise StageFailed(f"{label}: compiled and eager means differ by {gap:.2e} on {device}")
        ratio = statistics.median(times[True]) / statistics.median(times[False])
        record.row(
            f"{label} update, compiled, 2-{hidden}-1 MLP (D = {dim})",
            spread_us(times[True]),
            f"÷ eager {ratio:.2f}; means agree to {gap:.1e}; {compile_note}",
        )
        record.row(f"{label} update, eager", spread_us(times[False]), "baseline")


# -- 6. the distributed step ------------------------------------------------------------------
def stage_distributed(ctx, record):
    import distributed as bench
    import pyro
    import torch.distributed as c10d

    from pyro_ext.datasets import load_uci, standardize_split
    from pyro_ext.infer import MCMC, SGLD

    device = ctx.device
    backend = "nccl" if device.type == "cuda" else "gloo"
    num_particles = 4 if ctx.small else 16
    warmup, steps = (2, 5) if ctx.small else (5, 30)
    hidden, batch, step_size = bench.PROBLEMS["kin8nm"]
    split, _, _ = standardize_split(load_uci("kin8nm", 0, device=device))
    x, y = split.x_train, split.y_train
    if device.type == "cuda":
        torch.cuda.set_device(device)
        if torch.cuda.device_count() > 1:
            record.notes.append(
                f"{torch.cuda.device_count()} GPUs present: this check runs a one-rank group; "
                "several ranks need a launcher (torchrun), as benchmarks/distributed.py's "
                "spawned gloo ranks do on the CPU."
            )

    def chain(repulsion, shard):
        stamps = []
        pyro.set_rng_seed(0)
        kernel = SGLD(
            lambda x, y: bench.mlp_model(x, y, hidden, batch, False),
            step_size=step_size,
            num_particles=num_particles,
            repulsion=repulsion,
            shard=shard,
        )

        def hook(kernel, params, stage, index):
            sync(device)
            stamps.append(time.perf_counter())

        mcmc = MCMC(
            kernel, num_samples=steps, warmup_steps=warmup, disable_progbar=True, hook_fn=hook
        )
        mcmc.run(x, y)
        draws = mcmc.get_samples()
        if not all(torch.isfinite(v).all() for v in draws.values()):
            raise StageFailed(f"SGLD repulsion={repulsion!r} shard={shard!r}: non-finite draws")
        return [b - a for a, b in zip(stamps[warmup:], stamps[warmup + 1 :])]

    with tempfile.TemporaryDirectory() as folder:
        store = c10d.FileStore(os.path.join(folder, "store"), 1)
        c10d.init_process_group(backend, store=store, rank=0, world_size=1)
        try:
            for repulsion in (None, "rbf"):
                name = "SGLD+R" if repulsion else "SGLD"
                single = chain(repulsion, None)
                sharded = chain(repulsion, "particles")
                ratio = statistics.median(sharded) / statistics.median(single)
                record.row(
                    f"{name}, L = {num_particles}, kin8nm BNN, one process (no group)",
                    spread_us(single),
                    "baseline",
                )
                record.row(
                    f'{name}, L = {num_particles}, shard="particles", 1-rank {backend} group',
                    spread_us(sharded),
                    f"÷ one process {ratio:.2f}",
                )
        finally:
            c10d.destroy_process_group()


STAGES = [
    Stage("environment", "Environment and device", 0.05, stage_environment),
    Stage("tests", "The device-fixture tests", 0.28, stage_tests),
    Stage(
        "sgmcmc", "SG-MCMC step: compiled vs floor vs eager (sgmcmc_speed.py)", 0.24, stage_sgmcmc
    ),
    Stage("vis", "VIS refinement cost, T = 5 / T = 0 (vis_cost.py)", 0.06, stage_vis),
    Stage("ivon", "IVON step vs Adam's (ngvi.py)", 0.13, stage_ivon),
    Stage("scans", "HMM / Kalman scans at long T (timeseries_speed.py)", 0.08, stage_scans),
    Stage("online", "Online filters: compiled vs eager update (online.py)", 0.05, stage_online),
    Stage("distributed", "Distributed SG-MCMC step (distributed.py)", 0.08, stage_distributed),
]


def preamble_for(args, device, started):
    def preamble():
        from importlib.metadata import PackageNotFoundError, version

        try:
            pyro_version = version("pyro-ppl")
        except PackageNotFoundError:
            pyro_version = "not installed"
        name = (
            torch.cuda.get_device_name(device)
            if device.type == "cuda" and torch.cuda.is_available()
            else "cpu"
        )
        mode = "quick" if args.quick else "full"
        if device.type == "cpu":
            mode = "CPU smoke: smallest sizes, traced graphs instead of torch.compile"
        return (
            f"# CUDA capability check ({mode})\n\n"
            f"Generated by `python benchmarks/gpu_check.py --device {device.type}"
            f"{' --quick' if args.quick else ''}{' --keep-going' if args.keep_going else ''} "
            f"--budget-seconds {args.budget_seconds:g}`. "
            f"Device **{name}**; torch {torch.__version__}, CUDA {torch.version.cuda}, "
            f"pyro-ppl {pyro_version}. Elapsed {time.perf_counter() - started:.0f} s of "
            f"{args.budget_seconds:g}. Each stage's rows: what ran, its time (per-step times as "
            "median / mean / p90 / max), its key ratios (a target's verdict beside it) and "
            "whether it ran; "
            + (
                "every stage runs, whatever failed before it (--keep-going)."
                if args.keep_going
                else "the first stage that fails stops the run."
            )
        )

    return preamble


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.strip(), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cuda when present, else cpu (the smoke mode)",
    )
    parser.add_argument("--quick", action="store_true", help="smallest sizes on any device")
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="the report (default benchmarks/results/cuda.md on cuda, gpu_check_smoke.md on cpu)",
    )
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="run every stage after a failure, and every test (no -x): one run lists all that breaks",
    )
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=480,
        help="the whole run's time, shared out among the stages (default 480)",
    )
    args = parser.parse_args(argv)
    # Cold compiles, as on a user's first run (the compile seconds are part of the report);
    # here rather than at import, so that importing this module changes nothing.
    fresh_inductor_cache("gpu_check_inductor_")
    device = torch.device(args.device)
    if device.type == "cuda" and torch.cuda.is_available():
        # An explicit index: torch.cuda.set_device and the NCCL group need one.
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "cpu":
        torch.set_num_threads(1)
    output = args.output or DEFAULT_OUTPUT[device.type]
    ctx = Context(
        device=device,
        small=args.quick or device.type == "cpu",
        cpu=device.type == "cpu",
        keep_going=args.keep_going,
    )
    started = time.perf_counter()
    code = run_stages(
        STAGES,
        ctx,
        args.budget_seconds,
        output,
        preamble_for(args, device, started),
        hard_kill=True,
    )
    print(f"gpu_check: {'all stages passed' if code == 0 else 'FAILED'}; report in {output}")
    return code


if __name__ == "__main__":
    sys.exit(main())
