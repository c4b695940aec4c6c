import math

import pyro
import pytest
import torch

from pyro_ext.ara.acra import ACRA, RandomWordInsertionAttack, beta_concentrations
from pyro_ext.ara.naive_bayes import BernoulliNaiveBayes
from pyro_ext.ara.words import attack_candidates, good_word_insertion
from pyro_ext.datasets import load_spambase

NUM_FEATURES = 5


def all_rows(device):
    return torch.cartesian_prod(*[torch.tensor([0.0, 1.0], device=device)] * NUM_FEATURES)


@pytest.fixture
def toy_nb(device):
    """A naive Bayes whose posteriors are far from 0 and 1, on 5 binary words."""
    spam_rate = torch.tensor([0.7, 0.2, 0.6, 0.3, 0.5], device=device)
    ham_rate = torch.tensor([0.3, 0.6, 0.4, 0.5, 0.2], device=device)
    y = (torch.rand(400, device=device) < 0.4).long()
    rates = torch.where(y.bool().unsqueeze(-1), spam_rate, ham_rate)
    x = (torch.rand(400, NUM_FEATURES, device=device) < rates).float()
    return BernoulliNaiveBayes().fit(x.double(), y)


def test_beta_concentrations_match_moments():
    logit = torch.tensor([-30.0, -2.0, 0.0, 1.5, 15.0], dtype=torch.float64)
    r = torch.sigmoid(logit)
    for var in (0.01, 0.1, 1.0):
        a, b = beta_concentrations(logit, var)
        mean, variance = a / (a + b), a * b / ((a + b) ** 2 * (a + b + 1))
        max_variance = r * torch.minimum(r * (1 - r) / (1 + r), (1 - r) ** 2 / (2 - r))
        assert torch.allclose(mean, r, rtol=1e-9)
        assert torch.allclose(variance, var * max_variance, rtol=1e-6)
        assert (torch.minimum(a, b) >= 1 - 1e-9).all()  # unimodal
    assert torch.allclose(torch.minimum(*beta_concentrations(logit, 1.0)), torch.ones(5).double())


@pytest.mark.parametrize("var", [0.05, 0.5])
def test_exact_probabilities_sum_to_one_and_match_monte_carlo(var, device):
    weights = torch.tensor([0.8, -1.5, -0.7, 0.4], device=device)
    x = torch.tensor([1.0, 0, 0, 0], device=device)
    attack = RandomWordInsertionAttack(x, lambda z: torch.sigmoid(z @ weights + 1.0), n=2, var=var)
    candidates = attack_candidates(x, 2)
    probs = attack.log_prob(candidates).exp()
    assert probs.shape == (candidates.shape[0],)
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-4)
    for candidate, prob in zip(candidates, probs):
        estimate, stderr = attack.mc_probability(candidate, num_samples=20000)
        assert abs(estimate - prob) <= 4 * stderr + 1e-4
    # Unreachable observations have probability 0.
    assert attack.log_prob(torch.tensor([0.0, 1, 0, 0], device=device)) == -math.inf


def test_sample_and_batching(device):
    weights = torch.tensor([0.8, -1.5, -0.7, 0.4], device=device)
    x = torch.tensor([[1.0, 0, 0, 0], [0, 1, 1, 0]], device=device)
    attack = RandomWordInsertionAttack(x, lambda z: torch.sigmoid(z @ weights), n=1, var=0.3)
    samples = attack.sample((3,))
    assert samples.shape == (3, 2, 4)
    assert ((samples >= x) & ((samples - x).sum(-1, keepdim=True) <= 1)).all()
    assert attack.log_prob(samples).shape == (3, 2)
    assert attack.expand((4, 2)).batch_shape == (4, 2)
    estimate, stderr = attack.mc_probability(x, num_samples=10)
    assert estimate.shape == stderr.shape == (2,)
    with pytest.raises(ValueError, match="num_samples must be an integer >= 1, got 0"):
        attack.mc_probability(x, num_samples=0)
    with pytest.raises(TypeError, match="num_samples must be an integer >= 1"):
        attack.mc_probability(x, num_samples=10.0)


def test_small_variance_is_the_deterministic_attacker(device):
    weights = torch.tensor([0.8, -1.5, -0.7, 0.4], device=device)
    predict_proba = lambda z: torch.sigmoid(z @ weights)  # noqa: E731
    x = torch.tensor([[1.0, 0, 0, 0]], device=device)
    best = good_word_insertion(x, predict_proba, 2)[0]
    attack = RandomWordInsertionAttack(x[0], predict_proba, n=2, var=1e-6)
    assert attack.log_prob(best).exp().item() == pytest.approx(1.0, abs=1e-6)
    assert (attack.sample((5,)) == best).all()


def test_common_knowledge_limit_is_dalvi(toy_nb, device):
    """var -> 0: p(x'|y1) = sum_x p(x|y1) 1[a(x) = x'] with a the deterministic 2-GWI."""
    rows = all_rows(device).double()
    attacked = good_word_insertion(rows, toy_nb.predict_proba, 2)
    log_joint = toy_nb.log_joint(rows)
    reached = (attacked.unsqueeze(0) == rows.unsqueeze(1)).all(-1).double()  # [x', x]
    dalvi = torch.stack([log_joint[:, 0].exp(), reached @ log_joint[:, 1].exp()], -1)
    acra = ACRA(toy_nb, n=2, var=1e-8)
    evidence = acra.log_evidence(rows).exp()
    assert torch.allclose(evidence, dalvi, atol=1e-9)
    expected = (dalvi[:, 1] > dalvi[:, 0]).long()
    assert (acra.predict(rows) == expected).all()


def test_methods_agree(toy_nb, device):
    rows = all_rows(device).double()
    exact = ACRA(toy_nb, n=2, var=0.2)
    exact_proba = exact.predict_proba(rows)
    assert ((exact_proba >= 0) & (exact_proba <= 1)).all()
    sequential = ACRA(toy_nb, n=2, var=0.2, method="sequential")
    assert (sequential.predict(rows) == exact.predict(rows)).all()
    assert (sequential.predict_proba(rows) <= exact_proba + 1e-9).all()  # a lower bound
    for method in ("mc", "importance"):
        approx = ACRA(toy_nb, n=2, var=0.2, method=method, num_mc=4000, num_proposals=4000)
        assert torch.allclose(approx.predict_proba(rows), exact_proba, atol=0.03), method


def test_pyro_model_evidence(toy_nb, device):
    acra = ACRA(toy_nb, n=2, var=0.2)
    x_prime = torch.tensor([1.0, 0, 1, 1, 0], device=device).double()
    trace = pyro.poutine.trace(acra.model).get_trace(x_prime)
    assert trace.nodes["x_prime"]["is_observed"]
    log_weights, _, _ = pyro.infer.importance.vectorized_importance_weights(
        acra.model, acra.guide, x_prime, num_samples=3000, max_plate_nesting=0
    )
    estimate = log_weights.logsumexp(0) - math.log(3000)
    expected = acra.log_evidence(x_prime.unsqueeze(0))[0, 1]
    assert estimate.item() == pytest.approx(expected.item(), abs=0.05)


def test_utility_shifts_decisions(toy_nb, device):
    rows = all_rows(device).double()
    proba = ACRA(toy_nb, n=2, var=0.2).predict_proba(rows)
    utility = torch.tensor([[1.0, -5.0], [-1.0, 1.0]])  # missing a spam costs five
    decisions = ACRA(toy_nb, n=2, var=0.2, utility=utility).predict(rows)
    expected = (1 * proba - 1 * (1 - proba) > -5 * proba + 1 * (1 - proba)).long()
    assert (decisions == expected).all()
    assert decisions.sum() >= (proba > 0.5).sum()


def test_bad_input(toy_nb):
    with pytest.raises(ValueError, match="var"):
        ACRA(toy_nb, var=0.0)
    with pytest.raises(ValueError, match="num_mc"):
        ACRA(toy_nb, num_mc=0)
    with pytest.raises(ValueError, match="method"):
        ACRA(toy_nb, method="fast")
    with pytest.raises(ValueError, match="utility"):
        ACRA(toy_nb, utility=torch.ones(3, 2))
    with pytest.raises(ValueError, match="utility"):
        ACRA(toy_nb, utility=[[1.0, math.inf], [0.0, 1.0]])
    with pytest.raises(ValueError, match="n=9 exceeds the 5 features"):
        ACRA(toy_nb, n=9).predict(torch.zeros(1, NUM_FEATURES))
    with pytest.raises(ValueError, match="binary"):
        ACRA(toy_nb).predict(torch.full((1, NUM_FEATURES), 0.5))
    with pytest.raises(ValueError, match="predict_proba and predict_logit"):
        RandomWordInsertionAttack(torch.zeros(3))
    with pytest.raises(ValueError, match="var"):
        RandomWordInsertionAttack(torch.zeros(3), torch.sigmoid, var=-1.0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n=1.5), "attacker budget n must be an integer >= 0"),
        (dict(var=True), r"var \(a proportion of the maximum variance\) must be a finite number"),
        (dict(var="0.1"), r"var \(a proportion of the maximum variance\) must be a finite number"),
        (dict(num_mc=10.0), "num_mc must be an integer >= 1"),
        (dict(num_proposals=None), "num_proposals must be an integer >= 1"),
        (dict(method=None), "method must be a string"),
    ],
)
def test_wrong_types(toy_nb, kwargs, match):
    with pytest.raises(TypeError, match=match):
        ACRA(toy_nb, **kwargs)
    if "var" in kwargs:
        with pytest.raises(TypeError, match=match):
            RandomWordInsertionAttack(torch.zeros(3), torch.sigmoid, **kwargs)


def test_acra_protects_naive_bayes_on_spam():
    x, y = load_spambase(binarized=True, dtype=torch.float64)
    perm = torch.randperm(len(y))
    train, test = perm[:3400], perm[3400:]
    nb = BernoulliNaiveBayes(alpha=1e-10).fit(x[train], y[train])
    spam = test[y[test] == 1][:20]
    attacked = good_word_insertion(x[spam], nb.predict_proba, 2)
    acra = ACRA(nb, n=2, var=0.1, method="sequential")
    assert acra.predict(attacked).sum() > nb.predict(attacked).sum()
