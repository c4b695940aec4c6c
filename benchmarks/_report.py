"""Shared output of the benchmark scripts: markdown tables, printed and written to a file."""

import statistics
import sys


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
