"""
An MCMC driver with the interface of :class:`pyro.infer.MCMC` that understands particle
kernels.

It is built on Pyro's public API only: :class:`pyro.infer.mcmc.api.AbstractMCMC`, the
:class:`~pyro.infer.mcmc.mcmc_kernel.MCMCKernel` protocol (``setup`` / ``sample`` /
``cleanup`` / ``diagnostics`` / ``logging``) and the functions of
:mod:`pyro.infer.mcmc.util` (``select_samples``, ``diagnostics``, ``print_summary``).
A particle kernel is run by this module's own loop; any other kernel is handed to a
wrapped :class:`pyro.infer.MCMC`, whose private state this class neither inherits nor
touches.
"""

import copy
import os
import pickle
import warnings
from collections.abc import Callable

import pyro
import torch
from pyro.infer.mcmc.api import AbstractMCMC
from pyro.infer.mcmc.logger import ProgressBar
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from pyro.infer.mcmc.util import diagnostics as chain_diagnostics
from pyro.infer.mcmc.util import print_summary, select_samples
from pyro.ops import streaming, welford
from pyro.ops.streaming import StatsOfDict

from ..ops.validation import check_int
from . import checkpoint as ckpt
from .errors import EscapedParticleWarning, SamplerDivergenceError, SlowMixingWarning
from .sgmcmc.distributed import RankFailedError, is_collective_failure
from .sgmcmc.kernels import ParticleKernel

#: The classes a checkpoint may hold besides tensors and containers: Pyro's streaming
#: statistics. A checkpoint is loaded with ``torch.load(weights_only=True)``, so a crafted
#: file cannot run code; a user's own statistics class must be allowed explicitly, with
#: ``torch.serialization.add_safe_globals``.
CHECKPOINT_GLOBALS = [
    streaming.CountStats,
    streaming.CountMeanStats,
    streaming.CountMeanVarianceStats,
    streaming.StackStats,
    welford.WelfordCovariance,
]


#: The entries of a checkpoint, with the types they must have.
CHECKPOINT_ENTRIES = {
    "format": int,
    "step": int,
    "config": (list, tuple),
    "fingerprint": dict,
    "data": dict,
    "kernel": dict,
    "draws": torch.Tensor,
    "statistics": (dict, type(None)),
    "cpu_rng": torch.Tensor,
    "cuda_rng": (list, tuple, type(None)),
    "checksums": dict,
}


class MCMC(AbstractMCMC):
    """
    The interface of :class:`pyro.infer.MCMC` with particles reported as chains, thinning,
    divergence handling and checkpoints for the stochastic-gradient kernels of
    :mod:`pyro_ext.infer`.

    Other kernels (e.g. :class:`pyro.infer.NUTS`) run exactly as under
    :class:`pyro.infer.MCMC`: this class hands them to a wrapped ``pyro.infer.MCMC``
    (it derives from :class:`pyro.infer.mcmc.api.AbstractMCMC`, not from
    ``pyro.infer.MCMC``). For the particle kernels (:class:`~pyro_ext.infer.SGMCMCKernel` s
    and :class:`~pyro_ext.infer.Gibbs`):

    - the ``L`` particles become chains: ``get_samples(group_by_chain=True)`` has shape
      ``(L, num_samples, ...)``, ``get_samples()`` ``(L * num_samples, ...)`` and
      :meth:`summary` computes ``r_hat`` / ``n_eff`` across particles; after a run
      :attr:`num_chains` equals ``L``;
    - a :class:`~pyro_ext.infer.SamplerDivergenceError` stops the run, but the draws
      collected before it stay available through :meth:`get_samples`;
    - with ``checkpoint_path`` the state is written every ``checkpoint_every`` steps and
      :meth:`resume` continues an interrupted run to the same draws it would have made. A
      checkpoint is loaded without running code (``torch.load(weights_only=True)``), every
      entry of it carries a checksum, and a checkpoint of another run (another kernel or
      kernel setting, particle count, model or data set) is refused, naming what differs;
    - :meth:`extend` continues a finished run for more draws (e.g. until ``r_hat`` is
      small enough) without a second warm-up.
    - when a run ends, particles whose mean log density over the kept steps is far below
      the ensemble's (finite, but escaped to where the posterior has no mass) are listed
      in :attr:`escaped_particles` and reported by an
      :class:`~pyro_ext.infer.EscapedParticleWarning`;
    - in a :mod:`torch.distributed` process group (a script launched with ``torchrun``) a
      kernel shards its particles or its minibatch over the ranks (``shard=`` of
      :class:`~pyro_ext.infer.SGMCMCKernel`); every rank then ends the run with the draws
      of all particles, so :meth:`get_samples`, :meth:`summary` and
      :meth:`get_statistics` give the same answer on every rank. Only rank 0 shows a
      progress bar. A checkpoint is one file per rank, ``checkpoint_path`` with
      ``.rank{r}`` appended; resuming on the same number of ranks gives the same draws. A
      divergence on any rank stops all of them with the same
      :class:`~pyro_ext.infer.SamplerDivergenceError`, and a rank that stops or dies
      makes the others raise :class:`~pyro_ext.infer.sgmcmc.distributed.RankFailedError`.

    Memory: the kept draws of a large network need not pile up on the accelerator.
    ``thinning`` keeps fewer of them, ``draws_device="cpu"`` moves each one off the GPU as
    it is taken, and ``statistics`` keeps none at all but updates streaming statistics of
    them (:mod:`pyro.ops.streaming`), as :class:`pyro.infer.mcmc.api.StreamingMCMC` does::

        from pyro.ops.streaming import CountMeanVarianceStats, StatsOfDict

        mcmc = MCMC(kernel, num_samples=100, thinning=10,
                    statistics=StatsOfDict(default=CountMeanVarianceStats))
        mcmc.run(x, y)
        mcmc.get_statistics(group_by_chain=False)["w"]["mean"]  # pooled over particles

    ``StreamingMCMC`` itself runs these kernels too, but it sees the ``L`` particles as
    one chain whose state has a leading dimension ``L``: its statistics are per particle
    and never pooled, and it has neither thinning nor checkpoints.

    :param int thinning: keep every ``thinning``-th post-warmup state; ``num_samples``
        draws are kept per particle, so the run takes ``num_samples * thinning`` steps.
    :param str checkpoint_path: where checkpoints are written.
    :param int checkpoint_every: steps between checkpoints (default: 10 per run).
    :param draws_device: the device kept draws (or the streaming statistics) are moved
        to as they are taken, e.g. ``"cpu"`` for a run on a GPU; by default they stay on
        the particles' device.
    :type draws_device: torch.device or str
    :param statistics: a :class:`~pyro.ops.streaming.StatsOfDict` (e.g.
        ``StatsOfDict(default=CountMeanVarianceStats)``), updated with
        ``{(particle, site): constrained value}`` at each kept state instead of storing
        the draws; read it with :meth:`get_statistics`. :meth:`get_samples` is then
        unavailable.

    The other parameters are those of :class:`pyro.infer.MCMC`.
    """

    def __init__(
        self,
        kernel: MCMCKernel,
        num_samples: int,
        warmup_steps: int | None = None,
        initial_params: dict | None = None,
        num_chains: int = 1,
        hook_fn: Callable | None = None,
        mp_context: str | None = None,
        disable_progbar: bool = False,
        disable_validation: bool = True,
        transforms: dict | None = None,
        save_params: list | None = None,
        thinning: int = 1,
        checkpoint_path: str | os.PathLike | None = None,
        checkpoint_every: int | None = None,
        draws_device: str | torch.device | None = None,
        statistics: StatsOfDict | None = None,
    ):
        if not isinstance(kernel, MCMCKernel):
            raise TypeError(
                "kernel must be an MCMC kernel (pyro_ext.infer.SGLD, SGHMC, AdamSGLD, Gibbs, "
                f"or a pyro.infer.mcmc kernel such as NUTS), got {type(kernel).__name__}"
            )
        # The one place the kernel's type is looked at: a particle kernel runs in this
        # class's loop, any other in the wrapped pyro.infer.MCMC below.
        particle_kernel = isinstance(kernel, ParticleKernel)
        if (draws_device is not None or statistics is not None) and not particle_kernel:
            raise ValueError(
                "draws_device and statistics need a particle kernel (SGMCMCKernel or Gibbs)"
            )
        if statistics is not None and not isinstance(statistics, StatsOfDict):
            raise TypeError(
                "statistics must be a pyro.ops.streaming.StatsOfDict, "
                f"got {type(statistics).__name__}"
            )
        if particle_kernel:
            if num_chains != 1:
                raise ValueError(
                    "particle kernels run their chains together: set num_particles on the "
                    f"kernel instead of num_chains={num_chains}"
                )
            if save_params is not None:
                raise ValueError("save_params is not supported with particle kernels")
        warmup_steps = check_int(warmup_steps, "warmup_steps", low=0, allow_none=True)
        num_samples = check_int(num_samples, "num_samples", low=1)
        thinning = check_int(thinning, "thinning", low=1)
        checkpoint_every = check_int(checkpoint_every, "checkpoint_every", low=1, allow_none=True)
        super().__init__(kernel, num_chains, transforms)
        #: A kernel other than a particle kernel runs in this pyro.infer.MCMC, built here so
        #: that it checks its arguments (e.g. ``initial_params`` of a ``potential_fn``)
        #: when this one is constructed, as before; ``None`` for a particle kernel.
        self._pyro_mcmc = (
            None
            if particle_kernel
            else pyro.infer.MCMC(
                kernel,
                num_samples,
                warmup_steps=warmup_steps,
                initial_params=initial_params,
                num_chains=num_chains,
                hook_fn=hook_fn,
                mp_context=mp_context,
                disable_progbar=disable_progbar,
                disable_validation=disable_validation,
                transforms=transforms,
                save_params=save_params,
            )
        )
        self.num_samples = num_samples
        self.warmup_steps = num_samples if warmup_steps is None else warmup_steps  # as Pyro's
        self.disable_validation = disable_validation
        self.thinning = thinning
        self.checkpoint_path = checkpoint_path
        self.checkpoint_every = checkpoint_every
        self.draws_device = None if draws_device is None else torch.device(draws_device)
        self._statistics = statistics
        self._initial_statistics = copy.deepcopy(statistics)
        self._initial_params = initial_params
        self._hook_fn = hook_fn
        self._disable_progbar = disable_progbar
        self._model_args = (None, None)  # (args, kwargs) of the last run()
        # (fingerprint, data digest) of the current run, computed once at its set-up when
        # it writes or reads checkpoints (hashing the data is not a per-step cost).
        self._run_identity = None
        # What a particle kernel's run leaves: its flat draws (L, N, draw_dim), this rank's
        # share of them, their site values (L, N, ...) and each particle's diagnostics.
        self._flat = self._local_flat = None
        self._draws = None
        self._chain_diagnostics = None
        #: the particles (chains) the last run reported as escaped (see
        #: :class:`~pyro_ext.infer.EscapedParticleWarning`); empty when none did
        self.escaped_particles = []
        #: the particles far below the ensemble on average over the kept steps but not over
        #: their final quarter: late arrivals whose first kept draws are warm-up's transient
        #: (a :class:`~pyro_ext.infer.SlowMixingWarning` names them); empty when none were
        self.rejoined_particles = []

    # -- the only names of pyro.infer.MCMC's private state this class keeps ----------------
    # ArviZ (``arviz.from_pyro``) reads the model arguments of the run from
    # ``mcmc._args`` / ``mcmc._kwargs``, pyro.infer.MCMC's private fields: Pyro has no public
    # accessor for them. They are read-only views of this class's own record.
    @property
    def _args(self):
        return self._model_args[0]

    @property
    def _kwargs(self):
        return self._model_args[1]

    @property
    def _total_steps(self):
        return self.warmup_steps + self.num_samples * self.thinning

    def run(self, *args, **kwargs) -> None:
        """Run the sampler; see :meth:`pyro.infer.MCMC.run`."""
        self._model_args = (args, kwargs)
        if self._pyro_mcmc is not None:
            # Through public attributes only: a transforms dict set on this object before
            # the run is used, and the one Pyro infers is shown here after it.
            self._pyro_mcmc.transforms = self.transforms
            self._pyro_mcmc.disable_validation = self.disable_validation
            self._pyro_mcmc.run(*args, **kwargs)
            self.transforms = self._pyro_mcmc.transforms
            return
        if self._initial_params is not None:
            self.kernel.initial_params = self._initial_params
        self._tell_kept_steps()
        with pyro.validation_enabled(not self.disable_validation):
            self.kernel.setup(self.warmup_steps, *args, **kwargs)
        self._run_identity = None if self.checkpoint_path is None else self._identity()
        self._statistics = copy.deepcopy(self._initial_statistics)
        self._run_particles(start=0, draws=[])

    def resume(self, *args, allow_new_data: bool = False, **kwargs) -> None:
        """
        Continue the run saved at ``checkpoint_path``. Pass the same model arguments as
        to :meth:`run`; the draws equal those of an uninterrupted run with the same seed.

        The checkpoint must be one of this run: every entry matches its checksum, and the
        kernel (its class, particles, step-size schedule, repulsion, temperature and other
        hyper-parameters, shard layout), the model (each sample site's name, distribution,
        support, shapes, observed or not) and the model arguments (the SHA-256 of every
        tensor, the ``repr`` of anything else) are those it was written with. Otherwise a
        ``ValueError`` (a ``TypeError`` for an entry of the wrong type) names what differs;
        restart the run with :meth:`run`.

        :param bool allow_new_data: continue on purpose on other model arguments than the
            checkpoint's (e.g. a data set that grew): the arguments, their shapes and the
            observed sites' shapes are then not compared; the latent sites still must
            match. (A keyword of ``resume`` itself: a model keyword argument of that name
            cannot be passed through it.)
        """
        if self._pyro_mcmc is not None or self.checkpoint_path is None:
            raise ValueError("resume() needs a particle kernel and a checkpoint_path")
        if not isinstance(allow_new_data, bool):
            raise TypeError(
                f"allow_new_data must be True or False, got {type(allow_new_data).__name__}"
            )
        self._model_args = (args, kwargs)
        # Set up first: in a sharded run the set-up is collective, and the file to read is
        # this rank's.
        self._tell_kept_steps()
        with pyro.validation_enabled(not self.disable_validation):
            self.kernel.setup(self.warmup_steps, *args, **kwargs)
        self._run_identity = self._identity()
        try:
            checkpoint = self._load_checkpoint()
            self._check_checkpoint(checkpoint, allow_new_data)
            failure = None
        except (ValueError, TypeError, FileNotFoundError) as error:
            checkpoint, failure = None, error
        shard = self.kernel.shard
        if shard is not None:
            # Every rank learns whether every other could resume, so that none waits for a
            # rank that stopped at its checkpoint.
            verdicts = shard.gather_object(
                None if failure is None else f"{type(failure).__name__}: {failure}"
            )
            steps = shard.gather_object(None if checkpoint is None else checkpoint["step"])
            failed = {r: why for r, why in enumerate(verdicts) if why is not None}
            if failed:
                raise ValueError(
                    "resume(): rank(s) cannot resume: "
                    + "; ".join(f"rank {r}: {why}" for r, why in failed.items())
                )
            if len(set(steps)) > 1:
                raise ValueError(
                    f"resume(): the ranks' checkpoints are of different steps {steps}; "
                    "restart the run"
                )
        if failure is not None:
            raise failure
        self.kernel.load_state_dict(checkpoint["kernel"])
        torch.set_rng_state(checkpoint["cpu_rng"])
        if checkpoint["cuda_rng"] is not None:
            torch.cuda.set_rng_state_all(checkpoint["cuda_rng"])
        self._statistics = self._restore_statistics(checkpoint.get("statistics"))
        self._run_particles(start=checkpoint["step"], draws=list(checkpoint["draws"].unbind(0)))

    def _check_checkpoint(self, checkpoint, allow_new_data=False):
        """Refuse a checkpoint of another run, or one whose entries a set-up kernel cannot
        take (checked here, so that the kernel never meets a malformed state)."""
        where = f"checkpoint_path={self.checkpoint_file!r}"
        restart = "; the file was modified or damaged: restart the run"
        config = (self.warmup_steps, self.num_samples, self.thinning)
        saved_config = tuple(checkpoint["config"])
        integers = all(isinstance(v, int) and not isinstance(v, bool) for v in saved_config)
        if not integers or saved_config != config:
            raise ValueError(
                f"{where}: checkpoint['config'] says it was written with (warmup_steps, "
                f"num_samples, thinning)={saved_config}, this MCMC has {config}: resume with "
                "the run's settings, or restart the run"
            )
        step, total = checkpoint["step"], self._total_steps
        if not 0 <= step <= total:
            raise ValueError(
                f"{where}: checkpoint['step']={step} lies outside [0, {total}], the steps of a run "
                f"with (warmup_steps, num_samples, thinning)={config}" + restart
            )
        if (checkpoint["statistics"] is None) != (self._statistics is None):
            raise ValueError(
                f"{where}: the checkpoint and this MCMC disagree on keeping draws or statistics "
                f"(checkpoint['statistics'] is {'None' if checkpoint['statistics'] is None else 'set'}, "
                f"this MCMC's statistics= is {'None' if self._statistics is None else 'set'}): "
                "resume with the run's statistics option, or restart the run"
            )
        fingerprint, data = self._run_identity
        saved, now = checkpoint["fingerprint"], dict(fingerprint)
        saved_data, now_data = checkpoint["data"], data
        if allow_new_data:
            # Other data on purpose: what depends on the data (its shapes, the observed
            # sites' shapes) may change; the latent sites, which the state holds, may not.
            saved = dict(saved)
            for items in (saved, now):
                items.pop("data shapes", None)
                for key, value in list(items.items()):
                    if isinstance(value, dict) and value.get("observed"):
                        items[key] = {
                            k: v
                            for k, v in value.items()
                            if k not in ("batch_shape", "event_shape")
                        }
            saved_data = now_data
        different = ckpt.differences(saved, now) + ckpt.data_differences(saved_data, now_data)
        if different:
            data_only = not ckpt.differences(saved, now)
            raise ValueError(
                f"{where} was written by a different run (each item: was = in the checkpoint, "
                "is = in this run): "
                + "; ".join(different)
                + ". Resume with the kernel, its settings, the particles, the model and the "
                "model arguments of the run that wrote it, or start afresh with run()"
                + (
                    "; to continue on other data on purpose, pass resume(..., allow_new_data=True)"
                    if data_only
                    else ""
                )
                + "."
            )
        kernel = self.kernel
        ckpt.check_like(checkpoint["kernel"], kernel.state_dict(), ("kernel",), where)
        kernel_step = checkpoint["kernel"].get("step", step)
        if kernel_step != step:
            raise ValueError(
                f"{where}: checkpoint['kernel']['step']={kernel_step} differs from "
                f"checkpoint['step']={step}" + restart
            )
        draws = checkpoint["draws"]
        particles = kernel.particles
        kept = (
            0 if self._statistics is not None else max(0, step - self.warmup_steps) // self.thinning
        )
        expected = [kept, particles.shape[0], kernel.draw_dim]
        if list(draws.shape) != expected or draws.dtype != particles.dtype:
            raise ValueError(
                f"{where}: checkpoint['draws'] has shape {list(draws.shape)} and dtype "
                f"{draws.dtype}; at step {step} of this run it has shape {expected} (kept draws, "
                f"particles, draw width) and dtype {particles.dtype}" + restart
            )
        ckpt.check_like(checkpoint["cpu_rng"], torch.get_rng_state(), ("cpu_rng",), where)
        cuda_rng = checkpoint["cuda_rng"]
        if cuda_rng is not None:
            count = torch.cuda.device_count()
            if len(cuda_rng) != count:
                raise ValueError(
                    f"{where}: checkpoint['cuda_rng'] holds the random states of {len(cuda_rng)} "
                    f"CUDA devices, this process sees {count}: resume on the machine type "
                    "that wrote it, or restart the run"
                )
            template = [torch.cuda.get_rng_state(i) for i in range(count)]
            ckpt.check_like(cuda_rng, template, ("cuda_rng",), where)
        statistics = checkpoint["statistics"]
        if statistics is not None:
            for key, value in statistics.items():
                name = ckpt.render(("statistics", key))
                if not (
                    isinstance(key, tuple)
                    and len(key) == 2
                    and isinstance(key[0], int)
                    and isinstance(key[1], str)
                ):
                    raise ValueError(
                        f"{where}: {name}: the statistics are keyed by (particle, site)" + restart
                    )
                if not isinstance(value, streaming.StreamingStats):
                    raise TypeError(
                        f"{where}: {name} must be a pyro.ops.streaming statistic, got "
                        f"{type(value).__name__}" + restart
                    )

    @property
    def checkpoint_file(self) -> str | None:
        """The file this process writes checkpoints to: ``checkpoint_path``, with
        ``.rank{r}`` appended in a sharded run."""
        if self.checkpoint_path is None:
            return None
        shard = getattr(self.kernel, "shard", None)
        return os.fspath(self.checkpoint_path) + ("" if shard is None else f".rank{shard.rank}")

    def extend(self, num_samples: int) -> None:
        """
        Keep ``num_samples`` more draws per particle by continuing the finished run from
        the kernel's current state (no new warm-up, the same thinning). The draws are
        those a single run with the larger ``num_samples`` would have made.
        """
        if self._flat is None:
            raise ValueError("extend() continues a finished run of a particle kernel: run() first")
        num_samples = check_int(num_samples, "num_samples", low=1)
        start = self._total_steps
        draws = [] if self._statistics is not None else list(self._local_flat.unbind(1))
        self.num_samples += num_samples
        self._run_particles(start=start, draws=draws)

    def _run_particles(self, start, draws):
        kernel = self.kernel
        self.escaped_particles = []
        self.rejoined_particles = []
        params = kernel.initial_params
        every = self.checkpoint_every or max(1, self._total_steps // 10)
        shard = kernel.shard
        progress = ProgressBar(
            self.warmup_steps,
            self.num_samples * self.thinning,
            disable=self._disable_progbar or (shard is not None and shard.rank != 0),
        )
        bar = progress.progress_bars[0]
        bar.update(start)
        # Draws of steps the kernel has not verified yet (a compiled step on an accelerator
        # reads its finiteness flags every few steps): (step, flat particles).
        unverified = []
        step = start
        try:
            with pyro.validation_enabled(not self.disable_validation):
                while True:
                    if kernel.rewound_to is not None:
                        # A non-finite compiled step: the kernel went back to its last
                        # verified state and replays from there.
                        step, kernel.rewound_to = kernel.rewound_to, None
                        unverified = [(s, z) for s, z in unverified if s < step]
                        params = kernel.initial_params
                        bar.n = step
                        bar.refresh()
                        continue
                    # >=, not ==: a loop bound that a wrong start could skip past never ends.
                    if step >= self._total_steps:
                        if kernel.verify():
                            break
                        continue
                    params = kernel.sample(params)
                    if kernel.rewound_to is not None:
                        continue
                    if step == self.warmup_steps - 1:
                        self._warn_if_slow_mixing()
                    stage = "Warmup" if step < self.warmup_steps else "Sample"
                    kept = step - self.warmup_steps + 1
                    if kept > 0 and kept % self.thinning == 0:
                        unverified.append((step, self._take()))
                    if self._hook_fn is not None:
                        # As in pyro.infer.MCMC, the index restarts at 0 for the sampling stage.
                        index = step if step < self.warmup_steps else step - self.warmup_steps
                        self._hook_fn(kernel, params, stage, index)
                    if not progress.disable:
                        # kernel.logging() reads device values: only pay for it when shown.
                        progress.set_description(stage, refresh=False)
                        if step % 10 == 0:
                            progress.set_postfix(kernel.logging(), refresh=False)
                    bar.update()
                    step += 1
                    if self.checkpoint_path is not None and step % every == 0:
                        if not kernel.verify():
                            continue  # the rewind is taken at the top of the loop
                        unverified = self._commit(unverified, draws, step)
                        self._save_checkpoint(step, draws)
                    unverified = self._commit(unverified, draws, kernel.verified_steps)
            unverified = self._commit(unverified, draws, self._total_steps)
        except SamplerDivergenceError as error:
            self._commit(unverified, draws, error.step)
            self._collect(draws)
            raise
        except BaseException as error:
            if shard is None:
                # Any other failure (a model error, an interrupt) keeps the verified draws
                # too, so get_samples() never returns None after a run. (Not sharded: there
                # the collection is collective, and the other ranks may be gone.)
                try:
                    self._commit(unverified, draws, kernel.verified_steps)
                    self._collect(draws)
                except Exception as keep_error:
                    # The run's own error is the one raised; say why its draws are missing.
                    warnings.warn(
                        f"the draws before the failure could not be kept ({keep_error!r})",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                raise
            if isinstance(error, RankFailedError) or not isinstance(error, RuntimeError):
                raise
            if not is_collective_failure(error):
                raise
            raise RankFailedError(step, shard.rank, shard.world_size, error) from error
        finally:
            progress.close()
            kernel.cleanup()
        self._collect(draws)
        self._warn_if_escaped()

    def _tell_kept_steps(self):
        # The default step size (bias_bound="auto") is the least biased one whose kept
        # draws mix: the kernel needs to know how many steps are kept.
        if hasattr(self.kernel, "kept_steps"):
            self.kernel.kept_steps = self.num_samples * self.thinning

    def _warn_if_slow_mixing(self):
        """When warm-up has set the default step: warn if the steps to be kept are fewer
        than 100 relaxation times of a typical direction at that step."""
        advice = getattr(self.kernel, "mixing_advice", None)
        shard = getattr(self.kernel, "shard", None)
        if advice is None or (shard is not None and shard.rank != 0):
            return  # one warning per run, from rank 0
        message = advice(self.num_samples * self.thinning)
        if message is not None:
            warnings.warn(message[0].upper() + message[1:], SlowMixingWarning, stacklevel=4)

    def _warn_if_escaped(self):
        """When the run ends: list (:attr:`escaped_particles`) and warn about the particles
        whose mean log density over the kept steps is far below the ensemble's."""
        check = getattr(self.kernel, "escaped_particles", None)
        if check is None:
            return
        escape = check()  # collective when sharded: every rank calls it
        self.escaped_particles = escape.particles
        self.rejoined_particles = escape.rejoined
        shard = getattr(self.kernel, "shard", None)
        if shard is not None and shard.rank != 0:
            return
        if escape.rejoined:
            late = ", ".join(
                f"{i} ({gap:.3g} below on average, {final:.3g} at the end)"
                for i, gap, final in zip(
                    escape.rejoined[:10], escape.rejoined_gaps, escape.final_gaps
                )
            )
            warnings.warn(
                f"{len(escape.rejoined)} of {self.kernel.num_particles} particles reached the "
                f"ensemble only during the {escape.num_steps} kept steps: particle(s) {late}"
                f"{'...' if len(escape.rejoined) > 10 else ''} (nats below the median log "
                f"density; the threshold is {escape.threshold:.3g}). Their first kept draws "
                "are the transient of a warm-up too short for them: lengthen warm-up "
                "(warmup_steps) or start the particles nearer the posterior (init_strategy); "
                "MCMC.rejoined_particles lists them.",
                SlowMixingWarning,
                stacklevel=4,
            )
        if not escape.particles:
            return
        shown = ", ".join(
            f"{i} ({gap:.3g} below)" for i, gap in zip(escape.particles[:10], escape.gaps[:10])
        )
        more = "..." if len(escape.particles) > 10 else ""
        adaptation = getattr(self.kernel, "step_size_adaptation", None)
        if adaptation is None:
            remedy = "Reduce the step size (or leave step_size=None for the default rule)"
        else:
            # The default step (bias_bound="auto") may heat the stiffest directions well
            # above the target for the typical ones to mix: a particle kicked out of the
            # bulk there can land in another basin (a BNN's noise precision near 0).
            remedy = (
                f"The default step ({adaptation.step_size:.3g}) has a stationary variance "
                f"error of {adaptation.stiffest_error():.3g} in the stiffest direction: pass "
                "bias_bound='stiffest' (the bias bounded in every direction; slower mixing) "
                "or a smaller bias_tolerance, precondition (AdamSGLD), or start the particles "
                "nearer the posterior (init_strategy)"
            )
        warnings.warn(
            f"{len(escape.particles)} of {self.kernel.num_particles} particles escaped: their "
            f"mean log density over the {escape.num_steps} kept steps is below the ensemble's "
            f"median by more than {escape.threshold:.3g} nats (ten robust standard deviations "
            f"of the ensemble, and more than a Gaussian posterior allows): particle(s) "
            f"{shown}{more}. Their values are finite but lie where the posterior has no mass, "
            "so every average over the draws (a posterior predictive above all) is distorted. "
            f"{remedy}; to keep this run, drop those chains from "
            "get_samples(group_by_chain=True) (MCMC.escaped_particles lists them).",
            EscapedParticleWarning,
            stacklevel=4,
        )

    def _take(self):
        z = self.kernel.particles.detach()
        return z.to(self.draws_device or z.device, copy=True)

    def _commit(self, unverified, draws, verified_steps):
        """Keep the draws of the first ``verified_steps`` steps; return the others."""
        if not unverified or unverified[0][0] >= verified_steps:
            return unverified
        rest = []
        for step, z in unverified:
            if step >= verified_steps:
                rest.append((step, z))
            elif self._statistics is None:
                draws.append(z)
            else:
                self._update_statistics(z)
        return rest

    def _update_statistics(self, z):
        values = self.kernel.constrain_draws(z)
        shard = self.kernel.shard
        # Keyed by the particle's index in the whole run (this rank's, when sharded).
        indices = range(self.kernel.num_particles) if shard is None else shard.particle_indices
        self._statistics.update(
            {
                (particle, name): value[i]
                for name, value in values.items()
                for i, particle in enumerate(indices)
            }
        )

    def get_statistics(self, group_by_chain=True):
        """
        The streaming statistics of a run with ``statistics``, as
        :meth:`pyro.infer.mcmc.api.StreamingMCMC.get_statistics` gives them.

        :param bool group_by_chain: keyed by ``(particle, site)`` if ``True``, else by
            site, merged over particles.
        """
        if self._statistics is None:
            raise ValueError("this MCMC keeps draws, not statistics: use get_samples()")
        if group_by_chain:
            return self._statistics.get()
        merged = {}
        for (_, name), stats in self._statistics.stats.items():
            merged[name] = stats if name not in merged else merged[name].merge(stats)
        return {name: stats.get() for name, stats in merged.items()}

    def get_samples(
        self, num_samples: int | None = None, group_by_chain: bool = False
    ) -> dict[str, torch.Tensor]:
        """See :meth:`pyro.infer.MCMC.get_samples`; unavailable with ``statistics``."""
        if self._statistics is not None:
            raise ValueError("this MCMC kept streaming statistics, not draws: use get_statistics()")
        if self._pyro_mcmc is not None:
            return self._pyro_mcmc.get_samples(
                num_samples=num_samples, group_by_chain=group_by_chain
            )
        if self._draws is None:
            raise ValueError(
                "get_samples(): no draws yet; run() has not been called, or it failed while "
                "setting up the kernel (before its first step)"
            )
        return select_samples(self._draws, num_samples, group_by_chain)

    def diagnostics(self) -> dict:
        """
        See :meth:`pyro.infer.MCMC.diagnostics`: ``n_eff`` and ``r_hat`` of each site across
        the particles, and each particle's kernel diagnostics keyed ``"chain {i}"``
        (``divergences`` marks the last kept draw of a particle that diverged).
        """
        if self._pyro_mcmc is not None:
            return self._pyro_mcmc.diagnostics()
        diagnostics = chain_diagnostics(self._kept_draws("diagnostics"))
        for name in self._chain_diagnostics[0]:
            diagnostics[name] = {
                f"chain {i}": chain[name] for i, chain in enumerate(self._chain_diagnostics)
            }
        return diagnostics

    def summary(self, prob: float = 0.9) -> None:
        """See :meth:`pyro.infer.MCMC.summary`; counts the divergent particles of a diverged run."""
        if self._pyro_mcmc is not None:
            return self._pyro_mcmc.summary(prob=prob)
        print_summary(self._kept_draws("summary"), prob=prob)
        if "divergences" in self._chain_diagnostics[0]:
            count = sum(len(chain["divergences"]) for chain in self._chain_diagnostics)
            print(f"Number of divergences: {count}")

    def _kept_draws(self, method):
        """The draws ``(L, N, ...)`` that :meth:`summary` and :meth:`diagnostics` describe."""
        if self._statistics is not None:
            raise ValueError("this MCMC kept streaming statistics, not draws: use get_statistics()")
        if self._draws is None:
            raise ValueError(f"{method}() needs draws: run() first")
        if self._flat.shape[1] == 0:
            error = self.kernel.divergence
            why = (
                f"the run diverged at step {error.step}, before the first kept draw"
                if error is not None
                else "the run kept none"
            )
            raise ValueError(
                f"{method}() needs draws, and {why} (warmup_steps={self.warmup_steps}). "
                "Reduce the step size, or see SamplerDivergenceError for the sites concerned."
            )
        return self._draws

    def _restore_statistics(self, saved):
        if saved is None:
            return None
        statistics = copy.deepcopy(self._initial_statistics)
        statistics.stats.update(saved)
        return statistics

    def _identity(self):
        """``(fingerprint, data digest)`` of the run just set up: what its checkpoints are
        bound to (see :mod:`pyro_ext.infer.checkpoint`)."""
        args, kwargs = self._model_args
        model = self.kernel.potential.model
        return (
            ckpt.run_fingerprint(self.kernel, model, args, kwargs),
            ckpt.data_digest(model, args, kwargs),
        )

    def _load_checkpoint(self):
        path = self.checkpoint_file
        if not os.path.exists(path):
            rank_file = (
                "" if path == os.fspath(self.checkpoint_path) else f" (this rank's {path!r})"
            )
            raise FileNotFoundError(
                f"no checkpoint at checkpoint_path={self.checkpoint_path!r}{rank_file}"
            )
        try:
            with torch.serialization.safe_globals(CHECKPOINT_GLOBALS):
                checkpoint = torch.load(path, weights_only=True)
        except pickle.UnpicklingError as error:
            raise ValueError(
                f"checkpoint_path={path!r} holds objects other than tensors and Pyro's streaming "
                "statistics, so it was not loaded (a checkpoint is loaded without running code). "
                "If you wrote it with your own statistics class and trust the file, allow that "
                f"class with torch.serialization.add_safe_globals. Torch said: {error}"
            ) from None
        except (RuntimeError, EOFError, OSError) as error:
            raise ValueError(
                f"checkpoint_path={path!r} is truncated or not a checkpoint ({error}); restart the run"
            ) from None
        where = f"checkpoint_path={path!r}"
        if not isinstance(checkpoint, dict):
            raise ValueError(
                f"{where} is not a checkpoint of pyro_ext.infer.MCMC (it holds a "
                f"{type(checkpoint).__name__}); restart the run"
            )
        for key in CHECKPOINT_ENTRIES:
            if key not in checkpoint:
                raise ValueError(
                    f"{where}: checkpoint[{key!r}] is missing: the file is not a checkpoint of "
                    "pyro_ext.infer.MCMC, or one written by an older version (before checkpoints "
                    "were checksummed and bound to their run), or it was modified; restart the run"
                )
        unknown = [key for key in checkpoint if key not in CHECKPOINT_ENTRIES]
        if unknown:
            raise ValueError(
                f"{where}: checkpoint[{unknown[0]!r}] is not an entry of a checkpoint (those are "
                f"{list(CHECKPOINT_ENTRIES)}); the file was modified or damaged: restart the run"
            )
        for key, kind in CHECKPOINT_ENTRIES.items():
            value = checkpoint[key]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise TypeError(
                    f"{where}: checkpoint[{key!r}] must be "
                    + (
                        kind.__name__
                        if isinstance(kind, type)
                        else " or ".join(k.__name__ for k in kind)
                    )
                    + f", got {type(value).__name__}; the file was modified or damaged: restart the run"
                )
        if checkpoint["format"] != ckpt.FORMAT:
            raise ValueError(
                f"{where} has checkpoint format {checkpoint['format']}, this version of "
                f"pyro_ext reads format {ckpt.FORMAT}; restart the run"
            )
        ckpt.verify(checkpoint, where)
        return checkpoint

    def _save_checkpoint(self, step, draws):
        if self._run_identity is None:
            self._run_identity = self._identity()
        fingerprint, data = self._run_identity
        if draws:
            stacked = torch.stack(draws)
        else:
            # An empty tensor, not a list: a checkpoint's draws always have a checksum.
            particles = self.kernel.particles
            stacked = particles.new_zeros(
                (0, particles.shape[0], self.kernel.draw_dim),
                device=self.draws_device or particles.device,
            )
        checkpoint = {
            "format": ckpt.FORMAT,
            "step": step,
            "config": (self.warmup_steps, self.num_samples, self.thinning),
            "fingerprint": fingerprint,
            "data": data,
            "kernel": self.kernel.state_dict(),
            "draws": stacked,
            # The per-key statistics as a plain dict: a StatsOfDict keeps them in a
            # defaultdict, which a weights-only load cannot rebuild.
            "statistics": None if self._statistics is None else dict(self._statistics.stats),
            "cpu_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
        }
        ckpt.sign(checkpoint)
        tmp = f"{self.checkpoint_file}.tmp"
        torch.save(checkpoint, tmp)
        os.replace(tmp, self.checkpoint_file)

    def _collect(self, draws):
        num_particles = self.kernel.num_particles
        particles = self.kernel.particles
        if draws:
            flat = torch.stack(draws, dim=1)  # (L, N, D)
        else:
            device = self.draws_device or particles.device
            flat = particles.new_zeros((particles.shape[0], 0, self.kernel.draw_dim), device=device)
        self._local_flat = flat
        shard = self.kernel.shard
        if shard is not None and shard.mode == "particles":
            # Every rank ends with all particles' draws, gathered on the particles' device
            # (the one the process group's backend serves).
            flat = shard.gather(flat.to(particles.device)).to(flat.device)
        if shard is not None and self._statistics is not None:
            merged = copy.deepcopy(self._initial_statistics)
            for stats in shard.gather_object(dict(self._statistics.stats)):
                merged.stats.update(stats)
            self._statistics = merged
        self._flat = flat
        self._draws = self.kernel.constrain_draws(flat)
        # The draws are site values already: no transform is left to apply (the public
        # attributes of AbstractMCMC, as pyro.infer.MCMC has them after a run).
        self.transforms = {}
        self.num_chains = num_particles
        # A diverged run marks, for each particle that diverged, its last kept draw: the
        # divergent transition left that state (Pyro and ArviZ index divergences by draw).
        error, num_kept = self.kernel.divergence, flat.shape[1]
        self._chain_diagnostics = []
        for particle in range(num_particles):
            diagnostics = dict(self.kernel.diagnostics())
            if error is not None and particle in error.particles and num_kept:
                diagnostics["divergences"] = [num_kept - 1]
            self._chain_diagnostics.append(diagnostics)
