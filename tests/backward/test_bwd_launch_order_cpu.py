"""The Hopper backward's causal launch order, as the host computes it (bwd_launch_order.hpp):
each key tile's query rows against a direct count, and the chunks against what they promise
(every pair in exactly one chunk, one-wave chunks where asked, and after one-pair chunks a last
chunk just large enough that its work per SM covers its longest CTA)."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from support.paths import REPO_ROOT

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")

DRIVER = r"""
#include "ckfmha/kernel/sm90/bwd_launch_order.hpp"
#include <cstdio>
int main() {
  long long pairs; int sq, sk, block_n, bottom_right, sms, wave;
  while (std::scanf("%lld %d %d %d %d %d %d", &pairs, &sq, &sk, &block_n, &bottom_right,
                    &sms, &wave) == 7) {
    auto work = ckfmha::kernel::causal_key_tile_work(sq, sk, block_n, bottom_right != 0);
    const int key_tiles = (sk + block_n - 1) / block_n;
    auto c = ckfmha::kernel::bwd_sm90_causal_chunks(pairs, key_tiles, sms, wave != 0, work);
    std::printf("%.1f %.1f %d %d %d %lld\n", work.rows_per_pair, work.longest_rows,
                c.chunk_pairs, c.last_pairs, c.full_chunks, (long long)c.ctas);
  }
}
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("launch_order")
    source, program = folder / "driver.cpp", folder / "driver"
    source.write_text(DRIVER)
    command = ["c++", "-std=c++17", "-O1", f"-I{REPO_ROOT / 'cpp' / 'include'}", str(source),
               "-o", str(program)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return program


def run(driver: Path, cases: list[tuple[int, ...]]) -> list[list[float]]:
    stdin = "".join(" ".join(map(str, case)) + "\n" for case in cases)
    out = subprocess.run([str(driver)], input=stdin, capture_output=True, text=True, check=True)
    return [[float(x) for x in line.split()] for line in out.stdout.splitlines()]


def counted_rows(sq: int, sk: int, block_n: int, bottom_right: bool) -> list[int]:
    """Query rows that see at least one key of each key tile, counted row by row."""
    offset = sk - sq if bottom_right else 0
    rows = np.arange(sq)
    tiles = []
    for start in range(0, sk, block_n):
        # Row i sees key j iff j <= i + offset: it sees the tile iff its first key does.
        tiles.append(int(np.count_nonzero(start <= rows + offset)))
    return tiles


def covers(pairs: int, rows_per_pair: float, longest_rows: float, sms: int) -> bool:
    """Whether `pairs` pairs' work per SM is at least their longest CTA's."""
    return pairs * rows_per_pair / sms >= longest_rows * (1 - 1e-9)


def draw_cases(seed: int, count: int) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(count):
        sq, sk = (int(x) for x in rng.integers(1, 9000, size=2))
        pairs = int(rng.choice([1, 2, 3, 6, 18, 75, 640, 4096]))
        cases.append((pairs, sq, sk, int(rng.choice([64, 128])), int(rng.integers(0, 2)),
                      int(rng.choice([78, 114, 132])), int(rng.integers(0, 2))))  # fmt: skip
    # Fixed corners: one key tile, one row, keys far past the rows, rows far past the keys.
    cases += [(8, 1, 1, 128, 1, 132, 0), (8, 64, 1, 64, 0, 132, 1), (4, 3, 9000, 128, 1, 132, 0),
              (4, 9000, 3, 128, 1, 132, 0), (4, 9000, 3, 128, 0, 132, 1)]  # fmt: skip
    return cases


def test_key_tile_rows_match_a_direct_count(driver: Path) -> None:
    cases = draw_cases(1, 200)
    for case, (rows, longest, *_) in zip(cases, run(driver, cases), strict=True):
        _, sq, sk, block_n, bottom_right, _, _ = case
        tiles = counted_rows(sq, sk, block_n, bool(bottom_right))
        assert rows == sum(tiles), case
        assert longest == max(tiles), case


def test_chunks_cover_every_pair_once_in_the_promised_sizes(driver: Path) -> None:
    cases = draw_cases(2, 300)
    for case, (rows, longest, chunk, last, full, ctas) in zip(cases, run(driver, cases),
                                                              strict=True):  # fmt: skip
        pairs, _, sk, block_n, _, sms, wave = case
        key_tiles = -(-sk // block_n)
        assert ctas == pairs * key_tiles, case
        if pairs == 1:
            assert chunk == 0, case  # grid order
            continue
        assert full * chunk + last == pairs, case
        assert 1 <= last, case
        if wave and sms // key_tiles > 1:
            assert chunk == min(pairs, sms // key_tiles), case
            assert last <= chunk, case  # the remainder of the pairs
            continue
        assert chunk == 1, case
        # The last chunk covers its longest CTA with the fewest pairs (or takes them all).
        assert covers(last, rows, longest, sms) or last == pairs, case
        assert last == 1 or not covers(last - 1, rows, longest, sms), case
        assert last == max(1, min(pairs, math.ceil(sms * longest / rows))), case
