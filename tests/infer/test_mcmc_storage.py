"""Where :class:`pyro_ext.infer.MCMC` keeps its draws: ``draws_device`` and streaming statistics."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import NUTS
from pyro.infer.mcmc import StreamingMCMC
from pyro.ops.streaming import CountMeanVarianceStats, CountStats, StatsOfDict

from pyro_ext.infer import MCMC, SGHMC, SGLD

NUM_PARTICLES = 3


def model(data):
    loc = pyro.sample("loc", dist.Normal(torch.zeros(2, device=data.device), 1.0).to_event(1))
    scale = pyro.sample("scale", dist.LogNormal(torch.zeros((), device=data.device), 1.0))
    with pyro.plate("data", data.shape[0], subsample_size=10, device=data.device) as idx:
        mean, sd = loc.sum(-1, keepdim=True), scale.unsqueeze(-1)
        pyro.sample("obs", dist.Normal(mean, sd), obs=data[idx])


def make_mcmc(kernel=None, **kwargs):
    kernel = kernel or SGLD(model, step_size=1e-2, num_particles=NUM_PARTICLES, repulsion="rbf")
    options = dict(num_samples=40, warmup_steps=10, thinning=2, disable_progbar=True)
    return MCMC(kernel, **{**options, **kwargs})


class _Interrupt(Exception):
    """A simulated crash in the middle of the sampling stage."""


def streaming_stats():
    return StatsOfDict(default=CountMeanVarianceStats)


@pytest.fixture
def data(device):
    return torch.randn(30, device=device)


def test_draws_are_moved_to_draws_device(data):
    pyro.set_rng_seed(1)
    reference = make_mcmc()
    reference.run(data)
    pyro.set_rng_seed(1)
    mcmc = make_mcmc(draws_device="cpu")
    mcmc.run(data)
    for name, value in mcmc.get_samples(group_by_chain=True).items():
        assert value.device.type == "cpu"
        assert value.shape[:2] == (NUM_PARTICLES, 40)
        expected = reference.get_samples(group_by_chain=True)[name].cpu()
        if data.device.type == "cpu":
            assert torch.equal(value, expected)  # same seed, same draws
        else:
            # CUDA promises no bitwise-equal reruns (its reductions may reorder sums); the
            # two runs agreed to the 4th digit on an H200.
            torch.testing.assert_close(value, expected, rtol=1e-4, atol=1e-5)


def test_streaming_statistics_equal_those_of_the_stored_draws(data):
    pyro.set_rng_seed(2)
    stored = make_mcmc()
    stored.run(data)
    samples = stored.get_samples(group_by_chain=True)
    pyro.set_rng_seed(2)
    streaming = make_mcmc(statistics=streaming_stats(), draws_device="cpu")
    streaming.run(data)

    per_particle = streaming.get_statistics()
    assert set(per_particle) == {(i, n) for i in range(NUM_PARTICLES) for n in ("loc", "scale")}
    for (i, name), stats in per_particle.items():
        assert stats["count"] == 40
        assert stats["mean"].device.type == "cpu"
        draws = samples[name][i].cpu()
        assert torch.allclose(stats["mean"], draws.mean(0), atol=1e-5)
        assert torch.allclose(stats["variance"], draws.var(0), rtol=1e-4, atol=1e-6)
    pooled = streaming.get_statistics(group_by_chain=False)
    for name, stats in pooled.items():
        draws = stored.get_samples()[name].cpu()
        assert stats["count"] == NUM_PARTICLES * 40
        assert torch.allclose(stats["mean"], draws.mean(0), atol=1e-5)
        assert torch.allclose(stats["variance"], draws.var(0), rtol=1e-4, atol=1e-6)
    assert (pooled["scale"]["mean"] > 0).all()  # constrained values


def test_a_second_run_starts_fresh_statistics():
    data = torch.randn(30)
    mcmc = make_mcmc(statistics=StatsOfDict(default=CountStats))
    mcmc.run(data)
    mcmc.run(data)
    assert mcmc.get_statistics(group_by_chain=False)["loc"]["count"] == NUM_PARTICLES * 40


@pytest.mark.parametrize("streaming", [False, True])
def test_extend_equals_one_longer_run(data, streaming):
    def result(mcmc):
        if streaming:
            return {k: v["mean"] for k, v in mcmc.get_statistics(group_by_chain=False).items()}
        return mcmc.get_samples(group_by_chain=True)

    options = dict(statistics=streaming_stats()) if streaming else {}
    pyro.set_rng_seed(4)
    reference = make_mcmc(num_samples=25, **options)
    reference.run(data)
    pyro.set_rng_seed(4)
    extended = make_mcmc(num_samples=15, **options)
    extended.run(data)
    extended.extend(10)
    assert extended.num_samples == 25
    expected, actual = result(reference), result(extended)
    for name in expected:
        assert torch.allclose(actual[name], expected[name], rtol=1e-6, atol=1e-7), name
    with pytest.raises(ValueError, match="num_samples must be an integer >= 1, got 0"):
        extended.extend(0)
    with pytest.raises(TypeError, match="num_samples must be an integer >= 1"):
        extended.extend(2.5)
    with pytest.raises(ValueError, match="run\\(\\) first"):
        make_mcmc().extend(5)


@pytest.mark.parametrize("streaming", [False, True])
def test_checkpoint_resume_with_storage_options(tmp_path, streaming):
    data = torch.randn(30)
    options = dict(draws_device="cpu", statistics=streaming_stats() if streaming else None)

    def result(mcmc):
        if streaming:
            return mcmc.get_statistics()
        return mcmc.get_samples(group_by_chain=True)

    pyro.set_rng_seed(5)
    reference = make_mcmc(**options)
    reference.run(data)

    def crash(kernel, params, stage, index):
        if stage == "Sample" and index == 33:
            raise _Interrupt

    path = str(tmp_path / "run.ckpt")
    pyro.set_rng_seed(5)
    first = make_mcmc(checkpoint_path=path, checkpoint_every=12, hook_fn=crash, **options)
    with pytest.raises(_Interrupt):
        first.run(data)
    resumed = make_mcmc(checkpoint_path=path, **options)
    resumed.resume(data)
    expected, actual = result(reference), result(resumed)
    assert expected.keys() == actual.keys()
    for key, value in expected.items():
        if streaming:
            assert actual[key]["count"] == value["count"] == 40
            assert torch.allclose(actual[key]["mean"], value["mean"])
            assert torch.allclose(actual[key]["variance"], value["variance"])
        else:
            assert torch.equal(actual[key], value)

    mismatched = make_mcmc(
        checkpoint_path=path, statistics=None if streaming else streaming_stats()
    )
    with pytest.raises(ValueError, match="draws or statistics"):
        mismatched.resume(data)


def test_storage_options_are_checked():
    data = torch.randn(30)
    with pytest.raises(ValueError, match="particle kernel"):
        MCMC(NUTS(model), num_samples=5, draws_device="cpu")
    with pytest.raises(TypeError, match="StatsOfDict"):
        make_mcmc(statistics=CountMeanVarianceStats())
    streaming = make_mcmc(statistics=streaming_stats())
    streaming.run(data)
    with pytest.raises(ValueError, match="get_statistics"):
        streaming.get_samples()
    stored = make_mcmc()
    stored.run(data)
    with pytest.raises(ValueError, match="get_samples"):
        stored.get_statistics()


def test_pyro_streaming_mcmc_sees_the_particles_as_one_chain():
    # What the MCMC docstring says of pyro's StreamingMCMC: it runs the kernels, with
    # per-particle statistics that it never pools.
    kernel = SGHMC(model, step_size=1e-2, num_particles=NUM_PARTICLES)
    mcmc = StreamingMCMC(kernel, num_samples=20, warmup_steps=5, disable_progbar=True)
    mcmc.run(torch.randn(30))
    stats = mcmc.get_statistics(group_by_chain=False)
    assert stats["loc"]["mean"].shape == (NUM_PARTICLES, 2)
    assert stats["loc"]["count"] == 20


# -- checkpoints that must not be resumed ----------------------------------------------------
def _interrupted_run(path, data):
    def crash(kernel, params, stage, index):
        if stage == "Sample" and index == 21:
            raise _Interrupt

    mcmc = make_mcmc(checkpoint_path=path, checkpoint_every=12, hook_fn=crash)
    with pytest.raises(_Interrupt):
        mcmc.run(data)


def _load_trusted(path):
    from pyro_ext.infer.mcmc import CHECKPOINT_GLOBALS

    with torch.serialization.safe_globals(CHECKPOINT_GLOBALS):
        return torch.load(path, weights_only=True)


class _Payload:
    """An object whose unpickling would run code (here: create a file)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_crafted_checkpoint_runs_no_code(tmp_path):
    data = torch.randn(30)
    path, marker = str(tmp_path / "run.ckpt"), tmp_path / "pwned"
    _interrupted_run(path, data)
    checkpoint = _load_trusted(path)
    checkpoint["statistics"] = _Payload(str(marker))
    torch.save(checkpoint, path)
    with pytest.raises(ValueError, match="checkpoint_path=.*not loaded"):
        make_mcmc(checkpoint_path=path).resume(data)
    assert not marker.exists()


def test_tampered_draws_fail_their_checksum(tmp_path):
    data = torch.randn(30)
    path = str(tmp_path / "run.ckpt")
    _interrupted_run(path, data)
    checkpoint = _load_trusted(path)
    assert checkpoint["draws"].numel() > 0
    checkpoint["draws"].view(-1)[5] += 1.0  # what a flipped byte in the stored draws does
    torch.save(checkpoint, path)
    with pytest.raises(ValueError, match="checksum"):
        make_mcmc(checkpoint_path=path).resume(data)


@pytest.mark.parametrize(
    "kernel, data_rows, match",
    [
        (
            lambda: SGLD(model, step_size=1e-2, num_particles=2, repulsion="rbf"),
            30,
            "num_particles was 3, is 2",
        ),
        (
            lambda: SGHMC(model, step_size=1e-2, num_particles=NUM_PARTICLES),
            30,
            "kernel was 'SGLD', is 'SGHMC'",
        ),
        (None, 40, r"data shapes was \[\[30\]\], is \[\[40\]\]"),
    ],
    ids=["particles", "kernel", "data"],
)
def test_a_checkpoint_of_another_run_is_refused(tmp_path, kernel, data_rows, match):
    path = str(tmp_path / "run.ckpt")
    _interrupted_run(path, torch.randn(30))
    mcmc = make_mcmc(kernel() if kernel else None, checkpoint_path=path)
    with pytest.raises(ValueError, match=match):
        mcmc.resume(torch.randn(data_rows))


def test_a_truncated_checkpoint_names_its_path(tmp_path):
    data = torch.randn(30)
    path = tmp_path / "run.ckpt"
    _interrupted_run(str(path), data)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="checkpoint_path=.*truncated"):
        make_mcmc(checkpoint_path=str(path)).resume(data)
