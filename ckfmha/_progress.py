"""A progress display for long builds: tqdm when installed, else one updating stderr line."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from typing import Any


class Progress:
    def __init__(self, total: int, description: str, enabled: bool = True) -> None:
        self.total = total
        self.description = description
        self.enabled = enabled and total > 0
        self.count = 0
        self._bar: Any = None
        if self.enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                self._write()
            else:
                self._bar = tqdm(total=total, desc=description, unit="file")

    def _write(self) -> None:
        # \r keeps one line on a terminal; CI logs get one line per update.
        end = "\n" if self.count == self.total or not sys.stderr.isatty() else ""
        sys.stderr.write(f"\r{self.description}: {self.count}/{self.total}{end}")
        sys.stderr.flush()

    def update(self, count: int = 1) -> None:
        self.count += count
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(count)
        else:
            self._write()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class ElapsedLine:
    """One stderr line while kernels compile on first use: what, for which arch, and the seconds
    so far (redrawn each second on a terminal; a start and an end line in a log)."""

    def __init__(self, names: Sequence[str], arch: str) -> None:
        more = f" (+{len(names) - 1} more)" if len(names) > 1 else ""
        self.text = f"ckfmha: compiling {names[0]}{more} for {arch} on first use"
        self.start = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.done = threading.Event()
        if self.tty:
            self.ticker = threading.Thread(target=self._tick, daemon=True)
            self.ticker.start()
        else:
            self._write("\n")

    def _write(self, end: str) -> None:
        elapsed = time.monotonic() - self.start
        sys.stderr.write(f"\r{self.text}: {elapsed:.0f} s{end}")
        sys.stderr.flush()

    def _tick(self) -> None:
        while not self.done.wait(1.0):
            self._write("")

    def update(self, count: int = 1) -> None:
        """Compile steps are not counted: the line shows time, not a fraction."""

    def close(self) -> None:
        self.done.set()
        if self.tty:
            self.ticker.join()
        self._write(" (done)\n")
