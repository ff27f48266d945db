"""benchmarks/profile_vs_cudnn.py without a GPU: reading ncu's CSV, the instruction count it
derives, the report's comparison of the largest kernels, and the ncu command it runs."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType

import pytest
from support.paths import REPO_ROOT

BENCHMARKS = REPO_ROOT / "benchmarks"
HEADER = ('"ID","Process ID","Kernel Name","Section Name","Metric Name","Metric Unit",'
          '"Metric Value"')  # fmt: skip


def _rows(kernel_id: int, name: str, **metrics: str) -> list[str]:
    return [f'"{kernel_id}","1","{name}","S","{metric.replace("_", " ")}","","{value}"'
            for metric, value in metrics.items()]  # fmt: skip


def _metrics(duration_ns: str, cycles: str, ipc: str) -> dict[str, str]:
    return {"Duration": duration_ns, "Elapsed_Cycles": cycles, "Executed_Ipc_Elapsed": ipc,
            "#_SMs": "132", "SM_Busy": "36.26", "Grid_Size": "8,832"}  # fmt: skip


CSV = "\n".join([
    "==PROF== Connected to process 7",
    "ours 4.6 ms",  # the program's own output, interleaved by ncu
    HEADER,
    *_rows(0, "void ckfmha::kernel::bwd_main<Traits>(Params)", **_metrics("5,000,000", "7,000,000", "1.25")),
    *_rows(1, "void ckfmha::bwd_convert_dq_kernel<T>(P)", **_metrics("200,000", "280,000", "1.00")),
    *_rows(2, "cudnn_sdpa_bprop_kernel", **_metrics("3,500,000", "5,000,000", "1.30")),
    '"2","1","cudnn_sdpa_bprop_kernel","S","Local Memory Spilling Request Overhead","%","no data"',
    "==PROF== Disconnected from process 7",
])  # fmt: skip


@pytest.fixture(scope="module")
def tool() -> Iterator[ModuleType]:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        yield importlib.import_module("profile_vs_cudnn")


def test_kernels_come_back_in_launch_order_with_their_metrics(tool: ModuleType) -> None:
    kernels = tool.parse_ncu_csv(CSV)
    assert [k.ours for k in kernels] == [True, True, False]
    main = kernels[0]
    assert main.metrics["Duration"] == 5_000_000 and main.metrics["Grid Size"] == 8832
    assert main.instructions == pytest.approx(7_000_000 * 1.25 * 132)
    assert "Local Memory Spilling Request Overhead" not in kernels[2].metrics  # "no data"
    assert main.short_name() == "ckfmha::kernel::bwd_main<Traits>"


def test_report_sets_the_largest_kernels_against_each_other(tool: ModuleType) -> None:
    text = tool.report(tool.parse_ncu_csv(CSV))
    time_ratio = 5_000 / 3_500
    instruction_ratio = (7_000_000 * 1.25) / (5_000_000 * 1.30)
    assert (f"time {time_ratio:.2f}x, instructions {instruction_ratio:.2f}x, IPC 1.25 / 1.30"
            in text)  # fmt: skip
    assert "ckfmha: 2 kernels, 5200 us" in text
    assert "peer: 1 kernels, 3500 us" in text


def test_input_without_ncu_rows_is_refused(tool: ModuleType) -> None:
    with pytest.raises(ValueError, match="no ncu CSV rows"):
        tool.parse_ncu_csv("==PROF== nothing profiled\n")
    with pytest.raises(ValueError, match="no column"):
        tool.parse_ncu_csv('"ID","Kernel Name"\n"0","k"\n')


def test_arguments_and_the_ncu_command(tool: ModuleType) -> None:
    argv = ["--kind", "bwd", "--heads", "24/8", "--seqlen", "1024/4096", "--hdim", "192",
            "--hdim-v", "128", "--causal"]  # fmt: skip
    args = tool.parse_args(argv)
    assert args.heads == (24, 8) and args.seqlen == (1024, 4096)
    command = tool.ncu_command(args, argv)
    assert command[:3] == [args.ncu, "--profile-from-start", "off"]
    assert command[-1] == "--inner" and command[-len(argv) - 1 : -1] == argv
    assert all(name in command for name in tool.SECTIONS)
    with pytest.raises(SystemExit):
        tool.parse_args(["--heads", "24/5"])


def test_extra_metrics_reach_ncu_and_the_report(tool: ModuleType) -> None:
    stall = "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"
    argv = ["--kind", "conv_bwd_weight", "--layer", "resnet18/3x3 128", "--batch", "32",
            "--metrics", f"{stall}, dram__bytes_read.sum"]  # fmt: skip
    args = tool.parse_args(argv)
    command = tool.ncu_command(args, argv)
    assert command[command.index("--metrics") + 1] == f"{stall}, dram__bytes_read.sum"
    assert tool.extra_metrics(args) == (stall, "dram__bytes_read.sum")
    extra_row = f'"0","1","void ckfmha::kernel::bwd_main<Traits>(Params)","C","{stall}","","2.5"'
    text = tool.report(tool.parse_ncu_csv(CSV + "\n" + extra_row), tool.extra_metrics(args))
    assert f"{stall}: 2.5" in text
    assert "dram__bytes_read.sum" not in text  # no kernel has it


def test_conv_layers_are_named_by_model_and_name() -> None:
    pytest.importorskip("torch")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        bench_conv = importlib.import_module("bench_conv")
    layer = bench_conv.find_layer("resnet18/3x3 128")
    assert (layer.input, layer.groups, layer.c, layer.k) == ((28, 28), 1, 128, 128)
    with pytest.raises(ValueError, match="no layer 'resnet18/3x3 100'.*resnet18/3x3 128"):
        bench_conv.find_layer("resnet18/3x3 100")


def test_kernels_named_from_an_inner_namespace_are_ours(tool: ModuleType) -> None:
    name = "void kernel::conv_bwd_weight_sm90_kernel<kernel::Traits<2>>(kernel::Params)"
    assert tool.Kernel(name).ours
    assert tool.Kernel("runtime::<unnamed>::convert_kernel<float>(float *)").ours
    assert not tool.Kernel("cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16>(Params)").ours
    assert not tool.Kernel("cublasLt::splitKreduce_kernel<32, 16, int, float>(Params)").ours
