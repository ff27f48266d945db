"""All-pairs (pairwise) covering sets: every pair of values of any two factors appears together
in at least one chosen combination. Exhaustive feature cross-products grow multiplicatively;
pairwise covering grows roughly with the product of the two largest factors, and catches
every bug that needs only two features to interact."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

Combo = dict[str, Any]


def _pairs(combo: Mapping[str, Any], names: Sequence[str]) -> set[tuple[str, Any, str, Any]]:
    return {(a, combo[a], b, combo[b]) for a, b in itertools.combinations(names, 2)}


def all_pairs(factors: Mapping[str, Sequence[Any]]) -> list[Combo]:
    """Greedy covering: repeatedly take the combination covering the most uncovered pairs
    (first in product order on ties), so the result is deterministic."""
    names = list(factors)
    everything = [dict(zip(names, values)) for values in itertools.product(*factors.values())]
    uncovered = set().union(*(_pairs(c, names) for c in everything))
    chosen: list[Combo] = []
    while uncovered:
        best = max(everything, key=lambda c: len(_pairs(c, names) & uncovered))
        chosen.append(best)
        uncovered -= _pairs(best, names)
    return chosen


def covers_all_pairs(factors: Mapping[str, Sequence[Any]], combos: Sequence[Combo]) -> bool:
    names = list(factors)
    needed = {
        (a, va, b, vb)
        for a, b in itertools.combinations(names, 2)
        for va in factors[a]
        for vb in factors[b]
    }
    return needed <= set().union(*(_pairs(c, names) for c in combos))
