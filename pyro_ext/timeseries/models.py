"""Ready-made Pyro programs whose hidden states are marginalised exactly.

:class:`HiddenMarkovModel` is the discrete HMM of thesis eq. 2.14 (section 2.4.2): K hidden
states, a Markov chain with Dirichlet-distributed transition rows, and an emission family
(categorical with Dirichlet rows as in the thesis, Poisson, Gaussian, or any per-state
distribution the user builds). The hidden chain never appears as a sample site: the
observation site's density is the exact marginal likelihood from
:class:`~pyro_ext.timeseries.hmm.HiddenMarkovDistribution` (forward algorithm by parallel
scan), so the model composes with every inference algorithm that only needs log densities:
``SVI`` with any autoguide (an ``AutoDelta`` guide gives MAP, i.e. Bayesian Baum–Welch), the
VIS guide, the SG-MCMC kernels and NUTS.

``backend="funsor"`` writes the same model with the hidden states as enumerated sample sites
inside :func:`pyro.contrib.funsor.vectorized_markov`, to be run with
:class:`pyro.contrib.funsor.infer.TraceMarkovEnum_ELBO`; it is the way to combine the chain
with other enumerated variables, and is much slower (funsor's per-call overhead).
"""

from collections.abc import Callable

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule
from pyro.ops.indexing import Vindex

from ..ops.validation import check_choice, check_int, check_positive, values_checked
from .em import _check_observations, fit_hmm_em
from .hmm import HiddenMarkovDistribution, check_stochastic_matrix

__all__ = ["HiddenMarkovModel"]

_EMISSIONS = ("categorical", "poisson", "gaussian")


class HiddenMarkovModel(PyroModule):
    """A discrete hidden Markov model as a Pyro program with the chain marginalised.

    Sample sites (latent unless fixed in the constructor): ``"init_probs"`` (K,) and
    ``"transition_probs"`` (K, K) with Dirichlet priors (rows = from-state), and the
    emission parameters: ``"emission_probs"`` (K, M) for ``"categorical"``,
    ``"emission_rates"`` (K,) for ``"poisson"``, ``"emission_loc"``/``"emission_scale"`` (K,)
    for ``"gaussian"``. The observation site is ``"obs"``. ``init_probs`` is the
    distribution of the *first* hidden state (see :mod:`pyro_ext.timeseries.hmm`).

    :param int num_states: K ≥ 1.
    :param emission: ``"categorical"``, ``"poisson"``, ``"gaussian"``, or a callable
        ``emission()`` returning a distribution with batch shape ``(K,)`` (it may sample its
        own parameters with ``pyro.sample``).
    :param int num_symbols: M, required for ``"categorical"``.
    :param init_probs, transition_probs, emission_params: fixed values instead of latent
        sites; ``emission_params`` is a dict keyed by the emission site names above.
    :param float transition_concentration, emission_concentration: symmetric Dirichlet
        concentrations of the priors.
    :param str backend: ``"scan"`` (default, fast) or ``"funsor"`` (enumerated states,
        requires ``TraceMarkovEnum_ELBO``).
    """

    def __init__(
        self,
        num_states: int,
        emission: str | Callable = "categorical",
        num_symbols: int | None = None,
        init_probs: torch.Tensor | None = None,
        transition_probs: torch.Tensor | None = None,
        emission_params: dict[str, torch.Tensor] | None = None,
        transition_concentration: float = 1.0,
        emission_concentration: float = 1.0,
        backend: str = "scan",
    ):
        super().__init__()
        num_states = check_int(num_states, "num_states", low=1)
        if not callable(emission) and not isinstance(emission, str):
            raise TypeError(f"emission must be one of {_EMISSIONS} or a callable, got {emission!r}")
        if not callable(emission) and emission not in _EMISSIONS:
            raise ValueError(
                f"emission must be one of {_EMISSIONS} or a callable, got {emission!r}"
            )
        if emission == "categorical":
            if num_symbols is None:
                raise ValueError(
                    "num_symbols must be an integer >= 1 for categorical emissions, got None"
                )
            num_symbols = check_int(num_symbols, "num_symbols (for categorical emissions)", low=1)
        check_choice(backend, "backend", ("scan", "funsor"))
        K = num_states
        if init_probs is not None:
            init_probs = torch.as_tensor(init_probs)
            if init_probs.shape != (K,):
                raise ValueError(
                    f"init_probs must have shape ({K},), got {tuple(init_probs.shape)}"
                )
            check_stochastic_matrix("init_probs", init_probs)
        if transition_probs is not None:
            transition_probs = torch.as_tensor(transition_probs)
            if transition_probs.shape != (K, K):
                raise ValueError(
                    f"transition_probs must have shape ({K}, {K}), "
                    f"got {tuple(transition_probs.shape)}"
                )
            check_stochastic_matrix("transition_probs", transition_probs)
        emission_params = dict(emission_params or {})
        if "emission_probs" in emission_params:
            probs = torch.as_tensor(emission_params["emission_probs"])
            if probs.shape != (K, num_symbols):
                raise ValueError(
                    f"emission_params['emission_probs'] must have shape ({K}, {num_symbols}), "
                    f"got {tuple(probs.shape)}"
                )
            check_stochastic_matrix("emission_params['emission_probs']", probs)
        self.num_states = K
        self.emission = emission
        self.num_symbols = num_symbols
        self.fixed_init_probs = init_probs
        self.fixed_transition_probs = transition_probs
        self.fixed_emission_params = emission_params
        self.transition_concentration = check_positive(
            transition_concentration, "transition_concentration"
        )
        self.emission_concentration = check_positive(
            emission_concentration, "emission_concentration"
        )
        self.backend = backend

    # -- parameters -------------------------------------------------------------------------

    def _site(self, name, prior, fixed, like):
        if fixed is None:
            return pyro.sample(name, prior)
        # A fixed value is a plain attribute, which module.to(device) leaves where it was
        # given: it follows the data's device here.
        return fixed.to(like.device) if isinstance(fixed, torch.Tensor) else fixed

    def _sample_parameters(self, like):
        """Sample (or read the fixed) init, transition and emission parameters."""
        K = self.num_states
        ones = like.new_ones(K)
        init = self._site("init_probs", dist.Dirichlet(ones), self.fixed_init_probs, like)
        trans = self._site(
            "transition_probs",
            dist.Dirichlet(self.transition_concentration * like.new_ones(K, K)).to_event(1),
            self.fixed_transition_probs,
            like,
        )
        return init, trans, self._emission_distribution(like)

    def _emission_distribution(self, like):
        K, fixed = self.num_states, self.fixed_emission_params
        if callable(self.emission):
            obs_dist = self.emission()
            if obs_dist.batch_shape[-1:] != (K,):
                raise ValueError(
                    f"emission() must return a distribution with batch shape (..., {K}), "
                    f"got {tuple(obs_dist.batch_shape)}"
                )
            return obs_dist
        if self.emission == "categorical":
            conc = self.emission_concentration * like.new_ones(K, self.num_symbols)
            probs = self._site(
                "emission_probs",
                dist.Dirichlet(conc).to_event(1),
                fixed.get("emission_probs"),
                like,
            )
            return dist.Categorical(probs=probs)
        if self.emission == "poisson":
            rates = self._site(
                "emission_rates",
                dist.Gamma(like.new_ones(K), 0.1).to_event(1),
                fixed.get("emission_rates"),
                like,
            )
            return dist.Poisson(rates)
        loc = self._site(
            "emission_loc",
            dist.Normal(like.new_zeros(K), 10.0).to_event(1),
            fixed.get("emission_loc"),
            like,
        )
        scale = self._site(
            "emission_scale",
            dist.LogNormal(like.new_zeros(K), 1.0).to_event(1),
            fixed.get("emission_scale"),
            like,
        )
        return dist.Normal(loc, scale)

    def _float_like(self, y):
        return torch.zeros(
            (),
            dtype=y.dtype if y.is_floating_point() else torch.get_default_dtype(),
            device=y.device,
        )

    # -- the program --------------------------------------------------------------------------

    def forward(self, y: torch.Tensor) -> torch.Tensor | None:
        """The Pyro program: ``y`` is ``(T,)`` or ``(num_series, T)``; NaN marks missing values.

        Categorical and Poisson series may be given as floats to carry NaNs.
        """
        y = self._check_series(y)
        if self.backend == "funsor":
            return self._funsor_program(y)
        init, trans, obs_dist = self._sample_parameters(self._float_like(y))
        # The series' length is the event's: the site's event_shape reads (T,), and a draw
        # from the distribution (prior predictive checks) has the data's length.
        hmm = self._distribution(init, trans, obs_dist, duration=y.shape[-1])
        if y.dim() == 1:
            return pyro.sample("obs", hmm, obs=y)
        with pyro.plate("series", y.shape[0], dim=-1):
            return pyro.sample("obs", hmm, obs=y)

    def _check_series(self, y):
        if not isinstance(y, torch.Tensor):
            raise TypeError(
                f"y must be a torch.Tensor of shape (T,) or (num_series, T), got {type(y).__name__}"
            )
        if y.dim() not in (1, 2) or y.shape[-1] < 1:
            raise ValueError(
                f"y must have shape (T,) or (num_series, T) with T >= 1, got {tuple(y.shape)}"
            )
        if values_checked() and isinstance(self.emission, str):
            # Once per call, so that a bad value is reported naming y and its first index
            # rather than as Pyro's support error at the observation site.
            _check_observations(y, self.emission, self.num_symbols)
        return y

    def _distribution(self, init, trans, obs_dist, duration=None):
        # Parameters drawn under an outer particle/sample plate keep their leading dims; the
        # emission batch shape (..., K) lines up with them.
        return HiddenMarkovDistribution(init.log(), trans.log(), obs_dist, duration=duration)

    def _funsor_program(self, y):
        if y.dim() != 1:
            raise ValueError("backend='funsor' supports a single series y of shape (T,)")
        if torch.isnan(y).any() if y.is_floating_point() else False:
            raise ValueError("backend='funsor' does not support missing values; use backend='scan'")
        import pyro.contrib.funsor as pyro_funsor

        init, trans, obs_dist = self._sample_parameters(self._float_like(y))
        obs_value = y.long() if self.emission == "categorical" else y
        z_prev = None
        # funsor builds the enumerated values (and vectorized_markov its time indices) with
        # torch.arange on the default device: on CUDA data they must be made there too.
        with torch.device(y.device):
            for t in pyro_funsor.vectorized_markov(name="time", size=y.shape[-1], dim=-1):
                probs = init if isinstance(t, int) else Vindex(trans)[..., z_prev, :]
                z = pyro.sample(f"z_{t}", dist.Categorical(probs), infer={"enumerate": "parallel"})
                pyro.sample(f"y_{t}", _select_state(obs_dist, z), obs=obs_value[t])
                z_prev = z

    # -- fitting ----------------------------------------------------------------------------

    def fit(self, y, *, init=None, num_restarts=5, max_iterations=200, tolerance=1e-6, seed=0):
        """
        Maximum-likelihood parameters by EM (Baum-Welch), the best of ``num_restarts``
        starts: :func:`~pyro_ext.timeseries.em.fit_hmm_em` for this model's emission and
        states, with its fixed parameters held. The priors play no part (hmmlearn's default
        too); for the posterior, run SVI, VIS or MCMC on the model. The result's ``params``
        go straight into :meth:`distribution`, :meth:`viterbi`, :meth:`smooth` and
        :meth:`forecast`.

        :param torch.Tensor y: ``(T,)`` or ``(num_series, T)``; NaN marks a missing value.
        :returns: :class:`~pyro_ext.timeseries.em.HMMFit`.
        """
        if callable(self.emission):
            raise ValueError(
                "fit() runs EM, whose M-step is closed-form for emission='categorical', "
                "'poisson' or 'gaussian'; fit a custom emission with SVI or MCMC on the model"
            )
        y = self._check_series(y)
        fixed = dict(self.fixed_emission_params)
        if self.fixed_init_probs is not None:
            fixed["init_probs"] = self.fixed_init_probs
        if self.fixed_transition_probs is not None:
            fixed["transition_probs"] = self.fixed_transition_probs
        return fit_hmm_em(
            y,
            self.num_states,
            self.emission,
            self.num_symbols,
            fixed=fixed,
            init=init,
            num_restarts=num_restarts,
            max_iterations=max_iterations,
            tolerance=tolerance,
            seed=seed,
        )

    # -- exact posterior queries given parameter values -----------------------------------------

    def distribution(
        self, params: dict[str, torch.Tensor], like: torch.Tensor | None = None
    ) -> HiddenMarkovDistribution:
        """The :class:`HiddenMarkovDistribution` at parameter values ``params`` (a dict of
        site values, e.g. one draw or a batch of draws from ``MCMC.get_samples()``)."""
        if like is None and not params:
            # Neither data nor draws: the device of a fixed parameter, else the CPU.
            fixed = [self.fixed_init_probs, self.fixed_transition_probs]
            fixed += list(self.fixed_emission_params.values())
            devices = [v.device for v in fixed if isinstance(v, torch.Tensor)]
            like = torch.zeros((), device=next(iter(devices), None))
        like = like if like is not None else next(iter(params.values()))
        with pyro.poutine.block(), pyro.poutine.condition(data=params):
            init, trans, obs_dist = self._sample_parameters(self._float_like(like))
        return self._distribution(init, trans, obs_dist)

    def viterbi(
        self, y: torch.Tensor, params: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Most probable hidden path and its log joint density (max-product)."""
        return self.distribution(params, y).viterbi(y)

    def smooth(self, y: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """Posterior marginals p(z_t | y_{1:T}) of shape (..., T, K)."""
        return self.distribution(params, y).smooth(y)

    def forecast(
        self, y: torch.Tensor, params: dict[str, torch.Tensor], num_steps: int
    ) -> torch.distributions.Distribution:
        """Predictive distribution of y_{T+1..T+num_steps} given y_{1:T}: a mixture over the
        predicted hidden states, as a ``MixtureSameFamily`` with batch shape
        ``(num_steps, ...)`` (horizon first, then the batch of parameter draws or series)."""
        hmm = self.distribution(params, y)
        state_probs = hmm.predict(y, num_steps)  # (..., num_steps, K)
        state_probs = state_probs.movedim(-2, 0)
        components = hmm.observation_dist.expand((num_steps,) + tuple(state_probs.shape[1:]))
        return dist.MixtureSameFamily(dist.Categorical(probs=state_probs), components)


def _select_state(obs_dist, z):
    """The emission distribution of state ``z`` (an enumerated index tensor)."""
    if isinstance(obs_dist, dist.Categorical):
        return dist.Categorical(probs=Vindex(obs_dist.probs)[..., z, :])
    if isinstance(obs_dist, dist.Poisson):
        return dist.Poisson(Vindex(obs_dist.rate)[..., z])
    if isinstance(obs_dist, dist.Normal):
        return dist.Normal(Vindex(obs_dist.loc)[..., z], Vindex(obs_dist.scale)[..., z])
    raise ValueError(
        "backend='funsor' supports categorical, poisson and gaussian emissions, "
        f"got {type(obs_dist).__name__}"
    )
