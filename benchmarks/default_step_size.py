"""
The default step size of the SG-MCMC kernels (issue 30, item 9): ``SGLD(model)``,
``SGHMC(model)``, ``AdamSGLD(model)`` with no ``step_size``. The warm-up sets the largest
step whose stationary variance error on the posterior's local Gaussian approximation is
``bias_tolerance`` (0.05) in the stiffest direction, minibatch noise and repulsion
included (``pyro_ext.infer.sgmcmc.adaptation``), raises it where a typical direction would
not mix within the kept steps (``bias_bound="auto"``), and freezes it when warm-up ends.

1. Simulation-based calibration at the default step: 200 normal means with N(0, 1) priors
   and 4 observations each (posterior sd 0.45, no minibatch), L = 10, 500 warm-up steps
   and 1000 draws thinned by 100 (``normal_means_sbc``, as in ``calibration.py`` section
   3). Pass: rank p-value > 0.001 and the moments within 4 standard errors, plus the
   stated 0.05 on E[z^2].
2. A minibatched conjugate posterior: y_i ~ N(mu, 1), N = 2000, minibatch 100, prior
   N(0, 10^2); the minibatch-gradient variance (about 3.8e4) is 19 times the curvature
   (2000). L = 20 particles, 1500 warm-up steps and 6000 draws; the step the default
   chose, the variance its stationary law has in theory at that step (the kernel's linear
   recursion with this model's exact curvature and gradient noise), the sampled variance
   over the exact one (1 is exact) with a batch-means standard error (5 blocks of the
   particle-averaged series: the particles share minibatches, so their chains are
   correlated), the mean's error in posterior sd, and the same kernel at a step a user
   would guess from the curvature alone (2e-5, the demo's).
3. The README's first example as written (its synthetic logistic regression, N = 1000,
   D = 5, minibatch 500, 20 particles, 1000 warm-up steps + 4000 draws): max split-R-hat
   over particles and the seconds. And the breast-cancer logistic regression of the issue
   (scikit-learn's 569 rows, 30 standardised features, minibatch 100, 10 particles), where
   the minibatch noise along the stiffest direction is about 4 times its curvature and the
   condition number about 85: the default step, its stationary variance error in the
   stiffest direction, whether ``SlowMixingWarning`` fired, and max split-R-hat after 1000
   + 1000 and 5000 + 5000 steps, for SGLD and AdamSGLD, each with the default
   ``bias_bound="auto"`` and with ``"stiffest"`` (the bias bounded in every direction);
   then SGLD run as long as the 5000 + 5000 run's warning asks (5000 + 40 000).
"""

import math
import time
import warnings

import _common  # noqa: F401  (sets $PYRO_EXT_DATA's default)
import pyro
import pyro.distributions as dist
import torch
from _common import REPO, argument_parser, command_line_args, markdown, write_report
from pyro.ops.stats import split_gelman_rubin

from pyro_ext.infer import MCMC, SGHMC, SGLD, AdamSGLD, SlowMixingWarning
from pyro_ext.infer.calibration import (
    NORMAL_TAIL_MASS,
    minibatched_normal_mean,
    normal_means_sbc,
)
from pyro_ext.infer.sgmcmc.adaptation import stationary_variance_error

KERNELS = {
    "SGLD": lambda m, **kw: SGLD(m, **kw),
    "SGHMC": lambda m, **kw: SGHMC(m, **kw),
    "AdamSGLD": lambda m, **kw: AdamSGLD(m, **kw),
    "SGLD+R": lambda m, **kw: SGLD(m, repulsion="rbf", **kw),
    "SGHMC+R": lambda m, **kw: SGHMC(m, repulsion="rbf", **kw),
    "AdamSGLD+R": lambda m, **kw: AdamSGLD(m, repulsion="rbf", **kw),
}


def sbc_table(quick):
    rows = []
    for name, make in KERNELS.items():
        steps = []

        def make_kernel(model, make=make, steps=steps):
            kernel = make(model, num_particles=10)
            steps.append(kernel)
            return kernel

        start = time.perf_counter()
        result = normal_means_sbc(
            make_kernel,
            num_samples=200 if quick else 1000,
            warmup_steps=100 if quick else 500,
            thin=100,
            num_replications=20 if quick else 200,
        )
        seconds = time.perf_counter() - start
        rows.append(
            [
                name,
                f"{steps[-1].step_size_adaptation.step_size:.4f}",
                f"{result.p_value:.3f}",
                f"{result.mean:+.3f} ± {result.mean_se:.3f}",
                f"{result.mean_square:.3f} ± {result.mean_square_se:.3f}",
                f"{result.tail_mass:.4f} ± {result.tail_mass_se:.4f}",
                "yes" if result.p_value > 1e-3 and result.moments_agree(bias=0.05) else "**no**",
                f"{seconds:.0f}",
            ]
        )
        print(rows[-1])
    header = ["kernel", "default step", "rank p-value", "E[z]", "E[z²]", "P(|z|>2)", "pass", "s"]
    return (
        "## 1. Simulation-based calibration at the default step, 200 normal means, L = 10\n\n"
        f"Exact: p-value uniform, E[z] = 0, E[z²] = 1 (the default allows 1.05), "
        f"P(|z| > 2) = {NORMAL_TAIL_MASS:.4f}.\n\n" + markdown(header, rows)
    )


def predicted_ratio(kernel, target, step_size):
    """1 + the exact stationary variance error of ``kernel`` at ``step_size`` on ``target``
    (its curvature and minibatch-gradient variance known in closed form; AdamSGLD in each
    particle's frozen mass, the largest)."""
    curvature, noise = target.curvature, target.gradient_noise
    masses = [1.0]
    if isinstance(kernel, AdamSGLD):
        state = kernel.state_dict()["state"]
        moment = state["second_moment"] / (1 - kernel.betas[1] ** state["count"])
        masses = (moment.sqrt() + kernel.eps).flatten().tolist()
    friction = kernel.adaptation_friction
    return 1 + max(
        stationary_variance_error(step_size, curvature / m, noise / m, friction) for m in masses
    )


def stream_table(quick):
    target = minibatched_normal_mean()
    model, x, mean, sd = target.model, target.data, target.posterior_mean, target.posterior_sd
    warmup, draws = (300, 300) if quick else (1500, 6000)
    rows = []
    for name, make in list(KERNELS.items())[:3]:
        for step_size in (None, 2e-5):
            pyro.set_rng_seed(0)
            kernel = make(model, step_size=step_size, num_particles=20)
            mcmc = MCMC(kernel, num_samples=draws, warmup_steps=warmup, disable_progbar=True)
            start = time.perf_counter()
            mcmc.run(x)
            seconds = time.perf_counter() - start
            chains = mcmc.get_samples(group_by_chain=True)["mu"]
            # The particles share each minibatch, so their chains are correlated: batch
            # means of the particle-averaged series, in 5 blocks of 1200 steps (about 6
            # autocorrelation times at the default step).
            series = ((chains - mean) / sd).square().mean(0)
            blocks = series.reshape(5, -1).mean(-1)
            ratio, se = float(blocks.mean()), float(blocks.std() / math.sqrt(blocks.numel()))
            chosen = kernel.diagnostics()["step_size"]
            rows.append(
                [
                    name,
                    "default" if step_size is None else f"{step_size:g} (given)",
                    f"{chosen:.2e}",
                    f"{predicted_ratio(kernel, target, chosen):.3f}",
                    f"{ratio:.3f} ± {se:.3f}",
                    f"{float((chains.mean() - mean) / sd):+.2f}",
                    f"{seconds:.1f}",
                ]
            )
            print(rows[-1])
    header = [
        "kernel",
        "step size",
        "step used",
        "variance / exact at that step (theory)",
        "variance / exact (sampled)",
        "mean error (sd)",
        "s",
    ]
    return (
        f"## 2. Minibatched conjugate posterior (N = 2000, minibatch 100), L = 20, "
        f"{warmup} + {draws} steps\n\n"
        "Exact: variance ratio 1, mean error 0; the default allows 1.05. Theory: the exact "
        "stationary variance of the kernel's linear recursion at the step used, with this "
        "model's curvature and minibatch-gradient variance (`stationary_variance_error`, "
        "checked against simulation in the tests).\n\n" + markdown(header, rows)
    )


def readme_data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1000, 5, generator=generator)
    w = torch.tensor([1.0, -2.0, 0.5, 0.0, 1.5])
    y = torch.bernoulli(torch.sigmoid(x @ w), generator=generator)
    return x, y, 500


def breast_cancer_data():
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32)
    return (x - x.mean(0)) / x.std(0), torch.tensor(y, dtype=torch.float32), 100


def logistic_model(subsample_size):
    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
        with pyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
            pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=None if y is None else y[idx])

    return model


def convergence_table(quick):
    rows = []
    runs = [("README example", readme_data, "SGLD", 20, 1000, 4000, "auto")]
    for steps in (1000,) if quick else (1000, 5000):
        runs += [
            ("breast cancer", breast_cancer_data, k, 10, steps, steps, bound)
            for k in ("SGLD", "AdamSGLD")
            for bound in ("auto", "stiffest")
        ]
    if not quick:
        # As long as the 5000 + 5000 run's SlowMixingWarning asks (about 33 500 kept steps).
        runs.append(("breast cancer", breast_cancer_data, "SGLD", 10, 5000, 40000, "auto"))
    for data_name, data, name, num_particles, warmup, draws, bound in runs:
        if quick:
            warmup, draws = min(warmup, 200), min(draws, 200)
        x, y, subsample_size = data()
        pyro.set_rng_seed(0)
        kernel = KERNELS[name](
            logistic_model(subsample_size), num_particles=num_particles, bias_bound=bound
        )
        mcmc = MCMC(kernel, num_samples=draws, warmup_steps=warmup, disable_progbar=True)
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always", SlowMixingWarning)
            mcmc.run(x, y)
        seconds = time.perf_counter() - start
        warned = any(w.category is SlowMixingWarning for w in record)
        chains = mcmc.get_samples(group_by_chain=True)["w"]
        r_hat = float(split_gelman_rubin(chains, chain_dim=0, sample_dim=1).max())
        diagnostics = kernel.diagnostics()
        rows.append(
            [
                data_name,
                name,
                f"`{bound}`" + (" (default)" if bound == "auto" else ""),
                str(num_particles),
                f"{warmup} + {draws}",
                f"{diagnostics['step_size']:.2e}",
                f"{diagnostics['stiffest_variance_error']:.3f}",
                "yes" if warned else "no",
                f"{r_hat:.3f}",
                f"{seconds:.0f}",
            ]
        )
        print(rows[-1])
    header = [
        "data",
        "kernel",
        "bias_bound",
        "L",
        "warm-up + draws",
        "default step",
        "variance error, stiffest direction",
        "SlowMixingWarning",
        "max split-R̂",
        "s",
    ]
    return (
        "## 3. Convergence as written: max split-R̂ over particles (< 1.05 is converged)\n\n"
        '`bias_bound="stiffest"` holds the variance error to 0.05 in the stiffest direction; '
        'the default `"auto"` raises the step above that where a typical direction would not '
        "relax 100 times within the kept steps, up to an error of 0.05 on average over "
        "directions (the column gives what that costs in the stiffest direction); where even "
        "that step cannot, `SlowMixingWarning` says how many steps to keep.\n\n"
        + markdown(header, rows)
    )


def main():
    parser = argument_parser(
        __doc__, output=REPO / "benchmarks" / "results" / "default_step_size.md"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    preamble = (
        "# The default step size\n\n"
        f"`python benchmarks/default_step_size.py {command_line_args()}`, one torch thread. "
        f"torch {torch.__version__}. Regenerated by that command; the protocol is the "
        "script's docstring."
    )
    sections = [sbc_table(args.quick), stream_table(args.quick), convergence_table(args.quick)]
    write_report(preamble, sections, args.output)


if __name__ == "__main__":
    main()
