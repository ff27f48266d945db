"""BatchDecode: decode steps over a paged K/V cache, planned on the host once per step and run
(or replayed from a CUDA graph) without host work."""

from __future__ import annotations

from typing import Any

from ckfmha.errors import InvalidArgumentError
from ckfmha.problem import CausalAlignment, Layout, layout_code
from ckfmha.serving.wrapper import PagedAttentionWrapper, PlannedStep, Queries, count_arg


class BatchDecode(PagedAttentionWrapper):
    """Decode attention (a few new query tokens per sequence) over a paged K/V cache.

    ``BatchDecode(max_batch=..., max_pages=..., max_seqlen_k=..., device=None)`` fixes the
    bounds every plan stays within: at most ``max_batch`` sequences, ``max_pages`` page ids
    used by one step's sequences together (the capacity of the page-id buffer it owns) and
    ``max_seqlen_k`` keys per sequence. The kernels are planned for ``max_seqlen_k`` keys
    whatever a step's lengths are (the split count depends on it), so a graph captured once
    stays correct while the lengths grow up to the bound. ``device`` (default: the current one
    at the first plan) holds the buffers. Nothing is allocated before the first plan().

    Each step: ``plan(...)`` with the step's host metadata, then ``run(q, k_cache, v_cache,
    out=...)``, or a replay of a CUDA graph captured around an earlier run()::

        decode = ckfmha.serving.BatchDecode(max_batch=64, max_pages=65536, max_seqlen_k=32768)
        decode.plan(block_table=table, seqlens_k=lens, nhead_q=32, nhead_k=8, head_dim=128,
                    page_size=16, dtype="bf16")
        decode.run(q, k_cache, v_cache, out=o)            # warm-up, outside the capture
        with torch.cuda.graph(graph):
            decode.run(q, k_cache, v_cache, out=o)
        # next step: new lengths and pages
        decode.plan(block_table=table2, seqlens_k=lens2, nhead_q=32, nhead_k=8, head_dim=128,
                    page_size=16, dtype="bf16")
        graph.replay()

    Between a capture and a replay, plan() may change the key counts (within max_seqlen_k),
    the page ids and the page tables' shape and contents (within max_pages: a block table of
    any width, or kv_indptr/kv_indices), and the values in q and the caches may change. A new
    capture is needed when anything else changes: the batch, nhead_q, nhead_k, head_dim,
    seqlen_q, layout, page size or layout, dtype or kv_dtype, mask (causal, window, alignment),
    scale or softcap (``capture_key`` then changes), or the arrays run() was given (their
    addresses are in the graph), number k_scale/v_scale included (device scale arrays are read
    at each replay).
    """

    def plan(
        self,
        *,
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
        seqlen_q: int = 1,
        layout: Layout = "bhsd",
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
        into the owned device buffers, queued on ``stream`` after whatever runs there (a replay
        in flight reads the previous step's metadata to its end).

        Pages: a vLLM ``block_table`` [batch, pages per sequence] with ``seqlens_k`` [batch], or
        SGLang's ``kv_indptr`` [batch + 1] and ``kv_indices`` (``seqlens_k`` optional: default
        every key of the pages); NumPy arrays, lists or CPU tensors. ``num_pages``, the caches'
        page count, lets the host check every page id used (else only that none is negative;
        the kernels bound the rest). ``kv_dtype="fp8_e4m3"`` plans for fp8 caches
        (float8_e4m3fn, or uint8 codes) with q in ``dtype`` (fp16 or bf16); their scales go to
        run(). Queries: q [batch, nhead_q, seqlen_q, head_dim]
        ("bhsd"), or [batch, seqlen_q, nhead_q, head_dim] with ``layout="bshd"``. The mask
        defaults to causal with the last query on the last key (bottom-right); ``window``
        (left, right) replaces it (pass ``causal=False``). ``stream``: the stream run() and the
        replays use; default torch's current stream once torch has set up CUDA, else CuPy's
        current one once CuPy is loaded, else the legacy default stream.

        InvalidArgumentError names the argument and, for metadata past a bound, the bound
        ("built for at most max_seqlen_k=..."), before anything reaches the device.
        """
        layout_code(layout)  # an unknown layout raises here
        self._plan_step(
            Queries(mode="batch", seqlen_q=count_arg(seqlen_q, "seqlen_q"), layout=layout),
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
        if p.layout == "bshd":
            planned = (p.batch, p.seqlen_q, p.nhead_q, p.hdim)
        else:
            planned = (p.batch, p.nhead_q, p.seqlen_q, p.hdim)
        if shape != planned:
            raise InvalidArgumentError(
                f"q has shape {shape}; the plan is for {planned} ({p.layout})", 1
            )
