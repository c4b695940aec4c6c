import math

import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO

from pyro_ext.models.vae import CVAE, VAE, importance_log_likelihood, refined_mean_proposal


def _quadrature_log_likelihood(vae, x, grid=4001, width=10.0):
    """log p(x) = log ∫ p(x | z) N(z; 0, 1) dz by the trapezoid rule, for a 1-d latent."""
    z = torch.linspace(-width, width, grid, dtype=x.dtype, device=x.device)[:, None, None]
    log_joint = vae.log_joint(x, z.expand(grid, x.shape[0], 1))  # (grid, batch)
    dz = 2 * width / (grid - 1)
    weights = torch.full((grid, 1), math.log(dz), dtype=x.dtype, device=x.device)
    weights[0] = weights[-1] = math.log(dz / 2)
    return (log_joint + weights).logsumexp(0)


def test_importance_estimate_matches_quadrature(device):
    torch.manual_seed(0)
    vae = VAE(x_dim=5, z_dim=1, hidden=8).double().to(device)
    x = (torch.rand(4, 5, dtype=torch.float64, device=device) < 0.5).double()
    exact = _quadrature_log_likelihood(vae, x)
    with torch.no_grad():
        estimate = vae.log_likelihood(x, num_samples=20000, chunk_size=5000)
    # An untrained encoder is a poor but valid proposal: with 2e4 draws the estimate is
    # within a few hundredths of a nat (its bias is -Var(w)/(2 S E[w]^2)).
    assert torch.allclose(estimate, exact, atol=0.05), (estimate, exact)


def test_refined_mean_proposal_is_a_valid_proposal(device):
    torch.manual_seed(3)
    vae = VAE(x_dim=5, z_dim=1, hidden=8).double().to(device)
    x = (torch.rand(4, 5, dtype=torch.float64, device=device) < 0.5).double()
    loc, scale = vae.encode(x)
    with torch.no_grad():
        # No steps: exactly the encoder's Gaussian.
        z0, log_q0 = refined_mean_proposal(lambda z: vae.log_joint(x, z), loc, scale, 0.05, 0)(2)
        assert torch.allclose(log_q0, torch.distributions.Normal(loc, scale).log_prob(z0).sum(-1))
        # Five steps: still a proper proposal, so importance sampling recovers log p(x).
        draw = refined_mean_proposal(lambda z: vae.log_joint(x, z), loc, scale, 0.05, 5)
        estimate = vae.log_likelihood(x, 20000, chunk_size=5000, proposal=lambda _x, n: draw(n))
    assert torch.allclose(estimate, _quadrature_log_likelihood(vae, x), atol=0.05)


# In the integration run (`make test-integration`, CI): 150 SVI steps of 20 particles and a
# 2,000-sample importance estimate (about 17 s of CPU).
@pytest.mark.integration
def test_elbo_is_below_the_importance_estimate():
    torch.manual_seed(1)
    x = (torch.rand(64, 12) < 0.3).float()
    vae = VAE(x_dim=12, z_dim=2, hidden=16)
    svi = SVI(vae.model, vae.guide, pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO(num_particles=20))
    first = svi.evaluate_loss(x)
    for _ in range(150):
        svi.step(x, subsample_size=32)
    elbo = -svi.evaluate_loss(x) / x.shape[0]
    assert -first / x.shape[0] < elbo  # training improves the bound
    log_likelihood = vae.log_likelihood(x, num_samples=2000).mean()
    assert elbo <= log_likelihood + 0.05


def test_model_and_guide_share_the_subsample_and_train():
    # The default run's check of VAE.model and VAE.guide under SVI
    # (test_elbo_is_below_the_importance_estimate, in the integration run, trains them).
    x = (torch.rand(16, 12) < 0.3).float()
    vae = VAE(x_dim=12, z_dim=2, hidden=8)
    guide = pyro.poutine.trace(vae.guide).get_trace(x, subsample_size=5)
    model = pyro.poutine.trace(pyro.poutine.replay(vae.model, trace=guide)).get_trace(
        x, subsample_size=5
    )
    idx = guide.nodes["data"]["value"]
    assert guide.nodes["z"]["value"].shape == (5, 2) and idx.shape == (5,)
    assert torch.equal(model.nodes["data"]["value"], idx)
    assert torch.equal(model.nodes["x"]["value"], x[idx]) and model.nodes["x"]["is_observed"]
    assert torch.equal(model.nodes["z"]["value"], guide.nodes["z"]["value"])
    svi = SVI(vae.model, vae.guide, pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())
    before = {name: p.detach().clone() for name, p in pyro.get_param_store().named_parameters()}
    assert math.isfinite(svi.step(x, subsample_size=5))
    after = dict(pyro.get_param_store().named_parameters())
    assert {n.split("$$$")[0] for n in after} == {"encoder", "decoder"}
    assert all(not torch.equal(before[n], after[n]) for n in before)


def test_cvae_classifier_learns_class_patterns():
    torch.manual_seed(2)
    num, x_dim = 200, 10
    y = torch.randint(2, (num,))
    prototypes = torch.tensor([[0.9] * 5 + [0.1] * 5, [0.1] * 5 + [0.9] * 5])
    x = torch.bernoulli(prototypes[y])
    cvae = CVAE(x_dim=x_dim, z_dim=2, hidden=16, num_classes=2)
    svi = SVI(cvae.model, cvae.guide, pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())
    for _ in range(300):
        svi.step(x, y, subsample_size=50)
    scores = cvae.classify(x, num_samples=50)
    assert scores.shape == (num, 2)
    accuracy = (scores.argmax(-1) == y).float().mean()
    assert accuracy > 0.95


def test_importance_log_likelihood_checks_shapes():
    with pytest.raises(ValueError, match="proposal draws"):
        importance_log_likelihood(lambda z: z.sum(-1), (torch.zeros(3, 2), torch.zeros(3)))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: VAE(x_dim=0), "x_dim must be an integer >= 1, got 0"),
        (lambda: CVAE(num_classes=0), "num_classes must be an integer >= 1, got 0"),
        (lambda: VAE(x_dim=4).model(torch.zeros(3, 5)), "x must be a tensor of shape"),
        (
            lambda: VAE(x_dim=4).log_likelihood(torch.zeros(3, 4), num_samples=0),
            "num_samples must be an integer >= 1, got 0",
        ),
        (
            lambda: VAE(x_dim=4).log_likelihood(torch.zeros(3, 4), chunk_size=-1),
            "chunk_size must be an integer >= 1, got -1",
        ),
        (
            lambda: CVAE(x_dim=4, num_classes=2).model(torch.zeros(3, 4), torch.tensor([0, 1, 2])),
            "labels",
        ),
    ],
)
def test_bad_input_is_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: VAE(z_dim=1.5), "z_dim must be an integer >= 1"),
        (lambda: VAE(hidden=True), "hidden must be an integer >= 1"),
        (lambda: CVAE(num_classes="10"), "num_classes must be an integer >= 1"),
        (
            lambda: VAE(x_dim=4).log_likelihood(torch.zeros(3, 4), num_samples=10.0),
            "num_samples must be an integer >= 1",
        ),
        (
            lambda: VAE(x_dim=4).log_likelihood(torch.zeros(3, 4), chunk_size=None),
            "chunk_size must be an integer >= 1",
        ),
    ],
)
def test_wrong_types_are_type_errors(make, match):
    with pytest.raises(TypeError, match=match):
        make()
