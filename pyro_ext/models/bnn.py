"""Bayesian multilayer perceptrons and their posterior predictive evaluation.

A Bayesian neural network (thesis section 1.3.2) puts a prior on the weights of a
feed-forward network and a likelihood on its outputs: a Gaussian for regression (eq. 1.7)
or a multinomial through a softmax for classification (eq. 1.10). Section 2.3.3 samples
its posterior with SGLD and SGLD+R on the UCI regression suite, following the protocol of
probabilistic backpropagation (Hernández-Lobato & Adams, 2015) and SVGD (Liu & Wang,
2016): one hidden layer of 50 ReLU units, a Gamma prior on the noise precision, and
test RMSE and test log-likelihood of the posterior predictive mixture.

:class:`BayesianMLP` is a plain Pyro model, so it runs under
:class:`pyro_ext.infer.MCMC` with the stochastic-gradient kernels (vectorised over
particles with :func:`torch.func.vmap` or a particle plate), :class:`pyro.infer.NUTS`,
:class:`pyro.infer.SVI` with any autoguide, and :class:`pyro.infer.Predictive`. The
helpers below evaluate a set of posterior draws in vectorised chunks.
"""

import math
import numbers
from collections.abc import Sequence
from functools import partial

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.autoguide.initialization import init_to_median
from pyro.nn import PyroModule, PyroSample
from pyro.poutine.util import site_is_subsample

from ..ops.validation import check_choice, check_int, check_positive, values_checked

__all__ = [
    "BayesianMLP",
    "expected_calibration_error",
    "log_predictive_density",
    "predictive_moments",
    "rmse",
]

_LIKELIHOODS = ("gaussian", "bernoulli", "categorical")
_ACTIVATIONS = {
    "relu": torch.relu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "gelu": torch.nn.functional.gelu,
    "elu": torch.nn.functional.elu,
}


def _squeeze_trailing_ones(shape):
    # Pyro pads the batch shape of a global site with size-1 dims for the plates it lies
    # outside of (a particle or predictive plate gives (S, 1) under one data plate, but
    # Predictive passes (S,) for sites with event dims): drop them, so that the network
    # output is (S, N, out) whichever way the draws arrive.
    shape = tuple(shape)
    while shape and shape[-1] == 1:
        shape = shape[:-1]
    return shape


class _BayesianLinear(PyroModule):
    """An affine layer with ``Normal(0, scale)`` priors; broadcasts over weight draws."""

    def __init__(self, in_features, out_features, scale, precision_of=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        # A buffer, so that ``net.to(device)`` (or ``.double()``) moves the prior with the
        # network; not persistent, so that state dicts stay as they were.
        self.register_buffer("_prior_scale", torch.tensor(float(scale)), persistent=False)
        if precision_of is None:
            self.weight = PyroSample(
                lambda self: (
                    dist.Normal(0.0, self._prior_scale)
                    .expand([out_features, in_features])
                    .to_event(2)
                )
            )
            self.bias = PyroSample(
                lambda self: dist.Normal(0.0, self._prior_scale).expand([out_features]).to_event(1)
            )
        else:
            # Hierarchical prior: the shared weight precision lambda (possibly batched by
            # a particle or predictive plate) divides the variance, N(0, scale^2 / lambda).
            def prior(shape):
                def sample(module):
                    precision = precision_of()
                    std = module._prior_scale * precision.rsqrt()
                    std = std.reshape(std.shape + (1,) * len(shape))
                    return (
                        dist.Normal(0.0, std)
                        .expand(precision.shape + tuple(shape))
                        .to_event(len(shape))
                    )

                return sample

            self.weight = PyroSample(prior((out_features, in_features)))
            self.bias = PyroSample(prior((out_features,)))

    def forward(self, h):
        weight, bias = self.weight, self.bias
        weight = weight.reshape(_squeeze_trailing_ones(weight.shape[:-2]) + weight.shape[-2:])
        bias = bias.reshape(_squeeze_trailing_ones(bias.shape[:-1]) + bias.shape[-1:])
        return torch.matmul(h, weight.transpose(-1, -2)) + bias.unsqueeze(-2)


class BayesianMLP(PyroModule):
    r"""
    A Bayesian multilayer perceptron (thesis section 1.3.2, eq. 1.7 and 1.10) as a Pyro
    model ``net(x, y=None, subsample_size=None)``.

    Latent sites: ``layers.{i}.weight`` (shape ``(out, in)``) and ``layers.{i}.bias``
    (shape ``(out,)``) for each layer ``i``, with priors ``N(0, prior_scale[i]^2)``;
    ``"precision"``, the noise precision ``tau ~ Gamma(1, 0.1)`` (shape, rate) of the
    Gaussian likelihood ``y ~ N(f(x), 1 / tau)``; and with ``hierarchical=True``
    ``"weight_precision"``, one precision ``lambda ~ Gamma(1, 0.1)`` shared by all weights
    and biases, whose priors become ``N(0, prior_scale[i]^2 / lambda)``. With the default
    ``prior_scale=1`` that is the protocol of PBP and SVGD (Liu & Wang, 2016, whose code
    puts ``Gamma(1, 0.1)`` on both precisions) used in thesis section 2.3.3.

    The observations ``"obs"`` lie in ``pyro.plate("data", N, subsample_size=...)`` (dim
    ``-1``), so a minibatch likelihood is scaled by ``N / |batch|``. By default
    (``full_output=True``) the network runs once over all of ``x`` and the return value is
    its output for every row of ``x``: the regression mean or the logits, of shape
    ``(N,)`` when ``out_features == 1`` (Gaussian and Bernoulli) and ``(N, out_features)``
    otherwise (always for Categorical). That makes every minibatch step cost O(N); with
    ``full_output=False`` and a ``subsample_size``, the network runs on the minibatch rows
    only and the return value is the output for those rows, ``(B,)`` or
    ``(B, out_features)`` with ``B = subsample_size``, in the order of the plate's
    indices. The log joint is the same either way; without ``subsample_size`` the two
    settings are identical. Use ``full_output=False`` for stochastic-gradient MCMC on
    large data sets.

    Weight draws may carry leading batch dimensions (a particle plate, or
    ``Predictive(parallel=True)``): the output then has those in front, ``(S, N, ...)``.

    :param int in_features: number of input features.
    :param hidden: widths of the hidden layers (an int for a single one; ``()`` gives a
        generalised linear model).
    :param int out_features: outputs: the response dimension (Gaussian), the number of
        independent binary labels (Bernoulli) or of classes (Categorical, at least 2).
    :param str likelihood: ``"gaussian"``, ``"bernoulli"`` or ``"categorical"``.
    :param prior_scale: prior standard deviation of the weights and biases: one positive
        float, or one per layer (``len(hidden) + 1`` of them).
    :param activation: a callable or one of ``"relu"``, ``"tanh"``, ``"sigmoid"``,
        ``"gelu"``, ``"elu"`` (default ``"relu"``, as in section 2.3.3).
    :param bool hierarchical: add the shared Gamma weight precision described above.
    :param tuple noise_prior: ``(shape, rate)`` of the Gamma prior on ``"precision"``.
    :param tuple weight_precision_prior: ``(shape, rate)`` of the Gamma prior on
        ``"weight_precision"``.
    :param bool full_output: when subsampling, run the network over all rows of ``x``
        and return the full output (default, O(N) per call), or, if ``False``, over the
        minibatch rows only and return the minibatch output (O(batch) per call).

    Example::

        net = BayesianMLP(x.shape[1], hidden=(50,))
        kernel = pyro_ext.infer.SGLD(net, step_size=1e-4, num_particles=20, repulsion="rbf")
        mcmc = pyro_ext.infer.MCMC(kernel, num_samples=100, warmup_steps=1000, thinning=10)
        mcmc.run(x, y, subsample_size=100)
        mean, sd = predictive_moments(net, mcmc.get_samples(), x_test)
    """

    def __init__(
        self,
        in_features,
        hidden=(50,),
        out_features=1,
        likelihood="gaussian",
        prior_scale=1.0,
        activation="relu",
        hierarchical=False,
        noise_prior=(1.0, 0.1),
        weight_precision_prior=(1.0, 0.1),
        full_output=True,
    ):
        super().__init__()
        if not isinstance(full_output, bool):
            raise TypeError(f"full_output must be a bool, got {full_output!r}")
        self.full_output = full_output
        in_features = check_int(in_features, "in_features", low=1)
        out_features = check_int(out_features, "out_features", low=1)
        if isinstance(hidden, numbers.Integral) and not isinstance(hidden, bool):
            hidden = (hidden,)
        if not isinstance(hidden, Sequence) or isinstance(hidden, str):
            raise TypeError(
                f"hidden must be an integer or a sequence of integers (layer widths), got {hidden!r}"
            )
        hidden = tuple(check_int(h, f"hidden[{i}]", low=1) for i, h in enumerate(hidden))
        widths = [in_features, *hidden, out_features]
        check_choice(likelihood, "likelihood", _LIKELIHOODS)
        if likelihood == "categorical" and out_features < 2:
            raise ValueError(
                f"a categorical likelihood needs out_features >= 2 classes, got {out_features}"
            )
        num_layers = len(widths) - 1
        if isinstance(prior_scale, Sequence) and not isinstance(prior_scale, str):
            if len(prior_scale) != num_layers:
                raise ValueError(
                    f"prior_scale has {len(prior_scale)} entries; the network has {num_layers} layers"
                )
            scales = [check_positive(s, f"prior_scale[{i}]") for i, s in enumerate(prior_scale)]
        else:
            scales = [check_positive(prior_scale, "prior_scale")] * num_layers
        if isinstance(activation, str):
            if activation not in _ACTIVATIONS:
                raise ValueError(
                    f"activation must be a callable or one of {sorted(_ACTIVATIONS)}, got {activation!r}"
                )
            activation = _ACTIVATIONS[activation]
        elif not callable(activation):
            raise TypeError(f"activation must be a callable or a name, got {activation!r}")
        gamma_priors = {}
        for name, prior in (
            ("noise_prior", noise_prior),
            ("weight_precision_prior", weight_precision_prior),
        ):
            if len(prior) != 2:
                raise ValueError(f"{name} must be a (shape, rate) pair, got {prior!r}")
            gamma_priors[name] = tuple(
                check_positive(p, f"{name}[{i}]") for i, p in enumerate(prior)
            )

        self.in_features, self.out_features = in_features, out_features
        self.hidden = tuple(hidden)
        self.likelihood = likelihood
        self.prior_scale = tuple(scales)
        self.activation = activation
        self.hierarchical = hierarchical
        # The Gamma priors' (shape, rate) as buffers: ``net.to(device)`` moves them (see
        # _BayesianLinear).
        for name, prior in gamma_priors.items():
            self.register_buffer(f"_{name}", torch.tensor(prior), persistent=False)
        if likelihood == "gaussian":
            self.precision = PyroSample(lambda self: dist.Gamma(*self._noise_prior.unbind()))
        precision_of = None
        if hierarchical:
            self.weight_precision = PyroSample(
                lambda self: dist.Gamma(*self._weight_precision_prior.unbind())
            )
            precision_of = self._weight_precision
        self.layers = PyroModule[torch.nn.ModuleList](
            [
                _BayesianLinear(i, o, s, precision_of)
                for i, o, s in zip(widths[:-1], widths[1:], scales)
            ]
        )

    def _weight_precision(self):
        return self.weight_precision

    def default_init_strategy(self, x=None, y=None, subsample_size=None):
        """
        The start this model declares to the package's inference (SG-MCMC kernels, ARA
        training, natural-gradient VI) when none is given: :meth:`init_strategy` on the
        model's arguments. A kernel run as ``SGLD(net, ...)`` on ``mcmc.run(x, y)`` starts
        as if passed ``init_strategy=net.init_strategy(x, y)``. The observation site also
        declares it (``infer={"default_init_strategy": ...}``), so a model that wraps the
        network, ``SGLD(lambda x, y: net(x, y, subsample_size=64), ...)``, starts the same
        way.
        """
        if x is None or y is None:
            return self.init_strategy()
        return self.init_strategy(x, y)

    def init_strategy(self, x=None, y=None, max_rows=1000):
        """
        A Pyro ``init_strategy`` that starts each draw (particle) as the SVGD reference code
        starts its networks: weights ``N(0, 1 / (fan_in + 1))``, biases 0, and, for the
        Gaussian likelihood with data ``(x, y)``, the noise precision at ``1 / (mean
        squared residual)`` of that same starting network on up to ``max_rows`` random rows
        of the data (without data, and for ``"weight_precision"``, the prior median).

        A draw of the ``Gamma(1, 0.1)`` noise prior can be 30 times stiffer than the
        untrained network's residuals warrant, which limits the stable step size of an
        unpreconditioned sampler in the first steps. Works whatever order the model visits
        the sites in; pass it as ``SGLD(net, ..., init_strategy=net.init_strategy(x, y))``.
        """
        if (x is None) != (y is None):
            raise ValueError("init_strategy needs both x and y, or neither")
        if x is not None:
            y = self._check_data(x, y)
            rows = torch.randperm(x.shape[0], device=x.device)[:max_rows]
            x, y = x[rows], y[rows]
        return _FanInInit(self, x, y)

    def likelihood_dist(self, output, precision=None):
        """
        The distribution of ``y`` given network outputs ``output`` (as returned by
        :meth:`forward`) and, for the Gaussian likelihood, the noise ``precision`` (a
        scalar, or ``(S, 1)`` for ``S`` draws). Its batch shape is that of the data rows.
        """
        if self.likelihood == "gaussian":
            scale = precision.rsqrt()
            if self.out_features > 1:
                return dist.Normal(output, scale.unsqueeze(-1)).to_event(1)
            return dist.Normal(output, scale)
        if self.likelihood == "bernoulli":
            fn = dist.Bernoulli(logits=output)
            return fn.to_event(1) if self.out_features > 1 else fn
        return dist.Categorical(logits=output)

    def _check_data(self, x, y):
        """``y`` checked against ``x`` and the likelihood (``None`` if not given).

        Value checks follow the validation switch (see :mod:`pyro_ext.ops.validation`; the
        samplers turn it off, so their steps do not pay for them) and read the device once
        per call: every check builds a mask of bad entries and one ``bool`` reads them all.
        """
        if not torch.is_tensor(x) or x.dim() != 2 or x.shape[-1] != self.in_features:
            shape = tuple(x.shape) if torch.is_tensor(x) else type(x).__name__
            raise ValueError(f"x must be a tensor of shape (N, {self.in_features}), got {shape}")
        if not x.is_floating_point():
            raise ValueError(f"x must be a floating-point tensor, got dtype {x.dtype}")
        prior_device = self.layers[0]._prior_scale.device
        if x.device != prior_device:
            raise ValueError(
                f"x is on {x.device} but the network (its priors) is on {prior_device}: "
                f"move the network to the data with net.to(x.device)"
            )
        if y is not None and x.shape[0] == 0:
            raise ValueError(
                f"x and y are empty (x of shape {tuple(x.shape)}): the likelihood needs at "
                f"least one observed row"
            )
        checks = [(x, ~torch.isfinite(x), "x must be finite (no NaN or infinity)")]
        if y is not None:
            y = self._check_labels(x, y, checks)
        if values_checked():
            if bool(torch.stack([bad.any() for _, bad, _ in checks]).any()):
                for value, bad, expected in checks:
                    if bool(bad.any()):
                        index = tuple(int(i) for i in bad.nonzero()[0])
                        index = index[0] if len(index) == 1 else index
                        raise ValueError(f"{expected}; got {value[index].item()} at index {index}")
        return y

    def _check_labels(self, x, y, checks):
        """``y``'s type and shape; appends its value check to ``checks``."""
        if not torch.is_tensor(y):
            raise ValueError(f"y must be a tensor, got {type(y).__name__}")
        num = x.shape[0]
        multi = self.out_features > 1 and self.likelihood != "categorical"
        expected = (num, self.out_features) if multi else (num,)
        if tuple(y.shape) != expected:
            raise ValueError(
                f"y must have shape {expected} for this {self.likelihood} likelihood, got {tuple(y.shape)}"
            )
        if self.likelihood == "gaussian":
            if not y.is_floating_point():
                raise ValueError(
                    f"y must be floating point for a Gaussian likelihood, got dtype {y.dtype}"
                )
            checks.append((y, ~torch.isfinite(y), "y must be finite (no NaN or infinity)"))
            return y
        if self.likelihood == "bernoulli":
            bad = ~((y == 0) | (y == 1))
            checks.append((y, bad, "y must hold 0/1 labels for a Bernoulli likelihood"))
            return y.to(x.dtype)
        if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
            raise ValueError(
                f"y must hold integer class labels for a categorical likelihood, got dtype {y.dtype}"
            )
        bad = (y < 0) | (y >= self.out_features)
        message = f"y must hold class labels that lie in [0, {self.out_features}) (out_features {self.out_features})"
        checks.append((y, bad, message))
        return y.long()

    def forward(self, x, y=None, subsample_size=None):
        """
        Run the model on inputs ``x`` ``(N, in_features)`` with optional observations
        ``y``; ``subsample_size`` draws a minibatch of rows for the likelihood.
        Returns the network output for all rows of ``x``, or with ``full_output=False``
        and a ``subsample_size`` for the minibatch rows only (see the class docstring).
        """
        y = self._check_data(x, y)
        num = x.shape[0]
        subsample_size = check_int(subsample_size, "subsample_size", 1, num, allow_none=True)
        precision = self.precision if self.likelihood == "gaussian" else None
        if subsample_size is not None and not self.full_output:
            # Draw the weights outside the data plate (PyroModule caches them for this
            # call), so that their sites are neither batched nor rescaled by it.
            for layer in self.layers:
                _ = (layer.weight, layer.bias)
            with pyro.plate(
                "data", num, subsample_size=subsample_size, dim=-1, device=x.device
            ) as idx:
                rows = self._network(x.index_select(0, idx))
                self._observe(rows, precision, x, y, idx)
            return rows
        output = self._network(x)
        with pyro.plate("data", num, subsample_size=subsample_size, dim=-1, device=x.device) as idx:
            rows = output.index_select(-1 if self.out_features == 1 else -2, idx)
            self._observe(rows, precision, x, y, idx)
        return output

    def _observe(self, rows, precision, x, y, idx):
        """The observation site ``obs`` of the data plate's rows ``idx``, given the network
        output ``rows`` for them; it declares the model's start on the full data ``(x, y)``
        (see :meth:`default_init_strategy`)."""
        obs = None if y is None else y.index_select(0, idx)
        pyro.sample(
            "obs",
            self.likelihood_dist(rows, precision),
            obs=obs,
            infer={"default_init_strategy": partial(self.default_init_strategy, x, y)},
        )

    def _network(self, h):
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = self.activation(h)
        return h.squeeze(-1) if self.out_features == 1 else h


class _FanInInit:
    """The init strategy of :meth:`BayesianMLP.init_strategy` (one network per draw)."""

    def __init__(self, net, x, y):
        self.net, self.x, self.y = net, x, y
        self.network, self.pending, self.precision_given = {}, set(), True

    def _new_network(self, like):
        self.network = {}
        for i, layer in enumerate(self.net.layers):
            weight = torch.randn(
                layer.out_features, layer.in_features, dtype=like.dtype, device=like.device
            )
            self.network[f"layers.{i}.weight"] = weight / math.sqrt(layer.in_features + 1)
            self.network[f"layers.{i}.bias"] = torch.zeros(
                layer.out_features, dtype=like.dtype, device=like.device
            )
        self.pending, self.precision_given = set(self.network), False

    def _noise_precision(self):
        # By hand, not net._network: that would sample the layer sites again inside the
        # model trace this strategy is called from.
        h = self.x
        for i in range(len(self.net.layers)):
            h = h @ self.network[f"layers.{i}.weight"].T + self.network[f"layers.{i}.bias"]
            if i < len(self.net.layers) - 1:
                h = self.net.activation(h)
        residual = (h.squeeze(-1) if self.net.out_features == 1 else h) - self.y
        return residual.pow(2).mean().reciprocal()

    def __call__(self, site):
        name, prior = site["name"], site["fn"]
        if name == "precision" and self.x is not None:
            # The precision of the network this draw gets: the one whose sites are still to
            # come (precision visited first) or the one just handed out (visited last).
            if self.precision_given:
                self._new_network(prior.mean)
            self.precision_given = True
            return self._noise_precision().to(prior.mean).expand(prior.shape())
        if name.startswith("layers.") and name.rsplit(".", 1)[-1] in ("weight", "bias"):
            if name not in self.pending:
                self._new_network(prior.mean)
            self.pending.discard(name)
            return self.network[name].expand(prior.shape())
        return init_to_median(site)


def _latent_names(net, x):
    with pyro.poutine.block(), torch.no_grad():
        trace = pyro.poutine.trace(net).get_trace(x)
    return [
        name
        for name, site in trace.nodes.items()
        if site["type"] == "sample"
        and not site["is_observed"]
        and name != "obs"
        and not site_is_subsample(site)
    ]


def _draws(net, samples, x, chunk_size):
    """Yield (output, precision) for chunks of draws: output (S_c, N[, out]), precision (S_c, 1)."""
    if not isinstance(net, BayesianMLP):
        raise TypeError(f"net must be a BayesianMLP, got {type(net).__name__}")
    chunk_size = check_int(chunk_size, "chunk_size (draws evaluated at a time)", low=1)
    net._check_data(x, None)
    names = _latent_names(net, x)
    missing = [n for n in names if n not in samples]
    if missing:
        raise ValueError(f"samples lack the latent site(s) {missing} of the network")
    num = {samples[n].shape[0] for n in names}
    if len(num) != 1:
        raise ValueError(f"all sites must have the same number of draws, got {sorted(num)}")
    (num,) = num
    if num < 1:
        raise ValueError("samples hold no draws")
    for start in range(0, num, chunk_size):
        chunk = {n: samples[n][start : start + chunk_size] for n in names}
        size = chunk[names[0]].shape[0]
        predictive = pyro.infer.Predictive(
            net, posterior_samples=chunk, return_sites=("_RETURN",), parallel=True
        )
        output = predictive(x)["_RETURN"]
        precision = chunk["precision"].reshape(size, 1) if net.likelihood == "gaussian" else None
        yield output, precision


def predictive_moments(net, samples, x, chunk_size=256):
    """
    Mean and standard deviation of the posterior predictive distribution of ``y`` at
    ``x``, a mixture over the draws ``samples`` (a dict of site values with a leading
    draw dimension, e.g. ``MCMC.get_samples()``), evaluated ``chunk_size`` draws at a
    time under ``Predictive(parallel=True)``.

    Gaussian: the mixture's mean and sd, observation noise ``1 / precision`` included.
    Bernoulli and Categorical: ``y`` as 0/1 labels (one-hot for Categorical), so the mean
    is the predictive probability ``p`` (shape ``(N,)`` or ``(N, K)``) and the sd
    ``sqrt(p (1 - p))``.
    """
    total = second = 0.0
    count = 0
    for output, precision in _draws(net, samples, x, chunk_size):
        if net.likelihood == "gaussian":
            noise_var = (1.0 / precision).reshape((-1,) + (1,) * (output.dim() - 1))
            total = total + output.sum(0)
            second = second + (output.square() + noise_var).sum(0)
        else:
            probs = (
                torch.sigmoid(output)
                if net.likelihood == "bernoulli"
                else torch.softmax(output, -1)
            )
            total = total + probs.sum(0)
        count += output.shape[0]
    mean = total / count
    if net.likelihood == "gaussian":
        var = second / count - mean.square()
    else:
        var = mean * (1 - mean)
    return mean, var.clamp_min(0).sqrt()


def log_predictive_density(net, samples, x, y, chunk_size=256):
    r"""
    Average test log-likelihood of the posterior predictive mixture, the UCI protocol
    of thesis section 2.3.3 (Table 2.3)::

        1/N sum_i log( 1/S sum_s p(y_i | x_i, theta_s) )

    computed with ``logsumexp`` over the ``S`` draws. See :func:`predictive_moments` for
    ``samples`` and ``chunk_size``.
    """
    y = net._check_data(x, y)
    if y is None:
        raise ValueError("y is required")
    log_sum = None
    count = 0
    for output, precision in _draws(net, samples, x, chunk_size):
        log_p = net.likelihood_dist(output, precision).log_prob(y)  # (S_c, N)
        chunk = torch.logsumexp(log_p, 0)
        log_sum = chunk if log_sum is None else torch.logaddexp(log_sum, chunk)
        count += output.shape[0]
    return (log_sum - math.log(count)).mean()


def rmse(net, samples, x, y, chunk_size=256):
    """
    Root mean squared error of the posterior predictive mean of a Gaussian
    :class:`BayesianMLP` (thesis Table 2.4), averaged over rows and outputs.
    """
    if net.likelihood != "gaussian":
        raise ValueError(f"rmse needs a Gaussian likelihood, got {net.likelihood!r}")
    y = net._check_data(x, y)
    if y is None:
        raise ValueError("y is required")
    mean, _ = predictive_moments(net, samples, x, chunk_size)
    return (mean - y).square().mean().sqrt()


def expected_calibration_error(probs, labels, num_bins=15):
    r"""
    Expected calibration error (Guo et al., 2017) of a classifier's predicted
    probabilities: the confidence ``max_k p_k`` is binned into ``num_bins`` equal-width
    bins of ``[0, 1]`` and ``ECE = sum_b |B_b| / N |accuracy(B_b) - confidence(B_b)|``.

    :param torch.Tensor probs: ``(N, K)`` class probabilities, or ``(N,)`` probabilities
        of class 1 for a binary classifier.
    :param torch.Tensor labels: ``(N,)`` integer (or 0/1) labels.
    """
    if not torch.is_tensor(probs) or probs.dim() not in (1, 2) or probs.shape[0] == 0:
        raise ValueError("probs must be a non-empty tensor of shape (N,) or (N, K)")
    if not torch.is_tensor(labels) or tuple(labels.shape) != (probs.shape[0],):
        raise ValueError(f"labels must be a tensor of shape ({probs.shape[0]},)")
    num_bins = check_int(num_bins, "num_bins", low=1)
    if labels.is_complex():
        raise TypeError(f"labels must be a real tensor of class labels, got dtype {labels.dtype}")
    # Value checks follow the validation switch (see pyro_ext.ops.validation).
    if values_checked():
        num_classes = 2 if probs.dim() == 1 else probs.shape[-1]
        bad = (labels < 0) | (labels >= num_classes)
        if labels.is_floating_point():  # 0/1 floats (torch.bernoulli draws) are labels too
            bad = bad | (labels != labels.floor())
        if bool(bad.any()):
            row = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"labels must be integer class labels in [0, {num_classes}) (the classes of "
                f"probs), got {labels[row].item()} at index {row}"
            )
        eps = torch.finfo(probs.dtype).eps if probs.is_floating_point() else 0.0
        # Averages of softmaxes land a few ulps outside [0, 1]: that is round-off, not misuse.
        slack = 100 * eps
        outside = ~((probs >= -slack) & (probs <= 1 + slack))
        if bool(outside.any()):
            index = tuple(int(i) for i in outside.nonzero()[0])
            raise ValueError(
                f"probs must be probabilities in [0, 1], got {float(probs[index])} at index "
                f"{index[0] if len(index) == 1 else index}"
            )
        if probs.dim() == 2:
            total = probs.sum(-1)
            tol = max(1e-3, 10 * probs.shape[-1] * eps)
            bad = ((total - 1).abs() > tol).nonzero()
            if bad.numel():
                row = int(bad[0])
                raise ValueError(
                    f"each row of probs (N, K) must sum to 1, got {float(total[row]):.6g} in "
                    f"row {row}: pass class probabilities (e.g. softmax(logits, -1)), not "
                    "logits, or an (N,) tensor of P(class 1) for a binary classifier"
                )
    if probs.dim() == 1:
        probs = torch.stack([1 - probs, probs], -1)
    confidence, prediction = probs.max(-1)
    correct = (prediction == labels.long()).to(probs.dtype)
    bins = (confidence * num_bins).long().clamp(0, num_bins - 1)
    count = torch.zeros(num_bins, dtype=probs.dtype, device=probs.device).index_add_(
        0, bins, torch.ones_like(confidence)
    )
    gap = torch.zeros_like(count).index_add_(0, bins, correct - confidence)
    return gap.abs().sum() / probs.shape[0]
