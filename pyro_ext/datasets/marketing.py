"""Marketing-mix-model (MMM) example datasets and Robyn's holiday table."""

import csv
import datetime
from typing import NamedTuple

import numpy as np
import torch

from ..ops.validation import check_choice
from .utils import as_float, float_dtype, get_data_path


class MarketingMix(NamedTuple):
    """A weekly marketing-mix dataset returned by :func:`load_marketing_mix`."""

    dates: list
    columns: list
    values: torch.Tensor


class _Spec(NamedTuple):
    path: str
    date_column: str
    date_format: str
    one_hot: tuple = ()
    drop: tuple = ()


_SPECS = {
    "robyn": _Spec("mmm/dt_simulated_weekly.csv", "DATE", "%Y-%m-%d", one_hot=("events",)),
    "pymc": _Spec("mmm/mmm_example.csv", "date_week", "%Y-%m-%d"),
    "pymc_roas": _Spec("mmm/mmm_roas_data.csv", "date", "%Y-%m-%d", drop=("quarter",)),
    "iclaims": _Spec("mmm/iclaims_example.csv", "week", "%m/%d/%y"),
}
_MISSING = "na"


def load_marketing_mix(name="robyn", device=None, dtype=None):
    """
    Load a weekly marketing-mix-model example dataset.

    Data and licenses:

    - ``"robyn"``: Meta Robyn's simulated ``dt_simulated_weekly`` (208 weeks from 2015-11-23),
      facebookexperimental/Robyn, MIT.
    - ``"pymc"``: PyMC-Marketing's ``mmm_example.csv`` (179 weeks from 2018-04-02), Apache-2.0.
    - ``"pymc_roas"``: PyMC-Marketing's ROAS / unobserved-confounder simulation
      ``mmm_roas_data.csv`` (131 weeks from 2021-10-02) with all latent components, so the
      ground truth is known, e.g. ``y = 100 * (trend + seasonality + z + epsilon + x1_effect +
      x2_effect)``; Apache-2.0.
    - ``"iclaims"``: Uber Orbit's ``iclaims_example.csv``, weekly US initial unemployment claims
      with Google Trends, S&P 500 and VIX regressors (575 weeks from 2010-01-03), full and
      untransformed; Apache-2.0.

    Text columns: Robyn's ``events`` (``"na"``, ``"event1"`` or ``"event2"``) is replaced, in
    place, by one 0/1 column per event named after it (``event1``, ``event2``); the
    ``quarter`` column of ``"pymc_roas"`` (e.g. ``"2021Q4"``) is dropped as it follows from the
    date. Every other column is numeric and kept in file order.

    :param str name: ``"robyn"``, ``"pymc"``, ``"pymc_roas"`` or ``"iclaims"``.
    :param device: Device of the returned tensor.
    :type device: torch.device or str
    :param torch.dtype dtype: Floating dtype; defaults to ``torch.get_default_dtype()``.
    :returns: ``MarketingMix(dates, columns, values)``: ISO ``YYYY-MM-DD`` date strings, the
        names of the value columns, and a ``(num_weeks, len(columns))`` tensor.
    :rtype: MarketingMix
    """
    check_choice(name, "name", tuple(_SPECS))
    dtype = float_dtype(dtype)
    spec = _SPECS[name]
    with open(get_data_path(spec.path, verify=True), newline="", encoding="utf-8") as f:
        header, *rows = [row for row in csv.reader(f) if row]
    table = dict(zip(header, zip(*rows)))
    dates = [
        datetime.datetime.strptime(d, spec.date_format).date().isoformat()
        for d in table[spec.date_column]
    ]
    columns, values = [], []
    for column in header:
        if column == spec.date_column or column in spec.drop:
            continue
        if column in spec.one_hot:
            for level in sorted(set(table[column]) - {_MISSING}):
                columns.append(level)
                values.append([float(v == level) for v in table[column]])
        else:
            columns.append(column)
            values.append(table[column])
    values = np.array(values, dtype=np.float64).T
    return MarketingMix(dates, columns, as_float(values, dtype, device))


def load_prophet_holidays(country=None):
    """
    Load Robyn's holiday table ``dt_prophet_holidays`` (Prophet's default holidays of 123
    countries, 1995-2044), for use as MMM holiday regressors.

    Data: facebookexperimental/Robyn, MIT; the dates come from Prophet / the ``holidays``
    package.

    :param str country: ISO 3166 alpha-2 code (e.g. ``"US"``) to keep only that country's
        holidays, or ``None`` for all.
    :returns: A list of ``(date, holiday, country)`` string tuples, dates in ISO format, in file
        order.
    :rtype: list
    """
    if country is not None and not isinstance(country, str):
        raise TypeError(
            f"country must be None or an ISO alpha-2 code such as 'US', got "
            f"{type(country).__name__}"
        )
    with open(
        get_data_path("mmm/dt_prophet_holidays.csv", verify=True), newline="", encoding="utf-8"
    ) as f:
        reader = csv.reader(f)
        header = next(reader)
        ds, holiday, code = (header.index(c) for c in ("ds", "holiday", "country"))
        table = [(row[ds], row[holiday], row[code]) for row in reader]
    if country is None:
        return table
    selected = [row for row in table if row[2] == country]
    if not selected:
        raise ValueError(
            f"country must be an ISO alpha-2 code in the table, e.g. 'US', got {country!r}"
        )
    return selected
