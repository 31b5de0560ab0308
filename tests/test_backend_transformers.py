"""The transformers backend: the same preset, the same weights, the same greedy tokens as the engine.

Both of its serving paths (continuous batching for throughput scenarios, ``generate`` for single-stream
ones) are checked token for token against the engine in float32, with timings that make sense; the model
helper is checked on Qwen2 and on Llama with Llama 3 RoPE scaling (small presets added for the test);
and ``ablate`` compares the engine and transformers end to end, each in its own process.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from llmbench import LLM, SamplingParams
from llmbench.bench.backends.transformers import TransformersBackend
from llmbench.bench.errors import BenchError
from llmbench.bench.runner import RunRequest, execute_run
from llmbench.bench.scenario import load_scenario
from llmbench.bench.scenario.schema import Scenario
from llmbench.bench.store import load_run
from llmbench.bench.workload.spec import RequestSpec
from llmbench.cli.app import app
from llmbench.models.presets import PRESETS, Preset

BASE = {
    "name": "tf",
    "model": "qwen3-tiny",
    "backend": "transformers",
    "engine": {"device": "cpu", "dtype": "float32"},
    "workload": {"num_requests": 4, "input_len": {"dist": "uniform", "min": 6, "max": 30}, "output_len": 12},
    "arrival": {"kind": "offline"},
    "telemetry": {"period_ms": 20},
}


def scenario(**patch) -> Scenario:
    return Scenario.model_validate({**BASE, **patch})


def prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=int(rng.integers(5, 40))).tolist() for _ in range(n)]


def engine_greedy(model: str, ps: list[list[int]], n: int) -> list[list[int]]:
    llm = LLM(model, device="cpu", dtype="float32", num_kv_blocks=128, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    return [o.token_ids for o in llm.generate(ps, params)]


def served(backend: TransformersBackend, ps: list[list[int]], n: int, concurrency: int | None):
    specs = [RequestSpec(str(i), p, n) for i, p in enumerate(ps)]
    offsets = None if concurrency else [0.0] * len(specs)
    backend.start()
    try:
        result = backend.run(
            specs, offsets, concurrency=concurrency, tag="t-", max_duration=None, on_progress=None
        )
    finally:
        backend.shutdown()
    assert result.status == "complete", result.error
    return sorted(result.requests, key=lambda r: int(r.request_id))


@pytest.mark.parametrize(
    ("arrival", "mode"),
    [({"kind": "offline"}, "continuous_batching"), ({"kind": "concurrency", "concurrency": 1}, "generate")],
)
def test_greedy_tokens_equal_the_engines_with_sane_timings(arrival, mode):
    backend = TransformersBackend(scenario(arrival=arrival))
    assert backend.mode == mode
    ps = prompts(5, PRESETS["qwen3-tiny"].config.vocab_size)
    records = served(backend, ps, 12, None if arrival["kind"] == "offline" else 1)
    assert [r.token_ids for r in records] == engine_greedy("qwen3-tiny", ps, 12)
    for r in records:
        assert r.finish_reason == "length" and r.output_check is None and r.error is None
        t = np.asarray(r.token_times)
        assert len(t) == 12 and (np.diff(t) >= 0).all()
        assert r.arrival <= r.first_scheduled <= t[0]  # queued, then scheduled, then its first token
        assert r.num_cached_tokens is None and r.num_preemptions is None  # not known: not 0
    if mode == "generate":  # one at a time: each starts after the previous one's last token
        for a, b in zip(records, records[1:], strict=False):
            assert b.first_scheduled >= a.token_times[-1]
    assert backend.describe()["token_times_source"]


SMALL = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=512, eos_token_id=None,
)  # fmt: skip


@pytest.mark.parametrize("preset", ["qwen2-0.5b", "llama3.2-1b"])
def test_qwen2_and_llama3_presets_give_the_engines_tokens(preset, monkeypatch):
    """Small copies of the presets (Qwen2's q/k/v bias; Llama 3 RoPE scaling that bites at these lengths)."""
    cfg = PRESETS[preset].config.replace(**SMALL)
    if cfg.rope.kind == "llama3":
        cfg = cfg.replace(rope=dataclasses.replace(cfg.rope, original_max_position_embeddings=32))
    monkeypatch.setitem(PRESETS, "small-test", Preset("small-test", "test copy", cfg))
    backend = TransformersBackend(
        scenario(model="small-test", arrival={"kind": "concurrency", "concurrency": 1})
    )
    ps = prompts(3, cfg.vocab_size, seed=1)
    ps = [p + p for p in ps]  # positions past original_max_position_embeddings
    records = served(backend, ps, 16, 1)
    assert [r.token_ids for r in records] == engine_greedy("small-test", ps, 16)
    assert len({t for r in records for t in r.token_ids}) > 8  # tokens vary: agreement means something


def test_a_model_folder_is_loaded_with_from_pretrained_and_agrees_with_the_engine(tmp_path):
    from tiny_models import make_tiny

    make_tiny("llama", tmp_path / "m")
    backend = TransformersBackend(scenario(model=str(tmp_path / "m")))
    ps = prompts(3, 384, seed=2)
    records = served(backend, ps, 10, None)
    assert [r.token_ids for r in records] == engine_greedy(str(tmp_path / "m"), ps, 10)


def test_options_that_cannot_apply_are_errors_naming_their_path():
    with pytest.raises(BenchError, match=r"backend_options.transformers.mode: 'generate' serves one request"):
        TransformersBackend(
            scenario(
                arrival={"kind": "concurrency", "concurrency": 4},
                backend_options={"transformers": {"mode": "generate"}},
            )
        )
    with pytest.raises(
        BenchError, match=r"backend_options.transformers.num_blocks: applies to mode continuous"
    ):
        TransformersBackend(
            scenario(
                arrival={"kind": "concurrency", "concurrency": 1},
                backend_options={"transformers": {"num_blocks": 64}},
            )
        )
    with pytest.raises(
        BenchError, match=r"backend_options.transformers.cuda_graph: True needs a CUDA device"
    ):
        TransformersBackend(scenario(backend_options={"transformers": {"cuda_graph": True}}))


def test_engine_options_transformers_does_not_apply_are_named_not_dropped_in_silence():
    assert TransformersBackend(scenario()).warnings == []  # device and dtype: it takes them
    engine = {
        "device": "cpu",
        "dtype": "float32",
        "paged_kv": False,
        "max_num_seqs": 1,
        "kv_cache_dtype": "fp8_e4m3",
    }
    (text,) = TransformersBackend(scenario(engine=engine)).warnings
    assert text.startswith(
        "engine options the transformers backend does not apply, so they do not shape this run: "
        "kv_cache_dtype, max_num_seqs, paged_kv (it takes only device, dtype, seed, max_model_len, kv_cache_memory"
    )


class _Said:
    """Run events, in the order a user would see them."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def message(self, level: str, text: str) -> None:
        self.lines.append(f"{level}: {text}")

    def phase(self, text: str) -> None:
        self.lines.append(f"phase: {text}")

    def progress(self, label, repeat, progress) -> None:
        pass


def test_a_peer_backends_untaken_options_are_said_before_it_starts_and_once(tmp_path):
    # engine.tp=2 and a KV dtype shape nothing a transformers run does: a user must hear it before the
    # model loads and the run is measured (and can stop it), not only in the results; said once.
    path = tmp_path / "tf.yaml"
    data = {**BASE, "engine": {**BASE["engine"], "tp": 2, "kv_cache_dtype": "fp8_e4m3"}, "warmup": 0}
    path.write_text(yaml.safe_dump(data))
    said = _Said()
    outcome = execute_run(RunRequest(load_scenario(path), tmp_path / "r"), said)
    (untaken,) = [i for i, line in enumerate(said.lines) if "does not apply" in line]
    assert "kv_cache_dtype, tp" in said.lines[untaken]
    first_phase = next(i for i, line in enumerate(said.lines) if line.startswith("phase: "))
    assert untaken < first_phase, said.lines
    assert said.lines[untaken].removeprefix("warning: ") in outcome.summary["warnings"]  # and recorded
    res = CliRunner().invoke(
        app,
        ["run", str(path), "--out", str(tmp_path / "cli")],
        env={"COLUMNS": "400"},
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    assert res.output.count("does not apply, so they do not shape this run") == 1, res.output


def test_run_stores_engine_only_figures_as_unavailable(tmp_path, monkeypatch):
    # As on a GPU with a known peak, where the engine-only utilisation figures are computed.
    from llmbench.bench.peaks import PeakChoice, PeakUsed

    fake = PeakUsed(1e12, 1e15, "bfloat16", "datasheet", None, None, None)
    monkeypatch.setattr("llmbench.bench.run_record.choose_peak", lambda device: PeakChoice(fake, None, None))
    path = tmp_path / "tf.yaml"
    path.write_text(yaml.safe_dump({**BASE, "arrival": {"kind": "poisson", "rate": 40}, "warmup": 1}))
    outcome = execute_run(RunRequest(load_scenario(path), tmp_path / "r"))
    run = load_run(outcome.run_dir)
    assert run.meta["backend"] == "transformers" and run.meta["engine_config"] is None
    assert run.meta["backend_config"]["mode"] == "continuous_batching"
    assert run.meta["model_info"]["num_params"] == PRESETS["qwen3-tiny"].config.num_params()
    m = run.summary["points"][0]["metrics"]
    assert m["num_completed"]["value"] == 4 and m["output_throughput"]["value"] > 0
    assert m["ttft_p50"]["value"] > 0 and m["queue_p50"]["value"] is not None
    for name in ("kv_usage_max", "prefix_cache_hit_rate", "preemptions", "num_steps", "decode_bw_util_mean"):
        assert m[name]["value"] is None and name in run.summary["unavailable"]
    assert len(run.table("steps")) == 0
    assert run.table("requests")["num_cached_tokens"].isna().all()


def test_ablate_compares_engine_and_transformers_side_by_side(tmp_path):
    path = tmp_path / "abl.yaml"
    data = {
        **BASE,
        "name": "abl",
        "backend": ["engine", "transformers"],
        "workload": {**BASE["workload"], "output_len": 6},
    }
    path.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(app, ["ablate", str(path), "--out", str(tmp_path / "r")], env={"COLUMNS": "200"})
    assert "Traceback" not in res.output, res.output
    assert res.exit_code == 0, res.output
    assert "backend=transformers against backend=engine" in res.stdout
    row = next(line for line in res.stdout.splitlines() if "outputs against backend=engine" in line)
    assert re.search(r"(\d+)/\1 identical", row), row  # greedy, float32: the same tokens from both
    (folder,) = list((tmp_path / "r" / "abl").iterdir())
    record = json.loads((folder / "ablation.json").read_text())
    assert record["design"] == "backends" and record["baseline"] == "backend=engine"
    assert [(v["name"], v["status"], v["backend"]) for v in record["variants"]] == [
        ("backend=engine", "ok", "engine"),
        ("backend=transformers", "ok", "transformers"),
    ]
    runs = [load_run(folder / name) for name in ("backend-engine-r0", "backend-transformers-r0")]
    assert [r.meta["backend"] for r in runs] == ["engine", "transformers"]
    # `report` on the folder later finds the same baseline and labels the backends.
    rep = CliRunner().invoke(app, ["report", str(folder), "-f", "markdown"])
    assert rep.exit_code == 0 and "backend=transformers against backend=engine" in rep.stdout


def test_ablate_backend_flags_and_their_errors(tmp_path):
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump({**BASE, "backend": "engine"}))
    res = CliRunner().invoke(app, ["ablate", str(path), "--backend", "engine", "--toggle", "paged_kv"])
    assert res.exit_code == 2 and "give one or the other" in res.stderr
    res = CliRunner().invoke(app, ["ablate", str(path), "--backend", "engine"])
    assert res.exit_code == 2 and "comparing backends needs at least two" in res.stderr
    res = CliRunner().invoke(app, ["ablate", str(path), "--backend", "engine", "--backend", "vllm"])
    assert res.exit_code == 2 and "Unsupported backend: 'vllm'" in res.stderr
    path.write_text(yaml.safe_dump({**BASE, "backend": ["engine", "transformers"]}))
    res = CliRunner().invoke(app, ["run", str(path)])
    assert res.exit_code == 2 and "`run` measures one" in res.stderr and "llmbench ablate" in res.stderr
    res = CliRunner().invoke(app, ["ablate", str(path), "--toggle", "paged_kv"])
    assert res.exit_code == 2 and "add --set backend=engine" in res.stderr


def test_hf_config_keeps_the_presets_shapes():
    from llmbench.bench.backends.hf_model import hf_config

    cfg = PRESETS["llama3.1-8b"].config
    hf = hf_config(cfg).to_dict()
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    assert rope["rope_type"] == "llama3" and rope["factor"] == 8.0
    assert rope["original_max_position_embeddings"] == 8192
    assert (hf.get("rope_theta") or rope.get("rope_theta")) == 500_000.0
    assert hf["num_key_value_heads"] == 8 and hf["head_dim"] == 128 and hf["tie_word_embeddings"] is False


@pytest.mark.slow
@pytest.mark.parametrize("name", ["throughput", "single_stream"])
def test_the_shipped_peer_scenarios_compare_engine_and_transformers(tmp_path, name):
    shipped = Path(__file__).resolve().parents[1] / "scenarios" / "peers" / f"{name}.yaml"
    sets = ["workload.num_requests=3", "workload.output_len=8", "warmup=1", "repeats=1"]
    args = ["ablate", str(shipped), "--profile", "cpu", "--out", str(tmp_path / "r")]
    res = CliRunner().invoke(app, args + [x for s in sets for x in ("--set", s)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    row = next(line for line in res.stdout.splitlines() if "outputs against backend=engine" in line)
    assert re.search(r"(\d+)/\1 identical", row), row
