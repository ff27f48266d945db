"""What BatchDecode and BatchPrefill share: bounds fixed at construction, plan() (host checks,
the dispatcher's decisions, the owned buffers rewritten in place) and run() over them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ckfmha import _dtypes
from ckfmha._paged import fwd_paged
from ckfmha._registry import Dispatcher
from ckfmha._streams import stream_handle
from ckfmha.device_scope import on_device
from ckfmha.errors import InvalidArgumentError
from ckfmha.page_layouts import paged_cache_dims
from ckfmha.problem import (
    KV_QUANTS,
    CausalAlignment,
    FwdProblem,
    kv_quant_code,
    page_layout_code,
    window_bounds,
)
from ckfmha.serving.buffers import StepBuffers, plan_stream, resolve_device
from ckfmha.serving.kernel_plan import KernelPlan, plan_kernels
from ckfmha.serving.page_tables import StepPages, step_pages

_INT32_MAX = 2**31 - 1
_ATTENTION_DTYPES = (_dtypes.FP16, _dtypes.BF16, _dtypes.FP32)


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, 1)


def count_arg(value: Any, name: str, minimum: int = 1) -> int:
    """An int argument in [minimum, 2^31 - 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise _invalid(f"{name} must be an integer, got {value!r}")
    if not minimum <= int(value) <= _INT32_MAX:
        raise _invalid(f"{name} must be in [{minimum}, {_INT32_MAX}], got {value}")
    return int(value)


@dataclass(frozen=True)
class Queries:
    """How a wrapper's queries enter the planned problem."""

    mode: str  # "batch" (q [batch, hq, sq, d] in ``layout``) or "group" (packed, cu_seqlens_q)
    seqlen_q: int  # batch: the queries per sequence; group: the max_seqlen_q bound
    layout: str
    total_q: int | None = None  # group: the max_total_q bound
    cu_seqlens_q: np.ndarray | None = None  # group: host offsets, checked


@dataclass(frozen=True)
class PlannedStep:
    """One plan: the problem every run() launches and what checks a run's arrays against."""

    problem: FwdProblem
    kernels: KernelPlan
    call: dict[str, Any]  # fwd_paged keyword arguments of every run()
    tokens: int  # query tokens the metadata addresses (group: q needs at least these rows)
    num_pages: int | None  # the caches' page count given to plan()


class PagedAttentionWrapper:
    """Attention over a paged K/V cache planned once per step and run as often as wanted, also
    from a captured CUDA graph (see BatchDecode and BatchPrefill)."""

    def __init__(
        self, *, max_batch: int, max_pages: int, max_seqlen_k: int, device: int | None = None
    ) -> None:
        self.max_batch = count_arg(max_batch, "max_batch")
        self.max_pages = count_arg(max_pages, "max_pages")
        self.max_seqlen_k = count_arg(max_seqlen_k, "max_seqlen_k")
        self._device = None if device is None else count_arg(device, "device", 0)
        self._buffers: StepBuffers | None = None
        self._step: PlannedStep | None = None
        # The last q and cache dtype objects seen to match the plan: later runs compare
        # identities.
        self._q_dtype: Any = None
        self._cache_dtype: Any = None

    # ---- what the last plan decided ----

    @property
    def device(self) -> int | None:
        """The CUDA device of the owned buffers (None until the first plan when not given)."""
        return self._device

    @property
    def kernel(self) -> str | None:
        """The paged kernel run() launches (None before plan())."""
        return None if self._step is None else self._step.kernels.kernel

    def explain(self) -> str:
        """The dispatcher's account of the planned problem: the plan (split count included)
        and why each kernel fits or not."""
        if self._step is None:
            raise _invalid("explain() describes a plan: call plan() first")
        return Dispatcher().explain(self._step.problem)

    @property
    def workspace_bytes(self) -> int | None:
        """Bytes of split-KV workspace the plan needs (0 for one split)."""
        return None if self._step is None else self._step.kernels.workspace_bytes

    @property
    def capture_key(self) -> tuple[Any, ...] | None:
        """What a graph captured around run() depends on besides the metadata values: equal
        keys before and after a plan() mean replaying it computes the new step."""
        step = self._step
        if step is None:
            return None
        workspace = step.call["workspace"]
        return (step.problem, step.kernels, workspace.ptr, step.call["kv_indices"].ptr)

    # ---- plan ----

    def _bound(self, got: int, bound: int, name: str, what: str) -> None:
        """``what`` (with {got}) says what exceeds the bound ``name``."""
        if got > bound:
            raise _invalid(
                f"{what.format(got=got)}, but this {type(self).__name__} was built for at "
                f"most {name}={bound}"
            )

    def _plan_step(
        self,
        queries: Queries,
        *,
        block_table: Any,
        seqlens_k: Any,
        kv_indptr: Any,
        kv_indices: Any,
        page_size: int,
        num_pages: int | None,
        stream: Any,
        **options: Any,
    ) -> None:
        """Checks everything on the host, then commits the plan to the device. ``options``:
        the problem's heads, head dim, dtype and mask (see ``_problem``)."""
        page_size = count_arg(page_size, "page_size")
        if num_pages is not None:
            num_pages = count_arg(num_pages, "num_pages", 0)
        if stream is not None:
            stream_handle(stream)  # a malformed stream raises here, before the device is used
        pages = step_pages(
            block_table=block_table,
            seqlens_k=seqlens_k,
            kv_indptr=kv_indptr,
            kv_indices=kv_indices,
            page_size=page_size,
            num_pages=num_pages,
        )
        self._check_pages(pages)
        if queries.cu_seqlens_q is not None and queries.cu_seqlens_q.size != pages.batch + 1:
            raise _invalid(
                f"cu_seqlens_q must hold batch + 1 = {pages.batch + 1} offsets (the page "
                f"tables describe {pages.batch} sequences), got {queries.cu_seqlens_q.size}"
            )
        problem = self._problem(queries, pages.batch, page_size, **options)
        self._commit(problem, queries, pages, num_pages, stream)

    def _problem(
        self,
        queries: Queries,
        batch: int,
        page_size: int,
        *,
        nhead_q: int,
        nhead_k: int,
        head_dim: int,
        dtype: Any,
        kv_dtype: Any,
        causal: bool,
        causal_alignment: CausalAlignment,
        window: tuple[int, int] | None,
        scale: float | None,
        softcap: float,
        page_layout: str,
    ) -> FwdProblem:
        """The problem every run() launches: the bounds stand for the step's lengths."""
        dtype_code = _dtypes.dtype_code(dtype)
        if dtype_code not in _ATTENTION_DTYPES:
            raise _invalid(f"dtype must be fp16, bf16 or fp32, got {dtype!r}")
        page_layout_code(page_layout)
        fp8_kv = kv_quant_code(kv_dtype, dtype) == KV_QUANTS["e4m3"]
        problem = FwdProblem(
            batch=batch,
            nhead_q=count_arg(nhead_q, "nhead_q"),
            nhead_k=count_arg(nhead_k, "nhead_k"),
            seqlen_q=queries.seqlen_q,
            seqlen_k=self.max_seqlen_k,
            hdim=count_arg(head_dim, "head_dim"),
            dtype=_dtypes.NAMES[dtype_code],
            causal=bool(causal),
            causal_alignment=causal_alignment,
            layout=queries.layout,  # type: ignore[arg-type]
            scale=None if scale is None else float(scale),
            window=None if window is None else window_bounds(window),
            softcap=float(softcap),
            mode=queries.mode,
            total_q=queries.total_q,
            paged_kv="kv_indptr",
            page_size=page_size,
            page_layout=page_layout,
            num_pages=self.max_pages,
            kv_dtype=_dtypes.NAMES[_dtypes.FP8_E4M3] if fp8_kv else None,
        )
        problem.validate()
        return problem

    def _commit(
        self,
        problem: FwdProblem,
        queries: Queries,
        pages: StepPages,
        num_pages: int | None,
        stream: Any,
    ) -> None:
        """The device part of a plan: buffers (allocated once), kernels, workspace, and the
        metadata copy, queued last so that a plan failing earlier leaves the last one intact."""
        device = resolve_device(self._device)
        with on_device(device):
            if self._buffers is None:
                self._buffers = StepBuffers(self.max_batch, self.max_pages, device)
                self._device = device
            buffers = self._buffers
            handle = plan_stream(stream, device)
            kernels = plan_kernels(problem)
            workspace = buffers.workspace_for(kernels.workspace_bytes, handle)
            buffers.upload(pages, queries.cu_seqlens_q, handle)
        views = buffers.views(pages.batch)
        call: dict[str, Any] = {
            "kv_indices": views.kv_indices,
            "kv_indptr": views.kv_indptr,
            "seqlens_k": views.seqlens_k,
            "max_seqlen_k": problem.kv_seqlen,
            "causal": problem.causal,
            "causal_alignment": problem.causal_alignment,
            "window": problem.window,
            "scale": problem.scale,
            "softcap": problem.softcap,
            "page_layout": problem.page_layout,
            "kv_dtype": problem.kv_dtype,
            "workspace": workspace,
            # The host checked the metadata; a device check would wait for the stream.
            "validate": False,
        }
        if problem.mode == "group":
            call["cu_seqlens_q"] = views.cu_seqlens_q
            call["max_seqlen_q"] = problem.seqlen_q
            assert queries.cu_seqlens_q is not None
            tokens = int(queries.cu_seqlens_q[-1])
        else:
            call["layout"] = problem.layout
            tokens = pages.batch * problem.seqlen_q
        self._step = PlannedStep(problem, kernels, call, tokens, num_pages)
        self._q_dtype = None
        self._cache_dtype = None

    def _check_pages(self, pages: StepPages) -> None:
        self._bound(
            pages.batch, self.max_batch, "max_batch", "the page tables describe {got} sequences"
        )
        self._bound(
            pages.pages_used, self.max_pages, "max_pages", "the sequences' keys use {got} pages"
        )
        if pages.batch:
            b = int(np.argmax(pages.seqlens_k))
            self._bound(
                int(pages.seqlens_k[b]),
                self.max_seqlen_k,
                "max_seqlen_k",
                f"sequence {b} has {{got}} keys",
            )

    # ---- run ----

    def _check_q_shape(self, step: PlannedStep, shape: tuple[int, ...]) -> None:
        raise NotImplementedError

    def _checked_step(self, q: Any, k_cache: Any, v_cache: Any) -> PlannedStep:
        step = self._step
        if step is None:
            raise _invalid(f"{type(self).__name__}.run() needs a plan() first")
        problem = step.problem
        self._check_q_shape(step, tuple(int(n) for n in q.shape))
        dtype = getattr(q, "dtype", None)
        if dtype is not None and dtype is not self._q_dtype:
            if _dtypes.dtype_code(dtype) != problem.dtype_code:
                raise _invalid(f"q is {dtype}, but the plan is for {problem.dtype}")
            self._q_dtype = dtype
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            self._check_cache_dtype(problem, name, getattr(cache, "dtype", None))
        pages, page_size, heads, hdim, _ = paged_cache_dims(
            tuple(int(n) for n in k_cache.shape),
            tuple(int(n) for n in v_cache.shape),
            problem.page_layout == "vectorized",
        )
        if (page_size, heads, hdim) != (problem.page_size, problem.kv_heads, problem.hdim):
            raise _invalid(
                f"the caches hold pages of {page_size} keys, {heads} heads of dim {hdim}; the "
                f"plan is for {problem.page_size} keys, {problem.kv_heads} heads of dim "
                f"{problem.hdim}"
            )
        if step.num_pages is not None and pages < step.num_pages:
            raise _invalid(
                f"the caches hold {pages} pages; the plan checked page ids against "
                f"num_pages={step.num_pages}"
            )
        return step

    def _check_cache_dtype(self, problem: FwdProblem, name: str, dtype: Any) -> None:
        """A cache holds what the plan is for: e4m3 (float8_e4m3fn or uint8 codes) when it was
        planned with kv_dtype, else q's dtype. A plan's kernels and workspace are those of its
        K/V storage, so a run over other caches would launch what was not planned."""
        if dtype is None or dtype is self._cache_dtype:
            return
        try:
            code = _dtypes.dtype_code(dtype)
        except InvalidArgumentError:
            return  # a dtype only fwd_paged can read (an anonymous CAI type): it checks
        if problem.kv_dtype is not None:
            fits = code in (_dtypes.FP8_E4M3, _dtypes.UINT8)
            planned = f"{problem.kv_dtype} caches (plan(kv_dtype={problem.kv_dtype!r}))"
        else:
            fits = code == problem.dtype_code
            planned = f"{problem.dtype} caches (plan(kv_dtype=...) plans for fp8 ones)"
        if not fits:
            raise _invalid(f"{name} is {dtype}, but the plan is for {planned}")
        self._cache_dtype = dtype

    def run(
        self,
        q: Any,
        k_cache: Any,
        v_cache: Any,
        *,
        out: Any = None,
        lse_out: Any = None,
        return_lse: bool = False,
        stream: Any = None,
        k_scale: Any = None,
        v_scale: Any = None,
    ) -> Any:
        """Attention of ``q`` over the caches with the planned metadata, through
        ``ckfmha.fwd_paged``: o, or (o, lse) with ``lse_out`` or ``return_lse``. fp8 caches
        (planned with kv_dtype) take ``k_scale``/``v_scale`` as in fwd_paged: numbers are fixed
        in a graph captured around run(), device fp32 arrays are read at every replay.

        With ``out`` (and ``lse_out`` when the LSE is wanted) it allocates nothing and waits
        for nothing, so it can be captured in a CUDA graph; run it once before capturing, as
        torch's capture rules ask, so that one-time setup (a per-device error record, lazy
        module loading) happens outside the capture. Without ``stream`` it runs on the current
        stream of q's framework (torch's, CuPy's), like fwd_paged.
        """
        step = self._checked_step(q, k_cache, v_cache)
        return fwd_paged(
            q,
            k_cache,
            v_cache,
            out=out,
            lse_out=lse_out,
            return_lse=return_lse,
            stream=stream,
            k_scale=k_scale,
            v_scale=v_scale,
            **step.call,
        )
