"""Inputs with outlier channels, as activations and KV caches of real models have them."""

from __future__ import annotations

import numpy as np

from support.gpu_compare import Inputs, f64

OUTLIERS_PER_ROW = 2


def normal_with_outliers(inputs: Inputs, shape: tuple[int, ...], outliers: bool) -> np.ndarray:
    """Unit normal float64 values; with outliers, OUTLIERS_PER_ROW channels of every row 20 to
    60 times larger. Scaled by amax / 448 for e4m3, most values then fall on a few codes near
    zero, subnormals included."""
    import torch  # only on the GPU runs that call this

    x = f64(inputs.normal(shape, torch.float32))
    if outliers:
        rng = np.random.default_rng(inputs.integer(2**31))
        rows = x.reshape(-1, shape[-1])
        picked = np.argsort(rng.random(rows.shape), axis=1)[:, :OUTLIERS_PER_ROW]
        size = rng.uniform(20, 60, picked.shape) * rng.choice((-1.0, 1.0), picked.shape)
        np.put_along_axis(rows, picked, size, axis=1)
    return x
