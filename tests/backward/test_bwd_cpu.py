"""The backward's C API, dispatcher and Python layer on a machine without a GPU.

Expectations about kernels come from whatever kernel set the library was built with.
"""

from __future__ import annotations

import math
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
from support.c_programs import build_c_program, needs_cc
from support.device_kernels import runs_on

import ckfmha
from ckfmha import errors

no_gpu = pytest.mark.skipif(ckfmha.device_count() > 0, reason="checks behaviour without a GPU")

STAGES = ("bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq")


@pytest.fixture(scope="module")
def bwd_kernels() -> list[dict]:
    # Problems here are built from plain fields, which ask for no dbias.
    return [k for k in ckfmha.Registry().kernels()
            if k["family"] == "bwd_dq_dk_dv" and not k["dbias"]]


def _problem_fields(kernel: dict, **overrides) -> dict:
    fields = {
        "batch": 2,
        "nhead_q": 8,
        "nhead_k": 2,
        "seqlen_q": 300,
        "seqlen_k": 257,
        "hdim": kernel["hdim_q"],
        "hdim_v": kernel["hdim_v"],
        "dtype": kernel["dtype"],
        "mode": kernel["mode"],
        "causal": kernel["mask"] == "causal",
        "window": (16, 0) if kernel["mask"] == "window" else None,
    }
    fields.update(overrides)
    return fields


def _has_sm80_twin(kernel: dict, kernels: list[dict]) -> bool:
    """Is an sm80 main stage registered that computes `kernel`'s problems on its arch (same dtype,
    mode and head dims; a window kernel also computes causal masks)? SASS for sm_80 does not run
    on sm_90a: the twin must be built for the kernel's own arch."""
    masks = {"none": ("none",), "causal": ("causal", "window"),
             "window": ("window",)}[kernel["mask"]]
    return any(
        k["pipeline"] == "sm80_cpasync_mma"
        and runs_on(k, kernel["arch"])
        and (k["dtype"], k["mode"], k["hdim_q"], k["hdim_v"]) == (
            kernel["dtype"], kernel["mode"], kernel["hdim_q"], kernel["hdim_v"])
        and k["mask"] in masks and k["bias"] == "none" and not k["dropout"] and not k["softcap"]
        for k in kernels
    )  # fmt: skip


def test_every_registered_backward_kernel_has_a_plan(bwd_kernels):
    if not bwd_kernels:
        pytest.skip("library built without backward kernels")
    dispatcher = ckfmha.Dispatcher()
    by_name = {k["name"]: k for k in ckfmha.Registry().kernels()}
    for kernel in bwd_kernels:
        fields = _problem_fields(kernel)
        plan = dispatcher.select_bwd(arch=kernel["arch_name"], **fields)
        assert len(plan) == 3
        assert [by_name[name]["family"] for name in plan] == list(STAGES)
        main = by_name[plan[1]]
        assert (main["dtype"], main["mode"], main["hdim_q"], main["hdim_v"]) == (
            kernel["dtype"], kernel["mode"], kernel["hdim_q"], kernel["hdim_v"]
        )  # fmt: skip
        # Row-wise stages pass over hdim_v (D = rowsum(dO * O)) and hdim_q (dQ).
        assert by_name[plan[0]]["hdim_q"] == kernel["hdim_v"]
        assert by_name[plan[2]]["hdim_q"] == kernel["hdim_q"]
        # The deterministic switch is a run-time mode: the same kernels serve it, except an
        # sm90 main stage (fast mode only), which an sm80 one of the same signature replaces.
        if main["pipeline"] == "sm90_tma_wgmma" and not _has_sm80_twin(main, bwd_kernels):
            # A filtered build may hold no sm80 kernel to take the deterministic problem over.
            with pytest.raises(errors.UnsupportedError, match="no compiled bwd_dq_dk_dv kernel"):
                dispatcher.select_bwd(arch=kernel["arch_name"], deterministic=True, **fields)
            text = dispatcher.explain_bwd(arch=kernel["arch_name"], deterministic=True, **fields)
            assert "adds dQ with fp32 atomics (fast mode only)" in text, text
            continue
        exact = dispatcher.select_bwd(arch=kernel["arch_name"], deterministic=True, **fields)
        if main["pipeline"] == "sm90_tma_wgmma":
            assert exact[0] == plan[0] and exact[2] == plan[2]
            other = by_name[exact[1]]
            assert other["pipeline"] == "sm80_cpasync_mma", exact
            assert (other["dtype"], other["hdim_q"], other["mode"]) == (
                main["dtype"], main["hdim_q"], main["mode"]
            )  # fmt: skip
        else:
            assert exact == plan


def test_hopper_main_stage_takes_only_biases_broadcast_over_the_query_rows(bwd_kernels):
    hopper = [k for k in bwd_kernels
              if k["pipeline"] == "sm90_tma_wgmma" and k["bias"] == "elementwise"]
    if not hopper:
        pytest.skip("library built without a Hopper backward for elementwise biases")
    dispatcher = ckfmha.Dispatcher()
    for kernel in hopper:
        fields = _problem_fields(kernel, bias="elementwise")
        arch = kernel["arch_name"]
        padding = dispatcher.select_bwd(arch=arch, bias_rows_broadcast=True, **fields)
        assert padding[1] == kernel["name"], padding
        # A bias with a row per query: an sm80 main stage where one is built, else none.
        text = dispatcher.explain_bwd(arch=arch, **fields)
        assert "takes an elementwise bias broadcast over the query rows only" in text, text
        try:
            full = dispatcher.select_bwd(arch=arch, **fields)
        except errors.UnsupportedError as error:
            assert "no compiled bwd_dq_dk_dv kernel" in str(error)
        else:
            by_name = {k["name"]: k for k in bwd_kernels}
            assert by_name[full[1]]["pipeline"] == "sm80_cpasync_mma", full


def test_explain_bwd_lists_each_stage(bwd_kernels):
    if not bwd_kernels:
        pytest.skip("library built without backward kernels")
    kernel = bwd_kernels[0]
    text = ckfmha.Dispatcher().explain_bwd(arch=kernel["arch_name"], **_problem_fields(kernel))
    assert text.startswith("problem: bwd ")
    for stage in STAGES:
        assert f"stage {stage}:" in text
    assert text.count("selected") == 3
    assert "rejected" not in text or "problem has" in text or "problem is" in text


def test_unsupported_backward_says_what_exists(bwd_kernels):
    if not bwd_kernels:
        pytest.skip("library built without backward kernels")
    kernel = bwd_kernels[0]
    with pytest.raises(errors.UnsupportedError, match=r"no compiled bwd_dq_dk_dv kernel fits"):
        ckfmha.Dispatcher().select_bwd(arch=kernel["arch_name"],
                                       **_problem_fields(kernel, hdim=72, hdim_v=72))  # fmt: skip
    with pytest.raises(errors.UnsupportedError, match="Available on"):
        ckfmha.Dispatcher().select_bwd(arch=kernel["arch_name"],
                                       **_problem_fields(kernel, hdim=72, hdim_v=72))  # fmt: skip


def test_sink_problem_runs_the_same_plan_and_explains_dsink(bwd_kernels):
    """Sinks change no kernel: the dot_do_o stage's launcher adds the dsink reduction."""
    if not bwd_kernels:
        pytest.skip("library built without backward kernels")
    kernel = bwd_kernels[0]
    dispatcher = ckfmha.Dispatcher()
    fields = _problem_fields(kernel)
    plan = dispatcher.select_bwd(arch=kernel["arch_name"], **fields)
    assert dispatcher.select_bwd(arch=kernel["arch_name"], sink=True, **fields) == plan
    text = dispatcher.explain_bwd(arch=kernel["arch_name"], sink=True, **fields)
    assert " sink on " in text.splitlines()[0], text
    assert "+ dsink: a second kernel of this stage" in text, text
    assert "dsink" not in dispatcher.explain_bwd(arch=kernel["arch_name"], **fields)


def test_backward_rejects_forward_only_features():
    with pytest.raises(errors.InvalidArgumentError, match="row-major V"):
        ckfmha.Dispatcher().select_bwd(arch=90, batch=1, nhead_q=2, seqlen_q=8, hdim=64,
                                       v_col_major=True)  # fmt: skip


def test_invalid_backward_problem_is_an_argument_error():
    with pytest.raises(errors.InvalidArgumentError, match="multiple of nhead_k"):
        ckfmha.Dispatcher().select_bwd(arch=90, batch=1, nhead_q=3, nhead_k=2, seqlen_q=8, hdim=64)


def _ptr(shape, dtype="fp16"):
    """A device pointer view that is never dereferenced: argument checks need no GPU."""
    return ckfmha.device_ptr(0x7F000000, shape, dtype)


BASE = {"do": _ptr((1, 2, 16, 64)), "q": _ptr((1, 2, 16, 64)), "k": _ptr((1, 2, 16, 64)),
        "v": _ptr((1, 2, 16, 64)), "o": _ptr((1, 2, 16, 64)), "lse": _ptr((1, 2, 16), "fp32")}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"o": _ptr((1, 2, 15, 64))}, r"o must have shape \(1, 2, 16, 64\)"),
        ({"do": _ptr((1, 2, 16, 32))}, r"do must have shape"),
        ({"lse": _ptr((1, 2, 15), "fp32")}, r"lse must be fp32 \[1, 2, 16\]"),
        ({"lse": _ptr((1, 2, 16), "fp16")}, r"lse must be fp32"),
        ({"o": _ptr((1, 2, 16, 64), "bf16")}, r"o must be fp16"),
        ({"k": _ptr((1, 2, 16, 32))}, r"k head dim 32 differs"),
        ({"v": _ptr((1, 2, 17, 64))}, r"v has 2 heads x 17 keys"),
    ],
)
def test_bwd_argument_errors(change, message):
    arrays = {**BASE, **change}
    with pytest.raises(errors.InvalidArgumentError, match=message):
        ckfmha.bwd(arrays["do"], arrays["q"], arrays["k"], arrays["v"], arrays["o"],
                   arrays["lse"])  # fmt: skip


def test_bwd_problem_errors_come_before_any_device_work():
    with pytest.raises(errors.InvalidArgumentError, match="causal=True or window"):
        ckfmha.bwd(*BASE.values(), causal=True, window=(1, 1))
    with pytest.raises(errors.InvalidArgumentError, match="dropout_p"):
        ckfmha.bwd(*BASE.values(), dropout_p=1.0)
    with pytest.raises(errors.InvalidArgumentError, match="dq_out must have shape"):
        ckfmha.bwd(*BASE.values(), dq_out=_ptr((1, 2, 16, 32)))


def test_bwd_varlen_argument_errors():
    q = _ptr((10, 2, 64))
    lse = _ptr((2, 10), "fp32")
    cu = ckfmha.device_ptr(0x7F000000, (3,), "int32")
    cu_short = ckfmha.device_ptr(0x7F000000, (2,), "int32")
    with pytest.raises(errors.InvalidArgumentError, match="cu_seqlens_k must hold"):
        ckfmha.bwd_varlen(q, q, q, q, q, lse, cu, cu_short, max_seqlen_q=6, max_seqlen_k=10)
    with pytest.raises(errors.InvalidArgumentError, match=r"lse must be fp32 \[2, 10\]"):
        ckfmha.bwd_varlen(q, q, q, q, q, _ptr((10, 2), "fp32"), cu, cu, max_seqlen_q=6,
                          max_seqlen_k=10)  # fmt: skip


def _ptr_at(address: int, shape, dtype="fp16"):
    return ckfmha.device_ptr(address, shape, dtype)


# Outputs apart from the inputs (which all lie at 0x7F000000), so the aliasing checks pass.
OUTPUTS = {"dq_out": _ptr_at(0x7F100000, (1, 2, 16, 64)),
           "dk_out": _ptr_at(0x7F200000, (1, 2, 16, 64)),
           "dv_out": _ptr_at(0x7F300000, (1, 2, 16, 64))}  # fmt: skip
SINK = _ptr_at(0x7F400000, (2,), "fp32")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"return_dsink": True}, r"return_dsink needs `sink`, the forward's sink logits"),
        ({"sink": _ptr((3,), "fp32"), "return_dsink": True},
         r"sink must be contiguous fp32 \[2\], got shape \(3,\)"),
        ({"sink": _ptr((2,), "fp16"), "return_dsink": True}, r"sink must be fp32"),
        ({"sink": _ptr((1, 2), "fp32"), "return_dsink": True}, r"sink must be 1-D"),
        ({"sink": ckfmha.device_ptr(0x7F400000, (2,), "fp32", strides=(2,)),
          "return_dsink": True}, r"sink: the last dimension must be contiguous"),
        ({"sink": SINK, "dsink_out": _ptr_at(0x7F500000, (2,), "fp32")},
         r"dsink_out is given but return_dsink is False"),
        ({"dsink_out": _ptr_at(0x7F500000, (2,), "fp32")},
         r"dsink_out is given but return_dsink is False"),
        ({"sink": SINK, "return_dsink": True, "dsink_out": _ptr_at(0x7F500000, (3,), "fp32"),
          **OUTPUTS}, r"dsink_out must have shape \(2,\), got \(3,\)"),
        ({"sink": SINK, "return_dsink": True, "dsink_out": _ptr_at(0x7F500000, (2,), "fp16"),
          **OUTPUTS}, r"dsink_out must be fp32"),
        ({"sink": SINK, "return_dsink": True, "dsink_out": _ptr_at(0x7F400004, (2,), "fp32"),
          **OUTPUTS}, r"dsink_out overlaps the input sink"),
        ({"sink": SINK, "return_dsink": True, "dsink_out": _ptr_at(0x7F300000, (2,), "fp32"),
          **OUTPUTS}, r"dv_out overlaps the output dsink_out"),
    ],
    ids=["no_sink", "sink_shape", "sink_dtype", "sink_2d", "sink_strided", "dsink_out_unasked",
         "dsink_out_without_sink", "dsink_out_shape", "dsink_out_dtype", "dsink_out_over_sink",
         "dsink_out_over_dv_out"],
)  # fmt: skip
def test_bwd_sink_argument_errors(options, message):
    with pytest.raises(errors.InvalidArgumentError, match=message):
        ckfmha.bwd(*BASE.values(), **options)


def test_bwd_varlen_sink_argument_errors():
    q = _ptr((10, 2, 64))
    lse = _ptr((2, 10), "fp32")
    cu = ckfmha.device_ptr(0x7F000000, (3,), "int32")
    with pytest.raises(errors.InvalidArgumentError, match="return_dsink needs `sink`"):
        ckfmha.bwd_varlen(q, q, q, q, q, lse, cu, cu, max_seqlen_q=6, max_seqlen_k=10,
                          return_dsink=True)  # fmt: skip
    with pytest.raises(errors.InvalidArgumentError, match=r"sink must be contiguous fp32 \[2\]"):
        ckfmha.bwd_varlen(q, q, q, q, q, lse, cu, cu, max_seqlen_q=6, max_seqlen_k=10,
                          sink=_ptr((8,), "fp32"), return_dsink=True)  # fmt: skip


@no_gpu
def test_bwd_without_gpu_raises_no_device():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 16, 64)).astype(np.float16)
    lse = np.zeros((1, 2, 16), np.float32)
    with pytest.raises(errors.NoDeviceError):
        ckfmha.bwd(q, q, q, q, q, lse, causal=True)


C_PROBE = r"""
#include <ckfmha/ckfmha.h>
#include <stdio.h>
#include <string.h>

static void report(const char* what, int status) {
  printf("%s %d %s\n", what, status, status ? ckfmha_last_error() : "");
}

int main(void) {
  ckfmha_bwd_problem p;
  report("init", ckfmha_bwd_problem_init(&p, CKFMHA_DTYPE_BF16, CKFMHA_LAYOUT_BSHD, 2, 8, 2,
                                         300, 257, 128, 128));
  printf("strides %lld %lld %lld %lld\n", (long long)p.do_stride[2], (long long)p.dq_stride[2],
         (long long)p.dk_stride[2], (long long)p.lse_stride[1]);
  size_t fast = 0, exact = 0;
  report("size_fast", ckfmha_bwd_workspace_size(&p, &fast));
  p.deterministic = 1;
  report("size_exact", ckfmha_bwd_workspace_size(&p, &exact));
  printf("bytes %zu %zu\n", fast, exact);
  p.deterministic = 2;
  report("bad_deterministic", ckfmha_bwd_problem_validate(&p));
  p.deterministic = 0;
  p.store_dbias = 1;
  report("dbias_without_bias", ckfmha_bwd_problem_validate(&p));
  p.bias = CKFMHA_BIAS_ALIBI;
  report("dbias_alibi", ckfmha_bwd_problem_validate(&p));
  p.bias = CKFMHA_BIAS_ELEMENTWISE;
  printf("dbias_strides %lld %lld %lld\n", (long long)p.dbias_stride[0],
         (long long)p.dbias_stride[1], (long long)p.dbias_stride[2]);
  report("dbias_full", ckfmha_bwd_problem_validate(&p));
  p.dbias_stride[1] = 0;
  report("dbias_broadcast_heads", ckfmha_bwd_problem_validate(&p));
  p.dbias_stride[1] = 300 * 257;
  p.dbias_stride[0] = 0;
  report("dbias_broadcast_batch", ckfmha_bwd_problem_validate(&p));
  p.dbias_stride[0] = 8 * 300 * 257;
  p.store_dbias = 0;
  p.bias = CKFMHA_BIAS_NONE;
  p.dk_stride[1] = -1;
  report("negative_stride", ckfmha_bwd_problem_validate(&p));
  p.dk_stride[1] = 128;
  report("run_null_args", ckfmha_bwd_run(&p, NULL, NULL, NULL));
  ckfmha_bwd_args a;
  memset(&a, 0, sizeof a);
  static char dummy[64] __attribute__((aligned(16)));
  a.q = a.k = a.v = a.o = a.do_ = dummy;
  a.dq = a.dk = a.dv = dummy;
  report("run_no_lse", ckfmha_bwd_run(&p, &a, NULL, NULL));
  a.lse = (const float*)dummy;
  report("run_no_workspace", ckfmha_bwd_run(&p, &a, NULL, NULL));
  a.workspace = dummy;
  a.workspace_bytes = 64;
  report("run_small_workspace", ckfmha_bwd_run(&p, &a, NULL, NULL));
  p.has_sink = 1;
  size_t with_sink = 0;
  report("size_sink", ckfmha_bwd_workspace_size(&p, &with_sink));
  printf("sink_bytes %zu\n", with_sink);
  report("run_sink_no_dsink", ckfmha_bwd_run(&p, &a, NULL, NULL));
  static float dsink[8];
  a.dsink = dsink;
  report("run_sink_no_sink", ckfmha_bwd_run(&p, &a, NULL, NULL));
  char text[8192];
  size_t needed = 0;
  report("explain_sink", ckfmha_bwd_explain(&p, 90, text, sizeof text, &needed));
  printf("explain_sink_mentions %d %d\n", strstr(text, " sink on sm_90") != NULL,
         strstr(text, "+ dsink") != NULL);
  /* Empty problems: dsink is still written (a memset), so its pointer is still required. */
  a.dsink = NULL;
  p.batch = 0;
  report("run_empty_sink_no_dsink", ckfmha_bwd_run(&p, &a, NULL, NULL));
  report("explain_empty_sink", ckfmha_bwd_explain(&p, 90, text, sizeof text, &needed));
  printf("explain_empty_sink_text %s", strchr(text, '\n') + 1);
  p.has_sink = 0;
  report("explain_empty", ckfmha_bwd_explain(&p, 90, text, sizeof text, &needed));
  printf("explain_empty_text %s", strchr(text, '\n') + 1);
  p.batch = 2;
  p.hdim_q = p.hdim_v = 72;
  char names[1024];
  report("select_unsupported", ckfmha_bwd_select(&p, 90, names, sizeof names));
  return 0;
}
"""


@needs_cc
def test_c_api_checks_and_workspace_size(tmp_path: Path):
    source = tmp_path / "probe.c"
    source.write_text(textwrap.dedent(C_PROBE))
    program = build_c_program(source, tmp_path / "probe")
    out = subprocess.run([str(program)], capture_output=True, text=True, check=True).stdout
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in out.splitlines()}
    assert lines["init"].startswith("0")
    # BSHD: row strides are heads * head dim; the LSE is [batch, heads, rows] (head stride).
    assert lines["strides"] == f"{8 * 128} {8 * 128} {2 * 128} 300"
    fast, exact = (int(x) for x in lines["bytes"].split())
    # Each head's 300 rows are padded to whole 64-row blocks.
    rows = 2 * 8 * 320

    def round_up(n: int) -> int:
        return (n + 255) // 256 * 256

    # D, the log2-domain LSE, then the dQ accumulator: one slice in fast mode, `splits`
    # when deterministic.
    assert fast == 2 * round_up(4 * rows) + round_up(4 * rows * 128)
    splits = min(math.ceil(257 / 128), max(1, math.ceil(264 / (2 * 2))))
    assert exact == 2 * round_up(4 * rows) + round_up(4 * rows * 128 * splits)
    assert lines["bad_deterministic"].startswith("1 deterministic must be 0")
    assert lines["dbias_without_bias"].startswith("1 store_dbias needs an elementwise bias")
    assert lines["dbias_alibi"].startswith("1 store_dbias needs an elementwise bias")
    assert "ALiBi has no gradient" in lines["dbias_alibi"]
    # dbias defaults to a contiguous [batch, nhead_q, seqlen_q, seqlen_k].
    assert lines["dbias_strides"] == f"{8 * 300 * 257} {300 * 257} 257"
    assert lines["dbias_full"].startswith("0")
    assert lines["dbias_broadcast_heads"].startswith("1 dbias head stride is 0 over 8 entries")
    assert lines["dbias_broadcast_batch"].startswith("1 dbias batch stride is 0 over 2 entries")
    assert lines["negative_stride"].startswith("1 dk head stride is -1")
    assert lines["run_null_args"].startswith("1 args is NULL")
    assert lines["run_no_lse"].startswith("1 lse is NULL")
    assert lines["run_no_workspace"].startswith("1 workspace is NULL")
    assert lines["run_small_workspace"].startswith("1 workspace of 64 bytes is too small")
    # Sinks need no workspace of their own: dsink is reduced from D and the LSE rows.
    assert lines["size_sink"].startswith("0") and int(lines["sink_bytes"]) == fast
    assert lines["run_sink_no_dsink"].startswith("1 has_sink is set but args.dsink is NULL")
    assert lines["run_sink_no_sink"].startswith("1 has_sink is set but args.sink is NULL")
    assert lines["explain_sink_mentions"] == "1 1"
    assert lines["run_empty_sink_no_dsink"].startswith(
        "1 has_sink is set but args.dsink is NULL")
    # Without queries dsink is 0 (a memset); other gradients are then empty as well.
    assert "dsink too, with sinks" in lines["explain_empty_sink_text"]
    assert lines["explain_empty_text"] == "no kernel runs: every gradient is empty"
    assert lines["select_unsupported"].startswith("2 no compiled bwd_dq_dk_dv kernel fits bwd")


def test_sm90_main_stage_is_preferred_in_fast_mode_and_explained_otherwise():
    hopper = [k for k in ckfmha.Registry().kernels()
              if k["family"] == "bwd_dq_dk_dv" and k["pipeline"] == "sm90_tma_wgmma"]  # fmt: skip
    if not hopper:
        pytest.skip("library built without sm90 backward kernels")
    dispatcher = ckfmha.Dispatcher()
    for kernel in hopper:
        # The Hopper main stage's elementwise bias is one row per sequence (key padding).
        fields = _problem_fields(kernel, bias=kernel["bias"],
                                 bias_rows_broadcast=kernel["bias"] == "elementwise")
        assert dispatcher.select_bwd(arch=kernel["arch_name"], **fields)[1] == kernel["name"]
        text = dispatcher.explain_bwd(arch=kernel["arch_name"], deterministic=True, **fields)
        assert (f"rejected  {kernel['name']}: sm90_tma_wgmma adds dQ with fp32 atomics (fast "
                "mode only); deterministic mode runs on sm80_cpasync_mma") in text, text
