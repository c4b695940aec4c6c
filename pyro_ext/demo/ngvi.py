"""Chapter ``ngvi``: natural-gradient variational inference (IVON, VOGN) for a BNN."""

import time

import pyro

from pyro_ext.demo._common import plot_bnn_predictive, print_bnn_scores

FIGURES = ("ngvi_predictive",)


def run(quick=False, figures=None):
    """Natural-gradient VI (IVON, VOGN) for the BNN of the ``bnn`` chapter, beside SGLD."""
    from pyro_ext.datasets import load_uci, standardize_split
    from pyro_ext.infer import NaturalGradientVI
    from pyro_ext.models import BayesianMLP

    print("== Chapter: natural-gradient variational inference (IVON, VOGN) ==")
    data, y_mean, y_std = standardize_split(load_uci("yacht", 0))
    x, y = data.x_train, data.y_train
    steps = 600 if quick else 2000
    print(
        f"  yacht split 0, in-50-1 ReLU BNN, batch 100, {steps} steps; mean-field Gaussian "
        "posterior, test metrics from 100 posterior draws"
    )
    runs = {
        "IVON": dict(method="ivon"),
        "VOGN": dict(method="vogn"),
    }
    fits = {}
    for name, options in runs.items():
        pyro.set_rng_seed(0)
        net = BayesianMLP(x.shape[1], hidden=(50,), full_output=False)
        vi = NaturalGradientVI(net, init_loc_fn=net.init_strategy(x, y), **options)
        start = time.perf_counter()
        for _ in range(steps):
            vi.step(x, y, subsample_size=100)
        elapsed = time.perf_counter() - start
        timing = f"{elapsed:.1f} s, {elapsed / steps * 1e3:.2f} ms per step"
        fits[name] = net, vi.sample_posterior(100)
        print_bnn_scores(name, net, fits[name][1], data, y_std, timing)
    print("    (the bnn chapter samples the same network with SGLD, SGLD+R and Adam+NR)")
    if figures is not None:
        plot_bnn_predictive(
            figures,
            "ngvi_predictive",
            "yacht split 0, test rows: mean-field Gaussian posterior predictive of the BNN",
            fits,
            data,
            y_mean,
            y_std,
        )
