"""Issue 32, ACRA and pyro_ext.ara: no unbounded enumeration, and wrong classifiers and inputs
refused with an error that names the argument."""

import math
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyro_ext.ara import (
    ACRA,
    AdversarialTrainer,
    AttackMixture,
    BernoulliNaiveBayes,
    LangevinAttacker,
    RandomWordInsertionAttack,
    attack_candidates,
    attack_loss,
    check_attack_strength,
    check_security_curve,
    fgsm,
    good_word_insertion,
    langevin_attack,
    originating_instances,
    pgd,
    plot_security_curves,
    predictive_logits,
    project_l1_ball,
    security_evaluation_curve,
    word_deletion,
)
from pyro_ext.ara.acra import (
    attack_log_probs,
    attack_mc_probs,
    attack_prob_bounds,
    count_acra_candidates,
)
from pyro_ext.ara.words import MAX_ENUMERATION, count_subsets

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True)
D = 5


def _nb(num_features=D, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = (torch.rand(200, num_features, generator=generator) < 0.4).double()
    y = torch.arange(200) % 2
    return BernoulliNaiveBayes().fit(x, y)


NB = _nb()
NB40 = _nb(40)
ROWS = torch.tensor([[1.0, 0, 1, 0, 0], [0, 1, 1, 1, 0], [0, 0, 0, 0, 0], [1, 1, 0, 1, 1]])


class _Classifier:
    """A generative classifier whose log_joint is the given function of the rows."""

    def __init__(self, fn):
        self.fn = fn

    def log_joint(self, x):
        return self.fn(x)


def _constant(value, columns=2):
    return _Classifier(lambda x: torch.full(x.shape[:-1] + (columns,), value, dtype=torch.float64))


# --- The cases -------------------------------------------------------------------


def _spam_nb():
    """Naive Bayes on 40 words where word 0 marks spam: the row with word 0 alone is close
    to a spam, so bounds on p(x' | x, y1) are needed to decide it."""
    generator = torch.Generator().manual_seed(0)
    y = torch.arange(200) % 2
    x = (torch.rand(200, 40, generator=generator) < 0.3).double()
    x[:, 0] = y.double()
    return BernoulliNaiveBayes().fit(x, y)


SPAM_NB40 = _spam_nb()


@pytest.mark.parametrize("method", ["bounded", "exact"])
def test_hang_acra_n20_of_40_features_refused_at_once(method):
    # 9.6e11 attack candidates (C(39, <= 20) + C(40, <= 20)): counted, not enumerated.
    acra = ACRA(SPAM_NB40, n=20, method=method)
    row = torch.zeros(1, 40)
    row[0, 0] = 1
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"max_enumeration=1,000,000.*lower n") as info:
        acra.predict(row)
    assert time.perf_counter() - start < 1.0
    assert "would enumerate 962,480,249,652 instances" in str(info.value)
    assert "x row 0 (1 words present, 39 absent)" in str(info.value)
    assert count_acra_candidates(1, 39, 20) == 962_480_249_652


def test_hang_acra_n20_all_zero_row():
    # The row: 6.2e11 candidates for "exact", refused at once; "bounded" decides it
    # from its originating instance alone (the trivial bounds 0 <= p <= 1 settle it).
    row = torch.zeros(1, 40)
    start = time.perf_counter()
    with pytest.raises(ValueError, match="would enumerate 618,679,078,298 instances"):
        ACRA(NB40, n=20, method="exact").predict(row)
    for nb in (NB40, SPAM_NB40):
        assert ACRA(nb, n=20).predict(row).tolist() == [0]
    with pytest.raises(ValueError, match="max_enumeration"):
        ACRA(NB40, n=20).predict_proba(row)  # an interval 2e-6 wide needs the enumeration
    assert time.perf_counter() - start < 1.0
    assert count_acra_candidates(0, 40, 20) == sum(math.comb(40, k) for k in range(21))


def test_hang_budget_is_a_constructor_argument():
    x = torch.zeros(1, 40)
    x[0, :38] = 1  # 2 absent words: every method enumerates few candidates
    assert count_acra_candidates(38, 2, 2) == 8003
    assert ACRA(NB40, n=2, max_enumeration=8003).predict(x).shape == (1,)
    with pytest.raises(
        ValueError, match="8,003 instances, more than max_enumeration=8,002; lower n"
    ):
        ACRA(NB40, n=2, max_enumeration=8002).predict(x)
    assert ACRA(NB, n=2, max_enumeration=1e3).max_enumeration == 1000
    assert ACRA(NB).max_enumeration == MAX_ENUMERATION == 10**6
    with pytest.raises(ValueError, match="max_enumeration must be an integer >= 1"):
        ACRA(NB, max_enumeration=0)
    with pytest.raises(TypeError, match="max_enumeration must be an integer >= 1"):
        ACRA(NB, max_enumeration="big")
    with pytest.raises(TypeError, match="max_enumeration must be an integer >= 1"):
        ACRA(NB, max_enumeration=math.inf)


EXACT = ACRA(NB, n=1, method="exact")


@pytest.mark.parametrize("method", ["exact", "bounded"])
def test_exact_predict_on_integer_input(method):
    # int64 rows overflowed writing -inf log-probabilities; now cast to floating point.
    rows = ROWS[:2]
    expected = EXACT.predict(rows.double())
    acra = ACRA(NB, n=1, method=method)
    for integer_rows in (rows.long(), rows.bool()):
        assert torch.equal(acra.predict(integer_rows), expected)
    assert torch.allclose(EXACT.log_evidence(rows.long()).double(), EXACT.log_evidence(rows))


def test_integer_input_other_methods():
    for method in ("sequential", "mc", "importance"):
        proba = ACRA(NB, n=1, method=method, num_mc=10, num_proposals=10).predict_proba(
            ROWS[:1].long()
        )
        assert proba.is_floating_point() and torch.isfinite(proba).all(), method


@pytest.mark.parametrize("method", ["bounded", "exact", "sequential", "mc", "importance"])
@pytest.mark.parametrize(
    "classifier, error, match",
    [
        (_constant(math.nan), ValueError, r"generative_classifier.log_joint returned NaN"),
        (
            _constant(-math.inf),
            ValueError,
            r"generative_classifier.log_joint must be finite on the observed rows, got -inf",
        ),
        (
            _constant(0.0, columns=3),
            ValueError,
            r"generative_classifier.log_joint must return shape \(4, 2\).* got \(4, 3\)",
        ),
        (
            _Classifier(lambda x: [[0.0, 0.0]] * x.shape[0]),
            TypeError,
            r"generative_classifier.log_joint must return a tensor of shape \(4, 2\)",
        ),
        (
            _Classifier(lambda x: torch.zeros(x.shape[:-1] + (2,), dtype=torch.long)),
            TypeError,
            "generative_classifier.log_joint must return floating-point values",
        ),
    ],
    ids=["nan", "neg-inf", "3-columns", "list", "integer"],
)
def test_broken_log_joint_refused(classifier, error, match, method):
    acra = ACRA(classifier, n=1, method=method)
    for call in (acra.predict, acra.predict_proba, acra.log_evidence):
        with pytest.raises(error, match=match):
            call(ROWS)


def test_nan_log_joint_on_candidates_only_refused():
    # Finite on the observed rows, NaN on rows with a fifth word: only candidates see it.
    def log_joint(x):
        out = torch.zeros(x.shape[:-1] + (2,), dtype=torch.float64)
        return out.masked_fill((x[..., 4] == 1).unsqueeze(-1), math.nan)

    rows = ROWS[:3].clone()
    rows[:, 4] = 0
    for method in ("exact", "sequential", "mc", "bounded"):
        with pytest.raises(ValueError, match="generative_classifier.log_joint returned NaN"):
            ACRA(_Classifier(log_joint), n=1, method=method, proba_tol=1e-9).predict_proba(rows)


def test_classifier_without_log_joint_refused():
    with pytest.raises(TypeError, match="generative_classifier must provide a method log_joint"):
        ACRA(object())


# --- The rest of the ACRA and word-attack API ------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(utility="abc"), TypeError, "utility must be a"),
        (dict(utility=[[1, 0], [0, 1j]]), TypeError, "utility must hold real numbers"),
        (dict(utility=torch.full((2, 2), math.nan)), ValueError, "utility must be a finite"),
        (dict(utility=torch.eye(3)), ValueError, r"utility must be a finite \(2, 2\).*\(3, 3\)"),
        (dict(n=-1), ValueError, "attacker budget n must be an integer >= 0"),
        (dict(num_proposals=0), ValueError, "num_proposals must be an integer >= 1"),
        (dict(proba_tol=math.nan), ValueError, "proba_tol must be a finite number"),
        (dict(var=math.nan), ValueError, "var"),
    ],
)
def test_acra_constructor_refuses(kwargs, error, match):
    with pytest.raises(error, match=match):
        ACRA(NB, **kwargs)


@pytest.mark.parametrize(
    "x, error, match",
    [
        ([[0.0, 1, 0, 0, 1]], TypeError, "x must be a tensor"),
        (torch.zeros(D), ValueError, r"x must be shape \(N, D\)"),
        (torch.zeros(1, 1, D), ValueError, r"x must be shape \(N, D\)"),
        (torch.full((1, D), 2.0), ValueError, r"x must be binary .* got 2.0 at x\[0, 0\]"),
        (torch.zeros(1, D, dtype=torch.complex64), TypeError, "x must be a real tensor"),
        (torch.zeros(1, D + 2), ValueError, "x has 7 features, the classifier 5"),
    ],
)
def test_acra_predict_refuses_rows(x, error, match):
    for method in ("bounded", "exact"):
        with pytest.raises(error, match=match):
            ACRA(NB, n=1, method=method).predict(x)


def test_acra_empty_batch():
    for method in ("bounded", "exact", "mc"):
        acra = ACRA(NB, n=1, method=method)
        assert acra.predict(torch.zeros(0, D)).shape == (0,)
        assert acra.predict_proba(torch.zeros(0, D)).shape == (0,)


def test_word_attacks_budget_and_scores():
    x = torch.zeros(2, 40)
    proba = torch.nn.Sequential()  # any callable; never called when refused
    start = time.perf_counter()
    for attack in (good_word_insertion, word_deletion):
        rows = x if attack is good_word_insertion else 1 - x
        with pytest.raises(ValueError, match=r"up to n=20 .* x row 0 would enumerate "):
            attack(rows, proba, 20)
    with pytest.raises(ValueError, match="max_enumeration=1,000,000"):
        attack_candidates(x[0], 20)
    with pytest.raises(ValueError, match="deleting up to n=20 .* of x_attacked row 0"):
        originating_instances(1 - x[0], 20)
    with pytest.raises(ValueError, match="max_enumeration=10; lower n"):
        good_word_insertion(x[:, :5], lambda z: z.sum(-1), 2, max_enumeration=10)
    assert time.perf_counter() - start < 1.0
    assert good_word_insertion(x[:, :5], lambda z: z.sum(-1), 2, max_enumeration=16).shape
    # Labels: only y == 1 rows are counted and attacked.
    y = torch.tensor([0, 1])
    big = torch.ones(2, 40)
    big[1, :3] = 0
    assert good_word_insertion(big, lambda z: z.sum(-1), 20, y).shape == (2, 40)
    with pytest.raises(TypeError, match="predict_proba must be a callable"):
        good_word_insertion(x[:, :5], None, 1)
    with pytest.raises(ValueError, match=r"predict_proba must return one score per candidate"):
        good_word_insertion(x[:, :5], lambda z: z, 1)
    with pytest.raises(ValueError, match="predict_proba returned NaN scores"):
        good_word_insertion(x[:, :5], lambda z: z.sum(-1) * math.nan, 1)
    with pytest.raises(TypeError, match="predict_proba must return a tensor"):
        good_word_insertion(x[:, :5], lambda z: "abc", 1)
    with pytest.raises(TypeError, match="y must be a 1-d tensor"):
        good_word_insertion(x, lambda z: z.sum(-1), 1, [0, 1])
    with pytest.raises(ValueError, match=r"y labels must be in \{0, 1\}, got 2 at y\[1\]"):
        good_word_insertion(x, lambda z: z.sum(-1), 1, torch.tensor([0, 2]))


def test_attacker_model_and_quadrature_budget():
    x = torch.zeros(40)
    with pytest.raises(ValueError, match="max_enumeration"):
        RandomWordInsertionAttack(x, torch.sigmoid, n=20)
    with pytest.raises(TypeError, match="predict_proba must be a callable"):
        RandomWordInsertionAttack(x, "sigmoid", n=1)
    logit = NB40.logit
    with pytest.raises(ValueError, match="originals row 0 would enumerate"):
        attack_log_probs(x, x.unsqueeze(0), logit, 20, 0.1)
    with pytest.raises(ValueError, match="originals row 0 would enumerate"):
        attack_mc_probs(x, x.unsqueeze(0), logit, 20, 0.1, 10)
    with pytest.raises(ValueError, match="attack_prob_bounds with n=20 on x_prime"):
        attack_prob_bounds(x, logit, 20, 0.1)
    with pytest.raises(ValueError, match=r"originals must have the 40 features of x_prime"):
        attack_log_probs(x, torch.zeros(1, 3), logit, 1, 0.1)
    with pytest.raises(ValueError, match=r"weights must have shape \(40,\)"):
        attack_prob_bounds(x, logit, 1, 0.1, weights=torch.zeros(3))
    with pytest.raises(ValueError, match="logit_fn returned NaN log-odds"):
        attack_log_probs(x[:5], x[:5].unsqueeze(0), lambda z: z.sum(-1) * math.nan, 1, 0.1)
    with pytest.raises(ValueError, match="logit_fn returned NaN log-odds"):
        attack_prob_bounds(x[:5], lambda z: z.sum(-1) * math.nan, 1, 0.1)
    # Integer rows give floating-point log-probabilities, not an int64 overflow.
    log_p = attack_log_probs(x[:5].long(), x[:5].long().unsqueeze(0), NB.logit, 1, 0.1)
    assert log_p.is_floating_point() and log_p.shape == (1,)


def test_naive_bayes_refuses():
    x = torch.tensor([[0.0, 1], [1, 0]])
    with pytest.raises(TypeError, match="x must be a tensor"):
        BernoulliNaiveBayes().fit(x.tolist(), torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="y must be a 1-d tensor"):
        BernoulliNaiveBayes().fit(x, [0, 1])
    with pytest.raises(ValueError, match=r"y must be a 1-d tensor .* shape \(2, 1\)"):
        BernoulliNaiveBayes().fit(x, torch.tensor([[0], [1]]))
    with pytest.raises(ValueError, match=r"x must be binary .* got nan at x\[1, 0\]"):
        BernoulliNaiveBayes().fit(torch.tensor([[0.0, 1], [math.nan, 0]]), torch.tensor([0, 1]))
    nb = BernoulliNaiveBayes().fit(x, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="x must have a feature dimension"):
        nb.predict(torch.tensor(1.0))


def test_count_subsets_is_exact():
    for size in range(8):
        for n in range(size + 2):
            assert count_subsets(size, n) == sum(math.comb(size, k) for k in range(n + 1))


# --- Generated wrong inputs ---------------------------------------------------------------


@SETTINGS
@given(features=st.integers(1, 12).filter(lambda d: d != D), rows=st.integers(1, 3))
def test_generated_wrong_feature_count(features, rows):
    with pytest.raises(ValueError, match=rf"x has {features} features, the classifier {D}"):
        ACRA(NB, n=1).predict(torch.zeros(rows, features))


@SETTINGS
@given(
    row=st.integers(0, 3),
    col=st.integers(0, D - 1),
    value=st.sampled_from([math.nan, math.inf, -math.inf, 0.5, -1.0, 2.0, 0.25]),
)
def test_generated_non_binary_rows(row, col, value):
    x = ROWS.clone()
    x[row, col] = value
    match = rf"x must be binary \(0/1\) word-presence features, got {value} at x\[{row}, {col}\]"
    with pytest.raises(ValueError, match=match):
        ACRA(NB, n=1).predict(x)
    with pytest.raises(ValueError, match=r"x must be binary"):
        good_word_insertion(x, NB.predict_proba, 1)
    with pytest.raises(ValueError, match=r"x must be binary"):
        NB.predict(x)


@SETTINGS
@given(index=st.integers(0, 5), label=st.sampled_from([-1, 2, 3, 7]))
def test_generated_labels_outside_0_1(index, label):
    x = torch.zeros(6, D)
    y = torch.tensor([0, 1, 0, 1, 0, 1])
    y[index] = label
    match = rf"y labels must be in \{{0, 1\}}, got {label} at y\[{index}\]"
    with pytest.raises(ValueError, match=match):
        BernoulliNaiveBayes().fit(x, y)
    with pytest.raises(ValueError, match=match):
        good_word_insertion(x, NB.predict_proba, 1, y)


@SETTINGS
@given(num_features=st.integers(21, 60), extra=st.integers(0, 20))
def test_generated_budgets_beyond_max_enumeration_refused_at_once(num_features, extra):
    n = min(num_features, 20 + extra)
    start = time.perf_counter()
    with pytest.raises(ValueError, match="max_enumeration"):
        attack_candidates(torch.zeros(num_features), n)
    with pytest.raises(ValueError, match="max_enumeration"):
        ACRA(_nb(num_features), n=n, method="exact").predict(torch.zeros(1, num_features))
    assert time.perf_counter() - start < 1.0


@SETTINGS
@given(
    rows=st.integers(1, 4),
    position=st.integers(0, 7),
    bad=st.sampled_from([math.nan, -math.inf, math.inf]),
)
def test_generated_non_finite_log_joint(rows, position, bad):
    position = position % (2 * rows)

    def log_joint(x):
        out = torch.zeros(x.shape[:-1] + (2,), dtype=torch.float64)
        if x.shape[0] == rows:  # the observed batch only
            out.view(-1)[position] = bad
        return out

    match = "returned NaN" if math.isnan(bad) else "must be finite on the observed rows"
    with pytest.raises(ValueError, match=f"generative_classifier.log_joint {match}"):
        ACRA(_Classifier(log_joint), n=1, method="exact").predict(ROWS[:rows])


# --- Attacks, attacker models, evaluation, training -------------------------------------

N = 4
X = torch.linspace(0.1, 0.9, N * 3).reshape(N, 3)
Y = torch.tensor([0, 1, 0, 1])
W = torch.tensor([[1.0, -1.0], [0.5, 0.2], [-0.3, 0.4]])


def _logits(z):
    return z @ W


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: fgsm(None, X, Y, 0.1), TypeError, "predict_logits must be a callable"),
        (
            lambda: fgsm(lambda z: z.sum(-1), X, Y, 0.1),
            ValueError,
            r"logits must have shape \(N, C\) and y shape \(N,\), got logits \(4,\)",
        ),
        (
            lambda: pgd(lambda z: _logits(z)[:2], X, Y, 0.1, 2, 0.05),
            ValueError,
            r"got logits \(2, 2\) and y \(4,\): predict_logits must return one row",
        ),
        (lambda: fgsm(_logits, X, Y, 0.1, clip=(1, 0)), ValueError, "clip must be None or a pair"),
        (lambda: fgsm(_logits, X, Y, 0.1, clip="ab"), TypeError, "clip must be None or a pair"),
        (lambda: attack_loss([[0.0, 1.0]], Y[:1]), TypeError, "logits must be a tensor"),
        (lambda: predictive_logits([_logits, 3]), TypeError, "predict_logits_fns must hold"),
        (lambda: project_l1_ball(torch.ones(2, 3), -1.0), ValueError, "radius must be a finite"),
        (lambda: project_l1_ball(torch.ones(2, 3), math.nan), ValueError, "radius must be"),
        (lambda: project_l1_ball([[1.0, 2.0]], 1.0), TypeError, "v must be a floating-point"),
        (lambda: project_l1_ball(torch.ones(3), 1.0), ValueError, r"v must have shape \(N, ...\)"),
        (
            lambda: langevin_attack(_logits, X, Y, torch.full((N,), 0.1), torch.full((N,), -1)),
            ValueError,
            r"steps must hold whole numbers of iterations in \[0, 1000000\].*steps\[0\] = -1",
        ),
        (
            lambda: langevin_attack(_logits, X, Y, torch.full((N,), 0.1), torch.full((N,), 1.5)),
            ValueError,
            r"steps must hold whole numbers of iterations .*steps\[0\] = 1.5",
        ),
        (
            lambda: LangevinAttacker(_logits, X, Y, steps_rate=1e12),
            ValueError,
            r"steps_rate must be at most MAX_STEPS = 1000000",
        ),
        (lambda: LangevinAttacker(None, X, Y), TypeError, "predict_logits must be a callable"),
        (lambda: AttackMixture([1, 2]), TypeError, "attackers must hold attacker models"),
        (
            lambda: AttackMixture([LangevinAttacker(_logits, X, Y)], probs=[math.inf]),
            ValueError,
            "probs must hold 1 finite non-negative weights",
        ),
        (
            lambda: LangevinAttacker(_logits, X, Y, steps=0),
            ValueError,
            "steps=0 with steps_rate=0 is an attacker that never moves x",
        ),
        (lambda: fgsm(_logits, X[:0], Y[:0], 0.1), ValueError, "x holds no examples"),
        (
            lambda: AdversarialTrainer(torch.nn.Linear(3, 2), norm="l3"),
            ValueError,
            "norm must be one of",
        ),
        (
            lambda: AdversarialTrainer(torch.nn.Linear(3, 2)).fit(X, torch.tensor([0, 1, 2, 0])),
            ValueError,
            r"y labels must lie in \[0, 2\)",
        ),
        (
            lambda: security_evaluation_curve(_logits, fgsm, "ab", X, Y),
            TypeError,
            "epsilons must be a 1-D sequence of numbers",
        ),
        (
            lambda: security_evaluation_curve(_logits, fgsm, [0.0], X[:0], Y[:0]),
            ValueError,
            "x holds no examples",
        ),
        (lambda: check_security_curve(None), TypeError, "curve must be a SecurityCurve"),
        (lambda: check_attack_strength(None, None), TypeError, "weak must be a SecurityCurve"),
        (lambda: plot_security_curves(None), TypeError, "curves must be a dict"),
        (
            lambda: AdversarialTrainer(torch.nn.Linear(3, 2)).fit(torch.rand(N, 5), Y),
            ValueError,
            r"net cannot take x of shape \(4, 5\)",
        ),
    ],
    ids=[
        "fgsm-not-callable",
        "fgsm-flat-logits",
        "pgd-short-logits",
        "fgsm-clip-order",
        "fgsm-clip-str",
        "attack_loss-list",
        "predictive_logits-int",
        "l1-negative-radius",
        "l1-nan-radius",
        "l1-list",
        "l1-1d",
        "langevin-negative-steps",
        "langevin-float-steps",
        "langevin-huge-rate",
        "langevin-not-callable",
        "mixture-ints",
        "mixture-inf-probs",
        "langevin-never-moves",
        "fgsm-empty-x",
        "trainer-norm",
        "trainer-label-2",
        "curve-eps-str",
        "curve-empty-x",
        "check-curve-none",
        "check-strength-none",
        "plot-none",
        "trainer-wrong-features",
    ],  # fmt: skip
)
def test_other_entry_points_refuse(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_check_security_curve_refuses_nan_tolerance():
    curve = security_evaluation_curve(_logits, fgsm, [0.0, 0.1], X, Y)
    with pytest.raises(ValueError, match="tolerance must be a finite number"):
        check_security_curve(curve, tolerance=math.nan)
    with pytest.raises(ValueError, match="large_eps_accuracy must be a finite number in"):
        check_security_curve(curve, large_eps_accuracy=1.5)


@SETTINGS
@given(index=st.integers(0, N - 1), steps=st.sampled_from([-5, -1, 10**6 + 1, 10**12]))
def test_generated_langevin_steps_out_of_range(index, steps):
    counts = torch.ones(N, dtype=torch.long)
    counts[index] = steps
    start = time.perf_counter()
    with pytest.raises(ValueError, match=rf"steps\[{index}\] = {steps}"):
        langevin_attack(_logits, X, Y, torch.full((N,), 0.1), counts)
    assert time.perf_counter() - start < 1.0
