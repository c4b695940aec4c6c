"""UCI Spambase e-mail classification data, raw and binarized."""

import csv

import numpy as np

from .utils import as_float, as_long, float_dtype, get_data_path


def load_spambase(binarized=False, device=None, dtype=None):
    """
    Load UCI Spambase: 4601 e-mails, 1813 of them spam.

    Data: UCI Spambase (Hopkins, Reeber, Forman & Suermondt, 1999), CC BY 4.0; the binarized
    copy ``uciData.csv`` is from roinaveiro/aml_bayes (MIT).

    :param bool binarized: If ``False``, return the 57 raw features of ``spambase.data`` (48
        ``word_freq``, 6 ``char_freq`` and 3 ``capital_run_length`` columns). If ``True``, return
        the 54 binary word/char indicators ``(raw > 0)`` of ``uciData.csv``.
    :param device: Device of the returned tensors.
    :type device: torch.device or str
    :param torch.dtype dtype: Floating dtype of ``x``; defaults to ``torch.get_default_dtype()``.
    :returns: A tuple ``(x, y)`` with ``x`` of shape ``(4601, 57)`` (or ``(4601, 54)``) and
        labels ``y`` of shape ``(4601,)``, ``torch.long``, 1 for spam.
    :rtype: tuple(torch.Tensor, torch.Tensor)
    """
    if not isinstance(binarized, bool):
        raise TypeError(f"binarized must be a bool, got {binarized!r}")
    dtype = float_dtype(dtype)
    if binarized:
        path = get_data_path("spam/uciData.csv", verify=True)
        with open(path, newline="") as f:
            header = next(csv.reader(f))
        if header[-1] != "spam" or len(header) != 55:
            raise ValueError(f"{path}: expected 54 feature columns and 'spam', got {header}")
        data = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
    else:
        data = np.loadtxt(get_data_path("spam/spambase.data", verify=True), delimiter=",", ndmin=2)
    return as_float(data[:, :-1], dtype, device), as_long(data[:, -1], device)
