"""The traced and compiled SG-MCMC step (``jit_compile=True`` / ``"trace"``).

Ground truth is the eager kernel: for the same seed the compiled chain must be the eager
chain up to float32 round-off, including the paths where a compiled step is rejected and
redone eagerly.
"""

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch._dynamo
from pyro.ops.streaming import CountMeanVarianceStats, StatsOfDict

from pyro_ext.infer import (
    MCMC,
    SGHMC,
    SGLD,
    AdamSGLD,
    ModelNotTraceableError,
    PolynomialDecay,
    SamplerDivergenceError,
)
from pyro_ext.infer.sgmcmc import compiled as compiled_module
from pyro_ext.infer.sgmcmc.repulsion import Coupling, coupled_noise

KERNELS = {
    "sgld": lambda model, **kw: SGLD(model, 2e-3, **kw),
    "sghmc": lambda model, **kw: SGHMC(model, 1e-3, friction=0.2, **kw),
    "adam": lambda model, **kw: AdamSGLD(model, 1e-3, **kw),
}


def logistic_model(x, y):
    w = pyro.sample("w", dist.Normal(x.new_zeros(x.shape[1]), 1.0).to_event(1))
    scale = pyro.sample("scale", dist.LogNormal(x.new_zeros(()), 1.0))
    with pyro.plate("data", x.shape[0], subsample_size=50) as idx:
        pyro.sample("y", dist.Bernoulli(logits=(x[idx] @ w) / scale), obs=y[idx])


def logistic_data(device, n=300):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=generator)
    y = torch.bernoulli(torch.sigmoid(x @ torch.tensor([1.0, -2.0, 0.5])), generator=generator)
    return x.to(device), y.to(device)


def draws(kernel, *args, seed=0, num_samples=70, warmup_steps=30, **mcmc_kwargs):
    pyro.set_rng_seed(seed)
    mcmc = MCMC(
        kernel,
        num_samples=num_samples,
        warmup_steps=warmup_steps,
        disable_progbar=True,
        **mcmc_kwargs,
    )
    mcmc.run(*args)
    return mcmc


def assert_same_chain(eager, compiled, atol=1e-5):
    a, b = eager.get_samples(group_by_chain=True), compiled.get_samples(group_by_chain=True)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].shape == b[name].shape
        torch.testing.assert_close(b[name], a[name], atol=atol, rtol=1e-4)


@pytest.mark.parametrize("sampler", sorted(KERNELS))
@pytest.mark.parametrize("num_particles, repulsion", [(1, None), (4, None), (4, "rbf")])
def test_traced_step_gives_the_eager_chain(sampler, num_particles, repulsion):
    x, y = logistic_data("cpu")
    make = KERNELS[sampler]
    eager = draws(make(logistic_model, num_particles=num_particles, repulsion=repulsion), x, y)
    kernel = make(
        logistic_model, num_particles=num_particles, repulsion=repulsion, jit_compile="trace"
    )
    traced = draws(kernel, x, y)
    assert kernel.compiled_step.num_traces == 1
    assert_same_chain(eager, traced)


@pytest.mark.parametrize("sampler", ["sgld", "adam"])
def test_compiled_step_gives_the_eager_chain_on_every_device(device, sampler):
    """torch.compile (CUDA: mode="reduce-overhead", one CUDA graph per step) over 100 steps."""
    x, y = logistic_data(device)
    make = KERNELS[sampler]
    eager = draws(make(logistic_model, num_particles=4, repulsion="rbf"), x, y)
    kernel = make(logistic_model, num_particles=4, repulsion="rbf", jit_compile=True)
    compiled = draws(kernel, x, y)
    assert kernel.compile_seconds > 0
    assert_same_chain(eager, compiled, atol=1e-4)
    assert compiled.get_samples()["w"].device.type == device.type


def test_a_thousand_steps_compile_once():
    """A decaying step size and Adam's switch from adapting to frozen enter as tensors."""
    x, y = logistic_data("cpu")
    kernel = AdamSGLD(
        logistic_model, PolynomialDecay(1e-3, 10.0, 0.55), num_particles=2, jit_compile=True
    )
    torch._dynamo.utils.counters.clear()
    mcmc = draws(kernel, x, y, num_samples=900, warmup_steps=100)
    # One compilation in all (inductor compiles through AOT autograd, which counts them).
    assert torch._dynamo.utils.counters["aot_autograd"]["total"] == 1
    assert kernel.compiled_step.num_traces == 1
    assert torch.isfinite(mcmc.get_samples()["w"]).all()


def test_a_rejected_compiled_step_is_redone_eagerly(monkeypatch):
    """A step the compiled function flags (non-finite, or a failed factorisation) is redone
    eagerly from the same inputs, so the chain stays the eager one."""
    x, y = logistic_data("cpu")
    eager = draws(SGLD(logistic_model, 2e-3, num_particles=4, repulsion="rbf"), x, y)
    original = compiled_module.CompiledStep.__call__
    calls = []

    def flaky(self, *args, **kwargs):
        output = original(self, *args, **kwargs)
        calls.append(1)
        if len(calls) % 7 == 3:
            return output._replace(ok=torch.tensor(False))
        return output

    monkeypatch.setattr(compiled_module.CompiledStep, "__call__", flaky)
    kernel = SGLD(logistic_model, 2e-3, num_particles=4, repulsion="rbf", jit_compile="trace")
    assert_same_chain(eager, draws(kernel, x, y))


def test_single_try_factorisation_reports_failure_as_nan():
    # Eigenvalues 2.001 and -0.001: the first jitters fail, 1e-2 succeeds.
    matrix = torch.tensor([[1.0, 1.001], [1.001, 1.0]])
    noise = torch.randn(2, 3)
    coupling = Coupling(matrix, torch.zeros(2, 3))
    assert torch.isfinite(coupled_noise(coupling, noise)).all()
    assert torch.isnan(coupled_noise(coupling._replace(cholesky_tries=1), noise)).all()


class Interrupt(Exception):
    """A simulated crash in the middle of the sampling stage."""


def stiff_model():
    pyro.sample("stiff", dist.Normal(torch.zeros(2), 1e-3).to_event(1))


@pytest.mark.parametrize("jit_compile", ["trace", True])
def test_divergence_names_the_same_step_and_keeps_the_draws(jit_compile):
    errors, kept = [], []
    for compiled in (False, jit_compile):
        pyro.set_rng_seed(1)
        kernel = SGLD(stiff_model, 0.05, num_particles=3, jit_compile=compiled)
        mcmc = MCMC(kernel, num_samples=200, warmup_steps=0, disable_progbar=True)
        with pytest.raises(SamplerDivergenceError, match="'stiff'") as error:
            mcmc.run()
        errors.append(error.value)
        kept.append(mcmc.get_samples(group_by_chain=True)["stiff"])
    assert errors[0].step == errors[1].step
    assert errors[0].sites == errors[1].sites == ["stiff"]
    assert kept[0].shape == kept[1].shape and kept[1].shape[1] == errors[1].step
    torch.testing.assert_close(kept[1], kept[0], atol=1e-5, rtol=1e-4)


def test_checkpoint_resume_and_storage_options_under_jit(tmp_path):
    x, y = logistic_data("cpu")
    stats = lambda: StatsOfDict(default=CountMeanVarianceStats)  # noqa: E731
    options = dict(thinning=2, draws_device="cpu")
    reference = draws(
        SGHMC(logistic_model, 1e-3, num_particles=3, jit_compile="trace"), x, y, **options
    )

    def crash(kernel, params, stage, index):
        if stage == "Sample" and index == 41:
            raise Interrupt

    path = str(tmp_path / "run.ckpt")
    with pytest.raises(Interrupt):
        draws(
            SGHMC(logistic_model, 1e-3, num_particles=3, jit_compile="trace"),
            x,
            y,
            checkpoint_path=path,
            checkpoint_every=10,
            hook_fn=crash,
            **options,
        )
    resumed = MCMC(
        SGHMC(logistic_model, 1e-3, num_particles=3, jit_compile="trace"),
        num_samples=70,
        warmup_steps=30,
        disable_progbar=True,
        checkpoint_path=path,
        **options,
    )
    resumed.resume(x, y)
    for name, value in reference.get_samples(group_by_chain=True).items():
        assert value.shape[1] == 70
        assert torch.equal(resumed.get_samples(group_by_chain=True)[name], value)

    streamed = draws(
        SGHMC(logistic_model, 1e-3, num_particles=3, jit_compile="trace"),
        x,
        y,
        statistics=stats(),
        **options,
    )
    mean = streamed.get_statistics(group_by_chain=False)["w"]["mean"]
    torch.testing.assert_close(mean, reference.get_samples()["w"].mean(0), atol=1e-5, rtol=1e-4)


def test_plain_pyro_mcmc_runs_the_compiled_kernel():
    x, y = logistic_data("cpu")
    kernel = SGLD(logistic_model, 2e-3, jit_compile="trace")
    mcmc = pyro.infer.MCMC(kernel, num_samples=30, warmup_steps=10, disable_progbar=True)
    mcmc.run(x, y)
    assert mcmc.get_samples()["w"].shape == (30, 3)
    assert kernel.compiled_step.num_traces == 1


def test_new_data_of_the_same_shape_reuses_the_step():
    x, y = logistic_data("cpu")
    kernel = SGLD(logistic_model, 2e-3, num_particles=2, jit_compile="trace")
    kernel.setup(0, x, y)
    params = kernel.sample(kernel.initial_params)
    kernel.set_data(x.flip(0), y.flip(0))
    params = kernel.sample(params)
    assert kernel.compiled_step.num_traces == 1
    kernel.set_data(x[:200], y[:200])  # one more shape (e.g. a last batch): traced once more
    params = kernel.sample(params)
    assert kernel.compiled_step.num_traces == 2
    with pytest.warns(RuntimeWarning, match="changed shape"):
        kernel.set_data(x[:100], y[:100])
        kernel.sample(params)
    # ... and the step on new data is the eager step on that data.
    eager = SGLD(logistic_model, 2e-3, num_particles=2)
    eager.setup(0, x[:100], y[:100])
    pyro.set_rng_seed(3)
    before = kernel.state_dict()
    traced = kernel.sample(kernel.initial_params)["w"]
    pyro.set_rng_seed(3)
    eager.load_state_dict(before)
    torch.testing.assert_close(eager.state.z, before["state"]["z"])
    torch.testing.assert_close(eager.sample(eager.initial_params)["w"], traced)


def test_set_data_needs_setup():
    with pytest.raises(RuntimeError, match="setup"):
        SGLD(logistic_model, 1e-3).set_data(torch.zeros(3, 3), torch.zeros(3))


def test_a_model_that_branches_on_a_latent_value_cannot_be_traced():
    def branching(x):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        loc = w if w > 0 else -w
        pyro.sample("x", dist.Normal(loc, 1.0), obs=x)

    kernel = SGLD(branching, 1e-2, jit_compile="trace")
    with pytest.raises(ModelNotTraceableError, match="jit_compile=False"):
        draws(kernel, torch.tensor(0.5), num_samples=2, warmup_steps=0)


def test_a_model_that_reads_its_data_as_a_number_is_told_how_to_pass_it():
    x = torch.randn(20) + 1.0

    def reads_data(x):
        loc = pyro.sample("loc", dist.Normal(0.0, 10.0))
        with pyro.plate("data", len(x)):
            pyro.sample("x", dist.Normal(loc, float(x.std())), obs=x)

    with pytest.raises(ModelNotTraceableError, match="pass them as Python numbers"):
        draws(SGLD(reads_data, 1e-2, jit_compile="trace"), x, num_samples=2, warmup_steps=0)

    def takes_number(x, scale):
        loc = pyro.sample("loc", dist.Normal(0.0, 10.0))
        with pyro.plate("data", len(x)):
            pyro.sample("x", dist.Normal(loc, scale), obs=x)

    eager = draws(SGLD(takes_number, 1e-2, num_particles=3), x, float(x.std()))
    kernel = SGLD(takes_number, 1e-2, num_particles=3, jit_compile="trace")
    assert_same_chain(eager, draws(kernel, x, float(x.std())))
    kernel.set_data(x, 2.0)  # a new constant: traced again, once
    kernel.sample(kernel.initial_params)
    assert kernel.compiled_step.num_traces == 2


def test_a_plate_vectorised_model_with_boolean_masks_traces():
    counts = torch.tensor([3.0, 10.0, 7.0])

    def multinomial(counts):  # Multinomial.log_prob masks by boolean index: vmap cannot
        probs = pyro.sample("probs", dist.Dirichlet(torch.ones(3)))
        with pyro.plate("rep", 2):
            pyro.sample("obs", dist.Multinomial(20, probs), obs=counts)

    eager = draws(SGLD(multinomial, 1e-2, num_particles=3, vectorize="plate"), counts)
    kernel = SGLD(multinomial, 1e-2, num_particles=3, vectorize="plate", jit_compile="trace")
    assert_same_chain(eager, draws(kernel, counts))


def test_bad_jit_arguments_are_named():
    with pytest.raises(ValueError, match="jit_compile must be"):
        SGLD(logistic_model, 1e-3, jit_compile="fast")
    with pytest.raises(TypeError, match="jit_compile must be"):
        SGLD(logistic_model, 1e-3, jit_compile=1.0)
    with pytest.raises(ValueError, match="compile_mode must be one of 'default'.* or None"):
        SGLD(logistic_model, 1e-3, jit_compile=True, compile_mode="fastest")
    with pytest.raises(TypeError, match="compile_mode must be a string"):
        SGLD(logistic_model, 1e-3, jit_compile=True, compile_mode=1)
    with pytest.raises(ValueError, match="needs jit_compile=True"):
        SGLD(logistic_model, 1e-3, compile_mode="reduce-overhead")
    with pytest.raises(TypeError, match="num_particles"):
        SGLD(logistic_model, 1e-3, num_particles="4")
    with pytest.raises(ValueError, match="vectorize"):
        SGLD(logistic_model, 1e-3, vectorize="loop")


def test_a_kernel_with_a_python_level_update_refuses_to_compile():
    class Custom(SGLD):
        def _update(self, state, grad, step_size, noise, coupling, adapt):
            return super()._update(state, grad, step_size, noise, coupling, adapt)

    with pytest.raises(ValueError, match="jit_compile=False"):
        Custom(logistic_model, 1e-3, jit_compile=True).setup(0, *logistic_data("cpu"))


# -- deferred finiteness checks (the accelerator default, forced here on the CPU) -----------
def poison_compiled_calls(monkeypatch, calls_to_poison):
    """Make the given compiled calls return NaN particles flagged as not finite, once each."""
    original = compiled_module.CompiledStep.__call__
    count = [0]

    def poisoned(self, *args, **kwargs):
        output = original(self, *args, **kwargs)
        count[0] += 1
        if count[0] in calls_to_poison:
            state = type(output.state)(
                *(t * float("nan") if t.is_floating_point() else t for t in output.state)
            )
            return output._replace(state=state, ok=torch.tensor(False))
        return output

    monkeypatch.setattr(compiled_module.CompiledStep, "__call__", poisoned)
    return count


@pytest.mark.parametrize("streaming", [False, True])
def test_deferred_checks_rewind_and_replay_to_the_eager_chain(monkeypatch, streaming):
    x, y = logistic_data("cpu")
    options = dict(
        thinning=2, statistics=StatsOfDict(default=CountMeanVarianceStats) if streaming else None
    )
    make = lambda **kw: SGHMC(logistic_model, 1e-3, num_particles=3, repulsion="rbf", **kw)  # noqa: E731
    eager = draws(make(), x, y, **options)
    count = poison_compiled_calls(monkeypatch, {4, 20, 21, 57})
    kernel = make(jit_compile="trace", divergence_check_every=8)
    deferred = draws(kernel, x, y, **options)
    assert count[0] > 100 - 10  # most steps ran compiled, the replays eagerly
    if streaming:
        for key, stats in eager.get_statistics().items():
            got = deferred.get_statistics()[key]
            assert got["count"] == stats["count"] == 70
            torch.testing.assert_close(got["mean"], stats["mean"], atol=1e-5, rtol=1e-4)
    else:
        assert_same_chain(eager, deferred)


def test_deferred_checks_report_the_divergence_at_its_step():
    errors, kept = [], []
    for options in ({}, {"jit_compile": "trace", "divergence_check_every": 16}):
        pyro.set_rng_seed(1)
        mcmc = MCMC(
            SGLD(stiff_model, 0.05, num_particles=3, **options),
            num_samples=200,
            warmup_steps=0,
            disable_progbar=True,
        )
        with pytest.raises(SamplerDivergenceError, match="'stiff'") as error:
            mcmc.run()
        errors.append(error.value)
        kept.append(mcmc.get_samples(group_by_chain=True)["stiff"])
    assert errors[0].step == errors[1].step and errors[0].sites == errors[1].sites
    assert kept[1].shape[1] == errors[1].step and torch.isfinite(kept[1]).all()
    torch.testing.assert_close(kept[1], kept[0], atol=1e-5, rtol=1e-4)


def test_deferred_checks_with_checkpoints_resume_to_the_same_draws(tmp_path, monkeypatch):
    x, y = logistic_data("cpu")

    def make():
        return SGLD(
            logistic_model, 2e-3, num_particles=2, jit_compile="trace", divergence_check_every=6
        )

    reference = draws(make(), x, y)
    path = str(tmp_path / "run.ckpt")

    def crash(kernel, params, stage, index):
        if stage == "Sample" and index == 45:
            raise Interrupt

    poison_compiled_calls(monkeypatch, {9, 33})
    with pytest.raises(Interrupt):
        draws(make(), x, y, checkpoint_path=path, checkpoint_every=10, hook_fn=crash)
    resumed = MCMC(
        make(), num_samples=70, warmup_steps=30, disable_progbar=True, checkpoint_path=path
    )
    resumed.resume(x, y)
    assert_same_chain(reference, resumed)


def test_divergence_check_every_is_checked():
    with pytest.raises(ValueError, match="divergence_check_every"):
        SGLD(logistic_model, 1e-3, divergence_check_every=0)
    with pytest.raises(TypeError, match="divergence_check_every"):
        SGLD(logistic_model, 1e-3, divergence_check_every=2.0)


def test_a_minibatch_selected_by_value_cannot_be_traced():
    """Boolean-mask reads give sizes that change with the minibatch: refused, with the way out."""
    x, y = logistic_data("cpu")

    def selects(x, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
        with pyro.plate("data", x.shape[0], subsample_size=50) as idx:
            positives = x[idx][y[idx] > 0]  # as many rows as the minibatch has positives
        pyro.factor("positives", -(positives @ w).pow(2).sum())

    with pytest.raises(ModelNotTraceableError, match="0/1 mask"):
        draws(SGLD(selects, 1e-3, jit_compile="trace"), x, y, num_samples=2, warmup_steps=0)
    draws(SGLD(selects, 1e-3), x, y, num_samples=2, warmup_steps=0)  # eagerly it runs


@pytest.mark.parametrize(
    "make, error, match",
    [
        (
            lambda: AdamSGLD(logistic_model, 1e-3, eps="1e-8"),
            TypeError,
            "eps must be a finite number > 0",
        ),
        (lambda: AdamSGLD(logistic_model, 1e-3, betas=0.9), TypeError, "betas must be a pair"),
        (
            lambda: AdamSGLD(logistic_model, 1e-3, eps=float("inf")),
            ValueError,
            "eps must be a finite number > 0, got inf",
        ),
        (
            lambda: MCMC(SGLD(logistic_model, 1e-3), 10, warmup_steps=2.5),
            TypeError,
            "warmup_steps must be an integer >= 0 or None",
        ),
        (
            lambda: MCMC(SGLD(logistic_model, 1e-3), 10, warmup_steps=-1),
            ValueError,
            "warmup_steps must be an integer >= 0 or None, got -1",
        ),
        (
            lambda: MCMC(SGLD(logistic_model, 1e-3), 10.0),
            TypeError,
            "num_samples must be an integer >= 1",
        ),
        (
            lambda: MCMC(SGLD(logistic_model, 1e-3), 10, thinning=0),
            ValueError,
            "thinning must be an integer >= 1, got 0",
        ),
        (
            lambda: MCMC(SGLD(logistic_model, 1e-3), 10, checkpoint_every=1.0),
            TypeError,
            "checkpoint_every must be an integer >= 1 or None",
        ),
        (
            lambda: MCMC(SGLD(logistic_model, 1e-3), 10, checkpoint_every=0),
            ValueError,
            "checkpoint_every must be an integer >= 1 or None, got 0",
        ),
    ],
)
def test_wrong_types_are_type_errors_and_wrong_values_value_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


def diverged_run(num_samples, warmup_steps):
    """An MCMC of the stiff model whose run diverged, and the error it raised."""
    pyro.set_rng_seed(1)
    kernel = SGLD(stiff_model, 0.05, num_particles=3)
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup_steps, disable_progbar=True)
    with pytest.raises(SamplerDivergenceError) as error:
        mcmc.run()
    return mcmc, error.value


def test_summary_counts_the_divergent_particles(capsys):
    mcmc, error = diverged_run(num_samples=200, warmup_steps=0)
    assert error.step > 0
    mcmc.summary()
    assert f"Number of divergences: {len(error.particles)}" in capsys.readouterr().out


def test_summary_after_a_divergence_in_warmup_says_why_there_are_no_draws():
    mcmc, error = diverged_run(num_samples=10, warmup_steps=500)
    assert mcmc.get_samples()["stiff"].shape == (0, 2)
    with pytest.raises(
        ValueError, match=f"diverged at step {error.step}, before the first kept draw"
    ):
        mcmc.summary()


def test_arviz_marks_the_divergent_particles_last_draws():
    az = pytest.importorskip("arviz")
    mcmc, error = diverged_run(num_samples=200, warmup_steps=0)
    # (chains, num_samples): ArviZ sizes it by the configured draws, of which step were kept.
    diverging = az.from_pyro(mcmc).sample_stats["diverging"].values
    last_kept = error.step - 1
    assert sorted(diverging[:, last_kept].nonzero()[0].tolist()) == sorted(error.particles)
    assert diverging.sum() == len(error.particles)


def test_an_inductor_failure_falls_back_to_the_traced_step(monkeypatch):
    def broken(*args, **kwargs):
        raise AssertionError("vr must not be None for symbol q1")

    monkeypatch.setattr(torch._inductor, "compile", broken)
    x, y = logistic_data(torch.device("cpu"))
    traced = draws(SGLD(logistic_model, step_size=1e-3, num_particles=2, jit_compile="trace"), x, y)
    with pytest.warns(RuntimeWarning, match="TorchInductor could not compile"):
        fallback = draws(
            SGLD(logistic_model, step_size=1e-3, num_particles=2, jit_compile=True), x, y
        )
    a, b = traced.get_samples(), fallback.get_samples()
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def test_column_major_data_runs_the_step_compiled_for_row_major_data():
    # Inductor specialises a graph to its example inputs' strides; data of the same shape
    # but another layout (a Fortran-ordered array, a column of a table) is made
    # contiguous, not refused by the graph's stride assertion.
    x, y = logistic_data("cpu")
    kernel = SGLD(logistic_model, 2e-3, num_particles=2, jit_compile=True)
    kernel.setup(0, x, y)
    params = kernel.sample(kernel.initial_params)
    before = kernel.state_dict()
    pyro.set_rng_seed(5)
    kernel.set_data(x.T.contiguous().T, torch.stack([y, y], 1)[:, 0])
    column_major = kernel.sample(params)["w"]
    assert kernel.compiled_step.num_traces == 1
    kernel.load_state_dict(before)
    pyro.set_rng_seed(5)
    kernel.set_data(x, y)
    torch.testing.assert_close(kernel.sample(params)["w"], column_major)
