"""Chapter ``online``: online variational Bayes (BONG, LoFi, WoLF) on streams."""

import math
import time

import pyro
import pyro.distributions as dist
import torch

FIGURES = ("online_two_moons", "online_outliers")


def run(quick=False, figures=None):
    """Online variational Bayes: BONG / LoFi filters on a stream, WoLF against outliers."""
    from pyro.infer.autoguide.initialization import init_to_sample

    from pyro_ext.online import BONG, LoFi, WoLF

    print("== Chapter: online Bayesian learning (BONG, LoFi, WoLF) ==")
    generator = torch.Generator().manual_seed(0)

    def two_moons(n):
        label = torch.randint(2, (n,), generator=generator)
        angle = torch.rand(n, generator=generator) * math.pi
        x = torch.stack([torch.cos(angle), torch.sin(angle)], -1)
        x = torch.where(label.unsqueeze(-1) == 1, torch.tensor([1.0, 0.5]) - x, x)
        return x + 0.15 * torch.randn(n, 2, generator=generator), label.float()

    hidden = 16

    def mlp(x, y=None):
        w1 = pyro.sample("w1", dist.Normal(0.0, 1.0).expand([2, hidden]).to_event(2))
        b1 = pyro.sample("b1", dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
        w2 = pyro.sample("w2", dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
        b2 = pyro.sample("b2", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0]):
            logits = torch.tanh(x @ w1 + b1) @ w2 + b2
            pyro.sample("y", dist.Bernoulli(logits=logits), obs=y)

    num = 300 if quick else 1000
    x, y = two_moons(num)
    x_test, y_test = two_moons(1000)
    checkpoints = (10, 100, num)
    print(
        f"  two moons streamed one point at a time through a 2-{hidden}-1 tanh BNN "
        f"({2 * hidden + 2 * hidden + 1} weights, N(0, 1) priors); test error of the "
        "linearised predictive on 1000 points after"
    )
    # A network's Jacobian vanishes at its zero prior mean: each filter starts at a prior
    # draw instead (the belief is the prior's covariance around it).
    filters = {
        "BONG full": lambda: BONG(mlp, init_strategy=init_to_sample),
        "BONG diag": lambda: BONG(mlp, family="diag", init_strategy=init_to_sample),
        "LoFi rank 10": lambda: LoFi(mlp, rank=10, init_strategy=init_to_sample),
    }
    beliefs = {}
    for name, make in filters.items():
        pyro.set_rng_seed(0)
        belief = make()
        errors = []
        start = time.perf_counter()
        for t in range(num):
            belief.update(x[t : t + 1], y[t : t + 1])
            if t + 1 in checkpoints:
                probs, _ = belief.predictive(x_test)
                errors.append(((probs > 0.5).float() != y_test).float().mean().item())
        elapsed = (time.perf_counter() - start) / num * 1e3
        row = ", ".join(f"{n} points {e:.3f}" for n, e in zip(checkpoints, errors))
        print(f"    {name:>12}: {row} ({elapsed:.1f} ms per point)")
        beliefs[name] = belief, errors[-1]

    if figures is not None:
        with figures.figure("online_two_moons", 1, len(beliefs), panel_size=(4.0, 3.4)) as axes:
            grid = torch.linspace(-1.6, 2.6, 60), torch.linspace(-1.2, 1.7, 45)
            gx, gy = torch.meshgrid(*grid, indexing="xy")
            points = torch.stack([gx.reshape(-1), gy.reshape(-1)], -1)
            for ax, (name, (belief, error)) in zip(axes, beliefs.items()):
                probs, _ = belief.predictive(points)
                contour = ax.contourf(
                    gx, gy, probs.reshape(gx.shape), levels=10, cmap="RdBu_r", vmin=0, vmax=1
                )
                for label, marker, face, edge in ((0, "o", "w", "k"), (1, "^", "k", "w")):
                    mine = y == label
                    ax.scatter(x[mine, 0], x[mine, 1], s=9, marker=marker, c=face, ec=edge, lw=0.4)
                ax.set_title(f"{name}: test error {error:.3f}")
                ax.set_xlabel("x[0]")
            axes[0].set_ylabel("x[1]")
            axes[0].figure.colorbar(contour, ax=axes, label="predictive P(y = 1)")
            axes[0].figure.suptitle(
                f"two moons, {num} points streamed once (o: y = 0, ^: y = 1): linearised predictive"
            )

    dim, noise, n = 5, 0.3, 300 if quick else 1000
    w = torch.randn(dim, generator=generator)
    x = torch.randn(n, dim, generator=generator)
    y = x @ w + noise * torch.randn(n, generator=generator)
    outlier = torch.rand(n, generator=generator) < 0.15
    y = torch.where(outlier, torch.rand(n, generator=generator) * 100 - 50, y)

    def regression(x, y=None):
        weights = pyro.sample("w", dist.Normal(torch.zeros(dim), 1.0).to_event(1))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(x @ weights, noise), obs=y)

    print(
        f"  linear regression streamed with {int(outlier.sum())} of {n} targets replaced by "
        "uniform draws in (-50, 50): error of the posterior mean weights, |mean - truth|"
    )
    paths = {}
    for name, belief in {
        "Kalman (BONG)": BONG(regression),
        "WoLF, c = 4 sd": WoLF(regression, c=4 * noise),
    }.items():
        path = paths[name] = []
        for t in range(n):
            belief.update(x[t : t + 1], y[t : t + 1])
            if figures is not None:
                path.append((belief.mean - w).norm().item())
        print(f"    {name:>14}: {(belief.mean - w).norm().item():.3f}")

    if figures is not None:
        with figures.figure("online_outliers", panel_size=(7.0, 3.8)) as ax:
            step = torch.arange(1, n + 1)
            for name, path in paths.items():
                ax.semilogy(step, path, label=name)
            for t in torch.nonzero(outlier)[:, 0].tolist():
                ax.axvline(t + 1, color="grey", lw=0.3, alpha=0.4)
            ax.set_xlabel("points seen (grey: an outlier)")
            ax.set_ylabel("|posterior mean - true weights|")
            ax.set_title(
                f"linear regression, {int(outlier.sum())} of {n} targets replaced by outliers"
            )
            ax.legend()
