"""BatchPrefill: ragged query blocks (prefills, chunked prefills, speculative tokens) over a
paged K/V cache, planned on the host once per step and run (or replayed from a CUDA graph)
without host work."""

from __future__ import annotations

from typing import Any

import numpy as np

from ckfmha.errors import InvalidArgumentError
from ckfmha.metadata_checks import check_offsets
from ckfmha.problem import CausalAlignment
from ckfmha.serving.page_tables import host_ints
from ckfmha.serving.wrapper import PagedAttentionWrapper, PlannedStep, Queries, count_arg

_INT32_MAX = 2**31 - 1


class BatchPrefill(PagedAttentionWrapper):
    """Attention of ragged query blocks, packed as q [total_q, nhead_q, head_dim] with
    ``cu_seqlens_q`` offsets, over a paged K/V cache (batch_prefill kernels).

    ``BatchPrefill(max_batch=..., max_pages=..., max_seqlen_k=..., max_seqlen_q=...,
    max_total_q=..., device=None)`` fixes the bounds every plan stays within: sequences, page
    ids used by one step together, keys per sequence, queries per sequence and query tokens of
    a step. The kernels are planned for max_seqlen_q queries and max_seqlen_k keys per
    sequence whatever a step's lengths are, so a graph captured once stays correct as they
    vary within the bounds. q and out may hold more rows than a step's tokens (a buffer of
    max_total_q rows, say): rows past ``cu_seqlens_q[-1]`` are neither read nor written.

    Each step: ``plan(cu_seqlens_q=..., ...)`` with the host metadata, then ``run(q, k_cache,
    v_cache, out=...)`` or a replay of a graph captured around an earlier run() (see
    BatchDecode for the pattern). Between a capture and a replay, plan() may change the query
    offsets (within max_seqlen_q and max_total_q), the key counts (within max_seqlen_k), the
    page ids and the page tables (within max_pages), and the values in q and the caches may
    change. A new capture is needed when the batch, nhead_q, nhead_k, head_dim, page size or
    layout, dtype or kv_dtype, mask, scale or softcap change (``capture_key`` then changes), or
    the arrays run() was given (number k_scale/v_scale included).
    """

    def __init__(
        self,
        *,
        max_batch: int,
        max_pages: int,
        max_seqlen_k: int,
        max_seqlen_q: int,
        max_total_q: int,
        device: int | None = None,
    ) -> None:
        super().__init__(
            max_batch=max_batch, max_pages=max_pages, max_seqlen_k=max_seqlen_k, device=device
        )
        self.max_seqlen_q = count_arg(max_seqlen_q, "max_seqlen_q")
        self.max_total_q = count_arg(max_total_q, "max_total_q")

    def plan(
        self,
        *,
        cu_seqlens_q: Any,
        seqlens_k: Any = None,
        block_table: Any = None,
        kv_indptr: Any = None,
        kv_indices: Any = None,
        nhead_q: int,
        nhead_k: int,
        head_dim: int,
        page_size: int,
        dtype: Any = "bf16",
        kv_dtype: Any = None,
        causal: bool = True,
        causal_alignment: CausalAlignment = "bottom_right",
        window: tuple[int, int] | None = None,
        scale: float | None = None,
        softcap: float = 0.0,
        page_layout: str = "linear",
        num_pages: int | None = None,
        stream: Any = None,
    ) -> None:
        """Checks one step's metadata on the host, picks the kernels and copies the metadata
        into the owned device buffers, queued on ``stream`` after whatever runs there.

        ``cu_seqlens_q`` [batch + 1]: sequence b's queries are q rows cu_seqlens_q[b] ..
        cu_seqlens_q[b + 1] - 1. Pages, ``num_pages``, ``kv_dtype``, the mask and ``stream`` as
        in BatchDecode.plan; causal bottom-right (the default) puts each sequence's last query on
        its last key, what a prefill after a cached prefix wants. InvalidArgumentError names
        the argument and, for metadata past a bound, the bound, before anything reaches the
        device.
        """
        offsets = host_ints(cu_seqlens_q, "cu_seqlens_q", 1)
        if offsets.size < 1:
            raise InvalidArgumentError("cu_seqlens_q must hold batch + 1 >= 1 offsets", 1)
        lengths = check_offsets(offsets, "cu_seqlens_q", _INT32_MAX, "q")
        self._bound(
            int(offsets[-1]),
            self.max_total_q,
            "max_total_q",
            f"cu_seqlens_q[{offsets.size - 1}] = {{got}} query tokens",
        )
        if lengths.size:
            b = int(np.argmax(lengths))
            self._bound(
                int(lengths[b]),
                self.max_seqlen_q,
                "max_seqlen_q",
                f"sequence {b} has {{got}} queries",
            )
        self._plan_step(
            Queries(
                mode="group",
                seqlen_q=self.max_seqlen_q,
                layout="bshd",
                total_q=self.max_total_q,
                cu_seqlens_q=offsets,
            ),
            block_table=block_table,
            seqlens_k=seqlens_k,
            kv_indptr=kv_indptr,
            kv_indices=kv_indices,
            nhead_q=nhead_q,
            nhead_k=nhead_k,
            head_dim=head_dim,
            page_size=page_size,
            dtype=dtype,
            kv_dtype=kv_dtype,
            causal=causal,
            causal_alignment=causal_alignment,
            window=window,
            scale=scale,
            softcap=softcap,
            page_layout=page_layout,
            num_pages=num_pages,
            stream=stream,
        )

    def _check_q_shape(self, step: PlannedStep, shape: tuple[int, ...]) -> None:
        p = step.problem
        if len(shape) != 3 or shape[1:] != (p.nhead_q, p.hdim) or shape[0] < step.tokens:
            raise InvalidArgumentError(
                f"q has shape {shape}; the plan is for [at least {step.tokens}, {p.nhead_q}, "
                f"{p.hdim}] (packed tokens, heads, head dim)",
                1,
            )
