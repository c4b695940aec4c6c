"""
What the benchmark scripts share: the data prelude (importing this module points
``$PYRO_EXT_DATA`` at the shared data folder next to the repository unless it is set), the
command-line options every script has (``argument_parser``), a fresh inductor cache for
cold compile times, the median / mean / p90 / max spread of timings, ``mean ± sd`` over
runs, classification ``accuracy``, and markdown reports printed and written to a file.

Nothing here imports torch at import time: ``fresh_inductor_cache`` must run before it is.
"""

import argparse
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


def argument_parser(
    doc,
    output,
    *,
    quick="smoke test: tiny sizes, numbers not meaningful",
    output_help=None,
    seed=None,
    seeds=None,
    threads=None,
):
    """
    An ``argparse.ArgumentParser`` with the options every benchmark script has, to which the
    script adds its own. Its description is the script's docstring ``doc`` as written (the
    protocol). Options:

    * ``--quick``: a smoke-test run (``store_true``); ``quick`` is its help;
    * ``--output``: where the report is written, a ``Path``, default ``output`` (which
      ``output_help`` describes where the script picks it, ``output=None``);

    and those that several scripts share, where the argument is given:

    * ``--seed``: an int, default ``seed``;
    * ``--seeds``: a number of seeds, default None (the script's, which the help ``seeds``
      states);
    * ``--threads``: torch intra-op threads, default ``threads`` (the script calls
      ``torch.set_num_threads``; scripts without the option run on one thread).
    """
    parser = argparse.ArgumentParser(
        description=doc.strip(), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=quick)
    if output_help is None:
        shown = output.relative_to(REPO) if output.is_relative_to(REPO) else output
        output_help = f"where the report is written (default {shown})"
    parser.add_argument("--output", type=Path, default=output, help=output_help)
    if seed is not None:
        parser.add_argument("--seed", type=int, default=seed, help=f"random seed (default {seed})")
    if seeds is not None:
        parser.add_argument("--seeds", type=int, default=None, help=seeds)
    if threads is not None:
        parser.add_argument(
            "--threads",
            type=int,
            default=threads,
            help=f"torch intra-op threads (default {threads})",
        )
    return parser


def accuracy(predict, x, y, batch_size=None):
    """
    The fraction of the rows of ``x`` that ``predict`` labels ``y``, computed without
    gradients, ``batch_size`` rows per call of ``predict`` (all at once by default).
    ``predict(x)`` returns scores per class (logits, probabilities: the label is the argmax
    of the last dimension), a binary problem's probabilities of class 1 (one dimension of
    floats: the label is 1 above 0.5) or the labels themselves (integers).
    """
    import torch

    correct, size = 0, len(y)
    with torch.no_grad():
        for i in range(0, size, batch_size or max(size, 1)):
            out = predict(x[i : i + (batch_size or size)])
            if out.is_floating_point():
                out = out.argmax(-1) if out.dim() > 1 else (out > 0.5).long()
            correct += int((out == y[i : i + (batch_size or size)]).sum())
    return correct / size


def fresh_inductor_cache(prefix):
    """
    Point TorchInductor at an empty cache folder (removed at exit) unless the user set
    ``$TORCHINDUCTOR_CACHE_DIR`` to another folder, so that the run's first compilation of
    a graph is a cold one, as on a user's first run. Call before anything compiles.

    Inductor writes its default folder into ``$TORCHINDUCTOR_CACHE_DIR`` the first time
    anything asks for it (importing ``posteriors`` does), so the default there does not
    count as the user's choice: without this, a run that imported such a peer first timed
    its compiles against the warm shared cache while reporting them as cold.
    """
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen is None or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
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


def write_sections(preamble, headings, made, output):
    """
    Write a report whose sections can be remade one at a time: ``headings`` maps each
    section's key to the start of its heading (``"## Table 2.5"``), in the report's order;
    ``made`` maps the keys this run made to their text. The other sections are kept, as
    they are, from the report already at ``output`` (each should say the command that made
    it).
    """
    sections = dict(made)
    if output.exists():
        for chunk in output.read_text().split("\n## ")[1:]:
            for key, heading in headings.items():
                if key not in made and ("## " + chunk).startswith(heading):
                    sections[key] = "## " + chunk.strip()
    write_report(preamble, [sections[key] for key in headings if key in sections], output)


def section_made_by(text, quick, seconds):
    """``text`` (a ``## `` section) with a line after its heading: the command line of this
    run and its wall time."""
    heading, _, body = text.partition("\n\n")
    mode = "quick mode: numbers are not meaningful" if quick else "full protocol"
    return (
        f"{heading}\n\nMade by `python {_script()} "
        f"{command_line_args()}` ({mode}; {seconds:.0f} s on one CPU thread).\n\n{body}"
    )


def _script():
    """The running script's path from the repository root (``benchmarks/x.py``)."""
    path = Path(sys.argv[0]).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


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


#: what each ``--bias-bound`` makes the default step (the SG-MCMC kernels' ``bias_bound``), for the
#: reports' protocol lines
BIAS_BOUND_PROTOCOL = {
    "stiffest": "the largest step whose error is that in the stiffest direction (with "
    "repulsion: in the draws pooled over the particles, the ensemble's mean mode kept stable)",
    "typical": "the largest step whose error is that on average over directions (and particle "
    "modes), the stiffest direction kept stable",
    "auto": "the stiffest direction's bound when a typical direction relaxes 100 times within "
    "the kept steps at it, else the smallest larger step at which it does, up to the bound on "
    "average over directions",
}
