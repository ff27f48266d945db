"""Grouped convolution on torch tensors: a channels_last NCHW activation viewed as NHWGC without a
copy, torch's conv2d weight rearranged once to GKYXC, checked against torch's conv2d.

python examples/conv_fwd.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import ckfmha


def main() -> None:
    # A ResNeXt-50 32x4d stage-2 layer: 32 groups of 8 channels, 3x3, stride 2.
    batch, groups, c, k, size = 32, 32, 8, 8, 56
    x_nchw = torch.randn(batch, groups * c, size, size, device="cuda", dtype=torch.bfloat16)
    x_nchw = x_nchw.contiguous(memory_format=torch.channels_last)
    weight = torch.randn(groups * k, c, 3, 3, device="cuda", dtype=torch.bfloat16) * c**-0.5

    # channels_last holds NCHW as NHWC in memory: a permute and a split of the channel axis
    # give [N, H, W, G, C] on the same storage.
    x = x_nchw.permute(0, 2, 3, 1).unflatten(-1, (groups, c))
    # torch's grouped weight [G*K, C, Y, X] -> [G, K, Y, X, C], dense (one small copy).
    w = weight.unflatten(0, (groups, k)).permute(0, 1, 3, 4, 2).contiguous()

    y = ckfmha.conv_fwd(x, w, stride=2, padding=1)  # [N, OH, OW, G, K], torch out

    expected = F.conv2d(x_nchw, weight, stride=2, padding=1, groups=groups)  # [N, G*K, OH, OW]
    expected = expected.permute(0, 2, 3, 1).unflatten(-1, (groups, k))
    print("kernel:", ckfmha.conv_select(x, w, stride=2, padding=1))
    print("output:", tuple(y.shape))
    print("max |ckfmha - conv2d|:", (y.float() - expected.float()).abs().max().item())
    print("max |conv2d|:", expected.float().abs().max().item())


if __name__ == "__main__":
    main()
