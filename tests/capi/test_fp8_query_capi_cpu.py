"""fp8 queries through the C API, from C, without a GPU: what ckfmha_fwd_problem_init sets, every
problem the Hopper fp8 forward cannot take (refused by ckfmha_fwd_problem_validate with a
message naming the field), the device scale's checks in ckfmha_fwd_run (made before anything
reaches a device), and what select and explain say of fp8 queries on sm_80 and sm_90."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.c_programs import build_c_program, needs_cc

pytestmark = needs_cc

# Each case changes a valid fp8 problem (bf16 output, Q, K and V e4m3, d128, BSHD) and prints
# "<case>\t<status>\t<ckfmha_last_error()>" after validating it; the run cases call
# ckfmha_fwd_run on made-up 16-byte aligned addresses.
PROGRAM = r"""
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "ckfmha/ckfmha.h"

static ckfmha_fwd_problem fp8_problem(void) {
  ckfmha_fwd_problem p;
  ckfmha_fwd_problem_init(&p, CKFMHA_DTYPE_BF16, CKFMHA_LAYOUT_BSHD, 2, 8, 2, 256, 256, 128, 128);
  p.kv_quant = CKFMHA_KV_QUANT_FP8_E4M3;
  p.q_quant = CKFMHA_KV_QUANT_FP8_E4M3;
  return p;
}

static void report(const char* name, int status) {
  printf("%s\t%s\t%s\n", name, ckfmha_status_name(status),
         status == CKFMHA_SUCCESS ? "" : ckfmha_last_error());
}

static void validate(const char* name, ckfmha_fwd_problem p) {
  report(name, ckfmha_fwd_problem_validate(&p));
}

static void run_scales(const char* name, ckfmha_fwd_problem p, const float* q_scale,
                       const float* k_scale, const float* v_scale) {
  ckfmha_fwd_args a;
  memset(&a, 0, sizeof a);
  a.q = (const void*)(uintptr_t)0x100000;
  a.k = (const void*)(uintptr_t)0x200000;
  a.v = (const void*)(uintptr_t)0x300000;
  a.o = (void*)(uintptr_t)0x400000;
  a.q_scale = q_scale;
  a.k_scale = k_scale;
  a.v_scale = v_scale;
  report(name, ckfmha_fwd_run(&p, &a, NULL, NULL));
}

static void run(const char* name, ckfmha_fwd_problem p, const float* q_scale) {
  run_scales(name, p, q_scale, NULL, NULL);
}

int main(void) {
  ckfmha_fwd_problem p;
  ckfmha_fwd_problem_init(&p, CKFMHA_DTYPE_FP16, CKFMHA_LAYOUT_BHSD, 1, 1, 1, 64, 64, 64, 64);
  printf("init\t%d\t%g\n", (int)p.q_quant, p.q_scale);

  validate("valid", fp8_problem());
  p = fp8_problem(); p.mask = CKFMHA_MASK_CAUSAL_BOTTOM_RIGHT; p.store_lse = 1; p.mode = CKFMHA_MODE_GROUP;
  p.total_q = 512; p.total_k = 512;
  validate("valid_group_causal_lse", p);
  p = fp8_problem(); p.kv_quant = CKFMHA_KV_QUANT_NONE; validate("kv_in_dtype", p);
  p = fp8_problem(); p.q_quant = (ckfmha_kv_quant)7; validate("unknown_q_quant", p);
  p = fp8_problem(); p.q_scale = 0.f; validate("zero_q_scale", p);
  p = fp8_problem(); p.q_scale = -2.f; validate("negative_q_scale", p);
  p = fp8_problem(); p.q_scale = NAN; validate("nan_q_scale", p);
  p = fp8_problem(); p.q_scale = INFINITY; validate("inf_q_scale", p);
  p = fp8_problem(); p.kv_storage = CKFMHA_KV_PAGED_TABLE; p.page_size = 16;
  p.max_pages_per_seq = 16; p.block_table_stride = 16; p.num_pages = 32; validate("paged", p);
  p = fp8_problem(); p.bias = CKFMHA_BIAS_ELEMENTWISE; validate("bias", p);
  p = fp8_problem(); p.bias = CKFMHA_BIAS_ALIBI; validate("alibi", p);
  p = fp8_problem(); p.dropout_p = 0.1f; validate("dropout", p);
  p = fp8_problem(); p.softcap = 30.f; validate("softcap", p);
  p = fp8_problem(); p.has_sink = 1; validate("sink", p);
  p = fp8_problem(); p.hdim_v = 64; p.v_stride[2] = 2 * 64; p.o_stride[2] = 8 * 64;
  validate("unequal_head_dims", p);
  p = fp8_problem(); p.q_stride[2] = 8 * 128 + 8; validate("q_stride_not_16", p);
  p = fp8_problem(); p.k_stride[1] = 136; validate("k_stride_not_16", p);
  /* A scale the plain problem ignores: only fp8 queries read it. */
  p = fp8_problem(); p.q_quant = CKFMHA_KV_QUANT_NONE; p.kv_quant = CKFMHA_KV_QUANT_NONE;
  p.q_scale = 0.f; validate("plain_ignores_q_scale", p);

  static float scales[4];
  p = fp8_problem(); p.q_quant = CKFMHA_KV_QUANT_NONE; p.kv_quant = CKFMHA_KV_QUANT_NONE;
  run("run_q_scale_without_fp8_q", p, scales);
  run("run_misaligned_q_scale", fp8_problem(), (const float*)((const char*)scales + 2));

  /* Per-block scales: fp8 queries only, not per head, all three device arrays. */
  p = fp8_problem(); p.fp8_block_scales = 1; validate("valid_block_scales", p);
  p = fp8_problem(); p.fp8_block_scales = 2; validate("block_scales_not_a_flag", p);
  p = fp8_problem(); p.fp8_block_scales = 1; p.q_quant = CKFMHA_KV_QUANT_NONE;
  validate("block_scales_without_fp8_q", p);
  p = fp8_problem(); p.fp8_block_scales = 1; p.kv_scale_per_head = 1;
  validate("block_scales_per_head", p);
  p = fp8_problem(); p.fp8_block_scales = 1;
  run_scales("run_block_scales_without_k", p, scales, NULL, NULL);
  run_scales("run_block_scales_without_q", p, NULL, scales, scales);
  printf("block_macros\t%d\t%d %d %d\n", CKFMHA_FP8_SCALE_BLOCK, CKFMHA_FP8_SCALE_BLOCKS(1),
         CKFMHA_FP8_SCALE_BLOCKS(128), CKFMHA_FP8_SCALE_BLOCKS(129));

  char text[65536];
  p = fp8_problem();
  report("select_sm80", ckfmha_fwd_select(&p, 80, text, sizeof text));
  int status = ckfmha_fwd_select(&p, 90, text, sizeof text);
  printf("select_sm90\t%s\t%s\n", ckfmha_status_name(status),
         status == CKFMHA_SUCCESS ? text : ckfmha_last_error());
  for (int arch = 80; arch <= 90; arch += 10) {
    status = ckfmha_fwd_explain(&p, arch, text, sizeof text, NULL);
    for (char* c = text; *c; ++c) if (*c == '\n' || *c == '\t') *c = ' ';
    printf("explain_sm%d\t%s\t%s\n", arch, ckfmha_status_name(status), text);
  }
  size_t needed = 0;
  ckfmha_registry_json(NULL, 0, &needed);
  static char json[1 << 22];
  status = needed <= sizeof json ? ckfmha_registry_json(json, sizeof json, NULL) : -1;
  printf("registry_json\t%d\t%d\n", status, strstr(json, "\"q_quant\": ") != NULL);
  return 0;
}
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    directory: Path = tmp_path_factory.mktemp("fp8_query")
    source = directory / "fp8_query.c"
    source.write_text(PROGRAM)
    program = build_c_program(source, directory / "fp8_query", "-std=c11", "-Wall", "-Werror")
    out = subprocess.run([str(program)], capture_output=True, text=True, check=True).stdout
    rows = (line.split("\t") for line in out.splitlines())
    return {name: (status, message) for name, status, message in rows}


def test_init_leaves_queries_in_dtype(results: dict[str, tuple[str, str]]) -> None:
    assert results["init"] == ("0", "1")


def test_init_leaves_block_scales_off(results: dict[str, tuple[str, str]]) -> None:
    # fp8_problem() starts from ckfmha_fwd_problem_init: a valid problem with the flag off.
    assert results["valid"] == ("CKFMHA_SUCCESS", "")
    assert results["block_macros"] == ("128", "1 1 2")


@pytest.mark.parametrize(
    "case", ["valid", "valid_group_causal_lse", "plain_ignores_q_scale", "valid_block_scales"]
)
def test_valid_problems(results: dict[str, tuple[str, str]], case: str) -> None:
    assert results[case] == ("CKFMHA_SUCCESS", "")


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("kv_in_dtype", "need fp8 K/V (kv_quant fp8_e4m3): both products, Q K^T and P V, run"),
        ("unknown_q_quant", "q_quant 7 is not one of none (0), fp8_e4m3 (1)"),
        ("zero_q_scale", "q_scale is 0; an fp8 tensor stands for scale * code"),
        ("negative_q_scale", "q_scale is -2;"),
        ("nan_q_scale", "q_scale is nan;"),
        ("inf_q_scale", "q_scale is inf;"),
        ("paged", "fp8 queries take contiguous K/V only"),
        ("bias", "this problem has bias"),
        ("alibi", "this problem has ALiBi"),
        ("dropout", "this problem has dropout"),
        ("softcap", "this problem has soft-cap"),
        ("sink", "this problem has sink"),
        ("unequal_head_dims", "fp8 queries need hdim_q == hdim_v"),
        ("q_stride_not_16", "fp8 queries: q seq stride 1032 is not a multiple of 16"),
        ("k_stride_not_16", "fp8 queries: k head stride 136 is not a multiple of 16"),
        ("run_q_scale_without_fp8_q", "args.q_scale is set, but the queries are not quantised"),
        ("run_misaligned_q_scale", "args.q_scale must be fp32-aligned"),
        ("block_scales_not_a_flag", "fp8_block_scales 2 is not 0 or 1"),
        ("block_scales_without_fp8_q",
         "per-block scales (fp8_block_scales) need fp8 queries (q_quant fp8_e4m3)"),
        ("block_scales_per_head",
         "per-block scales exclude kv_scale_per_head: block scales are already per head"),
        ("run_block_scales_without_k",
         "per-block scales (fp8_block_scales) need args.q_scale, args.k_scale and args.v_scale"),
        ("run_block_scales_without_q",
         "per-block scales (fp8_block_scales) need args.q_scale, args.k_scale and args.v_scale"),
    ],
)  # fmt: skip
def test_refusals_say_why(results: dict[str, tuple[str, str]], case: str, message: str) -> None:
    status, text = results[case]
    assert status == "CKFMHA_ERROR_INVALID_ARGUMENT"
    assert message in text


@pytest.mark.parametrize(
    ("case", "status", "texts"),
    [
        ("select_sm80", "CKFMHA_ERROR_UNSUPPORTED",
         ["fp8 queries need sm_90a: the e4m3 products run on wgmma; this is sm_80"]),
        ("explain_sm80", "CKFMHA_SUCCESS",
         ["q=fp8_e4m3 kv=fp8_e4m3 on sm_80", "plan: none: fp8 queries need sm_90a"]),
        ("explain_sm90", "CKFMHA_SUCCESS", ["q=fp8_e4m3 kv=fp8_e4m3 on sm_90"]),
    ],
)  # fmt: skip
def test_plans_say_where_fp8_queries_run(
    results: dict[str, tuple[str, str]], case: str, status: str, texts: list[str]
) -> None:
    assert results[case][0] == status
    for text in texts:
        assert text in results[case][1]


def test_sm90_selects_an_fp8_forward_or_names_the_problem(
    results: dict[str, tuple[str, str]],
) -> None:
    status, text = results["select_sm90"]
    if status == "CKFMHA_SUCCESS":
        assert text.startswith("fwd_bf16_batch_d128x128_") and "_qkve4m3__sm_90a_" in text
        explanation = results["explain_sm90"][1]
        assert f"selected  {text}" in explanation
        assert "run the one-stage Hopper forward" in explanation
        # The forward kernels reading Q in bf16 say why they do not fit.
        assert "reads Q in bf16, problem has fp8 Q" in explanation
    else:
        # A build without sm_90a kernels: the message names the problem, fp8 queries included.
        assert status == "CKFMHA_ERROR_UNSUPPORTED"
        assert "no compiled forward kernel fits fwd bf16 batch" in text
        assert "q=fp8_e4m3" in text


def test_registry_json_names_q_quant(results: dict[str, tuple[str, str]]) -> None:
    assert results["registry_json"] == ("0", "1")
