"""Forward attention on NumPy arrays (staged to the GPU and back), checked in float64.

python examples/fwd_numpy.py
"""

from __future__ import annotations

import numpy as np

import ckfmha
from ckfmha.reference import attention_reference


def main() -> None:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 8, 300, 64)).astype(np.float16)
    k = rng.standard_normal((1, 8, 500, 64)).astype(np.float16)
    v = rng.standard_normal((1, 8, 500, 64)).astype(np.float16)

    out = ckfmha.fwd(q, k, v, causal=True, causal_alignment="bottom_right")
    ref, _ = attention_reference(
        q.astype(np.float64),
        k.astype(np.float64),
        v.astype(np.float64),
        causal=True,
        causal_alignment="bottom_right",
    )
    print("relative L2 error:", np.linalg.norm(out - ref) / np.linalg.norm(ref))


if __name__ == "__main__":
    main()
