"""MNIST and Fashion-MNIST, read from the original gzipped idx files."""

import gzip

import numpy as np
import torch

from ..ops.validation import check_choice
from .utils import as_long, check_device, check_flag, float_dtype, get_data_path

_IMAGES_MAGIC = 2051
_LABELS_MAGIC = 2049
_PREFIX = {"train": "train", "test": "t10k"}

#: Class names of Fashion-MNIST, indexed by label.
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


def _prefix(split):
    return _PREFIX[check_choice(split, "split", tuple(_PREFIX))]


def _read_idx(path, magic):
    """Read a gzipped idx file of unsigned bytes, checking its magic number and size."""
    with gzip.open(path, "rb") as f:
        header = f.read(4)
        if len(header) < 4 or int.from_bytes(header, "big") != magic:
            raise ValueError(f"{path} is not an idx file with magic number {magic}")
        ndim = header[3]
        shape = tuple(int.from_bytes(f.read(4), "big") for _ in range(ndim))
        array = np.empty(shape, dtype=np.uint8)
        if f.readinto(memoryview(array).cast("B")) != array.size or f.read(1):
            raise ValueError(f"{path}: the data do not match the header shape {shape}")
    return array


def _load(folder, split, device, dtype, binarize, flatten):
    dtype = float_dtype(dtype)
    check_device(device)
    check_flag(binarize, "binarize")
    check_flag(flatten, "flatten")
    prefix = _prefix(split)
    images = _read_idx(
        get_data_path(f"{folder}/{prefix}-images-idx3-ubyte.gz", verify=True), _IMAGES_MAGIC
    )
    labels = _read_idx(
        get_data_path(f"{folder}/{prefix}-labels-idx1-ubyte.gz", verify=True), _LABELS_MAGIC
    )
    if images.shape[1:] != (28, 28) or len(images) != len(labels):
        raise ValueError(f"{folder} {split}: got images {images.shape}, labels {labels.shape}")
    x = torch.from_numpy(images).to(device)
    x = (x >= 128).to(dtype) if binarize else x.to(dtype).div_(255)
    if flatten:
        x = x.reshape(len(x), 784)
    return x, as_long(labels, device)


def load_mnist(split="train", device=None, dtype=None, binarize=False, flatten=False):
    """
    Load the MNIST handwritten digits (60000 train, 10000 test images of 28x28 pixels).

    Data: Y. LeCun & C. Cortes, http://yann.lecun.com/exdb/mnist/ (usually distributed under
    CC BY-SA 3.0); downloaded from the PyTorch mirror ``ossci-datasets.s3.amazonaws.com``.

    :param str split: ``"train"`` or ``"test"``.
    :param device: Device of the returned tensors.
    :type device: torch.device or str
    :param torch.dtype dtype: Floating dtype of the images; defaults to
        ``torch.get_default_dtype()``.
    :param bool binarize: Threshold the intensities at 0.5 (pixel value >= 128 becomes 1).
    :param bool flatten: Return images of shape ``(n, 784)`` instead of ``(n, 28, 28)``.
    :returns: A tuple ``(images, labels)``: intensities in ``[0, 1]`` (or ``{0, 1}``) and
        ``torch.long`` digit labels of shape ``(n,)``.
    :rtype: tuple(torch.Tensor, torch.Tensor)
    """
    return _load("mnist", split, device, dtype, binarize, flatten)


def load_fashion_mnist(split="train", device=None, dtype=None, binarize=False, flatten=False):
    """
    Load Fashion-MNIST (60000 train, 10000 test 28x28 images of 10 kinds of clothing, see
    :data:`FASHION_MNIST_CLASSES`). Same interface as :func:`load_mnist`.

    Data: Zalando Research, https://github.com/zalandoresearch/fashion-mnist, MIT license. The
    images are not part of the shared data folder; they are downloaded (and checked against the
    official md5 sums) on first use, or must be placed in ``$PYRO_EXT_DATA/fashion-mnist/``.

    :param str split: ``"train"`` or ``"test"``.
    :param device: Device of the returned tensors.
    :type device: torch.device or str
    :param torch.dtype dtype: Floating dtype of the images; defaults to
        ``torch.get_default_dtype()``.
    :param bool binarize: Threshold the intensities at 0.5 (pixel value >= 128 becomes 1).
    :param bool flatten: Return images of shape ``(n, 784)`` instead of ``(n, 28, 28)``.
    :returns: A tuple ``(images, labels)`` as for :func:`load_mnist`.
    :rtype: tuple(torch.Tensor, torch.Tensor)
    """
    return _load("fashion-mnist", split, device, dtype, binarize, flatten)


def load_fashion_mnist_labels(split="train", device=None):
    """
    Load only the Fashion-MNIST labels (available without the images).

    Data: Zalando Research, https://github.com/zalandoresearch/fashion-mnist, MIT license.

    :param str split: ``"train"`` or ``"test"``.
    :param device: Device of the returned tensor.
    :type device: torch.device or str
    :returns: ``torch.long`` labels of shape ``(60000,)`` or ``(10000,)``, 6000 (resp. 1000) per
        class.
    :rtype: torch.Tensor
    """
    path = get_data_path(f"fashion-mnist/{_prefix(split)}-labels-idx1-ubyte.gz", verify=True)
    return as_long(_read_idx(path, _LABELS_MAGIC), device)
