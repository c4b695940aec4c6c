"""State-space inference with the hidden states marginalised exactly (thesis 2.4.2, 1.2.2).

Discrete hidden Markov models (forward–backward, Viterbi, forward-filter backward-sample and
prediction by parallel scans over the sum-product and max-product semirings) and dynamic
linear models (Kalman filtering, RTS smoothing, simulation smoothing and forecasting), as
functions, as Pyro distributions and as ready-made Pyro models; discrete HMMs are fitted by
exact EM (:func:`fit_hmm_em`, :meth:`HiddenMarkovModel.fit`), and a DLM's scales by maximum
likelihood through the exact Kalman likelihood (:func:`fit_dlm`).

Example: a series that switches between two levels, fitted by EM and decoded by Viterbi:

>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<torch._C.Generator object at ...>
>>> y = torch.cat([torch.zeros(50), 5 * torch.ones(50)]) + 0.1 * torch.randn(100)
>>> hmm = HiddenMarkovModel(2, "gaussian")
>>> fit = hmm.fit(y)
>>> sorted(round(m) for m in fit.params["emission_loc"].tolist())
[0, 5]
>>> path, log_joint = hmm.viterbi(y, fit.params)
>>> bool((path[:50] == path[0]).all() and (path[50:] != path[0]).all())
True
"""

from ._sequential import sequential_kernels
from .dlm import (
    DLM,
    Autoregressive,
    Component,
    ComponentBlock,
    DLMDistribution,
    LinearGaussian,
    LocalLevel,
    LocalLinearTrend,
    Regression,
    Seasonal,
    dlm_observe,
)
from .dlm_fit import DLMFit, fit_dlm
from .em import HMMFit, fit_hmm_em
from .hmm import (
    HiddenMarkovDistribution,
    HMMExpectedStatistics,
    check_stochastic_matrix,
    hmm_expected_statistics,
    hmm_filter,
    hmm_log_likelihood,
    hmm_predict,
    hmm_sample_paths,
    hmm_smooth,
    hmm_viterbi,
)
from .kalman import (
    KalmanFilterResult,
    KalmanForecast,
    KalmanSmootherResult,
    KalmanWhitening,
    StateSpaceMatrices,
    forecast_interval,
    kalman_filter,
    kalman_forecast,
    kalman_log_likelihood,
    kalman_sample,
    kalman_smoother,
    kalman_whiten,
)
from .models import HiddenMarkovModel

__all__ = [
    "Autoregressive",
    "Component",
    "ComponentBlock",
    "DLMFit",
    "DLM",
    "DLMDistribution",
    "HiddenMarkovDistribution",
    "HiddenMarkovModel",
    "HMMExpectedStatistics",
    "HMMFit",
    "KalmanFilterResult",
    "KalmanForecast",
    "KalmanSmootherResult",
    "KalmanWhitening",
    "LinearGaussian",
    "LocalLevel",
    "LocalLinearTrend",
    "Regression",
    "Seasonal",
    "StateSpaceMatrices",
    "check_stochastic_matrix",
    "dlm_observe",
    "fit_dlm",
    "fit_hmm_em",
    "forecast_interval",
    "hmm_expected_statistics",
    "hmm_filter",
    "hmm_log_likelihood",
    "hmm_predict",
    "hmm_sample_paths",
    "sequential_kernels",
    "hmm_smooth",
    "hmm_viterbi",
    "kalman_filter",
    "kalman_forecast",
    "kalman_log_likelihood",
    "kalman_sample",
    "kalman_smoother",
    "kalman_whiten",
]
