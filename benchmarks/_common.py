"""
What the benchmark scripts share: the data prelude (importing this module points
``$PYRO_EXT_DATA`` at the shared data folder next to the repository unless it is set), a
fresh inductor cache for cold compile times, the median / mean / p90 / max spread of
timings, ``mean ± sd`` over runs, and markdown reports printed and written to a file.
"""

import atexit
import math
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("PYRO_EXT_DATA", str(REPO.parent / "shared" / "data"))


def fresh_inductor_cache(prefix):
    """
    Point TorchInductor at an empty cache folder (removed at exit) unless
    ``$TORCHINDUCTOR_CACHE_DIR`` is set, so that the run's first compilation of a graph is
    a cold one, as on a user's first run. Call before anything compiles.
    """
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix=prefix)
        atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)


def spread(values, scale=1.0, fmt="{:,.0f}"):
    """``"median / mean / p90 / max"`` of ``values`` times ``scale``, each as ``fmt``."""
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(math.ceil(0.9 * len(ordered))) - 1)]
    summary = (statistics.median(ordered), statistics.fmean(ordered), p90, ordered[-1])
    return " / ".join(fmt.format(scale * v) for v in summary)


def markdown(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_report(preamble, sections, output):
    """Print the report and write it to ``output`` (a ``pathlib.Path``)."""
    report = "\n\n".join([preamble] + list(sections)) + "\n"
    print(report)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(report)


def command_line_args():
    """The command-line options of this run, minus ``--output``, for a report's preamble."""
    args, skip = [], False
    for arg in sys.argv[1:]:
        if skip or arg.startswith("--output"):
            skip = arg == "--output"
            continue
        args.append(arg)
    return " ".join(args)


def mean_sd(values, digits=2):
    """``"mean ± sd"`` over runs (just the value for one run)."""
    values = list(values)
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def robust_fit(model, *args, seed=0, **kwargs):
    """``model.fit(*args, seed=seed, **kwargs)`` that survives a run which still diverges
    after the model's own step-size halving: it is retried once with seed + 1000. Returns
    the list of failed attempts, which the reports show."""
    from pyro_ext.infer import SamplerDivergenceError

    failures = []
    for s in (seed, seed + 1000):
        try:
            model.fit(*args, seed=s, **kwargs)
            return failures
        except SamplerDivergenceError as error:
            failures.append(f"seed {s}: {str(error)[:80]}")
            print("fit failed:", failures[-1], flush=True)
    raise RuntimeError(f"every fit attempt failed: {failures}")
