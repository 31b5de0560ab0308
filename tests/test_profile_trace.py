"""Reading a torch.profiler Chrome trace into per-step breakdowns (bench/profile/trace.py), on traces built
by hand in kineto's format, the categories kernels and ops are put in (engine/kernel_roles.py), and step
ranges named after their steps for a trace viewer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmbench.bench.profile.trace import IN_GRAPH, OTHER_HOST, analyse, name_steps, step_name
from llmbench.engine import kernel_roles
from llmbench.engine.kernel_roles import classify

HOST = {"pid": 7, "tid": 7}
GPU = {"pid": 0, "tid": 7}  # stream 7
GPU2 = {"pid": 0, "tid": 20}  # another stream (NCCL)


def host(cat: str, name: str, ts: float, dur: float, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args, **HOST}


def launch(ts: float, corr: int, name: str = "cudaLaunchKernel") -> dict:
    return host("cuda_runtime", name, ts, 1.0, correlation=corr)


def kernel(name: str, ts: float, dur: float, corr: int, where: dict = GPU, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}, **where}


def gpu_step(offset: float = 0.0) -> list[dict]:
    """One 100 us step: schedule 0-10, forward 10-60 (a GEMM op, a norm layer), sample 60-70,
    copy_to_host 70-95; kernels: GEMM 20-40, an elementwise kernel launched in the norm 40-45, argmax 65-68,
    the copy back 90-92."""
    t = offset
    return [
        host("user_annotation", "llmbench.step", t + 0, 100),
        host("user_annotation", "llmbench.schedule", t + 0, 10),
        host("user_annotation", "llmbench.forward", t + 10, 50),
        host("cpu_op", "aten::mm", t + 15, 5, **{"Input Dims": [[4, 64], [64, 128]], "Input type": ["c10::BFloat16", "c10::BFloat16"]}),
        launch(t + 16, 1 + offset),
        host("user_annotation", "llmbench.layer.norm", t + 25, 10),
        host("cpu_op", "aten::mul", t + 26, 3),
        launch(t + 27, 2 + offset),
        host("user_annotation", "llmbench.sample", t + 60, 10),
        launch(t + 61, 3 + offset),
        host("user_annotation", "llmbench.copy_to_host", t + 70, 25),
        launch(t + 71, 4 + offset, "cudaMemcpyAsync"),
        kernel("nvjet_tst_128x64_64x3_1x2_h_bz_coopA_NNT", t + 20, 20, 1 + offset),
        kernel("void at::native::vectorized_elementwise_kernel<4, MulFunctor>", t + 40, 5, 2 + offset),
        kernel("void at::native::reduce_kernel<ArgMaxOps>", t + 65, 3, 3 + offset),
        kernel("Memcpy DtoH (Device -> Pinned)", t + 90, 2, 4 + offset, cat="gpu_memcpy"),
    ]  # fmt: skip


def test_gpu_step_adds_up_to_its_wall_time_with_idle_split_by_host_phase():
    (step,) = analyse({"traceEvents": gpu_step()}).steps
    us = 1e-6
    assert step.wall == pytest.approx(100 * us)
    assert step.device == pytest.approx(
        {"GEMM": 20 * us, "norm": 5 * us, "sampling": 3 * us, "copies": 2 * us}
    )
    assert step.idle == pytest.approx(70 * us)
    assert sum(step.device.values()) + step.idle == pytest.approx(step.wall)
    # idle 0-20 (schedule 10, forward 10), 45-60 (forward), 60-65 + 68-70 (sample), 70-90 + 92-95 (copy back)
    assert step.waited_for == pytest.approx(
        {"schedule": 10 * us, "forward": 25 * us, "sample": 7 * us, "copy_to_host": 23 * us,
         OTHER_HOST: 5 * us}
    )  # fmt: skip
    assert step.phases == pytest.approx(
        {"schedule": 10 * us, "forward": 50 * us, "sample": 10 * us, "copy_to_host": 25 * us}
    )
    assert step.launches == 3 and step.overlap == 0  # the memcpy is no launch


def test_gaps_between_one_graph_replays_kernels_wait_for_no_host_work():
    # a decode step replayed from a CUDA graph: its kernels share the graph launch's correlation id; the
    # gaps between them are the GPU's own, whatever the host does meanwhile (here: waits for the ids)
    events = [
        host("user_annotation", "llmbench.step", 0, 100),
        host("user_annotation", "llmbench.graph_replay", 0, 10),
        launch(5, 9, "cudaGraphLaunch"),
        host("user_annotation", "llmbench.copy_to_host", 10, 90),
        launch(12, 10, "cudaMemcpyAsync"),
        kernel("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 20, 30, 9),
        kernel("_rms_norm_kernel", 51, 9, 9),  # 1 us after the GEMM
        kernel("_decode_kernel", 63, 17, 9),  # 3 us after the norm
        kernel("Memcpy DtoH (Device -> Pinned)", 90, 2, 10, cat="gpu_memcpy"),  # 10 us after: another launch
    ]
    (step,) = analyse({"traceEvents": events}).steps
    us = 1e-6
    assert step.idle == pytest.approx(42 * us) and sum(step.waited_for.values()) == pytest.approx(step.idle)
    assert step.waited_for == pytest.approx(
        {IN_GRAPH: 4 * us, "graph_replay": 10 * us, "copy_to_host": 28 * us}
    )  # 0-10 graph_replay; 10-20, 80-90 and 92-100 copy_to_host; 50-51 and 60-63 inside the replay


def test_overlapping_kernels_share_the_time_they_overlap():
    events = gpu_step() + [kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 30, 20, 99, where=GPU2)]
    (step,) = analyse({"traceEvents": events}).steps
    us = 1e-6
    # 30-40: GEMM and NCCL at once (5 us each); 40-45: elementwise and NCCL (2.5 each); 45-50: NCCL alone
    assert step.device["GEMM"] == pytest.approx(15 * us)
    assert step.device["communication"] == pytest.approx((5 + 2.5 + 5) * us)
    assert step.device["norm"] == pytest.approx(2.5 * us)
    assert step.overlap == pytest.approx(15 * us)
    assert sum(step.device.values()) + step.idle == pytest.approx(step.wall)


def test_steps_are_told_apart_and_kernels_are_clipped_to_their_step():
    events = gpu_step() + gpu_step(offset=200)
    events.append(kernel("late_kernel", 95, 10, 1000))  # runs past the first step's end
    tr = analyse({"traceEvents": events})
    assert [s.start for s in tr.steps] == pytest.approx([0, 200e-6])
    first, second = tr.steps
    assert first.device["other"] == pytest.approx(5e-6)  # 95-100 only
    assert "other" not in second.device


def test_gemm_flops_and_bytes_come_from_the_launching_op_shapes():
    tr = analyse({"traceEvents": gpu_step()})
    (gemm,) = [k for k in tr.kernels if k.category == "GEMM"]
    assert gemm.flops == 2 * 4 * 64 * 128
    assert gemm.bytes == (4 * 64 + 64 * 128 + 4 * 128) * 2  # bf16 operands, each once
    assert gemm.total == pytest.approx(20e-6) and gemm.count == 1
    # the same op also clearing a workspace first (a memset it launched): the product's FLOPs and bytes
    # stay with the kernel that computes it, the memset takes its time and none of them
    events = gpu_step()
    events.insert(5, launch(15.5, 77, "cudaMemsetAsync"))
    events.append(kernel("Memset (Device)", 17, 2, 77, cat="gpu_memset"))
    for e in events:  # the memset launched by the same op: the launch sits inside aten::mm
        if e.get("args", {}).get("correlation") == 77 and e["cat"] == "cuda_runtime":
            e["ts"] = 15.5
    tr = analyse({"traceEvents": events})
    (gemm,) = [k for k in tr.kernels if k.category == "GEMM"]
    (memset,) = [k for k in tr.kernels if k.name == "Memset (Device)"]
    assert gemm.flops == 2 * 4 * 64 * 128 and gemm.bytes == (4 * 64 + 64 * 128 + 4 * 128) * 2
    assert memset.flops == 0 and memset.bytes == 0 and memset.total == pytest.approx(2e-6)


def test_cpu_ops_are_the_device_when_the_trace_has_no_kernels():
    us = 1e-6
    events = [
        host("user_annotation", "llmbench.step", 0, 100),
        host("user_annotation", "llmbench.forward", 10, 60),
        host("cpu_op", "aten::linear", 10, 30),
        host("cpu_op", "aten::t", 11, 2),
        host("cpu_op", "aten::mm", 14, 25),
        host("user_annotation", "llmbench.layer.norm", 45, 20),
        host("cpu_op", "aten::mul", 50, 10),
        host("user_annotation", "llmbench.sample", 80, 10),
        host("cpu_op", "aten::argmax", 81, 4),
    ]
    tr = analyse({"traceEvents": events})
    assert tr.mode == "cpu"
    (step,) = tr.steps
    # the linear's own time and the transpose inside it count as GEMM too
    assert step.device == pytest.approx({"GEMM": 30 * us, "norm": 10 * us, "sampling": 4 * us})
    assert step.waited_for == pytest.approx({"forward": 20 * us, "sample": 6 * us, OTHER_HOST: 30 * us})
    assert sum(step.device.values()) + sum(step.waited_for.values()) == pytest.approx(step.wall)
    assert step.idle == pytest.approx(sum(step.waited_for.values()))


def _elementwise_in(tag: str | None, t: float, corr: int) -> list[dict]:
    """One step whose only kernel is the elementwise multiply, launched inside the layer range ``tag``."""
    mul = "void at::native::vectorized_elementwise_kernel<4, MulFunctor>"
    layer = [host("user_annotation", f"llmbench.layer.{tag}", t + 10, 20)] if tag else []
    return [
        host("user_annotation", "llmbench.step", t, 100),
        host("user_annotation", "llmbench.forward", t + 5, 50),
        *layer,
        host("cpu_op", "aten::mul", t + 12, 5),
        launch(t + 13, corr),
        kernel(mul, t + 20, 4 if tag else 6, corr),
    ]


@pytest.mark.parametrize("norm_first", [True, False])
def test_a_kernel_is_counted_in_the_category_of_each_call_whichever_came_first(norm_first):
    # The same elementwise kernel does a norm's multiply (inside the norm layer) and an activation's: the
    # kernel table must put each call's time where the step breakdown puts it.
    steps = [_elementwise_in("norm", 0, 1), _elementwise_in(None, 200, 2)]
    tr = analyse({"traceEvents": [e for step in (steps if norm_first else steps[::-1]) for e in step]})
    us = 1e-6
    rows = {(k.category, k.count): k.total for k in tr.kernels}
    assert rows == pytest.approx({("norm", 1): 4 * us, ("activation and elementwise", 1): 6 * us})
    by_step = {cat: t for s in tr.steps for cat, t in s.device.items()}
    assert {k.category: k.total for k in tr.kernels} == pytest.approx(by_step)


def test_an_op_is_counted_in_the_category_of_each_call_on_a_cpu():
    events = [
        host("user_annotation", "llmbench.step", 0, 100),
        host("cpu_op", "aten::mul", 5, 10),  # an activation's multiply first
        host("user_annotation", "llmbench.layer.norm", 40, 20),
        host("cpu_op", "aten::mul", 45, 4),
    ]
    tr = analyse({"traceEvents": events})
    assert {(k.name, k.category): k.total for k in tr.kernels} == pytest.approx(
        {("aten::mul", "activation and elementwise"): 10e-6, ("aten::mul", "norm"): 4e-6}
    )


def test_step_ranges_are_named_after_their_steps_and_still_read_as_steps():
    first, second = gpu_step(), gpu_step(offset=200)
    for n, step in ((1, first), (2, second)):  # kineto links a range's GPU copy to it by its External id
        step[0]["args"]["External id"] = n
        step.append({**kernel("llmbench.step", step[12]["ts"], 80, 0), "cat": "gpu_user_annotation",
                     "args": {"External id": n}})  # fmt: skip
    events = second + first  # the file's order is no time order
    before = analyse({"traceEvents": events})
    trace = {"traceEvents": events}
    names = [step_name(41, "decode"), step_name(42, "mixed")]
    assert names == ["llmbench.step 41 (decode)", "llmbench.step 42 (mixed)"]
    assert name_steps(trace, names)
    host_ranges = sorted((e["ts"], e["name"]) for e in events if e["cat"] == "user_annotation")
    assert [n for _, n in host_ranges if n.startswith("llmbench.step")] == names
    gpu_ranges = sorted((e["ts"], e["name"]) for e in events if e["cat"] == "gpu_user_annotation")
    assert [n for _, n in gpu_ranges] == names
    assert analyse(trace) == before  # the reader maps the named ranges to the same steps
    assert not name_steps(trace, names)  # named already: nothing to write back
    assert step_name(7, "idle") == "llmbench.step (idle)" and step_name(None, "unrecorded") == "llmbench.step"


def test_a_trace_without_engine_steps_has_no_breakdown():
    tr = analyse({"traceEvents": [host("cpu_op", "aten::mm", 0, 5)]})
    assert tr.steps == [] and tr.kernels == []


@pytest.mark.parametrize(
    "name,ops,tag,phase,expected",
    [
        ("nvjet_tst_128x64_64x3_1x2_h_bz_coopA_NNT", (), None, "forward", "GEMM"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", (), None, "forward", "GEMM"),
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", (), None, "forward", "communication"),
        ("c10d::allreduce_", (), None, "forward", "communication"),
        ("_rms_norm_kernel", (), "attention", "forward", "norm"),  # our kernel's own name wins
        ("_store_kv_kernel", (), "attention", "graph_replay", "rotary and KV store"),
        ("_decode_kernel", (), None, "graph_replay", "attention"),
        ("void at::native::vectorized_elementwise_kernel<4, MulFunctor>", ("aten::mul",), "norm", "forward", "norm"),
        ("void at::native::vectorized_elementwise_kernel<4, MulFunctor>", ("aten::mul",), None, "forward",
         "activation and elementwise"),
        ("void at::native::reduce_kernel<ArgMaxOps>", ("aten::argmax",), None, "sample", "sampling"),
        ("aten::div", (), None, "sample", "sampling"),
        ("Memcpy HtoD (Pinned -> Device)", (), None, "copy_to_device", "copies"),
        ("aten::t", ("aten::linear",), None, "forward", "GEMM"),
        ("flash_fwd_splitkv_kernel", (), None, "forward", "attention"),
        ("some_unknown_kernel", (), None, "forward", "other"),
    ],
)  # fmt: skip
def test_kernels_and_ops_are_categorised(name, ops, tag, phase, expected):
    assert classify(name, ops, tag, phase) == expected


def test_every_triton_kernel_of_the_project_has_a_category():
    """A new kernel must be added to OWN_KERNELS, or profiles would file its time under "other"."""
    import llmbench.kernels as kernels

    source = "\n".join(p.read_text() for p in Path(kernels.__path__[0]).glob("*.py"))
    jitted = set(re.findall(r"^@(?:triton\.)?jit\b.*\n(?:@.*\n)*def (\w+)", source, re.M))
    launched = {name for name in jitted if re.search(rf"\b{name}\[", source)}  # kernel[grid](...)
    assert len(launched) >= 8, f"the scan found only {sorted(launched)}: it is broken"
    missing = launched - set(kernel_roles.OWN_KERNELS)
    assert not missing, f"kernels with no category: {sorted(missing)}"
