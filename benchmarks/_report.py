"""Shared output of the benchmark scripts: markdown tables, printed and written to a file."""

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
