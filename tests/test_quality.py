"""Quality beside speed: KL divergence, top-1 agreement and first divergence computed right, and
``ablate --quality`` writing rows whose KL is above zero for a float8 KV cache and exactly zero for a
variant that changes no numerics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from llmbench.bench.ablation import parse_toggle, plan
from llmbench.bench.quality.compare import first_divergence, perplexity, position_kl, summarise
from llmbench.cli.app import app
from llmbench.engine.config import EngineConfig
from llmbench.engine.resolve import resolve_here

runner = CliRunner()


def test_kl_is_zero_for_equal_distributions_and_matches_its_definition() -> None:
    base = torch.log_softmax(torch.randn(5, 50), dim=-1)
    other = torch.log_softmax(torch.randn(5, 50), dim=-1)
    assert (position_kl(base, base) == 0).all()
    p = base.double().exp()
    expected = (p * (base.double() - other.double())).sum(-1).numpy()
    assert position_kl(base, other) == pytest.approx(expected, rel=1e-12)
    assert (position_kl(base, other) > 0).all()


def test_kl_ignores_tokens_the_baseline_gives_no_probability() -> None:
    base = torch.log_softmax(torch.tensor([[0.0, 0.0, float("-inf")]]), dim=-1)
    variant = torch.log_softmax(torch.tensor([[0.0, 0.0, 3.0]]), dim=-1)
    kl = position_kl(base, variant)
    assert math.isfinite(kl[0]) and kl[0] == pytest.approx(math.log((2 + math.e**3) / 2))


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2


def test_summary_pools_positions_and_counts_identical_outputs() -> None:
    base = [torch.log_softmax(torch.randn(4, 30), dim=-1) for _ in range(3)]
    variant = [b.clone() for b in base]
    variant[1][2] = torch.log_softmax(torch.randn(30), dim=-1)  # one position of one prompt changed
    out = summarise(base, variant, [[1, 2], [3, 4], [5, 6]], [[1, 2], [3, 9], [5, 6]])
    kl_changed = position_kl(base[1][2:3], variant[1][2:3])[0]
    assert out["positions"] == 12 and out["kl_mean"] == pytest.approx(kl_changed / 12)
    assert out["kl_max"] == pytest.approx(kl_changed)
    assert out["greedy_identical"] == 2 and out["first_divergence"] == [None, 1, None]
    agree = base[1][2].argmax() == variant[1][2].argmax()
    assert out["top1_agreement"] == pytest.approx((11 + int(agree)) / 12)


def test_perplexity_is_exp_of_the_mean_negative_log_probability() -> None:
    assert perplexity([[math.log(0.5)] * 3, [math.log(0.25)]]) == pytest.approx(
        math.exp(-(3 * math.log(0.5) + math.log(0.25)) / 4)
    )


def test_kv_cache_dtype_toggles_between_auto_and_fp8() -> None:
    config = resolve_here(EngineConfig.from_options("qwen3-tiny", device="cpu"))
    assert [v.options for v in plan("flip", [parse_toggle("kv_cache_dtype")], config)] == [
        {},
        {"kv_cache_dtype": "fp8_e4m3"},
    ]
    given = plan("flip", [parse_toggle("kv_cache_dtype=auto,fp8_e4m3,fp8_e5m2")], config)
    assert [v.name for v in given] == ["baseline", "kv_cache_dtype=fp8_e4m3", "kv_cache_dtype=fp8_e5m2"]


SCENARIO = {
    "name": "qual",
    "model": "qwen3-tiny",
    "engine": {"device": "cpu"},
    "workload": {"num_requests": 3, "input_len": {"dist": "uniform", "min": 8, "max": 24}, "output_len": 3},
    "arrival": {"kind": "offline"},
    "telemetry": {"enabled": False},
}


def invoke(*args):
    res = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "250"})
    assert "Traceback" not in res.output, res.output
    return res


@pytest.mark.slow
def test_ablate_quality_rows_show_float8_error_and_none_for_a_scheduling_toggle(tmp_path: Path) -> None:
    path = tmp_path / "qual.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 4)
    res = invoke(
        "ablate", path, "--toggle", "kv_cache_dtype=auto,fp8_e4m3", "--toggle", "chunked_prefill",
        "--design", "one-at-a-time", "--quality", "--quality-prompts", "3", "--quality-tokens", "5",
        "--quality-text", text, "--out", tmp_path / "r",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    (folder,) = list((tmp_path / "r" / "qual").iterdir())
    record = json.loads((folder / "quality.json").read_text())
    rows = {v["name"]: v for v in record["variants"]}
    fp8, same = rows["kv_cache_dtype=fp8_e4m3"], rows["chunked_prefill=off"]
    print(f"KL mean: fp8 {fp8['kl_mean']:.3g}, chunked_prefill=off {same['kl_mean']}")
    assert fp8["status"] == same["status"] == "ok" and fp8["positions"] == same["positions"] == 15
    assert fp8["kl_mean"] > 0 and fp8["kl_max"] >= fp8["kl_p99"] > 0
    assert same["kl_mean"] == same["kl_max"] == 0 and same["top1_agreement"] == 1.0
    assert same["greedy_identical"] == 3 and same["perplexity"] == same["perplexity_baseline"] > 1
    assert record["note"] and "random weights" in record["note"]  # said plainly for a preset
    assert not (folder / "quality" / "baseline.pt").exists()  # the large file is gone
    assert "outputs against baseline" in res.stdout and "kv_cache_dtype=fp8_e4m3" in res.stdout


def test_quality_refuses_what_it_cannot_measure(tmp_path: Path) -> None:
    path = tmp_path / "qual.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    res = invoke("ablate", path, "--backend", "engine", "--backend", "transformers", "--quality")
    assert res.exit_code == 2 and "does not apply to --backend" in res.output
    res = invoke("ablate", path, "--toggle", "chunked_prefill", "--quality-text", tmp_path / "none.txt")
    assert res.exit_code == 2 and "add --quality" in res.output
    res = invoke(
        "ablate", path, "--toggle", "chunked_prefill", "--quality", "--quality-text", tmp_path / "no.txt"
    )
    assert res.exit_code == 2 and "no such file" in res.output
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    res = invoke("ablate", path, "--toggle", "chunked_prefill", "--quality", "--quality-text", latin)
    assert res.exit_code == 2 and "cannot read it as UTF-8 text" in res.output


def test_a_quality_text_the_models_tokenizer_cannot_encode_is_refused_before_any_variant(
    tmp_path: Path,
) -> None:
    from tiny_models import break_tokenizer, make_tiny

    folder = tmp_path / "model"
    make_tiny("qwen3", folder)
    break_tokenizer(folder)
    path = tmp_path / "qual.yaml"
    path.write_text(yaml.safe_dump({**SCENARIO, "model": str(folder)}))
    text = tmp_path / "t.txt"
    text.write_text("some text to score\n")
    out = tmp_path / "r"
    res = invoke(
        "ablate", path, "--toggle", "chunked_prefill", "--quality", "--quality-text", text, "--out", out
    )
    assert res.exit_code == 2, res.output
    said = " ".join(res.stderr.split())
    assert (
        f"--quality-text {text}: a text prompt needs the model's tokenizer: {folder}: its tokenizer" in said
    )
    assert not out.exists()  # refused before any variant ran


def test_the_report_view_has_a_row_per_variant_and_says_why_one_failed(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from llmbench.bench.report.frame import Group
    from llmbench.bench.report.quality import quality_views

    ok = {
        "name": "kv_cache_dtype=fp8_e4m3", "status": "ok", "kl_mean": 0.0123, "kl_mean_ci": [0.01, 0.015],
        "kl_p99": 0.05, "top1_agreement": 0.875, "greedy_identical": 2, "greedy_prompts": 3,
        "first_divergence_min": 7, "first_divergence_median": 7.0, "perplexity_baseline": 10.5, "perplexity": 10.75,
    }  # fmt: skip
    failed = {
        "name": "tp=2",
        "status": "failed",
        "error": "warning: a note before it\nerror: the engine said no",
    }
    record = {"baseline": "baseline", "settings": {"prompts": 3, "tokens": 8}, "method": "m", "note": "N",
              "variants": [ok, failed]}  # fmt: skip
    (tmp_path / "quality.json").write_text(json.dumps(record))
    group = Group("s", "sess", "baseline", runs=[SimpleNamespace(path=tmp_path / "baseline-r0")])
    (view,) = quality_views("s", [group])
    assert view.rows[0][:5] == ["kv_cache_dtype=fp8_e4m3", "0.0123", "0.01 … 0.015", "0.05", "87.5%"]
    assert view.rows[0][5] == "2/3 identical; first at 7, median 7" and view.rows[0][6] == "10.5 -> 10.75"
    assert view.rows[1][:2] == ["tp=2", "failed: the engine said no"]
    assert "Note: N" in view.title and "(3 prompts x 8 tokens, m)" in view.title
    record["settings"]["prompts"] = 100  # more asked for than the workload's 3 requests: 3 were used
    (tmp_path / "quality.json").write_text(json.dumps(record))
    (view,) = quality_views("s", [group])
    assert "(3 prompts (100 asked; the workload has no more) x 8 tokens" in view.title
    assert (
        quality_views("s", [Group("s", "x", "b", runs=[SimpleNamespace(path=tmp_path / "none" / "r")])]) == []
    )


def test_a_stopped_quality_run_keeps_its_rows_and_the_report_says_what_it_did_not_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from llmbench.bench.ablation import quality
    from llmbench.bench.quality.measure import QualitySettings
    from llmbench.bench.report.frame import Group
    from llmbench.bench.report.quality import quality_views

    def child(resolved, sets, variant, settings, work, out, timeout_s):  # the user's Ctrl-C or a timeout
        if variant.name == "b":
            raise KeyboardInterrupt
        return None

    monkeypatch.setattr(quality, "_child", child)
    monkeypatch.setattr(
        quality, "config_problem", lambda resolved, v: "cannot apply" if v.name == "a" else None
    )
    variants = [SimpleNamespace(name=n, options={}) for n in ("baseline", "a", "b", "c")]
    with pytest.raises(KeyboardInterrupt):
        quality.run_quality(None, [], variants, tmp_path, QualitySettings(2, 3, None))
    record = json.loads((tmp_path / "quality.json").read_text())
    assert record["status"] == "interrupted"
    assert [(v["name"], v["status"]) for v in record["variants"]] == [
        ("a", "failed"), ("b", "interrupted"), ("c", "interrupted"),
    ]  # fmt: skip
    group = Group("s", "sess", "baseline", runs=[SimpleNamespace(path=tmp_path / "baseline-r0")])
    (view,) = quality_views("s", [group])
    assert "Interrupted" in view.title
    assert [row[:2] for row in view.rows] == [
        ["a", "failed: cannot apply"],
        ["b", "not measured: the quality run was stopped first"],
        ["c", "not measured: the quality run was stopped first"],
    ]
    # Stopped before it wrote anything (its working folder made, no record): the report says so.
    (tmp_path / "quality.json").unlink()
    (view,) = quality_views("s", [group])
    assert view.rows[0][1].startswith("not recorded")


def test_the_quality_phase_follows_complete_timings_and_an_interrupt_keeps_them(monkeypatch, tmp_path):
    # ``ablate --quality``'s second phase, without the command line: it runs only after complete timings,
    # says its note, reports a variant it could not measure, and Ctrl-C in it marks the ablation
    # interrupted (the timings are kept).
    from llmbench.bench.ablation import quality as phase
    from llmbench.bench.ablation.execute import AblationOutcome

    said: list[tuple[str, str]] = []
    calls = []

    def measured(*args, **kwargs):
        calls.append(args)
        return {"note": "random weights", "variants": [{"status": "ok"}, {"status": "failed"}]}

    monkeypatch.setattr(phase, "run_quality", measured)
    done = AblationOutcome(tmp_path, "complete", [])
    args = (None, [], [], None, lambda level, text: said.append((level, text)))
    assert phase.quality_after(done._replace(status="interrupted"), *args) == (
        done._replace(status="interrupted"),
        False,
    )
    assert not calls  # incomplete timings: no quality phase
    assert phase.quality_after(done, *args) == (done, True) and said == [("info", "quality: random weights")]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(phase, "run_quality", interrupted)
    assert phase.quality_after(done, *args) == (done._replace(status="interrupted"), False)
