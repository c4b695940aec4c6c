"""
Natural-gradient variational inference (``pyro_ext.infer.NaturalGradientVI``: IVON, VOGN)
for Bayesian neural networks, against Bayes-by-backprop, SG-MCMC, ``ivon-opt`` and Adam.
Every figure below is measured by this script in the same run, from fixed seeds.

1. **UCI regression** -- ``uci.py``'s protocol (its data loading, standardisation,
   validation rows, evaluation and SG-MCMC runs are imported, not copied): the thesis'
   ``BayesianMLP(in, hidden=(50,))`` (ReLU, ``N(0, 1)`` weight priors, Gaussian likelihood
   with a learned noise precision ``tau ~ Gamma(1, 0.1)``, ``full_output=False``), inputs
   and targets standardised on the training part, metrics in original units.

   * IVON and VOGN (``NaturalGradientVI(net, method=...)``, the mean started at
     ``net.init_strategy(x, y)``) and Bayes-by-backprop (``AutoNormal`` with the same start
     and ``init_scale=0.01``, ``Trace_ELBO``, ``pyro.optim.Adam``) run the same number of
     passes over the data as ``uci.py``'s chains: ``--iterations`` (2000) steps on
     minibatches of 100 drawn by the model's data plate (``subsample_size=100``): 2000 x 100
     rows, e.g. 440 epochs of boston's 455 training rows, 27 of kin8nm's 7373. The posterior
     predictive is averaged over 100 posterior draws (``vi.sample_posterior(100)``, 100
     draws of the ``AutoNormal`` guide) and scored with ``uci._evaluate``
     (``log_predictive_density`` and ``rmse``).
   * SGLD and Adam+NR (``AdamSGLD`` with ``repulsion="rbf"``, uci.py's ``adamsgld+r``) run
     by ``uci.run_task`` (20 particles, batch 100, 2000 iterations, 1000 burn-in, a draw
     every 10: 2000 draws; ``jit_compile=True``) with the step sizes that ``uci.py``'s
     validation chose, read from ``results/uci_thesis_protocol.md``'s "chosen step(s)" column (where it
     lists two for a data set, both are tried in the listed order, then the rest of the
     grid, as ``run_task`` falls back when a chain diverges).
   * Hyper-parameters of the VI methods, per data set, by the log-likelihood of the
     posterior predictive on the validation rows of split 0 (``uci._split_rows``: the fit
     runs on 80 % of the training part, scored on the other 20 %; the test parts are never
     used): IVON on the grid ``lr`` x ``hess_init`` (``IVON_GRID``; ``mc_samples=1``,
     ``beta2=0.99999``, ``ivon-opt``'s default: every setting is passed explicitly, not
     left to the library's defaults), then from the best point ``mc_samples=4``,
     ``beta2=0.999`` and both (the best of the nine is kept); Bayes-by-backprop on Adam's
     ``BBB_LRS``; VOGN on its own grid ``VOGN_GRID`` (IVON's ``lr`` x ``hess_init`` with
     ``mc_samples=1`` and ``beta2=0.999``: its Gauss-Newton ``h`` is a curvature estimate
     from the first step, not a noisy one to average over 10^5 steps). VOGN needs its own
     search: with a learned noise precision its Gauss-Newton curvature of the log-precision
     is the Fisher's 1/2 however badly the network fits, where the Hessian is
     ``tau r^2 / 2``, so a learning rate IVON takes (0.3 on boston) overshoots the
     precision early and can leave it collapsed (a test RMSE of 3,600 on boston split 1).
     Then, for IVON and VOGN, ``clip_radius`` (``CLIP_MOVES``, ivon-opt's clip of each
     coordinate of the mean's step direction) from the best point so far; on a tie (the
     clip never bound) the smaller radius is kept. The clip guards against a failure that a
     single validation split rarely shows: a minibatch of large residuals gives the log noise
     precision a gradient 1/2 (tau r^2 - 1), unbounded, while its curvature 1/2 tau r^2 is
     seen by neither IVON's slowly averaged ``h`` nor VOGN's Fisher 1/2, so one unclipped
     step can drop the log precision by 20-40, after which the fit crawls back at about 0.1
     per step and ends finite but useless (the previous run's protein split 2: test RMSE
     190; a Newton step on that coordinate is at most 1 whatever the residual).
     Every split's final run uses the choice, and the next setting in validation order if it
     diverges or if its posterior predictive scores below the constant predictor N(0, 1) on
     its own standardised training rows (a finite failure; the test rows are never used for
     this); such refits are counted and listed.
   * Columns: test LL and RMSE, mean +- standard error over splits, and the median wall
     time of one run's fit (VI: the steps; SG-MCMC: ``MCMC.run``, compilation included).
     Runs execute in ``--jobs`` worker processes of one thread each (2 on the 2-core machine,
     as uci.py's committed run), so a run's seconds are those of one core.

2. **MNIST 784-400-400-10** (``pyro_ext.datasets.load_mnist``, ``--mnist-train`` 60,000
   training images, the 10,000 test images, batches of 128): IVON (ours:
   ``NaturalGradientVI`` on a categorical ``BayesianMLP``, ``N(0, 1)`` priors, ess = the
   number of training images), ``ivon-opt``'s IVON on a plain ``torch.nn`` network with the
   same settings (``weight_decay = 1 / ess``, the same prior), Bayes-by-backprop
   (``AutoNormal``, ``init_scale=0.01``, ``Trace_ELBO``, Adam) and Adam (MAP: a plain
   ``torch.nn`` network, ``weight_decay = 1 / N``, the ``N(0, 1)`` prior). All four start
   from the same weights (``N(0, 1 / (fan_in + 1))``, biases 0: ``BayesianMLP``'s
   ``init_strategy``) and take ``ceil(N / 128)`` steps per epoch: the torch networks go
   through a random permutation each epoch, the Pyro models draw each minibatch with their
   data plate (``subsample_size=128``). Each runs for the largest of ``--epochs`` (2 5 10)
   and is scored after each of them along the way ("after the same number of epochs" at
   three training lengths, not one chosen point): test accuracy, NLL and ECE (15 bins) of
   the posterior predictive, averaged over ``--mnist-draws`` (10) draws for the Bayesian
   methods (the MAP network's softmax for Adam); and seconds per step (median / mean / p90
   / max over every step, the first included; evaluations untimed), with the ratio of each
   to Adam's. The issue's target, IVON's NLL and ECE better than MAP's and
   Bayes-by-backprop's at <= 1.3x Adam's time per step, is judged at each epoch count.
   Then where an IVON step's time goes: ``torch.profiler`` on ``--profile-steps`` steps of
   ours and of ``ivon-opt`` (top operators by self time), and the unprofiled median time of
   our step and its parts (the Pyro model's log density and gradient, the noise draw, the
   draw and the update as the step runs them) beside ``ivon-opt``'s step, Adam's step, a
   plain forward and backward pass, and the floor of any IVON step on this machine (that
   forward and backward plus the D normal draws), each as a ratio to Adam's step.

   Settings: with ``--mnist-tune`` (the committed run), each method's are chosen first on
   a hold-out of the training images (the last sixth: 10,000 of 60,000; never the test
   images) by the NLL of its predictive after the largest epoch count of training on the
   rest: IVON on ``MNIST_IVON_GRID`` (lr x hess_init; ``--mnist-beta2`` 0.99999,
   ``ivon-opt``'s default, and mc_samples 1), Bayes-by-backprop and Adam on their
   learning rates (``MNIST_BBB_LRS``, ``MNIST_ADAM_LRS``); ``ivon-opt`` takes IVON's
   choice. The report lists every setting's hold-out NLL. Without it, ``--mnist-lr`` (0.5),
   ``--mnist-hess-init`` (1), ``--mnist-bbb-lr`` and ``--mnist-adam-lr`` (1e-3).

   ``--mnist-seeds N`` repeats the runs for seeds 0..N-1 (each seed its own start and random
   stream, shared by the four methods; default 1, quick 2): the scores become mean ± standard
   error over seeds, and the verdict adds IVON's paired differences to MAP and
   Bayes-by-backprop with their standard errors (the seed-to-seed spread of a 10-epoch NLL is
   as large as the gaps the target compares); times and the profile come from seed 0.

Run from the repository root::

    python benchmarks/ngvi.py             # full run: all nine data sets x 20 splits (protein 5), MNIST
    python benchmarks/ngvi.py --quick     # smoke test: yacht 1 split, 512 MNIST images, < 60 s
    python benchmarks/ngvi.py --datasets boston yacht --splits 5 --skip-mnist   # a part

The committed results are three runs: ``--skip-mnist`` (``results/ngvi.md``, about 90
minutes on two cores), ``--skip-uci --mnist-tune --output benchmarks/results/ngvi_mnist.md``
(about 20 minutes, on a quiet machine: it times steps) and, with the settings that run chose,
``--skip-uci --mnist-seeds 4 --mnist-lr 0.5 --mnist-hess-init 0.3 --mnist-bbb-lr 1e-3
--mnist-adam-lr 3e-4 --output benchmarks/results/ngvi_mnist_seeds.md`` (the scores over four
seeds; its step times were taken beside another benchmark and are not the reference).

Data are read from ``$PYRO_EXT_DATA`` (default: ``../shared/data`` next to the repository).
The tables are printed and written to ``benchmarks/results/ngvi.md`` (``--output``).
"""

import math
import os
import statistics
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

import pyro  # noqa: E402
import torch  # noqa: E402
import uci  # noqa: E402
from _common import (  # noqa: E402
    REPO,  # importing _common also sets $PYRO_EXT_DATA's default
    argument_parser,
    command_line_args,
    markdown,
    write_report,
)
from _common import spread as timing_spread  # noqa: E402
from pyro.infer import SVI, Trace_ELBO  # noqa: E402
from pyro.infer.autoguide import AutoNormal  # noqa: E402

from pyro_ext.datasets import (  # noqa: E402
    UCI_DATASETS,
    load_mnist,
    load_uci,
    standardize_split,
    uci_num_splits,  # noqa: E402
)
from pyro_ext.infer import NaturalGradientVI  # noqa: E402
from pyro_ext.models import (  # noqa: E402
    BayesianMLP,
    expected_calibration_error,
    log_predictive_density,
    predictive_moments,  # noqa: E402
)

try:
    import ivon
except ImportError:  # the peer is optional
    ivon = None

RESULTS = REPO / "benchmarks" / "results" / "ngvi.md"
UCI_RESULTS = REPO / "benchmarks" / "results" / "uci_thesis_protocol.md"
DEFAULT_DATASETS = ["all"]

# Validation grids of the VI methods (see the module docstring).
IVON_GRID = [(lr, h0) for lr in (0.03, 0.1, 0.3) for h0 in (0.1, 1.0)]
IVON_MOVES = [dict(mc_samples=4), dict(beta2=0.999), dict(mc_samples=4, beta2=0.999)]
# VOGN's own grid: its Gauss-Newton h is a real curvature estimate from the first step, so it
# averages it with beta2 0.999 (h forgets hess_init within the run), one draw per step.
VOGN_GRID = [dict(lr=lr, hess_init=h0, mc_samples=1, beta2=0.999) for lr, h0 in IVON_GRID]
# Then, for IVON and VOGN, the clip radius of the mean's step direction (ivon-opt's
# clip_radius) from the best point so far: with a learned noise precision, a minibatch of
# large residuals gives its log a gradient 1/2 (tau r^2 - 1) that neither method's h tracks,
# and an unclipped step can collapse the precision (traced in the module docstring).
CLIP_MOVES = (3.0, 1.0)
BBB_LRS = (1e-3, 1e-2)
BBB_INIT_SCALE = 0.01
IVON_DEFAULTS = dict(lr=0.1, hess_init=1.0, mc_samples=1, beta2=0.99999)

# The SG-MCMC methods: uci.py's SAMPLERS keys, with the labels of this report.
SGMCMC = {"sgld": "SGLD", "adamsgld+r": "Adam+NR"}
VI = {"ivon": "IVON (ours)", "vogn": "VOGN (ours)", "bbb": "Bayes-by-backprop"}
METHODS = {**{k: VI[k] for k in ("ivon", "vogn", "bbb")}, **SGMCMC}


# -- 1. UCI regression ----------------------------------------------------------------------
def chosen_sgmcmc_steps(path, datasets):
    """The step sizes uci.py's validation chose (its results file's "chosen step(s)" column),
    in uci.py's grid units, for each (data set, SG-MCMC key): the listed ones first, then the
    rest of the grid (the fallback order of uci.run_task)."""
    labels = {uci.SAMPLERS[key][0]: key for key in SGMCMC}
    chosen = {}
    for line in path.read_text().splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) == 8 and cols[1] in labels and cols[0] in UCI_DATASETS:
            key = labels[cols[1]]
            steps = [float(s.replace("/N", "")) for s in cols[7].split(",")]
            grid = uci.step_grid(key, 20)
            rest = [g for g in grid if not any(math.isclose(g, s, rel_tol=0.05) for s in steps)]
            chosen[cols[0], key] = steps + rest
    missing = [(n, k) for n in datasets for k in SGMCMC if (n, k) not in chosen]
    if missing:
        raise SystemExit(
            f"{path} has no chosen step for {missing}: run benchmarks/uci.py on those data sets "
            "with --samplers sgld adamsgld+r first"
        )
    return chosen


def _latent_draws(guide, args, num):
    with torch.no_grad():
        draws = [guide(*args) for _ in range(num)]
    return {k: torch.stack([d[k] for d in draws]).detach() for k in draws[0]}


def fit_vi(method, x, y, hp, cfg, seed):
    """Fit one VI method on (x, y); return the network, 100 posterior draws and the seconds
    of the fit. Raises on divergence (a non-finite loss or posterior)."""
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    net = BayesianMLP(x.shape[1], hidden=(cfg["hidden"],), full_output=False)
    batch = min(cfg["batch"], x.shape[0])
    start = time.perf_counter()
    if method == "bbb":
        guide = AutoNormal(net, init_loc_fn=net.init_strategy(x, y), init_scale=BBB_INIT_SCALE)
        svi = SVI(net, guide, pyro.optim.Adam({"lr": hp["lr"]}), Trace_ELBO())
        for _ in range(cfg["iterations"]):
            loss = svi.step(x, y, subsample_size=batch)
        seconds = time.perf_counter() - start
        if not math.isfinite(loss):
            raise FloatingPointError(f"Bayes-by-backprop diverged: loss {loss}")
        samples = _latent_draws(guide, (x, y), cfg["draws"])
    else:
        vi = NaturalGradientVI(net, method=method, init_loc_fn=net.init_strategy(x, y), **hp)
        for _ in range(cfg["iterations"]):
            vi.step(x, y, subsample_size=batch)
        seconds = time.perf_counter() - start
        samples = vi.sample_posterior(cfg["draws"])
    if not all(bool(torch.isfinite(v).all()) for v in samples.values()):
        raise FloatingPointError("non-finite posterior draws")
    return net, samples, seconds


def _hp_label(method, hp):
    if method == "bbb":
        return f"lr {hp['lr']:g}"
    text = f"lr {hp['lr']:g}, h0 {hp['hess_init']:g}"
    if hp.get("mc_samples", 1) != 1:
        text += f", mc {hp['mc_samples']}"
    if hp.get("beta2", 0.99999) != 0.99999:
        text += f", β2 {hp['beta2']:g}"
    if math.isfinite(hp.get("clip_radius", math.inf)):
        text += f", clip {hp['clip_radius']:g}"
    return text


def constant_predictor_ll(y):
    """Mean log density of standardised targets under N(0, 1): the predictive that ignores
    the inputs. A fit whose posterior predictive does worse on its own training rows has
    failed, finite or not."""
    return float(torch.distributions.Normal(0.0, 1.0).log_prob(y).mean())


def vi_tune_task(task):
    """Validation LL of one hyper-parameter setting on split 0 (-inf if it diverges)."""
    name, method, hp, cfg = task
    torch.set_num_threads(1)
    data, _, _ = standardize_split(load_uci(name, 0))
    fit, val = uci._split_rows(data.x_train.shape[0], 0, cfg["val_fraction"])
    try:
        net, samples, seconds = fit_vi(
            method, data.x_train[fit], data.y_train[fit], hp, cfg, seed=0
        )
        ll, _ = uci._evaluate(net, samples, data.x_train[val], data.y_train[val])
    except (FloatingPointError, ValueError, RuntimeError) as error:
        print(f"  tune {name} {method} {_hp_label(method, hp)}: failed ({error})", flush=True)
        ll, seconds = -math.inf, math.nan
    ll = ll if math.isfinite(ll) else -math.inf
    print(f"  tune {name} {VI[method]} {_hp_label(method, hp)}: val LL {ll:.3f}", flush=True)
    return dict(kind="tune", name=name, method=method, hp=hp, ll=ll, seconds=seconds)


def vi_run_task(task):
    """One (data set, split, VI method): fit the whole training part with the chosen setting
    (the next best if it diverges) and score the test part in original units."""
    name, split, method, settings, cfg = task
    torch.set_num_threads(1)
    data, _, y_std = standardize_split(load_uci(name, split))
    y_std = float(y_std)
    floor = constant_predictor_ll(data.y_train)
    refits = []
    for hp in settings:
        try:
            net, samples, seconds = fit_vi(
                method, data.x_train, data.y_train, hp, cfg, seed=10_000 + split
            )
            # The training rows judge the fit (never the test rows): a collapsed noise
            # precision leaves finite draws that predict worse than a constant.
            with torch.no_grad():  # the LL alone: the training rows' RMSE is not used
                train_ll = float(log_predictive_density(net, samples, data.x_train, data.y_train))
            if not train_ll > floor:
                raise FloatingPointError(
                    f"training LL {train_ll:.3f} is below the constant predictor's {floor:.3f}"
                )
            ll, err = uci._evaluate(net, samples, data.x_test, data.y_test)
        except (FloatingPointError, ValueError, RuntimeError) as error:
            print(f"  {name} split {split} {method} {_hp_label(method, hp)}: failed ({error})")
            refits.append(f"split {split}: {_hp_label(method, hp)}: {error}")
            continue
        if math.isfinite(ll):
            break
    else:
        return dict(
            kind="run",
            name=name,
            split=split,
            method=method,
            ll=math.nan,
            rmse=math.nan,
            refits=refits,
        )
    result = dict(
        kind="run",
        name=name,
        split=split,
        method=method,
        hp=hp,
        ll=ll - math.log(y_std),
        rmse=err * y_std,
        seconds=seconds,
        refits=refits,
    )
    print(
        f"  {name} split {split} {VI[method]}: test LL {result['ll']:.3f}, RMSE "
        f"{result['rmse']:.3f} ({seconds:.1f} s)",
        flush=True,
    )
    return result


def sgmcmc_run_task(task):
    """uci.py's run_task (the whole protocol of one split and sampler), relabelled."""
    name, split, key, steps, cfg = task
    result = uci.run_task((name, split, key, steps, cfg))
    return dict(
        kind="run",
        name=name,
        split=split,
        method=key,
        step=result["step"],
        ll=result["ll"],
        rmse=result["rmse"],
        seconds=result.get("chain_seconds", math.nan),
    )


class _Scheduler:
    """Worker processes fed as tasks become ready: the tuning stages of a data set submit its
    next stage (and its final runs) when they finish, so that both cores stay busy. With one
    job, the tasks run in this process, in submission order."""

    def __init__(self, jobs):
        self.pool = ProcessPoolExecutor(jobs) if jobs > 1 else None
        self.pending = {}  # future -> continuation
        self.queue = []  # (fn, task, continuation), serial mode

    def submit(self, fn, task, then=None):
        if self.pool is None:
            self.queue.append((fn, task, then))
        else:
            self.pending[self.pool.submit(fn, task)] = then

    def results(self):
        """Yield results as they come (running each one's continuation first)."""
        while self.pending or self.queue:
            if self.pool is None:
                fn, task, then = self.queue.pop(0)
                result = fn(task)
            else:
                done, _ = wait(list(self.pending), return_when=FIRST_COMPLETED)
                future = next(iter(done))
                then = self.pending.pop(future)
                result = future.result()
            if then is not None:
                then(result)
            yield result

    def close(self):
        if self.pool is not None:
            self.pool.shutdown()


def _best(results, key="ll"):
    """Settings ordered by validation LL, best first (diverged ones last); on a tie (a clip
    that never bound gives the same fit) the smaller clip radius first, as it also guards the
    runs that the validation split does not see."""
    order = sorted(results, key=lambda r: (-r[key], r["hp"].get("clip_radius", math.inf)))
    return [r["hp"] for r in order]


def uci_section(args, cfg, sgmcmc_cfg):
    names = args.datasets or (["yacht"] if args.quick else DEFAULT_DATASETS)
    datasets = list(UCI_DATASETS) if names == ["all"] else [uci._dataset_name(n) for n in names]
    num_splits = args.splits or (1 if args.quick else 20)
    steps = chosen_sgmcmc_steps(UCI_RESULTS, datasets)
    splits = {name: range(min(num_splits, uci_num_splits(name))) for name in datasets}
    tuning = {
        name: {"ivon": [], "ivon2": [], "ivon3": [], "vogn": [], "vogn2": [], "bbb": []}
        for name in datasets
    }
    choice = {}
    runs = []
    start = time.perf_counter()
    scheduler = _Scheduler(args.jobs)

    def submit_runs(name, method, settings):
        choice[name, method] = settings
        for split in splits[name]:
            scheduler.submit(vi_run_task, (name, split, method, settings, cfg))

    def stage(name, group, size, next_stage):
        def then(result):
            tuning[name][group].append(result)
            if len(tuning[name][group]) == size:
                next_stage(name)

        return then

    def after_bbb(name):
        submit_runs(name, "bbb", _best(tuning[name]["bbb"]))

    def clip_stage(name, method, group, best, next_stage):
        for radius in CLIP_MOVES:
            scheduler.submit(
                vi_tune_task,
                (name, method, {**best, "clip_radius": radius}, cfg),
                stage(name, group, len(CLIP_MOVES), next_stage),
            )

    def after_vogn(name):
        clip_stage(name, "vogn", "vogn2", _best(tuning[name]["vogn"])[0], after_vogn_clip)

    def after_vogn_clip(name):
        submit_runs(name, "vogn", _best(tuning[name]["vogn"] + tuning[name]["vogn2"]))

    def after_ivon_grid(name):
        best = _best(tuning[name]["ivon"])[0]
        for move in IVON_MOVES:
            hp = {**best, **move}
            scheduler.submit(
                vi_tune_task,
                (name, "ivon", hp, cfg),
                stage(name, "ivon2", len(IVON_MOVES), after_ivon_moves),
            )

    def after_ivon_moves(name):
        best = _best(tuning[name]["ivon"] + tuning[name]["ivon2"])[0]
        clip_stage(name, "ivon", "ivon3", best, after_ivon_clip)

    def after_ivon_clip(name):
        tuned = tuning[name]["ivon"] + tuning[name]["ivon2"] + tuning[name]["ivon3"]
        submit_runs(name, "ivon", _best(tuned))

    for name in datasets:
        for lr, h0 in IVON_GRID:
            hp = dict(IVON_DEFAULTS, lr=lr, hess_init=h0)
            scheduler.submit(
                vi_tune_task,
                (name, "ivon", hp, cfg),
                stage(name, "ivon", len(IVON_GRID), after_ivon_grid),
            )
        for hp in VOGN_GRID:
            scheduler.submit(
                vi_tune_task,
                (name, "vogn", hp, cfg),
                stage(name, "vogn", len(VOGN_GRID), after_vogn),
            )
        for lr in BBB_LRS:
            scheduler.submit(
                vi_tune_task,
                (name, "bbb", dict(lr=lr), cfg),
                stage(name, "bbb", len(BBB_LRS), after_bbb),
            )
    for name in datasets:
        for split in splits[name]:
            for key in SGMCMC:
                scheduler.submit(sgmcmc_run_task, (name, split, key, steps[name, key], sgmcmc_cfg))
    tune_seconds = {}
    for result in scheduler.results():
        if result["kind"] == "run":
            runs.append(result)
        elif math.isfinite(result["seconds"]):
            key = (result["name"], result["method"])
            tune_seconds[key] = tune_seconds.get(key, 0.0) + result["seconds"]
    scheduler.close()
    total = time.perf_counter() - start

    rows = []
    refit_notes = []
    for name in datasets:
        for method in METHODS:
            rs = [r for r in runs if r["name"] == name and r["method"] == method]
            failed = sum(not math.isfinite(r["ll"]) for r in rs)
            refit = sum(bool(r.get("refits")) and math.isfinite(r["ll"]) for r in rs)
            refit_notes.extend(
                f"{name} {METHODS[method]} {note}" for r in rs for note in r.get("refits", [])
            )
            seconds = [r["seconds"] for r in rs if math.isfinite(r.get("seconds", math.nan))]
            if method in SGMCMC:
                used = sorted({r["step"] for r in rs if r.get("step") is not None})
                setting = ", ".join(uci._step_label(method, s) for s in used) or "-"
            else:
                used = []
                for r in rs:
                    if "hp" in r and _hp_label(method, r["hp"]) not in used:
                        used.append(_hp_label(method, r["hp"]))
                setting = "; ".join(used) or "-"
            rows.append(
                [
                    name,
                    METHODS[method],
                    f"{len(rs) - failed}"
                    + (f" ({failed} failed)" if failed else "")
                    + (f" ({refit} refit)" if refit else ""),
                    uci._mean_se([r["ll"] for r in rs]),
                    uci._mean_se([r["rmse"] for r in rs]),
                    timing_spread(seconds, fmt="{:.1f}") if seconds else "-",
                    setting,
                ]
            )
    tune_rows = []
    for name in datasets:
        for method, group in (
            ("ivon", ("ivon", "ivon2", "ivon3")),
            ("vogn", ("vogn", "vogn2")),
            ("bbb", ("bbb",)),
        ):
            results = [r for g in group for r in tuning[name][g]]
            ordered = _best(results)
            lls = {_hp_label(method, r["hp"]): r["ll"] for r in results}
            tune_rows.append(
                [
                    name,
                    VI[method],
                    "; ".join(
                        f"{label}: {lls[label]:.3f}"
                        for label in (_hp_label(method, hp) for hp in ordered)
                    ),
                    f"{tune_seconds.get((name, method), 0.0):.0f}",
                ]
            )
    header = [
        "data set",
        "method",
        "splits",
        "test LL",
        "test RMSE",
        "s per run: median / mean / p90 / max",
        "setting",
    ]
    text = (
        f"## 1. UCI regression (BNN in-50-1)\n\nData sets: {', '.join(datasets)}; splits "
        f"0-{num_splits - 1} of each (fewer where a data set has fewer: "
        f"{', '.join(f'{n} {len(splits[n])}' for n in datasets if len(splits[n]) < num_splits) or 'none'}). {cfg['iterations']} steps of batch {cfg['batch']} for every "
        f"method (SG-MCMC: {sgmcmc_cfg['particles']} particles, {sgmcmc_cfg['burnin']} burn-in, a "
        f"draw every {sgmcmc_cfg['thinning']}: "
        f"{(sgmcmc_cfg['iterations'] - sgmcmc_cfg['burnin']) // sgmcmc_cfg['thinning'] * sgmcmc_cfg['particles']} "
        f"draws; VI: {cfg['draws']} posterior draws), {args.jobs} worker process(es) of one "
        f"thread; wall time of the section {total:.0f} s. Test LL and RMSE in original units, "
        "mean ± standard error over splits; s per run: median / mean / p90 / max seconds of one fit over the splits (SG-MCMC: "
        "`MCMC.run`; a worker process compiles a sampler once per data set, so one run of "
        "each carries the compilation). Setting: "
        "the VI hyper-parameters chosen on split 0's "
        "validation rows (lr, hess_init h0, mc_samples, beta2 and clip_radius where not 1, "
        "0.99999 and infinite; Adam's lr for Bayes-by-backprop), the SG-MCMC step from "
        "`results/uci_thesis_protocol.md` (SGLD in units of 1/N). A VI run whose posterior predictive scores "
        "below the constant predictor N(0, 1) on its own (standardised) training rows has "
        "failed even when finite (a collapsed noise precision): it is refitted with the next "
        "setting of the validation order, as a diverged run is, and counted as a refit "
        "(listed below the table).\n\n"
        + markdown(header, rows)
        + "\n\nRefits: "
        + ("; ".join(refit_notes) + "." if refit_notes else "none.")
        + "\n\n### Validation search (split 0: 80 % of the training part, scored on the other "
        "20 %)\n\nValidation LL of the posterior predictive (standardised units), best first; "
        "the first is the choice. IVON: the grid lr × h0 with mc 1 and β2 0.99999, then mc 4 "
        "and/or β2 0.999 from its best point, then clip radius "
        f"{' and '.join(f'{c:g}' for c in CLIP_MOVES)} from the best so far; VOGN: the same "
        "lr × h0 grid with mc 1 and β2 0.999, then the clip radii from its best point (on a "
        "tie, the smaller clip radius first); "
        f"Bayes-by-backprop: Adam's lr (AutoNormal init_scale {BBB_INIT_SCALE}). Tuning s: "
        "the seconds of the fits.\n\n"
        + markdown(["data set", "method", "validation LL by setting", "tuning s"], tune_rows)
    )
    return text, total


# -- 2. MNIST -------------------------------------------------------------------------------
def mnist_start(seed):
    """Weights N(0, 1 / (fan_in + 1)) and biases 0 (BayesianMLP.init_strategy's start)."""
    generator = torch.Generator().manual_seed(seed)
    widths = [784, 400, 400, 10]
    start = {}
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        weight = torch.randn(fan_out, fan_in, generator=generator) / math.sqrt(fan_in + 1)
        start[f"layers.{i}.weight"] = weight
        start[f"layers.{i}.bias"] = torch.zeros(fan_out)
    return start


def torch_net(start):
    net = torch.nn.Sequential(
        torch.nn.Linear(784, 400),
        torch.nn.ReLU(),
        torch.nn.Linear(400, 400),
        torch.nn.ReLU(),
        torch.nn.Linear(400, 10),
    )
    with torch.no_grad():
        for i, layer in enumerate(m for m in net if isinstance(m, torch.nn.Linear)):
            layer.weight.copy_(start[f"layers.{i}.weight"])
            layer.bias.copy_(start[f"layers.{i}.bias"])
    return net


def scores(probs, labels):
    # An average of softmaxes can exceed 1 by a rounding error (1.0000001), which
    # expected_calibration_error's value check rejects.
    probs = probs.clamp(0.0, 1.0)
    nll = -probs.clamp_min(1e-12).log().gather(1, labels[:, None]).mean()
    accuracy = (probs.argmax(1) == labels).float().mean()
    return float(accuracy), float(nll), float(expected_calibration_error(probs, labels, 15))


def _batches(num, batch, epochs, generator):
    for _ in range(epochs):
        perm = torch.randperm(num, generator=generator)
        yield from perm.split(batch)


def _evaluate_at(checkpoints, step, evaluate, scored):
    """After ``step`` steps, score the predictive if ``step`` ends a reported epoch count
    (outside the timed steps), restoring the global random state afterwards, so that the
    evaluation does not change the run."""
    if step in checkpoints:
        state = torch.get_rng_state()
        torch.manual_seed(1)
        with torch.no_grad():
            scored[checkpoints[step]] = evaluate()
        torch.set_rng_state(state)


def mnist_pyro(method, x, y, xt, yt, start, cfg, seed=0):
    """Our IVON or Bayes-by-backprop on a categorical BayesianMLP; per-step seconds and the
    test scores of the posterior predictive after each of ``cfg["checkpoints"]``."""
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    net = BayesianMLP(784, (400, 400), 10, likelihood="categorical", full_output=False)
    init = lambda site: start[site["name"]]  # noqa: E731
    if method == "ivon":
        vi = NaturalGradientVI(net, init_loc_fn=init, **cfg["ivon"])
        step_fn = vi.step

        def evaluate():
            probs, _ = predictive_moments(net, vi.sample_posterior(cfg["draws"]), xt)
            return scores(probs, yt)
    else:
        guide = AutoNormal(net, init_loc_fn=init, init_scale=BBB_INIT_SCALE)
        step_fn = SVI(net, guide, pyro.optim.Adam({"lr": cfg["bbb_lr"]}), Trace_ELBO()).step

        def evaluate():
            samples = _latent_draws(guide, (x[:1], y[:1]), cfg["draws"])
            probs, _ = predictive_moments(net, samples, xt)
            return scores(probs, yt)

    batch = min(cfg["batch"], x.shape[0])
    times, scored = [], {}
    for step in range(1, cfg["steps"] + 1):
        begin = time.perf_counter()
        loss = step_fn(x, y, subsample_size=batch)
        times.append(time.perf_counter() - begin)
        if not math.isfinite(loss):
            raise FloatingPointError(f"{method} diverged on MNIST at step {step}")
        _evaluate_at(cfg["checkpoints"], step, evaluate, scored)
    return times, scored, step_fn


def mnist_torch(method, x, y, xt, yt, start, cfg, seed=0):
    """ivon-opt's IVON or Adam (MAP) on a plain torch network: per-step seconds (the batch's
    indexing included) and the test scores after each of ``cfg["checkpoints"]``."""
    torch.manual_seed(seed)
    net = torch_net(start)
    num = x.shape[0]
    if method == "ivon-opt":
        opt = ivon.IVON(net.parameters(), ess=num, weight_decay=1.0 / num, **cfg["ivon"])
    else:
        opt = torch.optim.Adam(net.parameters(), lr=cfg["adam_lr"], weight_decay=1.0 / num)
    loss_fn = torch.nn.functional.cross_entropy

    def evaluate():
        if method == "adam":
            return scores(torch.softmax(net(xt), -1), yt)
        probs = 0.0
        for _ in range(cfg["draws"]):
            with opt.sampled_params():
                probs = probs + torch.softmax(net(xt), -1) / cfg["draws"]
        return scores(probs, yt)

    times, scored = [], {}
    batches = _batches(num, cfg["batch"], cfg["epochs"], torch.Generator().manual_seed(0))
    for step in range(1, cfg["steps"] + 1):
        begin = time.perf_counter()
        rows = next(batches)
        xb, yb = x[rows], y[rows]
        if method == "ivon-opt":
            with opt.sampled_params(train=True):
                opt.zero_grad()
                loss = loss_fn(net(xb), yb)
                loss.backward()
        else:
            opt.zero_grad()
            loss = loss_fn(net(xb), yb)
            loss.backward()
        opt.step()
        times.append(time.perf_counter() - begin)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"{method} diverged on MNIST at step {step}")
        _evaluate_at(cfg["checkpoints"], step, evaluate, scored)
    return times, scored, (opt, net, loss_fn)


def _ms_spread(times):
    return timing_spread(times, scale=1e3, fmt="{:.1f}")


def _profile(step, steps):
    """Top operators by self CPU time over ``steps`` calls of ``step``."""
    from torch.profiler import ProfilerActivity, profile

    step()  # warm
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    rows = []
    for event in events[:8]:
        rows.append(
            [
                f"`{event.key}`",
                f"{event.self_cpu_time_total / steps / 1e3:.2f}",
                f"{100 * event.self_cpu_time_total / total:.0f} %",
                f"{event.count / steps:g}",
            ]
        )
    return total / steps / 1e3, sum(e.count for e in events) / steps, rows


def _median_ms(fn, steps):
    times = []
    for _ in range(steps):
        begin = time.perf_counter()
        fn()
        times.append(time.perf_counter() - begin)
    return 1e3 * statistics.median(times)


def step_breakdown(vi, opt, net, x, y, batch, steps, adam_lr):
    """Median ms of a whole step and of its parts, unprofiled, and each one's ratio to
    Adam's step on the same network, measured here: our IVON step; the model's log density
    and gradient at one draw (``vi.potential``: the data plate's minibatch, the Pyro
    model's forward and backward); the D normals; the draw ``m + sigma eps`` and the update,
    as the step runs them (compiled for a network this size); ivon-opt's step; Adam's step;
    the forward and backward of the plain network on a batch; and the floor of any IVON
    step on this machine, that forward and backward plus the D normals."""
    num = x.shape[0]
    potential, state = vi.potential, vi.state
    dim = state.mean.shape[0]
    perturb, update = vi._step_fns()
    eps = torch.randn(1, dim)
    theta, noise = perturb(state, eps)

    def model_pass():
        potential.set_data(x, y, subsample_size=batch)
        potential.log_density_and_grad(theta, potential.draw_subsamples(theta.device))

    grad = torch.randn(1, dim)
    parts = {
        "IVON (ours): whole step": lambda: vi.step(x, y, subsample_size=batch),
        "IVON (ours): model log density + gradient (`potential`)": model_pass,
        "IVON (ours): noise draw (D normals)": lambda: torch.randn(1, dim),
        "IVON (ours): the draw m + σε": lambda: perturb(state, eps),
        "IVON (ours): update": lambda: update(state, grad, noise, None),
    }
    plain = torch_net(mnist_start(0))
    adam = torch.optim.Adam(plain.parameters(), lr=adam_lr, weight_decay=1.0 / num)

    def forward_backward():
        rows = torch.randint(0, num, (batch,))
        plain.zero_grad()
        torch.nn.functional.cross_entropy(plain(x[rows]), y[rows]).backward()

    def adam_step():
        forward_backward()
        adam.step()

    if opt is not None:

        def theirs_step():
            rows = torch.randint(0, num, (batch,))
            with opt.sampled_params(train=True):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(net(x[rows]), y[rows]).backward()
            opt.step()

        parts["IVON (`ivon-opt`): whole step"] = theirs_step
    parts["Adam (MAP): whole step"] = adam_step
    parts["plain network: forward + backward of a batch"] = forward_backward
    parts["floor of any IVON step: forward + backward, then D normals"] = lambda: (
        forward_backward(),
        torch.randn(1, dim),
    )
    medians = {}
    for label, fn in parts.items():
        fn()  # warm
        medians[label] = _median_ms(fn, steps)
    adam_ms = medians["Adam (MAP): whole step"]
    return [[label, f"{ms:.2f}", f"{ms / adam_ms:.2f}"] for label, ms in medians.items()]


#: the hold-out search of ``--mnist-tune``: IVON's (lr, hess_init), Bayes-by-backprop's and
#: Adam's Adam learning rates
MNIST_IVON_GRID = [(0.2, 1.0), (0.5, 1.0), (1.0, 1.0), (0.5, 0.3), (0.5, 3.0)]
MNIST_ADAM_LRS = (3e-4, 1e-3, 3e-3)
MNIST_BBB_LRS = (1e-3, 3e-3)


def mnist_tune(x, y, cfg, holdout):
    """
    Each method's settings by the NLL of its predictive on the last ``holdout`` training
    images after ``cfg["epochs"]`` epochs on the others (never the test images): IVON on
    ``MNIST_IVON_GRID``, Bayes-by-backprop and Adam on their learning rates. Returns the
    choices and the table's rows.
    """
    fit_x, fit_y, val_x, val_y = x[:-holdout], y[:-holdout], x[-holdout:], y[-holdout:]
    steps = cfg["epochs"] * math.ceil(fit_x.shape[0] / cfg["batch"])
    tune_cfg = dict(cfg, steps=steps, checkpoints={steps: cfg["epochs"]})
    start = mnist_start(0)
    candidates = {
        "ivon": [dict(cfg["ivon"], lr=lr, hess_init=h0) for lr, h0 in MNIST_IVON_GRID],
        "bbb": [dict(bbb_lr=lr) for lr in MNIST_BBB_LRS],
        "adam": [dict(adam_lr=lr) for lr in MNIST_ADAM_LRS],
    }
    choice, rows = {}, []
    for method, settings in candidates.items():
        scored = []
        for hp in settings:
            run_cfg = dict(tune_cfg, ivon=hp) if method == "ivon" else dict(tune_cfg, **hp)
            fn = mnist_pyro if method in ("ivon", "bbb") else mnist_torch
            began = time.perf_counter()
            try:
                _, by_epoch, _ = fn(method, fit_x, fit_y, val_x, val_y, start, run_cfg)
                accuracy, nll, ece = by_epoch[cfg["epochs"]]
            except FloatingPointError:
                accuracy = nll = ece = math.inf
            label = (
                f"lr {hp['lr']:g}, h0 {hp['hess_init']:g}"
                if method == "ivon"
                else f"lr {next(iter(hp.values())):g}"
            )
            print(
                f"  MNIST tune {method} {label}: hold-out NLL {nll:.4f} "
                f"({time.perf_counter() - began:.0f} s)",
                flush=True,
            )
            scored.append((nll, label, hp, accuracy, ece))
        scored.sort(key=lambda item: item[0])
        choice[method] = scored[0][2]
        rows.append(
            [
                {"ivon": "IVON (ours)", "bbb": "Bayes-by-backprop", "adam": "Adam (MAP)"}[method],
                "; ".join(f"{label}: {nll:.4f}" for nll, label, *_ in scored),
            ]
        )
    return choice, rows


def mnist_section(args, quick):
    x, y = load_mnist("train", flatten=True)
    xt, yt = load_mnist("test", flatten=True)
    train_size = args.mnist_train or (512 if quick else x.shape[0])
    test_size = 200 if quick else xt.shape[0]
    x, y, xt, yt = x[:train_size], y[:train_size], xt[:test_size], yt[:test_size]
    epochs = sorted(set(args.epochs or ([1] if quick else [2, 5, 10])))
    batch = 128
    steps_per_epoch = math.ceil(train_size / batch)
    cfg = dict(
        batch=batch,
        epochs=epochs[-1],
        steps=epochs[-1] * steps_per_epoch,
        checkpoints={e * steps_per_epoch: e for e in epochs},
        draws=args.mnist_draws,
        ivon=dict(
            lr=args.mnist_lr,
            hess_init=args.mnist_hess_init,
            mc_samples=1,
            beta1=0.9,
            beta2=args.mnist_beta2,
        ),
        bbb_lr=args.mnist_bbb_lr,
        adam_lr=args.mnist_adam_lr,
    )
    tune_rows = None
    if args.mnist_tune:
        holdout = max(train_size // 6, 1)
        choice, tune_rows = mnist_tune(x, y, cfg, holdout)
        cfg["ivon"], cfg["bbb_lr"], cfg["adam_lr"] = (
            choice["ivon"],
            choice["bbb"]["bbb_lr"],
            choice["adam"]["adam_lr"],
        )
    seeds = range(args.mnist_seeds or (2 if quick else 1))  # quick: the multi-seed path too
    runs_by_seed = []  # per seed: method -> (times, scores by epoch, step) or None
    for seed in seeds:
        start = mnist_start(seed)
        runs = {}
        for method in ("adam", "ivon", "ivon-opt", "bbb"):
            if method == "ivon-opt" and ivon is None:
                runs[method] = None
                continue
            began = time.perf_counter()
            fn = mnist_pyro if method in ("ivon", "bbb") else mnist_torch
            runs[method] = fn(method, x, y, xt, yt, start, cfg, seed=seed)
            times, scored, _ = runs[method]
            acc, nll, ece = scored[epochs[-1]]
            print(
                f"  MNIST seed {seed} {method} after {epochs[-1]} epoch(s): acc {acc:.4f} NLL "
                f"{nll:.4f} ECE {ece:.4f}, {1e3 * statistics.median(times):.1f} ms/step "
                f"({time.perf_counter() - began:.0f} s)",
                flush=True,
            )
        runs_by_seed.append(runs)
    # Timing, profiling and the step breakdown: the first seed's runs.
    runs = runs_by_seed[0]
    start = mnist_start(0)

    def seed_scores(method, epoch):
        """(accuracy, NLL, ECE) per seed."""
        return [r[method][1][epoch] for r in runs_by_seed]

    def mean_scores(method, epoch):
        return [statistics.fmean(v) for v in zip(*seed_scores(method, epoch))]

    def score_cell(method, epoch):
        per_seed = seed_scores(method, epoch)
        if len(per_seed) == 1:
            return " / ".join(f"{v:.4f}" for v in per_seed[0])
        return " / ".join(
            f"{statistics.fmean(v):.4f} ± {statistics.stdev(v) / math.sqrt(len(v)):.4f}"
            for v in zip(*per_seed)
        )

    labels = {
        "ivon": "IVON (ours)",
        "ivon-opt": "IVON (`ivon-opt`)",
        "bbb": "Bayes-by-backprop",
        "adam": "Adam (MAP)",
    }
    order = ("ivon", "ivon-opt", "bbb", "adam")
    adam_times = runs["adam"][0]
    score_rows, time_rows = [], []
    for method in order:
        if runs[method] is None:
            score_rows.append([labels[method]] + ["not installed"] * len(epochs))
            time_rows.append([labels[method], "not installed", "-", "-"])
            continue
        times, scored, _ = runs[method]
        score_rows.append([labels[method]] + [score_cell(method, e) for e in epochs])
        time_rows.append(
            [
                labels[method],
                _ms_spread(times),
                f"{statistics.median(times) / statistics.median(adam_times):.2f}",
                f"{statistics.fmean(times) / statistics.fmean(adam_times):.2f}",
            ]
        )
    ratio = statistics.median(runs["ivon"][0]) / statistics.median(adam_times)
    verdicts = []
    for e in epochs:
        (_, ivon_nll, ivon_ece), (_, map_nll, map_ece), (_, bbb_nll, bbb_ece) = (
            mean_scores(m, e) for m in ("ivon", "adam", "bbb")
        )
        checks = [
            ["NLL below MAP's and Bayes-by-backprop's", ivon_nll < min(map_nll, bbb_nll)],
            ["ECE below MAP's and Bayes-by-backprop's", ivon_ece < min(map_ece, bbb_ece)],
            [f"median time per step <= 1.3 × Adam's (is {ratio:.2f} ×)", ratio <= 1.3],
        ]
        met = all(ok for _, ok in checks)
        paired = ""
        if len(seeds) > 1:  # the seed-to-seed spread of the differences the target compares
            diffs = []
            for other, label in (("adam", "MAP"), ("bbb", "Bayes-by-backprop")):
                for index, metric in ((1, "NLL"), (2, "ECE")):
                    d = [
                        a[index] - b[index]
                        for a, b in zip(seed_scores("ivon", e), seed_scores(other, e))
                    ]
                    se = statistics.stdev(d) / math.sqrt(len(d))
                    diffs.append(f"{metric} − {label}'s {statistics.fmean(d):+.4f} ± {se:.4f}")
            paired = f" (IVON's, paired over {len(seeds)} seeds: " + "; ".join(diffs) + ")"
        verdicts.append(
            f"- after {e} epoch(s): **target {'met' if met else 'NOT met'}**: "
            + "; ".join(f"{what}: {'yes' if ok else 'no'}" for what, ok in checks)
            + paired
        )
    verdict = "\n".join(verdicts)
    print(verdict, flush=True)

    # Where a step's time goes: our IVON and ivon-opt's, under torch.profiler.
    profile_rows = []
    summary = []
    steps = args.profile_steps or (3 if quick else 20)
    ours_step = runs["ivon"][2]
    pieces = [("IVON (ours)", lambda: ours_step(x, y, subsample_size=min(batch, train_size)))]
    if runs["ivon-opt"] is not None:
        opt, net, loss_fn = runs["ivon-opt"][2]

        def theirs_step():
            rows = torch.randint(0, train_size, (min(batch, train_size),))
            with opt.sampled_params(train=True):
                opt.zero_grad()
                loss_fn(net(x[rows]), y[rows]).backward()
            opt.step()

        pieces.append(("IVON (`ivon-opt`)", theirs_step))
    for label, step in pieces:
        total_ms, calls, top = _profile(step, steps)
        summary.append([label, f"{total_ms:.1f}", f"{calls:.0f}"])
        profile_rows += [[label] + row for row in top]

    opt, net = (runs["ivon-opt"][2][:2]) if runs["ivon-opt"] is not None else (None, None)
    breakdown = step_breakdown(
        ours_step.__self__,
        opt,
        net,
        x,
        y,
        min(batch, train_size),
        max(steps, 5) * 5,
        cfg["adam_lr"],
    )
    used = {f"{ours_step.__self__.beta2:g}"}
    if opt is not None:
        used.add(f"{opt.param_groups[0]['beta2']:g}")
    ivon_beta2 = " / ".join(sorted(used))  # one value unless the two disagree
    params = sum(v.numel() for v in start.values())
    text = (
        f"## 2. MNIST 784-400-400-10 ({train_size} training images, {test_size} test images)\n\n"
        f"{params:,} weights, N(0, 1) priors (ess = {train_size}); {epochs[-1]} epoch(s) of "
        f"batches of {batch} ({cfg['steps']} steps) for every method, all from the same start, "
        f"scored after {', '.join(map(str, epochs))} epoch(s) along the way; "
        + (
            f"{len(seeds)} seeds (each seed: its own start and random stream, the same for "
            "every method), scores as mean ± standard error over seeds, times from seed 0; "
            if len(seeds) > 1
            else ""
        )
        + f"{torch.get_num_threads()} thread(s). IVON (both): lr {cfg['ivon']['lr']:g}, hess_init "
        f"{cfg['ivon']['hess_init']:g}, mc_samples 1, β1 0.9, β2 {ivon_beta2}, weight decay = prior "
        f"precision / ess = 1/{train_size}; Bayes-by-backprop: AutoNormal (init_scale "
        f"{BBB_INIT_SCALE}), Trace_ELBO, Adam lr {cfg['bbb_lr']:g}; Adam (MAP): lr "
        f"{cfg['adam_lr']:g}, weight_decay 1/{train_size}. Test accuracy / NLL / ECE (15 bins) "
        f"of the posterior predictive ({cfg['draws']} draws; Adam: the network's softmax).\n\n"
        + markdown(["method"] + [f"after {e} epoch(s)" for e in epochs], score_rows)
        + (
            "\n\nSettings chosen by `--mnist-tune` before these runs: the NLL of each "
            f"method's predictive on the last {max(train_size // 6, 1)} training images after "
            f"{epochs[-1]} epoch(s) on the others (the test images unused), best first.\n\n"
            + markdown(["method", "hold-out NLL by setting"], tune_rows)
            if tune_rows
            else ""
        )
        + "\n\nms per step: median / mean / p90 / max over all steps (the first included; the "
        "torch networks' times include indexing the batch, the Pyro models' their data "
        "plate's draw; evaluations are outside the timed steps); ÷ Adam: ratio of the "
        "medians and of the means.\n\n"
        + markdown(["method", "ms per step", "÷ Adam (median)", "÷ Adam (mean)"], time_rows)
        + "\n\nThe issue's target, IVON's NLL and ECE below MAP's and Bayes-by-backprop's at "
        "≤ 1.3 × Adam's time per step:\n\n"
        + verdict
        + f"\n\n### Where an IVON step's time goes (`torch.profiler`, {steps} steps, CPU)\n\n"
        "Self CPU time of all operators per step (the profiler's overhead included, so above "
        "the unprofiled times) and operator calls per step, then the top operators.\n\n"
        + markdown(["implementation", "ms per step (profiled)", "operator calls per step"], summary)
        + "\n\n"
        + markdown(
            ["implementation", "operator", "self ms per step", "share", "calls per step"],
            profile_rows,
        )
        + "\n\nUnprofiled, measured one after another in this run: median ms of a whole step "
        "and of its parts, and each one's ratio to Adam's step (the rest of our step is its "
        "bookkeeping: the loss and the finiteness check). The floor is what any IVON step "
        "on this machine must do beyond Adam's forward and backward: draw D normals (its "
        "update then makes a memory-bound pass over D parameters, as Adam's does).\n\n"
        + markdown(["part", "median ms", "÷ Adam's step"], breakdown)
    )
    return text


def main():
    parser = argument_parser(__doc__, RESULTS, quick="smoke test (< 60 s)")
    parser.add_argument(
        "--datasets",
        nargs="+",
        default=None,
        help="UCI data sets or aliases, or 'all' (default: all; quick: yacht)",
    )
    parser.add_argument(
        "--splits", type=int, default=None, help="default 20, protein's 5 (quick 1)"
    )
    parser.add_argument(
        "--iterations", type=int, default=None, help="steps of batch 100 (default 2000)"
    )
    parser.add_argument("--jobs", type=int, default=2, help="UCI worker processes (one thread)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for MNIST")
    parser.add_argument(
        "--epochs",
        type=int,
        nargs="+",
        default=None,
        help="MNIST: train for the largest, score after each (default 2 5 10; quick: 1)",
    )
    parser.add_argument("--mnist-train", type=int, default=None, help="training images")
    parser.add_argument("--mnist-draws", type=int, default=10)
    parser.add_argument(
        "--mnist-seeds",
        type=int,
        default=None,
        help="MNIST runs per method, seeds 0..N-1 (start and random stream); scores as mean ± SE "
        "(default 1; quick 2)",
    )
    parser.add_argument("--mnist-lr", type=float, default=0.5, help="IVON's lr on MNIST")
    parser.add_argument("--mnist-hess-init", type=float, default=1.0, help="IVON's h0 on MNIST")
    parser.add_argument("--mnist-beta2", type=float, default=0.99999, help="IVON's beta2")
    parser.add_argument("--mnist-bbb-lr", type=float, default=1e-3)
    parser.add_argument("--mnist-adam-lr", type=float, default=1e-3)
    parser.add_argument(
        "--mnist-tune",
        action="store_true",
        help="choose the MNIST settings on a hold-out of the training images first",
    )
    parser.add_argument("--profile-steps", type=int, default=None, help="default 20")
    parser.add_argument("--skip-uci", action="store_true")
    parser.add_argument("--skip-mnist", action="store_true")
    args = parser.parse_args()
    if args.mnist_seeds is not None and args.mnist_seeds < 1:
        parser.error(f"--mnist-seeds must be at least 1, got {args.mnist_seeds}")
    torch.set_num_threads(1)
    began = time.perf_counter()

    iterations = args.iterations or (100 if args.quick else 2000)
    cfg = dict(hidden=50, batch=100, iterations=iterations, draws=100, val_fraction=0.2)
    sgmcmc_cfg = dict(
        hidden=50,
        particles=20,
        batch=100,
        iterations=iterations,
        burnin=iterations // 2,
        thinning=10,
        val_fraction=0.2,
        jit=not args.quick,  # compiling costs more than a quick run's chain
    )
    sections = []
    uci_seconds = mnist_seconds = 0.0
    if not args.skip_uci:
        text, uci_seconds = uci_section(args, cfg, sgmcmc_cfg)
        sections.append(text)
    if not args.skip_mnist:
        torch.set_num_threads(args.threads)
        mnist_began = time.perf_counter()
        sections.append(mnist_section(args, args.quick))
        mnist_seconds = time.perf_counter() - mnist_began
    total = time.perf_counter() - began
    ivon_version = getattr(ivon, "__version__", "installed") if ivon else "not installed"
    preamble = (
        f"# Natural-gradient VI for Bayesian neural networks ({'quick' if args.quick else 'full'} run)\n\n"
        f"Command: `python benchmarks/ngvi.py {command_line_args()}`. torch {torch.__version__}, "
        f"pyro {pyro.__version__}, ivon-opt {ivon_version}; CPU ({os.cpu_count()} cores). Total "
        f"wall time {total:.0f} s (UCI {uci_seconds:.0f} s, MNIST {mnist_seconds:.0f} s). What "
        "each section measures and how: the docstring of `benchmarks/ngvi.py`."
    )
    write_report(preamble, sections, args.output)


if __name__ == "__main__":
    main()
