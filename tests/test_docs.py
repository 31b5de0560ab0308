"""The measured tables of README.md and BENCHMARKS.md are generated from kept result folders, and stay so."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from llmbench.cli.app import app

REPO = Path(__file__).resolve().parents[1]


def test_the_repository_documents_match_what_their_commands_make_now(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a block's folders (--baseline's too) are the document's, wherever it runs
    res = CliRunner().invoke(app, ["docs", "--check"])
    assert res.exit_code == 0, res.output


def _ablation(tmp_path: Path) -> Path:
    """A kept ablation folder: summaries and metadata only, no request-level tables."""
    src = REPO / "tests" / "data" / "kept-ablation"
    dst = tmp_path / "results" / "kept-ablation"
    shutil.copytree(src, dst)
    return dst


def test_a_block_is_regenerated_and_then_checks_clean(tmp_path):
    _ablation(tmp_path)
    doc = tmp_path / "DOC.md"
    command = "report results/kept-ablation --view deltas -m output_throughput"
    doc.write_text(
        f"intro\n<!-- llmbench: {command} -->\nstale text typed by hand\n<!-- /llmbench -->\nend\n"
    )
    runner = CliRunner()
    res = runner.invoke(app, ["docs", "--check", str(doc)])
    assert res.exit_code == 1 and "out of date" in res.output
    res = runner.invoke(app, ["docs", str(doc)])
    assert res.exit_code == 0, res.output
    text = doc.read_text()
    assert "stale text typed by hand" not in text and text.startswith("intro\n") and text.endswith("end\n")
    assert f"`llmbench {command}` · measured" in text  # the provenance line names the command
    assert "| output tok/s (tok/s) |" in text
    assert runner.invoke(app, ["docs", "--check", str(doc)]).exit_code == 0


def test_a_changed_result_makes_its_table_stale(tmp_path):
    folder = _ablation(tmp_path)
    doc = tmp_path / "DOC.md"
    doc.write_text(
        "<!-- llmbench: report results/kept-ablation --view overview -m output_throughput -->\n<!-- /llmbench -->\n"
    )
    runner = CliRunner()
    assert runner.invoke(app, ["docs", str(doc)]).exit_code == 0
    summary_path = next(folder.rglob("summary.json"))
    summary = json.loads(summary_path.read_text())
    for point in summary["points"]:
        for rep in point["repeats"]:
            rep["metrics"]["output_throughput"] *= 2
    summary_path.write_text(json.dumps(summary))
    assert runner.invoke(app, ["docs", "--check", str(doc)]).exit_code == 1


def test_unknown_block_kinds_and_missing_folders_are_clear_errors(tmp_path):
    doc = tmp_path / "DOC.md"
    doc.write_text("<!-- llmbench: plot results/x -->\n<!-- /llmbench -->\n")
    res = CliRunner().invoke(app, ["docs", str(doc)])
    assert res.exit_code == 2 and "Unsupported generated block: 'plot results/x'" in res.output
    doc.write_text("<!-- llmbench: report results/nowhere -->\n<!-- /llmbench -->\n")
    res = CliRunner().invoke(app, ["docs", str(doc)])
    assert res.exit_code == 2 and "no such result folder: results/nowhere" in res.output
    assert "relative to the document's own folder" in " ".join(res.output.split())


def test_the_compact_changes_view_has_a_row_per_variant_with_its_verdict(tmp_path):
    _ablation(tmp_path)
    res = CliRunner().invoke(
        app,
        ["report", str(tmp_path / "results" / "kept-ablation"), "--view", "changes", "-m", "output_throughput",
         "--format", "markdown"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = [line for line in res.output.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| variant | repeats | output tok/s (tok/s) | change [95% CI] | verdict |")
    assert rows[1].startswith("| baseline: baseline | 2 |")
    variant = rows[2].split(" | ")
    assert variant[0] == "| chunked_prefill=off" and variant[1] == "2"
    assert variant[4].rstrip(" |").split(" (")[0] in ("better", "worse", "equivalent", "inconclusive")


def test_a_kernel_table_keeps_the_rows_its_match_names(tmp_path):
    rows = [
        {"kernel": "paged_decode", "shape": "B=64", "time_us": 259.6, "gb_per_s": 4138.0, "frac_peak": 0.986},
        {"kernel": "paged_decode fp8_e4m3 n64w4s3", "shape": "B=64", "time_us": 334.0},
        {"kernel": "paged_decode fp8_e4m3 to fp16 n128w4s3", "shape": "B=64", "time_us": 246.8},
    ]
    (tmp_path / "k.json").write_text(json.dumps(rows))
    doc = tmp_path / "DOC.md"
    runner = CliRunner()
    doc.write_text("<!-- llmbench: kernels k.json --match fp8.*n[0-9]+w -->\n<!-- /llmbench -->\n")
    assert runner.invoke(app, ["docs", str(doc)]).exit_code == 0, doc.read_text()
    text = doc.read_text()
    assert (
        "| paged_decode fp8_e4m3 n64w4s3 | B=64 | 334.0 |" in text
        and "| paged_decode | B=64 | 259.6 |" not in text
    )
    assert "to fp16 n128w4s3 | B=64 | 246.8 | – |" in text and "matches `fp8.*n[0-9]+w`" in text
    doc.write_text("<!-- llmbench: kernels k.json --shape B=64$ --match n128 -->\n<!-- /llmbench -->\n")
    assert runner.invoke(app, ["docs", str(doc)]).exit_code == 0, doc.read_text()
    table = [line for line in doc.read_text().splitlines() if line.startswith("| paged")]
    assert table == ["| paged_decode fp8_e4m3 to fp16 n128w4s3 | B=64 | 246.8 | – | – | – | – |"], table
    assert "(the rows whose kernel matches `n128` and whose shape matches `B=64$`)" in doc.read_text()
    for bad, says in (
        ("kernels k.json --only x", "optionally --match REGEX and --shape REGEX"),
        ("kernels k.json --match", "optionally --match REGEX"),
        ("kernels k.json --match ( --shape x", "not a regular expression"),
        ("kernels k.json --shape [", "kernels --shape '[': not a regular expression"),
    ):
        doc.write_text(f"<!-- llmbench: {bad} -->\n<!-- /llmbench -->\n")
        res = runner.invoke(app, ["docs", str(doc)])
        assert res.exit_code == 2 and says in res.output, res.output


def test_the_linear_layer_benchmark_writes_rows_a_kernel_table_shows(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "devtools"))
    from bench_linear import products, table_rows

    dims = (1024, 2048, 1024, 3072, 151936)  # qwen3-0.6b: hidden, q, kv, intermediate, vocabulary
    per = {"qkv": 5.0, "o": 6.0, "gate_up": 7.0, "down": 8.0}
    rows = table_rows("cuBLAS", "0.6b", 16, dims, per, layer=25.0, lm_head=90.0)
    assert [r["kernel"] for r in rows] == [
        f"{p} (cuBLAS)" for p in (*products(1, 1, 1, 1), "lm_head", "layer")
    ]
    layer_bytes = 2 * (4096 * 1024 + 1024 * 2048 + 6144 * 1024 + 1024 * 3072)
    (tmp_path / "lin.json").write_text(json.dumps(rows))
    doc = tmp_path / "DOC.md"
    doc.write_text(
        "<!-- llmbench: kernels lin.json --match ^layer --shape '16 rows' -->\n<!-- /llmbench -->\n"
    )
    assert CliRunner().invoke(app, ["docs", str(doc)]).exit_code == 0, doc.read_text()
    table = [line for line in doc.read_text().splitlines() if line.startswith("| layer")]
    gb_per_s = f"{layer_bytes / 25.0 / 1e3:,.0f}"
    assert table == [f"| layer (cuBLAS) | 0.6b 16 rows qkv+o+gate_up+down | 25.0 | {gb_per_s} | – | "
                     f"{2 * 16 * layer_bytes / 2 / 25.0 / 1e6:.1f} | – |"], table  # fmt: skip


def test_the_skinny_matmul_benchmark_writes_rows_a_kernel_table_shows(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "devtools"))
    from bench_gemv import kernel_rows

    from llmbench.kernels.skinny_tiles import Tiles

    best = (4.0e-6, Tiles(32, 256, 4, 4, dot=True))
    rows = kernel_rows("0.6b.o", 1024, 2048, 8, 6.0e-6, 5.0e-6, best) + kernel_rows(
        "0.6b.o", 1024, 2048, 1, 3.0e-6, 2.5e-6, None
    )
    assert [r["kernel"] for r in rows] == [
        "0.6b.o (cuBLAS)",
        "0.6b.o (skinny, tiles_for)",
        "0.6b.o (skinny, best n32 k256 w4 s4 tensor cores)",
        "0.6b.o (cuBLAS)",
        "0.6b.o (skinny, tiles_for)",
    ]
    (tmp_path / "gemv.json").write_text(json.dumps(rows))
    doc = tmp_path / "DOC.md"
    doc.write_text(
        "<!-- llmbench: kernels gemv.json --match tiles_for --shape '^8 rows' -->\n<!-- /llmbench -->\n"
    )
    assert CliRunner().invoke(app, ["docs", str(doc)]).exit_code == 0, doc.read_text()
    table = [line for line in doc.read_text().splitlines() if line.startswith("| 0.6b")]
    weight = 1024 * 2048 * 2  # bf16 bytes read
    assert table == [f"| 0.6b.o (skinny, tiles_for) | 8 rows N=1024 K=2048 | 5.0 | {weight / 5.0e-6 / 1e9:,.0f} | – | "
                     f"{2 * 8 * 1024 * 2048 / 5.0e-6 / 1e12:.1f} | – |"], table  # fmt: skip


def test_the_two_stream_benchmark_checks_the_halves_against_the_whole_batch(tmp_path):
    # devtools/bench_overlap.py: the batch cut in two, each half through the same layers; the halves'
    # outputs, put back in the batch's order, are the whole batch's
    out = tmp_path / "overlap.json"
    cmd = [sys.executable, str(REPO / "devtools" / "bench_overlap.py"), "--smoke", "--json", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    rows = json.loads(out.read_text())
    assert [r["kernel"] for r in rows] == [
        "full batch, one stream",
        "halves one after the other, one stream",
        "halves on two streams",
        "halves on two streams, attentions taking turns",
    ]
    assert rows[0]["max_rel_diff"] is None and all(r["max_rel_diff"] < 1e-5 for r in rows[1:])


def _docs(doc: Path, text: str, *options: str):
    doc.write_text(text)
    res = CliRunner().invoke(app, ["docs", *options, str(doc)])
    assert "Traceback" not in res.output
    return res


def test_a_marker_left_open_or_closing_nothing_is_an_error_naming_its_line(tmp_path):
    _ablation(tmp_path)
    doc = tmp_path / "DOC.md"
    opened = "intro `<!-- llmbench: ... -->` quoted\n<!-- llmbench: report results/kept-ablation -->\nold\n"
    for options in ((), ("--check",)):
        res = _docs(doc, opened, *options)
        assert res.exit_code == 2
        assert f"{doc}: line 2: <!-- llmbench: report results/kept-ablation --> is not closed" in res.output
    res = _docs(doc, "intro\n<!-- /llmbench -->\n")
    assert res.exit_code == 2 and "line 2: <!-- /llmbench --> closes no" in res.output
    block = "<!-- llmbench: report results/kept-ablation -m output_throughput -->\nx\n<!-- /llmbench -->\n"
    res = _docs(doc, block + "<!-- llmbench: report results/kept-ablation\nx\n<!-- /llmbench -->\n")
    assert (
        res.exit_code == 2
        and "line 4: '<!-- llmbench: report results/kept-ablation': a marker reads" in res.output
    )  # its --> is missing
    assert doc.read_text().count("\nx\n") == 2  # nothing rewritten


def test_a_marker_in_a_code_fence_is_an_example_and_an_indented_one_an_error(tmp_path):
    _ablation(tmp_path)
    doc = tmp_path / "DOC.md"
    example = "```\n<!-- llmbench: report results/nowhere -->\n<!-- /llmbench -->\n```\n"
    block = "<!-- llmbench: report results/kept-ablation -m output_throughput -->\nx\n<!-- /llmbench -->\n"
    res = _docs(doc, example + block)
    assert res.exit_code == 0, res.output
    assert doc.read_text().startswith(example) and "\nx\n" not in doc.read_text()  # the block made anew
    res = _docs(doc, "  <!-- llmbench: report results/nowhere -->\n<!-- /llmbench -->\n", "--check")
    assert res.exit_code == 2 and "line 1: an indented marker is not read as one" in res.output


def test_documents_keep_their_line_endings_and_none_is_written_unless_all_are_made(tmp_path):
    _ablation(tmp_path)
    crlf, bad = tmp_path / "CRLF.md", tmp_path / "BAD.md"
    block = "<!-- llmbench: report results/kept-ablation -m output_throughput -->\nx\n<!-- /llmbench -->\n"
    crlf.write_bytes(("intro\n" + block + "end\n").replace("\n", "\r\n").encode())
    bad.write_bytes(b"<!-- llmbench: report results/nowhere -->\n<!-- /llmbench -->\n")
    res = CliRunner().invoke(app, ["docs", str(crlf), str(bad)])
    assert res.exit_code == 2 and "no such result folder" in res.output
    assert b"\r\nx\r\n" in crlf.read_bytes()  # the first document was not rewritten either
    res = CliRunner().invoke(app, ["docs", str(crlf)])
    assert res.exit_code == 0, res.output
    raw = crlf.read_bytes()
    assert b"\r\nx\r\n" not in raw and b"| output tok/s" in raw
    assert raw.count(b"\n") == raw.count(b"\r\n") > 5  # every line still ends with CRLF
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []
    bad.write_bytes(b"\xff\xfe not text")
    res = CliRunner().invoke(app, ["docs", "--check", str(bad)])
    assert res.exit_code == 2 and f"{bad}: not a UTF-8 text file" in res.output


def test_a_bad_option_or_an_empty_view_in_a_block_is_an_error_naming_it(tmp_path):
    _ablation(tmp_path)
    doc = tmp_path / "DOC.md"
    for command, expected in (
        (
            "report results/kept-ablation --min-effect abc",
            "report option --min-effect 'abc': not a percentage",
        ),
        ("report results/kept-ablation --view", "report option --view needs a value"),
        ("report results/kept-ablation --view profile", "--view profile: none of these runs was recorded"),
    ):
        res = _docs(doc, f"intro\n<!-- llmbench: {command} -->\n<!-- /llmbench -->\n")
        assert res.exit_code == 2 and f"line 2, `{command}`: {expected}" in res.output, res.output


def test_a_block_over_a_run_that_is_skipped_or_read_in_part_is_an_error(tmp_path):
    folder = _ablation(tmp_path)
    doc = tmp_path / "DOC.md"
    text = "<!-- llmbench: report results/kept-ablation -m output_throughput -->\n<!-- /llmbench -->\n"
    summary = next(folder.rglob("summary.json"))
    data = json.loads(summary.read_text())
    data["points"][0]["repeats"][0]["metrics"]["output_throughput"] = "fast"
    summary.write_text(json.dumps(data))
    res = _docs(doc, text)
    assert res.exit_code == 2 and f"{summary.parent}: values of the wrong type read as missing" in res.output
    summary.write_text("{")
    res = _docs(doc, text)
    assert res.exit_code == 2 and "summary.json is unreadable" in res.output


def test_the_source_digest_follows_the_package_code_and_nothing_else(tmp_path):
    from llmbench.bench.hardware import source_digest

    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "sub" / "b.py").write_text("y = 2\n")
    first = source_digest(package)
    (package / "notes.txt").write_text("not code")  # only Python files count
    assert source_digest(package) == first and len(first) == 12
    (package / "sub" / "b.py").write_text("y = 3\n")
    assert source_digest(package) != first
    (package / "sub" / "b.py").write_text("y = 2\n")
    assert source_digest(package) == first
    (package / "sub" / "b.py").rename(package / "b2.py")  # the same bytes under another name
    assert source_digest(package) != first


def test_a_run_from_a_tree_with_local_changes_names_its_source_digest_in_the_header(tmp_path):
    folder = _ablation(tmp_path)
    for meta_path in folder.rglob("meta.json"):
        meta = json.loads(meta_path.read_text())
        meta["git"]["source"] = "0123456789ab"
        meta_path.write_text(json.dumps(meta))
    doc = tmp_path / "DOC.md"
    doc.write_text(
        "<!-- llmbench: report results/kept-ablation --view overview -m output_throughput -->\n<!-- /llmbench -->\n"
    )
    assert CliRunner().invoke(app, ["docs", str(doc)]).exit_code == 0
    assert "with uncommitted changes (source 0123456789ab)" in doc.read_text()
