"""
Where a compiled online update's time goes (issue 36: "what remains of the per-update
overhead, with the profile that shows it"). float32, one thread, the filters of
``benchmarks/online.py`` section 5 (a 2-16-1 tanh MLP regression, D = 65, one observation
per update, the start a prior draw) and the MNIST bandit's LoFi-TS of
``benchmarks/online_bandits.py`` (a 50-32-10 tanh MLP, D = 1,962, rank 10, on random
contexts: its update and its Thompson scoring), all with ``jit_compile=True``.

For each, after three warm-up calls (the second traces and compiles), ``--calls`` calls
(500):

* **call**: the public call (``update`` / ``observe`` / ``act``), median / mean / p90 /
  max.
* **graph**: the compiled graph's share of each call (a timer wrapped around the graph's
  callable), median; **outside**: the median over the calls of call - graph, the filter's
  (and the bandit's) Python around the graph: the shape key, the checks, the inputs'
  assembly, the flag's check, the new belief.
* Inside the graph, called again on the inputs of the last call: each **library call** it
  makes (BLAS and LAPACK: ``mm``, ``addmm``, ``eigh``, ``cholesky``, ``cholesky_solve``,
  ``svd``...), read from one profiled batch of 50 graph calls (``torch.profiler``, input
  shapes recorded, the ``out=`` buffer's shape last), with its calls per graph call, each
  timed on its own (fresh inputs of those shapes, a symmetric positive definite matrix for
  a factorisation; the median of 7 repeats of a batch lasting at least 20 ms), summed; the
  **generated kernels** (inductor's fused C++ loops), each timed inside the running graph
  (a timer wrapped around it in the graph's module), summed over their medians; and **the
  rest**: graph - libraries - kernels, the graph's own Python (its buffer allocations, one
  Python call per kernel and per library call, the wrappers around the graph).
* **floor**: a compiled graph of the same inputs that only adds 1 to the first (one
  generated kernel, one buffer): what any compiled call costs here.

Timing a kernel or a graph with a wrapper adds about 0.1 us to it; the isolated library
calls run on fresh, contiguous inputs where the graph passes some of them transposed; so
the split is good to a few microseconds.
"""

import statistics
import sys
import time
from pathlib import Path

import pyro
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import argument_parser, markdown, spread, write_report  # noqa: E402
from online import regression_stream  # noqa: E402
from timeseries_speed import _calls_per_batch as calls_per_batch  # noqa: E402
from timeseries_speed import _per_call as per_call  # noqa: E402

from pyro_ext.infer.tracing import compile_graph, trace_pure  # noqa: E402
from pyro_ext.online import BONG, LoFi, ThompsonBandit  # noqa: E402
from pyro_ext.online.bandits import neural_contextual_model  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "online_profile.md"
CPU = torch.device("cpu")


def us(seconds):
    return f"{1e6 * seconds:.1f}"


def median_time(fn, repeats=7):
    """The median over ``repeats`` of the seconds per call of a batch of back-to-back
    calls lasting at least 20 ms (``timeseries_speed.py``'s batches)."""
    fn()
    calls = calls_per_batch(fn, CPU)
    return statistics.median(per_call(fn, calls, CPU) for _ in range(repeats))


class Recorder:
    """Stands in for a compiled graph: times each call and keeps the last call's inputs."""

    def __init__(self, fn):
        self.fn, self.inputs, self.seconds = fn, None, []

    def __call__(self, *inputs):
        began = time.perf_counter()
        out = self.fn(*inputs)
        self.seconds.append(time.perf_counter() - began)
        self.inputs = inputs
        return out


def timed_calls(graphs, call, num_calls):
    """Seconds of ``num_calls`` calls ``call()``, seconds of the compiled graph within each,
    the graph (the one entry ``(fn, cudagraphs)`` of the dict ``graphs``: a filter's
    ``_graphs`` or a bandit's ``_score_graphs``) and the inputs of its last call."""
    (key, entry), *others = graphs.items()
    assert not others, "one graph per profiled call"
    recorder = Recorder(entry[0])
    graphs[key] = (
        entry._replace(fn=recorder) if hasattr(entry, "_replace") else (recorder, *entry[1:])
    )
    times = []
    try:
        for _ in range(num_calls):
            began = time.perf_counter()
            call()
            times.append(time.perf_counter() - began)
    finally:
        graphs[key] = entry
    assert len(recorder.seconds) == num_calls, "one graph call per call"
    return times, recorder.seconds, entry[0], recorder.inputs


def spd(n, dtype):
    a = torch.randn(n, n, dtype=torch.float64)
    return (a @ a.T + n * torch.eye(n, dtype=torch.float64)).to(dtype)


def library_inputs(name, shapes, dtypes):
    """Fresh inputs of a library call's recorded shapes (``None``: not a call we time)."""
    if name == "aten::mm":
        return torch.mm, [torch.randn(s, dtype=d) for s, d in zip(shapes[:2], dtypes)]
    if name == "aten::addmm":
        return torch.addmm, [torch.randn(s, dtype=d) for s, d in zip(shapes[:3], dtypes)]
    if name == "aten::bmm":
        return torch.bmm, [torch.randn(s, dtype=d) for s, d in zip(shapes[:2], dtypes)]
    if name in ("aten::_linalg_eigh", "aten::linalg_cholesky_ex"):
        fn = torch.linalg.eigh if "eigh" in name else torch.linalg.cholesky_ex
        return fn, [spd(shapes[0][-1], dtypes[0])]
    if name == "aten::cholesky_solve":
        factor = torch.linalg.cholesky(spd(shapes[1][-1], dtypes[1]))
        return torch.cholesky_solve, [torch.randn(shapes[0], dtype=dtypes[0]), factor]
    if name == "aten::_linalg_svd":
        return (
            lambda a: torch.linalg.svd(a, full_matrices=False),
            [torch.randn(shapes[0], dtype=dtypes[0])],
        )
    if name == "aten::linalg_solve_triangular":
        factor = torch.linalg.cholesky(spd(shapes[0][-1], dtypes[0]))
        return (
            lambda a, b: torch.linalg.solve_triangular(a, b, upper=False),
            [factor, torch.randn(shapes[1], dtype=dtypes[1])],
        )
    return None


_DTYPES = {"float": torch.float32, "double": torch.float64}
LIBRARY = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::_linalg_eigh",
    "aten::linalg_cholesky_ex",
    "aten::cholesky_solve",
    "aten::_linalg_svd",
    "aten::linalg_solve_triangular",
)


def library_calls(fn, inputs, calls):
    """``[(name, shapes, dtypes, count per graph call)]`` of the library calls the graph
    makes, read from a profile of ``calls`` graph calls."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(calls):
            fn(*inputs)
    found = {}
    for event in prof.events():
        if event.name not in LIBRARY:
            continue
        parent = event.cpu_parent
        # A library call inside another one (cholesky_solve's helper) is counted once.
        while parent is not None and parent.name not in LIBRARY:
            parent = parent.cpu_parent
        if parent is not None:
            continue
        shapes = tuple(tuple(s) for s in event.input_shapes if s)
        dtypes = tuple(_DTYPES.get(t, torch.float32) for t in event.input_dtypes if t in _DTYPES)
        key = (event.name, shapes, dtypes)
        found[key] = found.get(key, 0) + 1
    return [
        (name, shapes, dtypes, count / calls) for (name, shapes, dtypes), count in found.items()
    ]


def kernel_times(fn, inputs, calls):
    """Median seconds per call of each generated kernel the graph runs, timed inside it."""
    from torch._inductor.codecache import PyCodeCache

    times, patched = {}, []
    for module in list(PyCodeCache.modules):
        for name in [n for n in vars(module) if n.startswith("cpp_fused")]:
            kernel = getattr(module, name)

            def timed(*args, _kernel=kernel, _key=(id(module), name)):
                began = time.perf_counter()
                out = _kernel(*args)
                times.setdefault(_key, []).append(time.perf_counter() - began)
                return out

            setattr(module, name, timed)
            patched.append((module, name, kernel))
    try:
        for _ in range(calls):
            fn(*inputs)
    finally:
        for module, name, kernel in patched:
            setattr(module, name, kernel)
    return {key: statistics.median(values) for key, values in times.items()}


def floor_graph(inputs):
    """A compiled graph of the same inputs that adds 1 to the first."""
    graph = trace_pure(lambda *xs: (xs[0] + 1,), inputs, "not compiled")
    return compile_graph(graph, inputs, contiguous_inputs=True)[0]


def profile_case(label, call, graphs, num_calls):
    """One row of the summary and the rows of its library calls."""
    for _ in range(3):
        call()
    times, graph_times, fn, inputs = timed_calls(graphs, call, num_calls)
    graph = statistics.median(graph_times)
    outside = statistics.median(t - g for t, g in zip(times, graph_times))
    calls = library_calls(fn, inputs, 50)
    library_rows, library_total = [], 0.0
    for name, shapes, dtypes, count in sorted(calls, key=lambda c: c[0]):
        made = library_inputs(name, shapes, dtypes)
        if made is None:
            continue
        op, args = made
        seconds = median_time(lambda op=op, args=args: op(*args))
        library_total += seconds * count
        library_rows.append(
            [
                label,
                name.removeprefix("aten::"),
                " · ".join("×".join(str(n) for n in s) for s in shapes),
                ", ".join(str(d).removeprefix("torch.") for d in dtypes),
                f"{count:g}",
                us(seconds),
            ]
        )
    kernels = kernel_times(fn, inputs, num_calls)
    kernel_total = sum(kernels.values())
    floor_fn = floor_graph(inputs)
    floor = median_time(lambda: floor_fn(*inputs))
    summary = [
        label,
        spread(times, 1e6, "{:.1f}"),
        us(graph),
        us(library_total),
        f"{us(kernel_total)} ({len(kernels)})",
        us(graph - library_total - kernel_total),
        us(outside),
        us(floor),
    ]
    return summary, library_rows


def regression_cases(num_calls, quick):
    x, y, dim, model, init = regression_stream([2, 16, 1], 3 + 2 * num_calls + 4, 1.0, 0.3)
    cases = [
        ("BONG full", lambda: BONG(model, init_strategy=init, jit_compile=True)),
        ("BONG diag", lambda: BONG(model, family="diag", init_strategy=init, jit_compile=True)),
        ("LoFi rank 10", lambda: LoFi(model, 10, init_strategy=init, jit_compile=True)),
    ]
    if quick:
        cases = cases[2:]
    out = []
    for name, make in cases:
        pyro.set_rng_seed(0)
        f = make()
        position = iter(range(len(x)))

        def update(f=f, position=position):
            t = next(position)
            f.update(x[t : t + 1], y[t : t + 1])

        out.append(profile_case(f"{name}, D = {dim}: update", update, f._graphs, num_calls))
    return out


def bandit_cases(num_calls):
    context_dim, arms = 50, 10
    model = neural_contextual_model(
        context_dim, arms, hidden=(32,), noise_scale=0.1, prior_scale=0.5
    )
    pyro.set_rng_seed(0)
    agent = ThompsonBandit(lambda: LoFi(model, rank=10, jit_compile=True), arms)
    g = torch.Generator().manual_seed(0)
    contexts = torch.randn(10 * num_calls + 20, context_dim, generator=g)
    state = {"t": 0}

    def observe():
        t = state["t"] = state["t"] + 1
        agent.observe(contexts[t], t % arms, float(t % 3 == 0))

    def act():
        state["t"] += 1
        agent.act(contexts[state["t"]])

    act()
    observe()
    dim = agent.filter.belief.mean.shape[0]
    return [
        profile_case(
            f"bandit LoFi rank 10, D = {dim:,}: observe", observe, agent.filter._graphs, num_calls
        ),
        profile_case(f"bandit LoFi rank 10, D = {dim:,}: act", act, agent._score_graphs, num_calls),
    ]


def main():
    parser = argument_parser(__doc__, RESULTS, quick="smoke test (< 1 min)")
    parser.add_argument("--calls", type=int, default=None, help="calls per case (default 500)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    num_calls = args.calls or (20 if args.quick else 500)
    began = time.perf_counter()
    results = regression_cases(num_calls, args.quick)
    if not args.quick:
        results += bandit_cases(num_calls)
    summary = [row for row, _ in results]
    libraries = [row for _, rows in results for row in rows]
    preamble = (
        f"# Where a compiled online update's time goes ({'quick' if args.quick else 'full'} "
        f"run)\n\nCommand: `python benchmarks/online_profile.py{' --quick' if args.quick else ''}`. "
        f"torch {torch.__version__}, pyro {pyro.__version__}; one thread; {num_calls} calls "
        f"per case; wall time {time.perf_counter() - began:.0f} s. How each column is "
        "measured: the docstring of `benchmarks/online_profile.py`."
    )
    sections = [
        "## Per call (µs)\n\n"
        "call: median / mean / p90 / max; the others medians. graph: its share of the call; "
        "libraries: the library calls' isolated times times their calls per graph call; "
        "kernels: the generated kernels' (their number); rest: graph − libraries − kernels; "
        "outside: call − graph; floor: a compiled graph of the same inputs that adds 1 to "
        "the first.\n\n"
        + markdown(
            ["case", "call", "graph", "libraries", "kernels", "rest", "outside", "floor"],
            summary,
        ),
        "## The library calls inside each graph\n\n"
        + markdown(
            ["case", "call", "shapes", "dtypes", "per graph call", "µs each (isolated)"],
            libraries,
        ),
    ]
    write_report(preamble, sections, args.output)


if __name__ == "__main__":
    main()
