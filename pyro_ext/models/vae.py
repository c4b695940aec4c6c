"""Variational autoencoders of the VIS experiments (thesis section 2.4.2, appendix 2.B.2–2.B.3).

:class:`VAE` is the model of figure 2.12: a latent z ∈ R^10 with a standard normal prior and a
factorised Bernoulli decoder p_θ(x | z) (two ReLU layers of 200 units, sigmoid output); its
amortized guide q_{0,φ}(z | x) is a diagonal Gaussian whose mean and variance come from two
separate networks of the same shape (the variance through a softplus). :class:`CVAE` is the
conditional model of figure 2.13 used as a deep Bayes classifier (figure 2.11, table 2.8):
decoder p_θ(x | z, y) and encoder q_{0,φ}(z | x, y) take the one-hot label as an extra input,
and an image is classified by arg max_y p(x | y) p(y) with p(x | y) estimated by importance
sampling.

Both are plain Pyro programs: ``model`` and ``guide`` take a batch of flattened images and a
``pyro.plate("data", ..., subsample_size=...)``, so they train with ``SVI`` and any ELBO, and
the guide is the base distribution that :class:`pyro_ext.infer.VIS` refines.
:func:`importance_log_likelihood` is the test log-likelihood estimator of table 2.7,
log p(x) ≈ logsumexp_s [log p(x, z_s) − log q(z_s | x)] − log S.
"""

import math

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule
from torch import nn
from torch.nn import functional as F

from ..ops.validation import check_int, check_real, values_checked

__all__ = ["CVAE", "VAE", "importance_log_likelihood", "refined_mean_proposal"]

SCALE_FLOOR = 1e-5  # smallest encoder scale


def _mlp(in_features, hidden, out_features):
    return nn.Sequential(
        nn.Linear(in_features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, out_features),
    )


class _GaussianEncoder(nn.Module):
    """Mean and variance from two separate two-layer networks (figure 2.12)."""

    def __init__(self, in_features, hidden, z_dim):
        super().__init__()
        self.loc_net = _mlp(in_features, hidden, z_dim)
        self.var_net = _mlp(in_features, hidden, z_dim)

    def forward(self, inputs):
        # The floor keeps the scale positive in float32: softplus(v).sqrt() underflows to 0
        # once v < -104, which Adam at lr 0.01 reaches (appendix 2.B.3) and Normal rejects.
        return self.loc_net(inputs), F.softplus(self.var_net(inputs)).sqrt().clamp_min(SCALE_FLOOR)


def _check_images(x, x_dim, name="x"):
    """A non-empty ``(batch, x_dim)`` tensor of binary pixels, once per call: the decoder is
    Bernoulli, so with validation on (see :func:`~pyro_ext.ops.validation.values_checked`)
    every pixel must be 0 or 1, in the one scan that also finds NaN."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[-1] != x_dim:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a tensor of shape (batch, {x_dim}), got {shape}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)}): pass at least one image")
    if values_checked():
        bad = ~((x == 0) | (x == 1))
        if bool(bad.any()):
            index = tuple(int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"{name} must hold binary pixels 0 or 1 (the decoder is Bernoulli), got "
                f"{float(x[index])} at index {index}; binarize the images first (e.g. "
                f"torch.bernoulli({name}) or ({name} > 0.5).float())"
            )
    elif torch.isnan(x).any():
        raise ValueError(f"{name} contains NaN")


class VAE(PyroModule):
    """Bernoulli VAE with a Gaussian amortized guide (figure 2.12).

    :param int x_dim: flattened image size (784 for MNIST).
    :param int z_dim: latent dimension (10 in the thesis).
    :param int hidden: units per hidden layer (200).
    """

    def __init__(self, x_dim=784, z_dim=10, hidden=200):
        super().__init__()
        x_dim = check_int(x_dim, "x_dim", low=1)
        z_dim = check_int(z_dim, "z_dim", low=1)
        hidden = check_int(hidden, "hidden", low=1)
        self.x_dim, self.z_dim = x_dim, z_dim
        self.encoder = _GaussianEncoder(x_dim + self._extra_inputs(), hidden, z_dim)
        self.decoder = _mlp(z_dim + self._extra_inputs(), hidden, x_dim)

    def _extra_inputs(self):
        return 0

    def decode_logits(self, z):
        """Bernoulli logits of p_θ(x | z)."""
        return self.decoder(z)

    def encode(self, x):
        """Location and scale of q_{0,φ}(z | x)."""
        return self.encoder(x)

    def model(self, x, subsample_size=None):
        _check_images(x, self.x_dim)
        pyro.module("decoder", self.decoder)
        with pyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
            prior = dist.Normal(x.new_zeros(self.z_dim), 1.0).to_event(1)
            z = pyro.sample("z", prior)
            return pyro.sample(
                "x", dist.Bernoulli(logits=self.decode_logits(z)).to_event(1), obs=x[idx]
            )

    def guide(self, x, subsample_size=None):
        _check_images(x, self.x_dim)
        pyro.module("encoder", self.encoder)
        with pyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
            loc, scale = self.encode(x[idx])
            return pyro.sample("z", dist.Normal(loc, scale).to_event(1))

    def log_joint(self, x, z):
        """log p(x, z) per datapoint; ``z`` may carry leading sample dims."""
        prior = dist.Normal(torch.zeros_like(z), 1.0).log_prob(z).sum(-1)
        return prior + dist.Bernoulli(logits=self.decode_logits(z)).log_prob(x).sum(-1)

    def encoder_proposal(self, x, num_samples):
        """``num_samples`` draws from q_{0,φ}(z | x) and their log densities."""
        loc, scale = self.encode(x)
        q = dist.Normal(loc, scale).to_event(1)
        z = q.sample((num_samples,))
        return z, q.log_prob(z)

    @torch.no_grad()
    def log_likelihood(self, x, num_samples=1000, chunk_size=100, proposal=None):
        """Importance-sampling estimate of log p(x) per image (the test metric of table 2.7).

        ``proposal(x, n)`` returns ``(z, log_q)`` for ``n`` draws; it defaults to the encoder.
        Draws are taken in chunks of ``chunk_size`` to bound memory.
        """
        _check_images(x, self.x_dim)
        proposal = proposal if proposal is not None else self.encoder_proposal
        return _chunked_importance(
            lambda z: self.log_joint(x, z), lambda n: proposal(x, n), num_samples, chunk_size
        )


class CVAE(VAE):
    """Conditional VAE p_θ(x | z, y) with one-hot labels at both ends (figure 2.13), and the
    deep Bayes classifier arg max_y p(x | y) p(y) of table 2.8.

    :param int num_classes: number of labels (10 for MNIST).
    """

    def __init__(self, x_dim=784, z_dim=10, hidden=200, num_classes=10):
        self.num_classes = check_int(num_classes, "num_classes", low=1)
        super().__init__(x_dim, z_dim, hidden)

    def _extra_inputs(self):
        return self.num_classes

    def _one_hot(self, y, like):
        if not isinstance(y, torch.Tensor) or y.dim() != 1 or y.shape[0] != like.shape[0]:
            raise ValueError(f"y must be a tensor of {like.shape[0]} integer labels")
        if ((y < 0) | (y >= self.num_classes)).any():
            raise ValueError(
                f"y must hold labels in [0, {self.num_classes}), got {y.min()}..{y.max()}"
            )
        return F.one_hot(y.long(), self.num_classes).to(like)

    def decode_logits(self, z, y_onehot):
        y_onehot = y_onehot.expand(z.shape[:-1] + y_onehot.shape[-1:])
        return self.decoder(torch.cat([z, y_onehot], -1))

    def encode(self, x, y_onehot):
        return self.encoder(torch.cat([x, y_onehot], -1))

    def model(self, x, y, subsample_size=None):
        _check_images(x, self.x_dim)
        y_onehot = self._one_hot(y, x)
        pyro.module("decoder", self.decoder)
        with pyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
            z = pyro.sample("z", dist.Normal(x.new_zeros(self.z_dim), 1.0).to_event(1))
            logits = self.decode_logits(z, y_onehot[idx])
            return pyro.sample("x", dist.Bernoulli(logits=logits).to_event(1), obs=x[idx])

    def guide(self, x, y, subsample_size=None):
        _check_images(x, self.x_dim)
        y_onehot = self._one_hot(y, x)
        pyro.module("encoder", self.encoder)
        with pyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
            loc, scale = self.encode(x[idx], y_onehot[idx])
            return pyro.sample("z", dist.Normal(loc, scale).to_event(1))

    def log_joint(self, x, y, z):
        y_onehot = self._one_hot(y, x)
        prior = dist.Normal(torch.zeros_like(z), 1.0).log_prob(z).sum(-1)
        return prior + dist.Bernoulli(logits=self.decode_logits(z, y_onehot)).log_prob(x).sum(-1)

    @torch.no_grad()
    def log_likelihood(self, x, y, num_samples=1000, chunk_size=100, proposal=None):
        """Importance-sampling estimate of log p(x | y) per image; ``proposal(x, y, n)``
        defaults to the encoder."""
        _check_images(x, self.x_dim)
        proposal = proposal if proposal is not None else self.encoder_proposal
        return _chunked_importance(
            lambda z: self.log_joint(x, y, z), lambda n: proposal(x, y, n), num_samples, chunk_size
        )

    @torch.no_grad()
    def classify(self, x, num_samples=100, chunk_size=100, proposal=None):
        """Deep Bayes classifier: log p(x | y) + log p(y) for every label (uniform p(y)).

        Returns (batch, num_classes) scores; the prediction is their arg max. ``proposal``
        is as in :meth:`log_likelihood` (a refined, VIS proposal plugs in there).
        """
        _check_images(x, self.x_dim)
        scores = []
        for label in range(self.num_classes):
            y = torch.full((x.shape[0],), label, dtype=torch.long, device=x.device)
            scores.append(self.log_likelihood(x, y, num_samples, chunk_size, proposal))
        return torch.stack(scores, -1) - math.log(self.num_classes)

    def encoder_proposal(self, x, y, num_samples):
        """``num_samples`` draws from q_{0,φ}(z | x, y) and their log densities."""
        loc, scale = self.encode(x, self._one_hot(y, x))
        q = dist.Normal(loc, scale).to_event(1)
        z = q.sample((num_samples,))
        return z, q.log_prob(z)


def _chunked_importance(log_joint, draw, num_samples, chunk_size):
    num_samples = check_int(num_samples, "num_samples", low=1)
    chunk_size = check_int(chunk_size, "chunk_size", low=1)
    log_weights, remaining = [], num_samples
    while remaining > 0:
        z, log_q = draw(min(chunk_size, remaining))
        log_weights.append(log_joint(z) - log_q)
        remaining -= z.shape[0]
    return torch.cat(log_weights).logsumexp(0) - math.log(num_samples)


def importance_log_likelihood(log_joint, proposal_draws):
    """log p(x) ≈ logsumexp_s [log p(x, z_s) − log q(z_s)] − log S, per datapoint.

    :param callable log_joint: z (S, batch, z_dim) ↦ log p(x, z) of shape (S, batch).
    :param tuple proposal_draws: ``(z, log_q)`` with ``z`` (S, batch, z_dim), ``log_q`` (S, batch).
    """
    if not callable(log_joint):
        raise TypeError(f"log_joint must be a callable z -> log p(x, z), got {log_joint!r}")
    if (
        not isinstance(proposal_draws, (tuple, list))
        or len(proposal_draws) != 2
        or not all(isinstance(t, torch.Tensor) for t in proposal_draws)
    ):
        raise TypeError(
            f"proposal_draws must be a pair (z, log_q) of tensors, got "
            f"{type(proposal_draws).__name__}"
        )
    z, log_q = proposal_draws
    if z.dim() != 3 or log_q.shape != z.shape[:2]:
        raise ValueError(
            f"proposal draws must be z of shape (S, batch, z_dim) and log_q of shape (S, batch), "
            f"got {tuple(z.shape)} and {tuple(log_q.shape)}"
        )
    log_weights = log_joint(z) - log_q
    return log_weights.logsumexp(0) - math.log(z.shape[0])


def refined_mean_proposal(log_joint, loc, scale, step_size, num_steps):
    """An importance-sampling proposal for a refined (VIS) guide with an exact density.

    The refined distribution's density is intractable, so the proposal moves the encoder
    mean ``loc`` by ``num_steps`` noise-free gradient steps of size ``step_size`` on
    ``log_joint`` (the VIS sampler ``"sgd"``) and keeps the encoder's ``scale``:
    N(μ_T, diag σ²). Any proposal gives a valid importance-sampling estimate; this one is
    as cheap as the encoder's and benefits from the refinement.

    :param callable log_joint: z (batch, z_dim) ↦ log p(x, z) of shape (batch,).
    :param torch.Tensor loc: (batch, z_dim) encoder means.
    :param torch.Tensor scale: (batch, z_dim) encoder scales, positive.
    :param float step_size: gradient step size, ``>= 0``.
    :param int num_steps: number of gradient steps, ``>= 0``.
    :returns: ``draw(n) -> (z, log_q)`` with z of shape (n, batch, z_dim), as
        :meth:`VAE.log_likelihood` expects from its ``proposal``.
    :raises TypeError: if ``log_joint`` is not callable, ``loc`` / ``scale`` not tensors,
        ``step_size`` not a number or ``num_steps`` not an integer.
    :raises ValueError: if ``step_size`` or ``num_steps`` is negative.
    """
    if not callable(log_joint):
        raise TypeError(f"log_joint must be a callable z -> log p(x, z), got {log_joint!r}")
    for value, name in ((loc, "loc"), (scale, "scale")):
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {value!r}")
    step_size = check_real(step_size, "step_size", low=0)
    num_steps = check_int(num_steps, "num_steps", low=0)
    z = loc.detach()
    with torch.enable_grad():
        for _ in range(num_steps):
            z = z.detach().requires_grad_()
            (grad,) = torch.autograd.grad(log_joint(z).sum(), z)
            z = z + step_size * grad
    q = dist.Normal(z.detach(), scale).to_event(1)

    def draw(num_samples):
        draws = q.sample((num_samples,))
        return draws, q.log_prob(draws)

    return draw
