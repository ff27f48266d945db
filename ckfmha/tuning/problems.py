"""The problems file of ``python -m ckfmha tune --problems FILE``.

A JSON list of objects, or JSON Lines (one object per line; blank lines are skipped). Each
object is one problem: "kind" ("fwd" or "bwd"; a decode step is "fwd" with seqlen_q 1) and the
dispatcher's problem fields. For example::

    [{"batch": 2, "nhead_q": 32, "nhead_k": 8, "seqlen_q": 4096, "hdim": 128, "causal": true},
     {"batch": 64, "nhead_q": 32, "nhead_k": 8, "seqlen_q": 1, "seqlen_k": 8192, "hdim": 128},
     {"kind": "bwd", "batch": 2, "nhead_q": 16, "seqlen_q": 2048, "hdim": 64},
     {"nhead_q": 32, "nhead_k": 8, "seqlens_q": [700, 1500, 90], "hdim": 128, "causal": true}]

nhead_k defaults to nhead_q, seqlen_k to seqlen_q, hdim_v to hdim, dtype to "bf16", causal to
false and causal_alignment to "top_left" (ckfmha.fwd's default); null means the default too.
A varlen forward (group mode, ckfmha.fwd_varlen) gives each sequence's length instead of batch
and seqlen_q/k: "seqlens_q", and "seqlens_k" (default: seqlens_q). A bad entry is a ValueError
naming its index, the field and what the field accepts.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KINDS = ("fwd", "bwd")
DTYPES = ("bf16", "fp16", "fp32")
ALIGNMENTS = ("top_left", "bottom_right")
REQUIRED = ("batch", "nhead_q", "seqlen_q", "hdim")
# Optional sizes and the required field each defaults to.
SIZE_DEFAULTS = {"nhead_k": "nhead_q", "seqlen_k": "seqlen_q", "hdim_v": "hdim"}
VARLEN = ("seqlens_q", "seqlens_k")
ACCEPTED = ("kind", *REQUIRED, *SIZE_DEFAULTS, *VARLEN, "dtype", "causal", "causal_alignment")
FORMAT_HINT = "a problems file is a JSON list of objects, or JSON Lines: one object per line"


@dataclass(frozen=True)
class TuningProblem:
    """One problem to tune: q [batch, nhead_q, seqlen_q, hdim], k [batch, nhead_k, seqlen_k,
    hdim], v [batch, nhead_k, seqlen_k, hdim_v]; or, with seqlens_q/k (group mode), sequences
    of those lengths packed (seqlen_q/k are then the longest, batch their count)."""

    kind: str
    batch: int
    nhead_q: int
    nhead_k: int
    seqlen_q: int
    seqlen_k: int
    hdim: int
    hdim_v: int
    dtype: str = "bf16"
    causal: bool = False
    causal_alignment: str = "top_left"
    seqlens_q: tuple[int, ...] | None = None
    seqlens_k: tuple[int, ...] | None = None

    def fields(self) -> dict[str, Any]:
        """The dispatcher's keyword fields (Dispatcher.explain, ckfmha.tuning_add), and for a
        varlen problem its sequences' lengths (ckfmha.tuning.inputs.explain_fields drops them)."""
        fields = dataclasses.asdict(self)
        del fields["kind"]
        if self.seqlens_q is None:
            del fields["seqlens_q"], fields["seqlens_k"]
        else:
            fields.update(mode="group", total_q=sum(self.seqlens_q), total_k=sum(self.seqlens_k),
                          seqlens_q=list(self.seqlens_q), seqlens_k=list(self.seqlens_k))  # fmt: skip
        return fields

    @property
    def label(self) -> str:
        heads = f"h{self.nhead_q}"
        if self.nhead_k != self.nhead_q:
            heads += f"/{self.nhead_k}"
        lengths = (f"s{self.seqlen_q}" if self.seqlen_q == self.seqlen_k
                   else f"q{self.seqlen_q} k{self.seqlen_k}")  # fmt: skip
        hdims = f"d{self.hdim}" if self.hdim == self.hdim_v else f"d{self.hdim}x{self.hdim_v}"
        mask = ""
        if self.causal:
            mask = " causal" if self.causal_alignment == "top_left" else " causal bottom_right"
        if self.seqlens_q is not None and self.seqlens_k is not None:
            lengths = (f"varlen q{sum(self.seqlens_q)}/max{self.seqlen_q} "
                       f"k{sum(self.seqlens_k)}/max{self.seqlen_k}")  # fmt: skip
        return f"{self.kind} b{self.batch} {heads} {lengths} {hdims} {self.dtype}{mask}"


def _choice(where: str, entry: dict[str, Any], name: str, accepted: tuple[str, ...],
            default: str, hint: str = "") -> str:  # fmt: skip
    value = default if entry.get(name) is None else entry[name]
    if value not in accepted:
        listed = ", ".join(repr(a) for a in accepted)
        raise ValueError(f"{where}: field '{name}' is {value!r}; accepted: {listed}{hint}")
    return str(value)


def _size(where: str, entry: dict[str, Any], name: str) -> int:
    value = entry[name]
    # bool is an int subclass: true must not pass for 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: field '{name}' is {value!r}; accepted: an integer >= 1")
    return value


def _lengths(where: str, entry: dict[str, Any], name: str) -> tuple[int, ...]:
    value = entry[name]
    if not isinstance(value, list) or not value or any(
            isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in value):  # fmt: skip
        raise ValueError(f"{where}: field '{name}' is {value!r}; accepted: a non-empty list of "
                         "integers >= 1, one per sequence")  # fmt: skip
    return tuple(value)


def _varlen_sizes(where: str, entry: dict[str, Any]) -> dict[str, Any]:
    """batch, seqlen_q/k and seqlens_q/k of a varlen entry, which gives lengths, not sizes."""
    if entry.get("kind", "fwd") != "fwd":
        raise ValueError(f"{where}: seqlens_q/k describe a varlen forward; kind must be 'fwd'")
    for name in ("batch", "seqlen_q", "seqlen_k"):
        if entry.get(name) is not None:
            raise ValueError(f"{where}: field '{name}' comes from seqlens_q/k; leave it out")
    lengths_q = _lengths(where, entry, "seqlens_q")
    lengths_k = lengths_q if entry.get("seqlens_k") is None else _lengths(where, entry, "seqlens_k")
    if len(lengths_k) != len(lengths_q):
        raise ValueError(f"{where}: seqlens_q has {len(lengths_q)} sequences and seqlens_k "
                         f"{len(lengths_k)}; give one length per sequence in each")  # fmt: skip
    return {"batch": len(lengths_q), "seqlen_q": max(lengths_q), "seqlen_k": max(lengths_k),
            "seqlens_q": lengths_q, "seqlens_k": lengths_k}  # fmt: skip


def problem_from_entry(entry: Any, where: str) -> TuningProblem:
    """One problem from a decoded JSON object; `where` names the entry in errors."""
    if not isinstance(entry, dict):
        # A ValueError like every other flaw of the file, so the command reports it as one.
        got = type(entry).__name__
        raise ValueError(f"{where}: a problem is a JSON object, got {got}")  # noqa: TRY004
    unknown = [name for name in entry if name not in ACCEPTED]
    if unknown:
        raise ValueError(f"{where}: unknown field '{unknown[0]}'; accepted: {', '.join(ACCEPTED)}")
    varlen: dict[str, Any] = {}
    if entry.get("seqlens_q") is not None or entry.get("seqlens_k") is not None:
        if entry.get("seqlens_q") is None:
            raise ValueError(f"{where}: seqlens_k without seqlens_q")
        varlen = _varlen_sizes(where, entry)
        entry = {**entry, **{k: varlen[k] for k in ("batch", "seqlen_q", "seqlen_k")}}
    missing = [name for name in REQUIRED if entry.get(name) is None]
    if missing:
        raise ValueError(f"{where}: missing field '{missing[0]}' "
                         f"(required: {', '.join(REQUIRED)})")  # fmt: skip
    sizes: dict[str, Any] = {name: _size(where, entry, name) for name in REQUIRED}
    for name, fallback in SIZE_DEFAULTS.items():
        sizes[name] = sizes[fallback] if entry.get(name) is None else _size(where, entry, name)
    sizes.update({k: varlen[k] for k in VARLEN if k in varlen})
    if sizes["nhead_q"] % sizes["nhead_k"]:
        raise ValueError(f"{where}: nhead_q {sizes['nhead_q']} is not a multiple of nhead_k "
                         f"{sizes['nhead_k']} (each K/V head serves a whole group)")  # fmt: skip
    causal = False if entry.get("causal") is None else entry["causal"]
    if causal is not True and causal is not False:  # JSON true/false only, not 1 or "yes"
        raise ValueError(f"{where}: field 'causal' is {causal!r}; accepted: true, false")
    kind_hint = " (a decode step is 'fwd' with seqlen_q 1)"
    return TuningProblem(
        kind=_choice(where, entry, "kind", KINDS, "fwd", kind_hint),
        dtype=_choice(where, entry, "dtype", DTYPES, "bf16"),
        causal=causal,
        causal_alignment=_choice(where, entry, "causal_alignment", ALIGNMENTS, "top_left"),
        **sizes,
    )


def _json_lines(text: str) -> Iterator[tuple[str, Any]]:
    index = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"line {number}: not JSON ({exc.msg}); {FORMAT_HINT}") from None
        yield f"entry {index} (line {number})", entry
        index += 1


def parse_problems(text: str) -> list[TuningProblem]:
    """The problems of a JSON list or JSON Lines text, in order."""
    if text.lstrip().startswith("["):
        try:
            entries = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a JSON list: {exc}; {FORMAT_HINT}") from None
        located = [(f"entry {i}", entry) for i, entry in enumerate(entries)]
    else:
        located = list(_json_lines(text))
    if not located:
        raise ValueError(f"no problems: {FORMAT_HINT}")
    return [problem_from_entry(entry, where) for where, entry in located]


def read_problems(path: str | Path) -> list[TuningProblem]:
    """parse_problems of a file; errors name the file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read the problems file {path}: {exc.strerror}") from None
    try:
        return parse_problems(text)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
