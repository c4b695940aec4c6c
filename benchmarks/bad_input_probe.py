"""
A probe of how every public entry point of ``pyro_ext`` answers bad input (issue 32, "Every
wrong input refused").

Each case calls one entry point (of ``pyro_ext.infer``, ``online``, ``timeseries``,
``models``, ``ara``, ``rl``, ``datasets``, ``ops``) with one bad input: a wrong type (a
string, list or None where a tensor or number is expected), NaN/inf in data, an observation
outside its distribution's support (Bernoulli 2, Poisson -1 / 0.5, a category beyond the
count), a wrong length or a broadcastable wrong shape, an int tensor where floats are
needed, empty data, negative or zero sizes and step sizes, a subsample larger than the data,
and tampered MCMC checkpoints (the saved step set to 10**6 or -5, other data of the same
shape, another step size, 100 added to the kernel's state). Every case runs in a forked
worker (the package is imported once, before forking), at most two at a time, with a
timeout, and is classified:

- **clear**: a ``TypeError`` / ``ValueError`` (or a ``pyro_ext.infer.DivergenceError``)
  whose message names the offending argument or site (each case lists the names it accepts);
- **cryptic**: any other exception, or a ``TypeError`` / ``ValueError`` that names none of
  them (torch's "size of tensor a (5) must match", an ``IndexError``, a ``KeyError``...) or
  is Pyro's / torch.distributions' own validation error ("Error while computing log_prob_sum
  at site 'x': Expected value argument ... to be within the support ...");
- **silent**: no exception (a wrong answer returned);
- **hang**: the case ran past the timeout.

Control cases (the same calls with good input) check that the probe calls each entry point
correctly: a control that fails is reported, and its group's verdicts are suspect.

Run from the repository root::

    python benchmarks/bad_input_probe.py            # every case: about a minute of CPU,
                                                    # 3-4 minutes on the shared 2-core machine
    python benchmarks/bad_input_probe.py --quick    # one case in five, every control
    python benchmarks/bad_input_probe.py --before /tmp/probe_before.md   # a "before" column

``--before`` reads an earlier report of this script (e.g. one written with
``PYTHONPATH=<an archive of an older commit>`` so that ``import pyro_ext`` resolves there)
and puts its class of each case beside this run's. The table is printed and written to
``benchmarks/results/bad_input_probe.md``.
"""

import math
import multiprocessing
import os
import re
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from _common import REPO, argument_parser, command_line_args, markdown, write_report

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pyro  # noqa: E402
import pyro.distributions as dist  # noqa: E402
import torch  # noqa: E402

import pyro_ext  # noqa: E402
import pyro_ext.ara as ara  # noqa: E402
import pyro_ext.datasets as datasets  # noqa: E402
import pyro_ext.infer as infer  # noqa: E402
import pyro_ext.models as models  # noqa: E402
import pyro_ext.online as online  # noqa: E402
import pyro_ext.ops as ops  # noqa: E402
import pyro_ext.rl as rl  # noqa: E402
import pyro_ext.timeseries as ts  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "bad_input_probe.md"
CLASSES = ("clear", "cryptic", "silent", "hang")
#: First lines of Pyro's and torch.distributions' own validation errors: a message that starts
#: so is an internal leaking out (it names a site, not the argument, and no index), cryptic.
LEAKS = ("Error while computing log_prob", "Expected parameter ", "Expected value argument ")
NAN, INF = math.nan, math.inf


class Case(NamedTuple):
    module: str
    entry: str
    case: str
    names: tuple  # any of these in the message makes a TypeError / ValueError "clear"
    fn: object
    control: bool = False
    errors: tuple = ()  # other exception types that are the right answer for this case


CASES = []


def case(module, entry, name, names, fn, errors=()):
    """Register a bad-input case: ``fn()`` should raise naming one of ``names``, a
    ``TypeError`` / ``ValueError`` / ``DivergenceError`` or one of ``errors`` (names of
    exception classes, e.g. ``FileNotFoundError`` for a missing file)."""
    # The probe's models name their data argument "data" and their observed site "obs",
    # words that a message may use in passing: those count only quoted ('data', 'obs').
    names = tuple(f"'{n}'" if n in ("data", "obs") else n for n in names.split())
    CASES.append(Case(module, entry, name, names, fn, errors=tuple(errors)))


def control(module, entry, fn):
    """Register a control: ``fn()`` with good input, which must not raise."""
    CASES.append(Case(module, entry, "control (good input)", (), fn, control=True))


def with_nan(t, index=3, value=NAN):
    t = t.clone()
    t.view(-1)[index] = value
    return t


# -- shared models and helpers (built inside the worker) ----------------------------------------


def normal_model(data):
    loc = pyro.sample("loc", dist.Normal(0.0, 1.0))
    with pyro.plate("data", data.shape[0]):
        pyro.sample("obs", dist.Normal(loc, 1.0), obs=data)


def subsampled_model(data, subsample_size=2):
    loc = pyro.sample("loc", dist.Normal(0.0, 1.0))
    with pyro.plate("data", data.shape[0], subsample_size=subsample_size) as idx:
        pyro.sample("obs", dist.Normal(loc, 1.0), obs=data[idx])


def bernoulli_model(data):
    p = pyro.sample("p", dist.Beta(1.0, 1.0))
    with pyro.plate("data", data.shape[0]):
        pyro.sample("obs", dist.Bernoulli(p), obs=data)


def poisson_model(data):
    rate = pyro.sample("rate", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", data.shape[0]):
        pyro.sample("obs", dist.Poisson(rate), obs=data)


def categorical_model(data):
    probs = pyro.sample("probs", dist.Dirichlet(torch.ones(3)))
    with pyro.plate("data", data.shape[0]):
        pyro.sample("obs", dist.Categorical(probs), obs=data)


def mixture_model(data):
    mu = pyro.sample("mu", dist.Normal(torch.tensor([-1.0, 1.0]), 1.0).to_event(1))
    with pyro.plate("data", data.shape[0]):
        z = pyro.sample("z", dist.Bernoulli(torch.tensor(0.5)))
        pyro.sample("obs", dist.Normal(mu[z.long()], 1.0), obs=data)


def linear_model(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(2), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]):
        return pyro.sample("obs", dist.Normal(x @ w, 1.0), obs=y)


def data5():
    return torch.randn(5)


def run_mcmc(kernel, *args, num_samples=2, warmup_steps=1, **kwargs):
    mcmc = infer.MCMC(
        kernel, num_samples=num_samples, warmup_steps=warmup_steps, disable_progbar=True, **kwargs
    )
    mcmc.run(*args)
    return mcmc


def sgld(model=normal_model, **kwargs):
    return infer.SGLD(model, **{"step_size": 1e-3, **kwargs})


# -- pyro_ext.infer -----------------------------------------------------------------------------

KERNELS = {
    "SGLD": lambda model=normal_model, **kw: infer.SGLD(model, **{"step_size": 1e-3, **kw}),
    "SGHMC": lambda model=normal_model, **kw: infer.SGHMC(model, **{"step_size": 1e-3, **kw}),
    "AdamSGLD": lambda model=normal_model, **kw: infer.AdamSGLD(model, **{"step_size": 1e-3, **kw}),
}

for _name, _make in KERNELS.items():
    _entry = f"{_name} + MCMC.run"
    control("infer", _entry, lambda m=_make: run_mcmc(m(), data5()))
    case("infer", _name, "step_size a string", "step_size", lambda m=_make: m(step_size="0.1"))
    case("infer", _name, "step_size negative", "step_size", lambda m=_make: m(step_size=-0.1))
    case("infer", _name, "step_size zero", "step_size", lambda m=_make: m(step_size=0.0))
    case("infer", _name, "step_size NaN", "step_size", lambda m=_make: m(step_size=NAN))
    case("infer", _name, "model not callable", "model", lambda m=_make: m(model="normal"))
    case("infer", _name, "num_particles 0", "num_particles", lambda m=_make: m(num_particles=0))
    case(
        "infer",
        _entry,
        "NaN in data at 3",
        "obs data",
        lambda m=_make: run_mcmc(m(), with_nan(data5())),
    )
    case(
        "infer",
        _entry,
        "Bernoulli obs 2",
        "obs data",
        lambda m=_make: run_mcmc(m(bernoulli_model), torch.tensor([0.0, 1.0, 2.0, 1.0])),
    )

# Data cases for SGLD only (the other kernels share its set-up).
_entry = "SGLD + MCMC.run"
case(
    "infer",
    _entry,
    "inf in data at 2",
    "obs data",
    lambda: run_mcmc(sgld(), with_nan(data5(), 2, INF)),
)
case(
    "infer",
    _entry,
    "Poisson obs -1",
    "obs data",
    lambda: run_mcmc(sgld(poisson_model), torch.tensor([0.0, 2.0, -1.0])),
)
case(
    "infer",
    _entry,
    "Poisson obs 0.5",
    "obs data",
    lambda: run_mcmc(sgld(poisson_model), torch.tensor([0.0, 2.0, 0.5])),
)
case(
    "infer",
    _entry,
    "Categorical obs 3 of 3 categories",
    "obs data",
    lambda: run_mcmc(sgld(categorical_model), torch.tensor([0, 1, 3])),
)
case(
    "infer",
    _entry,
    "Categorical obs -1",
    "obs data",
    lambda: run_mcmc(sgld(categorical_model), torch.tensor([0, 1, -1])),
)
case(
    "infer", _entry, "int data for a Normal", "obs data", lambda: run_mcmc(sgld(), torch.arange(5))
)
case("infer", _entry, "empty data (N=0)", "obs data", lambda: run_mcmc(sgld(), torch.zeros(0)))
case(
    "infer",
    _entry,
    "subsample_size 5 > N 3",
    "subsample_size data",
    lambda: run_mcmc(sgld(lambda d: subsampled_model(d, 5)), torch.randn(3)),
)
case(
    "infer",
    _entry,
    "subsample_size 0",
    "subsample_size data",
    lambda: run_mcmc(sgld(lambda d: subsampled_model(d, 0)), torch.randn(3)),
)
case("infer", "SGLD", "num_particles 2.5", "num_particles", lambda: sgld(num_particles=2.5))
case("infer", "SGLD", "temperature negative", "temperature", lambda: sgld(temperature=-1.0))
case("infer", "SGLD", "repulsion unknown", "repulsion", lambda: sgld(repulsion="bogus"))
case("infer", "SGLD", "vectorize unknown", "vectorize", lambda: sgld(vectorize="bogus"))
case(
    "infer",
    "SGLD",
    "divergence_check_every 0",
    "divergence_check_every",
    lambda: sgld(divergence_check_every=0),
)
case("infer", "SGLD", "step_size inf", "step_size", lambda: sgld(step_size=INF))
case("infer", "SGLD", "step_size a list", "step_size", lambda: sgld(step_size=[1e-3]))
case(
    "infer",
    "SGHMC",
    "friction negative",
    "friction",
    lambda: infer.SGHMC(normal_model, 1e-3, friction=-1.0),
)
case(
    "infer",
    "SGHMC",
    "friction a string",
    "friction",
    lambda: infer.SGHMC(normal_model, 1e-3, friction="a"),
)
case(
    "infer",
    "AdamSGLD",
    "betas (1.5, 0.9)",
    "betas",
    lambda: infer.AdamSGLD(normal_model, 1e-3, betas=(1.5, 0.9)),
)
case(
    "infer", "AdamSGLD", "eps negative", "eps", lambda: infer.AdamSGLD(normal_model, 1e-3, eps=-1.0)
)
case(
    "infer",
    "AdamSGLD",
    "betas a float",
    "betas",
    lambda: infer.AdamSGLD(normal_model, 1e-3, betas=0.9),
)

# MCMC's own arguments.
case("infer", "MCMC", "num_samples 0", "num_samples", lambda: infer.MCMC(sgld(), num_samples=0))
case("infer", "MCMC", "num_samples -1", "num_samples", lambda: infer.MCMC(sgld(), num_samples=-1))
case(
    "infer",
    "MCMC",
    "num_samples a string",
    "num_samples",
    lambda: infer.MCMC(sgld(), num_samples="10"),
)
case("infer", "MCMC", "num_samples 2.5", "num_samples", lambda: infer.MCMC(sgld(), num_samples=2.5))
case(
    "infer",
    "MCMC",
    "warmup_steps -1",
    "warmup_steps",
    lambda: infer.MCMC(sgld(), 2, warmup_steps=-1),
)
case("infer", "MCMC", "thinning 0", "thinning", lambda: infer.MCMC(sgld(), 2, thinning=0))
case("infer", "MCMC", "num_chains 0", "num_chains", lambda: infer.MCMC(sgld(), 2, num_chains=0))
case("infer", "MCMC", "kernel a string", "kernel", lambda: infer.MCMC("SGLD", num_samples=2))
case(
    "infer",
    "MCMC",
    "checkpoint_every 0",
    "checkpoint_every",
    lambda: infer.MCMC(sgld(), 2, checkpoint_path="/tmp/x.ckpt", checkpoint_every=0),
)
case(
    "infer",
    "MCMC.run",
    "initial_params wrong shape",
    "initial_params loc",
    lambda: run_mcmc(sgld(), data5(), initial_params={"loc": torch.zeros(3, 4)}),
)
case(
    "infer",
    "MCMC.run",
    "initial_params NaN",
    "initial_params loc",
    lambda: run_mcmc(sgld(), data5(), initial_params={"loc": torch.tensor(NAN)}),
)
case(
    "infer",
    "MCMC.run",
    "initial_params unknown site",
    "initial_params nope",
    lambda: run_mcmc(sgld(), data5(), initial_params={"nope": torch.tensor(0.0)}),
)


# Checkpoint tampering: interrupt a run after a checkpoint, edit the file, resume.
class _Stop(Exception):
    """Raised by a hook to interrupt a run right after a checkpoint is written."""


def _stop(kernel, params, stage, index):
    if stage == "Sample" and index == 3:
        raise _Stop


def _checkpointed(path, step_size=1e-3, hook_fn=None):
    return infer.MCMC(
        sgld(subsampled_model, step_size=step_size, num_particles=2),
        num_samples=6,
        warmup_steps=2,
        disable_progbar=True,
        checkpoint_path=path,
        checkpoint_every=2,
        hook_fn=hook_fn,
    )


def tampered_resume(edit=None, resume_data=None, resume_step_size=1e-3):
    """Run until the hook interrupts the sampling stage (a checkpoint of step 4 is on disk),
    apply ``edit`` to the saved checkpoint, then resume, maybe with other data or step size."""
    from pyro_ext.infer.mcmc import CHECKPOINT_GLOBALS

    with tempfile.TemporaryDirectory(prefix="probe_ckpt_") as folder:
        path = os.path.join(folder, "run.ckpt")
        data = torch.randn(10)
        try:
            _checkpointed(path, hook_fn=_stop).run(data)
        except _Stop:  # the interruption asked for: the checkpoint stays behind
            pass
        if edit is not None:
            with torch.serialization.safe_globals(CHECKPOINT_GLOBALS):
                checkpoint = torch.load(path, weights_only=True)
            edit(checkpoint)
            torch.save(checkpoint, path)
        resumed = _checkpointed(path, step_size=resume_step_size)
        resumed.resume(data if resume_data is None else resume_data)
        return resumed.get_samples()


def _set_step(value):
    def edit(checkpoint):
        checkpoint["step"] = value
        checkpoint["kernel"]["step"] = value

    return edit


def _shift_state(checkpoint):
    for value in checkpoint["kernel"]["state"].values():
        value.add_(100.0)


control("infer", "MCMC.resume (checkpoint)", lambda: tampered_resume())
case(
    "infer",
    "MCMC.resume (checkpoint)",
    "saved step 10**6",
    "checkpoint checkpoint_path step",
    lambda: tampered_resume(_set_step(10**6)),
)
case(
    "infer",
    "MCMC.resume (checkpoint)",
    "saved step -5",
    "checkpoint checkpoint_path step",
    lambda: tampered_resume(_set_step(-5)),
)
case(
    "infer",
    "MCMC.resume (checkpoint)",
    "saved step a string",
    "checkpoint checkpoint_path step",
    lambda: tampered_resume(_set_step("4")),
)
case(
    "infer",
    "MCMC.resume (checkpoint)",
    "other data of the same shape",
    "checkpoint checkpoint_path data",
    lambda: tampered_resume(resume_data=torch.randn(10) + 5.0),
)
case(
    "infer",
    "MCMC.resume (checkpoint)",
    "another step size",
    "checkpoint checkpoint_path step_size",
    lambda: tampered_resume(resume_step_size=0.5),
)
case(
    "infer",
    "MCMC.resume (checkpoint)",
    "100 added to the kernel state",
    "checkpoint checkpoint_path state",
    lambda: tampered_resume(_shift_state),
)
case(
    "infer",
    "MCMC.resume (checkpoint)",
    "state tensor NaN",
    "checkpoint checkpoint_path state",
    lambda: tampered_resume(lambda c: [v.fill_(NAN) for v in c["kernel"]["state"].values()]),
)
case(
    "infer",
    "MCMC.resume (checkpoint)",
    "state tensor of another shape",
    "checkpoint checkpoint_path state",
    lambda: tampered_resume(
        lambda c: c["kernel"]["state"].update({k: v[:1] for k, v in c["kernel"]["state"].items()})
    ),
)
case(
    "infer",
    "MCMC.resume",
    "no checkpoint file",
    "checkpoint_path",
    lambda: _checkpointed("/nonexistent/run.ckpt").resume(torch.randn(10)),
    errors=("FileNotFoundError",),
)

# Step-size schedules and the repulsion kernel.
case(
    "infer",
    "ConstantStepSize",
    "step_size negative",
    "step_size",
    lambda: infer.ConstantStepSize(-1.0),
)
case(
    "infer",
    "ConstantStepSize",
    "step_size a string",
    "step_size",
    lambda: infer.ConstantStepSize("a"),
)
case(
    "infer",
    "CyclicalStepSize",
    "num_cycles 0",
    "num_cycles",
    lambda: infer.CyclicalStepSize(0.1, 0, 10),
)
case(
    "infer",
    "CyclicalStepSize",
    "num_cycles > num_steps",
    "num_cycles num_steps",
    lambda: infer.CyclicalStepSize(0.1, 5, 2),
)
case("infer", "PolynomialDecay", "a negative", "a", lambda: infer.PolynomialDecay(-1.0))
case("infer", "PolynomialDecay", "gamma 2", "gamma", lambda: infer.PolynomialDecay(0.1, gamma=2.0))
case(
    "infer", "RBFKernel", "bandwidth negative", "bandwidth", lambda: infer.RBFKernel(bandwidth=-1.0)
)

# Gibbs.
_gibbs_inner = lambda: infer.SGLD(mixture_model, step_size=1e-3, num_particles=2)  # noqa: E731
control("infer", "Gibbs + MCMC.run", lambda: run_mcmc(infer.Gibbs(_gibbs_inner(), "z"), data5()))
case(
    "infer",
    "Gibbs",
    "discrete_sites not in the model",
    "discrete_sites nope",
    lambda: run_mcmc(infer.Gibbs(_gibbs_inner(), "nope"), data5()),
)
case(
    "infer",
    "Gibbs",
    "discrete_sites a number",
    "discrete_sites",
    lambda: infer.Gibbs(_gibbs_inner(), 3),
)
case(
    "infer",
    "Gibbs",
    "moves unknown",
    "moves",
    lambda: infer.Gibbs(_gibbs_inner(), "z", moves="bogus"),
)
case("infer", "Gibbs", "every 0", "every", lambda: infer.Gibbs(_gibbs_inner(), "z", every=0))
case(
    "infer",
    "Gibbs",
    "max_support_size 0",
    "max_support_size",
    lambda: infer.Gibbs(_gibbs_inner(), "z", max_support_size=0),
)
case("infer", "Gibbs", "kernel a string", "kernel", lambda: infer.Gibbs("SGLD", "z"))
case(
    "infer",
    "Gibbs",
    "divergence_threshold negative",
    "divergence_threshold",
    lambda: infer.Gibbs(_gibbs_inner(), "z", divergence_threshold=-1.0),
)
case(
    "infer",
    "Gibbs + MCMC.run",
    "NaN in data at 3",
    "obs data",
    lambda: run_mcmc(infer.Gibbs(_gibbs_inner(), "z"), with_nan(data5())),
)


# VIS.
def vis_step(guide_kwargs=None, data=None, model=normal_model):
    from pyro.infer import SVI, Trace_ELBO
    from pyro.infer.autoguide import AutoNormal

    pyro.clear_param_store()
    data = data5() if data is None else data
    base = AutoNormal(model)
    base(data)
    guide = infer.VIS(model, base, **{"num_steps": 1, **(guide_kwargs or {})})
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), Trace_ELBO())
    return svi.step(data)


def _auto_normal():
    from pyro.infer.autoguide import AutoNormal

    return AutoNormal(normal_model)


control("infer", "VIS + SVI.step", lambda: vis_step())
case("infer", "VIS", "model not callable", "model", lambda: infer.VIS("model", _auto_normal()))
case("infer", "VIS", "base_guide None", "base_guide", lambda: infer.VIS(normal_model, None))
case(
    "infer",
    "VIS",
    "num_steps -1",
    "num_steps",
    lambda: infer.VIS(normal_model, _auto_normal(), num_steps=-1),
)
case(
    "infer",
    "VIS",
    "num_steps 1.5",
    "num_steps",
    lambda: infer.VIS(normal_model, _auto_normal(), num_steps=1.5),
)
case(
    "infer",
    "VIS",
    "step_size negative",
    "step_size",
    lambda: infer.VIS(normal_model, _auto_normal(), step_size=-1.0),
)
case(
    "infer",
    "VIS",
    "sampler unknown",
    "sampler",
    lambda: infer.VIS(normal_model, _auto_normal(), sampler="bogus"),
)
case(
    "infer",
    "VIS",
    "entropy unknown",
    "entropy",
    lambda: infer.VIS(normal_model, _auto_normal(), entropy="bogus"),
)
case(
    "infer",
    "VIS",
    "gradient unknown",
    "gradient",
    lambda: infer.VIS(normal_model, _auto_normal(), gradient="bogus"),
)
case(
    "infer",
    "VIS",
    "friction negative",
    "friction",
    lambda: infer.VIS(normal_model, _auto_normal(), friction=-1.0),
)
case(
    "infer",
    "VIS + SVI.step",
    "NaN in data at 3",
    "obs data",
    lambda: vis_step(data=with_nan(data5())),
)
case(
    "infer",
    "VIS + SVI.step",
    "Bernoulli obs 2",
    "obs data",
    lambda: vis_step(data=torch.tensor([0.0, 2.0, 1.0]), model=bernoulli_model),
)


# Natural-gradient VI.
def ngvi(**kwargs):
    return infer.NaturalGradientVI(linear_model, **{"ess": 6.0, **kwargs})


def xy(n=6):
    return torch.randn(n, 2), torch.randn(n)


control("infer", "NaturalGradientVI.step", lambda: ngvi().step(*xy()))
for _arg, _value in [
    ("method", "bogus"),
    ("lr", -0.1),
    ("lr", 0.0),
    ("ess", 0.0),
    ("beta1", 1.5),
    ("beta2", -0.1),
    ("hess_init", 0.0),
    ("mc_samples", 0),
    ("weight_decay", -1.0),
    ("vectorize", "bogus"),
    ("lr", "0.1"),
]:
    case(
        "infer",
        "NaturalGradientVI",
        f"{_arg}={_value!r}",
        _arg,
        lambda a=_arg, v=_value: ngvi(**{a: v}),
    )
case(
    "infer",
    "NaturalGradientVI",
    "model not callable",
    "model",
    lambda: infer.NaturalGradientVI(None),
)
case(
    "infer",
    "NaturalGradientVI.step",
    "NaN in x at 3",
    "x obs data",
    lambda: ngvi().step(with_nan(xy()[0]), xy()[1]),
)
case(
    "infer",
    "NaturalGradientVI.step",
    "NaN in y at 3",
    "y obs data",
    lambda: ngvi().step(xy()[0], with_nan(xy()[1])),
)
case(
    "infer",
    "NaturalGradientVI.step",
    "y of length 5 for 6 rows",
    "y obs",
    lambda: ngvi().step(xy()[0], torch.randn(5)),
)
case(
    "infer",
    "NaturalGradientVI.step",
    "empty data",
    "x y obs data",
    lambda: ngvi().step(torch.zeros(0, 2), torch.zeros(0)),
)


# tune_step_size.
def tune(**kwargs):
    options = {"candidates": [1e-3, 1e-2], "num_steps": 4, "max_draws": 4, **kwargs}
    return infer.tune_step_size(lambda s: infer.SGLD(normal_model, step_size=s), data5(), **options)


control("infer", "tune_step_size", lambda: tune())
case("infer", "tune_step_size", "candidates empty", "candidates", lambda: tune(candidates=[]))
case(
    "infer",
    "tune_step_size",
    "candidates negative",
    "candidates",
    lambda: tune(candidates=[-1e-3, 1e-2]),
)
case(
    "infer", "tune_step_size", "candidates a string", "candidates", lambda: tune(candidates="0.01")
)
case("infer", "tune_step_size", "num_steps 0", "num_steps", lambda: tune(num_steps=0))
case(
    "infer", "tune_step_size", "burn_in >= num_steps", "burn_in num_steps", lambda: tune(burn_in=10)
)
case("infer", "tune_step_size", "max_draws 0", "max_draws", lambda: tune(max_draws=0))
case(
    "infer",
    "tune_step_size",
    "kernel_factory a string",
    "kernel_factory",
    lambda: infer.tune_step_size("SGLD", data5(), candidates=[1e-3], num_steps=4),
)

# -- pyro_ext.online ----------------------------------------------------------------------------


def bong(**kwargs):
    return online.BONG(linear_model, **kwargs)


control("online", "BONG.update", lambda: bong().update(*xy()))
for _arg, _value in [
    ("family", "bogus"),
    ("method", "bogus"),
    ("learning_rate", -1.0),
    ("num_iters", 0),
    ("num_samples", 0),
    ("hessian", "bogus"),
    ("robust", "imq"),
]:
    case("online", "BONG", f"{_arg}={_value!r}", _arg, lambda a=_arg, v=_value: bong(**{a: v}))
case("online", "BONG", "rank 0 (dlr)", "rank", lambda: bong(family="dlr", rank=0))
case("online", "BONG", "model not callable", "model", lambda: online.BONG("model"))
case(
    "online",
    "BONG.update",
    "NaN in x at 3",
    "x obs",
    lambda: bong().update(with_nan(xy()[0]), xy()[1]),
)
case(
    "online",
    "BONG.update",
    "inf in y at 2",
    "y obs",
    lambda: bong().update(xy()[0], with_nan(xy()[1], 2, INF)),
)
case(
    "online",
    "BONG.update",
    "y of length 5 for 6 rows",
    "y obs",
    lambda: bong().update(xy()[0], torch.randn(5)),
)
case(
    "online",
    "BONG.update",
    "y broadcastable (6, 1)",
    "y obs",
    lambda: bong().update(xy()[0], torch.randn(6, 1)),
)
case("online", "BONG.update", "int y", "y obs", lambda: bong().update(xy()[0], torch.arange(6)))
case(
    "online",
    "BONG.update",
    "empty batch",
    "x y obs",
    lambda: bong().update(torch.zeros(0, 2), torch.zeros(0)),
)
case("online", "IMQ", "c negative", "c", lambda: online.IMQ(-1.0))
case("online", "IMQ", "c a string", "c", lambda: online.IMQ("a"))
case("online", "LoFi", "rank 0", "rank", lambda: online.LoFi(linear_model, rank=0))
case("online", "WoLF", "c zero", "c", lambda: online.WoLF(linear_model, c=0.0))


def _bern_arms():
    return online.ThompsonBandit(
        lambda: online.BONG(online.bernoulli_arms_model(3), family="diag"), 3
    )


def _gauss_arms():
    return online.ThompsonBandit(
        lambda: online.BONG(online.gaussian_arms_model(3), family="diag"), 3
    )


control(
    "online",
    "ThompsonBandit.run",
    lambda: _gauss_arms().run(online.GaussianBandit(torch.zeros(3)), 3, seed=0),
)
case(
    "online",
    "ThompsonBandit.observe",
    "action 5 of 3 arms",
    "action",
    lambda: _gauss_arms().observe(None, torch.tensor([0, 5]), torch.tensor([0.1, 0.2])),
)
case(
    "online",
    "ThompsonBandit.observe",
    "action -1",
    "action",
    lambda: _gauss_arms().observe(None, torch.tensor([0, -1]), torch.tensor([0.1, 0.2])),
)
case(
    "online",
    "ThompsonBandit.observe",
    "reward NaN",
    "reward",
    lambda: _gauss_arms().observe(None, torch.tensor([0, 1]), torch.tensor([0.1, NAN])),
)
case(
    "online",
    "ThompsonBandit.observe",
    "Bernoulli reward 2",
    "reward obs",
    lambda: _bern_arms().observe(None, torch.tensor([0, 1]), torch.tensor([1.0, 2.0])),
)
case(
    "online",
    "ThompsonBandit.observe",
    "3 actions, 2 rewards",
    "reward action",
    lambda: _gauss_arms().observe(None, torch.tensor([0, 1, 2]), torch.tensor([0.1, 0.2])),
)
case(
    "online",
    "ThompsonBandit.observe",
    "action a float tensor",
    "action",
    lambda: _gauss_arms().observe(None, torch.tensor([0.0, 1.5]), torch.tensor([0.1, 0.2])),
)
case(
    "online",
    "ThompsonBandit.run",
    "num_steps -1",
    "num_steps",
    lambda: _gauss_arms().run(online.GaussianBandit(torch.zeros(3)), -1, seed=0),
)
case(
    "online",
    "ThompsonBandit.run",
    "env with 5 arms for 3",
    "env num_arms",
    lambda: _gauss_arms().run(online.GaussianBandit(torch.zeros(5)), 3, seed=0),
)
case(
    "online",
    "ThompsonBandit",
    "num_arms 0",
    "num_arms",
    lambda: online.ThompsonBandit(lambda: bong(), 0),
)
case(
    "online",
    "ThompsonBandit",
    "policy unknown",
    "policy",
    lambda: online.ThompsonBandit(lambda: bong(), 2, policy="bogus"),
)
case(
    "online",
    "ThompsonBandit",
    "epsilon 2",
    "epsilon",
    lambda: online.ThompsonBandit(lambda: bong(), 2, policy="epsilon_greedy", epsilon=2.0),
)
case(
    "online",
    "ThompsonBandit",
    "ucb_scale negative",
    "ucb_scale",
    lambda: online.ThompsonBandit(lambda: bong(), 2, policy="ucb", ucb_scale=-1.0),
)
case(
    "online",
    "ThompsonBandit",
    "filter_factory not callable",
    "filter_factory",
    lambda: online.ThompsonBandit("bong", 2),
)
case(
    "online",
    "BernoulliBandit",
    "probs 1.5",
    "probs",
    lambda: online.BernoulliBandit(torch.tensor([0.5, 1.5])),
)
case(
    "online", "BernoulliBandit", "probs a list", "probs", lambda: online.BernoulliBandit([0.5, 0.2])
)
case(
    "online",
    "BernoulliBandit",
    "probs NaN",
    "probs",
    lambda: online.BernoulliBandit(torch.tensor([0.5, NAN])),
)
case(
    "online",
    "GaussianBandit",
    "means NaN",
    "means",
    lambda: online.GaussianBandit(torch.tensor([0.0, NAN])),
)
case(
    "online",
    "GaussianBandit",
    "scale negative",
    "scale",
    lambda: online.GaussianBandit(torch.zeros(2), scale=-1.0),
)
case(
    "online",
    "LinearContextualBandit",
    "weights 1-D",
    "weights",
    lambda: online.LinearContextualBandit(torch.zeros(3)),
)
case(
    "online",
    "LinearContextualBandit",
    "noise_scale negative",
    "noise_scale",
    lambda: online.LinearContextualBandit(torch.zeros(2, 3), noise_scale=-1.0),
)
case(
    "online",
    "LogisticContextualBandit",
    "weights a string",
    "weights",
    lambda: online.LogisticContextualBandit("w"),
)
case(
    "online",
    "bernoulli_arms_model",
    "num_arms 0",
    "num_arms",
    lambda: online.bernoulli_arms_model(0),
)
case(
    "online",
    "gaussian_arms_model",
    "noise_scale negative",
    "noise_scale",
    lambda: online.gaussian_arms_model(2, noise_scale=-1.0),
)
case(
    "online",
    "linear_contextual_model",
    "context_dim 0",
    "context_dim",
    lambda: online.linear_contextual_model(0, 2),
)
case(
    "online",
    "logistic_contextual_model",
    "num_arms -1",
    "num_arms",
    lambda: online.logistic_contextual_model(2, -1),
)
case(
    "online",
    "neural_contextual_model",
    "hidden 0",
    "hidden",
    lambda: online.neural_contextual_model(2, 2, hidden=0),
)


def bayes_opt(**kwargs):
    options = {"num_steps": 2, "hidden": 4, "grid_size": 8, "seed": 0, **kwargs}
    objective = options.pop("objective", lambda x: -(x**2))
    bounds = options.pop("bounds", (-1.0, 1.0))
    return online.bayes_opt_1d(objective, bounds, **options)


control("online", "bayes_opt_1d", lambda: bayes_opt())
case("online", "bayes_opt_1d", "bounds reversed", "bounds", lambda: bayes_opt(bounds=(1.0, -1.0)))
case("online", "bayes_opt_1d", "bounds NaN", "bounds", lambda: bayes_opt(bounds=(NAN, 1.0)))
case("online", "bayes_opt_1d", "bounds a string", "bounds", lambda: bayes_opt(bounds="0,1"))
case("online", "bayes_opt_1d", "num_steps 0", "num_steps", lambda: bayes_opt(num_steps=0))
case("online", "bayes_opt_1d", "grid_size 0", "grid_size", lambda: bayes_opt(grid_size=0))
case(
    "online",
    "bayes_opt_1d",
    "noise_scale negative",
    "noise_scale",
    lambda: bayes_opt(noise_scale=-1.0),
)
case(
    "online",
    "bayes_opt_1d",
    "objective not callable",
    "objective",
    lambda: bayes_opt(objective="f"),
)
case(
    "online",
    "bayes_opt_1d",
    "objective returns NaN",
    "objective",
    lambda: bayes_opt(objective=lambda x: x * NAN),
)


# More data cases: contexts, rewards and actions of the contextual models.
def _linear_bandit():
    return online.ThompsonBandit(lambda: online.BONG(online.linear_contextual_model(2, 2)), 2)


case(
    "online",
    "ThompsonBandit.observe",
    "context 3 features for 2",
    "context",
    lambda: _linear_bandit().observe(torch.randn(2, 3), torch.tensor([0, 1]), torch.randn(2)),
)
case(
    "online",
    "ThompsonBandit.observe",
    "NaN in context",
    "context",
    lambda: _linear_bandit().observe(
        with_nan(torch.randn(2, 2), 1), torch.tensor([0, 1]), torch.randn(2)
    ),
)
case(
    "online",
    "ThompsonBandit.act",
    "context 3 features for 2",
    "context",
    lambda: _linear_bandit().act(torch.randn(3)),
)
case(
    "online",
    "ThompsonBandit.observe",
    "contexts for 3 rows, 2 actions",
    "context action",
    lambda: _linear_bandit().observe(torch.randn(3, 2), torch.tensor([0, 1]), torch.randn(2)),
)

# -- pyro_ext.timeseries ------------------------------------------------------------------------


def ssm(obs_dim=1, state=2):
    return ts.StateSpaceMatrices(
        transition_matrix=torch.eye(state),
        observation_matrix=torch.ones(obs_dim, state),
        transition_cov=0.1 * torch.eye(state),
        observation_cov=torch.eye(obs_dim),
        init_mean=torch.zeros(state),
        init_cov=torch.eye(state),
    )


def ssm_with(**fields):
    return ssm()._replace(**fields)


def series(t=6):
    return torch.randn(t, 1)


control("timeseries", "kalman_filter", lambda: ts.kalman_filter(series(), ssm()))
case(
    "timeseries", "kalman_filter", "y a list", "y", lambda: ts.kalman_filter([[0.1], [0.2]], ssm())
)
case(
    "timeseries",
    "kalman_filter",
    "y obs_dim 2 for 1",
    "y observation_matrix",
    lambda: ts.kalman_filter(torch.randn(6, 2), ssm()),
)
case(
    "timeseries",
    "kalman_filter",
    "y int",
    "y",
    lambda: ts.kalman_filter(torch.ones(6, 1, dtype=torch.long), ssm()),
)
case(
    "timeseries",
    "kalman_filter",
    "inf in y at 3",
    "y",
    lambda: ts.kalman_filter(with_nan(series(), 3, INF), ssm()),
)
case(
    "timeseries",
    "kalman_filter",
    "matrices a dict",
    "matrices",
    lambda: ts.kalman_filter(series(), {}),
)
case(
    "timeseries",
    "kalman_filter",
    "transition_cov not PSD",
    "transition_cov W",
    lambda: ts.kalman_filter(series(), ssm_with(transition_cov=-torch.eye(2))),
)
case(
    "timeseries",
    "kalman_filter",
    "init_cov NaN",
    "init_cov",
    lambda: ts.kalman_filter(series(), ssm_with(init_cov=with_nan(torch.eye(2), 0))),
)
case(
    "timeseries",
    "kalman_filter",
    "init_mean wrong length",
    "init_mean",
    lambda: ts.kalman_filter(series(), ssm_with(init_mean=torch.zeros(3))),
)
case(
    "timeseries",
    "kalman_filter",
    "observation_matrix wrong shape",
    "observation_matrix F",
    lambda: ts.kalman_filter(series(), ssm_with(observation_matrix=torch.ones(1, 3))),
)
case(
    "timeseries",
    "kalman_filter",
    "empty series",
    "y",
    lambda: ts.kalman_filter(torch.zeros(0, 1), ssm()),
)
case(
    "timeseries",
    "kalman_forecast",
    "num_steps -1",
    "num_steps",
    lambda: ts.kalman_forecast(ts.kalman_filter(series(), ssm()), -1, ssm()),
)
case(
    "timeseries",
    "kalman_sample",
    "num_samples 0",
    "num_samples",
    lambda: ts.kalman_sample(series(), ssm(), num_samples=0),
)
case(
    "timeseries",
    "kalman_log_likelihood",
    "block_size 0",
    "block_size",
    lambda: ts.kalman_log_likelihood(series(), ssm(), block_size=0),
)
case(
    "timeseries",
    "kalman_smoother",
    "y 1-D for obs_dim 1",
    "y",
    lambda: ts.kalman_smoother(torch.randn(6), ssm()),
)
case(
    "timeseries", "kalman_whiten", "series a string", "series", lambda: ts.kalman_whiten("y", ssm())
)
case(
    "timeseries",
    "forecast_interval",
    "level 1.5",
    "level",
    lambda: ts.forecast_interval(torch.zeros(3, 1), torch.ones(3, 1, 1), level=1.5),
)
case(
    "timeseries",
    "forecast_interval",
    "covs wrong shape",
    "covs",
    lambda: ts.forecast_interval(torch.zeros(3, 1), torch.ones(4, 2, 2)),
)


def hmm_args(k=3, t=5):
    return torch.zeros(k), torch.zeros(k, k), torch.randn(t, k)


control("timeseries", "hmm_filter", lambda: ts.hmm_filter(*hmm_args()))
for _fname in ("hmm_filter", "hmm_log_likelihood", "hmm_smooth", "hmm_viterbi"):
    _f = getattr(ts, _fname)
    case(
        "timeseries",
        _fname,
        "trans_logits (3, 2)",
        "trans_logits",
        lambda f=_f: f(torch.zeros(3), torch.zeros(3, 2), torch.randn(5, 3)),
    )
    case(
        "timeseries",
        _fname,
        "obs_log_probs 4 states for 3",
        "obs_log_probs",
        lambda f=_f: f(torch.zeros(3), torch.zeros(3, 3), torch.randn(5, 4)),
    )
    case(
        "timeseries",
        _fname,
        "NaN in obs_log_probs",
        "obs_log_probs",
        lambda f=_f: f(*hmm_args()[:2], with_nan(torch.randn(5, 3), 4)),
    )
    case(
        "timeseries",
        _fname,
        "init_logits a string",
        "init_logits",
        lambda f=_f: f("a", torch.zeros(3, 3), torch.randn(5, 3)),
    )
case(
    "timeseries",
    "hmm_filter",
    "mask wrong length",
    "mask",
    lambda: ts.hmm_filter(*hmm_args(), mask=torch.ones(4, dtype=torch.bool)),
)
case(
    "timeseries",
    "hmm_filter",
    "int obs_log_probs",
    "obs_log_probs",
    lambda: ts.hmm_filter(torch.zeros(3), torch.zeros(3, 3), torch.zeros(5, 3, dtype=torch.long)),
)
case(
    "timeseries",
    "hmm_log_likelihood",
    "empty series",
    "obs_log_probs",
    lambda: ts.hmm_log_likelihood(*hmm_args(t=0)),
)
case(
    "timeseries",
    "hmm_predict",
    "num_steps -1",
    "num_steps",
    lambda: ts.hmm_predict(*hmm_args(), -1),
)
case(
    "timeseries",
    "hmm_sample_paths",
    "num_samples 0",
    "num_samples",
    lambda: ts.hmm_sample_paths(*hmm_args(), 0),
)
case(
    "timeseries",
    "check_stochastic_matrix",
    "rows sum to 2",
    "trans",
    lambda: ts.check_stochastic_matrix("trans", torch.ones(2, 2)),
)


def hmm_model_trace(y, **kwargs):
    model = ts.HiddenMarkovModel(3, "categorical", num_symbols=3, **kwargs)
    return pyro.poutine.trace(model).get_trace(y).log_prob_sum()


control(
    "timeseries", "HiddenMarkovModel", lambda: hmm_model_trace(torch.tensor([0.0, 1.0, 2.0, 1.0]))
)
case(
    "timeseries",
    "HiddenMarkovModel",
    "symbol 5 of 3",
    "y obs",
    lambda: hmm_model_trace(torch.tensor([0.0, 1.0, 5.0])),
)
case(
    "timeseries",
    "HiddenMarkovModel",
    "symbol -1",
    "y obs",
    lambda: hmm_model_trace(torch.tensor([0.0, -1.0, 2.0])),
)
case(
    "timeseries",
    "HiddenMarkovModel",
    "symbol 0.5",
    "y obs",
    lambda: hmm_model_trace(torch.tensor([0.0, 0.5, 2.0])),
)
case(
    "timeseries",
    "HiddenMarkovModel",
    "NaN in y",
    "y obs",
    lambda: hmm_model_trace(torch.tensor([0.0, NAN, 2.0])),
)
case("timeseries", "HiddenMarkovModel", "y a list", "y", lambda: hmm_model_trace([0, 1, 2]))
case(
    "timeseries",
    "HiddenMarkovModel",
    "num_states 0",
    "num_states",
    lambda: ts.HiddenMarkovModel(0, num_symbols=3),
)
case(
    "timeseries",
    "HiddenMarkovModel",
    "emission unknown",
    "emission",
    lambda: ts.HiddenMarkovModel(3, "bogus"),
)
case(
    "timeseries",
    "HiddenMarkovModel",
    "categorical without num_symbols",
    "num_symbols",
    lambda: ts.HiddenMarkovModel(3, "categorical"),
)
case(
    "timeseries",
    "HiddenMarkovModel",
    "transition_probs rows sum to 3",
    "transition_probs",
    lambda: ts.HiddenMarkovModel(3, num_symbols=3, transition_probs=torch.ones(3, 3)),
)
case(
    "timeseries",
    "HiddenMarkovModel",
    "init_probs wrong length",
    "init_probs",
    lambda: ts.HiddenMarkovModel(3, num_symbols=3, init_probs=torch.ones(4) / 4),
)
case(
    "timeseries",
    "HiddenMarkovModel",
    "transition_concentration 0",
    "transition_concentration",
    lambda: ts.HiddenMarkovModel(3, num_symbols=3, transition_concentration=0.0),
)
case(
    "timeseries",
    "HiddenMarkovModel",
    "backend unknown",
    "backend",
    lambda: ts.HiddenMarkovModel(3, num_symbols=3, backend="bogus"),
)
case(
    "timeseries",
    "HiddenMarkovDistribution",
    "observation batch 4 states for 3",
    "observation_dist",
    lambda: ts.HiddenMarkovDistribution(
        torch.zeros(3), torch.zeros(3, 3), dist.Normal(torch.zeros(4), 1.0)
    ),
)


def dlm(**kwargs):
    return ts.DLM(
        ts.LocalLevel(torch.tensor(0.3)), **{"observation_scale": torch.tensor(1.0), **kwargs}
    )


control("timeseries", "DLM.log_likelihood", lambda: dlm().log_likelihood(torch.randn(6)))
case(
    "timeseries",
    "DLM.log_likelihood",
    "inf in y at 3 (NaN marks a missing value)",
    "y",
    lambda: dlm().log_likelihood(with_nan(torch.randn(6), 3, INF)),
)
case(
    "timeseries", "DLM.log_likelihood", "y int", "y", lambda: dlm().log_likelihood(torch.arange(6))
)
case(
    "timeseries",
    "DLM.log_likelihood",
    "y (6, 2)",
    "y",
    lambda: dlm().log_likelihood(torch.randn(6, 2)),
)
case("timeseries", "DLM.log_likelihood", "y a list", "y", lambda: dlm().log_likelihood([0.1, 0.2]))
case(
    "timeseries", "DLM.log_likelihood", "empty y", "y", lambda: dlm().log_likelihood(torch.zeros(0))
)
case(
    "timeseries",
    "DLM.forecast",
    "num_steps -1",
    "num_steps",
    lambda: dlm().forecast(torch.randn(6), -1),
)
case(
    "timeseries",
    "DLM",
    "observation_scale negative",
    "observation_scale",
    lambda: dlm(observation_scale=torch.tensor(-1.0)),
)
case("timeseries", "DLM", "observation_df 0", "observation_df", lambda: dlm(observation_df=0.0))
case(
    "timeseries",
    "DLM",
    "components a string",
    "components",
    lambda: ts.DLM("level", torch.tensor(1.0)),
)
case("timeseries", "LocalLevel", "level_scale negative", "level_scale", lambda: ts.LocalLevel(-1.0))
case(
    "timeseries",
    "LocalLinearTrend",
    "slope_scale NaN",
    "slope_scale",
    lambda: ts.LocalLinearTrend(0.1, NAN),
)
case("timeseries", "Seasonal", "period 0", "period", lambda: ts.Seasonal(0, 0.1))
case("timeseries", "Seasonal", "form unknown", "form", lambda: ts.Seasonal(4, 0.1, form="bogus"))
case(
    "timeseries",
    "Seasonal",
    "harmonics 0",
    "harmonics",
    lambda: ts.Seasonal(12, 0.1, harmonics=0, form="cyclic"),
)
case(
    "timeseries", "Regression", "NaN in X", "X", lambda: ts.Regression(with_nan(torch.randn(6, 2)))
)
case("timeseries", "Regression", "X a list", "X", lambda: ts.Regression([[0.1, 0.2]]))
case(
    "timeseries",
    "DLM.log_likelihood",
    "Regression X of 5 rows for 6 steps",
    "X y",
    lambda: ts.DLM(ts.Regression(torch.randn(5, 2)), torch.tensor(1.0)).log_likelihood(
        torch.randn(6)
    ),
)
case("timeseries", "Autoregressive", "coefs a string", "coefs", lambda: ts.Autoregressive("a", 0.1))
case(
    "timeseries",
    "Autoregressive",
    "scale negative",
    "scale",
    lambda: ts.Autoregressive(torch.tensor([0.5]), -0.1),
)
case(
    "timeseries",
    "LinearGaussian",
    "G (2, 3)",
    "G",
    lambda: ts.LinearGaussian(
        torch.ones(2, 3), torch.ones(1, 2), torch.eye(2), torch.zeros(2), torch.eye(2)
    ),
)
case(
    "timeseries",
    "DLMDistribution",
    "num_steps 0",
    "num_steps",
    lambda: ts.DLMDistribution(dlm(), 0),
)
case(
    "timeseries",
    "DLMDistribution.log_prob",
    "value of 5 steps for 6",
    "value",
    lambda: ts.DLMDistribution(dlm(), 6).log_prob(torch.randn(5)),
)
case("timeseries", "dlm_observe", "y a string", "y", lambda: ts.dlm_observe("y", dlm(), "y"))
case(
    "timeseries",
    "dlm_observe",
    "name not a string",
    "name",
    lambda: ts.dlm_observe(3, dlm(), torch.randn(6)),
)

# -- pyro_ext.models ----------------------------------------------------------------------------


def retail(weeks=20):
    return models.simulate_retail(num_weeks=weeks, seed=0, noise="gaussian")


def bsts_fit(edit=None, **kwargs):
    d = retail()
    sales, spend, cov = d.sales, d.spend, d.covariates
    if edit is not None:
        sales, spend, cov = edit(sales.clone(), spend.clone(), cov.clone())
    m = models.RetailBSTS(variant="RF", noise="gaussian", seasonal_harmonics=1)
    options = {
        "num_samples": 1,
        "warmup_steps": 1,
        "num_particles": 1,
        "map_init_steps": 1,
        **kwargs,
    }
    return m.fit(sales, spend, cov, **options)


control("models", "RetailBSTS.fit", lambda: bsts_fit())
case(
    "models",
    "RetailBSTS.fit",
    "NaN in sales at 3",
    "sales",
    lambda: bsts_fit(lambda s, u, x: (with_nan(s), u, x)),
)
case(
    "models",
    "RetailBSTS.fit",
    "negative spend",
    "spend",
    lambda: bsts_fit(lambda s, u, x: (s, u.neg(), x)),
)
case(
    "models",
    "RetailBSTS.fit",
    "inf in spend",
    "spend",
    lambda: bsts_fit(lambda s, u, x: (s, with_nan(u, 1, INF), x)),
)
case(
    "models",
    "RetailBSTS.fit",
    "spend of 19 weeks for 20",
    "spend sales",
    lambda: bsts_fit(lambda s, u, x: (s, u[:-1], x)),
)
case(
    "models",
    "RetailBSTS.fit",
    "covariates of 19 weeks",
    "covariates sales",
    lambda: bsts_fit(lambda s, u, x: (s, u, x[:-1])),
)
case(
    "models",
    "RetailBSTS.fit",
    "sales 2-D (20, 1)",
    "sales",
    lambda: bsts_fit(lambda s, u, x: (s[:, None], u, x)),
)
case(
    "models",
    "RetailBSTS.fit",
    "sales a list",
    "sales",
    lambda: bsts_fit(lambda s, u, x: (s.tolist(), u, x)),
)
case(
    "models",
    "RetailBSTS.fit",
    "empty data",
    "sales",
    lambda: bsts_fit(lambda s, u, x: (s[:0], u[:0], x[:0])),
)
case("models", "RetailBSTS.fit", "method unknown", "method", lambda: bsts_fit(method="bogus"))
case("models", "RetailBSTS.fit", "num_samples 0", "num_samples", lambda: bsts_fit(num_samples=0))
case(
    "models",
    "RetailBSTS.fit",
    "num_particles 0",
    "num_particles",
    lambda: bsts_fit(num_particles=0),
)
case(
    "models",
    "RetailBSTS.fit",
    "channel_names wrong length",
    "channel_names",
    lambda: bsts_fit(channel_names=["a"]),
)
for _arg, _value in [
    ("variant", "bogus"),
    ("expected_model_size", -1),
    ("selection", "bogus"),
    ("noise", "bogus"),
    ("df", 0.0),
    ("spend_lag", -1),
    ("spend_lag", "weekly"),
    ("carryover", "bogus"),
    ("effects", "bogus"),
    ("delta_range", (1.0, 0.0)),
    ("trend", "bogus"),
    ("seasonal_period", 0.0),
    ("slab_scale", -1.0),
]:
    case(
        "models",
        "RetailBSTS",
        f"{_arg}={_value!r}",
        _arg,
        lambda a=_arg, v=_value: models.RetailBSTS(**{a: v}),
    )
case(
    "models",
    "simulate_retail",
    "num_weeks 0",
    "num_weeks",
    lambda: models.simulate_retail(num_weeks=0),
)
case(
    "models",
    "simulate_retail",
    "noise unknown",
    "noise",
    lambda: models.simulate_retail(num_weeks=20, noise="bogus"),
)
case(
    "models",
    "simulate_retail",
    "df negative",
    "df",
    lambda: models.simulate_retail(num_weeks=20, noise="student_t", df=-1.0),
)


def mlp_trace(net, x, y):
    return pyro.poutine.trace(net).get_trace(x, y).log_prob_sum()


control(
    "models", "BayesianMLP (model)", lambda: mlp_trace(models.BayesianMLP(2, hidden=(3,)), *xy())
)
case("models", "BayesianMLP", "in_features 0", "in_features", lambda: models.BayesianMLP(0))
case("models", "BayesianMLP", "hidden (0,)", "hidden", lambda: models.BayesianMLP(2, hidden=(0,)))
case(
    "models",
    "BayesianMLP",
    "likelihood unknown",
    "likelihood",
    lambda: models.BayesianMLP(2, likelihood="bogus"),
)
case(
    "models",
    "BayesianMLP",
    "prior_scale negative",
    "prior_scale",
    lambda: models.BayesianMLP(2, prior_scale=-1.0),
)
case(
    "models",
    "BayesianMLP",
    "activation unknown",
    "activation",
    lambda: models.BayesianMLP(2, activation="bogus"),
)
case(
    "models",
    "BayesianMLP (model)",
    "x 3 features for 2",
    "x in_features",
    lambda: mlp_trace(models.BayesianMLP(2, hidden=(3,)), torch.randn(6, 3), torch.randn(6)),
)
case(
    "models",
    "BayesianMLP (model)",
    "y of length 5 for 6",
    "y",
    lambda: mlp_trace(models.BayesianMLP(2, hidden=(3,)), torch.randn(6, 2), torch.randn(5)),
)
case(
    "models",
    "BayesianMLP (model)",
    "NaN in x",
    "x",
    lambda: mlp_trace(
        models.BayesianMLP(2, hidden=(3,)), with_nan(torch.randn(6, 2)), torch.randn(6)
    ),
)
case(
    "models",
    "BayesianMLP (model)",
    "Bernoulli y 2",
    "y obs",
    lambda: mlp_trace(
        models.BayesianMLP(2, hidden=(3,), likelihood="bernoulli"),
        torch.randn(3, 2),
        torch.tensor([0.0, 1.0, 2.0]),
    ),
)
case(
    "models",
    "BayesianMLP (model)",
    "category 3 of 3",
    "y obs",
    lambda: mlp_trace(
        models.BayesianMLP(2, hidden=(3,), out_features=3, likelihood="categorical"),
        torch.randn(3, 2),
        torch.tensor([0, 1, 3]),
    ),
)
case(
    "models",
    "BayesianMLP (model)",
    "subsample_size 10 > N 6",
    "subsample_size",
    lambda: pyro.poutine.trace(models.BayesianMLP(2, hidden=(3,))).get_trace(
        *xy(), subsample_size=10
    ),
)


def vae_trace(x, net=None):
    net = net or models.VAE(x_dim=4, z_dim=2, hidden=3)
    return pyro.poutine.trace(net.model).get_trace(x).log_prob_sum()


control("models", "VAE.model", lambda: vae_trace(torch.bernoulli(torch.full((3, 4), 0.5))))
case("models", "VAE.model", "pixel 2 (Bernoulli)", "x", lambda: vae_trace(torch.full((3, 4), 2.0)))
case("models", "VAE.model", "x 5 features for 4", "x x_dim", lambda: vae_trace(torch.zeros(3, 5)))
case("models", "VAE.model", "NaN in x", "x", lambda: vae_trace(with_nan(torch.zeros(3, 4))))
case("models", "VAE", "x_dim 0", "x_dim", lambda: models.VAE(x_dim=0))
case("models", "VAE", "z_dim -1", "z_dim", lambda: models.VAE(z_dim=-1))
case(
    "models",
    "VAE.log_likelihood",
    "num_samples 0",
    "num_samples",
    lambda: models.VAE(4, 2, 3).log_likelihood(torch.zeros(2, 4), num_samples=0),
)
case("models", "CVAE", "num_classes 0", "num_classes", lambda: models.CVAE(4, 2, 3, num_classes=0))
case(
    "models",
    "CVAE.model",
    "label 10 of 10",
    "y",
    lambda: (
        pyro.poutine.trace(models.CVAE(4, 2, 3).model)
        .get_trace(torch.zeros(2, 4), torch.tensor([0, 10]))
        .log_prob_sum()
    ),
)
case(
    "models",
    "expected_calibration_error",
    "probs 1.5",
    "probs",
    lambda: models.expected_calibration_error(torch.tensor([[0.2, 1.5]]), torch.tensor([1])),
)
case(
    "models",
    "expected_calibration_error",
    "labels of 2 for 1 row",
    "labels",
    lambda: models.expected_calibration_error(torch.tensor([[0.2, 0.8]]), torch.tensor([1, 0])),
)
case(
    "models",
    "expected_calibration_error",
    "num_bins 0",
    "num_bins",
    lambda: models.expected_calibration_error(
        torch.tensor([[0.2, 0.8]]), torch.tensor([1]), num_bins=0
    ),
)
case(
    "models",
    "expected_calibration_error",
    "label 5 of 2 classes",
    "labels",
    lambda: models.expected_calibration_error(torch.tensor([[0.2, 0.8]]), torch.tensor([5])),
)
case(
    "models",
    "importance_log_likelihood",
    "proposal_draws a string",
    "proposal_draws",
    lambda: models.importance_log_likelihood(lambda z: z.sum(-1), "draws"),
)
case(
    "models",
    "refined_mean_proposal",
    "step_size negative",
    "step_size",
    lambda: models.refined_mean_proposal(
        lambda z: -(z**2).sum(-1), torch.zeros(2), torch.ones(2), -0.1, 2
    ),
)
case(
    "models",
    "refined_mean_proposal",
    "num_steps -1",
    "num_steps",
    lambda: models.refined_mean_proposal(
        lambda z: -(z**2).sum(-1), torch.zeros(2), torch.ones(2), 0.1, -1
    ),
)
case(
    "models",
    "rmse",
    "chunk_size 0",
    "chunk_size",
    lambda: models.rmse(models.BayesianMLP(2, hidden=(3,)), {}, *xy(), chunk_size=0),
)


# More data cases of the models.
def _mlp():
    return models.BayesianMLP(2, hidden=(3,))


case(
    "models",
    "BayesianMLP (model)",
    "NaN in y",
    "y",
    lambda: mlp_trace(_mlp(), xy()[0], with_nan(xy()[1])),
)
case(
    "models",
    "BayesianMLP (model)",
    "int x",
    "x",
    lambda: mlp_trace(_mlp(), torch.ones(6, 2, dtype=torch.long), xy()[1]),
)
case(
    "models",
    "BayesianMLP (model)",
    "empty data",
    "x y",
    lambda: mlp_trace(_mlp(), torch.zeros(0, 2), torch.zeros(0)),
)
case(
    "models",
    "BayesianMLP (model)",
    "Bernoulli y 0.5",
    "y obs",
    lambda: mlp_trace(
        models.BayesianMLP(2, hidden=(3,), likelihood="bernoulli"),
        torch.randn(3, 2),
        torch.tensor([0.0, 0.5, 1.0]),
    ),
)
case("models", "VAE.model", "empty x", "x", lambda: vae_trace(torch.zeros(0, 4)))
case("models", "VAE.model", "pixel -1", "x", lambda: vae_trace(torch.full((3, 4), -1.0)))
case(
    "models",
    "RetailBSTS.fit",
    "NaN in covariates",
    "covariates",
    lambda: bsts_fit(lambda s, u, x: (s, u, with_nan(x, 2))),
)
case(
    "models",
    "RetailBSTS.fit",
    "NaN in spend",
    "spend",
    lambda: bsts_fit(lambda s, u, x: (s, with_nan(u, 2), x)),
)
case(
    "models",
    "RetailBSTS.fit",
    "inf in sales",
    "sales",
    lambda: bsts_fit(lambda s, u, x: (with_nan(s, 5, INF), u, x)),
)
case(
    "models",
    "RetailBSTS.fit",
    "spend 1-D",
    "spend",
    lambda: bsts_fit(lambda s, u, x: (s, u[:, 0], x)),
)

# -- pyro_ext.ara -------------------------------------------------------------------------------


def binary(n=6, d=4):
    return torch.bernoulli(torch.full((n, d), 0.5)), torch.tensor([0, 1] * (n // 2))


def nb():
    x, y = binary()
    return ara.BernoulliNaiveBayes().fit(x.double(), y)


control("ara", "BernoulliNaiveBayes.fit", lambda: nb())
case(
    "ara",
    "BernoulliNaiveBayes",
    "alpha negative",
    "alpha",
    lambda: ara.BernoulliNaiveBayes(alpha=-1.0),
)
case(
    "ara",
    "BernoulliNaiveBayes.fit",
    "x value 2",
    "x",
    lambda: ara.BernoulliNaiveBayes().fit(binary()[0] * 2, binary()[1]),
)
case(
    "ara",
    "BernoulliNaiveBayes.fit",
    "label 3",
    "y",
    lambda: ara.BernoulliNaiveBayes().fit(binary()[0], torch.tensor([0, 1, 3, 0, 1, 0])),
)
case(
    "ara",
    "BernoulliNaiveBayes.fit",
    "y of 5 for 6 rows",
    "y",
    lambda: ara.BernoulliNaiveBayes().fit(binary()[0], torch.tensor([0, 1, 1, 0, 1])),
)
case(
    "ara",
    "BernoulliNaiveBayes.fit",
    "NaN in x",
    "x",
    lambda: ara.BernoulliNaiveBayes().fit(with_nan(binary()[0]), binary()[1]),
)
case(
    "ara",
    "BernoulliNaiveBayes.fit",
    "x a list",
    "x",
    lambda: ara.BernoulliNaiveBayes().fit([[0, 1]], torch.tensor([0])),
)
case(
    "ara",
    "BernoulliNaiveBayes.predict",
    "x 5 features for 4",
    "x",
    lambda: nb().predict(torch.zeros(2, 5)),
)
case(
    "ara",
    "BernoulliNaiveBayes.fit",
    "empty data",
    "x y",
    lambda: ara.BernoulliNaiveBayes().fit(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long)),
)
control(
    "ara", "ACRA.predict", lambda: ara.ACRA(nb(), n=1, var=0.1).predict(binary()[0][:2].double())
)
case("ara", "ACRA", "n -1", "n", lambda: ara.ACRA(nb(), n=-1))
case("ara", "ACRA", "var negative", "var", lambda: ara.ACRA(nb(), var=-0.1))
case("ara", "ACRA", "num_mc 0", "num_mc", lambda: ara.ACRA(nb(), num_mc=0))
case("ara", "ACRA", "method unknown", "method", lambda: ara.ACRA(nb(), method="bogus"))
case("ara", "ACRA", "proba_tol 2", "proba_tol", lambda: ara.ACRA(nb(), proba_tol=2.0))
case(
    "ara", "ACRA", "generative_classifier a string", "generative_classifier", lambda: ara.ACRA("nb")
)
case(
    "ara",
    "ACRA.predict",
    "x 5 features for 4",
    "x_observed x",
    lambda: ara.ACRA(nb(), n=1, var=0.1).predict(torch.zeros(2, 5, dtype=torch.float64)),
)
case(
    "ara",
    "ACRA.predict",
    "x value 2",
    "x_observed x",
    lambda: ara.ACRA(nb(), n=1, var=0.1).predict(torch.full((2, 4), 2.0, dtype=torch.float64)),
)


def net2():
    torch.manual_seed(0)
    return torch.nn.Linear(2, 2)


def pts(n=4):
    return torch.rand(n, 2), torch.tensor([0, 1] * (n // 2))


control("ara", "fgsm", lambda: ara.fgsm(net2(), *pts(), eps=0.1))
case("ara", "fgsm", "eps negative", "eps", lambda: ara.fgsm(net2(), *pts(), eps=-0.1))
case("ara", "fgsm", "eps a string", "eps", lambda: ara.fgsm(net2(), *pts(), eps="0.1"))
case(
    "ara",
    "fgsm",
    "clip reversed",
    "clip",
    lambda: ara.fgsm(net2(), *pts(), eps=0.1, clip=(1.0, 0.0)),
)
case("ara", "fgsm", "loss unknown", "loss", lambda: ara.fgsm(net2(), *pts(), eps=0.1, loss="bogus"))
case(
    "ara",
    "fgsm",
    "y of 3 for 4",
    "y",
    lambda: ara.fgsm(net2(), pts()[0], torch.tensor([0, 1, 0]), eps=0.1),
)
case(
    "ara",
    "fgsm",
    "label 2 of 2 classes",
    "y",
    lambda: ara.fgsm(net2(), pts()[0], torch.tensor([0, 1, 2, 0]), eps=0.1),
)
case(
    "ara",
    "fgsm",
    "eot_samples 0",
    "eot_samples",
    lambda: ara.fgsm(net2(), *pts(), eps=0.1, eot_samples=0),
)
case(
    "ara", "fgsm", "NaN in x", "x", lambda: ara.fgsm(net2(), with_nan(pts()[0]), pts()[1], eps=0.1)
)
case(
    "ara",
    "pgd",
    "steps 0",
    "steps",
    lambda: ara.pgd(net2(), *pts(), eps=0.1, steps=0, step_size=0.01),
)
case(
    "ara",
    "pgd",
    "step_size negative",
    "step_size",
    lambda: ara.pgd(net2(), *pts(), eps=0.1, steps=1, step_size=-0.01),
)
case(
    "ara",
    "pgd",
    "norm unknown",
    "norm",
    lambda: ara.pgd(net2(), *pts(), eps=0.1, steps=1, step_size=0.01, norm="l3"),
)
case(
    "ara",
    "pgd",
    "restarts 0",
    "restarts",
    lambda: ara.pgd(net2(), *pts(), eps=0.1, steps=1, step_size=0.01, restarts=0),
)
case(
    "ara",
    "pgd",
    "l1_sparsity 1.5",
    "l1_sparsity",
    lambda: ara.pgd(net2(), *pts(), eps=0.1, steps=1, step_size=0.01, norm="l1", l1_sparsity=1.5),
)
case(
    "ara",
    "langevin_attack",
    "steps -1",
    "steps",
    lambda: ara.langevin_attack(net2(), *pts(), eps=torch.full((4,), 0.1), steps=-1),
)
case(
    "ara",
    "langevin_attack",
    "noise_scale negative",
    "noise_scale",
    lambda: ara.langevin_attack(
        net2(), *pts(), eps=torch.full((4,), 0.1), steps=1, noise_scale=-1.0
    ),
)
case(
    "ara",
    "project_l1_ball",
    "radius negative",
    "radius",
    lambda: ara.project_l1_ball(torch.randn(3, 4), -1.0),
)
case("ara", "project_l1_ball", "v a list", "v", lambda: ara.project_l1_ball([1.0, 2.0], 1.0))
case(
    "ara",
    "attack_loss",
    "loss unknown",
    "loss",
    lambda: ara.attack_loss(torch.randn(4, 2), pts()[1], loss="bogus"),
)
case(
    "ara",
    "attack_loss",
    "label 2 of 2 classes",
    "y",
    lambda: ara.attack_loss(torch.randn(4, 2), torch.tensor([0, 1, 2, 0])),
)
case("ara", "attack_candidates", "n -1", "n", lambda: ara.attack_candidates(binary()[0][0], -1))
case(
    "ara",
    "attack_candidates",
    "x value 2",
    "x",
    lambda: ara.attack_candidates(torch.full((4,), 2.0), 1),
)
case(
    "ara",
    "originating_instances",
    "n -1",
    "n",
    lambda: ara.originating_instances(binary()[0][0], -1),
)
case(
    "ara",
    "good_word_insertion",
    "n -1",
    "n",
    lambda: ara.good_word_insertion(binary()[0], nb().predict_proba, -1),
)
case(
    "ara",
    "word_deletion",
    "n -1",
    "n",
    lambda: ara.word_deletion(binary()[0], nb().predict_proba, -1),
)
case(
    "ara",
    "LangevinAttacker",
    "eps negative",
    "eps",
    lambda: ara.LangevinAttacker(net2(), *pts(), eps=-0.1),
)
case(
    "ara",
    "LangevinAttacker",
    "steps 0",
    "steps",
    lambda: ara.LangevinAttacker(net2(), *pts(), steps=0),
)
case(
    "ara",
    "LangevinAttacker",
    "norm unknown",
    "norm",
    lambda: ara.LangevinAttacker(net2(), *pts(), norm="l3"),
)
case(
    "ara",
    "LangevinAttacker",
    "y of 3 for 4",
    "y",
    lambda: ara.LangevinAttacker(net2(), pts()[0], torch.tensor([0, 1, 0])),
)
case(
    "ara",
    "RandomWordInsertionAttack",
    "n -1",
    "n",
    lambda: ara.RandomWordInsertionAttack(binary()[0], nb().predict_proba, n=-1),
)
case(
    "ara",
    "RandomWordInsertionAttack",
    "var negative",
    "var",
    lambda: ara.RandomWordInsertionAttack(binary()[0], nb().predict_proba, var=-0.1),
)
case(
    "ara",
    "RandomWordInsertionAttack",
    "x value 2",
    "x",
    lambda: ara.RandomWordInsertionAttack(binary()[0] * 2, nb().predict_proba),
)
case("ara", "AttackMixture", "attackers empty", "attackers", lambda: ara.AttackMixture([]))
case(
    "ara",
    "AttackMixture",
    "probs sum to 2",
    "probs",
    lambda: ara.AttackMixture(
        [ara.LangevinAttacker(net2(), *pts())] * 2, probs=torch.tensor([1.0, 1.0])
    ),
)
case(
    "ara",
    "check_attack_strength",
    "curves are tensors",
    "weak strong",
    lambda: ara.check_attack_strength(torch.tensor([0.5]), torch.tensor([0.4])),
)
case(
    "ara",
    "security_evaluation_curve",
    "epsilons empty",
    "epsilons",
    lambda: ara.security_evaluation_curve(net2(), lambda f, x, y, eps: x, [], *pts()),
)
case(
    "ara",
    "security_evaluation_curve",
    "num_repeats 0",
    "num_repeats",
    lambda: ara.security_evaluation_curve(
        net2(), lambda f, x, y, eps: x, [0.1], *pts(), num_repeats=0
    ),
)
case(
    "ara",
    "ARATrainer",
    "step_size negative",
    "step_size",
    lambda: ara.ARATrainer(net2(), step_size=-0.1),
)
case(
    "ara",
    "ARATrainer",
    "kernel unknown",
    "kernel",
    lambda: ara.ARATrainer(net2(), step_size=0.1, kernel="bogus"),
)
case(
    "ara",
    "ARATrainer",
    "num_particles 0",
    "num_particles",
    lambda: ara.ARATrainer(net2(), step_size=0.1, num_particles=0),
)
case(
    "ara",
    "ARATrainer",
    "batch_size 0",
    "batch_size",
    lambda: ara.ARATrainer(net2(), step_size=0.1, batch_size=0),
)
case(
    "ara",
    "ARATrainer",
    "clean_fraction 2",
    "clean_fraction",
    lambda: ara.ARATrainer(net2(), step_size=0.1, clean_fraction=2.0),
)
case(
    "ara",
    "AdversarialTrainer",
    "eps negative",
    "eps",
    lambda: ara.AdversarialTrainer(net2(), eps=-0.1),
)
case(
    "ara",
    "AdversarialTrainer",
    "norm unknown",
    "norm",
    lambda: ara.AdversarialTrainer(net2(), norm="l3"),
)
case(
    "ara",
    "AdversarialTrainer",
    "lr negative",
    "lr",
    lambda: ara.AdversarialTrainer(net2(), lr=-0.1),
)
case(
    "ara",
    "AdversarialTrainer.fit",
    "y of 3 for 4",
    "y",
    lambda: ara.AdversarialTrainer(net2(), steps=1).fit(pts()[0], torch.tensor([0, 1, 0])),
)
case(
    "ara",
    "AdversarialTrainer.fit",
    "epochs 0",
    "epochs",
    lambda: ara.AdversarialTrainer(net2(), steps=1).fit(*pts(), epochs=0),
)


# More data cases of the attacks and defences.
case(
    "ara",
    "ACRA.predict",
    "NaN in x",
    "x_observed x",
    lambda: ara.ACRA(nb(), n=1, var=0.1).predict(with_nan(binary()[0][:2].double(), 1)),
)
case(
    "ara",
    "fgsm",
    "int x",
    "x",
    lambda: ara.fgsm(net2(), torch.ones(4, 2, dtype=torch.long), pts()[1], eps=0.1),
)
case(
    "ara",
    "fgsm",
    "empty x",
    "x",
    lambda: ara.fgsm(net2(), torch.zeros(0, 2), torch.zeros(0, dtype=torch.long), eps=0.1),
)
case(
    "ara",
    "pgd",
    "float labels",
    "y",
    lambda: ara.pgd(
        net2(), pts()[0], torch.tensor([0.0, 1.0, 0.0, 1.0]), eps=0.1, steps=1, step_size=0.01
    ),
)
case(
    "ara",
    "AdversarialTrainer.fit",
    "NaN in x",
    "x",
    lambda: ara.AdversarialTrainer(net2(), steps=1).fit(with_nan(pts()[0]), pts()[1]),
)
case(
    "ara",
    "AdversarialTrainer.fit",
    "label 2 of 2 classes",
    "y",
    lambda: ara.AdversarialTrainer(net2(), steps=1).fit(pts()[0], torch.tensor([0, 1, 2, 0])),
)

# -- pyro_ext.rl --------------------------------------------------------------------------------


def play_one(agent=None, opponent=None, env=None, episodes=2):
    agent = agent if agent is not None else rl.QLearner(0.1, 0.1, 0.8)
    opponent = opponent if opponent is not None else rl.ExponentialSmootherAdversary(0.75)
    return rl.play(env if env is not None else rl.FriendOrFoe(), agent, opponent, episodes, 0)


control("rl", "play", lambda: play_one())
case("rl", "QLearner", "epsilon 2", "epsilon", lambda: play_one(rl.QLearner(2.0, 0.1, 0.8)))
case("rl", "QLearner", "lr negative", "lr", lambda: play_one(rl.QLearner(0.1, -0.1, 0.8)))
case("rl", "QLearner", "gamma 1.5", "gamma", lambda: play_one(rl.QLearner(0.1, 0.1, 1.5)))
case(
    "rl", "QLearner", "policy unknown", "policy", lambda: rl.QLearner(0.1, 0.1, 0.8, policy="bogus")
)
case(
    "rl",
    "QLearner",
    "temperature 0",
    "temperature",
    lambda: play_one(rl.QLearner(0.1, 0.1, 0.8, policy="softmax", temperature=0.0)),
)
case(
    "rl", "QLearner", "epsilon a string", "epsilon", lambda: play_one(rl.QLearner("0.1", 0.1, 0.8))
)
case(
    "rl",
    "FPQLearner",
    "forget 2",
    "forget",
    lambda: play_one(rl.FPQLearner(0.1, 0.1, 0.8, forget=2.0)),
)
case("rl", "LevelKQLearner", "k 0", "k", lambda: play_one(rl.LevelKQLearner(0, 0.1, 0.1, 0.8)))
case("rl", "play", "num_episodes -1", "num_episodes", lambda: play_one(episodes=-1))
case("rl", "play", "env a string", "env", lambda: play_one(env="FriendOrFoe"))
case("rl", "play", "opponent None-like string", "opponent", lambda: play_one(opponent="adv"))
case(
    "rl",
    "play_many",
    "num_runs 0",
    "num_runs",
    lambda: rl.play_many(
        rl.FriendOrFoe(),
        lambda: rl.QLearner(0.1, 0.1, 0.8),
        lambda: rl.ExponentialSmootherAdversary(0.75),
        2,
        0,
        0,
    ),
)
case(
    "rl",
    "FriendOrFoe",
    "payoff a string",
    "payoff",
    lambda: play_one(env=rl.FriendOrFoe(payoff="50")),
)
case("rl", "CoinGame", "size 0", "size", lambda: rl.CoinGame(size=0))
case("rl", "Blotto", "num_positions 0", "num_positions", lambda: rl.Blotto(num_positions=0))
case("rl", "DataSharingGame", "horizon 0", "horizon", lambda: rl.DataSharingGame(horizon=0))
case("rl", "SpatialFriendOrFoe", "horizon -1", "horizon", lambda: rl.SpatialFriendOrFoe(horizon=-1))
case(
    "rl",
    "ExponentialSmootherAdversary",
    "beta 2",
    "beta",
    lambda: play_one(opponent=rl.ExponentialSmootherAdversary(2.0)),
)
case(
    "rl",
    "FixedPolicyOpponent",
    "probs sum to 2",
    "probs",
    lambda: play_one(opponent=rl.FixedPolicyOpponent(torch.tensor([1.0, 1.0]))),
)
case(
    "rl",
    "FixedPolicyOpponent",
    "probs 3 actions for 2",
    "probs num_actions",
    lambda: play_one(opponent=rl.FixedPolicyOpponent(torch.tensor([0.2, 0.3, 0.5]))),
)
case("rl", "TitForTat", "forgive 2", "forgive", lambda: rl.TitForTat(forgive=2.0))
case(
    "rl",
    "DirichletOpponentModel",
    "prior negative",
    "prior",
    lambda: rl.DirichletOpponentModel(prior=-1.0),
)
case(
    "rl",
    "CategoricalTaxPolicy",
    "rates empty",
    "rates",
    lambda: rl.CategoricalTaxPolicy(0.1, rates=()),
)
case(
    "rl",
    "GaussianTaxPolicy",
    "scale negative",
    "scale",
    lambda: rl.GaussianTaxPolicy(0.1, scale=-1.0),
)
case(
    "rl", "PolicyGradientAgent", "lr negative", "lr", lambda: play_one(rl.PolicyGradientAgent(-0.1))
)
case(
    "rl",
    "epsilon_greedy_probs",
    "epsilon 2",
    "epsilon",
    lambda: rl.epsilon_greedy_probs(torch.zeros(3, 2), 2.0),
)
case(
    "rl",
    "softmax_probs",
    "temperature 0",
    "temperature",
    lambda: rl.softmax_probs(torch.zeros(3, 2), 0.0),
)
case(
    "rl",
    "policy_probs",
    "policy unknown",
    "policy",
    lambda: rl.policy_probs(torch.zeros(3, 2), "bogus", 0.1, 1.0),
)
case(
    "rl",
    "q_update",
    "state 5 of 3",
    "state",
    lambda: rl.q_update(
        torch.zeros(1, 3, 2),
        torch.tensor([5]),
        torch.tensor([0]),
        torch.tensor([1.0]),
        torch.tensor([0]),
        0.1,
        0.9,
    ),
)
case(
    "rl",
    "q_update",
    "lr negative",
    "lr",
    lambda: rl.q_update(
        torch.zeros(1, 3, 2),
        torch.tensor([0]),
        torch.tensor([0]),
        torch.tensor([1.0]),
        torch.tensor([0]),
        -0.1,
        0.9,
    ),
)
case(
    "rl",
    "sample",
    "probs negative",
    "probs",
    lambda: rl.sample(torch.tensor([[-0.5, 1.5]]), torch.Generator()),
)
case(
    "rl",
    "dirichlet_forget_update",
    "forget 2",
    "forget",
    lambda: rl.dirichlet_forget_update(torch.ones(2, 2), torch.tensor([0, 1]), forget=2.0),
)
case(
    "rl",
    "expected_q",
    "opponent_probs 3 for 2",
    "opponent_probs",
    lambda: rl.expected_q(torch.zeros(1, 2, 2), torch.ones(1, 3) / 3),
)
case(
    "rl",
    "gaussian_score",
    "scale negative",
    "scale",
    lambda: rl.gaussian_score(torch.tensor(0.1), torch.tensor(0.0), -1.0),
)
case(
    "rl",
    "Regulator",
    "incentive_rounds -1",
    "incentive_rounds",
    lambda: rl.Regulator(incentive_rounds=-1),
)

# -- pyro_ext.datasets --------------------------------------------------------------------------

case("datasets", "load_uci", "unknown name", "name", lambda: datasets.load_uci("nope"))
case(
    "datasets",
    "load_uci",
    "split -1",
    "split",
    lambda: datasets.load_uci("bostonHousing", split=-1),
)
case(
    "datasets",
    "load_uci",
    "split 10**6",
    "split",
    lambda: datasets.load_uci("bostonHousing", split=10**6),
)
case(
    "datasets",
    "load_uci",
    "split a string",
    "split",
    lambda: datasets.load_uci("bostonHousing", split="0"),
)
case(
    "datasets",
    "load_uci",
    "dtype a string",
    "dtype",
    lambda: datasets.load_uci("bostonHousing", dtype="float"),
)
case("datasets", "uci_num_splits", "unknown name", "name", lambda: datasets.uci_num_splits("nope"))
case("datasets", "load_mnist", "split unknown", "split", lambda: datasets.load_mnist(split="bogus"))
case(
    "datasets",
    "load_fashion_mnist_labels",
    "split unknown",
    "split",
    lambda: datasets.load_fashion_mnist_labels(split="bogus"),
)
case("datasets", "load_co2", "source unknown", "source", lambda: datasets.load_co2(source="bogus"))
case(
    "datasets",
    "load_marketing_mix",
    "name unknown",
    "name",
    lambda: datasets.load_marketing_mix(name="bogus"),
)
case(
    "datasets",
    "load_prophet_holidays",
    "country a number",
    "country",
    lambda: datasets.load_prophet_holidays(country=5),
)
case(
    "datasets",
    "get_data_path",
    "relative_path None",
    "relative_path",
    lambda: datasets.get_data_path(None),
)
case(
    "datasets",
    "standardize_split",
    "split a string",
    "split",
    lambda: datasets.standardize_split("split"),
)
case("datasets", "load_nile", "dtype int", "dtype", lambda: datasets.load_nile(dtype=torch.long))

# -- pyro_ext.ops -------------------------------------------------------------------------------

case(
    "ops", "split_rhat", "one draw per chain", "samples", lambda: ops.split_rhat(torch.randn(2, 1))
)
case(
    "ops",
    "split_rhat",
    "NaN in samples",
    "samples",
    lambda: ops.split_rhat(with_nan(torch.randn(2, 10))),
)
case(
    "ops",
    "split_rhat",
    "chain_dim 5",
    "chain_dim",
    lambda: ops.split_rhat(torch.randn(2, 10), chain_dim=5),
)
case(
    "ops",
    "split_rhat",
    "samples a list",
    "samples",
    lambda: ops.split_rhat([[0.1, 0.2], [0.3, 0.4]]),
)
case(
    "ops",
    "sbc_ranks",
    "truth shape (3,) for draws (10, 2)",
    "truth draws",
    lambda: ops.sbc_ranks(torch.zeros(3), torch.randn(10, 2)),
)
case(
    "ops",
    "rank_uniformity_test",
    "num_draws 0",
    "num_draws",
    lambda: ops.rank_uniformity_test(torch.tensor([0, 1, 2]), 0),
)
case(
    "ops",
    "rank_uniformity_test",
    "rank above num_draws",
    "ranks",
    lambda: ops.rank_uniformity_test(torch.tensor([0, 1, 12]), 10),
)
case(
    "ops",
    "rank_uniformity_test",
    "num_bins 0",
    "num_bins",
    lambda: ops.rank_uniformity_test(torch.tensor([0, 1, 2]), 10, num_bins=0),
)
case(
    "ops",
    "hessian_diagonal",
    "fn not callable",
    "fn",
    lambda: ops.hessian_diagonal("f", torch.zeros(2, 3)),
)
case(
    "ops",
    "hessian_diagonal",
    "chunk_size 0",
    "chunk_size",
    lambda: ops.hessian_diagonal(lambda p: (p**2).sum(-1), torch.zeros(2, 3), chunk_size=0),
)
case(
    "ops",
    "hessian_diagonal",
    "int points",
    "points",
    lambda: ops.hessian_diagonal(lambda p: (p**2).sum(-1), torch.zeros(2, 3, dtype=torch.long)),
)
case(
    "ops",
    "kernel_stein_discrepancy",
    "score shape (4, 3) for (4, 2)",
    "score samples",
    lambda: ops.kernel_stein_discrepancy(torch.randn(4, 2), torch.randn(4, 3)),
)
case(
    "ops",
    "kernel_stein_discrepancy",
    "c negative",
    "c",
    lambda: ops.kernel_stein_discrepancy(torch.randn(4, 2), torch.randn(4, 2), c=-1.0),
)
case(
    "ops",
    "kernel_stein_discrepancy",
    "beta positive",
    "beta",
    lambda: ops.kernel_stein_discrepancy(torch.randn(4, 2), torch.randn(4, 2), beta=0.5),
)
case(
    "ops",
    "kernel_stein_discrepancy",
    "empty samples",
    "samples",
    lambda: ops.kernel_stein_discrepancy(torch.zeros(0, 2), torch.zeros(0, 2)),
)
case(
    "ops",
    "associative_scan",
    "combine not callable",
    "combine",
    lambda: ops.associative_scan("add", (torch.arange(4.0),)),
)
case(
    "ops",
    "vector_scan",
    "matrices (4, 3, 3) for vector (2,)",
    "matrices vector",
    lambda: ops.vector_scan(
        (torch.zeros(2),),
        (torch.eye(3).expand(4, 3, 3),),
        lambda v, m: (torch.einsum("ni,nij->nj", v[0], m[0]),),
        lambda a, b: (a[0] @ b[0],),
    ),
)


# -- running the cases --------------------------------------------------------------------------


def _worker(index, conn):
    """Run case ``index`` in this forked process and send back (kind, type, message)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    torch.set_num_threads(1)
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = CASES[index].fn()
        except BaseException as error:  # noqa: BLE001 -- classify every failure
            kinds = [k for k, t in _KINDS.items() if isinstance(error, t)]
            kinds += [t.__name__ for t in type(error).__mro__ if t.__name__ in CASES[index].errors]
            message = str(error).strip() or repr(error)
            if not str(error).strip():
                message = "".join(traceback.format_exception_only(error)).strip()
            conn.send(("raised", type(error).__name__, kinds, message))
            return
    what = type(result).__name__
    if caught:
        what += f"; warned: {caught[0].category.__name__}: {caught[0].message}"
    conn.send(("returned", what, [], ""))


_KINDS = {
    "TypeError": TypeError,
    "ValueError": ValueError,
    "DivergenceError": infer.DivergenceError,
}


def classify(case_, outcome):
    """The class of a case from its worker's outcome (None: ran past the timeout)."""
    if outcome is None:
        return ("broken" if case_.control else "hang"), "timed out"
    status, type_name, kinds, message = outcome
    first = message.splitlines()[0] if message else ""
    if status == "returned":
        return ("ok" if case_.control else "silent"), f"returned {type_name}"
    if case_.control:
        return "broken", f"{type_name}: {first}"
    names = any(re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)", message) for n in case_.names)
    leak = first.startswith(LEAKS)
    return ("clear" if kinds and names and not leak else "cryptic"), f"{type_name}: {first}"


def run_cases(indices, timeout, jobs):
    """Run the cases, ``jobs`` forked workers at a time; returns {index: (class, message)}."""
    ctx = multiprocessing.get_context("fork")
    pending, running, results = list(indices), {}, {}
    while pending or running:
        while pending and len(running) < jobs:
            index = pending.pop(0)
            receive, send = ctx.Pipe(duplex=False)
            process = ctx.Process(target=_worker, args=(index, send), daemon=True)
            process.start()
            send.close()
            running[index] = (process, receive, time.monotonic())
        time.sleep(0.01)
        for index, (process, receive, started) in list(running.items()):
            outcome, done = None, False
            if receive.poll():
                try:
                    outcome = receive.recv()
                except EOFError:
                    outcome = ("raised", "WorkerDied", [], "the worker exited without a result")
                done = True
            elif not process.is_alive():
                code = process.exitcode
                outcome = ("raised", "WorkerDied", [], f"the worker exited with code {code}")
                done = True
            elif time.monotonic() - started > timeout:
                process.kill()
                done = True
            if done:
                process.join(1)
                if process.is_alive():
                    process.kill()
                receive.close()
                del running[index]
                results[index] = classify(CASES[index], outcome)
    return results


def read_before(path):
    """{(module, entry, case): class} from an earlier report of this script."""
    before = {}
    for line in Path(path).read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[3] in CLASSES + ("ok", "broken"):
            before[tuple(cells[:3])] = cells[3]
    return before


def cell(text, width=100):
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= width else text[: width - 1] + "…"


def main():
    parser = argument_parser(__doc__, RESULTS, quick="one case in five (and every control)")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per case (default 20)")
    parser.add_argument("--jobs", type=int, default=2, help="cases run at a time (default 2)")
    parser.add_argument("--before", type=Path, help="an earlier report: its classes as a column")
    parser.add_argument("--match", help="run only the cases whose module/entry/case has this text")
    args = parser.parse_args()
    torch.set_num_threads(1)

    indices = list(range(len(CASES)))
    if args.quick:
        indices = [i for i in indices if CASES[i].control or i % 5 == 0]
    if args.match:
        indices = [i for i in indices if args.match in " ".join(CASES[i][:3])]
    start = time.perf_counter()
    results = run_cases(indices, args.timeout, args.jobs)
    seconds = time.perf_counter() - start
    before = read_before(args.before) if args.before else None

    header = ["module", "entry point", "case", "class"]
    header += ["before"] if before is not None else []
    header += ["message (first line)"]
    rows, controls = [], []
    for index in indices:
        c = CASES[index]
        klass, message = results[index]
        row = [c.module, cell(c.entry, 40), cell(c.case, 50), klass]
        row += [before.get((row[0], row[1], row[2]), "—")] if before is not None else []
        row += [cell(message)]
        (controls if c.control else rows).append(row)

    modules = sorted({r[0] for r in rows}, key=[c.module for c in CASES].index)
    counts = {m: Counter(r[3] for r in rows if r[0] == m) for m in modules}
    total = Counter(r[3] for r in rows)
    summary_header = ["module", "cases", *CLASSES]
    summary = [[m, sum(counts[m].values()), *(counts[m][k] for k in CLASSES)] for m in modules]
    summary.append(["**all**", len(rows), *(total[k] for k in CLASSES)])
    sections = ["## Counts per class\n\n" + markdown(summary_header, summary)]
    if before is not None:
        old = {}
        for r in rows:
            old.setdefault(r[0], Counter())[r[4]] += 1
        old_total = Counter(r[4] for r in rows)
        before_rows = [[m, *(old.get(m, Counter())[k] for k in CLASSES)] for m in modules]
        before_rows.append(["**all**", *(old_total[k] for k in CLASSES)])
        sections.append(
            "## Counts per class before (`--before`)\n\n"
            + markdown(["module", *CLASSES], before_rows)
        )
    broken = [r for r in controls if r[3] != "ok"]
    sections.append(
        f"## Controls (good input): {len(controls) - len(broken)} of {len(controls)} ran\n\n"
        "A control that fails makes the verdicts of its entry point's cases suspect.\n\n"
        + markdown(header, controls)
    )
    sections.append("## Every case\n\n" + markdown(header, rows))
    preamble = (
        "# Bad-input probe (issue 32)\n\n"
        f"Generated by `{' '.join(['python benchmarks/bad_input_probe.py', command_line_args()]).strip()}` "
        f"against `{Path(pyro_ext.__file__).parent}` (torch {torch.__version__}, "
        f"pyro {pyro.__version__}): {len(rows)} cases and {len(controls)} controls, "
        f"{args.jobs} forked workers at a time, {args.timeout:g} s timeout each, "
        f"{seconds:.0f} s in all.\n\n"
        "**clear**: a TypeError / ValueError (or a DivergenceError) naming the argument or site; "
        "**cryptic**: another exception, one that names none of them, or Pyro's / torch's own "
        "validation error (`Error while computing log_prob_sum at site ...`, `Expected "
        "parameter ...`); **silent**: no "
        "exception; **hang**: past the timeout."
    )
    write_report(preamble, sections, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
