"""``llmbench profile`` running its variants, with the child processes faked: a variant stopped at
``--timeout`` is said to have timed out (not "failed (exit 8.0)"), the profile that none completed is
failed, and a failed variant's error is what the child said, not the profiler's log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llmbench.bench.ablation.execute import ChildTimeout
from llmbench.bench.ablation.plan import Variant
from llmbench.bench.errors import error_headline
from llmbench.bench.profile import execute
from llmbench.bench.profile.execute import ProfileSettings, run_profile
from llmbench.bench.scenario.loader import load_scenario

from tiny_models import PROFILED

USDT = "USDT:2026-12-05 17:13:40 17501:17501 SyncActivityProfilerHandler.cpp:52] profiler_start"
VARIANTS = [Variant("baseline", {}), Variant("paged_kv=off", {"paged_kv": False})]


def _partial_profile(variant: str) -> dict:
    kind = {"steps": 4, "wall": 0.01, "busy": 0.008, "idle": 0.002, "device": {"GEMM": 0.008},
            "waited_for": {}, "untraced_median": 0.005}  # fmt: skip
    return {"variant": variant, "status": "incomplete", "mode": "cpu", "kinds": {"decode": kind}}


def _profile(tmp_path: Path, monkeypatch, child) -> tuple[execute.ProfileOutcome, list[tuple[str, str]]]:
    """Run a profile of VARIANTS whose children ``child(variant, folder)`` fakes."""
    path = tmp_path / "prof.yaml"
    path.write_text(yaml.safe_dump(PROFILED))
    resolved = load_scenario(path, [], "none")

    def run_child(cmd, env, timeout_s=None):
        folder = Path(cmd[cmd.index("--trace-dir") + 1])
        folder.mkdir(parents=True, exist_ok=True)
        return child(cmd[cmd.index("--variant") + 1], folder)

    monkeypatch.setattr(execute, "_run_child", run_child)
    events: list[tuple[str, str]] = []
    folder = tmp_path / "out"
    folder.mkdir()
    settings = ProfileSettings(4, False, 5.0, 8.0)
    outcome = run_profile(resolved, [], VARIANTS, settings, folder, lambda *e: events.append(e))
    return outcome, events


def test_a_variant_past_its_timeout_is_said_to_have_timed_out_and_the_profile_to_have_failed(
    tmp_path, monkeypatch
):
    def child(variant: str, folder: Path):
        (folder / "profile.json").write_text(json.dumps(_partial_profile(variant)))  # kept as it stopped
        return ChildTimeout(8.0, f"{USDT}\nerror: interrupted\n")

    outcome, events = _profile(tmp_path, monkeypatch, child)
    said = "timed out after 8 s (--timeout); the run was stopped"
    assert [(v.status, v.error) for v in outcome.variants] == [("failed", said)] * 2
    assert [text for level, text in events if level == "warning"] == [
        f"variant {v.name}: {said}" for v in VARIANTS
    ]
    assert outcome.status == "failed"
    recorded = json.loads((outcome.folder / "profile.json").read_text())
    assert recorded["status"] == "failed"
    assert [(v["status"], v["error"]) for v in recorded["variants"]] == [("failed", said)] * 2


def test_a_failed_variants_error_is_the_childs_not_the_profilers_log(tmp_path, monkeypatch):
    def child(variant: str, folder: Path):
        if variant == "baseline":
            (folder / "profile.json").write_text(json.dumps(_partial_profile(variant)))
            return 0, USDT
        return 1, f"{USDT}\nwarning: something on the way\nerror: the engine could not start: out of memory\n"

    outcome, _ = _profile(tmp_path, monkeypatch, child)
    assert outcome.status == "complete"  # one variant was profiled
    failed = outcome.variants[1]
    assert failed.status == "failed" and "USDT" not in failed.error
    assert error_headline(failed.error) == "the engine could not start: out of memory"


@pytest.mark.parametrize(
    ("error", "headline"),
    [
        ("warning: x\nerror: first\nmore\nerror: last", "last"),
        ("Traceback\n  File x\nValueError: bad", "ValueError: bad"),
        ("", "unknown error"),
    ],
)
def test_the_headline_of_an_error_is_its_last_error_line(error, headline):
    assert error_headline(error) == headline
