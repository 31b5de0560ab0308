"""The openai backend's client, against the stub server of test_backend_openai.py: a client whose own event
loop is held up says how much that could have inflated the latencies of what was in flight; a URL where
no completions are served fails at start-up, naming what was wrong and what is allowed; figures this
backend cannot know are unavailable, not 0; and a server that does not stream, or a TLS handshake with a
plain-HTTP port, is named as such.
"""

from __future__ import annotations

import re
import socket
import time

import pytest
import yaml
from test_backend_openai import SCENARIO, Stub, backend_for, specs
from typer.testing import CliRunner

from llmbench.bench.backends import openai_driver
from llmbench.bench.errors import RunFailed
from llmbench.bench.store import find_runs
from llmbench.cli.app import app

HOLD_S = 0.3  # how long the client's loop is held up (a process stopped, a long collection)


def hold_the_loop_once(monkeypatch, request_id: str) -> None:
    """Block the client's event loop for HOLD_S when ``request_id`` has its second token."""
    real = openai_driver.Flight.take
    done = []

    def take(self, data, now):
        real(self, data, now)
        if self.spec.request_id == request_id and self.shown == 2 and not done:
            done.append(True)
            time.sleep(HOLD_S)

    monkeypatch.setattr(openai_driver.Flight, "take", take)


def _inflation_ms(warnings: list[str]) -> float:
    (said,) = [w for w in warnings if "event loop was held up" in w]
    assert "TTFT, TPOT and E2E may be inflated" in said
    return float(re.search(r"inflated by up to ([\d.]+) ms", said)[1])


@pytest.mark.parametrize("open_loop", [True, False])
def test_a_held_up_client_loop_says_how_much_the_requests_in_flight_may_be_inflated(monkeypatch, open_loop):
    hold_the_loop_once(monkeypatch, "1")
    with Stub() as stub:
        backend = backend_for(stub.url)
        offsets, concurrency = ([0.0, 0.0, 0.0], None) if open_loop else (None, 3)
        how = {"concurrency": concurrency, "tag": "", "max_duration": None, "on_progress": None}
        result = backend.run(specs(3), offsets, **how)
    # All three were in flight while the loop was held: their tokens were stamped when it resumed.
    stalls = [r.client_stall for r in result.requests]
    assert all(s >= HOLD_S * 0.8 for s in stalls), stalls
    assert HOLD_S * 1e3 * 0.8 <= _inflation_ms(backend.warnings) <= HOLD_S * 1e3 * 2


def _run(tmp_path, url: str, **options):
    path = tmp_path / "s.yaml"
    data = {**SCENARIO, "backend_options": {"openai": {"url": url, "model": "stub-model", **options}}}
    path.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "r")])
    assert "Traceback" not in res.output, res.output
    return res


@pytest.mark.parametrize("status", [404, 405, 500])
def test_a_models_route_that_errs_is_said_and_one_request_must_succeed(status):
    with Stub(models_status=status) as stub:
        backend = backend_for(stub.url)
        assert len(stub.bodies) == 1 and stub.bodies[0]["max_tokens"] == 1  # the one-token check
    (said,) = [w for w in backend.warnings if "was not checked" in w]
    assert f"/v1/models with HTTP {status}, so the model name 'stub-model' was not checked" in said


def test_a_wrong_url_path_fails_at_start_naming_both_answers(tmp_path):
    with Stub() as stub:
        res = _run(tmp_path, f"{stub.url}/api")
    said = " ".join(res.stderr.split())
    assert res.exit_code == 1, res.output
    assert f"answered {stub.url}/api/v1/models with HTTP 404" in said
    assert f"a one-token request to {stub.url}/api/v1/completions failed: HTTP 404" in said
    assert "takes the server's base URL" in said


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings", "/v1/responses"])
def test_a_url_naming_another_endpoint_is_bad_input(tmp_path, path):
    res = _run(tmp_path, f"http://127.0.0.1:1{path}")
    said = " ".join(res.stderr.split())
    assert res.exit_code == 2, res.output
    assert f"backend_options.openai.url: http://127.0.0.1:1{path} names the /{path.split('/v1/')[1]}" in said
    assert "its /v1, or its /v1/completions" in said
    assert not (tmp_path / "r").exists()


def test_what_a_remote_server_cannot_tell_is_unavailable_not_zero(tmp_path):
    with Stub() as stub:
        res = _run(tmp_path, stub.url)
    assert res.exit_code == 0, res.output
    (run,), _ = find_runs([tmp_path / "r"])
    metrics = run.summary["points"][0]["metrics"]
    una = run.summary["unavailable"]
    for name in ("arrival_lag_p99", "arrival_lag_max"):
        assert metrics[name]["value"] is None and "client_queue" in una[name]
    startup = run.meta["startup"]
    for name in ("load_time", "compile_time", "graph_capture_time"):
        assert name not in startup and "before the benchmark starts" in una[name]
    assert startup["server_check_time"] > 0


def test_a_server_that_answers_json_to_a_stream_request_is_named():
    with Stub(no_stream=True) as stub:
        backend = backend_for(stub.url)
        result = backend.run(specs(1), None, concurrency=1, tag="", max_duration=None, on_progress=None)
    (r,) = result.requests
    assert r.finish_reason == "failed"
    assert "the server answered application/json, not an event stream" in r.error
    assert "does it support stream: true?" in r.error


def test_tls_to_a_plain_http_port_is_named_as_such():
    with Stub() as stub:
        port = stub.server_address[1]
        with pytest.raises(RunFailed, match=r"TLS handshake .* failed: .*plain HTTP: use an http:// URL"):
            backend_for(f"https://127.0.0.1:{port}", connect_timeout_s=2)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (the kernel does), never answers
        port = silent.getsockname()[1]
        with pytest.raises(RunFailed, match="connected to 127.0.0.1:.*but the TLS handshake did not finish"):
            backend_for(f"https://127.0.0.1:{port}", connect_timeout_s=0.3)
