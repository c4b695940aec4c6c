"""
Adversarial risk analysis (thesis chapter 3): attacks, attacker models as Pyro
distributions, ARA defenses and security evaluation.

- Attacks on any ``predict_logits(x) -> logits`` callable: :func:`fgsm`, :func:`pgd`
  (linf, L2, sparse L1; cross-entropy, Carlini-Wagner or DLR loss; restarts; expectation
  over transformation for stochastic defenses), and, for binary word-presence features,
  :func:`good_word_insertion` and :func:`word_deletion`.
- Attacker models ``p_C(x' | x, y)`` as Pyro distributions, carrying the defender's
  uncertainty about the attacker: :class:`RandomWordInsertionAttack` (eq. 3.11, exact
  probabilities by quadrature and the Monte Carlo estimate of eq. 3.12) and
  :class:`LangevinAttacker` (eq. 3.14), mixed by :class:`AttackMixture`.
- Defenses: :class:`ACRA` (Algorithm 3.1) around a generative classifier such as
  :class:`BernoulliNaiveBayes`; :class:`ARATrainer` (Algorithm 3.2, the package's
  SG-MCMC kernels on clean and attacked data); :class:`AdversarialTrainer` (Madry PGD
  training, the baseline).
- Evaluation: :func:`security_evaluation_curve` with the sanity checks
  :func:`check_security_curve` and :func:`check_attack_strength`, and
  :func:`plot_security_curves`.

Example: FGSM steps each input coordinate by ``eps`` against the gradient of the true class'
cross-entropy. With the logits equal to the inputs, class 0 loses on ``x_0`` and gains on
``x_1``:

>>> from pyro_ext.ara import fgsm
>>> x, y = torch.tensor([[0.6, 0.4]]), torch.tensor([0])
>>> fgsm(lambda x: x, x, y, eps=0.1)
tensor([[0.5000, 0.5000]])
"""

from .acra import ACRA, RandomWordInsertionAttack
from .attackers import AttackMixture, LangevinAttacker, langevin_attack
from .attacks import attack_loss, fgsm, pgd, predictive_logits, project_l1_ball
from .evaluation import (
    SecurityCurve,
    check_attack_strength,
    check_security_curve,
    plot_security_curves,
    security_evaluation_curve,
)
from .naive_bayes import BernoulliNaiveBayes
from .training import AdversarialTrainer, ARATrainer, init_fan_in
from .words import attack_candidates, good_word_insertion, originating_instances, word_deletion

__all__ = [
    "ACRA",
    "ARATrainer",
    "AdversarialTrainer",
    "AttackMixture",
    "BernoulliNaiveBayes",
    "LangevinAttacker",
    "RandomWordInsertionAttack",
    "SecurityCurve",
    "attack_candidates",
    "attack_loss",
    "check_attack_strength",
    "check_security_curve",
    "fgsm",
    "good_word_insertion",
    "init_fan_in",
    "langevin_attack",
    "originating_instances",
    "pgd",
    "plot_security_curves",
    "predictive_logits",
    "project_l1_ball",
    "security_evaluation_curve",
    "word_deletion",
]
