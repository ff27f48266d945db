"""The convolution C API's workspaces through ctypes, without a device: the bytes
``ckfmha_conv_workspace_size`` asks for the forward's packed filters (groups of 8, 16 or 32 input
channels that divide into packs of 64 channels, on archs with the TMA template), and none
elsewhere; and backward-weight's fp32 partial sums."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

import ckfmha

BF16 = 1  # ckfmha_dtype
FWD, BWD_DATA, BWD_WEIGHT = 0, 1, 2  # ckfmha_conv_direction
SUCCESS = 0


class ConvProblem(ctypes.Structure):
    _fields_ = [
        ("dtype", ctypes.c_int),
        ("spatial_dims", ctypes.c_int32),
        ("batch", ctypes.c_int32),
        ("groups", ctypes.c_int32),
        ("in_channels", ctypes.c_int32),
        ("out_channels", ctypes.c_int32),
        ("input", ctypes.c_int32 * 3),
        ("filter", ctypes.c_int32 * 3),
        ("stride", ctypes.c_int32 * 3),
        ("padding", ctypes.c_int32 * 3),
        ("dilation", ctypes.c_int32 * 3),
        ("output", ctypes.c_int32 * 3),
        ("x_stride", ctypes.c_int64 * 4),
        ("y_stride", ctypes.c_int64 * 4),
    ]


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    library = ctypes.CDLL(str(Path(ckfmha.get_library_dir()) / "libckfmha.so"))
    library.ckfmha_last_error.restype = ctypes.c_char_p
    return library


def _problem(lib: ctypes.CDLL, groups: int, c: int, k: int, spatial: tuple[int, ...],
             filt: tuple[int, ...]) -> ConvProblem:  # fmt: skip
    problem = ConvProblem()
    dims = len(spatial)
    status = lib.ckfmha_conv_problem_init(
        ctypes.byref(problem), BF16, dims, 4, groups, c, k, (ctypes.c_int32 * 3)(*spatial),
        (ctypes.c_int32 * 3)(*filt), None, None, None,
    )  # fmt: skip
    assert status == SUCCESS, lib.ckfmha_last_error().decode()
    return problem


def _workspace(lib: ctypes.CDLL, problem: ConvProblem, direction: int, arch: int) -> int:
    size = ctypes.c_size_t(0)
    status = lib.ckfmha_conv_workspace_size(ctypes.byref(problem), direction, arch,
                                            ctypes.byref(size))  # fmt: skip
    assert status == SUCCESS, lib.ckfmha_last_error().decode()
    return size.value


@pytest.mark.parametrize(
    ("groups", "c", "k", "spatial", "filt", "pack"),
    [(32, 8, 8, (28, 28), (3, 3), 8), (32, 16, 16, (14, 14), (3, 3), 4),
     (32, 32, 32, (7, 7), (3, 3), 2), (8, 16, 24, (9, 9), (5, 3), 4),
     (32, 8, 8, (4, 8, 8), (3, 3, 3), 8), (12, 8, 8, (28, 28), (3, 3), 1),
     (32, 24, 24, (28, 28), (3, 3), 1), (32, 4, 4, (28, 28), (3, 3), 1),
     (2, 64, 64, (28, 28), (3, 3), 1)],
)  # fmt: skip
def test_forward_workspace_holds_the_packed_filters(
    lib: ctypes.CDLL, groups: int, c: int, k: int, spatial: tuple[int, ...],
    filt: tuple[int, ...], pack: int,
) -> None:  # fmt: skip
    """groups / pack filters of pack x K rows by taps x pack x C elements on sm_90; on sm_80
    (no TMA template) and where the groups do not pack, none."""
    problem = _problem(lib, groups, c, k, spatial, filt)
    taps = 1
    for f in filt:
        taps *= f
    expected = groups * k * taps * c * pack * 2 if pack > 1 else 0
    assert _workspace(lib, problem, FWD, 90) == expected
    assert _workspace(lib, problem, FWD, 80) == 0


@pytest.mark.parametrize(
    ("groups", "c", "k", "spatial", "filt"),
    [(32, 8, 8, (28, 28), (3, 3)), (1, 64, 64, (56, 56), (3, 3)), (2, 130, 200, (9, 9), (5, 3)),
     (96, 1, 1, (56, 56), (7, 7)), (8, 16, 24, (4, 8, 8), (3, 3, 3))],
)  # fmt: skip
def test_weight_workspace_holds_the_fp32_sums(
    lib: ctypes.CDLL, groups: int, c: int, k: int, spatial: tuple[int, ...],
    filt: tuple[int, ...],
) -> None:  # fmt: skip
    """fp32 partial sums of the whole dw (groups x K x taps x C), on every arch: split plans
    and the direct kernels add into them."""
    problem = _problem(lib, groups, c, k, spatial, filt)
    reduction = c
    for f in filt:
        reduction *= f
    expected = 4 * groups * k * reduction
    assert _workspace(lib, problem, BWD_WEIGHT, 90) == expected
    assert _workspace(lib, problem, BWD_WEIGHT, 80) == expected


def test_forward_packs_by_the_input_channels(lib: ctypes.CDLL) -> None:
    """The forward's reduction is over the input channels, backward-data's over the output
    channels: groups of 8 in and 64 out pack forward only, 64 in and 8 out backward only."""
    forward_only = _problem(lib, 16, 8, 64, (28, 28), (3, 3))
    assert _workspace(lib, forward_only, FWD, 90) == 16 * 64 * 9 * 8 * 8 * 2
    backward_only = _problem(lib, 16, 64, 8, (28, 28), (3, 3))
    assert _workspace(lib, backward_only, FWD, 90) == 0
    assert _workspace(lib, backward_only, BWD_DATA, 90) > 0
