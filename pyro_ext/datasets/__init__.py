"""
Loaders for the public datasets used in tests, tutorials and benchmarks.

Files are found with :func:`get_data_path`: under ``$PYRO_EXT_DATA``, then in the user cache
(``$XDG_CACHE_HOME/pyro_ext`` or ``~/.cache/pyro_ext``), else downloaded from their canonical
public URL into the cache and checked against their published checksum. All loaders return
tensors on the requested ``device`` with a floating ``dtype`` (default
``torch.get_default_dtype()``); integer labels are ``torch.long``.

Example: split 0 of the UCI yacht data, as the thesis' regression benchmarks use it:

>>> from pyro_ext.datasets import load_uci
>>> data = load_uci("yacht")
>>> data.x_train.shape, data.y_train.shape, data.x_test.shape
(torch.Size([277, 6]), torch.Size([277]), torch.Size([31, 6]))
"""

from .marketing import MarketingMix, load_marketing_mix, load_prophet_holidays
from .mnist import (
    FASHION_MNIST_CLASSES,
    load_fashion_mnist,
    load_fashion_mnist_labels,
    load_mnist,
)
from .spambase import load_spambase
from .timeseries import CO2, load_co2, load_earthquakes, load_nile
from .uci import UCI_DATASETS, UCISplit, load_uci, standardize_split, uci_num_splits
from .utils import DatasetChecksumError, DatasetNotFoundError, cache_dir, get_data_path

__all__ = [
    "CO2",
    "DatasetChecksumError",
    "DatasetNotFoundError",
    "FASHION_MNIST_CLASSES",
    "MarketingMix",
    "UCISplit",
    "UCI_DATASETS",
    "cache_dir",
    "get_data_path",
    "load_co2",
    "load_earthquakes",
    "load_fashion_mnist",
    "load_fashion_mnist_labels",
    "load_marketing_mix",
    "load_mnist",
    "load_nile",
    "load_prophet_holidays",
    "load_spambase",
    "load_uci",
    "standardize_split",
    "uci_num_splits",
]
