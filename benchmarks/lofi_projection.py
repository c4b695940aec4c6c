"""
LoFi's projection (``pyro_ext.online.updates.project_low_rank``): the best rank-``L`` part of
``diag(u) + C C^T`` for the ``K = L + 1`` stacked columns ``C`` ``(D, K)`` of an update. Ours
takes the top singular directions from the eigendecomposition of the float64 Gram matrix
``C^T C``; the baseline is the thin SVD of ``C`` itself, as the LoFi paper (Chang et al.
2023) and its code project, written out here (what ``project_low_rank`` ran before).

**Speed.** Both compiled the way a ``jit_compile=True`` update compiles them (traced, then
TorchInductor; float32, one thread), the columns laid out as the update builds them (``(D,
K)`` column-major for ours; the SVD gets them row-major, as it did). ms per call, median /
mean / p90 / max over the repeats (each repeat a batch of back-to-back calls lasting at least
20 ms), and the median of the per-repeat ratios.

**Accuracy.** Float32 columns whose squared singular values span 1e6 (two nearly parallel
columns of norm about 900 beside one of norm 3 and one of 0.03, D = 9, the case of
``tests/online/test_filters.py``), projected to ranks 1-3: the largest error of the
projected diagonal relative to its largest entry, and of ``W W^T`` relative to its largest
entry, against the float64 SVD's projection of the same columns; for ours, the float32 SVD,
and a Gram matrix formed in float32 (the variant not taken).
"""

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import argument_parser, markdown, spread, write_report  # noqa: E402
from timeseries_speed import timed_pair  # noqa: E402

from pyro_ext.infer.tracing import compile_graph, trace_pure  # noqa: E402
from pyro_ext.online import updates  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "lofi_projection.md"


def svd_projection(diagonal, columns, rank):
    """The thin SVD's projection: the baseline, and the float64 reference."""
    u, s, _ = torch.linalg.svd(columns, full_matrices=False)
    kept = min(rank, s.shape[-1])
    W = (u[:, :kept] * s[:kept]).contiguous()
    return diagonal + (u[:, kept:] * s[kept:]).square().sum(-1), W


def float32_gram_projection(diagonal, columns, rank):
    """Ours with the Gram matrix formed in float32 (not taken: its round-off, about 6e-8 of
    the largest squared singular value, moves the split)."""
    _, R = torch.linalg.eigh((columns.T @ columns).double())
    scaled = R.flip(-1).T.to(columns.dtype) @ columns.T
    return diagonal + scaled[rank:].square().sum(0), scaled[:rank].T.contiguous()


def compiled(fn, inputs):
    def graph(diagonal, columns):
        with updates.deferred_checks() as flags:
            out = fn(diagonal, columns)
        return (*out, *flags)

    return compile_graph(trace_pure(graph, inputs, "not compiled"), inputs)[0]


def speed_rows(sizes, repeats):
    rows = []
    for D, rank in sizes:
        g = torch.Generator().manual_seed(D + rank)
        K = rank + 1
        column_major = torch.randn(K, D, generator=g).T  # as natural_step stacks them
        row_major = column_major.contiguous()
        diagonal = torch.rand(D, generator=g) + 1

        ours = compiled(lambda d, c: updates.project_low_rank(d, c, rank), [diagonal, column_major])
        theirs = compiled(lambda d, c: svd_projection(d, c, rank), [diagonal, row_major])
        t_ours, t_svd, ratio = timed_pair(
            lambda: ours(diagonal, column_major),
            lambda: theirs(diagonal, row_major),
            repeats,
            diagonal.device,
        )
        rows.append(
            [
                f"{D:,}",
                rank,
                spread(t_ours, 1e3, "{:.3f}"),
                spread(t_svd, 1e3, "{:.3f}"),
                f"{ratio:.2f}",
            ]
        )
        print(rows[-1], flush=True)
    return rows


def accuracy_rows():
    g = torch.Generator().manual_seed(4)
    dim = 9
    diagonal = torch.rand(dim, generator=g) + 0.2
    column = torch.randn(dim, generator=g)
    columns = torch.stack(
        [
            300 * column,
            300 * column + 0.5 * torch.randn(dim, generator=g),
            torch.randn(dim, generator=g),
            0.01 * torch.randn(dim, generator=g),
        ],
        dim=-1,
    )
    methods = [
        ("ours (float64 Gram matrix)", updates.project_low_rank),
        ("thin SVD, float32 (before)", svd_projection),
        ("Gram matrix in float32 (not taken)", float32_gram_projection),
    ]
    rows = []
    for rank in (1, 2, 3):
        d64, W64 = svd_projection(diagonal.double(), columns.double(), rank)
        kept64 = W64 @ W64.T
        for name, fn in methods:
            d32, W32 = fn(diagonal, columns, rank)
            kept = W32.double() @ W32.double().T
            rows.append(
                [
                    rank,
                    name,
                    f"{float((d32.double() - d64).abs().max() / d64.abs().max()):.1e}",
                    f"{float((kept - kept64).abs().max() / kept64.abs().max()):.1e}",
                ]
            )
    return rows


#: (D, rank) of the speed table: the sizes of online.py's section 5 and the MNIST bandit's
SIZES = [(D, L) for D in (65, 401, 1201) for L in (5, 10, 20)] + [(1962, 10), (100_001, 10)]
QUICK_SIZES = [(65, 5), (401, 10)]


def main(argv=None):
    parser = argument_parser(__doc__, RESULTS, quick="two small sizes, 2 repeats (smoke test)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    repeats = 2 if args.quick else args.repeats
    sizes = QUICK_SIZES if args.quick else SIZES
    torch.set_num_threads(1)
    started = time.perf_counter()
    speed = speed_rows(sizes, repeats)
    accuracy = accuracy_rows()
    preamble = (
        "# LoFi's projection: the Gram matrix's eigendecomposition against the thin SVD\n\n"
        f"{'Quick mode (numbers not meaningful). ' if args.quick else ''}torch "
        f"{torch.__version__}, CPU, 1 thread, float32, {repeats} repeats; "
        f"{time.perf_counter() - started:.0f} s. Generated by `python "
        f"benchmarks/lofi_projection.py{' --quick' if args.quick else ''}`. Protocol: the "
        "script's docstring. Ratio < 1: ours is faster."
    )
    write_report(
        preamble,
        [
            "## Speed, compiled\n\n"
            + markdown(
                [
                    "D",
                    "rank",
                    "ours ms (median / mean / p90 / max)",
                    "thin SVD ms (median / mean / p90 / max)",
                    "ours / SVD",
                ],
                speed,
            ),
            "## Accuracy in float32, against the float64 SVD\n\n"
            + markdown(
                ["rank", "projection", "diagonal error (relative)", "W W^T error (relative)"],
                accuracy,
            ),
        ],
        args.output,
    )


if __name__ == "__main__":
    main()
