"""
The demo tour: ``python -m pyro_ext.demo [--chapter NAME] [--quick] [--figures DIR]``
(``make demo``).

Each landed capability contributes a chapter, a module of this package, that runs on
generated or shared data, prints its results and draws its most telling figures as PNG
files (trace plots, forecast bands, security and reward curves) into one folder, named at
the end (default ``./pyro_ext_demo_figures``; ``--no-figures`` draws none). The figures
need matplotlib, the ``demo`` extra (``pip install "pyro-ext[demo]"``); without it the tour
runs and says it skipped them. Chapters so far:

- ``sgmcmc``: stochastic-gradient MCMC with repulsion (thesis section 2.3).
- ``distributed``: the same sampler sharded over two processes with torch.distributed.
- ``bnn``: Bayesian neural networks on UCI regression (thesis 1.3, 2.3.3).
- ``ngvi``: natural-gradient variational inference (IVON, VOGN) for a BNN.
- ``online``: online variational Bayes (BONG, LoFi, WoLF) on streams.
- ``vis``: variationally inferred sampling (thesis section 2.4).
- ``timeseries``: exact HMM and dynamic linear model inference (thesis 2.4.2, 1.2.2).
- ``bsts``: the retail structural time series and budget allocation (thesis chapter 1.2).
- ``ara``: adversarial risk analysis defenses and security evaluation (thesis chapter 3).
- ``rl``: threatened Markov decision processes (thesis chapter 4).

``--quick`` runs every chapter with fewer iterations (the test suite runs it).
"""

import argparse

import pyro
import torch

from pyro_ext.demo import (
    ara,
    bnn,
    bsts,
    distributed,
    ngvi,
    online,
    rl,
    sgmcmc,
    timeseries,
    vis,
)
from pyro_ext.demo._common import DEFAULT_FOLDER, INSTALL_HINT, Figures

_MODULES = {
    "sgmcmc": sgmcmc,
    "distributed": distributed,
    "bnn": bnn,
    "ngvi": ngvi,
    "online": online,
    "vis": vis,
    "timeseries": timeseries,
    "bsts": bsts,
    "ara": ara,
    "rl": rl,
}

#: Chapter name -> ``run(quick=False, figures=None)``, in the tour's order.
CHAPTERS = {name: module.run for name, module in _MODULES.items()}

#: Chapter name -> the names (without ``.png``) of the figures it writes.
FIGURES = {name: module.FIGURES for name, module in _MODULES.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m pyro_ext.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--chapter",
        choices=sorted(CHAPTERS),
        action="append",
        help="run only these chapters (default: all)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    figures_group = parser.add_mutually_exclusive_group()
    figures_group.add_argument(
        "--figures",
        metavar="DIR",
        default=DEFAULT_FOLDER,
        help=f"folder for the PNG figures, created if missing (default: ./{DEFAULT_FOLDER})",
    )
    figures_group.add_argument(
        "--no-figures", action="store_true", help="draw no figures, write no files"
    )
    args = parser.parse_args(argv)
    figures = skipped = None
    if not args.no_figures:
        try:
            figures = Figures(args.figures)
        except ImportError:
            skipped = f"Figures skipped: matplotlib is not installed ({INSTALL_HINT})."
    # The tour's models are small: intra-op threads only add synchronisation, which costs
    # up to 10x on a busy machine (ACRA's many small tensor ops).
    torch.set_num_threads(1)
    pyro.set_rng_seed(0)
    for name in args.chapter or CHAPTERS:
        CHAPTERS[name](quick=args.quick, figures=figures)
    if figures is not None:
        count = len(figures.written)
        print(
            f"Figures written to {figures.folder.resolve()} "
            f"({count} PNG file{'' if count == 1 else 's'})"
        )
    elif skipped:
        print(skipped)
