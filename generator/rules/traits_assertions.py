"""Numbers the rules compute about a template that its C++ traits struct defines as well.

The rules size shared memory, threads per CTA and register budgets in Python; the traits
compute the same numbers in C++. Every generated instance asserts that the two agree (emit.py
writes a static_assert for each TraitsAssertion), so a change to one side that the other does
not follow stops the build, instead of the rules accepting configs the kernel cannot run or
rejecting ones it can.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TraitsAssertion:
    """`Traits::<member> == value`, with what the number is and which rules module computed it,
    for the message nvcc prints when they disagree."""

    member: str  # e.g. "kSmemBytes"
    value: int | bool
    what: str  # what the number is, e.g. "shared-memory bytes"
    source: str  # e.g. "generator/rules/sm80_fwd.py"

    @property
    def cpp_value(self) -> str:
        if isinstance(self.value, bool):
            return "true" if self.value else "false"
        return str(self.value)


def assertions_from(
    module: str, *facts: tuple[str, int | bool, str]
) -> tuple[TraitsAssertion, ...]:
    """TraitsAssertions of (member, value, what) computed by the rules module named `module`
    (its __name__)."""
    source = module.replace(".", "/") + ".py"
    return tuple(TraitsAssertion(member, value, what, source) for member, value, what in facts)
