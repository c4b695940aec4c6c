"""The divergence errors of the package's inference families, under one base class.

Every family stops with its own error when its state stops being finite (the SG-MCMC
kernels and Gibbs with :class:`SamplerDivergenceError`, VIS with
:class:`~pyro_ext.infer.VISDivergenceError`, natural-gradient VI with
:class:`~pyro_ext.infer.NGVIDivergenceError`, the online filters with
:class:`~pyro_ext.online.OnlineDivergenceError`); each derives from
:class:`DivergenceError`, so that one ``except DivergenceError`` catches them all.
"""


class SlowMixingWarning(UserWarning):
    """
    A run whose draws will not have mixed: with the step size set at the end of warm-up,
    a typical direction of the posterior relaxes in more steps than a hundredth of those
    the run keeps (ten relaxations leave a split-R-hat near 1.3) (see :meth:`pyro_ext.infer.SGMCMCKernel.relaxation_steps`). The message says
    what to change; ``warnings.filterwarnings("ignore", category=SlowMixingWarning)``
    silences it.
    """


class EscapedParticleWarning(UserWarning):
    """
    Particles that escaped: every value finite, but a mean log density over the kept steps
    far below the rest of the ensemble's (see
    :meth:`pyro_ext.infer.SGMCMCKernel.escaped_particles` for the criterion). Their draws
    lie where the posterior has no mass. :attr:`pyro_ext.infer.MCMC.escaped_particles`
    lists them; the message says what to change.
    """


class DivergenceError(FloatingPointError):
    """
    The base class of every inference family's divergence error: a sampler, a variational
    fit or an online filter whose state (or its gradient) stopped being finite. Each
    subclass names the step where it happened (``step``) and keeps its own fields.

    A :class:`FloatingPointError`, as the natural-gradient and online errors always were;
    :class:`SamplerDivergenceError` (hence :class:`~pyro_ext.infer.VISDivergenceError`)
    stays a :class:`RuntimeError` too.
    """


class SamplerDivergenceError(DivergenceError, RuntimeError):
    """
    Raised when the potential or its gradient stops being finite.

    :ivar int step: the (0-based) sampler step at which it happened.
    :ivar list sites: latent sites whose gradient is not finite (empty when only the
        potential is).
    :ivar list particles: indices of the particles concerned.
    :ivar str reason: what failed, when not a non-finite value (e.g. the model's Cholesky
        factorisation of a covariance at the particles' values).
    """

    def __init__(self, step, sites, particles, reason=None):
        self.step, self.sites, self.particles = step, list(sites), list(particles)
        self.reason = reason
        where = f"in site(s) {', '.join(repr(s) for s in self.sites)}" if self.sites else ""
        what = reason or f"non-finite potential or gradient {where}"
        super().__init__(
            f"Sampler diverged at step {step}: {what} "
            f"for particle(s) {self.particles[:10]}{'...' if len(self.particles) > 10 else ''}. "
            "Reduce the step size (pyro_ext.infer.tune_step_size picks one from a grid by "
            "the kernel Stein discrepancy of short pilot runs) or check the model; draws "
            "collected before this step are kept (see MCMC.get_samples())."
        )

    def __reduce__(self):
        # Rebuild from the constructor's arguments: the default pickling passes only the
        # message, which breaks the error's trip back from a worker process.
        return type(self), (self.step, self.sites, self.particles, self.reason)

    @classmethod
    def from_model_error(cls, step, num_particles, error):
        """The divergence of a step at which the model itself failed on the particles'
        values (a covariance no longer positive definite, say), naming the error."""
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return cls(
            step,
            [],
            range(num_particles),
            reason=f"the model raised {type(error).__name__.lstrip('_')} ({first_line}) at the "
            "particles' "
            "values",
        )
