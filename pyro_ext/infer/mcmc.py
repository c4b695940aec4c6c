"""A drop-in :class:`pyro.infer.MCMC` that understands particle kernels."""

import os

import pyro
import torch
from pyro.infer.mcmc.logger import ProgressBar

from .sgmcmc.kernels import SGMCMCKernel
from .sgmcmc.potential import SamplerDivergenceError


class MCMC(pyro.infer.MCMC):
    """
    :class:`pyro.infer.MCMC` with particles reported as chains, thinning, divergence
    handling and checkpoints for the stochastic-gradient kernels of :mod:`pyro_ext.infer`.

    Other kernels (e.g. :class:`pyro.infer.NUTS`) run exactly as under
    :class:`pyro.infer.MCMC`. For :class:`~pyro_ext.infer.SGMCMCKernel` s:

    - the ``L`` particles become chains: ``get_samples(group_by_chain=True)`` has shape
      ``(L, num_samples, ...)``, ``get_samples()`` ``(L * num_samples, ...)`` and
      :meth:`summary` computes ``r_hat`` / ``n_eff`` across particles; after a run
      :attr:`num_chains` equals ``L``;
    - a :class:`~pyro_ext.infer.SamplerDivergenceError` stops the run, but the draws
      collected before it stay available through :meth:`get_samples`;
    - with ``checkpoint_path`` the state is written every ``checkpoint_every`` steps and
      :meth:`resume` continues an interrupted run to the same draws it would have made.

    :param int thinning: keep every ``thinning``-th post-warmup state; ``num_samples``
        draws are kept per particle, so the run takes ``num_samples * thinning`` steps.
    :param str checkpoint_path: where checkpoints are written.
    :param int checkpoint_every: steps between checkpoints (default: 10 per run).

    The other parameters are those of :class:`pyro.infer.MCMC`.
    """

    def __init__(
        self,
        kernel,
        num_samples,
        warmup_steps=None,
        initial_params=None,
        num_chains=1,
        hook_fn=None,
        mp_context=None,
        disable_progbar=False,
        disable_validation=True,
        transforms=None,
        save_params=None,
        thinning=1,
        checkpoint_path=None,
        checkpoint_every=None,
    ):
        if isinstance(kernel, SGMCMCKernel):
            if num_chains != 1:
                raise ValueError(
                    "particle kernels run their chains together: set num_particles on the "
                    f"kernel instead of num_chains={num_chains}"
                )
            if save_params is not None:
                raise ValueError("save_params is not supported with particle kernels")
        for name, value in (("num_samples", num_samples), ("thinning", thinning)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if checkpoint_every is not None and (not isinstance(checkpoint_every, int) or checkpoint_every < 1):
            raise ValueError(f"checkpoint_every must be a positive integer, got {checkpoint_every!r}")
        super().__init__(
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
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.thinning = thinning
        self.checkpoint_path = checkpoint_path
        self.checkpoint_every = checkpoint_every
        self._initial_params = initial_params
        self._hook_fn = hook_fn
        self._disable_progbar = disable_progbar

    @property
    def _total_steps(self):
        return self.warmup_steps + self.num_samples * self.thinning

    def run(self, *args, **kwargs):
        """Run the sampler; see :meth:`pyro.infer.MCMC.run`."""
        if not isinstance(self.kernel, SGMCMCKernel):
            return super().run(*args, **kwargs)
        self._args, self._kwargs = args, kwargs
        if self._initial_params is not None:
            self.kernel.initial_params = self._initial_params
        with pyro.validation_enabled(not self.disable_validation):
            self.kernel.setup(self.warmup_steps, *args, **kwargs)
        self._run_particles(start=0, draws=[])

    def resume(self, *args, **kwargs):
        """
        Continue the run saved at ``checkpoint_path``. Pass the same model arguments as
        to :meth:`run`; the draws equal those of an uninterrupted run with the same seed.
        """
        if not isinstance(self.kernel, SGMCMCKernel) or self.checkpoint_path is None:
            raise ValueError("resume() needs a particle kernel and a checkpoint_path")
        if not os.path.exists(self.checkpoint_path):
            raise FileNotFoundError(f"no checkpoint at checkpoint_path={self.checkpoint_path!r}")
        checkpoint = torch.load(self.checkpoint_path, weights_only=False)
        config = (self.warmup_steps, self.num_samples, self.thinning)
        if tuple(checkpoint["config"]) != config:
            raise ValueError(
                f"checkpoint was written with (warmup_steps, num_samples, thinning)="
                f"{tuple(checkpoint['config'])}, this MCMC has {config}"
            )
        self._args, self._kwargs = args, kwargs
        with pyro.validation_enabled(not self.disable_validation):
            self.kernel.setup(self.warmup_steps, *args, **kwargs)
        self.kernel.load_state_dict(checkpoint["kernel"])
        torch.set_rng_state(checkpoint["cpu_rng"])
        if checkpoint["cuda_rng"] is not None:
            torch.cuda.set_rng_state_all(checkpoint["cuda_rng"])
        self._run_particles(start=checkpoint["step"], draws=list(checkpoint["draws"]))

    def _run_particles(self, start, draws):
        kernel = self.kernel
        params = kernel.initial_params
        every = self.checkpoint_every or max(1, self._total_steps // 10)
        progress = ProgressBar(self.warmup_steps, self.num_samples * self.thinning, disable=self._disable_progbar)
        progress.progress_bars[0].update(start)
        try:
            with pyro.validation_enabled(not self.disable_validation):
                for step in range(start, self._total_steps):
                    params = kernel.sample(params)
                    stage = "Warmup" if step < self.warmup_steps else "Sample"
                    kept = step - self.warmup_steps + 1
                    if kept > 0 and kept % self.thinning == 0:
                        draws.append(kernel.particles.detach().clone())
                    if self._hook_fn is not None:
                        # As in pyro.infer.MCMC, the index restarts at 0 for the sampling stage.
                        index = step if step < self.warmup_steps else step - self.warmup_steps
                        self._hook_fn(kernel, params, stage, index)
                    if not progress.disable:
                        # kernel.logging() reads device values: only pay for it when shown.
                        progress.set_description(stage, refresh=False)
                        if step % 10 == 0:
                            progress.set_postfix(kernel.logging(), refresh=False)
                    progress.progress_bars[0].update()
                    if self.checkpoint_path is not None and (step + 1) % every == 0:
                        self._save_checkpoint(step + 1, draws)
        except SamplerDivergenceError:
            self._collect(draws)
            raise
        finally:
            progress.close()
            kernel.cleanup()
        self._collect(draws)

    def _save_checkpoint(self, step, draws):
        checkpoint = {
            "step": step,
            "config": (self.warmup_steps, self.num_samples, self.thinning),
            "kernel": self.kernel.state_dict(),
            "draws": torch.stack(draws) if draws else [],
            "cpu_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
        }
        tmp = f"{self.checkpoint_path}.tmp"
        torch.save(checkpoint, tmp)
        os.replace(tmp, self.checkpoint_path)

    def _collect(self, draws):
        potential = self.kernel.potential
        num_particles = self.kernel.num_particles
        if draws:
            flat = torch.stack(draws, dim=1)  # (L, N, D)
        else:
            flat = torch.zeros((num_particles, 0, potential.dim), device=self.kernel.particles.device)
        self._samples = {
            name: potential.transforms[name].inv(value)
            for name, value in potential.unflatten(flat).items()
        }
        self.transforms = {}
        self.num_chains = num_particles
        self._diagnostics = [self.kernel.diagnostics()] * num_particles
