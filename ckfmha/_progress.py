"""A progress display for long builds: tqdm when installed, else one updating stderr line."""

from __future__ import annotations

import sys
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
