"""A training step through ckfmha's grouped convolution: ckfmha.torch.conv2d takes
torch.nn.functional.conv2d's arguments, and autograd runs ckfmha's backward-data and
backward-weight kernels. The gradients are compared with torch's (cuDNN) on the same inputs.

python examples/conv_train_step.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import ckfmha
import ckfmha.torch


def main() -> None:
    # A MobileNetV2 block's depthwise 3x3 (stride 2) and a ResNeXt grouped 3x3.
    for groups, c, k, stride in ((96, 1, 1, 2), (32, 8, 8, 1)):
        x = torch.randn(16, groups * c, 28, 28, device="cuda", dtype=torch.bfloat16)
        x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
        weight = torch.randn(groups * k, c, 3, 3, device="cuda", dtype=torch.bfloat16) * c**-0.5
        weight.requires_grad_()
        args = {"stride": stride, "padding": 1, "groups": groups}

        y = ckfmha.torch.conv2d(x, weight, **args)
        dy = torch.randn_like(y)
        dx, dw = torch.autograd.grad(y, (x, weight), dy)

        y_ref = F.conv2d(x, weight, **args)
        dx_ref, dw_ref = torch.autograd.grad(y_ref, (x, weight), dy)
        problem = ckfmha.ConvProblem(16, (28, 28), groups, c, k, (3, 3), stride, 1, dtype="bf16")
        print(f"groups {groups} x {c} channels, stride {stride}")
        for direction in ("fwd", "bwd_data", "bwd_weight"):
            print(f"  {direction:10s} kernel: {ckfmha.conv_select(problem, direction=direction)}")
        for name, got, ref in (("y", y, y_ref), ("dx", dx, dx_ref), ("dw", dw, dw_ref)):
            error = (got.float() - ref.float()).abs().max().item()
            print(f"  max |{name} - torch|: {error:.3g} (max |{name}| {ref.float().abs().max():.3g})")


if __name__ == "__main__":
    main()
