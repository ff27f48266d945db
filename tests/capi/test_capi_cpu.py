"""The Python/Cython layer over the C API, on a machine without a GPU.

Kernel-dependent expectations are derived from whatever kernel set the library was
built with (CKFMHA_KERNELS / CKFMHA_ARCHS), so the tests hold for ci and full builds.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

import ckfmha
from ckfmha import errors
from ckfmha.__main__ import main as cli_main
from ckfmha._arch import parse_arch
from ckfmha._status import error_for_status, raise_for_status, status_name

no_gpu = pytest.mark.skipif(ckfmha.device_count() > 0, reason="checks behaviour without a GPU")

KERNEL_FIELDS = {
    "name", "family", "dtype", "mode", "hdim_q", "hdim_v", "mask", "lse", "kv_quant", "q_quant",
    "arch", "arch_name", "pipeline", "tile_m", "tile_n", "tile_k", "warps", "stages",
    "bias_rows_only", "conv_spatial_dims", "conv_vector", "conv_max_channels",
}  # fmt: skip


BWD_FAMILIES = ("bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq")
PAGED_FAMILIES = ("fwd_pagedkv", "batch_prefill")


@pytest.fixture(scope="module")
def all_kernels() -> list[dict]:
    return ckfmha.Registry().kernels()


@pytest.fixture(scope="module")
def kernels(all_kernels) -> list[dict]:
    """The forward kernels (the backward stages have their own tests below)."""
    return [k for k in all_kernels if k["family"] == "fwd"]


@pytest.fixture(scope="module")
def bwd_kernels(all_kernels) -> list[dict]:
    return [k for k in all_kernels if k["family"] == "bwd_dq_dk_dv"]


def problem_for(kernel: dict, **overrides) -> ckfmha.FwdProblem:
    """A problem the given registered kernel can serve."""
    fields = {
        "batch": 2,
        "nhead_q": 8,
        "seqlen_q": 256,
        "hdim": kernel["hdim_q"],
        "hdim_v": kernel["hdim_v"],
        "dtype": kernel["dtype"],
        "causal": kernel["mask"] == "causal",
        "window": (16, 0) if kernel["mask"] == "window" else None,
        "lse": kernel["lse"],
        "bias": kernel["bias"],
        "dropout_p": 0.1 if kernel["dropout"] else 0.0,
        "softcap": 30.0 if kernel["softcap"] else 0.0,
        "sink": kernel["sink"],
        "mode": kernel["mode"],
        "v_col_major": kernel["v_col_major"],
    }
    fields.update(overrides)
    return ckfmha.FwdProblem(**fields)


# ---- versions, errors ----


def test_versions_agree():
    assert ckfmha.version() == ckfmha.header_version()
    assert ckfmha.__version__ == ".".join(str(part) for part in ckfmha.version())


@pytest.mark.parametrize(
    ("status", "cls", "builtin"),
    [
        (1, errors.InvalidArgumentError, ValueError),
        (2, errors.UnsupportedError, NotImplementedError),
        (3, errors.CudaError, RuntimeError),
        (4, errors.NoDeviceError, RuntimeError),
        (5, errors.BufferTooSmallError, errors.CkfmhaError),
        (6, errors.NotFoundError, LookupError),
        (7, errors.InternalError, RuntimeError),
    ],
)
def test_status_codes_map_to_exceptions(status, cls, builtin):
    error = error_for_status(status, "message")
    assert type(error) is cls and isinstance(error, builtin)
    assert isinstance(error, errors.CkfmhaError) and error.status == status
    assert status_name(status).startswith("CKFMHA_ERROR_")
    with pytest.raises(cls):
        raise_for_status(status)


def test_success_raises_nothing():
    raise_for_status(0)
    assert status_name(0) == "CKFMHA_SUCCESS"


# ---- registry ----


def test_registry_lists_kernels(all_kernels):
    kernels = all_kernels
    registry = ckfmha.Registry()
    names = registry.names()
    assert len(registry) == len(names) > 0
    assert len(set(names)) == len(names)
    assert names == [kernel["name"] for kernel in kernels]
    assert names[0] in registry and "no_such_kernel" not in registry
    assert list(registry) == names


def test_registry_json_fields(all_kernels):
    assert json.loads(ckfmha.Registry().to_json()) == all_kernels
    for kernel in all_kernels:
        assert KERNEL_FIELDS <= set(kernel)
        assert kernel["family"] in ("fwd", "fwd_splitkv", "fwd_splitkv_combine", "fwd_appendkv",
                                    *PAGED_FAMILIES, *BWD_FAMILIES, "conv_fwd",
                                    "conv_bwd_weight")  # fmt: skip
        # Convolutions carry their spatial dims, channel vector and (direct kernels) the
        # channels a group may have; attention kernels carry zeros there.
        conv = kernel["family"] in ("conv_fwd", "conv_bwd_weight")
        assert (kernel["conv_spatial_dims"] in (2, 3)) == conv
        assert (kernel["conv_vector"] in (1, 2, 4, 8)) == conv
        assert kernel["conv_max_channels"] in ((0, 1, 2, 4, 8) if conv else (0,))
        assert (kernel["conv_max_channels"] != 0) == (conv and "_conv_direct_" in kernel["name"])
        # Only the backward's main stage computes dbias, and only of an elementwise bias.
        assert isinstance(kernel["dbias"], bool)
        if kernel["dbias"]:
            assert kernel["family"] == "bwd_dq_dk_dv" and kernel["bias"] == "elementwise"
        # Only kernels with an elementwise bias can be limited to row-broadcast ones.
        assert isinstance(kernel["bias_rows_only"], bool)
        if kernel["bias_rows_only"]:
            assert kernel["bias"] == "elementwise" and kernel["pipeline"] == "sm90_tma_wgmma"
        assert kernel["dtype"] in ("fp16", "bf16", "fp32")
        assert kernel["mask"] in ("none", "causal", "window")
        assert kernel["bias"] in ("none", "elementwise", "alibi")
        assert kernel["arch_name"].startswith(f"sm_{kernel['arch']}")
        assert kernel["arch_name"] in kernel["name"]
        # fp8 queries: the Hopper forward only, always beside fp8 K/V.
        assert kernel["q_quant"] in ("none", "fp8_e4m3")
        assert (kernel["q_quant"] != "none") == ("_qkve4m3__" in kernel["name"])
        if kernel["q_quant"] != "none":
            assert kernel["family"] == "fwd" and kernel["pipeline"] == "sm90_tma_wgmma"
            assert kernel["kv_quant"] == kernel["q_quant"]


def test_load_missing_module_raises():
    with pytest.raises(errors.CkfmhaError):
        ckfmha.Registry().load_module("/nonexistent/module.so")


# ---- dispatch ----


@pytest.mark.parametrize(
    ("spelling", "number"),
    [(90, 90), ("sm_90a", 90), ("sm90", 90), ("90", 90), ("9.0", 90), ("sm_80", 80), (None, -1)],
)
def test_parse_arch(spelling, number):
    assert parse_arch(spelling) == number


def test_parse_arch_rejects_garbage():
    with pytest.raises(errors.InvalidArgumentError):
        parse_arch("hopper")


def test_select_serves_every_registered_signature(kernels):
    dispatcher = ckfmha.Dispatcher()
    # Combine kernels serve a plan's second stage, never a problem of their own.
    for kernel in (k for k in kernels if k["family"] != "fwd_splitkv_combine"):
        # One stage asked for: where a split-KV kernel of the same signature is registered, the
        # small test grid would otherwise get a split plan.
        name = dispatcher.select(problem_for(kernel, num_splits=1), arch=kernel["arch"])
        chosen = next(k for k in kernels if k["name"] == name)
        signature = (
            "dtype",
            "mode",
            "hdim_q",
            "hdim_v",
            "mask",
            "bias",
            "dropout",
            "softcap",
            "sink",
            "v_col_major",
        )
        assert [chosen[f] for f in signature] == [kernel[f] for f in signature]
        assert kernel["arch_name"] in name


def test_column_major_v_takes_any_key_count(kernels):
    column_major = [k for k in kernels if k["v_col_major"]]
    if not column_major:
        pytest.skip("library built without column-major V kernels")
    dispatcher = ckfmha.Dispatcher()
    for kernel in column_major:
        for seqlen_k in (17, 1, 256):
            problem = problem_for(kernel, seqlen_k=seqlen_k)
            # Contiguous [b, hk, dv, seqlen_k]: an odd key count makes the head-dim stride
            # odd too; the kernel then loads V element by element.
            assert problem.to_c_dict()["v_stride"][2] == seqlen_k
            name = dispatcher.select(problem, arch=kernel["arch"])
            chosen = next(k for k in kernels if k["name"] == name)
            assert chosen["v_col_major"] and chosen["mode"] == kernel["mode"]
            text = dispatcher.explain(problem, arch=kernel["arch"])
            assert f"selected  {name}" in text and "16-byte" not in text


def test_select_for_hopper_picks_sm90a(kernels):
    hopper = [k for k in kernels if k["arch"] == 90]
    if not hopper:
        pytest.skip("library built without sm_90a kernels")
    for spelling in (90, "sm_90a", "sm90"):
        assert "sm_90a" in ckfmha.Dispatcher().select(problem_for(hopper[0]), arch=spelling)


def test_hopper_group_mode_needs_packed_token_counts(kernels):
    hopper_group = [
        k for k in kernels if k["pipeline"] == "sm90_tma_wgmma" and k["mode"] == "group"
    ]
    if not hopper_group:
        pytest.skip("library built without sm90 group-mode kernels")
    kernel = hopper_group[0]
    dispatcher = ckfmha.Dispatcher()
    # Token counts given (or taken at their largest): the Hopper kernel is preferred.
    assert dispatcher.select(problem_for(kernel), arch=kernel["arch"]) == kernel["name"]
    given = problem_for(kernel, total_q=300, total_k=500)
    assert dispatcher.select(given, arch=kernel["arch"]) == kernel["name"]
    assert given.to_c_dict()["total_q"] == 300 and given.to_c_dict()["total_k"] == 500
    # Unknown counts rule it out with the reason; another kernel may still serve.
    unknown = problem_for(kernel, total_q=0, total_k=0)
    text = dispatcher.explain(unknown, arch=kernel["arch"])
    assert f"rejected  {kernel['name']}: group mode on sm90_tma_wgmma needs total_q" in text
    too_many = problem_for(kernel, total_q=2**31, total_k=10)
    assert "coordinate range" in dispatcher.explain(too_many, arch=kernel["arch"])
    with pytest.raises(ckfmha.InvalidArgumentError, match="total_q"):
        problem_for(kernel, total_q=-1).validate()


def test_select_accepts_keyword_fields(kernels):
    kernel = kernels[0]
    problem = problem_for(kernel)
    fields = {f: getattr(problem, f) for f in problem.__dataclass_fields__}
    dispatcher = ckfmha.Dispatcher()
    assert dispatcher.select(arch=kernel["arch"], **fields) == dispatcher.select(
        problem, arch=kernel["arch"]
    )
    with pytest.raises(TypeError):
        dispatcher.select(problem, arch=kernel["arch"], batch=3)


def test_explain_gives_reasons(kernels):
    kernel = kernels[0]
    text = ckfmha.Dispatcher().explain(problem_for(kernel), arch=kernel["arch"])
    for other in kernels:
        assert other["name"] in text
    assert "selected" in text
    if len({k["dtype"] for k in kernels}) > 1:
        assert "rejected" in text and "dtype" in text


def test_unsupported_head_dim_names_supported_ones(kernels):
    kernel = kernels[0]
    with pytest.raises(errors.UnsupportedError) as caught:
        ckfmha.Dispatcher().select(problem_for(kernel, hdim=72, hdim_v=72), arch=kernel["arch"])
    assert isinstance(caught.value, NotImplementedError)
    message = str(caught.value)
    assert "72" in message
    for hdim in {k["hdim_q"] for k in kernels if k["arch"] == kernel["arch"]}:
        assert str(hdim) in message


@pytest.mark.parametrize(
    "overrides",
    [
        {"nhead_q": 8, "nhead_k": 3},
        {"batch": -2},
        {"seqlen_k": -1},
        {"nhead_q": -8},
        {"batch": 2**31},
    ],
)
def test_invalid_shapes_raise_invalid_argument(kernels, overrides):
    kernel = kernels[0]
    problem = problem_for(kernel, **overrides)
    with pytest.raises(errors.InvalidArgumentError) as caught:
        ckfmha.Dispatcher().select(problem, arch=kernel["arch"])
    assert isinstance(caught.value, ValueError) and str(caught.value)
    with pytest.raises(errors.InvalidArgumentError):
        problem.validate()


@pytest.mark.parametrize(
    "overrides",
    [{"dtype": "fp64"}, {"layout": "sbhd"}, {"causal": True, "causal_alignment": "center"}],
)
def test_invalid_problem_fields(overrides):
    problem = ckfmha.FwdProblem(batch=1, nhead_q=2, seqlen_q=8, hdim=64, **overrides)
    with pytest.raises(errors.InvalidArgumentError):
        problem.validate()


# ---- problems as the C library sees them ----


def test_problem_struct_bhsd():
    problem = ckfmha.FwdProblem(
        batch=2, nhead_q=8, nhead_k=2, seqlen_q=100, seqlen_k=300, hdim=64, lse=True
    )
    problem.validate()
    c = problem.to_c_dict()
    assert (c["batch"], c["nhead_q"], c["nhead_k"], c["seqlen_q"], c["seqlen_k"]) == (
        2, 8, 2, 100, 300,
    )  # fmt: skip
    assert (c["hdim_q"], c["hdim_v"], c["store_lse"], c["mask"]) == (64, 64, 1, 0)
    assert c["scale"] == pytest.approx(1 / math.sqrt(64))
    assert c["q_stride"] == (8 * 100 * 64, 100 * 64, 64)
    assert c["k_stride"] == (2 * 300 * 64, 300 * 64, 64)
    assert c["o_stride"] == (8 * 100 * 64, 100 * 64, 64)


def test_problem_struct_bshd_and_mask():
    problem = ckfmha.FwdProblem(
        batch=2, nhead_q=4, seqlen_q=16, hdim=128, hdim_v=64, layout="bshd", causal=True,
        causal_alignment="bottom_right", scale=0.5, dtype="bf16",
    )  # fmt: skip
    c = problem.to_c_dict()
    assert c["dtype"] == 1 and c["mask"] == 2 and c["scale"] == 0.5
    # (batch, head, seq) strides of a [b, s, h, d] tensor.
    assert c["q_stride"] == (16 * 4 * 128, 128, 4 * 128)
    assert c["v_stride"] == (16 * 4 * 64, 64, 4 * 64)
    assert problem.flops() == pytest.approx(2 * 2 * 4 * 16 * 16 * (128 + 64) / 2)


# ---- feature fields (window, soft-cap, bias, sink, dropout, group mode) ----


def small_problem(**fields) -> ckfmha.FwdProblem:
    return ckfmha.FwdProblem(batch=2, nhead_q=4, nhead_k=2, seqlen_q=16, seqlen_k=24, hdim=64,
                             **fields)  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dropout_p": 1.0}, "dropout_p"),
        ({"dropout_p": -0.1}, "dropout_p"),
        ({"dropout_p": math.nan}, "dropout_p"),
        ({"softcap": -1.0}, "softcap"),
        ({"softcap": math.inf}, "softcap"),
        ({"window": (-2, 0)}, "window"),
        ({"window": (0, -5)}, "window"),
        ({"window": (1, 2, 3)}, "window"),
        ({"window": (1, 1), "causal": True}, "not both"),
        ({"skip_min_seqlen_q": 4}, "group"),
        ({"skip_min_seqlen_q": -1, "mode": "group"}, "skip_min_seqlen_q"),
        ({"bias": "relative"}, "bias"),
        ({"mode": "paged"}, "mode"),
    ],
)
def test_invalid_feature_fields(fields, message):
    with pytest.raises(errors.InvalidArgumentError, match=message):
        small_problem(**fields).validate()


@pytest.mark.parametrize(
    "fields",
    [
        {"window": (-1, -1)},
        {"window": (0, 0), "causal_alignment": "bottom_right"},
        {"window": (128, -1)},
        {"softcap": 0.0},
        {"softcap": 50.0},
        {"dropout_p": 0.0},
        {"dropout_p": 0.999},
        {"bias": "elementwise"},
        {"bias": "alibi", "sink": True},
        {"mode": "group", "skip_min_seqlen_q": 8},
        {"v_col_major": True},
    ],
)
def test_valid_feature_fields(fields):
    small_problem(**fields).validate()


def test_problem_struct_features():
    c = small_problem(
        window=(8, 0), causal_alignment="bottom_right", softcap=30.0, bias="alibi", sink=True,
        dropout_p=0.25, mode="group", skip_min_seqlen_q=3, hdim_v=32, v_col_major=True,
    ).to_c_dict()  # fmt: skip
    assert c["mask"] == 4 and c["window"] == (8, 0)
    assert (c["softcap"], c["bias"], c["has_sink"], c["dropout_p"]) == (30.0, 2, 1, 0.25)
    assert (c["mode"], c["skip_min_seqlen_q"], c["hdim_v"], c["v_col_major"]) == (1, 3, 32, 1)
    # Column-major V [batch, nhead_k, hdim_v, seqlen_k]: the third stride is the head dim's.
    assert c["v_stride"] == (2 * 32 * 24, 32 * 24, 24)
    assert small_problem(window=(3, 2)).to_c_dict()["mask"] == 3
    plain = small_problem(lse=True).to_c_dict()
    assert plain["mask"] == 0 and plain["window"] == (-1, -1) and plain["bias"] == 0
    assert (plain["has_sink"], plain["dropout_p"], plain["v_col_major"]) == (0, 0.0, 0)
    assert plain["lse_stride"] == (4 * 16, 16) and plain["bias_stride"] == (0, 0, 0)


def test_explain_describes_features(kernels):
    kernel = kernels[0]
    problem = problem_for(kernel, window=(4, 4), causal=False, softcap=5.0, sink=True)
    text = ckfmha.Dispatcher().explain(problem, arch=kernel["arch"])
    assert kernel["name"] in text


# ---- arrays without a device ----


def test_device_ptr_exports_cuda_array_interface():
    view = ckfmha.device_ptr(0x7F0000, (2, 3, 4, 8), "fp16", strides=(256, 8, 64, 1))
    cai = view.__cuda_array_interface__
    assert cai["version"] == 3 and cai["typestr"] == "<f2"
    assert cai["data"] == (0x7F0000, False)
    assert cai["shape"] == (2, 3, 4, 8)
    assert cai["strides"] == (512, 16, 128, 2)
    assert not view.owns_memory and view.dtype == "fp16" and view.nbytes == 2 * 2 * 3 * 4 * 8
    contiguous = ckfmha.device_ptr(0x7F0000, (2, 3), "bf16")
    assert contiguous.__cuda_array_interface__["strides"] is None
    assert contiguous.__cuda_array_interface__["typestr"] == "<V2"
    assert contiguous.strides == (3, 1)


@pytest.mark.parametrize("max_version", [None, (1, 0)])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_dlpack_round_trip(dtype, max_version):
    from ckfmha._arrays import as_view

    base = ckfmha.device_ptr(0x100000, (1, 4, 3, 8), dtype, strides=(96, 8, 32, 1))
    assert base.__dlpack_device__() == (2, 0)

    class Producer:
        def __dlpack__(self, stream=None):
            return base.__dlpack__(stream=stream, max_version=max_version)

        def __dlpack_device__(self):
            return base.__dlpack_device__()

    view = as_view(Producer(), 0, None, "q")
    assert view.protocol == "dlpack"
    assert (view.ptr, view.shape, view.strides) == (0x100000, base.shape, base.strides)
    assert view.dtype_name == dtype


def test_dlpack_capsule_releases_its_array():
    import sys

    base = ckfmha.device_ptr(0x100000, (2, 2), "fp16")
    before = sys.getrefcount(base)
    capsule = base.__dlpack__()
    assert sys.getrefcount(base) == before + 1
    del capsule
    assert sys.getrefcount(base) == before


class FakeCudaArray:
    """Stands in for numba/CuPy arrays: only the CUDA Array Interface."""

    def __init__(self, shape, typestr, strides=None, readonly=False, dtype=None):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (0x200000, readonly),
            "strides": strides,
            "version": 3,
            "stream": None,
        }
        if dtype is not None:
            self.dtype = dtype


def test_cai_strides_become_elements():
    from ckfmha._arrays import as_view

    view = as_view(FakeCudaArray((1, 2, 3, 8), "<f2", strides=(96, 16, 32, 2)), 0, None, "q")
    assert view.protocol == "cai" and view.strides == (48, 8, 16, 1) and view.dtype_name == "fp16"


def test_cai_two_byte_void_needs_a_dtype():
    from ckfmha._arrays import as_view

    with pytest.raises(errors.InvalidArgumentError, match="dtype="):
        as_view(FakeCudaArray((1, 1, 1, 8), "<V2"), 0, None, "q")
    assert as_view(FakeCudaArray((1, 1, 1, 8), "<V2"), 0, "bf16", "q").dtype_name == "bf16"
    torch_like = FakeCudaArray((1, 1, 1, 8), "<V2", dtype="torch.bfloat16")
    assert as_view(torch_like, 0, None, "q").dtype_name == "bf16"


@pytest.mark.parametrize(
    ("array", "kwargs", "message"),
    [
        (FakeCudaArray((1, 1, 2, 8), "<f2", strides=(32, 32, 16, 3)), {}, "multiples"),
        (FakeCudaArray((1, 1, 2, 8), "<f2", strides=(64, 64, 2, 4)), {}, "contiguous"),
        (FakeCudaArray((2, 8), "<f2"), {}, "4-D"),
        (FakeCudaArray((1, 1, 2, 8), "<f8"), {}, "typestr"),
        (FakeCudaArray((1, 1, 2, 8), "<f4"), {}, "fp16 or bf16"),
        (FakeCudaArray((1, 1, 2, 8), "<f2", readonly=True), {"writable": True}, "read-only"),
        (0x1000, {}, "device_ptr"),
        ("not an array", {}, "cannot read"),
        (np.zeros((1, 1, 2, 8), np.float32), {}, "NumPy dtype"),
        (np.zeros((1, 1, 2, 8), np.float16), {"writable": True}, "NumPy output"),
    ],
)
def test_array_validation(array, kwargs, message):
    from ckfmha._arrays import as_view

    with pytest.raises(errors.InvalidArgumentError, match=message):
        as_view(array, 0, None, "q", 4, (0, 1), **kwargs)


def _ptr(shape, dtype="fp16", address=0x400000):
    return ckfmha.device_ptr(address, shape, dtype)


@pytest.mark.parametrize(
    ("q", "k", "v", "kwargs", "message"),
    [
        (_ptr((1, 2, 8, 64)), _ptr((1, 2, 8, 64), "bf16"), _ptr((1, 2, 8, 64)), {}, "one dtype"),
        (_ptr((2, 2, 8, 64)), _ptr((1, 2, 8, 64)), _ptr((1, 2, 8, 64)), {}, "batch"),
        (_ptr((1, 2, 8, 64)), _ptr((1, 2, 8, 32)), _ptr((1, 2, 8, 64)), {}, "head dim"),
        (_ptr((1, 2, 8, 64)), _ptr((1, 2, 8, 64)), _ptr((1, 2, 9, 64)), {}, "keys"),
        (_ptr((1, 2, 8, 64)), _ptr((1, 2, 8, 64)), _ptr((1, 2, 8, 64)), {"layout": "x"}, "layout"),
        (
            _ptr((1, 2, 8, 64)),
            _ptr((1, 2, 8, 64)),
            _ptr((1, 2, 8, 64)),
            {"causal": True, "causal_alignment": "middle"},
            "causal_alignment",
        ),
        (
            _ptr((1, 2, 8, 64)),
            _ptr((1, 2, 8, 64)),
            _ptr((1, 2, 8, 64)),
            {"out": _ptr((1, 2, 8, 32))},
            "out must have shape",
        ),
        (
            _ptr((1, 2, 8, 64)),
            _ptr((1, 2, 8, 64)),
            _ptr((1, 2, 8, 64)),
            {"out": _ptr((1, 2, 8, 64)), "lse_out": _ptr((1, 2, 8), "fp16")},
            "lse_out must be fp32",
        ),
    ],
)
def test_fwd_argument_errors(q, k, v, kwargs, message):
    with pytest.raises(errors.InvalidArgumentError, match=message):
        ckfmha.fwd(q, k, v, **kwargs)


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (((1, 6, 8, 64), (1, 4, 8, 64)), "multiple"),
        (((1, 2, 2**31, 64), (1, 2, 8, 64)), "int32"),
    ],
)
def test_fwd_rejects_bad_sizes_before_allocating(shapes, message):
    q_shape, kv_shape = shapes
    with pytest.raises(errors.InvalidArgumentError, match=message):
        ckfmha.fwd(_ptr(q_shape), _ptr(kv_shape), _ptr(kv_shape))


def test_fwd_bshd_shapes_are_read_by_layout():
    # bhsd reading of these shapes mismatches (8 vs 2 heads); bshd reading is consistent,
    # so the call gets past validation to the device (absent here) or runs.
    q, k, v = _ptr((1, 8, 2, 64)), _ptr((1, 8, 2, 64)), _ptr((1, 9, 2, 64))
    with pytest.raises(errors.InvalidArgumentError):
        ckfmha.fwd(q, k, v)
    with pytest.raises(errors.InvalidArgumentError, match="keys"):
        ckfmha.fwd(q, k, v, layout="bshd")


_Q = (1, 2, 8, 64)


def _fwd_features(**kwargs):
    """fwd on device pointers with an explicit out, so nothing is allocated before checks."""
    q = _ptr(_Q)
    return ckfmha.fwd(q, q, q, out=_ptr(_Q, address=0x800000), **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dropout_p": 1.0}, "dropout_p is 1"),
        ({"dropout_p": -0.5}, "dropout_p"),
        ({"softcap": -1.0}, "softcap"),
        ({"window": (-2, 4)}, "window"),
        ({"window": "wide"}, "window"),
        ({"window": (1, 1), "causal": True}, "not both"),
        ({"window": (1, 1), "causal_alignment": "center"}, "causal_alignment"),
        ({"bias": _ptr((1, 2, 8, 9))}, "broadcast"),
        ({"bias": _ptr((1, 3, 8, 8))}, "broadcast"),
        ({"bias": _ptr((2, 2, 8, 8))}, "broadcast"),
        ({"bias": _ptr((2, 8, 8))}, "4-D"),
        ({"bias": _ptr((1, 2, 8, 8), "bf16")}, "bias must be fp16"),
        ({"bias": _ptr((1, 1, 1, 8)), "alibi_slopes": _ptr((2,), "fp32")}, "not both"),
        ({"alibi_slopes": _ptr((3,), "fp32")}, "alibi_slopes must be fp32"),
        ({"alibi_slopes": _ptr((2, 2), "fp32")}, "alibi_slopes must be fp32"),
        ({"alibi_slopes": _ptr((2,))}, "alibi_slopes must be fp32"),
        ({"alibi_slopes": np.ones(2)}, "alibi_slopes: NumPy dtype float64 is not fp32"),
        ({"sink": _ptr((4,), "fp32")}, "sink must be contiguous fp32"),
        ({"sink": _ptr((2,), "bf16")}, "sink must be fp32"),
        ({"sink": _ptr((1, 2), "fp32")}, "1-D"),
        ({"v_col_major": True}, "keys"),
    ],
)
def test_fwd_feature_argument_errors(kwargs, message):
    with pytest.raises(errors.InvalidArgumentError, match=message):
        _fwd_features(**kwargs)


def _varlen(q_shape=(10, 2, 64), kv_shape=(12, 2, 64), cu_q=None, cu_k=None, **kwargs):
    # Device offsets, so no host array is staged before the checks under test.
    cu_q = _ptr((3,), "int32", address=0x900000) if cu_q is None else cu_q
    cu_k = _ptr((3,), "int32", address=0xA00000) if cu_k is None else cu_k
    q, k, v = _ptr(q_shape), _ptr(kv_shape, address=0x500000), _ptr(kv_shape, address=0x600000)
    out = _ptr(q_shape[:2] + (kwargs.pop("hdim_v", kv_shape[2]),), address=0x800000)
    kwargs.setdefault("max_seqlen_q", 6)
    kwargs.setdefault("max_seqlen_k", 7)
    return ckfmha.fwd_varlen(q, k, v, cu_q, cu_k, out=out, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cu_q": np.array([0, 4, 10], np.int64)}, "int32"),
        ({"cu_q": np.zeros(0, np.int32)}, "batch \\+ 1 >= 1"),
        ({"cu_q": [0, 4, 10, 12]}, "cu_seqlens_k must hold batch \\+ 1 = 4"),
        ({"cu_k": np.array([0, 12], np.int32)}, "cu_seqlens_k must hold"),
        ({"cu_k": _ptr((3,), "fp32")}, "cu_seqlens_k must be int32"),
        ({"cu_q": np.zeros((2, 3), np.int32)}, "1-D"),
        ({"cu_q": 5}, "1-D"),
        ({"q_shape": (10, 2, 2, 64)}, "3-D"),
        ({"kv_shape": (12, 2, 32)}, "head dim"),
        ({"max_seqlen_q": -1}, "seqlen_q is -1; it must be at least 0"),
        ({"max_seqlen_q": 2**31}, "int32"),
        ({"skip_min_seqlen_q": -1}, "skip_min_seqlen_q"),
        ({"dropout_p": 2.0}, "dropout_p"),
        ({"softcap": -3.0}, "softcap"),
        ({"window": (-3, 0)}, "window"),
        ({"bias": _ptr((2, 2, 6, 6))}, "broadcast"),
    ],
)
def test_fwd_varlen_argument_errors(kwargs, message):
    with pytest.raises(errors.InvalidArgumentError, match=message):
        _varlen(**kwargs)


def test_group_mode_without_offsets_fails_at_run():
    # NULL offsets pass every Python check (they are well-formed arrays); the C run rejects them.
    null = ckfmha.device_ptr(0, (3,), "int32")
    with pytest.raises(errors.InvalidArgumentError, match="cu_seqlens_q"):
        _varlen(cu_q=null, cu_k=null)
    with pytest.raises(errors.InvalidArgumentError, match="cu_seqlens_k"):
        _varlen(cu_q=_ptr((3,), "int32", address=0x900000), cu_k=null)


# ---- no device ----


@no_gpu
def test_device_queries_without_gpu():
    assert ckfmha.device_count() == 0
    with pytest.raises(errors.NoDeviceError):
        ckfmha.device_arch()
    with pytest.raises(errors.NoDeviceError):
        ckfmha.current_device()


@no_gpu
def test_select_without_arch_needs_a_device(kernels):
    with pytest.raises(errors.NoDeviceError, match="arch"):
        ckfmha.Dispatcher().select(problem_for(kernels[0]))


@no_gpu
def test_fwd_numpy_without_gpu_raises_no_device():
    q = np.zeros((1, 2, 16, 64), np.float16)
    with pytest.raises(errors.NoDeviceError):
        ckfmha.fwd(q, q, q)


@no_gpu
def test_fwd_fp32_inputs_reach_the_device():
    # fp32 q/k/v pass the argument checks (fp32 bias included); only the missing device stops
    # them.
    q = _ptr((1, 2, 16, 64), "fp32")
    with pytest.raises(errors.NoDeviceError):
        ckfmha.fwd(q, q, q, out=_ptr((1, 2, 16, 64), "fp32", address=0x800000),
                   bias=_ptr((1, 2, 16, 16), "fp32", address=0x900000))
    with pytest.raises(errors.NoDeviceError):
        ckfmha.fwd(np.zeros((1, 2, 16, 64), np.float32), np.zeros((1, 2, 16, 64), np.float32),
                   np.zeros((1, 2, 16, 64), np.float32))
    with pytest.raises(errors.InvalidArgumentError, match="fp16, bf16 or fp32"):
        ckfmha.fwd(q, q, q, dtype="float64")


@no_gpu
def test_fwd_device_pointers_without_gpu_raise_no_device():
    q = _ptr((1, 2, 16, 64))
    with pytest.raises(errors.NoDeviceError):
        ckfmha.fwd(q, q, q)
    with pytest.raises(errors.NoDeviceError):
        ckfmha.fwd(q, q, q, out=_ptr((1, 2, 16, 64), address=0x800000))


@no_gpu
@pytest.mark.parametrize(
    "kwargs",
    [
        {"window": (-1, -1)},
        {"window": (4, 0), "causal_alignment": "bottom_right", "softcap": 20.0},
        {"bias": _ptr((1, 1, 1, 8)), "dropout_p": 0.1, "dropout_seed": 2**64 - 1},
        {"alibi_slopes": _ptr((1, 2), "fp32"), "sink": _ptr((2,), "fp32")},
        {"v_col_major": True, "scale": 0.5},
    ],
)
def test_well_formed_features_reach_the_device(kwargs):
    q = _ptr(_Q)
    v = _ptr((1, 2, 64, 8)) if kwargs.get("v_col_major") else q
    with pytest.raises(errors.NoDeviceError):
        ckfmha.fwd(q, q, v, out=_ptr(_Q, address=0x800000), **kwargs)


@no_gpu
def test_column_major_v_with_odd_keys_reaches_the_device():
    q, k = _ptr(_Q), _ptr((1, 2, 17, 64), address=0x500000)
    # 17 keys, seen from the second of 24 stored per channel: an unaligned base.
    v = ckfmha.device_ptr(0x600002, (1, 2, 64, 17), "fp16", strides=(2 * 64 * 24, 64 * 24, 24, 1))
    with pytest.raises(errors.NoDeviceError):
        ckfmha.fwd(q, k, v, out=_ptr(_Q, address=0x800000), v_col_major=True)
    # Group mode: 13 packed keys per channel, V [nhead_k, hdim_v, total_k].
    offsets = _ptr((3,), "int32", address=0x900000)
    q, k = _ptr((10, 2, 64)), _ptr((13, 2, 64), address=0x500000)
    v = ckfmha.device_ptr(0x600002, (2, 64, 13), "fp16")
    with pytest.raises(errors.NoDeviceError):
        ckfmha.fwd_varlen(q, k, v, offsets, offsets, max_seqlen_q=6, max_seqlen_k=7,
                          v_col_major=True, out=_ptr((10, 2, 64), address=0x800000))


@no_gpu
def test_well_formed_varlen_reaches_the_device():
    offsets = _ptr((3,), "int32", address=0x900000)
    with pytest.raises(errors.NoDeviceError):
        _varlen(cu_q=offsets, cu_k=offsets, skip_min_seqlen_q=2, window=(3, 3))
    with pytest.raises(errors.NoDeviceError):
        _varlen(cu_q=offsets, cu_k=offsets, kv_shape=(12, 1, 64), alibi_slopes=_ptr((2,), "fp32"))


@no_gpu
def test_device_memory_without_gpu_raises_no_device():
    with pytest.raises(errors.NoDeviceError):
        ckfmha.DeviceArray((2, 3), "fp16")
    with pytest.raises(errors.NoDeviceError):
        ckfmha.from_host(np.zeros(4, np.float16))
    with pytest.raises(errors.NoDeviceError):
        ckfmha.synchronize()


# ---- packaging and CLI ----


def test_get_include_and_library_dir():
    package_parent, headers = ckfmha.get_include()
    assert os.path.isfile(os.path.join(package_parent, "ckfmha", "__init__.pxd"))
    assert os.path.isfile(os.path.join(headers, "ckfmha", "ckfmha.h"))
    assert os.path.isfile(os.path.join(ckfmha.get_library_dir(), "libckfmha.so"))


def test_cli_list(capsys, all_kernels):
    kernels = all_kernels
    assert cli_main(["list"]) == 0
    assert capsys.readouterr().out.split() == [k["name"] for k in kernels]
    assert cli_main(["list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == kernels


def test_cli_explain(capsys, kernels):
    kernel = kernels[0]
    argv = ["explain", "--heads", "4", "--seqlen", "64", "--hdim", str(kernel["hdim_q"])]
    argv += ["--dtype", kernel["dtype"], "--arch", kernel["arch_name"]]
    argv += ["--causal"] if kernel["mask"] == "causal" else []
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("selected: ") and kernel["name"] in out


def test_cli_feature_flags_build_the_problem():
    from ckfmha.__main__ import _parser, problem_from_args

    argv = ["explain", "--heads", "8", "--kv-heads", "2", "--seqlen", "64", "--hdim", "64"]
    argv += ["--window", "16", "-1", "--causal-alignment", "bottom_right", "--softcap", "30"]
    argv += ["--alibi", "--sink", "--dropout", "0.125"]
    problem = problem_from_args(_parser().parse_args(argv))
    assert problem.window == (16, -1) and problem.causal_alignment == "bottom_right"
    assert (problem.softcap, problem.bias, problem.sink, problem.dropout_p) == (
        30.0, "alibi", True, 0.125,
    )  # fmt: skip
    assert problem.to_c_dict()["mask"] == 4
    plain = problem_from_args(_parser().parse_args(argv[:9]))
    assert (plain.window, plain.softcap, plain.bias, plain.sink, plain.dropout_p) == (
        None, 0.0, "none", False, 0.0,
    )  # fmt: skip


def test_cli_explain_with_features(capsys, kernels):
    kernel = kernels[0]
    argv = ["explain", "--heads", "4", "--seqlen", "64", "--hdim", str(kernel["hdim_q"])]
    argv += ["--dtype", kernel["dtype"], "--arch", kernel["arch_name"]]
    argv += ["--window", "8", "0", "--softcap", "10", "--sink", "--dropout", "0.1"]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("selected: ") and kernel["name"] in out
    assert cli_main(argv + ["--dropout", "1.5"]) == 2
    assert "dropout_p" in capsys.readouterr().err


def test_cli_explain_takes_fp8_kv(capsys):
    from ckfmha.__main__ import _parser, problem_from_args

    argv = ["explain", "--heads", "32", "--kv-heads", "8", "--seqlen", "1", "--seqlen-k", "4096"]
    argv += ["--hdim", "128", "--kv-dtype", "fp8_e4m3", "--arch", "80"]
    assert problem_from_args(_parser().parse_args(argv)).to_c_dict()["kv_quant"] == 1
    # The problem line says fp8 K/V; on sm_80 the plan says why no kernel reads it.
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert "kv=fp8_e4m3 on sm_80" in out
    assert out.startswith("selected: none") and "fp8 K/V needs sm_89 or later" in out
    assert problem_from_args(_parser().parse_args(argv[:-4])).to_c_dict()["kv_quant"] == 0


def test_cli_validation_uses_features_and_stored_randval():
    from ckfmha._bench import make_features, validate
    from ckfmha.reference import attention_reference, dropout_keep, philox_dropout_randval

    problem = ckfmha.FwdProblem(
        batch=2, nhead_q=4, nhead_k=2, seqlen_q=9, seqlen_k=12, hdim=16, window=(3, 2),
        causal_alignment="bottom_right", softcap=5.0, bias="alibi", sink=True, dropout_p=0.3,
        layout="bshd",
    )  # fmt: skip
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 9, 4, 16)).astype(np.float16)
    k, v = (rng.standard_normal((2, 12, 2, 16)).astype(np.float16) for _ in range(2))
    features = make_features(problem, seed=11)
    assert features["alibi_slopes"].dtype == np.float32 and features["sink"].shape == (4,)
    assert features["dropout_seed"] == 11 and features["window"] == (3, 2)
    randval = philox_dropout_randval(11, 0, 2, 4, 9, 12)
    expected, _ = attention_reference(
        q, k, v, layout="bshd", window=(3, 2), causal_alignment="bottom_right", softcap=5.0,
        alibi_slopes=features["alibi_slopes"], sink=features["sink"], dropout_p=0.3,
        dropout_keep=dropout_keep(randval, 0.3),
    )  # fmt: skip
    max_abs, rel_l2, _ = validate(problem, q, k, v, expected, features, randval)
    assert max_abs == 0.0 and rel_l2 == 0.0
    # Another stream's bytes drop other probabilities, which validation notices.
    other = philox_dropout_randval(12, 0, 2, 4, 9, 12)
    assert validate(problem, q, k, v, expected, features, other)[0] > 1e-3


@no_gpu
def test_cli_without_gpu_exits_cleanly(capsys):
    assert cli_main(["explain", "--heads", "4", "--seqlen", "64", "--hdim", "64"]) == 2
    assert "--arch" in capsys.readouterr().err
    assert cli_main(["run", "--heads", "4", "--seqlen", "64", "--hdim", "64"]) == 2


@pytest.mark.parametrize("scale", [-0.125, 0.0, float("nan"), float("inf")])
def test_scale_must_be_positive_and_finite(kernels, scale):
    """The kernels track each row's largest raw score, the largest logit only for a positive
    scale: any other scale is refused before a launch, by name."""
    kernel = kernels[0]
    problem = problem_for(kernel, scale=scale)
    with pytest.raises(errors.InvalidArgumentError, match="scale is .*; it must be positive"):
        ckfmha.Dispatcher().select(problem, arch=kernel["arch"])
