"""Which torch calls may run ckfmha without the op dispatcher.

``torch.ops.ckfmha.fwd`` and its siblings exist for whatever traces or intercepts a call:
torch.compile, export, FakeTensor, dispatch and function modes, functorch transforms. They
see the op, its fake implementation and its registered autograd. In plain eager code nothing
does, and the dispatcher's round trip costs host time: the op's 20 arguments go into C++
values and back to Python objects before its implementation runs (about 13 us a call on a
CPU-only probe, as much as ``ckfmha.fwd``'s own cached path takes). A call that nothing can
see takes the eager route: ``ckfmha.torch.attention`` calls the op's implementation itself,
with the same arguments and results, and its gradient Function does the same for the
backward.
"""

from __future__ import annotations

import torch

_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def nothing_intercepts() -> bool:
    """Whether no tracer, mode or transform is active: not under torch.compile (or compiled
    autograd), no dispatch mode (FakeTensorMode, functionalisation, make_fx), no function mode
    (a ``torch.device`` context among them)."""
    return not (torch.compiler.is_compiling() or _dispatch_modes() or _function_modes())


def _plain(t: torch.Tensor) -> bool:
    """A ``torch.Tensor`` itself: not a subclass (FakeTensor, DTensor), not wrapped by a
    functorch transform (vmap, grad)."""
    return type(t) is torch.Tensor and not _functorch_wrapped(t)


def untraced(q: torch.Tensor, *others: torch.Tensor | None) -> bool:
    """Whether nothing but eager autograd sees a call over ``q`` and ``others``: nothing
    intercepts, every tensor is plain, and q is on a CUDA device, where the dispatcher would
    have sent the op."""
    if not (nothing_intercepts() and _plain(q) and q.is_cuda):
        return False
    return all(t is None or _plain(t) for t in others)
