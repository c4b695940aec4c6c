import copy
import math

import pyro
import pytest
import torch

import pyro_ext.ara.acra as acra_module
from pyro_ext.ara.acra import (
    ACRA,
    BOUND_STEPS,
    LOGIT_RANGE,
    RandomWordInsertionAttack,
    attack_log_probs,
    attack_prob_bounds,
    beta_concentrations,
)
from pyro_ext.ara.naive_bayes import BernoulliNaiveBayes
from pyro_ext.ara.words import attack_candidates, good_word_insertion, originating_instances
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
    exact = ACRA(toy_nb, n=2, var=0.2, method="exact")
    exact_proba = exact.predict_proba(rows)
    assert ((exact_proba >= 0) & (exact_proba <= 1)).all()
    bounded = ACRA(toy_nb, n=2, var=0.2, proba_tol=1e-4)  # the default method
    assert torch.allclose(bounded.predict_proba(rows[::2]), exact_proba[::2], atol=1e-4, rtol=0)
    assert torch.equal(bounded.log_evidence(rows[:3]), exact.log_evidence(rows[:3]))
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
    with pytest.raises(ValueError, match="proba_tol"):
        ACRA(toy_nb, proba_tol=0.0)
    with pytest.raises(ValueError, match="single row"):
        attack_prob_bounds(torch.zeros(2, NUM_FEATURES), toy_nb.logit, 2, 0.1)
    with pytest.raises(ValueError, match="step"):
        attack_prob_bounds(torch.zeros(NUM_FEATURES), toy_nb.logit, 2, 0.1, step=0.0)
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
        (dict(proba_tol="1e-6"), "proba_tol must be a finite number"),
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


def brute_force_attack_prob(x_prime, x, logit_fn, n, var):
    """p(x' | x, y1) = P(argmin_z P_z = x') by adaptive quadrature over P_{x'} itself."""
    from scipy import integrate, special

    candidates = attack_candidates(x, n)
    star = (candidates == x_prime).all(-1)
    if not star.any():
        return 0.0
    logit = torch.as_tensor(logit_fn(candidates)).double().clamp(*LOGIT_RANGE)
    alpha, beta = (t.cpu().numpy() for t in beta_concentrations(logit, var))
    i, others = int(star.nonzero()[0, 0]), (~star).cpu().numpy()
    log_norm = special.betaln(alpha[i], beta[i])

    def integrand(p):
        log_pdf = (alpha[i] - 1) * math.log(p) + (beta[i] - 1) * math.log1p(-p) - log_norm
        return math.exp(log_pdf) * special.betaincc(alpha[others], beta[others], p).prod()

    mean = alpha[i] / (alpha[i] + beta[i])
    value, _ = integrate.quad(integrand, 0, 1, points=[mean], limit=200, epsabs=1e-14)
    return value


def test_exact_and_bounded_match_brute_force_enumeration(toy_nb, device):
    """Every observation of the 5-word toy: each term p(x' | x, y1) of eq. (3.8) by an
    independent adaptive quadrature, and the decisions that follow from their sum."""
    acra = ACRA(toy_nb, n=2, var=0.2, method="exact")
    rows = all_rows(device).double()
    expected, margins = [], []
    for x_prime in rows:
        originals = originating_instances(x_prime, 2)
        exact = attack_log_probs(x_prime, originals, acra._logit, 2, 0.2).exp().cpu()
        brute = [brute_force_attack_prob(x_prime, x, acra._logit, 2, 0.2) for x in originals]
        brute = torch.tensor(brute, dtype=torch.float64)
        # The 8-point Gauss-Legendre panels of "exact" are accurate to a few 1e-8 here.
        assert torch.allclose(exact, brute, rtol=0, atol=1e-7)
        joint = toy_nb.log_joint(originals)[:, 1].exp().cpu()
        innocent = float(toy_nb.log_joint(x_prime)[0].exp())
        expected.append(float(joint @ brute) > innocent)
        margins.append(abs(float(joint @ brute) - innocent) - float(joint.sum()) * 1e-7)
    expected, decided = torch.tensor(expected).long(), torch.tensor(margins) > 0
    assert decided.float().mean() > 0.9 and 0 < expected.sum() < len(expected)
    for method in ("exact", "bounded"):
        decisions = ACRA(toy_nb, n=2, var=0.2, method=method).predict(rows).cpu()
        assert (decisions == expected)[decided].all(), method


@pytest.mark.parametrize("n, var", [(1, 0.2), (2, 0.05), (3, 0.5)])
def test_bounds_contain_the_exact_quadrature(toy_nb, device, n, var):
    """attack_prob_bounds brackets attack_log_probs for every originating instance and grid,
    with and without the naive Bayes' word weights, and tightens as the grid refines."""
    acra = ACRA(toy_nb, n=n, var=var)
    for x_prime in all_rows(device).double()[::3]:
        exact = attack_log_probs(
            x_prime, originating_instances(x_prime, n), acra._logit, n, var
        ).exp()
        widths = []
        for step in BOUND_STEPS:
            low, high = attack_prob_bounds(x_prime, acra._logit, n, var, step, acra._weights())
            assert low.device == x_prime.device and low.shape == exact.shape
            assert (low <= exact).all() and (exact <= high).all()
            generic = attack_prob_bounds(x_prime, acra._logit, n, var, step)
            assert torch.allclose(generic[0], low, rtol=1e-9, atol=1e-15)
            assert torch.allclose(generic[1], high, rtol=1e-9, atol=1e-15)
            widths.append(float((high - low).max()))
        assert widths[-1] <= widths[0]


def test_bounded_refines_to_exact_terms_and_defers_ties(toy_nb, device, monkeypatch):
    rows = all_rows(device).double()[::2]
    exact = ACRA(toy_nb, n=2, var=0.2, method="exact")
    log_evidence = exact.log_evidence(rows)
    decisions = (log_evidence[:, 1] > log_evidence[:, 0]).long()
    # Without grids, the bounds go straight from [0, 1] to exact terms.
    monkeypatch.setattr(acra_module, "BOUND_STEPS", ())
    assert (ACRA(toy_nb, n=2, var=0.2).predict(rows) == decisions).all()
    proba = ACRA(toy_nb, n=2, var=0.2, proba_tol=1e-8).predict_proba(rows)
    assert torch.allclose(proba, log_evidence.softmax(-1)[:, 1], atol=1e-8, rtol=0)
    # A zero utility ties every decision: no margin, so "exact" decides (argmax: 0).
    tied = ACRA(toy_nb, n=2, var=0.2, utility=torch.zeros(2, 2)).predict(rows)
    assert (tied == 0).all()
    # float32 rows, and a float32 classifier: the decisions of "exact" on the same.
    rows32 = rows.float()
    assert (ACRA(toy_nb, n=2, var=0.2).predict(rows32) == exact.predict(rows32)).all()
    nb32 = copy.copy(toy_nb)
    for name in ("log_prior", "feature_log_prob", "feature_log1m_prob"):
        setattr(nb32, name, getattr(toy_nb, name).float())
    expected = ACRA(nb32, n=2, var=0.2, method="exact").predict(rows)
    assert (ACRA(nb32, n=2, var=0.2).predict(rows) == expected).all()


# Positions in the Spambase test split of benchmarks/ara_spam.py (seed 0) -> words after
# the 2-GWI attack on naive Bayes: e-mails with many words (27-34, hence 400-600
# originating instances; 879 took "sequential" 531 terms), each cheap for "exact"
# (< 0.7 s), and the closest decisions of the split (log-odds of the two evidences
# -0.09 and -0.06 for 409 and 593, which need the 0.125 grid).
SPAM_ROWS = {879: 34, 621: 33, 1022: 31, 42: 30, 647: 29, 217: 28, 722: 27, 409: 5, 593: 6}


def test_bounded_decisions_equal_exact_on_attacked_spam():
    x, y = load_spambase(binarized=True, dtype=torch.float64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    train, test = perm[: int(0.75 * len(y))], perm[int(0.75 * len(y)) :]
    nb = BernoulliNaiveBayes(alpha=1e-10).fit(x[train], y[train])
    rows = test[list(SPAM_ROWS)]
    attacked = good_word_insertion(x[rows], nb.predict_proba, 2, y[rows])
    assert attacked.sum(-1).long().tolist() == list(SPAM_ROWS.values())
    exact = ACRA(nb, n=2, var=0.1, method="exact")
    bounded = ACRA(nb, n=2, var=0.1)
    expected = exact.predict(attacked)
    assert 0 < expected.sum() < len(expected)
    assert (bounded.predict(attacked) == expected).all()
    # The bounds bracket the quadrature on a close call.
    x_prime = attacked[-1]
    values = attack_log_probs(x_prime, originating_instances(x_prime, 2), nb.logit, 2, 0.1).exp()
    for step in BOUND_STEPS[:2]:
        low, high = attack_prob_bounds(x_prime, nb.logit, 2, 0.1, step, bounded._weights())
        assert (low <= values).all() and (values <= high).all()
