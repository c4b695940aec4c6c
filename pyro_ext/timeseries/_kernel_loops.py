"""What the numba kernels of :mod:`._hmm_kernels` and :mod:`._kalman_kernels` share: the
compile options and the array copies and fills, written as explicit loops (numba's slice
assignments and array expressions cost seconds each to compile). Imported only when numba
is installed."""

import numba

# Reassociation lets LLVM vectorise the inner products; no flag assumes finite values, so
# the -inf of impossible states and NaN of missing values keep their meaning.
jit = numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})


@jit
def copy_vector(src, dst):
    for i in range(src.shape[0]):
        dst[i] = src[i]


@jit
def copy_matrix(src, dst):
    for i in range(src.shape[0]):
        for j in range(src.shape[1]):
            dst[i, j] = src[i, j]


@jit
def fill(x, value):
    """Set every entry of the C-ordered array ``x`` to ``value``."""
    flat = x.reshape(x.size)
    for i in range(flat.shape[0]):
        flat[i] = value
