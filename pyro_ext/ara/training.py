r"""
Robust training of differentiable classifiers (thesis section 3.5.1).

:class:`ARATrainer` is Algorithm 3.2, large-scale ARA-robust training: the defender's
posterior over the weights :math:`\beta` is sampled with SG-MCMC (eq. 3.15) on a 1:1 mix
of clean minibatch rows and rows attacked by an attacker model :math:`p_C(x' \mid x)`
such as :class:`~pyro_ext.ara.attackers.LangevinAttacker` (eq. 3.14), which attacks the
current posterior sample. Predictions average the ``K`` final particles,
:math:`p_C(y \mid x) = \frac1K \sum_k p_C(y \mid x, \beta_k)`.

:class:`AdversarialTrainer` is the point-estimate baseline: Madry et al.'s adversarial
training (SGD on PGD-attacked minibatches) and, with ``clean_fraction=1``, plain
training. All trainers share ``fit`` / ``epoch_times`` / ``predict_logits`` /
``predict``, so that a benchmark can treat the defenses alike.
"""

import functools
import math
import time

import pyro
import torch
import torch.nn.functional as F
from pyro.infer.autoguide.initialization import init_to_median
from pyro.poutine.messenger import Messenger

from pyro_ext.infer.potential import PerParticle
from pyro_ext.infer.sgmcmc import get_kernel

from ..ops.validation import check_choice, check_int, check_positive, check_real
from .attacks import pgd, predictive_logits

__all__ = ["ATTACKS", "ARATrainer", "AdversarialTrainer", "init_fan_in"]

#: How :class:`ARATrainer` attacks: one attacked batch per particle (Algorithm 3.2), or one
#: shared by all particles.
ATTACKS = ("per_particle", "shared")


def init_fan_in(site):
    r"""
    Pyro initialisation strategy for neural network weights: weight matrices (sites of
    at least two dimensions, ``(out, in)``) start at :math:`\mathcal{N}(0, 1 / \text{in})`
    (LeCun initialisation, which keeps the scale of the activations through the layers),
    every other site at its prior median. The default start of
    :class:`~pyro_ext.infer.SGLD`, uniform in ``(-2, 2)``, saturates a wide first layer.
    """
    value = init_to_median(site)
    if value.dim() < 2:
        return value
    return torch.randn_like(value) / math.sqrt(value.shape[-1])


def _check_data(x, y, num_classes=None):
    if not torch.is_tensor(x) or x.dim() < 2 or not x.is_floating_point():
        raise ValueError("x must be a floating-point tensor of shape (N, ...)")
    if not torch.is_tensor(y) or tuple(y.shape) != (x.shape[0],):
        raise ValueError(
            f"y must be a tensor of shape ({x.shape[0]},) matching x, got {getattr(y, 'shape', y)}"
        )
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ValueError(f"y must hold integer class labels, got dtype {y.dtype}")
    if x.shape[0] == 0:
        raise ValueError("x holds no examples")
    # Once per fit, on the whole data set (one host sync), not per minibatch.
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        index = tuple(int(i) for i in (~finite).nonzero()[0])
        raise ValueError(
            f"x must be finite: x[{', '.join(map(str, index))}] is {float(x[index])} (first of "
            f"{int((~finite).sum())} NaN or infinite values); remove or impute those examples"
        )
    if num_classes is not None and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(
            f"y labels must lie in [0, {num_classes}), got range [{int(y.min())}, {int(y.max())}]"
        )


def _num_attacked(batch, clean_fraction):
    return int(round((1.0 - clean_fraction) * batch))


def _logits_of(fn):
    # The observation site may be wrapped (.to_event(), masking): unwrap to the Categorical.
    while not hasattr(fn, "logits"):
        fn = fn.base_dist
    return fn.logits


class _LikelihoodScale(Messenger):
    """Scales the observed sites only: the minibatch likelihood estimates the full one."""

    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def _pyro_sample(self, msg):
        if msg["is_observed"]:
            msg["scale"] = self.scale * msg["scale"]


class _MinibatchModel:
    """``model(x, y)`` on a minibatch with its likelihood weighted by ``N / |batch|``."""

    def __init__(self, model):
        self.model = model

    def __call__(self, x, y, scale):
        with _LikelihoodScale(scale):
            return self.model(x, y)


class ARATrainer:
    r"""
    Large-scale ARA-robust training of a differentiable Bayesian classifier, thesis
    Algorithm 3.2. Every step

    1. draws a minibatch;
    2. for each of the ``K`` particles :math:`\beta_k`, replaces a ``1 - clean_fraction``
       share of the minibatch rows by a draw :math:`x_k \sim p_C(x' \mid x)` of the
       attacker model against that particle (white box, detached from the weights); the
       thesis keeps clean and attacked data 1:1;
    3. moves each particle with one SG-MCMC step (SGLD, eq. 3.15, or SGHMC, the thesis'
       SGD with momentum plus noise) on the log joint of its own mixed minibatch, its
       likelihood scaled by ``N / |batch|``.

    An attacker model that declares ``row_aligned`` (as
    :class:`~pyro_ext.ara.attackers.LangevinAttacker` does: rows attacked independently,
    scored in whole batches) draws the ``K`` attacks as one attack on ``K`` stacked copies
    of the rows, copy ``k`` scored by particle ``k``; any other is drawn once per
    particle. The ``K`` updates run in one vectorised pass, each particle on its own data
    (:class:`~pyro_ext.infer.PerParticle`). ``attacks="shared"`` is the cheaper departure
    from the algorithm: one attacked batch, against a particle drawn at random each step,
    moves every particle. It crafts ``K`` times fewer attacks; ``benchmarks/ara_scalable.py``
    compares the two defences' robustness.

    The SG-MCMC machinery is :mod:`pyro_ext.infer.sgmcmc`'s: the kernel's update
    (:func:`~pyro_ext.infer.sgmcmc.sgld_update`, :func:`~pyro_ext.infer.sgmcmc.sghmc_update`),
    its :class:`~pyro_ext.infer.potential.ParticlePotential` (whose model arguments are the
    current mixed minibatch) and its divergence check, which raises
    :class:`~pyro_ext.infer.SamplerDivergenceError` with the step.

    :param model: a Pyro classifier ``model(x, y=None)`` with continuous latent weights
        (e.g. :class:`~pyro_ext.models.BayesianMLP` with ``likelihood="categorical"``,
        or any ``PyroModule`` with ``PyroSample`` priors) and a Categorical observation
        site ``"obs"`` over the rows of ``x``, differentiable in ``x``.
    :param attacker: a factory ``(predict_logits, x, y) -> attacker model`` whose
        ``sample()`` gives attacked inputs of ``x``'s shape, e.g.
        ``functools.partial(LangevinAttacker, eps=(0.05, 0.2), steps_rate=2.0)``; it is
        also built once on the whole training set to validate it, so building must be
        cheap (a distribution is lazy). ``None`` trains on clean data only: plain SG-MCMC.
    :param float step_size: SG-MCMC step size on the gradient of the log joint; an SGD
        learning rate ``lr`` on the mean negative log-likelihood corresponds to
        ``step_size = lr / N``.
    :param str kernel: ``"sgld"`` (Algorithm 3.2) or ``"sghmc"`` (SGD with momentum
        ``1 - friction`` plus noise).
    :param str attacks: ``"per_particle"`` (default, Algorithm 3.2: each particle moves on
        its own attacked rows) or ``"shared"`` (one attacked batch, against a random
        particle, moves them all).
    :param int num_particles: the number ``K`` of particles (5 in the thesis).
    :param float friction: ``1 - momentum`` for ``"sghmc"`` (thesis MNIST: momentum 0.5).
    :param int batch_size: minibatch size (32 in the thesis).
    :param float clean_fraction: share of clean rows in each minibatch, in ``[0, 1]``.
    :param float temperature: scales the injected noise; 1 samples the posterior.
    :param repulsion: ``None`` or ``"rbf"``, see :class:`~pyro_ext.infer.SGLD`.
    :param init_strategy: Pyro initialisation strategy per particle
        (default :func:`init_fan_in`).
    :param jit_compile: compile the SG-MCMC step (``True`` or ``"trace"``, see
        :class:`~pyro_ext.infer.SGMCMCKernel`); the full batches and the last, smaller one
        of an epoch are compiled once each. The attack itself runs eagerly.

    :ivar list epoch_times: wall-clock seconds of each epoch trained.
    :ivar kernel: the :class:`~pyro_ext.infer.SGMCMCKernel` holding the particles.
    """

    def __init__(
        self,
        model,
        attacker=None,
        *,
        step_size,
        kernel="sgld",
        attacks="per_particle",
        num_particles=5,
        friction=0.5,
        batch_size=32,
        clean_fraction=0.5,
        temperature=1.0,
        repulsion=None,
        init_strategy=init_fan_in,
        jit_compile=False,
    ):
        if not callable(model):
            raise ValueError("model must be a callable Pyro model")
        if attacker is not None and not callable(attacker):
            raise ValueError("attacker must be None or a factory (predict_logits, x, y) -> model")
        get_kernel(kernel)  # a ValueError naming the registered kernels
        self.attacks = check_choice(attacks, "attacks", ATTACKS)
        self.model, self.attacker = model, attacker
        self.step_size = check_positive(step_size, "step_size")
        self.num_particles = check_int(num_particles, "num_particles", low=1)
        self.friction = check_real(friction, "friction", 0, 1, low_open=True)
        self.batch_size = check_int(batch_size, "batch_size", low=1)
        self.clean_fraction = check_real(clean_fraction, "clean_fraction", 0, 1)
        self.temperature = check_real(temperature, "temperature", low=0)
        self.kernel_name, self.repulsion, self.init_strategy = kernel, repulsion, init_strategy
        self.jit_compile = jit_compile
        self.kernel = None
        self.num_classes = None
        self.epoch_times = []
        self._params = None
        self._target = 0

    # -- particles and predictions ---------------------------------------------------
    def _site_values(self, z):
        return self.kernel.potential.constrain(z)

    def _particle_logits(self, z, x):
        """Logits ``(N, C)`` of the classifier with the weights of flat particle ``z``."""
        conditioned = pyro.poutine.condition(self.model, self._site_values(z))
        with pyro.poutine.block(), pyro.validation_enabled(False):
            trace = pyro.poutine.trace(conditioned).get_trace(x)
        return _logits_of(trace.nodes["obs"]["fn"])

    def _attack_logits(self, x):
        """The attacker's white-box target: the particle drawn for this step."""
        return self._particle_logits(self.kernel.particles[self._target].detach(), x)

    def _stacked_logits(self, x):
        """Logits of ``K`` stacked blocks of rows ``(K n, ...)``, block ``k`` by particle
        ``k``: ``K`` white-box targets in one vectorised pass, differentiable in ``x``."""
        particles = self.kernel.particles.detach()
        if x.shape[0] % particles.shape[0]:
            raise RuntimeError(
                f"the attacker scored {x.shape[0]} rows, not {particles.shape[0]} stacked "
                "blocks of its rows: an attacker model with row_aligned = True must call "
                "predict_logits on whole batches of its inputs"
            )
        blocks = x.reshape((particles.shape[0], -1) + x.shape[1:])
        # The trace draws the unobserved "obs" site (thrown away): vmap must allow it.
        logits = torch.func.vmap(self._particle_logits, randomness="different")(particles, blocks)
        return logits.reshape((-1,) + logits.shape[2:])

    def _check_fitted(self):
        if self.kernel is None:
            raise RuntimeError("call fit() first")

    @property
    def posterior_samples(self):
        """The ``K`` particles as a dict of constrained site values, leading dim ``K``."""
        self._check_fitted()
        return {
            name: value.detach() for name, value in self._site_values(self.kernel.particles).items()
        }

    def predict_logits(self, x):
        r"""
        Log posterior-predictive probabilities :math:`\log \frac1K \sum_k
        \mathrm{softmax}(f_{\beta_k}(x))` (Algorithm 3.2's marginalisation), shape
        ``(N, C)``; differentiable in ``x``, so a white-box attack on them is the exact
        expectation over the ``K`` draws.
        """
        self._check_fitted()
        particles = self.kernel.particles.detach()
        fns = [lambda x, z=z: self._particle_logits(z, x) for z in particles]
        return predictive_logits(fns)(x)

    def predict(self, x):
        """Predicted classes ``(N,)``: the argmax of :meth:`predict_logits`."""
        with torch.no_grad():
            return self.predict_logits(x).argmax(-1)

    # -- training --------------------------------------------------------------------
    def _setup(self, x, y):
        with pyro.poutine.block(), torch.no_grad(), pyro.validation_enabled(False):
            trace = pyro.poutine.trace(self.model).get_trace(x[:1])
        if "obs" not in trace.nodes:
            raise ValueError('model must have a Categorical observation site named "obs"')
        self.num_classes = _logits_of(trace.nodes["obs"]["fn"]).shape[-1]
        _check_data(x, y, self.num_classes)
        kwargs = {"friction": self.friction} if self.kernel_name == "sghmc" else {}
        self.kernel = get_kernel(self.kernel_name)(
            _MinibatchModel(self.model),
            self.step_size,
            num_particles=self.num_particles,
            repulsion=self.repulsion,
            temperature=self.temperature,
            init_strategy=self.init_strategy,
            jit_compile=self.jit_compile,
            # Training drives the kernel step by step on its own minibatches, in one process.
            shard=None,
            **kwargs,
        )
        batch = min(self.batch_size, x.shape[0])
        self.kernel.setup(0, x[:batch], y[:batch], x.new_tensor(1.0))
        self._params = self.kernel.initial_params

    def _attacked(self, x, y):
        # A fresh target per step: over the run the attacker faces every particle.
        self._target = int(torch.randint(self.num_particles, ()))
        return self.attacker(self._attack_logits, x, y).sample().detach()

    def _attacked_per_particle(self, x, y):
        """``(K, n, ...)``: row block ``k`` attacked against particle ``k``. An attacker
        model that declares ``row_aligned`` (e.g. :class:`~pyro_ext.ara.attackers.LangevinAttacker`)
        draws the ``K`` attacks as one, on stacked copies of the rows; any other (one that
        scores candidate rows, or subsets of them) is built and drawn once per particle."""
        num_particles, rows = self.num_particles, x.shape[0]
        stacked_x = x.expand((num_particles,) + x.shape).reshape((-1,) + x.shape[1:])
        stacked = self.attacker(self._stacked_logits, stacked_x, y.repeat(num_particles))
        if getattr(stacked, "row_aligned", False):
            attacked = stacked.sample().detach()
            return attacked.reshape((num_particles, rows) + x.shape[1:])
        particles = self.kernel.particles.detach()
        return torch.stack(
            [
                self.attacker(functools.partial(self._particle_logits, z), x, y).sample().detach()
                for z in particles
            ]
        )

    def _step(self, x, y, scale):
        num_attacked = (
            0 if self.attacker is None else _num_attacked(x.shape[0], self.clean_fraction)
        )
        if num_attacked and self.attacks == "shared":
            x_attacked = self._attacked(x[:num_attacked], y[:num_attacked])
            x = torch.cat([x_attacked, x[num_attacked:]])
        elif num_attacked:
            attacked = self._attacked_per_particle(x[:num_attacked], y[:num_attacked])
            clean = x[num_attacked:].expand((self.num_particles,) + x[num_attacked:].shape)
            # Particle k's minibatch: its own attacked rows, then the shared clean rows.
            x = PerParticle(torch.cat([attacked, clean], dim=1))
        self.kernel.set_data(x, y, scale)
        self._params = self.kernel.sample(self._params)

    def fit(self, x, y, epochs=1):
        """
        Run ``epochs`` passes of Algorithm 3.2 over ``(x, y)`` in random minibatches,
        continuing from the current particles if already fitted.

        :param torch.Tensor x: training inputs ``(N, ...)``.
        :param torch.Tensor y: integer labels ``(N,)``.
        :param int epochs: number of passes.
        :returns: ``self``.
        """
        _check_data(x, y, self.num_classes)
        epochs = check_int(epochs, "epochs", low=1)
        if self.kernel is None:
            self._setup(x, y)
        if self.attacker is not None:
            # Built on the whole training set only to validate it (e.g. the attack's domain).
            self.attacker(self._attack_logits, x, y)
        num = x.shape[0]
        for _ in range(epochs):
            start = time.perf_counter()
            for index in torch.randperm(num, device=x.device).split(self.batch_size):
                # The scale is a tensor so that a compiled step takes it as an input.
                self._step(x[index], y[index], x.new_tensor(num / index.numel()))
            self.epoch_times.append(time.perf_counter() - start)
        return self


class AdversarialTrainer:
    r"""
    Adversarial training (Madry et al., 2018), the AT baseline of thesis section 3.6.2:
    SGD with momentum on the cross-entropy of minibatches whose rows are replaced, all
    or a ``1 - clean_fraction`` share, by their PGD attack against the current network
    (:func:`~pyro_ext.ara.attacks.pgd`); the Dirac-delta attacker model of section
    3.5.1. With ``clean_fraction=1`` no attack is computed: the undefended baseline.

    :param torch.nn.Module net: a classifier ``x -> (N, C)`` logits.
    :param float eps: attack radius in data units.
    :param int steps: PGD steps.
    :param float attack_step_size: PGD step; default ``2.5 eps / steps`` (Madry et al.).
    :param str norm: ``"linf"``, ``"l2"`` or ``"l1"``.
    :param float clean_fraction: share of clean rows per minibatch (Madry: 0).
    :param float lr: SGD learning rate (thesis MNIST: 0.01).
    :param float momentum: SGD momentum (thesis MNIST: 0.5).
    :param int batch_size: minibatch size (thesis MNIST: 32).
    :param clip: the data domain ``(low, high)`` or ``None``.
    :param bool random_start: PGD starts at a random point of the ball.

    :ivar list epoch_times: wall-clock seconds of each epoch trained.
    """

    def __init__(
        self,
        net,
        eps=0.1,
        steps=10,
        attack_step_size=None,
        norm="linf",
        clean_fraction=0.0,
        lr=0.01,
        momentum=0.5,
        batch_size=32,
        clip=(0.0, 1.0),
        random_start=True,
    ):
        if not isinstance(net, torch.nn.Module):
            raise ValueError(f"net must be a torch.nn.Module, got {type(net).__name__}")
        self.net = net
        self.eps = check_real(eps, "eps", low=0)
        self.steps = check_int(steps, "steps", low=1)
        if attack_step_size is None:
            attack_step_size = 2.5 * self.eps / self.steps if self.eps > 0 else 1.0
        self.attack_step_size = check_positive(attack_step_size, "attack_step_size")
        check_choice(norm, "norm", ("linf", "l2", "l1"))
        self.norm, self.clip, self.random_start = norm, clip, random_start
        self.clean_fraction = check_real(clean_fraction, "clean_fraction", 0, 1)
        self.batch_size = check_int(batch_size, "batch_size", low=1)
        lr = check_positive(lr, "lr")
        momentum = check_real(momentum, "momentum", 0, 1)
        self.optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
        self.epoch_times = []

    def predict_logits(self, x):
        """The network's logits ``(N, C)``, differentiable in ``x``."""
        return self.net(x)

    def predict(self, x):
        """Predicted classes ``(N,)``."""
        with torch.no_grad():
            return self.predict_logits(x).argmax(-1)

    def _step(self, x, y):
        num_attacked = _num_attacked(x.shape[0], self.clean_fraction)
        if num_attacked:
            x_attacked = pgd(
                self.net,
                x[:num_attacked],
                y[:num_attacked],
                self.eps,
                self.steps,
                self.attack_step_size,
                norm=self.norm,
                clip=self.clip,
                random_start=self.random_start,
            )
            x = torch.cat([x_attacked, x[num_attacked:]])
        loss = F.cross_entropy(self.net(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def fit(self, x, y, epochs=1):
        """
        Train for ``epochs`` passes over ``(x, y)`` in random minibatches.

        :returns: ``self``.
        """
        _check_data(x, y)
        epochs = check_int(epochs, "epochs", low=1)
        attacking = self.clean_fraction < 1 and self.clip is not None
        if attacking and (float(x.min()) < self.clip[0] or float(x.max()) > self.clip[1]):
            raise ValueError(f"x lies outside the attack's domain clip={tuple(self.clip)}")
        with torch.no_grad():
            try:
                num_classes = self.net(x[:1]).shape[-1]
            except RuntimeError as error:
                # A shape mismatch inside the network: say which argument it comes from.
                raise ValueError(
                    f"net cannot take x of shape {tuple(x.shape)} (one row: {error}); x must "
                    "have the network's input shape (N, ...)"
                ) from None
            _check_data(x, y, num_classes)
        self.net.train()
        for _ in range(epochs):
            start = time.perf_counter()
            for index in torch.randperm(x.shape[0], device=x.device).split(self.batch_size):
                self._step(x[index], y[index])
            self.epoch_times.append(time.perf_counter() - start)
        return self
