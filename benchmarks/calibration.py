"""
Calibration of the SG-MCMC kernels (issue 30): is each sampler's stationary law its target?

1. The repulsive SGLD+R of thesis eq. (2.7)-(2.8) with the RBF kernel and its median
   bandwidth, on a 1-D N(0, 1): E[z^2] (exact: 1) and P(|z| > 2) (exact: 0.0455) over
   independent ensembles of L particles, the bandwidth's dependence on the particles held
   constant in the divergence term (as before this fix, and as SVGD does) against the exact
   divergence (``pyro_ext.infer.RBFKernel``'s default). Ensembles start at the target, run
   4 / step burn-in steps and average 24 / step steps; errors are standard errors across
   ensembles (``repulsive_ensemble_moments``). L = 10 with 400 ensembles at steps 0.1 to
   0.0025; L = 50 with 100 ensembles at 0.1 and 0.025 (its smaller steps take hours on 2
   cores).
2. Mixing, the same 1-D target at step 0.05: the per-particle effective step (1 - lag-one
   autocorrelation, divided by the step: 1 for SGLD) and the effective sample size per
   particle and step (Pyro's ESS over all particles as chains), SGLD against SGLD+R, L = 10,
   50, 200 (2000 / L ensembles, at least 5, of 3000 steps).
   ``--bnn`` (written to ``results/calibration_bnn.md``): the same comparison on a
   Bayesian neural network's posterior, ``BayesianMLP(1, hidden=(16,))`` (ReLU, N(0, 1)
   priors, Gaussian likelihood with a sampled noise precision) on 64 points of ``y =
   sin(2x) + 0.1 e``, full batch, L = 10, 50, 200, 1000 warm-up and 2000 kept steps at one
   step size for both samplers (SGLD's default at L = 10, from a pilot run) and at each
   kernel's own default. The scalars are the network's outputs at 5 test inputs in
   [-2, 2] (invariant to the network's permutation symmetries): the effective step is
   ``(1 - lag-one autocorrelation) / step`` per particle (each particle centred on its
   own mean, since a BNN's particles sit in different modes), the ESS Pyro's over the
   particles as chains, per particle and step, both averaged over the outputs.
3. Simulation-based calibration (Talts et al. 2018) of each kernel as a user runs it
   (``MCMC(kernel).run``): 200 normal means with N(0, 1) priors and 4 observations each
   (posterior sd 0.45), L = 10 particles, the rank of each true mean among 100 thinned
   draws (chi-square p-value of 20 bins), and E[z], E[z^2], P(|z| > 2) of the draws
   standardised by the exact posterior (``normal_means_sbc``). ``Gibbs`` runs on the same
   means with a two-component prior N(±2, 1) chosen by a discrete site, its draws
   standardised through the exact posterior's CDF. The step sizes are chosen
   per kernel so that the chains mix within the run; the stationary step-size bias of
   SGLD at step 0.004 is 1 / (1 - 0.004 / (2 * 0.2)) - 1 = 1 % on E[z^2].
"""

import time

from _common import REPO, argument_parser, command_line_args, markdown, write_report

from pyro_ext.infer.calibration import (
    NORMAL_TAIL_MASS,
    normal_means_sbc,
    repulsive_ensemble_moments,
)


def stationary_table(quick):
    # (L, ensembles, steps): L = 50 costs 25 times L = 10 per ensemble and step.
    plan = (
        [(10, 50, [0.1, 0.025])]
        if quick
        else [
            (10, 400, [0.1, 0.025, 0.01, 0.0025]),
            (50, 100, [0.1, 0.025]),
        ]
    )
    rows = []
    for num_particles, num_ensembles, steps in plan:
        for step_size in steps:
            cells = []
            for bandwidth_gradient in (False, True):
                start = time.perf_counter()
                moments = repulsive_ensemble_moments(
                    num_particles,
                    step_size,
                    num_ensembles=num_ensembles,
                    num_steps=int(4 / step_size) if quick else None,
                    burn_in=int(1 / step_size) if quick else None,
                    bandwidth_gradient=bandwidth_gradient,
                )
                seconds = time.perf_counter() - start
                cells += [
                    f"{moments.mean_square:.3f} ± {moments.mean_square_se:.3f}",
                    f"{moments.tail_mass:.4f} ± {moments.tail_mass_se:.4f}",
                ]
                print(
                    f"L={num_particles} step={step_size} exact={bandwidth_gradient} {seconds:.0f}s"
                )
            rows.append([num_particles, num_ensembles, step_size] + cells)
    header = [
        "L",
        "ensembles",
        "step",
        "E[z²], h held constant (before)",
        "P(|z|>2), before",
        "E[z²], exact (after)",
        "P(|z|>2), after",
    ]
    return (
        "## 1. SGLD+R's stationary law on N(0, 1), median bandwidth\n\n"
        f"Exact: E[z²] = 1, P(|z| > 2) = {NORMAL_TAIL_MASS:.4f}; mean ± standard error over "
        "independent ensembles.\n\n" + markdown(header, rows)
    )


def mixing_table(quick):
    step_size = 0.05
    rows = []
    for num_particles in [10] if quick else [10, 50, 200]:
        ensembles = 20 if quick else max(5, 2000 // num_particles)
        results = {}
        for name, repulsion in (("SGLD", False), ("SGLD+R", True)):
            results[name] = repulsive_ensemble_moments(
                num_particles,
                step_size,
                num_ensembles=ensembles,
                num_steps=200 if quick else 3000,
                burn_in=0,
                repulsion=repulsion,
            )
        plain, repulsive = results["SGLD"], results["SGLD+R"]
        rows.append(
            [
                num_particles,
                f"{plain.effective_step:.3f}",
                f"{repulsive.effective_step:.3f}",
                f"{repulsive.effective_step * num_particles:.2f}",
                f"{plain.ess_per_step:.4f}",
                f"{repulsive.ess_per_step:.5f}",
                f"{plain.ess_per_step / repulsive.ess_per_step:.1f}",
            ]
        )
    header = [
        "L",
        "effective step / step, SGLD",
        "SGLD+R",
        "SGLD+R × L",
        "ESS per particle and step, SGLD",
        "SGLD+R",
        "SGLD / SGLD+R",
    ]
    return (
        f"## 2. Mixing per particle on N(0, 1) at step {step_size}\n\n"
        "Effective step: (1 - lag-one autocorrelation) / step, 1 for SGLD. ESS: Pyro's "
        "effective sample size over all particles as chains, per particle and step.\n\n"
        + markdown(header, rows)
    )


def _bnn_data():
    import torch

    generator = torch.Generator().manual_seed(0)
    x = 4 * torch.rand(64, 1, generator=generator) - 2
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(64, generator=generator)
    return x, y, torch.linspace(-2, 2, 5).unsqueeze(-1)


def _bnn_run(num_particles, repulsion, step_size, warmup, num_samples, seed=0):
    """Outputs at the test inputs per particle and kept step ``(L, S, 5)``, the step used."""
    import pyro
    import torch

    from pyro_ext.infer import MCMC, SGLD
    from pyro_ext.models import BayesianMLP

    x, y, x_test = _bnn_data()
    pyro.set_rng_seed(seed)
    net = BayesianMLP(1, hidden=(16,))
    kernel = SGLD(net, step_size=step_size, num_particles=num_particles, repulsion=repulsion)
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup, disable_progbar=True)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SlowMixingWarning: what this table measures
        mcmc.run(x, y)
    grouped = mcmc.get_samples(group_by_chain=True)  # (L, S, ...)
    flat = {name: value.reshape((-1,) + value.shape[2:]) for name, value in grouped.items()}
    predictive = pyro.infer.Predictive(
        net, posterior_samples=flat, return_sites=("_RETURN",), parallel=True
    )
    with torch.no_grad():
        outputs = predictive(x_test)["_RETURN"].reshape(num_particles, num_samples, -1)
    used = step_size if step_size is not None else kernel.step_size_adaptation.step_size
    return outputs, used


def _mixing(outputs):
    """``1 - lag-one autocorrelation`` and ESS per particle and step of ``(L, S, K)``
    traces, averaged over the ``K`` scalars."""
    from pyro.ops.stats import effective_sample_size

    centred = outputs - outputs.mean(1, keepdim=True)
    lag_one = (centred[:, 1:] * centred[:, :-1]).mean(1) / centred.square().mean(1)
    num_particles, num_samples, _ = outputs.shape
    ess = effective_sample_size(outputs, chain_dim=0, sample_dim=1)
    return float((1 - lag_one).mean()), float(ess.mean()) / (num_particles * num_samples)


def bnn_mixing_table(quick):
    warmup, num_samples = (100, 200) if quick else (1000, 2000)
    sizes = [10] if quick else [10, 50, 200]
    # SGLD's default step at L = 10, for as many kept steps as the runs below (the default,
    # bias_bound="auto", lets a typical direction relax within them).
    _, common = _bnn_run(10, None, None, warmup, num_samples)
    rows = []
    for num_particles in sizes:
        for label, step in (("one step for both", common), ("each kernel's default", None)):
            measured = {}
            for name, repulsion in (("SGLD", None), ("SGLD+R", "rbf")):
                outputs, used = _bnn_run(num_particles, repulsion, step, warmup, num_samples)
                measured[name] = (used,) + _mixing(outputs)
            (s_step, s_move, s_ess), (r_step, r_move, r_ess) = measured["SGLD"], measured["SGLD+R"]
            rows.append(
                [
                    num_particles,
                    label,
                    f"{s_step:.2e} / {r_step:.2e}",
                    f"{s_move:.4f}",
                    f"{r_move:.4f}",
                    f"{r_move / s_move:.3f}",
                    f"{s_ess:.4f}",
                    f"{r_ess:.4f}",
                    f"{s_ess / r_ess:.1f}",
                ]
            )
    header = [
        "L",
        "step size",
        "step: SGLD / SGLD+R",
        "1 - lag-one autocorrelation, SGLD",
        "SGLD+R",
        "SGLD+R / SGLD",
        "ESS per particle and step, SGLD",
        "SGLD+R",
        "SGLD / SGLD+R",
    ]
    return (
        f"## Mixing per particle on a BNN posterior ({warmup} + {num_samples} steps)\n\n"
        "BayesianMLP(1, hidden=(16,)) on 64 points of sin(2x) + 0.1 e, full batch, float32. "
        "Scalars: the network's outputs at 5 test inputs. 1 - lag-one autocorrelation: per "
        "particle, each centred on its own mean, averaged; at one step for both samplers its "
        "ratio is SGLD+R's per-particle effective step over SGLD's. ESS: Pyro's over the "
        "particles as chains, per particle and step (low where particles sit in different "
        "modes). One step for both: SGLD's default at L = 10 "
        f"({common:.2e}).\n\n" + markdown(header, rows)
    )


def sbc_configs():
    """(name, kernel factory, mixture prior?)"""
    from pyro_ext.infer import SGHMC, SGLD, AdamSGLD, Gibbs

    L = 10
    configs = [
        ("SGLD", lambda m: SGLD(m, 0.004, num_particles=L)),
        ("SGLD+R", lambda m: SGLD(m, 0.02, num_particles=L, repulsion="rbf")),
        (
            "SGLD+R compiled",
            lambda m: SGLD(m, 0.02, num_particles=L, repulsion="rbf", jit_compile=True),
        ),
        ("SGHMC", lambda m: SGHMC(m, 0.001, friction=0.1, num_particles=L)),
        ("SGHMC+R", lambda m: SGHMC(m, 0.03, friction=0.1, num_particles=L, repulsion="rbf")),
        ("AdamSGLD", lambda m: AdamSGLD(m, 0.001, num_particles=L)),
        ("AdamSGLD+R (Adam+NR)", lambda m: AdamSGLD(m, 0.1, num_particles=L, repulsion="rbf")),
    ]
    gibbs = (
        "Gibbs(SGLD), mixture prior",
        lambda m: Gibbs(SGLD(m, 0.004, num_particles=L), discrete_sites=["component"]),
    )
    return [(name, make, False) for name, make in configs] + [(*gibbs, True)]


def sbc_table(quick):
    rows = []
    for name, make_kernel, mixture in sbc_configs():
        if quick and "compiled" in name:
            continue
        start = time.perf_counter()
        result = normal_means_sbc(
            make_kernel,
            num_samples=200 if quick else 1000,
            warmup_steps=100 if quick else 500,
            thin=100,
            num_replications=20 if quick else 200,
            mixture=mixture,
        )
        seconds = time.perf_counter() - start
        rows.append(
            [
                name,
                f"{result.p_value:.3f}",
                f"{result.mean:+.3f} ± {result.mean_se:.3f}",
                f"{result.mean_square:.3f} ± {result.mean_square_se:.3f}",
                f"{result.tail_mass:.4f} ± {result.tail_mass_se:.4f}",
                "yes" if result.moments_agree(bias=0.02) else "**no**",
                f"{seconds:.0f}",
            ]
        )
        print(rows[-1])
    header = [
        "kernel",
        "rank p-value",
        "E[z]",
        "E[z²]",
        "P(|z|>2)",
        "moments within 4 SE (+0.02 on E[z²])",
        "seconds",
    ]
    return (
        "## 3. Simulation-based calibration, 200 normal means, L = 10\n\n"
        "Exact: p-value uniform on (0, 1), E[z] = 0, E[z²] = 1, "
        f"P(|z| > 2) = {NORMAL_TAIL_MASS:.4f}.\n\n" + markdown(header, rows)
    )


def main():
    import torch

    parser = argument_parser(__doc__, output=REPO / "benchmarks" / "results" / "calibration.md")
    parser.add_argument(
        "--bnn",
        action="store_true",
        help="only the BNN mixing section, written to results/calibration_bnn.md",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.bnn:
        output = args.output
        if output == REPO / "benchmarks" / "results" / "calibration.md":
            output = REPO / "benchmarks" / "results" / "calibration_bnn.md"
        preamble = (
            "# SG-MCMC mixing on a BNN posterior\n\n"
            f"`python benchmarks/calibration.py {command_line_args()}`, one torch thread, "
            "float32. Regenerated by that command; the protocol is the script's docstring."
        )
        write_report(preamble, [bnn_mixing_table(args.quick)], output)
        return
    preamble = (
        "# SG-MCMC calibration\n\n"
        f"`python benchmarks/calibration.py {command_line_args()}`, one torch thread, float64."
        " Regenerated by that command; the protocol is the script's docstring."
    )
    sections = [stationary_table(args.quick), mixing_table(args.quick), sbc_table(args.quick)]
    write_report(preamble, sections, args.output)


if __name__ == "__main__":
    main()
