"""Chapter ``ara``: adversarial risk analysis defenses and security evaluation (thesis 3)."""

import functools
import time

import pyro
import torch

FIGURES = ("ara_spam", "ara_security_curves")


def run(quick=False, figures=None):
    """Thesis chapter 3: ACRA against good-word insertion; ARA training against FGSM/PGD."""
    from pyro_ext.ara import (
        ACRA,
        AdversarialTrainer,
        ARATrainer,
        BernoulliNaiveBayes,
        LangevinAttacker,
        check_security_curve,
        fgsm,
        good_word_insertion,
        pgd,
        plot_security_curves,
        security_evaluation_curve,
    )
    from pyro_ext.datasets import DatasetNotFoundError, load_mnist, load_spambase
    from pyro_ext.models import BayesianMLP

    print("== Chapter: adversarial risk analysis (thesis chapter 3) ==")
    try:
        x, y = load_spambase(binarized=True)
        x_mnist, y_mnist = load_mnist("train", flatten=True)
        x_test, y_test = load_mnist("test", flatten=True)
    except DatasetNotFoundError as error:
        print(f"  skipped: {error}")
        return
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    cut = int(0.75 * len(y))
    test = perm[cut:][: 300 if quick else None]
    nb = BernoulliNaiveBayes().fit(x[perm[:cut]], y[perm[:cut]])
    attacked = good_word_insertion(x[test], nb.predict_proba, n=2, y=y[test])
    acra = ACRA(nb, n=2, var=0.1)
    start = time.perf_counter()
    acra_labels = acra.predict(attacked)
    elapsed = time.perf_counter() - start

    def accuracy(labels):
        return float((labels == y[test]).float().mean())

    clean = accuracy(nb.predict(x[test]))
    naive_attacked = accuracy(nb.predict(attacked))
    acra_attacked = accuracy(acra_labels)
    print(f"  spam, {len(test)} test e-mails, spam attacked by 2 good-word insertions:")
    print(
        f"    naive Bayes accuracy {clean:.3f} clean, "
        f"{naive_attacked:.3f} attacked; ACRA {acra_attacked:.3f} "
        f"attacked ({1e3 * elapsed / len(test):.1f} ms per e-mail)"
    )
    print("    (reference code: 0.887 clean, 0.724 attacked, ACRA 0.904)")
    if figures is not None:
        with figures.figure("ara_spam", panel_size=(5.5, 3.8)) as ax:
            names = ["naive Bayes\nclean", "naive Bayes\nattacked", "ACRA\nattacked"]
            bars = ax.bar(names, [clean, naive_attacked, acra_attacked], color=["0.6", "C3", "C0"])
            ax.bar_label(bars, fmt="%.3f", label_type="center", color="w")
            reference = (0.887, 0.724, 0.904)
            ax.plot(names, reference, "k_", ms=30, mew=2, label="reference code")
            ax.set_ylim(0.5, 1.0)
            ax.set_ylabel("accuracy")
            ax.set_title(f"spam, {len(test)} test e-mails, 2 good-word insertions")
            ax.legend(loc="lower right", fontsize="small")

    train = 3000 if quick else 10000
    x_mnist, y_mnist = x_mnist[:train], y_mnist[:train]
    x_eval, y_eval = x_test[: 200 if quick else 500], y_test[: 200 if quick else 500]

    def mlp():
        layers = [torch.nn.Linear(784, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10)]
        return torch.nn.Sequential(*layers)

    pyro.set_rng_seed(0)
    # One short epoch: a larger learning rate than the thesis' 0.01 (as in ara_images.ipynb).
    lr = 0.05
    defenses = {"none": AdversarialTrainer(mlp(), clean_fraction=1.0, lr=lr)}
    defenses["AT"] = AdversarialTrainer(mlp(), eps=0.1, steps=10, lr=lr)
    attacker = functools.partial(
        LangevinAttacker, eps=(0.02, 0.1), steps=1, steps_rate=1.0, max_steps=5, noise_scale=0.01
    )
    net = BayesianMLP(784, (100,), 10, likelihood="categorical", full_output=False)
    defenses["ARA"] = ARATrainer(
        net, attacker, step_size=lr / train, kernel="sghmc", friction=0.5, num_particles=5
    )
    epsilons = [0.0, 0.1, 0.2]
    attacks = {
        "FGSM": fgsm,
        "PGD-20": lambda f, x, y, eps: pgd(f, x, y, eps, 20, eps / 8, restarts=1),
    }
    print(
        f"  MNIST, {train} training images, one epoch each; accuracy on {len(y_eval)} test "
        f"images at eps = {epsilons}:"
    )
    curves = {attack_name: {} for attack_name in attacks}
    for name, defense in defenses.items():
        defense.fit(x_mnist, y_mnist, epochs=1)
        rows = []
        for attack_name, attack in attacks.items():
            curve = security_evaluation_curve(
                defense.predict_logits, attack, epsilons, x_eval, y_eval
            )
            curves[attack_name][name] = curve
            flags = "" if not check_security_curve(curve) else " (check failed)"
            values = " / ".join(f"{a:.2f}" for a in curve.accuracy.tolist())
            rows.append(f"{attack_name} {values}{flags}")
        print(f"    {name:>4} ({defense.epoch_times[0]:5.1f} s per epoch): " + "; ".join(rows))
    print(
        "    (thesis figure 3.8: ARA's curves above AT's; results/ara_scalable.md has the "
        "full protocol, where PGD breaks ARA sooner than AT)"
    )
    if figures is None:
        return
    with figures.figure("ara_security_curves", 1, len(attacks), panel_size=(4.5, 3.8)) as axes:
        for ax, (attack_name, by_defense) in zip(axes, curves.items()):
            plot_security_curves(by_defense, ax=ax, marker="o", capsize=3)
            ax.set_ylim(0, 1)
            ax.set_title(attack_name)
        axes[0].figure.suptitle(
            f"MNIST security evaluation curves, {train} training images, one epoch, "
            f"{len(y_eval)} test images"
        )
