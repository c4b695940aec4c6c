"""What the demo's chapters share: the folder of figures, and the BNN chapters' scores."""

import math
from contextlib import contextmanager
from pathlib import Path

import pyro.util
import torch

DEFAULT_FOLDER = "pyro_ext_demo_figures"
INSTALL_HINT = 'pip install "pyro-ext[demo]"'


class Figures:
    """
    The folder the chapters write their PNG figures to.

    matplotlib is the demo extra's dependency, imported here and nowhere else at the demo's
    import: constructing a ``Figures`` without it raises ``ImportError``. The figures are
    drawn on matplotlib's Agg canvas without pyplot, so no window opens and no global backend
    changes.

    :param folder: created if missing; files of the same names are overwritten.
    """

    def __init__(self, folder):
        from matplotlib.figure import Figure

        self._figure = Figure
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.written = []

    @contextmanager
    def figure(self, name, nrows=1, ncols=1, panel_size=(5.0, 3.6), **subplot_kw):
        """
        Yields the axes of a new ``nrows x ncols`` figure (one ``Axes`` for one panel, else
        a flat list) and writes it to ``<folder>/<name>.png`` when the block ends.

        The random number generators are restored on leaving the block, so what the block
        computes for its plot (predictive draws, say) leaves the chapter's numbers as they
        are without figures.
        """
        state = pyro.util.get_rng_state()
        try:
            width, height = panel_size
            fig = self._figure(figsize=(width * ncols, height * nrows), layout="constrained")
            axes = fig.subplots(nrows, ncols, squeeze=False, subplot_kw=subplot_kw or None)
            axes = axes.ravel().tolist()
            yield axes[0] if len(axes) == 1 else axes
            path = self.folder / f"{name}.png"
            fig.savefig(path, dpi=100)
            self.written.append(path)
        finally:
            pyro.util.set_rng_state(state)


def print_bnn_scores(name, net, samples, data, y_std, timing):
    """Test RMSE and log-likelihood of posterior draws, in the targets' original units."""
    from pyro_ext.models import log_predictive_density, rmse

    with torch.no_grad():
        ll = float(log_predictive_density(net, samples, data.x_test, data.y_test))
        err = float(rmse(net, samples, data.x_test, data.y_test))
    print(
        f"    {name:8s} test RMSE {err * float(y_std):.2f}  test LL "
        f"{ll - math.log(float(y_std)):6.2f}  ({timing})"
    )


def plot_bnn_predictive(figures, name, title, fits, data, y_mean, y_std):
    """
    Predicted against observed test targets, original units, one panel per fit: the
    posterior predictive mean with +-2 sd bars (observation noise included).

    :param dict fits: label -> ``(net, samples)``.
    """
    from pyro_ext.models import predictive_moments

    with figures.figure(name, 1, len(fits), panel_size=(3.6, 3.6)) as axes:
        observed = data.y_test.reshape(-1) * y_std + y_mean
        low, high = float(observed.min()), float(observed.max())
        for ax, (label, (net, samples)) in zip(axes, fits.items()):
            with torch.no_grad():
                mean, sd = predictive_moments(net, samples, data.x_test)
            mean = mean.reshape(-1) * y_std + y_mean
            sd = sd.reshape(-1) * y_std
            ax.errorbar(observed, mean, yerr=2 * sd, fmt="o", ms=3, alpha=0.7, capsize=2)
            ax.plot([low, high], [low, high], "k--", lw=1)
            ax.set_title(label)
            ax.set_xlabel("observed")
        axes[0].set_ylabel("predicted (mean +- 2 sd)")
        axes[0].figure.suptitle(title)
