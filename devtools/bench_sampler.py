"""Check, then time, the sampler at real sizes (151,936 ids, bf16 logits, 256 rows and 1) on a CUDA GPU.

Checks (exit 1 when one fails):
- the Triton draw against its torch reference, id for id, greedy and sampled rows mixed, with and without
  a cut; an id may differ only where the reference's own scores of the two ids tie to float rounding
  (the GPU's log2 is not the CPU's);
- the Triton top-p / min-p thresholds against the sorting reference (kept sets within 2 tokens a row);
- a row draws the same id alone as among 255 others;
- 8,192 draws from one row cut to its top 8 follow softmax(logits / T) over those 8 (chi-square).

Then the time per call of each sampling setting: the old sampler (a sort of the vocabulary for top-k/p,
one noise launch per sampled row; it had no min-p), this sampler's torch path and its Triton path, and
the Triton path's share of a 7 ms decode step (256 rows of qwen3-0.6b on an H200), on trained-like
logits and on flat ones (random weights), where top-p's threshold search needs the most passes.

    python devtools/bench_sampler.py            # CUDA
    python devtools/bench_sampler.py --tune --json FILE   # first sweep the draw's launch configs
    python devtools/bench_sampler.py --smoke    # CPU, Triton interpreted, small sizes: the checks only

``--tune`` times the draw alone (replayed from a CUDA graph, as the engine's decode step would run it) for
each ``SampleConfig``: loop step, warps, programs per multiprocessor, accurate or approximate log2; each
config's ids are first compared with the reference's (near-ties allowed). ``--json`` writes those rows in
``bench_kernels.py``'s format, for ``llmbench docs`` kernel blocks.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:  # must be decided before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from llmbench.engine.sampler import Sampler  # noqa: E402
from llmbench.engine.sampling_params import SamplingParams  # noqa: E402
from llmbench.engine.sequence import Sequence  # noqa: E402
from llmbench.kernels.sample import DEFAULT_CONFIG, SampleConfig, sample, sample_ref, uniforms_ref  # noqa: E402
from llmbench.kernels.sample_cut import cut_threshold, cut_threshold_ref  # noqa: E402

LOG2E = 1.4426950408889634
STEP_MS = 7.0  # a 256-row decode step of qwen3-0.6b on an H200


class OldSampler:
    """The sampler this one replaced: per-row torch.Generator noise, a full sort for top-k/top-p."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.gens = device, {}

    def __call__(self, logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        out = logits.argmax(dim=-1)
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if not rows:
            return out
        idx = torch.tensor(rows, device=logits.device)
        temps = torch.tensor([params[i].temperature for i in rows], device=logits.device)
        sub = logits[idx].float() / temps[:, None]
        ks = [params[i].top_k if 0 < params[i].top_k < sub.shape[-1] else sub.shape[-1] for i in rows]
        ps = [params[i].top_p for i in rows]
        if any(k < sub.shape[-1] for k in ks) or any(p < 1 for p in ps):
            sorted_logits, order = sub.sort(dim=-1, descending=True)
            rank = torch.arange(sub.shape[-1], device=sub.device)[None, :]
            drop = rank >= torch.tensor(ks, device=sub.device)[:, None]
            probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
            drop |= probs.cumsum(dim=-1) - probs >= torch.tensor(ps, device=sub.device)[:, None]
            sub = torch.empty_like(sub).scatter_(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
        probs = sub.softmax(dim=-1)
        noise = torch.empty_like(probs)
        for j, i in enumerate(rows):
            seed = params[i].seed
            if seed is None:
                noise[j].exponential_()
            else:
                gen = self.gens.setdefault(i, torch.Generator(device=self.device).manual_seed(seed))
                noise[j].exponential_(generator=gen)
        out[idx] = (probs / noise).argmax(dim=-1)
        return out


def new_sampler(device: torch.device, params: list[SamplingParams], triton: bool):
    """A sampler holding one request per params, and the device rows of a step over all of them."""
    s = Sampler(device, use_triton=triton)
    seqs = []
    for i, p in enumerate(params):
        s.add(f"r{i}", p)
        seqs.append(Sequence(f"r{i}", [0] * (100 + i), p, 0.0))
    params_np, keys_np = s.rows(seqs)
    rows = (
        (torch.from_numpy(params_np).to(device), torch.from_numpy(keys_np).to(device)) if s.active else None
    )
    return s, rows


def differing_rows(logits, scale, cut, keys, pos, got, want) -> tuple[int, float]:
    """How many ids differ from the reference's, and the largest gap between the reference's own scores
    of the two ids, relative to the row's largest score (a near-tie when below ~1e-5)."""
    bad = (got != want).nonzero().flatten().tolist()
    x = logits.float()
    scores = x * scale[:, None] - torch.log2(-torch.log2(uniforms_ref(keys, pos, x.shape[-1])))
    if cut is not None:
        scores = scores.masked_fill(x < cut[:, None], float("-inf"))
    gaps = [
        abs(scores[r, got[r]] - scores[r, want[r]]).item() / max(1.0, scores[r].abs().max().item())
        for r in bad
    ]
    return len(bad), max(gaps, default=0.0)


def check_draw(n: int, v: int, device: torch.device, config: SampleConfig = DEFAULT_CONFIG) -> bool:
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(n, v, generator=g) * 3).to(torch.bfloat16).to(device)
    scale = (LOG2E / (torch.rand(n, generator=g) + 0.3)).to(device)
    scale[::5] = 0  # greedy rows among sampled ones
    keys = torch.randint(0, 2**32, (n,), generator=g).to(device)
    pos = torch.randint(0, 4096, (n,), generator=g).to(device)
    ok = True
    for cut in (None, logits.float().topk(64, dim=-1).values[:, -1].contiguous()):
        got = sample(logits, scale, cut, keys, pos, config)
        bad, gap = differing_rows(
            logits, scale, cut, keys, pos, got, sample_ref(logits, scale, cut, keys, pos)
        )
        print(f"draw {n}x{v} cut={cut is not None} {config}: {n - bad}/{n} ids identical; "
              f"differing rows are near-ties: {gap < 1e-5} (largest relative gap {gap:.2g})")  # fmt: skip
        ok &= gap < 1e-5
    alone = sample(logits[3:4], scale[3:4], None, keys[3:4], pos[3:4], config).item()
    together = sample(logits, scale, None, keys, pos, config)[3].item()
    print(f"a row alone and among {n - 1} others: {alone} and {together}")
    return ok and alone == together


def check_cut(n: int, v: int, device: torch.device) -> bool:
    ok = True
    for spread in (0.5, 3.0, 30.0):
        g = torch.Generator().manual_seed(1)
        logits = (torch.randn(n, v, generator=g) * spread).to(torch.bfloat16).to(device)
        scale = torch.full((n,), LOG2E / 0.6, device=device)
        top_p = torch.full((n,), 0.9, device=device)
        min_p = torch.full((n,), 0.05, device=device)
        for name, args in (("top_p", (None, top_p, None)), ("min_p", (None, None, min_p))):
            got, want = cut_threshold(logits, scale, *args), cut_threshold_ref(logits, scale, *args)
            x = logits.float()
            moved = ((x >= got[:, None]) != (x >= want[:, None])).sum(dim=-1)
            kept = (x >= want[:, None]).sum(dim=-1).float().mean().item()
            print(f"cut {name} spread {spread}: keeps {kept:.0f} tokens a row; boundary moved by "
                  f"at most {moved.max().item()} token(s)")  # fmt: skip
            ok &= moved.max().item() <= 2
    return ok


def check_distribution(rows: int, v: int, device: torch.device) -> bool:
    g = torch.Generator().manual_seed(2)
    row = (torch.randn(v, generator=g) * 2).to(torch.bfloat16)
    params = [SamplingParams(temperature=0.8, top_k=8, seed=i) for i in range(rows)]
    s, sample_rows = new_sampler(device, params, triton=True)
    ids = s.sample(row.to(device).expand(rows, -1).contiguous(), sample_rows).cpu()
    # top-k keeps every token tied with the k-th largest logit: the kept set is those at or above it
    x = row.float()
    kept = (x >= x.topk(8).values[-1]).nonzero().flatten()
    probs = torch.softmax(x[kept].double() / 0.8, -1).numpy()
    counts = np.array([(ids == t).sum().item() for t in kept.tolist()])
    outside = rows - counts.sum()
    stat = float(((counts - rows * probs) ** 2 / (rows * probs)).sum())
    df = len(kept) - 1
    critical = df * (1 - 2 / (9 * df) + 3.719 * math.sqrt(2 / (9 * df))) ** 3  # chi-square, alpha 1e-4
    print(
        f"{rows} draws cut to the top 8 ({len(kept)} with ties): chi2 {stat:.1f} "
        f"(critical {critical:.1f}), {outside} outside the cut"
    )
    return stat < critical and outside == 0


def timed(fn, device: torch.device, iters: int) -> float:
    """Milliseconds per call, wall time with the device drained (host-bound launches count)."""
    for _ in range(3):
        fn()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters * 1e3


CASES = {
    "greedy": {"temperature": 0.0},
    "T=0.6": {"temperature": 0.6},
    "T=0.6 seeded": {"temperature": 0.6, "seed": 1},
    "top_k=50": {"temperature": 0.6, "top_k": 50},
    "top_p=0.9": {"temperature": 0.6, "top_p": 0.9},
    "min_p=0.05": {"temperature": 0.6, "min_p": 0.05},
    "top_k=20 top_p=0.95": {"temperature": 0.6, "top_k": 20, "top_p": 0.95},
}


def time_cases(n: int, v: int, device: torch.device, iters: int, spreads: tuple[float, ...]) -> None:
    print(f"\n{n} rows x {v} ids, bf16: ms per call (share of a {STEP_MS:g} ms step for Triton)")
    print(f"{'setting':<22}{'old':>10}{'torch':>10}{'triton':>10}{'share':>10}")
    for spread in spreads:
        logits = (torch.randn(n, v, device=device) * spread).to(torch.bfloat16)
        print(f"-- logits of std {spread:g}" + (" (flat, as random weights give)" if spread < 1 else ""))
        for name, kw in CASES.items():
            params = [SamplingParams(**{**kw, "seed": kw.get("seed") and i + 1}) for i in range(n)]
            old = OldSampler(device)
            t_old = "–" if "min_p" in kw else f"{timed(lambda: old(logits, params), device, iters):.3f}"  # noqa: B023
            times = []
            for triton in (False, True):
                s, rows = new_sampler(device, params, triton)
                times.append(timed(lambda: s.sample(logits, rows), device, iters))  # noqa: B023
            share = times[1] / STEP_MS * 100
            print(f"{name:<22}{t_old:>10}{times[0]:>10.3f}{times[1]:>10.3f}{share:>9.2f}%")


def tune(v: int, device: torch.device, smoke: bool) -> list[dict]:
    """The draw alone at temperature 0.6 for each launch config, 256 rows and 1; rows for --json."""
    import triton.testing

    from llmbench.bench.peaks import choose_peak

    peak = choose_peak(str(device)).peak if device.type == "cuda" else None
    copy_bytes_per_s = peak.mem_bandwidth if peak is not None else 4.25e12  # else an H200's copy rate
    grid = itertools.product((1024, 2048), (4, 8), (2, 4, 8, 16), (False, True))
    configs = (
        [SampleConfig(*c) for c in grid] if not smoke else [SampleConfig(), SampleConfig(256, 4, 8, True)]
    )
    out = []
    print(f"\nthe draw alone, temperature 0.6, {v} ids bf16: µs per call (CUDA graph replay, median)")
    print(
        f"{'rows':>5} {'block':>6} {'warps':>6} {'per SM':>7} {'log2':>7} {'µs':>9} {'GB/s':>8} {'differ':>7}"
    )
    for n in (4,) if smoke else (256, 1):
        g = torch.Generator().manual_seed(5)
        logits = (torch.randn(n, v, generator=g) * 0.5).to(torch.bfloat16).to(device)  # flat: random weights
        scale = torch.full((n,), LOG2E / 0.6, device=device)
        keys = torch.randint(0, 2**32, (n,), generator=g).to(device)
        pos = torch.randint(0, 4096, (n,), generator=g).to(device)
        want = sample_ref(logits, scale, None, keys, pos)
        for c in configs:
            got = sample(logits, scale, None, keys, pos, c)
            bad, gap = differing_rows(logits, scale, None, keys, pos, got, want)
            if gap >= 1e-5:
                print(f"FAIL {c}: {bad} ids differ beyond a near-tie (gap {gap:.2g})")
                continue
            if smoke:
                us = timed(lambda: sample(logits, scale, None, keys, pos, c), device, 1) * 1e3  # noqa: B023
            else:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    sample(logits, scale, None, keys, pos, c)
                us = triton.testing.do_bench(graph.replay, warmup=25, rep=100, return_mode="median") * 1e3
            gbps = logits.numel() * logits.element_size() / us / 1e3
            log = "approx" if c.fast_log2 else "exact"
            print(
                f"{n:>5} {c.block:>6} {c.num_warps:>6} {c.programs_per_sm:>7} {log:>7} {us:>9.1f} {gbps:>8.0f} {bad:>7}"
            )
            out.append({
                "kernel": f"sample T=0.6 b{c.block}w{c.num_warps}p{c.programs_per_sm} {log} log2",
                "shape": f"{n}x{v} bf16", "time_us": us, "gb_per_s": gbps,
                "frac_peak": gbps * 1e9 / copy_bytes_per_s, "tflops": None, "max_rel_diff": None, "timing": "graph",
            })  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="CPU, Triton interpreted, small sizes, no timing")
    ap.add_argument("--iters", type=int, default=50, help="calls per timing")
    ap.add_argument("--tune", action="store_true", help="first sweep the draw's launch configs")
    ap.add_argument("--json", type=Path, help="with --tune: write its rows to this JSON file")
    args = ap.parse_args()
    if args.smoke:
        device, v, n, draws = torch.device("cpu"), 3001, 8, 512
    elif torch.cuda.is_available():
        device, v, n, draws = torch.device("cuda"), 151_936, 256, 8192
    else:
        print("no CUDA device: run with --smoke for the checks on the CPU", file=sys.stderr)
        return 2
    if args.tune:
        rows = tune(v, device, args.smoke)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
            print(f"wrote {args.json}")
    ok = check_draw(n, v, device)
    ok &= check_draw(n, v, device, SampleConfig(fast_log2=False))
    ok &= check_cut(8 if args.smoke else 64, v, device)
    ok &= check_distribution(draws, v, device)
    print("checks:", "pass" if ok else "FAIL")
    if not ok:
        return 1
    for rows in (4,) if args.smoke else (256, 1):  # the smoke run only exercises the timing code
        time_cases(rows, v, device, 1 if args.smoke else args.iters, (3.0,) if args.smoke else (3.0, 0.5))
    return 0


if __name__ == "__main__":
    sys.exit(main())
