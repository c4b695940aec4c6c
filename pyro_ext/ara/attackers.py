r"""
Attacker models :math:`p_C(x' \mid x, y)` for continuous data (thesis section 3.5.1).

Adversarial training replaces each training input by the single, deterministic answer of
one attack: a Dirac delta at the FGSM or PGD solution. The ARA defender is instead
uncertain about the attack, and samples attacked inputs from regions of high adversarial
loss with the Langevin-type iterates of eq. (3.14),

.. math::

    x_{t+1} = x_t + \epsilon\, \mathrm{sign} \nabla_x \ell(f_\beta(x_t), y)
        + \mathcal{N}(0, 2 \epsilon), \qquad t = 1, \ldots, T,

where :math:`\ell = -\log p_C(y \mid x, \beta)` (the thesis writes the descent on
:math:`\log p_C`, the same step), with the attack intensity :math:`\epsilon` drawn from a
rescaled Beta distribution and the number of iterations :math:`T` from a shifted Poisson
distribution, per example. Mixtures of attack kinds (e.g. sign steps on the
cross-entropy against L2 steps on the Carlini & Wagner margin) are drawn per example by
a Categorical choice.

Both models are sample-only Pyro distributions: the density of an attacked input is
intractable, so ``log_prob`` is not available, but ``pyro.sample("x_attacked",
LangevinAttacker(...))`` runs inside any Pyro program.
"""

import torch
from pyro.distributions import TorchDistribution
from torch.distributions import constraints

from ..ops.validation import check_choice, check_int, check_positive, check_real
from .attacks import attack_loss

__all__ = ["AttackMixture", "LangevinAttacker", "langevin_attack"]

_LOSSES = ("ce", "cw", "dlr")
_NORMS = ("linf", "l2")
# Most iterations of eq. (3.14) one attack may run: the thesis draws T ~ Poisson with a
# mean of a few, and a million forward/backward passes is already hours for a real network;
# a Poisson draw without max_steps is clamped here, and a larger count given is refused.
MAX_STEPS = 10**6


def _per_example(values, x):
    """Reshape per-example values ``(N,)`` to broadcast against ``x`` ``(N, ...)``."""
    return values.reshape((-1,) + (1,) * (x.dim() - 1))


def _ascent_direction(grad, norm):
    if norm == "linf":
        return grad.sign()
    # A zero gradient gives a zero step, as sign(0) = 0 does for the linf attack.
    return grad / _per_example(grad.flatten(1).norm(dim=1), grad).clamp(min=1e-12)


def langevin_attack(
    predict_logits, x, y, eps, steps, noise_scale=1.0, loss="ce", norm="linf", clip=(0.0, 1.0)
):
    r"""
    The noisy attack iterates of eq. (3.14) from ``x``, with per-example intensity and
    number of iterations::

        x_{t+1} = clip(x_t + eps * d_t + sqrt(2 eps noise_scale) * xi_t),  xi_t ~ N(0, I)

    for ``t < steps``, where ``d_t`` is the sign of the input gradient of the attack loss
    (``norm="linf"``, FGSM steps) or its L2-normalised direction (``norm="l2"``). With
    ``noise_scale=0`` this is iterated FGSM, i.e. PGD without projection onto a ball. The
    loss is ascended on ``predict_logits`` as given: pass the posterior-predictive
    logits, or those of one posterior draw, for an attacker uncertain about the defender.

    :param callable predict_logits: ``x -> (N, C)`` logits.
    :param torch.Tensor x: inputs ``(N, ...)``.
    :param torch.Tensor y: integer labels ``(N,)``.
    :param torch.Tensor eps: per-example step sizes ``(N,)``.
    :param torch.Tensor steps: per-example numbers of iterations ``(N,)``, integers in
        ``[0, MAX_STEPS]``; the batch runs ``max(steps)`` iterations, each example moving
        during its first ``steps[i]``.
    :param float noise_scale: multiplies the noise variance ``2 eps`` of eq. (3.14).
    :param str loss: ``"ce"``, ``"cw"`` or ``"dlr"``, see
        :func:`~pyro_ext.ara.attacks.attack_loss`.
    :param str norm: ``"linf"`` or ``"l2"``.
    :param clip: the data domain ``(low, high)``, applied after every step, or ``None``.
    :returns: detached attacked inputs, same shape as ``x``.
    :rtype: torch.Tensor
    """
    _check_langevin_arguments(x, eps, steps, noise_scale, norm)
    return _langevin_attack(predict_logits, x, y, eps, steps, noise_scale, loss, norm, clip)


def _check_langevin_arguments(x, eps, steps, noise_scale, norm):
    try:
        check_real(noise_scale, "noise_scale", low=0)
    except ValueError as error:
        raise ValueError(f"{error} (it multiplies the noise variance 2 eps)") from None
    check_choice(norm, "norm", _NORMS)
    if not torch.is_tensor(x) or x.dim() < 1:
        raise TypeError(f"x must be a tensor of shape (N, ...), got {type(x).__name__}")
    num = x.shape[0]
    for name, value in (("eps", eps), ("steps", steps)):
        if not torch.is_tensor(value):
            raise TypeError(
                f"{name} must be a tensor of per-example values of shape ({num},), "
                f"got {type(value).__name__}"
            )
        if tuple(value.shape) != (num,) and value.numel() != 1:
            raise ValueError(
                f"{name} must have shape ({num},) (or one value for all), got {tuple(value.shape)}"
            )
    if steps.is_complex() or steps.dtype == torch.bool:
        raise TypeError(f"steps must hold integer numbers of iterations, got dtype {steps.dtype}")
    flat_steps = steps.reshape(-1)
    # Whole numbers, float dtypes included (steps.max() sets the loop's length).
    bad_steps = ~(
        (flat_steps >= 0) & (flat_steps <= MAX_STEPS) & (flat_steps == flat_steps.floor())
    )
    if flat_steps.numel() and bool(bad_steps.any()):
        i = int(bad_steps.nonzero()[0, 0])
        raise ValueError(
            f"steps must hold whole numbers of iterations in [0, {MAX_STEPS}] (MAX_STEPS bounds "
            f"the loop), got steps[{i}] = {flat_steps[i].item()}"
        )
    flat = eps.reshape(-1).to(x.dtype if x.is_floating_point() else torch.get_default_dtype())
    bad = ~(torch.isfinite(flat) & (flat >= 0))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"eps must hold finite step sizes >= 0 (the noise sd is sqrt(2 eps noise_scale)), "
            f"got eps[{i}] = {float(flat[i]):g}"
        )


def _langevin_attack(predict_logits, x, y, eps, steps, noise_scale, loss, norm, clip):
    """:func:`langevin_attack` without the argument checks (done once by the caller)."""
    x_t = x.detach()
    step_scale = _per_example(eps.to(x.dtype), x)
    noise_sd = (2.0 * noise_scale * step_scale).sqrt()
    for t in range(int(steps.max()) if steps.numel() else 0):
        x_t.requires_grad_(True)
        with torch.enable_grad():
            (grad,) = torch.autograd.grad(attack_loss(predict_logits(x_t), y, loss).sum(), x_t)
        x_t = x_t.detach()
        moved = x_t + step_scale * _ascent_direction(grad, norm)
        if noise_scale:
            moved = moved + noise_sd * torch.randn_like(x_t)
        if clip is not None:
            moved = moved.clamp(*clip)
        x_t = torch.where(_per_example(steps > t, x), moved, x_t)
    return x_t


class LangevinAttacker(TorchDistribution):
    r"""
    The ARA attacker model of thesis section 3.5.1: the defender's uncertainty about an
    attacker who runs the noisy iterates of eq. (3.14) (:func:`langevin_attack`) with
    unknown intensity and effort. Per example,

    - the step size is :math:`\epsilon = \epsilon_{low} + (\epsilon_{high} -
      \epsilon_{low}) B`, :math:`B \sim \mathrm{Beta}(a, b)` (a rescaled Beta: neither
      too weak nor too strong an attack), or fixed when ``eps`` is a number;
    - the number of iterations is :math:`T = T_0 + \mathrm{Poisson}(\lambda)` (the thesis
      takes :math:`T_0 = 1`), truncated at ``max_steps``, or fixed :math:`T_0` when
      :math:`\lambda = 0`.

    With a fixed ``eps``, ``steps_rate=0`` and ``noise_scale=0`` the draw is
    deterministic: iterated FGSM (PGD without projection). The thesis' noise variance
    :math:`2\epsilon` is large for pixels in ``[0, 1]`` (standard deviation 0.45 at
    :math:`\epsilon = 0.1`, before clipping), so ``noise_scale`` multiplies it.

    A sample-only distribution: the density of :math:`x'` is intractable, so
    :meth:`log_prob` is not available. Batch shape ``(N,)``, event shape
    ``x.shape[1:]``, support the interval ``clip``. ``sample(sample_shape)`` draws
    ``sample_shape + x.shape`` attacked inputs, each with its own intensity and noise.

    :param callable predict_logits: ``x -> (N, C)`` logits of the attacked model (white
        box); differentiable in ``x``.
    :param torch.Tensor x: clean inputs ``(N, ...)``, inside ``clip``.
    :param torch.Tensor y: their integer labels ``(N,)``.
    :param eps: a fixed step size, or ``(low, high)`` for the rescaled Beta.
    :param tuple eps_concentration: Beta ``(a, b)``.
    :param int steps: :math:`T_0`, the number of iterations (the minimum when random).
    :param float steps_rate: Poisson rate :math:`\lambda` of the extra iterations.
    :param int max_steps: cap on :math:`T`, bounding the cost of a draw; ``None`` for
        :data:`MAX_STEPS` (``10**6``), the most ``steps``, ``steps_rate`` and ``max_steps``
        may be.
    :param float noise_scale: multiplies the noise variance ``2 eps`` of eq. (3.14).
    :param str loss: the loss ascended, ``"ce"``, ``"cw"`` or ``"dlr"``.
    :param str norm: ``"linf"`` (sign steps) or ``"l2"`` (normalised gradient steps).
    :param clip: the data domain ``(low, high)``, or ``None`` for an unbounded one.

    Example, inside a Pyro program::

        attacker = LangevinAttacker(net, x, y, eps=(0.02, 0.1), steps=1, steps_rate=2.0,
                                    noise_scale=0.01)
        x_attacked = pyro.sample("x_attacked", attacker)
    """

    arg_constraints = {}
    has_rsample = False
    #: :meth:`sample` calls ``predict_logits`` only on whole batches whose row ``i`` is a
    #: version of ``x[i]``, and treats rows independently: a caller may then attack
    #: stacked copies of ``x`` against different models in one draw
    #: (:class:`~pyro_ext.ara.training.ARATrainer` does, one copy per particle).
    row_aligned = True

    def __init__(
        self,
        predict_logits,
        x,
        y,
        eps=0.1,
        steps=1,
        steps_rate=0.0,
        max_steps=None,
        noise_scale=1.0,
        eps_concentration=(2.0, 2.0),
        loss="ce",
        norm="linf",
        clip=(0.0, 1.0),
        validate_args=None,
    ):
        if not callable(predict_logits):
            raise TypeError(
                f"predict_logits must be a callable x -> logits, got {type(predict_logits).__name__}"
            )
        if not torch.is_tensor(x) or x.dim() < 2 or not x.is_floating_point():
            raise ValueError("x must be a floating-point tensor of shape (N, ...)")
        if not torch.is_tensor(y) or tuple(y.shape) != (x.shape[0],):
            raise ValueError(
                f"y must be a tensor of shape ({x.shape[0]},), got {getattr(y, 'shape', y)}"
            )
        if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
            raise ValueError(f"y must hold integer class labels, got dtype {y.dtype}")
        if isinstance(eps, (tuple, list)):
            if len(eps) != 2:
                raise ValueError(f"eps must be a number or a (low, high) pair, got {eps!r}")
            low, high = (check_real(e, "eps", low=0) for e in eps)
            if low > high:
                raise ValueError(f"eps range must have low <= high, got {eps!r}")
        else:
            low = high = check_real(eps, "eps", low=0)
        concentration = tuple(check_positive(c, "eps_concentration") for c in eps_concentration)
        if len(concentration) != 2:
            raise ValueError(f"eps_concentration must be a pair (a, b), got {eps_concentration!r}")
        steps = check_int(steps, "steps", low=0)
        steps_rate = check_real(steps_rate, "steps_rate", low=0)
        if max_steps is not None:
            max_steps = check_int(max_steps, "max_steps", low=max(steps, 1))
        if steps == 0 and steps_rate == 0:
            raise ValueError(
                "steps=0 with steps_rate=0 is an attacker that never moves x: give steps >= 1 "
                "or a steps_rate > 0 (T = steps + Poisson(steps_rate))"
            )
        for name, value in (("steps", steps), ("steps_rate", steps_rate), ("max_steps", max_steps)):
            if value is not None and value > MAX_STEPS:
                raise ValueError(
                    f"{name} must be at most MAX_STEPS = {MAX_STEPS} (it bounds the loop of "
                    f"eq. 3.14), got {value}"
                )
        noise_scale = check_real(noise_scale, "noise_scale", low=0)
        check_choice(loss, "loss", _LOSSES)
        check_choice(norm, "norm", _NORMS)
        if clip is not None:
            clip = tuple(float(c) for c in clip)
            if len(clip) != 2 or not clip[0] < clip[1]:
                raise ValueError(f"clip must be None or a pair low < high, got {clip!r}")
            if x.numel() and (float(x.min()) < clip[0] or float(x.max()) > clip[1]):
                raise ValueError(
                    f"x lies outside the attacker's domain clip={clip}: rescale the inputs "
                    "or pass the data's range as clip"
                )
        self.predict_logits, self.x, self.y = predict_logits, x, y
        self.eps_range = (low, high)
        self.clip = clip
        self._options = dict(
            eps=eps,
            steps=steps,
            steps_rate=steps_rate,
            max_steps=max_steps,
            noise_scale=noise_scale,
            eps_concentration=concentration,
            loss=loss,
            norm=norm,
            clip=clip,
        )
        super().__init__(x.shape[:1], x.shape[1:], validate_args=validate_args)

    @constraints.dependent_property
    def support(self):
        if self.clip is None:
            return constraints.independent(constraints.real, len(self.event_shape))
        return constraints.independent(constraints.interval(*self.clip), len(self.event_shape))

    def sample_hyperparameters(self, sample_shape=torch.Size()):
        """
        Draw the per-example attack intensity ``eps`` and number of iterations ``steps``,
        both of shape ``sample_shape + (N,)``.
        """
        shape = torch.Size(sample_shape) + self.batch_shape
        low, high = self.eps_range
        options = self._options
        eps = self.x.new_full(shape, low)
        if high > low:
            a, b = (self.x.new_tensor(c) for c in options["eps_concentration"])
            eps = eps + (high - low) * torch.distributions.Beta(a, b).sample(shape)
        steps = torch.full(shape, options["steps"], dtype=torch.long, device=self.x.device)
        if options["steps_rate"] > 0:
            extra = torch.poisson(self.x.new_full(shape, options["steps_rate"]))
            steps = steps + extra.long()
        # Without max_steps, MAX_STEPS still bounds a Poisson draw's loop.
        steps = steps.clamp(max=options["max_steps"] or MAX_STEPS)
        return eps, steps

    def sample(self, sample_shape=torch.Size()):
        sample_shape = torch.Size(sample_shape)
        eps, steps = self.sample_hyperparameters(sample_shape)
        x = self.x.expand(sample_shape + self.x.shape).reshape((-1,) + self.x.shape[1:])
        y = self.y.expand(sample_shape + self.y.shape).reshape(-1)
        options = self._options
        # The arguments were checked by the constructor; eps >= 0 by construction.
        x_attacked = _langevin_attack(
            self.predict_logits,
            x,
            y,
            eps.reshape(-1),
            steps.reshape(-1),
            options["noise_scale"],
            options["loss"],
            options["norm"],
            options["clip"],
        )
        return x_attacked.reshape(self._extended_shape(sample_shape))

    def subset(self, index):
        """The same attacker model on the rows ``index`` of ``x`` and ``y``."""
        return type(self)(self.predict_logits, self.x[index], self.y[index], **self._options)


class AttackMixture(TorchDistribution):
    r"""
    A mixture of attacker models (thesis section 3.5.1: "sampling a Bernoulli random
    variable and, then, choosing the gradient corresponding to either FGSM or another
    attack"): each example, and each draw, is attacked by component ``k`` with
    probability ``probs[k]``. Only the chosen component runs on an example.

    Components are :class:`LangevinAttacker` (or any attacker model with a
    ``subset(index)`` method) over the same clean inputs and domain. Sample-only, like
    its components.

    :param list attackers: the component attacker models.
    :param probs: mixture weights (normalised here); uniform by default.

    Example, FGSM-type steps half the time, L2 steps on the C&W margin otherwise::

        mixture = AttackMixture([
            LangevinAttacker(net, x, y, eps=(0.05, 0.2)),
            LangevinAttacker(net, x, y, eps=(0.5, 2.0), loss="cw", norm="l2"),
        ])
    """

    arg_constraints = {}
    has_rsample = False

    def __init__(self, attackers, probs=None, validate_args=None):
        attackers = list(attackers)
        if not attackers:
            raise ValueError("attackers must hold at least one attacker model")
        first = attackers[0]
        for attacker in attackers:
            if not hasattr(attacker, "subset"):
                raise TypeError(
                    f"attackers must hold attacker models with a subset(index) method, such "
                    f"as LangevinAttacker; got {type(attacker).__name__}"
                )
            if (
                attacker.batch_shape != first.batch_shape
                or attacker.event_shape != first.event_shape
            ):
                raise ValueError("all attackers must attack inputs of the same shape")
            if attacker.clip != first.clip:
                raise ValueError("all attackers must share the data domain clip")
        if probs is None:
            probs = torch.ones(len(attackers))
        probs = torch.as_tensor(probs, dtype=first.x.dtype, device=first.x.device)
        if (
            probs.shape != (len(attackers),)
            or not bool((probs >= 0).all() & torch.isfinite(probs).all())
            or not float(probs.sum()) > 0
        ):
            raise ValueError(
                f"probs must hold {len(attackers)} finite non-negative weights, not all zero"
            )
        self.attackers = attackers
        self.probs = probs / probs.sum()
        self.clip = first.clip
        super().__init__(first.batch_shape, first.event_shape, validate_args=validate_args)

    @constraints.dependent_property
    def support(self):
        return self.attackers[0].support

    def sample(self, sample_shape=torch.Size()):
        shape = torch.Size(sample_shape) + self.batch_shape
        choice = torch.distributions.Categorical(self.probs).sample(shape).reshape(-1)
        # Draw j of the flattened sample attacks row j mod N of the clean inputs.
        rows = torch.arange(choice.numel(), device=choice.device) % self.batch_shape[0]
        out = self.attackers[0].x.new_empty((choice.numel(),) + self.event_shape)
        for k, attacker in enumerate(self.attackers):
            (draws,) = (choice == k).nonzero(as_tuple=True)
            if draws.numel():
                out[draws] = attacker.subset(rows[draws]).sample()
        return out.reshape(shape + self.event_shape)

    def subset(self, index):
        """The same mixture on the rows ``index`` of the clean inputs."""
        return type(self)([a.subset(index) for a in self.attackers], self.probs)
