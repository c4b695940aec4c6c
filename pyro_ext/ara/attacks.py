r"""
Gradient-based evasion attacks on continuous inputs (thesis section 3.5.1): the attacker
solves :math:`x' = \arg\max_{x' \in B(x)} \ell(f(x'), y)` over a neighbourhood
:math:`B(x) = \{x' : \|x' - x\| \le \epsilon\} \cap [\text{low}, \text{high}]^d`.

Every attack takes a callable ``predict_logits(x) -> logits`` of shape ``(N, C)``. It may
be stochastic (e.g. a Bayesian defense returning the logits of a fresh posterior draw per
call); ``eot_samples`` then averages the input gradient over several calls (expectation
over transformation, Athalye et al. 2018), and :func:`predictive_logits` turns several
draws into the posterior-predictive average. A transfer (black-box) attack is simply an
attack crafted on an undefended source model, ``pgd(source_logits, x, y, ...)``, and then
evaluated on the defense.

Attacks differentiate with :func:`torch.autograd.grad` with respect to the input only, so
the ``.grad`` of model parameters is never touched, and they enable gradients internally,
so they may be called under :func:`torch.no_grad`.
"""

import math

import torch
import torch.nn.functional as F

from ..ops.validation import check_choice, check_int, check_positive, check_real

__all__ = ["attack_loss", "fgsm", "pgd", "predictive_logits", "project_l1_ball"]

_LOSSES = ("ce", "cw", "dlr")
_NORMS = ("linf", "l2", "l1")


def attack_loss(logits, y, loss="ce"):
    r"""
    Per-example loss that an untargeted attacker ascends:

    - ``"ce"``: cross-entropy :math:`-\log \mathrm{softmax}(z)_y`;
    - ``"cw"``: the Carlini & Wagner (2017) margin :math:`\max_{j \ne y} z_j - z_y`;
    - ``"dlr"``: the difference of logits ratio of Croce & Hein (2020),
      :math:`-(z_y - \max_{j \ne y} z_j) / (z_{\pi_1} - z_{\pi_3} + 10^{-12})` with
      :math:`\pi` sorting the logits in decreasing order; it is invariant to shifts and
      rescalings of the logits, so needs at least 3 classes.

    :param torch.Tensor logits: logits of shape ``(N, C)``.
    :param torch.Tensor y: integer labels of shape ``(N,)`` in ``[0, C)``.
    :param str loss: one of ``"ce"``, ``"cw"``, ``"dlr"``.
    :returns: losses of shape ``(N,)``.
    :rtype: torch.Tensor
    """
    check_choice(loss, "loss", _LOSSES)
    for name, value in (("logits", logits), ("y", y)):
        if not torch.is_tensor(value):
            raise TypeError(f"{name} must be a tensor, got {type(value).__name__}")
    if logits.dim() != 2 or tuple(y.shape) != tuple(logits.shape[:1]):
        raise ValueError(
            f"logits must have shape (N, C) and y shape (N,), got logits {tuple(logits.shape)} "
            f"and y {tuple(y.shape)}: predict_logits must return one row of logits per example"
        )
    num_classes = logits.shape[-1]
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(f"y has labels outside [0, {num_classes})")
    if loss == "ce":
        return F.cross_entropy(logits, y, reduction="none")
    index = y.unsqueeze(-1)
    z_y = logits.gather(-1, index).squeeze(-1)
    z_other = logits.scatter(-1, index, -math.inf).amax(-1)
    if loss == "cw":
        return z_other - z_y
    if num_classes < 3:
        raise ValueError(f"loss='dlr' needs at least 3 classes, got logits with {num_classes}")
    top = logits.topk(3, dim=-1).values
    return (z_other - z_y) / (top[..., 0] - top[..., 2] + 1e-12)


def predictive_logits(predict_logits_fns):
    r"""
    Log posterior-predictive probabilities
    :math:`\log \frac{1}{K} \sum_{k=1}^K \mathrm{softmax}(f_{\beta_k}(x))` of ``K`` logit
    functions (e.g. posterior draws :math:`\beta_k`, thesis section 3.5.1), usable as the
    ``predict_logits`` of an attack that targets the Bayesian predictive average.

    :param predict_logits_fns: a non-empty iterable of callables ``x -> (N, C)`` logits.
    :returns: a callable ``x -> (N, C)`` log-probabilities, which are valid logits.
    """
    fns = tuple(predict_logits_fns)
    if not fns:
        raise ValueError("predict_logits_fns must contain at least one callable")
    for i, fn in enumerate(fns):
        if not callable(fn):
            raise TypeError(
                f"predict_logits_fns must hold callables x -> logits, got "
                f"{type(fn).__name__} at index {i}"
            )

    def logits(x):
        log_probs = torch.stack([fn(x).log_softmax(-1) for fn in fns])
        return log_probs.logsumexp(0) - math.log(len(fns))

    return logits


def project_l1_ball(v, radius):
    r"""
    Euclidean projection of each row of ``v`` onto the L1 ball
    :math:`\{w : \|w\|_1 \le r\}`, by the sort-based algorithm of Duchi et al. (2008),
    "Efficient projections onto the l1-ball for learning in high dimensions", figure 1:
    :math:`w = \mathrm{sign}(v) \max(|v| - \theta, 0)` with the threshold
    :math:`\theta = (\sum_{j \le \rho} u_j - r) / \rho`, where :math:`u` is :math:`|v|`
    sorted decreasingly and :math:`\rho = \max\{j : u_j > (\sum_{i \le j} u_i - r)/j\}`.
    Rows already inside the ball are returned unchanged.

    :param torch.Tensor v: tensor of shape ``(N, ...)``; each of the ``N`` rows is
        projected over all its remaining dimensions.
    :param float radius: the radius :math:`r \ge 0`.
    :rtype: torch.Tensor
    """
    radius = check_real(radius, "radius", low=0)
    if not torch.is_tensor(v) or not v.is_floating_point():
        raise TypeError(
            f"v must be a floating-point tensor of shape (N, ...), got {type(v).__name__}"
        )
    if v.dim() < 2:
        raise ValueError(
            f"v must have shape (N, ...) with one row per example, got {tuple(v.shape)}"
        )
    flat = v.flatten(1)
    u = flat.abs().sort(dim=1, descending=True).values
    cumsum = u.cumsum(1) - radius
    j = torch.arange(1, u.shape[1] + 1, device=v.device, dtype=v.dtype)
    # rho >= 1 always, so radius = 0 gives theta = max|v| and projects to 0.
    rho = (u * j > cumsum).sum(1, keepdim=True).clamp(min=1)
    theta = (cumsum.gather(1, rho - 1) / rho).clamp(min=0)
    return (flat.sign() * (flat.abs() - theta).clamp(min=0)).view_as(v)


def _row_norm(v, p):
    """Per-row ``p``-norm of ``v`` of shape ``(N, ...)``, shaped to broadcast against it."""
    return v.flatten(1).norm(p=p, dim=1).view(-1, *(1,) * (v.dim() - 1))


def _clamp(x, clip):
    return x if clip is None else x.clamp(*clip)


def _check_inputs(x, y, eps, clip, loss, eot_samples, predict_logits=len):
    if not callable(predict_logits):
        raise TypeError(
            f"predict_logits must be a callable x -> (N, C) logits, got "
            f"{type(predict_logits).__name__}"
        )
    if clip is not None:
        try:
            low, high = (check_real(c, "clip bound") for c in clip)
        except (TypeError, ValueError):
            raise TypeError(
                f"clip must be None or a pair (low, high) of finite numbers, got {clip!r}"
            ) from None
        if not low < high:
            raise ValueError(f"clip must be None or a pair with low < high, got {tuple(clip)}")
    check_real(eps, "eps", low=0)
    check_choice(loss, "loss", _LOSSES)
    check_int(eot_samples, "eot_samples", low=1)
    if not (torch.is_tensor(x) and x.is_floating_point() and x.dim() >= 2):
        raise ValueError("x must be a floating point tensor of shape (N, ...) with ndim >= 2")
    if not x.shape[0]:
        raise ValueError("x holds no examples: give at least one row to attack")
    if bool(torch.isnan(x).any()):
        raise ValueError("x contains NaN values")
    if clip is not None:
        low, high = clip
        if x.numel() and bool((x < low).any() or (x > high).any()):
            raise ValueError(
                f"x has values outside the data domain clip={tuple(clip)}: "
                f"min {x.min().item():g}, max {x.max().item():g}"
            )
    if not torch.is_tensor(y) or y.shape != x.shape[:1]:
        raise ValueError(
            f"y must be a tensor of shape ({x.shape[0]},), got {getattr(y, 'shape', y)}"
        )
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ValueError(f"y must hold integer class labels, got dtype {y.dtype}")


def _input_grad(predict_logits, x, y, loss, eot_samples):
    r"""
    Monte Carlo estimate of :math:`\nabla_x \mathbb{E}[\ell(f(x), y)]` over
    ``eot_samples`` calls of a possibly stochastic ``predict_logits`` (EOT), with the
    mean loss and whether the mean softmax errs at ``x``, from the same calls.
    """
    x = x.detach().requires_grad_()
    grad = torch.zeros_like(x)
    value, probs = 0.0, 0.0
    with torch.enable_grad():
        # One backward per call keeps only one graph alive at a time.
        for _ in range(eot_samples):
            logits = predict_logits(x)
            losses = attack_loss(logits, y, loss)
            grad += torch.autograd.grad(losses.sum(), x)[0]
            value = value + losses.detach()
            probs = probs + logits.detach().softmax(-1)
    return grad / eot_samples, value / eot_samples, probs.argmax(-1) != y


def _check_attack_values(value, grad):
    """
    The attack loss and its input gradient must not be NaN: ``sign(NaN) = 0`` would leave
    the input where it is, and a NaN loss never wins the best-iterate comparison, so the
    attack would silently return ``x``. One host sync (two on the error path).
    """
    if not bool(torch.isnan(value).any() | torch.isnan(grad).any()):
        return
    bad = torch.isnan(value)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"predict_logits returned NaN logits (the attack loss is NaN) for example {i} "
            f"of x, and for {int(bad.sum())} examples in all: the attack cannot move them. "
            "Check the model for NaN parameters or outputs"
        )
    i = int(torch.isnan(grad).flatten(1).any(1).nonzero()[0, 0])
    raise ValueError(
        f"the input gradient of the attack loss is NaN for example {i} of x: check that "
        "predict_logits is differentiable in x without NaN gradients"
    )


@torch.no_grad()
def _loss_and_fooled(predict_logits, x, y, loss, eot_samples):
    """Mean attack loss over ``eot_samples`` calls, and whether the mean softmax errs."""
    logits = [predict_logits(x) for _ in range(eot_samples)]
    value = torch.stack([attack_loss(z, y, loss) for z in logits]).mean(0)
    probs = torch.stack([z.softmax(-1) for z in logits]).mean(0)
    return value, probs.argmax(-1) != y


def _random_start(x, eps, norm, generator):
    """Uniform in the linf box; otherwise a random direction with a uniform radius."""
    kwargs = dict(generator=generator, device=x.device, dtype=x.dtype)
    if norm == "linf":
        return (2 * torch.rand(x.shape, **kwargs) - 1) * eps
    direction = torch.randn(x.shape, **kwargs)
    direction = direction / _row_norm(direction, 2 if norm == "l2" else 1).clamp(min=1e-12)
    radius = torch.rand(x.shape[0], **kwargs).view(-1, *(1,) * (x.dim() - 1)) * eps
    return direction * radius


def _ascent_direction(grad, x_adv, norm, clip, l1_sparsity):
    if norm == "linf":
        return grad.sign()
    if norm == "l2":
        return grad / _row_norm(grad, 2).clamp(min=1e-12)
    # SLIDE (Tramer & Boneh 2019): coordinates stuck at the domain boundary with an
    # outward gradient cannot move, so they must not take up the sparse step's budget.
    if clip is not None:
        low, high = clip
        grad = grad.masked_fill(((x_adv <= low) & (grad < 0)) | ((x_adv >= high) & (grad > 0)), 0)
    flat = grad.flatten(1)
    k = min(max(math.ceil(l1_sparsity * flat.shape[1]), 1), flat.shape[1])
    threshold = flat.abs().kthvalue(k, dim=1, keepdim=True).values
    # sign(0) = 0 drops the masked coordinates even when the threshold is 0.
    step = flat.sign() * (flat.abs() >= threshold)
    return (step / step.abs().sum(1, keepdim=True).clamp(min=1)).view_as(grad)


def _project(delta, eps, norm):
    if norm == "linf":
        return delta.clamp(-eps, eps)
    if norm == "l2":
        return delta * (eps / _row_norm(delta, 2).clamp(min=1e-12)).clamp(max=1)
    return project_l1_ball(delta, eps)


def fgsm(predict_logits, x, y, eps, clip=(0, 1), loss="ce", eot_samples=1):
    r"""
    Fast gradient sign method (Goodfellow et al. 2015; thesis section 3.5.1), untargeted:
    :math:`x' = \mathrm{clip}(x + \epsilon\, \mathrm{sign} \nabla_x \ell(f(x), y))`.

    :param callable predict_logits: ``x -> (N, C)`` logits, possibly stochastic.
    :param torch.Tensor x: inputs of shape ``(N, ...)`` inside ``clip``.
    :param torch.Tensor y: integer labels of shape ``(N,)``.
    :param float eps: linf radius :math:`\epsilon \ge 0`, in data units.
    :param clip: the data domain ``(low, high)``, or ``None`` for an unbounded one.
    :param str loss: the loss ascended, see :func:`attack_loss`.
    :param int eot_samples: calls of ``predict_logits`` the gradient is averaged over.
    :returns: detached adversarial inputs, same shape, dtype and device as ``x``.
    :rtype: torch.Tensor
    """
    _check_inputs(x, y, eps, clip, loss, eot_samples, predict_logits)
    grad, value, _ = _input_grad(predict_logits, x, y, loss, eot_samples)
    _check_attack_values(value, grad)
    return _clamp(x.detach() + eps * grad.sign(), clip)


def pgd(
    predict_logits,
    x,
    y,
    eps,
    steps,
    step_size,
    norm="linf",
    restarts=1,
    clip=(0, 1),
    loss="ce",
    random_start=True,
    eot_samples=1,
    generator=None,
    l1_sparsity=0.99,
):
    r"""
    Projected gradient ascent of Madry et al. (2018), "Towards deep learning models
    resistant to adversarial attacks", on :math:`\ell(f(x'), y)` over
    :math:`\|x' - x\| \le \epsilon`, :math:`x' \in [\text{low}, \text{high}]^d`:
    :math:`x_{t+1} = \mathrm{clip}(x + \Pi_\epsilon(x_t + \alpha\, d_t - x))` with

    - ``"linf"``: :math:`d_t = \mathrm{sign}\, g_t`, :math:`\Pi` clamps to the box;
    - ``"l2"``: :math:`d_t = g_t / \|g_t\|_2`, :math:`\Pi` rescales onto the ball;
    - ``"l1"``: SLIDE (Tramer & Boneh 2019): :math:`d_t` is the sign of :math:`g_t` on
      its coordinates at or above the ``l1_sparsity`` quantile of :math:`|g_t|`,
      normalised to unit L1 norm, skipping coordinates at the domain boundary whose
      gradient points outward; :math:`\Pi` is :func:`project_l1_ball`.

    Clamping to the domain after projecting keeps the norm bound, since with
    :math:`x` inside the domain it moves every coordinate of the perturbation towards 0.
    Each example keeps its best iterate over all steps and restarts, as AutoAttack does:
    the highest-loss one among those that misclassify (by the mean softmax over
    ``eot_samples`` calls), or the highest-loss one if none does; so with the same
    ``generator`` seed, more steps or restarts never weaken the attack against a
    deterministic model. A transfer attack is ``pgd(source_logits, ...)`` on an
    undefended source model, evaluated on the defense.

    :param callable predict_logits: ``x -> (N, C)`` logits, possibly stochastic.
    :param torch.Tensor x: inputs of shape ``(N, ...)`` inside ``clip``.
    :param torch.Tensor y: integer labels of shape ``(N,)``.
    :param float eps: radius :math:`\epsilon \ge 0`, in data units.
    :param int steps: number of ascent steps :math:`\ge 1`.
    :param float step_size: :math:`\alpha > 0`, in the units of ``norm``.
    :param str norm: ``"linf"``, ``"l2"`` or ``"l1"``.
    :param int restarts: number of independent runs, the best kept per example.
    :param clip: the data domain ``(low, high)``, or ``None`` for an unbounded one.
    :param str loss: the loss ascended, see :func:`attack_loss`.
    :param bool random_start: start from a random point of the ball rather than ``x``.
    :param int eot_samples: calls of ``predict_logits`` each gradient is averaged over.
    :param torch.Generator generator: source of the random starts, on ``x.device``;
        the same seed gives the same output for a deterministic ``predict_logits``.
    :param float l1_sparsity: for ``norm="l1"``, the quantile in ``[0, 1]`` of
        :math:`|g_t|` above which coordinates are stepped.
    :returns: detached adversarial inputs, same shape, dtype and device as ``x``.
    :rtype: torch.Tensor
    """
    _check_inputs(x, y, eps, clip, loss, eot_samples, predict_logits)
    check_int(steps, "steps", low=1)
    check_positive(step_size, "step_size")
    check_choice(norm, "norm", _NORMS)
    check_int(restarts, "restarts", low=1)
    check_real(l1_sparsity, "l1_sparsity", 0, 1)
    x = x.detach()
    batch_shape = (-1,) + (1,) * (x.dim() - 1)
    best = None
    checked = False
    for _ in range(restarts):
        delta = _random_start(x, eps, norm, generator) if random_start else torch.zeros_like(x)
        x_adv = _clamp(x + delta, clip)
        for step in range(steps + 1):
            if step < steps:
                grad, value, fooled = _input_grad(predict_logits, x_adv, y, loss, eot_samples)
                if not checked:  # once, at the start: not a sync per step
                    _check_attack_values(value, grad)
                    checked = True
            else:
                value, fooled = _loss_and_fooled(predict_logits, x_adv, y, loss, eot_samples)
            if best is None:
                best, best_value, best_fooled = x_adv, value, fooled
            else:
                better = (fooled & ~best_fooled) | ((fooled == best_fooled) & (value > best_value))
                best = torch.where(better.view(batch_shape), x_adv, best)
                best_value = torch.where(better, value, best_value)
                best_fooled = best_fooled | fooled
            if step < steps:
                direction = _ascent_direction(grad, x_adv, norm, clip, l1_sparsity)
                x_adv = _clamp(x + _project(x_adv + step_size * direction - x, eps, norm), clip)
    return best
