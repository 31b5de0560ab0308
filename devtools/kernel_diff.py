"""Which of the engine's Triton launches compile to other code than at another commit.

An optimisation kept off by default must leave the default path as it was, or the tables that
BENCHMARKS.md says ran this commit's engine did not. This compiles every launch ``compile_kernels.py``
makes (the engine's, at the models' real shapes, plain and under programmatic launch) in this checkout
and in a worktree of REV, both for sm_90 without a GPU, and compares each launch's PTX with its registers
renamed and its parameter loads and declarations dropped: a parameter added to a kernel changes no
instruction of a launch that leaves it unused.

    python devtools/kernel_diff.py 29cb5777c2                  # same / changed / new, kernel by kernel
    python devtools/kernel_diff.py REV --dtype bf16,fp32 --json FILE

A launch is matched to its counterpart by kernel, launch options and the constexprs the older kernel
has; the constexprs the newer kernel added are printed beside a changed or new launch, so that a launch
of a new option switched on (``PREFETCH=True``) is told from a default launch whose code moved.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
_SKIP = (
    ".param",
    "ld.param",
    "//",
    ".loc",
    ".file",
    ".visible",
    ".entry",
    ".maxntid",
    ".reqntid",
)
_REGISTER = re.compile(r"%[a-z]+\d+")
_LABEL = re.compile(r"\$L__\w+")


def ptx_body(ptx: str) -> list[str]:
    """A kernel's instructions, registers and labels renamed, its parameters' declarations and loads and
    its debug lines and sections (which spell out the source's path) dropped: what two compiles of one
    launch share unless the code itself differs."""
    ptx = ptx.split("\n\t.section", 1)[0]
    lines = (line.strip() for line in ptx.splitlines())
    kept = [line for line in lines if line and not line.startswith(_SKIP)]
    return [_LABEL.sub("L", _REGISTER.sub("%R", line)) for line in kept]


def fingerprints(dtypes: list[str]) -> list[dict]:
    """Every distinct launch of the checkout on ``sys.path``: kernel, constexprs, launch options, the
    size and a hash of its PTX body."""
    import compile_kernels as ck
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
    launches = []
    for dtype in dtypes:
        launches += ck.capture(lambda d=names[dtype]: ck.engine_calls(d))
        launches += ck.capture(lambda d=names[dtype]: ck.engine_calls(d), programmatic=True)
    target = GPUTarget("cuda", 90, 32)
    out = []
    for launch in {launch.key: launch for launch in launches}.values():
        source = ASTSource(launch.kernel, launch.signature, constexprs=launch.constexprs, attrs=launch.attrs)
        body = ptx_body(triton.compile(source, target=target, options=launch.options).asm["ptx"])
        params = [p.name for p in launch.kernel.params]
        out.append(
            {
                "kernel": launch.kernel.fn.__name__,
                "constexprs": {params[i[0]]: repr(v) for i, v in launch.constexprs.items()},
                "options": {k: repr(v) for k, v in sorted(launch.options.items())},
                "lines": len(body),
                "hash": _digest(body),
                "unordered": _digest(sorted(line for line in body if line != "L:")),
            }
        )
    return out


def _digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def compare(old: list[dict], new: list[dict]) -> dict[str, list[dict]]:
    """Each new launch as ``same`` (an old launch with its kernel, options and the old constexprs'
    values compiles to the same body), ``reordered`` (to the same instructions in another order, blocks
    cut elsewhere), ``changed`` (such a launch exists, with other instructions) or ``new``; a launch
    that is not the same carries the constexprs its kernel added (``added``)."""
    by_kernel: dict[str, list[dict]] = {}
    for launch in old:
        by_kernel.setdefault(launch["kernel"], []).append(launch)
    verdicts: dict[str, list[dict]] = {"same": [], "reordered": [], "changed": [], "new": []}
    for launch in new:
        olds = by_kernel.get(launch["kernel"], [])
        known = set(olds[0]["constexprs"]) if olds else set()
        added = {k: v for k, v in launch["constexprs"].items() if k not in known}
        mates = [
            o
            for o in olds
            if o["options"] == launch["options"]
            and o["constexprs"] == {k: v for k, v in launch["constexprs"].items() if k in known}
        ]
        entry = {**launch, "added": added}
        if not mates:
            verdicts["new"].append(entry)
        elif any(o["hash"] == launch["hash"] for o in mates):
            verdicts["same"].append(entry)
        elif any(o["unordered"] == launch["unordered"] for o in mates):
            verdicts["reordered"].append({**entry, "old_lines": sorted(o["lines"] for o in mates)})
        else:
            verdicts["changed"].append({**entry, "old_lines": sorted(o["lines"] for o in mates)})
    return verdicts


def _emit(root: Path, dtypes: str, out: Path) -> None:
    """The fingerprints of the checkout at ``root``, computed in a process of their own (so that its
    llmbench and compile_kernels are the ones imported)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, str(HERE), "--emit", str(out), "--root", str(root), "--dtype", dtypes]
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: compiling the launches of {root} failed:\n{done.stderr[-3000:]}")


def _summary(verdicts: dict[str, list[dict]]) -> str:
    lines = [f"{len(v)} {k}" for k, v in verdicts.items()]
    text = ", ".join(lines) + " (distinct launches, against REV)"
    for kind in ("reordered", "changed", "new"):
        for e in verdicts[kind]:
            was = f" (was {e['old_lines']} lines)" if kind != "new" else ""
            added = ", ".join(f"{k}={v}" for k, v in e["added"].items()) or "no constexpr added"
            text += f"\n  {kind}: {e['kernel']} [{added}] {e['options']}: {e['lines']} lines{was}"
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev", nargs="?", help="the commit to compare this checkout's launches with")
    parser.add_argument("--dtype", default="bf16", help="model dtypes, comma-separated (bf16, fp32, fp16)")
    parser.add_argument("--json", type=Path, help="also write the comparison here")
    parser.add_argument("--emit", type=Path, help=argparse.SUPPRESS)  # one checkout's fingerprints ...
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)  # ... that checkout
    args = parser.parse_args()
    if args.emit:
        # that checkout's llmbench and compile_kernels, not this script's folder (Python's first path)
        sys.path[:] = [str(args.root), str(args.root / "devtools")] + [
            p for p in sys.path if p != str(HERE.parent)
        ]
        args.emit.write_text(json.dumps(fingerprints(args.dtype.split(","))))
        return 0
    if not args.rev:
        parser.error("give the commit to compare with")
    if unknown := set(args.dtype.split(",")) - {"bf16", "fp32", "fp16"}:
        parser.error(f"--dtype takes bf16, fp32 or fp16, comma-separated; got {', '.join(sorted(unknown))}")
    repo = HERE.parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        git = ["git", "worktree", "add", "--detach", "-q", str(tree), args.rev]
        added = subprocess.run(git, cwd=repo, capture_output=True, text=True)
        if added.returncode != 0:
            parser.error(f"cannot check out {args.rev!r}: {added.stderr.strip()}")
        try:
            _emit(tree, args.dtype, Path(tmp) / "old.json")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=repo, check=False)
        _emit(repo, args.dtype, Path(tmp) / "new.json")
        old, new = (json.loads((Path(tmp) / f"{n}.json").read_text()) for n in ("old", "new"))
    verdicts = compare(old, new)
    print(_summary(verdicts).replace("REV", args.rev))
    if args.json:
        args.json.write_text(json.dumps({"rev": args.rev, **verdicts}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
