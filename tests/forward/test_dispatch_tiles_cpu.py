"""Which tile the dispatcher picks when a signature is built with several query-tile heights.

No kernel set built in CI has such a signature for the forward family, so the test
registers a module of its own: a C kernel table with two entries of each of two made-up
signatures (the tile table's default first: a 192-row tile then a 128-row one without a
bias; with an elementwise bias the 128-row tile, then the 192-row companion for row-broadcast
biases, whose entry says so in bias_rows_only), whose launch functions are never called. The
module loads in a child process so the registry of the other tests never sees it.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from support.c_programs import needs_cc

import ckfmha

MODULE_SOURCE = r"""
#include "ckfmha/kernel_entry.h"

static int never_launched(const void* problem, const void* args,
                          const ckfmha_launch_context* context, ckfmha_stream_t stream) {
  (void)problem; (void)args; (void)context; (void)stream;
  return -1;
}

#define ENTRY(NAME, BIAS, TILE_M, WARPS, ROWS_ONLY)                                      \
  {NAME, CKFMHA_FAMILY_FWD, CKFMHA_DTYPE_FP16, CKFMHA_MODE_BATCH, 40, 40,                \
   CKFMHA_MASK_KIND_NONE, BIAS, 1, 0, 0, 0, 0, 0, CKFMHA_ROPE_NONE, 0,                   \
   CKFMHA_PAGE_LAYOUT_LINEAR, CKFMHA_KV_QUANT_NONE, CKFMHA_KV_QUANT_NONE, 90, "sm_90a",  \
   "sm90_tma_wgmma", TILE_M, 128, 40, WARPS, 2,                                          \
   never_launched, NULL, ROWS_ONLY}

/* Plain: the 192-row default first. Elementwise bias: the 128-row default first, then the
   192-row companion, which takes row-broadcast biases only. */
static const ckfmha_kernel_entry entries[] = {
    ENTRY("test_fwd_fp16_d40_m192", CKFMHA_BIAS_NONE, 192, 16, 0),
    ENTRY("test_fwd_fp16_d40_m128", CKFMHA_BIAS_NONE, 128, 12, 0),
    ENTRY("test_fwd_fp16_d40_bias_m128", CKFMHA_BIAS_ELEMENTWISE, 128, 12, 0),
    ENTRY("test_fwd_fp16_d40_bias_m192", CKFMHA_BIAS_ELEMENTWISE, 192, 16, 1),
};

static const ckfmha_kernel_table table = {CKFMHA_KERNEL_ABI_VERSION, 4, entries};

const ckfmha_kernel_table* ckfmha_module_kernel_table(void) { return &table; }
"""

CHILD = r"""
import json, sys
import ckfmha
ckfmha.Registry().load_module(sys.argv[1])
picks = {}
for seqlen in map(int, sys.argv[2:]):
    problem = ckfmha.FwdProblem(batch=2, nhead_q=4, seqlen_q=seqlen, hdim=40, dtype="fp16",
                                lse=True)
    picks[seqlen] = ckfmha.Dispatcher().select(problem, arch="sm_90a")
print(json.dumps(picks))
"""

BIAS_CHILD = r"""
import json, sys
import ckfmha
ckfmha.Registry().load_module(sys.argv[1])
dispatcher = ckfmha.Dispatcher()
picks = {}
for broadcast in (False, True):
    for seqlen in (2048, 100):
        problem = ckfmha.FwdProblem(batch=2, nhead_q=4, seqlen_q=seqlen, hdim=40, dtype="fp16",
                                    lse=True, bias="elementwise", bias_rows_broadcast=broadcast)
        picks[f"{broadcast} {seqlen}"] = dispatcher.select(problem, arch="sm_90a")
full = ckfmha.FwdProblem(batch=2, nhead_q=4, seqlen_q=2048, hdim=40, dtype="fp16", lse=True,
                         bias="elementwise")
picks["explain"] = dispatcher.explain(full, arch="sm_90a")
print(json.dumps(picks))
"""


def _build_module(tmp_path: Path) -> Path:
    source = tmp_path / "two_tiles.c"
    source.write_text(MODULE_SOURCE)
    module = tmp_path / "two_tiles.so"
    command = ["cc", "-shared", "-fPIC", str(source), f"-I{ckfmha.get_include()[-1]}", "-o",
               str(module)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{shlex.join(command)}\n{result.stdout}{result.stderr}"
    return module


@needs_cc
def test_padding_under_an_eighth_keeps_the_table_order(tmp_path: Path) -> None:
    module = _build_module(tmp_path)
    seqlens = [384, 2048, 8192, 512, 100, 200, 1100]
    result = subprocess.run([sys.executable, "-c", CHILD, str(module), *map(str, seqlens)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    picks = {int(seqlen): name for seqlen, name in json.loads(result.stdout).items()}
    m192, m128 = "test_fwd_fp16_d40_m192", "test_fwd_fp16_d40_m128"
    # No padding in either, or the 192-row tile's under an eighth of its rows
    # (64 of 2112, of 8256; 64 of 576 is 11%): the table's first entry.
    assert picks[384] == m192
    assert picks[2048] == m192
    assert picks[8192] == m192
    assert picks[512] == m192
    # Past an eighth the tile that pads fewer rows wins: 100 rows pad 28 of
    # 128 against 92 of 192; 200 pad 56 of 256 against 184 of 384; 1100 pad
    # 52 of 1152 (under an eighth) against 52 of 1152 for 192 rows too: a tie,
    # so the table's order again.
    assert picks[100] == m128
    assert picks[200] == m128
    assert picks[1100] == m192


@needs_cc
def test_row_broadcast_biases_take_the_companion_tile(tmp_path: Path) -> None:
    module = _build_module(tmp_path)
    result = subprocess.run([sys.executable, "-c", BIAS_CHILD, str(module)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    picks = json.loads(result.stdout)
    m128, m192 = "test_fwd_fp16_d40_bias_m128", "test_fwd_fp16_d40_bias_m192"
    # A bias with a row per query: the companion refuses it, and says why.
    assert picks["False 2048"] == m128 and picks["False 100"] == m128
    assert re.search(rf"rejected  {m192}: takes an elementwise bias broadcast over the query "
                     r"rows only \(\[b, 1 or h, 1, sk\]", picks["explain"]), picks["explain"]
    # A row-broadcast bias: the companion where it pads no more rows than the default tile.
    assert picks["True 2048"] == m192
    assert picks["True 100"] == m128
