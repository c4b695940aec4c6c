"""Whether tensors are being traced rather than computed on."""

import torch

__all__ = ["is_traced"]


def is_traced() -> bool:
    """
    Whether a trace is running: :func:`torch.compile`, a :mod:`torch.func` transform, or
    any torch dispatch mode (:func:`~torch.fx.experimental.proxy_tensor.make_fx`, fake
    tensors). Code that reads tensors' values outside torch (numpy kernels) or calls
    eager-only APIs (:mod:`torch.distributed`'s work handles) must stand aside then: a
    trace would keep its result as a constant, or fail.

    >>> import torch
    >>> from pyro_ext.ops import is_traced
    >>> is_traced()
    False
    >>> torch.func.vmap(lambda x: torch.tensor(is_traced()))(torch.zeros(2)).tolist()
    [True, True]
    """
    return (
        torch.compiler.is_compiling()
        or torch._C._functorch.peek_interpreter_stack() is not None
        or torch._C._len_torch_dispatch_stack() > 0
    )
