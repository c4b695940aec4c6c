"""Chapter ``bnn``: Bayesian neural networks on a UCI regression split (thesis 1.3, 2.3.3)."""

import time

import pyro

from pyro_ext.demo._common import plot_bnn_predictive, print_bnn_scores
from pyro_ext.infer import MCMC, SGLD, AdamSGLD

FIGURES = ("bnn_predictive",)


def run(quick=False, figures=None):
    """Thesis 2.3.3: a 50-unit Bayesian neural network on a UCI regression split."""
    from pyro_ext.datasets import load_uci, standardize_split
    from pyro_ext.models import BayesianMLP

    print("== Chapter: Bayesian neural networks (thesis 1.3, 2.3.3) ==")
    data, y_mean, y_std = standardize_split(load_uci("yacht", 0))
    x, y, num_particles = data.x_train, data.y_train, 20
    n = x.shape[0]
    iterations = 600 if quick else 2000
    print(
        f"  yacht split 0 ({n} train / {data.x_test.shape[0]} test rows), in-50-1 ReLU BNN, "
        f"{num_particles} particles, batch 100, {iterations} iterations, second half kept"
    )

    def common(net):
        return dict(
            num_particles=num_particles, jit_compile=True, init_strategy=net.init_strategy(x, y)
        )

    # Steps: benchmarks/uci.py's choice for yacht on validation folds. Repulsion averages
    # the drift over the particles, so SGLD+R's step is written as L times a per-particle
    # step, and Adam+NR's (whose velocity passes through the average twice) as L^2 times.
    samplers = {
        "SGLD": lambda net: SGLD(net, 1e-2 / n, **common(net)),
        "SGLD+R": lambda net: SGLD(net, 3e-2 / n * num_particles, repulsion="rbf", **common(net)),
        "AdamSGLD": lambda net: AdamSGLD(net, 1e-3, **common(net)),
        "Adam+NR": lambda net: AdamSGLD(
            net, 3e-4 * num_particles**2, repulsion="rbf", **common(net)
        ),
    }

    fits = {}
    for name, make in samplers.items():
        pyro.set_rng_seed(0)
        net = BayesianMLP(x.shape[1], hidden=(50,), full_output=False)
        mcmc = MCMC(
            make(net),
            num_samples=iterations // 20,
            warmup_steps=iterations // 2,
            thinning=10,
            disable_progbar=True,
        )
        start = time.perf_counter()
        mcmc.run(x, y, subsample_size=100)
        elapsed = time.perf_counter() - start
        fits[name] = net, mcmc.get_samples()
        print_bnn_scores(name, net, fits[name][1], data, y_std, f"{elapsed:.1f} s")
    print(
        "    (thesis table 2.3/2.4, 20 splits: SGLD 0.94 / -1.21, SGLD+R 0.89 / -1.17; "
        "results/uci_thesis_protocol.md has all nine data sets)"
    )
    if figures is not None:
        plot_bnn_predictive(
            figures,
            "bnn_predictive",
            "yacht split 0, test rows: SG-MCMC posterior predictive of the BNN",
            fits,
            data,
            y_mean,
            y_std,
        )
