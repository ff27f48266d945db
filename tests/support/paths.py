"""Paths of the checkout the tests run from."""

from __future__ import annotations

import os
from pathlib import Path

# tests/support/paths.py -> the checkout root, which holds pyproject.toml.
REPO_ROOT: Path = Path(__file__).resolve().parents[2]


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child Python process: the checkout and tests/ importable, host
    validation of device metadata off (so kernels meet it), output unbuffered, plus ``extra``."""
    env = dict(os.environ)
    paths = [str(REPO_ROOT), str(REPO_ROOT / "tests"), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    env.pop("CKFMHA_VALIDATE", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env
