"""Who picks automatic plans: the hand rules, the learned cost model, or the tuning table.

``set_selection(mode)`` and the ``selection(mode)`` context manager set the process's mode
(one for all threads, so torch's autograd workers plan the backward as the caller's thread
does; it starts as $CKFMHA_SELECTION names, else "heuristic"):

- "heuristic": the hand-written rules.
- "learned": the cost model shipped in ckfmha/data (trained on an H100 from the selection
  oracle's timings, benchmarks/train_selection.py) predicts each candidate plan's time as a
  multiple of the hand rules' plan's, and the fastest wins, unless the hand rules' plan is
  predicted within the model's margin. It covers fp16/bf16 forward plans in batch and group
  (varlen) mode and the backward main stage on sm_90; elsewhere (paged K/V, fp32) the hand
  rules decide. ``Dispatcher.explain`` lists the predictions. A second model
  (benchmarks/train_conv_selection.py) ranks each convolution pass's kernels at the widest
  channel vector and backward-weight's split counts; ``conv_explain`` lists its predictions.
- "tuned": the plan ``python -m ckfmha tune`` timed for this exact problem on this GPU (the
  table in ``default_tuning_path()``, or one given to ``load_tuning``); other problems, and
  every convolution, as "learned".

The model and the default table load on the first switch to a mode that uses them.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ckfmha import _cache
from ckfmha._selection import (
    clear_tuning,
    conv_selection_model_info,
    get_selection,
    load_selection_model,
    load_tuning,
    save_tuning,
    selection_model_info,
    tuning_add,
)
from ckfmha._selection import (
    set_selection as _set_mode,
)
from ckfmha.errors import CkfmhaError

PACKAGED_MODEL = Path(__file__).resolve().parent / "data" / "selection_sm90.model"
PACKAGED_CONV_MODEL = Path(__file__).resolve().parent / "data" / "selection_conv_sm90.model"

__all__ = ["PACKAGED_CONV_MODEL", "PACKAGED_MODEL", "clear_tuning", "conv_selection_model_info",
           "default_tuning_path", "get_selection",
           "load_selection_model", "load_tuning", "save_tuning", "selection",
           "selection_model_info", "set_selection", "tuning_add"]  # fmt: skip

_loaded_default_table = False


def default_tuning_path(arch: int | None = None) -> Path:
    """Where ``python -m ckfmha tune`` writes, and "tuned" reads, this GPU's table: one file per
    arch in the cache directory (the file names its device, driver and library version, and a
    table of another one is refused when loaded)."""
    if arch is None:
        from ckfmha._device import device_arch

        arch = device_arch()
    return _cache.default_cache_dir() / "tuning" / f"sm_{arch}.txt"


def _load_sources(mode: str) -> None:
    global _loaded_default_table
    if (mode in ("learned", "tuned") and selection_model_info() == "none"
            and PACKAGED_MODEL.exists()):  # fmt: skip
        load_selection_model(PACKAGED_MODEL)
    if (mode in ("learned", "tuned") and conv_selection_model_info() == "none"
            and PACKAGED_CONV_MODEL.exists()):  # fmt: skip
        load_selection_model(PACKAGED_CONV_MODEL)
    if mode == "tuned" and not _loaded_default_table:
        _loaded_default_table = True
        try:
            path = default_tuning_path()
        except CkfmhaError:  # no device: nothing was tuned for it
            return
        if path.exists():
            try:
                load_tuning(path)
            except CkfmhaError as exc:  # stale: another library, driver or GPU
                warnings.warn(f"ckfmha: not using the tuning table {path}: {exc}", stacklevel=3)


def set_selection(mode: str) -> None:
    """Sets the process's selection mode, loading the model (and the default tuning table) the
    mode needs the first time."""
    _set_mode(mode)
    _load_sources(mode)


@contextmanager
def selection(mode: str) -> Iterator[None]:
    """The selection mode inside the block (for every thread); the previous one after it."""
    previous = get_selection()
    set_selection(mode)
    try:
        yield
    finally:
        _set_mode(previous)


if os.environ.get("CKFMHA_SELECTION") in ("learned", "tuned"):
    _load_sources(os.environ["CKFMHA_SELECTION"])
