r"""
Security evaluation curves (Biggio & Roli 2018, "Wild patterns: ten years after the rise
of adversarial machine learning"; thesis figure 3.8): accuracy of a defense against an
attack of increasing strength :math:`\epsilon`, plus the sanity checks of Carlini et al.
(2019), "On evaluating adversarial robustness", and Athalye et al. (2018), "Obfuscated
gradients give a false sense of security", that flag a too weak attack or gradient
masking.
"""

from typing import NamedTuple

import torch

from ..ops.validation import check_int, check_real

__all__ = [
    "SecurityCurve",
    "check_attack_strength",
    "check_security_curve",
    "plot_security_curves",
    "security_evaluation_curve",
]


class SecurityCurve(NamedTuple):
    """
    Accuracy of a defense against an attack at each strength, on the CPU.

    :ivar torch.Tensor epsilons: attack strengths, ascending.
    :ivar torch.Tensor accuracy: mean accuracy over repeated predictions at each strength.
    :ivar torch.Tensor accuracy_sd: standard deviation of the accuracy over repeated
        predictions (0 for a single repeat).
    """

    epsilons: torch.Tensor
    accuracy: torch.Tensor
    accuracy_sd: torch.Tensor


def security_evaluation_curve(defense, attack, epsilons, x, y, num_repeats=1, batch_size=None):
    r"""
    Security evaluation curve of Biggio & Roli (2018): for each strength :math:`\epsilon`,
    adversarial inputs ``attack(defense, x, y, eps)`` are crafted against ``defense`` and
    its accuracy on them is measured; :math:`\epsilon = 0` gives the clean accuracy
    without calling ``attack``. A stochastic defense (e.g. a fresh posterior draw per
    call) is evaluated ``num_repeats`` times on the same adversarial inputs, and the mean
    and standard deviation of the accuracy over the repeats are reported.

    Example, with :func:`~pyro_ext.ara.attacks.pgd` under expectation over
    transformation::

        attack = functools.partial(pgd, steps=50, step_size=0.01, restarts=2, eot_samples=8)
        curve = security_evaluation_curve(defense, attack, [0.0, 0.1, 0.2, 0.3], x, y)

    With a fixed ``step_size``, ``steps * step_size`` must exceed the largest
    :math:`\epsilon` for the attack to reach the boundary of the ball;
    :func:`check_attack_strength` against :func:`~pyro_ext.ara.attacks.fgsm` reveals
    an attack that does not.

    :param callable defense: ``x -> (N, C)`` logits, possibly stochastic.
    :param callable attack: ``attack(predict_logits, x, y, eps) -> x_adv``.
    :param epsilons: non-negative, finite, ascending strengths, in data units.
    :param torch.Tensor x: inputs of shape ``(N, ...)``.
    :param torch.Tensor y: integer labels of shape ``(N,)``.
    :param int num_repeats: predictions of ``defense`` per adversarial input.
    :param int batch_size: rows attacked at a time, to bound memory; all by default.
    :rtype: SecurityCurve
    """
    try:
        epsilons = torch.as_tensor(epsilons, dtype=torch.float64).cpu()
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(
            f"epsilons must be a 1-D sequence of numbers, got {type(epsilons).__name__}"
        ) from None
    if epsilons.dim() != 1 or not epsilons.numel():
        raise ValueError(f"epsilons must be a non-empty 1-D sequence, got shape {epsilons.shape}")
    if not bool(torch.isfinite(epsilons).all() and (epsilons >= 0).all()):
        raise ValueError(f"epsilons must be finite and >= 0, got {epsilons.tolist()}")
    if bool((epsilons.diff() < 0).any()):
        raise ValueError(f"epsilons must be sorted ascending, got {epsilons.tolist()}")
    num_repeats = check_int(num_repeats, "num_repeats", low=1)
    batch_size = check_int(batch_size, "batch_size", low=1, allow_none=True)
    for name, fn in (("defense", defense), ("attack", attack)):
        if not callable(fn):
            raise TypeError(f"{name} must be a callable, got {fn!r}")
    for name, value in (("x", x), ("y", y)):
        if not torch.is_tensor(value):
            raise TypeError(f"{name} must be a tensor, got {type(value).__name__}")
    if y.shape != x.shape[:1]:
        raise ValueError(f"y must have shape ({x.shape[0]},), got {tuple(y.shape)}")
    num_rows = x.shape[0]
    if not num_rows:
        raise ValueError("x holds no examples: an accuracy needs at least one row")
    # Labels are checked once here and against the number of classes at the first
    # prediction: a label no class can match would silently count as an error.
    label_range = None
    if num_rows:
        if y.is_complex() or (y.is_floating_point() and not bool((y == y.round()).all())):
            raise ValueError("y must hold integer class labels")
        label_range = int(y.min()), int(y.max())
        if label_range[0] < 0:
            raise ValueError(f"y must hold class labels >= 0, got min(y) = {label_range[0]}")
    batch_size = batch_size or max(num_rows, 1)
    correct = torch.zeros(len(epsilons), num_repeats, dtype=torch.float64)
    for start in range(0, num_rows, batch_size):
        x_batch, y_batch = x[start : start + batch_size], y[start : start + batch_size]
        for i, eps in enumerate(epsilons.tolist()):
            x_adv = x_batch if eps == 0 else attack(defense, x_batch, y_batch, eps)
            with torch.no_grad():
                for r in range(num_repeats):
                    logits = defense(x_adv)
                    if label_range is not None:
                        num_classes = logits.shape[-1]
                        if label_range[1] >= num_classes:
                            raise ValueError(
                                f"y has labels up to {label_range[1]} but defense returns "
                                f"logits for {num_classes} classes: labels must lie in "
                                f"[0, {num_classes})"
                            )
                        label_range = None
                    hits = logits.argmax(-1) == y_batch
                    correct[i, r] += hits.sum().item()
    accuracy = correct / max(num_rows, 1)
    sd = accuracy.std(-1) if num_repeats > 1 else torch.zeros(len(epsilons), dtype=torch.float64)
    dtype = torch.get_default_dtype()
    return SecurityCurve(epsilons.to(dtype), accuracy.mean(-1).to(dtype), sd.to(dtype))


def _check_curve(curve, name):
    if not isinstance(curve, SecurityCurve):
        raise TypeError(
            f"{name} must be a SecurityCurve (from security_evaluation_curve), got "
            f"{type(curve).__name__}"
        )


def _report(problems, strict):
    if strict and problems:
        raise ValueError("\n".join(problems))
    return problems


def check_security_curve(curve, tolerance=0.0, large_eps_accuracy=None, strict=False):
    r"""
    Sanity checks of a security evaluation curve (Carlini et al. 2019, section 5;
    Athalye et al. 2018, section 3.1):

    - accuracy must not increase with :math:`\epsilon` by more than ``tolerance``: a
      stronger attacker can always play the weaker attack, so a rising curve means the
      attack failed to optimise (too few steps, gradient masking or obfuscation);
    - with ``large_eps_accuracy`` given, the accuracy at the largest :math:`\epsilon`
      must not exceed it: an attack with an unbounded budget (e.g. :math:`\epsilon = 1`
      with linf on ``[0, 1]`` data) should reach near-zero accuracy.

    :param SecurityCurve curve: the curve to check.
    :param float tolerance: allowed increase between consecutive strengths, e.g. a few
        ``accuracy_sd`` for a stochastic defense.
    :param float large_eps_accuracy: highest accuracy allowed at the largest strength.
    :param bool strict: raise a :class:`ValueError` listing the problems instead of
        returning them.
    :returns: human-readable problems; empty when the curve passes.
    :rtype: list[str]
    """
    _check_curve(curve, "curve")
    tolerance = check_real(tolerance, "tolerance")
    large_eps_accuracy = check_real(large_eps_accuracy, "large_eps_accuracy", 0, 1, allow_none=True)
    eps, acc = curve.epsilons.tolist(), curve.accuracy.tolist()
    problems = [
        f"accuracy increases from {acc[i]:.4f} at eps={eps[i]:g} to {acc[i + 1]:.4f} at "
        f"eps={eps[i + 1]:g}: the attack is too weak or the defense masks gradients"
        for i in range(len(acc) - 1)
        if acc[i + 1] > acc[i] + tolerance
    ]
    if large_eps_accuracy is not None and acc[-1] > large_eps_accuracy:
        problems.append(
            f"accuracy {acc[-1]:.4f} at the largest eps={eps[-1]:g} exceeds "
            f"{large_eps_accuracy:g}: an unbounded attack should succeed, so it is too weak "
            "or the defense masks gradients"
        )
    return _report(problems, strict)


def check_attack_strength(weak, strong, tolerance=0.0, strict=False):
    r"""
    Checks that a stronger attack (more steps or restarts, EOT) never leaves a higher
    accuracy than a weaker one at the same strength (Carlini et al. 2019, section 5.2):
    otherwise the weaker attack had not converged, or neither has. Compute both curves
    with :func:`security_evaluation_curve` on the same defense and ``epsilons``.

    :param SecurityCurve weak: curve under the weaker attack.
    :param SecurityCurve strong: curve under the stronger attack.
    :param float tolerance: allowed excess accuracy of the stronger attack.
    :param bool strict: raise a :class:`ValueError` listing the problems instead of
        returning them.
    :returns: human-readable problems; empty when the check passes.
    :rtype: list[str]
    """
    _check_curve(weak, "weak")
    _check_curve(strong, "strong")
    tolerance = check_real(tolerance, "tolerance")
    if not torch.equal(weak.epsilons, strong.epsilons):
        raise ValueError("weak and strong curves must share the same epsilons")
    problems = [
        f"at eps={e:g} the stronger attack leaves accuracy {s:.4f} > {w:.4f} of the weaker "
        "one: the attacks have not converged"
        for e, w, s in zip(weak.epsilons.tolist(), weak.accuracy.tolist(), strong.accuracy.tolist())
        if s > w + tolerance
    ]
    return _report(problems, strict)


def plot_security_curves(curves, ax=None, **kwargs):
    """
    Plots security evaluation curves as in thesis figure 3.8, with error bars of one
    ``accuracy_sd``. Needs :mod:`matplotlib`.

    :param dict curves: legend label -> :class:`SecurityCurve`.
    :param matplotlib.axes.Axes ax: axes to draw on; the current axes by default.
    :param kwargs: passed to :meth:`matplotlib.axes.Axes.errorbar`.
    :returns: the axes.
    """
    if not isinstance(curves, dict):
        raise TypeError(f"curves must be a dict name -> SecurityCurve, got {type(curves).__name__}")
    if ax is None:
        import matplotlib.pyplot as plt

        ax = plt.gca()
    for name, curve in curves.items():
        _check_curve(curve, f"curves[{name!r}]")
        ax.errorbar(curve.epsilons, curve.accuracy, yerr=curve.accuracy_sd, label=name, **kwargs)
    ax.set_xlabel("ε")
    ax.set_ylabel("accuracy")
    ax.legend()
    return ax
