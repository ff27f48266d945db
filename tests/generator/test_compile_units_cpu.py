"""Compile units (instances of one template compiled together) and kernel names read back."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from generator import emit
from generator.enumerate import PARTIAL_TEMPLATES, select
from generator.names import parse_kernel_name
from generator.receipts import RECEIPTS, get_receipt
from generator.specs import load_specs
from generator.units import plan_units

SPECS = load_specs()


def _core(arch: str) -> list:
    return select(get_receipt("core"), SPECS[arch]).accepted


def _templates(configs: list) -> dict[str, str]:
    return {c.name: emit.template_for(c).header for c in configs}


@pytest.mark.parametrize("jobs", [1, 2, 16, 1000])
def test_units_cover_every_instance_once_grouped_by_arch_and_template(jobs: int) -> None:
    configs = _core("sm_90a") + _core("sm_80")
    units = plan_units(configs, jobs, _templates(configs))
    names = [c.name for unit in units for c in unit.configs]
    assert sorted(names) == sorted(c.name for c in configs)
    per_unit = max(1, min(12, -(-len(configs) // jobs)))
    for unit in units:
        assert 1 <= len(unit.configs) <= per_unit
        assert {c.algorithm.arch for c in unit.configs} == {unit.arch}
        assert len({emit.template_for(c).header for c in unit.configs}) == 1
    assert [len(u.configs) for u in units] == sorted((len(u.configs) for u in units), reverse=True)
    assert len({u.name for u in units}) == len(units)
    if jobs >= len(configs):
        assert len(units) == len(configs), "as many jobs as instances: one instance per unit"


def test_units_split_a_template_evenly() -> None:
    configs = [c for c in _core("sm_80") if c.signature.family == "fwd"]
    configs = [c for c in configs if emit.template_for(c).header.endswith("sm80/fwd_launch.cuh")]
    assert len(configs) >= 5
    sizes = [len(u.configs) for u in plan_units(configs, 2, _templates(configs), max_per_unit=4)]
    assert max(sizes) - min(sizes) <= 1 and max(sizes) <= 4


def test_rendered_unit_includes_its_instances(tmp_path: Path) -> None:
    configs = _core("sm_80")[:3]
    emitted = emit.emit(tmp_path, configs, [], SPECS, jobs=1)
    assert emitted.units, "units are written beside the instances"
    included = []
    for path, unit in emitted.units:
        text = path.read_text()
        assert text.startswith(emit.GENERATED_BANNER + "\n")
        included += [line.split('"')[1] for line in text.splitlines() if line.startswith("#incl")]
        assert [f"{c.name}.cu" for c in unit.configs] == included[-len(unit.configs):]
    assert sorted(included) == sorted(p.name for p in emitted.instances)


def test_instances_name_their_traits_in_their_own_namespace() -> None:
    """Two instances in one unit must not define the same alias."""
    first, second = _core("sm_90a")[:2]
    for config in (first, second):
        text = emit.render_instance(config)
        assert f"namespace {emit.instance_namespace(config)} {{" in text
        assert f"<{emit.instance_namespace(config)}::Traits>" in text
    assert emit.instance_namespace(first) != emit.instance_namespace(second)


def test_every_kernel_name_reads_back_as_its_config() -> None:
    seen = 0
    for receipt, arch in itertools.product(RECEIPTS.values(), SPECS):
        for config in select(receipt, SPECS[arch]).accepted:
            assert parse_kernel_name(config.name) == config, config.name
            seen += 1
    assert seen > 1000


@pytest.mark.parametrize(
    "name",
    [
        "fwd_bf16_batch_d128x128_none_lse",  # no algorithm part
        "fwd_bf16_batch_d128x128_none_lse__sm_90a_sm80_cpasync_mma_m128n32k128_w4",
        "fwd_bf16_batch_d128x128_causal_bias_alibi_lse__sm_80_sm80_cpasync_mma_m128n32k128_w4s1",
        "fwd_bf16_batch_d128x128_none_nolse_sink_drop__sm_80_sm80_cpasync_mma_m128n32k128_w4s1",
        "fwd_int8_batch_d128x128_none_lse__sm_80_sm80_cpasync_mma_m128n32k128_w4s1",
        "bwd_dq_dk_dv_bf16_batch_d128x128_none_dbias_drop__sm_80_sm80_cpasync_mma_m64n128k128_w8s2",
    ],
)
def test_names_the_generator_would_not_write_are_refused(name: str) -> None:
    assert parse_kernel_name(name) is None


def test_a_name_outside_every_kernel_set_reads_back() -> None:
    """First use builds signatures no kernel set lists (soft-cap alone, for one)."""
    name = "fwd_bf16_batch_d128x128_none_lse_softcap__sm_90a_sm80_cpasync_mma_m128n32k128_w4s1"
    config = parse_kernel_name(name)
    assert config is not None and config.signature.softcap and config.name == name
    assert not any(
        c.name == name for r in RECEIPTS.values() for c in select(r, SPECS["sm_90a"]).accepted
    )


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_core_set_holds_every_template_of_the_arch(arch: str) -> None:
    """A plain install builds the core set, so CI's install proves every template compiles."""
    core = _core(arch)
    every = select(get_receipt("full"), SPECS[arch]).accepted
    assert {emit.template_for(c).header for c in core} == {
        emit.template_for(c).header for c in every
    }
    assert {c.algorithm.pipeline for c in core} == {c.algorithm.pipeline for c in every}


def test_core_set_builds_each_signature_on_its_preferred_template_only() -> None:
    """One template per signature, and beside it the partial ones (the TMA conv forward, which
    runs only the channel counts its tile_k divides)."""
    core = _core("sm_90a")
    pipelines: dict[object, set[str]] = {}
    for config in core:
        if (config.signature.family, config.algorithm.pipeline) in PARTIAL_TEMPLATES:
            continue
        pipelines.setdefault(config.signature, set()).add(config.algorithm.pipeline)
    assert all(len(found) == 1 for found in pipelines.values())
    hopper = [c for c in core if c.signature.family == "fwd" and c.signature.mask != "window"
              and c.signature.mode == "batch" and c.signature.hdim_q in (64, 128)
              and c.signature.bias == "none" and not c.signature.softcap]
    assert hopper and all(c.algorithm.pipeline == "sm90_tma_wgmma" for c in hopper)
    assert len(core) < 115, "the core stays small: it is built at every install"
