"""Every Triton kernel compiles for an H200 (sm_90), checked on a machine without a GPU.

The interpreter runs kernels as Python and lets through errors only the compiler sees (two were found
this way on the H200 after passing every interpreter test). ``devtools/compile_kernels.py`` compiles
each launch the engine makes, at the models' real shapes, down to a cubin.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
if tuple(int(p) for p in triton.__version__.split(".")[:2]) < (3, 3):
    pytest.skip("compiling for a GPU target by hand takes Triton 3.3's ASTSource", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "devtools" / "compile_kernels.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    # No time limit: compiling is bounded work that only takes longer on a busy machine, and nothing in it
    # waits on anything that could hang.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{ROOT / 'devtools'}"
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True)


@pytest.mark.slow  # minutes on two CPU cores: dozens of launches compiled down to cubins
def test_every_kernel_launch_compiles_for_sm90() -> None:
    done = _run(str(SCRIPT), "--arch", "90")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    compiled, _, total = last.split(" distinct")[0].partition(" of ")
    # Both dtypes, four model shapes, two page sizes, each attention mode: dozens of distinct launches.
    assert int(compiled) == int(total) >= 60, last


def test_a_kernel_the_interpreter_accepts_but_the_compiler_rejects_is_reported(tmp_path: Path) -> None:
    # The shape of the bug the H200 found: a variable an `if` block redefines with another shape.
    code = """
import compile_kernels as ck
import torch
import triton.language as tl
from llmbench.kernels._triton import jit

@jit
def bad(x_ptr, n, A: tl.constexpr, B: tl.constexpr):
    v = tl.load(x_ptr + tl.arange(0, A))
    if n > 0:
        v = tl.load(x_ptr + tl.arange(0, B))
    tl.store(x_ptr + tl.arange(0, A), v)

@jit
def good(x_ptr, n, A: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, A), tl.load(x_ptr + tl.arange(0, A)) + n)

def calls():
    x = torch.zeros(64)
    bad[(1,)](x, 3, A=32, B=8)
    good[(1,)](x, 3, A=32)

results = ck.compile_all(ck.capture(calls), 90)
for launch, error in results:
    print(launch.kernel.fn.__name__, "ok" if error is None else "error: " + error)
"""
    probe = tmp_path / "probe.py"  # Triton reads a kernel's source from its file
    probe.write_text(code)
    done = _run(str(probe))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.strip().splitlines())
    assert lines["good"] == "ok"
    assert lines["bad"].startswith("error:") and "v" in lines["bad"], lines["bad"]


def test_every_launch_gives_each_kernel_parameter() -> None:
    # torch.compile's inductor launches a user kernel with the arguments it was called with: a parameter
    # left at its default (a constexpr such as PDL) leaves its launcher one short on the GPU.
    code = """
import compile_kernels as ck
for programmatic in (False, True):
    for calls in (ck.engine_calls, ck.fp8_kv_calls, ck.sampler_calls):
        for launch in ck.capture(calls, programmatic):
            print(launch.kernel.fn.__name__, ",".join(launch.defaulted) or "-")
"""
    done = _run("-c", code)
    assert done.returncode == 0, done.stderr[-3000:]
    launches = [line.split(" ") for line in done.stdout.strip().splitlines()]
    assert len({name for name, _ in launches}) >= 10  # every kind of kernel the engine launches
    assert [line for line in launches if line[1] != "-"] == []


def test_bad_options_are_a_clear_error() -> None:
    done = _run(str(SCRIPT), "--dtype", "bf17")
    assert done.returncode == 2
    assert "--dtype takes bf16, fp32 or fp16" in done.stderr and "Traceback" not in done.stderr


def test_a_v_cache_laid_out_by_token_reaches_the_float8_dot_without_byte_loads(tmp_path: Path) -> None:
    # The reason the float8 pool holds V by token (kernels/kv_layout.py): compiled for sm_90, the decode
    # kernel reads a float8 V tile laid out as K from shared memory a byte at a time; by token, through
    # ldmatrix, and (the chunked load) from global memory in 16-byte vectors, as does the prefill kernel.
    code = """
import re
import compile_kernels as ck
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from llmbench.kernels.kv_layout import v_by_token
from llmbench.kernels.triton_decode import decode_attention
from llmbench.kernels.triton_prefill import prefill_attention

t = lambda *shape, dt=torch.bfloat16: torch.zeros(shape, dtype=dt)

def calls():
    cache, scale = t(64, 16, 8, 128, dt=torch.float8_e4m3fn), t(8, dt=torch.float32)
    for v in (cache, v_by_token(cache)):
        decode_attention(t(64, 16, 128), cache, v, t(64, 256, dt=torch.int32), t(64, dt=torch.int64), 0.1,
                         num_splits=1, k_scale=scale, v_scale=scale)
        prefill_attention(t(2048, 16, 128), cache, v, t(1, 256, dt=torch.int32),
                          torch.tensor([0, 2048], dtype=torch.int32), t(1, dt=torch.int64), 2048, 0.1,
                          k_scale=scale, v_scale=scale)

for launch in ck.capture(calls):
    ptx = triton.compile(ASTSource(launch.kernel, launch.signature, constexprs=launch.constexprs,
                                   attrs=launch.attrs), target=GPUTarget("cuda", 90, 32),
                         options=launch.options).asm["ptx"]
    by_token = dict((launch.kernel.params[i[0]].name, v) for i, v in launch.constexprs.items())["V_BY_TOKEN"]
    print(launch.kernel.fn.__name__, "token" if by_token else "pool", len(re.findall(r"ld\\.shared\\.b8", ptx)),
          len(re.findall(r"ld\\.global(?:\\.\\w+)*\\.b8", ptx)), len(re.findall(r"ldmatrix", ptx)))
"""
    probe = tmp_path / "probe.py"
    probe.write_text(code)
    done = _run(str(probe))
    assert done.returncode == 0, done.stderr[-3000:]
    counts = {
        (kernel, layout): (int(b8), int(global_b8), int(ldm))
        for kernel, layout, b8, global_b8, ldm in (line.split() for line in done.stdout.split("\n") if line)
    }
    for kernel in ("_decode_kernel", "_prefill_kernel"):
        assert counts[(kernel, "token")][:2] == (0, 0), counts  # no byte loads at all by token
    token, pool = counts[("_decode_kernel", "token")], counts[("_decode_kernel", "pool")]
    assert token[2] > pool[2], counts  # V through ldmatrix instead
    # if Triton learns to read the K layout without byte loads, the layout is moot for decode
    assert pool[0] > 0, counts


PTX = """
//
// Generated by LLVM NVPTX Back-End
.visible .entry k(
\t.param .u64 .ptr .global .align 1 k_param_0,
\t.param .u32 k_param_1
)
{
\t.loc\t1 12 0
\tld.param.u64 \t%rd1, [k_param_0];
\tld.param.u32 \t%r1, [k_param_1];
\tmov.u32 \t%r2, %tid.x;
$L__BB0_2:
\tadd.s32 \t%r3, %r2, %r1;
\tst.global.u32 \t[%rd1], %r3;
\tret;
}
"""


def test_a_parameter_added_and_left_unused_changes_no_ptx_body(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "devtools"))
    import kernel_diff

    body = kernel_diff.ptx_body(PTX)
    assert body == [
        ")",
        "{",
        "mov.u32 \t%R, %tid.x;",
        "L:",
        "add.s32 \t%R, %R, %R;",
        "st.global.u32 \t[%R], %R;",
        "ret;",
        "}",
    ]
    # one more parameter, loaded into registers numbered one higher everywhere, and another label
    added = (
        PTX.replace("k_param_1\n)", "k_param_1,\n\t.param .u64 k_param_2\n)")
        .replace("ld.param.u32 \t%r1", "ld.param.u64 \t%rd2, [k_param_2];\n\tld.param.u32 \t%r1")
        .replace("%r2", "%r7")
        .replace("$L__BB0_2", "$L__BB0_5")
        .replace(".b8 47", ".b8 47\n.b8 116")  # the source at another path
    )
    assert kernel_diff.ptx_body(added) == body
    assert kernel_diff.ptx_body(PTX.replace("add.s32", "sub.s32")) != body


def test_launches_are_matched_on_the_older_kernels_constexprs_and_options(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "devtools"))
    import kernel_diff

    def launch(kernel, h, options="4", **constexprs):
        return {
            "kernel": kernel,
            "constexprs": constexprs,
            "options": {"num_warps": options},
            "lines": 9,
            "hash": h,
            "unordered": h.rstrip("'"),  # c' is c's instructions in another order
        }

    old = [launch("norm", "a", BLOCK=128), launch("norm", "b", BLOCK=256), launch("act", "c", BLOCK=64)]
    new = [
        launch("norm", "a", BLOCK=128, PREFETCH=False),  # an added switch off: compiles as before
        launch("norm", "x", BLOCK=128, PREFETCH=True),  # on: other code
        launch("norm", "x", BLOCK=256, PREFETCH=False),  # off, and yet other code: what to look at
        launch("act", "c'", BLOCK=64),  # the same instructions, moved
        launch("norm", "b", BLOCK=256, options="8"),  # options no old launch had
        launch("split", "s", BLOCK=64),  # a kernel the old commit lacked
    ]
    verdicts = kernel_diff.compare(old, new)
    assert [(e["constexprs"], e["added"]) for e in verdicts["same"]] == [
        ({"BLOCK": 128, "PREFETCH": False}, {"PREFETCH": False})
    ]
    assert [(e["constexprs"]["BLOCK"], e["added"]) for e in verdicts["changed"]] == [
        (128, {"PREFETCH": True}),
        (256, {"PREFETCH": False}),
    ]
    assert [(e["kernel"], e["options"]["num_warps"]) for e in verdicts["new"]] == [
        ("norm", "8"),
        ("split", "4"),
    ]
    assert [(e["kernel"], e["added"]) for e in verdicts["reordered"]] == [("act", {})]
    summary = kernel_diff._summary(verdicts)
    assert summary.startswith("1 same, 1 reordered, 2 changed, 2 new")
    assert "changed: norm [PREFETCH=False]" in summary and "reordered: act [no constexpr added]" in summary


def test_each_checkout_is_compiled_from_its_own_code(monkeypatch, tmp_path: Path) -> None:
    """The other commit's launches come from its own compile_kernels and llmbench, not from this
    checkout's (which sit first on the path of the script that runs them)."""
    monkeypatch.syspath_prepend(str(ROOT / "devtools"))
    import kernel_diff

    (tmp_path / "devtools").mkdir()
    (tmp_path / "llmbench").mkdir()
    (tmp_path / "llmbench" / "__init__.py").write_text("WHERE = 'the other checkout'\n")
    (tmp_path / "devtools" / "compile_kernels.py").write_text(
        "import llmbench\nraise SystemExit('compile_kernels of ' + llmbench.WHERE)\n"
    )
    with pytest.raises(SystemExit, match="compile_kernels of the other checkout"):
        kernel_diff._emit(tmp_path, "bf16", tmp_path / "out.json")
