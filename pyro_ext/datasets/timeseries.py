"""Classic univariate time series: Mauna Loa CO2, major earthquakes and the Nile."""

import csv
from typing import NamedTuple

import numpy as np
import torch

from ..ops.validation import check_choice
from .utils import as_float, as_long, float_dtype, get_data_path


class CO2(NamedTuple):
    """Monthly Mauna Loa CO2 record returned by ``load_co2("noaa")``."""

    time: torch.Tensor
    ppm: torch.Tensor
    year: torch.Tensor
    month: torch.Tensor


def _read_columns(path):
    """Read a numeric csv file with a header row, skipping ``#`` comment lines."""
    with open(path, newline="") as f:
        rows = list(csv.reader(line for line in f if not line.startswith("#")))
    header, rows = rows[0], [row for row in rows[1:] if row]
    data = np.array(rows, dtype=np.float64).reshape(len(rows), len(header))
    return dict(zip(header, data.T))


def _load_annual(name, column, device, dtype):
    """``(years, values)`` of the annual series ``timeseries/{name}.csv``: its ``year``
    column as ``torch.long`` and its ``column`` in the floating ``dtype``."""
    dtype = float_dtype(dtype)
    columns = _read_columns(get_data_path(f"timeseries/{name}.csv", verify=True))
    return as_long(columns["year"], device), as_float(columns[column], dtype, device)


def load_co2(source="noaa", device=None, dtype=None):
    """
    Load the Mauna Loa monthly mean atmospheric CO2 concentration.

    Data: NOAA GML / Scripps (C. D. Keeling), https://gml.noaa.gov/ccgg/trends/, freely available
    to the public with credit to NOAA GML and Scripps.

    :param str source: ``"noaa"`` for the NOAA release ``co2_mm_mlo.csv`` (815 months,
        1958-03 .. 2026-01), or ``"vis"`` for the older single-column copy of vicgalle/vis
        (637 months, 1966-01 .. 2019-01, about 0.2 ppm below the current calibration).
    :param device: Device of the returned tensors.
    :type device: torch.device or str
    :param torch.dtype dtype: Floating dtype; defaults to ``torch.get_default_dtype()``.
    :returns: For ``"noaa"`` a :class:`CO2` tuple ``(time, ppm, year, month)``: the decimal date
        and the monthly ``average`` in ppm (floating), year and month (``torch.long``). For
        ``"vis"`` a tensor of shape ``(637,)``.
    :rtype: CO2 or torch.Tensor
    """
    check_choice(source, "source", ("noaa", "vis"))
    dtype = float_dtype(dtype)
    if source == "vis":
        return as_float(
            np.loadtxt(get_data_path("co2/co2_vis.csv", verify=True), ndmin=1), dtype, device
        )
    columns = _read_columns(get_data_path("timeseries/co2_mm_mlo.csv", verify=True))
    return CO2(
        time=as_float(columns["decimal date"], dtype, device),
        ppm=as_float(columns["average"], dtype, device),
        year=as_long(columns["year"], device),
        month=as_long(columns["month"], device),
    )


def load_earthquakes(device=None, dtype=None):
    """
    Load the annual counts of major (magnitude >= 7) earthquakes worldwide, 1900-2006, the
    standard overdispersed Poisson-HMM benchmark (Zucchini & MacDonald, 2009).

    Data: USGS/NEIC (public domain), as hard-coded in hmmlearn's ``plot_poisson_hmm.py``
    (BSD-3-Clause). Not downloadable: it is available only via ``$PYRO_EXT_DATA`` or the cache.

    :param device: Device of the returned tensors.
    :type device: torch.device or str
    :param torch.dtype dtype: Floating dtype of the counts; defaults to
        ``torch.get_default_dtype()``.
    :returns: A tuple ``(years, counts)`` of shape ``(107,)``; ``years`` is ``torch.long``.
    :rtype: tuple(torch.Tensor, torch.Tensor)
    """
    return _load_annual("earthquakes", "count", device, dtype)


def load_nile(device=None, dtype=None):
    """
    Load the annual flow volume of the Nile at Aswan, 1871-1970, in 10^8 m^3 (the classic
    change-point series, change near 1898; R's ``datasets::Nile``).

    Data: statsmodels ``datasets/nile`` (public domain).

    :param device: Device of the returned tensors.
    :type device: torch.device or str
    :param torch.dtype dtype: Floating dtype of the volumes; defaults to
        ``torch.get_default_dtype()``.
    :returns: A tuple ``(years, volume)`` of shape ``(100,)``; ``years`` is ``torch.long``.
    :rtype: tuple(torch.Tensor, torch.Tensor)
    """
    return _load_annual("nile", "volume", device, dtype)
