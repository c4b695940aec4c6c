"""
Issue 32, checkpoints bound to their run: :meth:`pyro_ext.infer.MCMC.resume` refuses a
checkpoint of another run (model, kernel setting, data) or an edited / damaged one with
an error that names the entry at fault, and never hangs.
"""

import functools
import os
import re
import tempfile

import pyro
import pyro.distributions as dist
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyro_ext.infer import MCMC, SGHMC, SGLD
from pyro_ext.infer.mcmc import CHECKPOINT_GLOBALS

try:
    from pyro_ext.infer.checkpoint import sign
except ImportError:  # the code before checkpoints were signed: edits need no re-signing

    def sign(checkpoint):
        return checkpoint


NUM_SAMPLES, WARMUP, EVERY, CRASH_AT = 10, 5, 5, 7  # a checkpoint at step 10, 5 draws kept


def model(x, y):
    w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.Normal(x @ w, 0.5), obs=y)


def student_t_model(x, y):
    w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.StudentT(4.0, x @ w, 0.5), obs=y)


def data(seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(20, 3, generator=generator)
    return x, x @ torch.tensor([1.0, -0.5, 0.2]) + 0.5 * torch.randn(20, generator=generator)


def make_mcmc(path, kernel=None, **options):
    kernel = kernel or SGLD(model, step_size=1e-3, num_particles=2)
    return MCMC(
        kernel,
        num_samples=NUM_SAMPLES,
        warmup_steps=WARMUP,
        checkpoint_path=path,
        checkpoint_every=EVERY,
        disable_progbar=True,
        **options,
    )


class _Interrupt(Exception):
    pass


def _crash(kernel, params, stage, index):
    if stage == "Sample" and index == CRASH_AT:
        raise _Interrupt


def _write_checkpoint(path):
    pyro.set_rng_seed(0)
    with pytest.raises(_Interrupt):
        make_mcmc(path, hook_fn=_crash).run(*data())


@functools.cache
def _pristine_bytes():
    """The bytes of one real checkpoint, written once for the whole module."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "run.pt")
        _write_checkpoint(path)
        with open(path, "rb") as f:
            return f.read()


def _load(path):
    with torch.serialization.safe_globals(CHECKPOINT_GLOBALS):
        return torch.load(path, weights_only=True)


@pytest.fixture
def path(tmp_path):
    path = str(tmp_path / "run.pt")
    with open(path, "wb") as f:
        f.write(_pristine_bytes())
    return path


def _edit(path, change, resign=True):
    checkpoint = _load(path)
    change(checkpoint)
    torch.save(sign(checkpoint) if resign else checkpoint, path)


def _never_hang(limit=200):
    calls = []

    def hook(kernel, params, stage, index):
        calls.append(index)
        if len(calls) > limit:
            raise RuntimeError(f"resume() ran {limit} steps past a 15-step run: it hangs")

    return hook


def _name(*path):
    return re.escape("checkpoint" + "".join(f"[{key!r}]" for key in path))


def test_the_checkpoint_resumes_to_the_uninterrupted_draws(path):
    pyro.set_rng_seed(0)
    reference = make_mcmc(None)
    reference.run(*data())
    resumed = make_mcmc(path)
    resumed.resume(*data())
    assert torch.equal(resumed.get_samples()["w"], reference.get_samples()["w"])


# -- the step counter ----------------------------------------------------------------------
def test_hang_a_step_beyond_the_run_is_refused(path):
    _edit(path, lambda c: c.update(step=10**6))
    with pytest.raises(ValueError, match=r"checkpoint\['step'\]=1000000 lies outside \[0, 15\]"):
        make_mcmc(path, hook_fn=_never_hang()).resume(*data())


def test_a_negative_step_is_refused(path):
    # Before: step -5 replayed 15 steps on top of the 5 saved draws.
    _edit(path, lambda c: c.update(step=-5))
    with pytest.raises(ValueError, match=r"checkpoint\['step'\]=-5 lies outside \[0, 15\]"):
        make_mcmc(path, hook_fn=_never_hang()).resume(*data())


def test_a_step_that_is_not_an_integer_is_refused(path):
    _edit(path, lambda c: c.update(step=10.0))
    with pytest.raises(TypeError, match=r"checkpoint\['step'\] must be int, got float"):
        make_mcmc(path, hook_fn=_never_hang()).resume(*data())


def test_the_run_loop_stops_past_its_last_step():
    # The loop bound is >=, not ==: a start past the end stops at once (extend() and
    # resume() start mid-run; a wrong start must never make the loop run forever).
    mcmc = make_mcmc(None, hook_fn=_never_hang())
    mcmc.run(*data())
    mcmc._run_particles(start=10**6, draws=[])
    assert mcmc.get_samples()["w"].shape == (0, 3)


# -- the data ------------------------------------------------------------------------------
def test_other_data_of_the_same_shapes_is_refused(path):
    x2, y2 = data(seed=1)
    with pytest.raises(
        ValueError,
        match=r"model argument 'x' holds other values .*model argument 'y' holds other values"
        r".*allow_new_data=True",
    ):
        make_mcmc(path).resume(x2, y2)


def test_one_changed_argument_is_named(path):
    x, y = data()
    y = y.clone()
    y[7] += 1.0
    with pytest.raises(ValueError, match=r"model argument 'y' holds other values") as info:
        make_mcmc(path).resume(x, y)
    assert "'x'" not in str(info.value)


def test_allow_new_data_continues_on_other_data(path):
    x2, y2 = data(seed=1)
    mcmc = make_mcmc(path)
    mcmc.resume(x2[:15], y2[:15], allow_new_data=True)  # other values, other shapes
    assert mcmc.get_samples(group_by_chain=True)["w"].shape == (2, NUM_SAMPLES, 3)
    with pytest.raises(TypeError, match="allow_new_data must be True or False"):
        make_mcmc(path).resume(x2, y2, allow_new_data="yes")


# -- the model and the kernel --------------------------------------------------------------
def test_a_student_t_model_with_the_same_sites_is_refused(path):
    kernel = SGLD(student_t_model, step_size=1e-3, num_particles=2)
    with pytest.raises(
        ValueError,
        match=r"checkpoint_path=.*model site 'y' distribution was 'Normal', is 'StudentT'.*"
        r"start afresh with run\(\)",
    ):
        make_mcmc(path, kernel).resume(*data())


def test_another_step_size_is_refused(path):
    kernel = SGLD(model, step_size=0.5, num_particles=2)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "step_size was 'ConstantStepSize(step_size=0.001)', is 'ConstantStepSize(step_size=0.5)'"
        ),
    ):
        make_mcmc(path, kernel).resume(*data())


@pytest.mark.parametrize(
    "kernel, match",
    [
        (
            lambda: SGLD(model, 1e-3, num_particles=2, temperature=0.5),
            "temperature was 1.0, is 0.5",
        ),
        (
            lambda: SGLD(model, 1e-3, num_particles=2, repulsion="rbf"),
            "repulsion was None, is 'RBFKernel(bandwidth=None)'",
        ),
        (lambda: SGLD(model, 1e-3, num_particles=3), "num_particles was 2, is 3"),
        (lambda: SGHMC(model, 1e-3, num_particles=2), "kernel was 'SGLD', is 'SGHMC'"),
    ],
    ids=["temperature", "repulsion", "particles", "kernel class"],
)
def test_another_kernel_setting_is_refused(path, kernel, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        make_mcmc(path, kernel()).resume(*data())


def test_a_default_step_checkpoint_is_bound_to_its_bias_rule(tmp_path):
    # With step_size=None a checkpoint taken during warm-up continues the step's rule, so
    # resuming it under another bias_bound or bias_tolerance would change the chain.
    path = str(tmp_path / "default_step.pt")
    pyro.set_rng_seed(0)
    with pytest.raises(_Interrupt):
        make_mcmc(path, SGLD(model, num_particles=2), hook_fn=_crash).run(*data())
    for other, match in [
        (dict(bias_bound="stiffest"), "bias_bound was 'auto', is 'stiffest'"),
        (dict(bias_tolerance=0.1), "bias_tolerance was 0.05, is 0.1"),
    ]:
        with pytest.raises(ValueError, match=re.escape(match)):
            make_mcmc(path, SGLD(model, num_particles=2, **other)).resume(*data())
    make_mcmc(path, SGLD(model, num_particles=2)).resume(*data())  # its own rule resumes


# -- the checksum covers every entry -------------------------------------------------------
def test_a_tampered_state_fails_its_checksum(path):
    def shift(c):
        c["kernel"]["state"]["z"] += 100

    _edit(path, shift, resign=False)
    with pytest.raises(
        ValueError, match=_name("kernel", "state", "z") + " does not match its checksum"
    ):
        make_mcmc(path).resume(*data())


def test_draws_stored_as_a_list_are_refused(path):
    _edit(path, lambda c: c.update(draws=c["draws"].tolist()), resign=False)
    with pytest.raises(TypeError, match=_name("draws") + " must be Tensor, got list"):
        make_mcmc(path).resume(*data())


# -- edited states that carry valid checksums ----------------------------------------------
def test_a_wrong_shaped_z_is_refused(path):
    def widen(c):
        c["kernel"]["state"]["z"] = torch.zeros(2, 5)

    _edit(path, widen)
    with pytest.raises(ValueError, match=_name("kernel", "state", "z") + " has shape \\[2, 5\\]"):
        make_mcmc(path).resume(*data())


def test_a_missing_state_key_is_refused(path):
    _edit(path, lambda c: c["kernel"]["state"].pop("z"))
    with pytest.raises(ValueError, match=_name("kernel", "state", "z") + " is missing"):
        make_mcmc(path).resume(*data())


def test_an_extra_state_key_is_refused(path):
    def add(c):
        c["kernel"]["state"]["momentum"] = torch.zeros(2, 3)

    _edit(path, add)
    with pytest.raises(
        ValueError, match=_name("kernel", "state", "momentum") + " is not part of this kernel's"
    ):
        make_mcmc(path).resume(*data())


def test_a_wrong_rng_state_size_is_refused(path):
    _edit(path, lambda c: c.update(cpu_rng=c["cpu_rng"][:100]))
    with pytest.raises(ValueError, match=_name("cpu_rng") + " has shape \\[100\\]"):
        make_mcmc(path).resume(*data())


def test_draws_of_the_wrong_count_are_refused(path):
    _edit(path, lambda c: c.update(draws=torch.cat([c["draws"], c["draws"]])))
    with pytest.raises(ValueError, match=_name("draws") + " has shape \\[10, 2, 3\\]"):
        make_mcmc(path).resume(*data())


def test_a_statistic_that_is_not_one_is_refused(tmp_path):
    from pyro.ops.streaming import CountMeanVarianceStats, StatsOfDict

    path = str(tmp_path / "run.pt")
    options = dict(statistics=StatsOfDict(default=CountMeanVarianceStats))
    with pytest.raises(_Interrupt):
        make_mcmc(path, hook_fn=_crash, **options).run(*data())

    def replace(c):
        c["statistics"][(0, "w")] = "0"

    _edit(path, replace)
    with pytest.raises(TypeError, match=re.escape("checkpoint['statistics'][(0, 'w')] must be")):
        make_mcmc(path, **options).resume(*data())


# -- hostile checkpoints -------------------------------------------------------------------
def _targets():
    checkpoint = _load_pristine()
    paths = [("step",), ("draws",), ("cpu_rng",), ("kernel", "step")]
    paths += [("kernel", "state", key) for key in checkpoint["kernel"]["state"]]
    return paths


@functools.cache
def _load_pristine():
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "run.pt")
        with open(path, "wb") as f:
            f.write(_pristine_bytes())
        return _load(path)


def _corrupt(value, how):
    tensor = isinstance(value, torch.Tensor)
    if how == "scale":
        return value * 3 + 1 if tensor else value * 3
    if how == "reshape":
        if not tensor:
            return [value]
        return value.reshape(1) if value.dim() == 0 else torch.cat([value, value[-1:]])
    if how == "list":
        return value.tolist() if tensor else [value]
    return {"none": None, "str": "0"}[how]


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    target=st.integers(0, 1000),
    how=st.sampled_from(["scale", "reshape", "list", "none", "str", "delete"]),
    resign=st.booleans(),
)
def test_hostile_checkpoints_name_the_entry(path, target, how, resign):
    """A random entry of a real checkpoint (a tensor of the sampler state, the draws, the
    random state, a step counter) rescaled, reshaped, replaced by a list / None / a string
    or deleted, with its checksums left stale or recomputed: refused, naming the entry."""
    targets = _targets()
    key = targets[target % len(targets)]
    if resign and how == "scale" and isinstance(_get(_load_pristine(), key), torch.Tensor):
        how = "reshape"  # a rescaled tensor with fresh checksums is a valid state

    def change(checkpoint):
        parent = _get(checkpoint, key[:-1])
        if how == "delete":
            del parent[key[-1]]
        else:
            parent[key[-1]] = _corrupt(parent[key[-1]], how)

    with open(path, "wb") as f:
        f.write(_pristine_bytes())
    _edit(path, change, resign=resign)
    with pytest.raises((ValueError, TypeError)) as info:
        make_mcmc(path, hook_fn=_never_hang()).resume(*data())
    assert "checkpoint" + "".join(f"[{k!r}]" for k in key) in str(info.value), (key, how)


def _get(checkpoint, key):
    return functools.reduce(lambda d, k: d[k], key, checkpoint)


# -- the security refusals stay ------------------------------------------------------------
class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_crafted_checkpoint_still_runs_no_code(path, tmp_path):
    marker = tmp_path / "pwned"
    _edit(path, lambda c: c.update(statistics=_Payload(str(marker))))
    with pytest.raises(ValueError, match="checkpoint_path=.*not loaded"):
        make_mcmc(path).resume(*data())
    assert not marker.exists()
