"""One rank's Chrome trace (torch.profiler's export) read into a breakdown per engine step.

Steps are the ``llmbench.step`` ranges on the thread that holds them (the engine's), in time order: the
engine names them ``llmbench.step``, and ``name_steps`` renames them after the steps of the profile's
tables (``llmbench.step 42 (decode)``), so a name counts as a step range by its prefix. For each step, over
its host window [start, end]:

- on a GPU: every instant is either GPU busy, split between the kernels running then (equal shares when
  several overlap; ``overlap`` says how long that was), each kernel's share in its category, or GPU idle;
  idle time is further split by the engine phase the host was in meanwhile (``waited_for``: the host work
  the GPU waited for), the rest being "other host work". A gap between two kernels of one launch (the
  kernels a CUDA graph replay runs share its launch's correlation id) waited for no host work: it goes to
  ``IN_GRAPH``, the GPU's own time from one graph node to the next. So ``sum(device) + idle == wall``.
- on a CPU (no device activity in the trace): the ops are the device. Every instant belongs to the
  innermost op running then (its self time), in that op's category, or to no op: host time outside the
  framework's ops (Python, scheduling), split by phase into ``waited_for``. So
  ``sum(device) + sum(waited_for) == wall``.

A kernel's category (engine/kernel_roles.py) uses the layer range and phase its launch happened in and
the ops around that launch, found through the launch's correlation id; it is decided for each call, so
calls of one name can fall in different categories (the same elementwise kernel in a norm layer and in an
activation), and the kernel table (``kernels``) has a row per step, name and category. ``phases`` is the host
time of each engine phase range in the step. GEMM FLOPs and bytes come from the input shapes of the op
that launched the kernel (2 M N K, and every operand read or written once); other kernels have none, and
so has a GEMM replayed from a CUDA graph (its launch is no op's, and records no shapes): a kernel's row
counts the calls whose cost is known (``rated``) and their time apart, so that a rate is over them alone.
A row's step is the one its calls were launched in, so that a reader can leave steps out.

This is our own reading of torch.profiler's events: HolisticTraceAnalysis needs jupyterlab, plotly and
pytest installed, and Perfetto's trace processor downloads a native binary when it runs, neither of which
suits a command-line tool on machines without network access.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any, NamedTuple

from llmbench.engine.kernel_roles import COPIES, classify
from llmbench.engine.ranges import LAYER_PREFIX, PREFIX, STEP

HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
OTHER_HOST = "other host work"
IN_GRAPH = "the next kernel of a graph replay"
_GEMM_OPS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1), "aten::baddbmm": (1, 2)}
_ITEMSIZE = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "int": 4, "long int": 8}
_LAUNCHES = ("launch", "graphlaunch")  # cudaLaunchKernel, cudaLaunchKernelExC, cudaGraphLaunch, cuLaunch*


class StepBreakdown(NamedTuple):
    index: int  # position among this trace's steps
    start: float  # seconds since the trace's first step
    wall: float  # the step range's length, seconds
    device: dict[str, float]  # category -> seconds (GPU kernels, or CPU ops)
    idle: float  # seconds the device did nothing (on a CPU: time in no op)
    waited_for: dict[str, float]  # phase (or "other host work") -> seconds of that idle time
    phases: dict[str, float]  # engine phase -> seconds of host time in it
    overlap: float  # seconds during which two or more kernels ran at once
    launches: int  # kernel and graph launches made in the step (GPU)


class KernelStat(NamedTuple):
    name: str
    category: str
    count: int
    total: float  # seconds (on a CPU: the op's self time)
    flops: float  # 0 when unknown
    bytes: float
    rated: int = 0  # calls whose FLOPs and bytes are known (launched by an op with recorded shapes)
    rated_total: float = 0.0  # their seconds: what ``flops`` and ``bytes`` were done in
    step: int | None = None  # the trace's step (its index) the calls were launched in; None: in none


class TraceBreakdown(NamedTuple):
    mode: str  # "cuda" | "cpu"
    steps: list[StepBreakdown]
    kernels: list[KernelStat]  # one row per step, name and category; longest total first


class _Node(NamedTuple):
    name: str
    cat: str
    start: float
    end: float
    args: dict[str, Any]


class _Context(NamedTuple):
    step: int | None
    phase: str | None
    tag: str | None
    ops: tuple[_Node, ...]  # enclosing ops, innermost first


def _gemm_cost(op: _Node) -> tuple[float, float]:
    """(FLOPs, bytes) of a GEMM op from its input shapes; (0, 0) when it is not one or they are missing."""
    where = _GEMM_OPS.get(op.name)
    dims = op.args.get("Input Dims")
    if where is None or not dims or len(dims) <= where[1]:
        return 0.0, 0.0
    a, b = dims[where[0]], dims[where[1]]
    if len(a) < 2 or len(b) < 2:
        return 0.0, 0.0
    batch = a[0] if len(a) == 3 else 1
    m, k, n = a[-2], a[-1], b[-1]
    types = op.args.get("Input type") or []
    size = _ITEMSIZE.get(types[where[0]] if len(types) > where[0] else "", 2)
    return 2.0 * batch * m * n * k, float(batch * (m * k + k * n + m * n) * size)


_COPY_CATS = ("gpu_memcpy", "gpu_memset")  # the device's copies and fills, not kernels


def is_step_range(name: str, cat: str | None) -> bool:
    """Whether an event is a step range: ``llmbench.step``, named or not (``step_name``)."""
    return cat == "user_annotation" and (name == STEP or name.startswith(STEP + " "))


def _host_thread(events: list[dict]) -> tuple[Any, Any] | None:
    counts: dict[tuple[Any, Any], int] = defaultdict(int)
    for e in events:
        if is_step_range(e.get("name", ""), e.get("cat")):
            counts[(e.get("pid"), e.get("tid"))] += 1
    return max(counts, key=counts.__getitem__) if counts else None


def _walk_host(nodes: list[_Node]):
    """Yield (node, its context, its self time) with nodes nested by time on one thread."""
    stack: list[tuple[_Node, _Context, list[float]]] = []
    root = _Context(None, None, None, ())
    step = -1
    for node in nodes:
        while stack and stack[-1][0].end <= node.start:
            yield _finish(stack.pop())
        ctx = stack[-1][1] if stack else root
        if stack:
            parent = stack[-1][0]
            stack[-1][2][0] += max(0.0, min(node.end, parent.end) - node.start)
        if is_step_range(node.name, node.cat):
            step += 1
            ctx = _Context(step, None, None, ())
        elif node.cat == "user_annotation" and node.name.startswith(LAYER_PREFIX):
            ctx = ctx._replace(tag=node.name[len(LAYER_PREFIX) :])
        elif node.cat == "user_annotation" and node.name.startswith(PREFIX):
            ctx = ctx._replace(phase=node.name[len(PREFIX) :])
        elif node.cat == "cpu_op":
            ctx = ctx._replace(ops=(node, *ctx.ops[:3]))
        stack.append((node, ctx, [0.0]))
    while stack:
        yield _finish(stack.pop())


def _finish(entry: tuple[_Node, _Context, list[float]]) -> tuple[_Node, _Context, float]:
    node, ctx, children = entry
    return node, ctx, max(0.0, node.end - node.start - children[0])


def analyse(trace: dict[str, Any]) -> TraceBreakdown:
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    where = _host_thread(events)
    if where is None:
        return TraceBreakdown("cpu", [], [])
    host = [
        _Node(e["name"], e["cat"], e["ts"] * 1e-6, (e["ts"] + e["dur"]) * 1e-6, e.get("args") or {})
        for e in events
        if (e.get("pid"), e.get("tid")) == where and e.get("cat") in HOST_CATS
    ]
    host.sort(key=lambda n: (n.start, -(n.end - n.start)))
    device_events = [e for e in events if e.get("cat") in DEVICE_CATS]
    mode = "cuda" if device_events else "cpu"

    steps: list[_Node] = []
    phase_ranges: dict[int, list[tuple[str, float, float]]] = defaultdict(list)
    own: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))  # CPU: ops' self time
    outside: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))  # CPU: time in no op
    launches: dict[int, int] = defaultdict(int)
    by_correlation: dict[Any, _Context] = {}
    op_stats: dict[tuple[int | None, str, str], list] = {}  # (step, name, category) -> _add's figures
    for node, ctx, own_time in _walk_host(host):
        if is_step_range(node.name, node.cat):
            steps.append(node)
        if ctx.step is None:
            continue
        if node.cat == "user_annotation" and ctx.phase and node.name == PREFIX + ctx.phase:
            phase_ranges[ctx.step].append((ctx.phase, node.start, node.end))
        if node.cat in ("cuda_runtime", "cuda_driver"):
            if "correlation" in node.args:
                by_correlation[node.args["correlation"]] = ctx
            if any(k in node.name.lower() for k in _LAUNCHES):
                launches[ctx.step] += 1
        if mode == "cpu":
            if node.cat == "cpu_op":
                category = classify(node.name, tuple(o.name for o in ctx.ops[1:]), ctx.tag, ctx.phase)
                own[ctx.step][category] += own_time
                flops, nbytes = _gemm_cost(node)
                _add(op_stats, ctx.step, node.name, category, own_time, flops, nbytes)
            else:
                outside[ctx.step][ctx.phase or OTHER_HOST] += own_time
    steps.sort(key=lambda n: n.start)
    origin = steps[0].start if steps else 0.0

    kernels: dict[tuple[int | None, str, str], list] = {}
    per_step: dict[int, list[tuple[float, float, str, Any]]] = defaultdict(list)  # ..., correlation id
    if mode == "cuda":
        starts = [s.start for s in steps]
        ends = [s.end for s in steps]
        by_op: dict[int, list[tuple[dict, str]]] = defaultdict(list)
        ops_seen: dict[int, tuple[_Node, int | None]] = {}  # the op and the step it ran in
        for e in device_events:
            corr = (e.get("args") or {}).get("correlation")
            ctx = by_correlation.get(corr)
            name = e.get("name", "?")
            if e.get("cat") in _COPY_CATS:
                category = COPIES
            else:
                ops = tuple(o.name for o in ctx.ops) if ctx else ()
                category = classify(name, ops, ctx.tag if ctx else None, ctx.phase if ctx else None)
            a, b = e["ts"] * 1e-6, (e["ts"] + e["dur"]) * 1e-6
            j = bisect.bisect_right(ends, a)
            while j < len(steps) and starts[j] < b:
                per_step[j].append((max(a, starts[j]), min(b, ends[j]), category, corr))
                j += 1
            if ctx is not None and ctx.ops:
                by_op[id(ctx.ops[0])].append((e, category))
                ops_seen[id(ctx.ops[0])] = (ctx.ops[0], ctx.step)
            else:
                _add(kernels, ctx.step if ctx else None, name, category, b - a, 0.0, 0.0)
        for key, launched in by_op.items():
            op, step = ops_seen[key]
            flops, nbytes = _gemm_cost(op)
            # an op's FLOPs and bytes shared among its computing kernels by their time; a memset or copy
            # it launched (a split-K workspace cleared) computes none of its product
            total = sum(e["dur"] for e, _ in launched if e.get("cat") not in _COPY_CATS) or 1.0
            for e, category in launched:
                share = 0.0 if e.get("cat") in _COPY_CATS else e["dur"] / total
                seconds = e["dur"] * 1e-6
                _add(kernels, step, e.get("name", "?"), category, seconds, flops * share, nbytes * share)
    else:
        kernels = op_stats

    out = []
    for i, s in enumerate(steps):
        wall = s.end - s.start
        phases: dict[str, float] = defaultdict(float)
        for name, a, b in phase_ranges[i]:
            phases[name] += b - a
        if mode == "cuda":
            device, idle_spans, overlap = _sweep(per_step[i], s.start, s.end)
            idle = sum(b - a for a, b in idle_spans)
            idle_spans, in_graph = _graph_gaps(idle_spans, per_step[i])
            waited = _split_idle(idle_spans, phase_ranges[i])
            if in_graph > 0:
                waited[IN_GRAPH] = in_graph
        else:
            device, overlap = dict(own[i]), 0.0
            waited = dict(outside[i])
            idle = sum(waited.values())
        out.append(
            StepBreakdown(i, s.start - origin, wall, device, idle, waited, dict(phases), overlap, launches[i])
        )
    stats = [KernelStat(name, category, *v, step=step) for (step, name, category), v in kernels.items()]
    stats.sort(key=lambda k: -k.total)
    return TraceBreakdown(mode, out, stats)


def step_name(step: int | None, kind: str) -> str:
    """The name of a step's range once its step is known, what a search in Perfetto or chrome://tracing
    finds: ``llmbench.step 42 (decode)``; ``llmbench.step (idle)`` for a call that ran no step, and
    ``llmbench.step`` for one whose step is not known."""
    if kind == "idle":
        return f"{STEP} (idle)"
    return STEP if step is None else f"{STEP} {step} ({kind})"


def name_steps(trace: dict[str, Any], names: list[str]) -> bool:
    """Rename the trace's step ranges, the i-th in time order (as ``analyse`` reads them) to ``names[i]``;
    ranges past the names keep theirs. The GPU's copy of a range (``gpu_user_annotation``, linked to it by
    its External id) is renamed with it. Returns whether any name changed."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    where = _host_thread(events)
    if where is None:
        return False
    ranges = [
        e
        for e in events
        if (e.get("pid"), e.get("tid")) == where and is_step_range(e.get("name", ""), e.get("cat"))
    ]
    ranges.sort(key=lambda e: (e["ts"], -e["dur"]))
    changed = False
    by_id: dict[Any, str] = {}
    for e, name in zip(ranges, names, strict=False):
        changed = changed or e["name"] != name
        e["name"] = name
        if (link := (e.get("args") or {}).get("External id")) is not None:
            by_id[link] = name
    for e in events:
        link = (e.get("args") or {}).get("External id")
        if e.get("cat") == "gpu_user_annotation" and link in by_id and e.get("name", "").startswith(STEP):
            changed = changed or e["name"] != by_id[link]
            e["name"] = by_id[link]
    return changed


def _add(
    table: dict[tuple[int | None, str, str], list],
    step: int | None,
    name: str,
    category: str,
    seconds: float,
    flops: float,
    nbytes: float,
) -> None:
    """Count one call into its (step, name, category) row: calls of one name can belong to different
    categories (an elementwise kernel launched in a norm layer and in an activation), and each is counted
    where the step breakdown counts it, whichever came first. A call with FLOPs or bytes is rated: its
    time is counted apart too (KernelStat)."""
    row = table.setdefault((step, name, category), [0, 0.0, 0.0, 0.0, 0, 0.0])
    row[0] += 1
    row[1] += seconds
    row[2] += flops
    row[3] += nbytes
    if flops or nbytes:
        row[4] += 1
        row[5] += seconds


def _sweep(
    spans: list[tuple[float, float, str, Any]], start: float, end: float
) -> tuple[dict[str, float], list[tuple[float, float]], float]:
    """Busy time per category (overlapping kernels share), idle spans and overlapped time in [start, end]."""
    edges = sorted({start, end, *(span[0] for span in spans), *(span[1] for span in spans)})
    opening: dict[float, list[int]] = defaultdict(list)
    closing: dict[float, list[int]] = defaultdict(list)
    for k, (a, b, _, _) in enumerate(spans):
        opening[a].append(k)
        closing[b].append(k)
    device: dict[str, float] = defaultdict(float)
    idle: list[tuple[float, float]] = []
    overlap = 0.0
    active: set[int] = set()
    for t0, t1 in zip(edges, edges[1:], strict=False):
        active.difference_update(closing.get(t0, ()))
        active.update(k for k in opening.get(t0, ()) if spans[k][1] > t0)
        length = t1 - t0
        if not active:
            if idle and idle[-1][1] == t0:
                idle[-1] = (idle[-1][0], t1)
            else:
                idle.append((t0, t1))
            continue
        if len(active) > 1:
            overlap += length
        for k in active:
            device[spans[k][2]] += length / len(active)
    return dict(device), idle, overlap


def _graph_gaps(
    idle: list[tuple[float, float]], spans: list[tuple[float, float, str, Any]]
) -> tuple[list[tuple[float, float]], float]:
    """The idle spans that lie between two kernels of one launch (a graph replay's), taken out: (the
    others, the seconds taken)."""
    ending: dict[float, set] = defaultdict(set)
    starting: dict[float, set] = defaultdict(set)
    for a, b, _, corr in spans:
        if corr is not None:
            ending[b].add(corr)
            starting[a].add(corr)
    rest, inside = [], 0.0
    for a, b in idle:
        if ending.get(a, set()) & starting.get(b, set()):
            inside += b - a
        else:
            rest.append((a, b))
    return rest, inside


def _split_idle(idle: list[tuple[float, float]], phases: list[tuple[str, float, float]]) -> dict[str, float]:
    """Idle time by the phase the host was in during it (phase ranges do not nest)."""
    out: dict[str, float] = defaultdict(float)
    for a, b in idle:
        covered = 0.0
        for name, pa, pb in phases:
            inter = min(b, pb) - max(a, pa)
            if inter > 0:
                out[name] += inter
                covered += inter
        if b - a - covered > 0:
            out[OTHER_HOST] += b - a - covered
    return dict(out)
