"""The openai backend against a stub OpenAI-compatible server on 127.0.0.1 whose timing is known.

The stub streams ``/v1/completions`` with a known delay before the first token and between tokens, and
stamps each chunk with ``time.perf_counter()`` as it writes it -- the same clock the client reads, so the
measured TTFT/ITL are checked against the truth. In lockstep it writes a token only once the client has
stamped the one before, so those checks hold however busy the machine is; a request it is told to hang
on sends one token and then nothing until the test ends. It can be told to fail requests (HTTP 500, a dropped
connection), to open with a role-only chunk, to send fewer tokens than asked, or to merge two tokens in
one chunk. It listens on loopback only, on an ephemeral port, serves a bounded number of requests and
shuts itself down after a fixed lifetime.
"""

from __future__ import annotations

import functools
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from llmbench.bench.backends.openai import OpenAIBackend, endpoints
from llmbench.bench.backends.openai_stream import parse_chunk
from llmbench.bench.errors import RunFailed
from llmbench.bench.scenario.schema import Scenario
from llmbench.bench.store import find_runs
from llmbench.bench.workload.spec import RequestSpec
from llmbench.cli.app import app

TTFT = 0.060  # the stub's delay from a request's arrival to its first token
ITL = 0.015  # and between tokens
LIFETIME_S = 60.0  # the stub shuts itself down after this, whatever happens
LOCKSTEP_WAIT_S = 30.0  # in lockstep, how long the stub waits for the client's stamp (a broken client only)
MAX_REQUESTS = 200


class Stub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, **behaviour) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.ttft = behaviour.pop("ttft", TTFT)
        self.itl = behaviour.pop("itl", ITL)
        self.fail: dict[int, str] = behaviour.pop("fail", {})  # request number -> "500" | "drop"
        self.role_chunk = behaviour.pop("role_chunk", False)
        self.short: dict[int, int] = behaviour.pop("short", {})  # request number -> tokens actually sent
        self.merge: set[int] = behaviour.pop(
            "merge", set()
        )  # request numbers whose 2nd/3rd tokens share a chunk
        self.usage = behaviour.pop("usage", True)
        self.usage_scale = behaviour.pop("usage_scale", 1.0)  # usage counts round(scale * tokens sent)
        self.prompt_extra = behaviour.pop("prompt_extra", 0)  # usage counts the prompt this much longer
        self.per_chunk = behaviour.pop("per_chunk", 1)  # tokens in each chunk of text
        self.ids = behaviour.pop("ids", True)  # token ids in each chunk when the request asks for them
        self.no_stream = behaviour.pop("no_stream", False)  # one JSON body whatever "stream" says
        self.models_status = behaviour.pop("models_status", 200)  # /v1/models answers this
        self.chunked = behaviour.pop("chunked", True)
        self.models = behaviour.pop("models", ["stub-model"])
        self.hang: set[str] = behaviour.pop("hang", set())  # request ids that stall after one token
        self.lockstep = threading.Event() if behaviour.pop("lockstep", False) else None
        assert not behaviour, behaviour
        self.released = threading.Event()  # set on exit: hung requests end
        self.lock = threading.Lock()
        self.count = 0
        self.bodies: list[dict] = []
        self.received: dict[str, float] = {}  # request id (first prompt id) -> arrival
        self.sent: dict[str, list[float]] = {}  # -> time each token chunk was written
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.timer = threading.Timer(LIFETIME_S, self.shutdown)
        self.timer.daemon = True

    def handle_error(self, request, client_address) -> None:
        pass  # a client that hung up mid-stream (timeouts, aborts) is what some tests do on purpose

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        assert host == "127.0.0.1"
        return f"http://{host}:{port}"

    def __enter__(self) -> Stub:
        self.thread.start()
        self.timer.start()
        return self

    def stamped(self) -> float:
        """The client's clock in lockstep: the time, and the stub may write the next token."""
        now = time.perf_counter()
        if self.lockstep is not None:
            self.lockstep.set()
        return now

    def __exit__(self, *exc) -> None:
        self.released.set()
        self.timer.cancel()
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Stub

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        if self.path != "/v1/models":
            return self._plain(404, '{"detail": "Not Found"}')
        if self.server.models_status != 200:
            return self._plain(self.server.models_status, '{"detail": "no models here"}')
        body = json.dumps(
            {"object": "list", "data": [{"id": m, "max_model_len": 4096} for m in self.server.models]}
        )
        self._plain(200, body)

    def _plain(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _event(self, obj: object) -> None:
        data = f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()
        if self.server.chunked:
            data = f"{len(data):x}\r\n".encode() + data + b"\r\n"
        self.wfile.write(data)

    def do_POST(self) -> None:
        arrived = time.perf_counter()
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        stub = self.server
        if self.path != "/v1/completions":
            return self._plain(404, '{"detail": "Not Found"}')
        with stub.lock:
            number = stub.count
            stub.count += 1
            stub.bodies.append(body)
        if number >= MAX_REQUESTS:
            return self._plain(503, '{"error": "stub request budget spent"}')
        if stub.fail.get(number) == "500":
            return self._plain(500, json.dumps({"error": {"message": "stub says no", "code": 500}}))
        n = stub.short.get(number, body["max_tokens"])
        if stub.no_stream:
            choice = {"index": 0, "text": " t" * n, "finish_reason": "length"}
            return self._plain(200, json.dumps({"choices": [choice], "usage": {"completion_tokens": n}}))
        rid = str(body["prompt"][0])
        stub.received[rid] = arrived
        times = stub.sent.setdefault(rid, [])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if stub.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
        self.end_headers()
        if stub.role_chunk:  # what chat endpoints open with: no token in it
            self._event({"choices": [{"index": 0, "delta": {"role": "assistant"}, "text": ""}]})
        time.sleep(stub.ttft)
        k = 0
        while k < n:
            first = k
            step = 2 if number in stub.merge and k == 1 else min(stub.per_chunk, n - k)
            k += step
            text = "".join(f" t{j}" for j in range(first, k))
            if stub.fail.get(number) == "drop" and k > 2:
                self.connection.shutdown(socket.SHUT_RDWR)  # mid-stream, no terminating chunk
                self.close_connection = True
                return
            finish = None if k < n else ("length" if n == body["max_tokens"] else "stop")
            if stub.lockstep is not None:
                stub.lockstep.clear()
            times.append(time.perf_counter())
            choice = {"index": 0, "text": text, "finish_reason": finish}
            if stub.ids and body.get("return_token_ids"):
                choice["token_ids"] = list(range(first, k))
            self._event({"choices": [choice]})
            if stub.lockstep is not None:
                stub.lockstep.wait(LOCKSTEP_WAIT_S)
            if rid in stub.hang:
                stub.released.wait(LIFETIME_S)
                return
            if k < n:
                time.sleep(stub.itl)
        if stub.usage:
            prompt, out = len(body["prompt"]) + stub.prompt_extra, round(stub.usage_scale * n)
            usage = {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out}
            self._event({"choices": [], "usage": usage})
        self._event("[DONE]")
        if stub.chunked:
            self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True


SCENARIO = {
    "name": "oai",
    "model": "qwen3-tiny",
    "backend": "openai",
    "workload": {"num_requests": 4, "input_len": 8, "output_len": 6},
    "arrival": {"kind": "concurrency", "concurrency": 1},
    "telemetry": {"period_ms": 20},
}


def backend_for(url: str, **options) -> OpenAIBackend:
    data = {**SCENARIO, "backend_options": {"openai": {"url": url, "model": "stub-model", **options}}}
    backend = OpenAIBackend(Scenario.model_validate(data))
    backend.start()
    return backend


def specs(n: int, out: int = 6) -> list[RequestSpec]:
    # The first prompt id names the request for the stub (it keys its timestamps on it).
    return [RequestSpec(str(i), [100 + i, 5, 6, 7], out) for i in range(n)]


def by_id(result):
    return {r.request_id: r for r in result.requests}


def in_lockstep(monkeypatch, stub: Stub) -> None:
    """The client stamps tokens with the stub's lockstep clock."""
    import llmbench.bench.backends.openai as openai_backend

    monkeypatch.setattr(
        openai_backend, "Client", functools.partial(openai_backend.Client, clock=stub.stamped)
    )


def test_ttft_and_itl_match_the_servers_known_delays(monkeypatch):
    with Stub(lockstep=True) as stub:
        in_lockstep(monkeypatch, stub)
        backend = backend_for(stub.url)
        result = backend.run(specs(3), None, concurrency=1, tag="", max_duration=None, on_progress=None)
    assert result.status == "complete"
    for r in result.requests:
        assert r.finish_reason == "length" and r.error is None and r.output_check is None
        assert len(r.token_times) == 6 and r.reported_output_len == 6
        t = np.asarray(r.token_times)
        truth = np.asarray(stub.sent[str(100 + int(r.request_id))])
        # Same clock. Each token is stamped after the stub wrote it and before it wrote the next one (it
        # waits for the stamp), whatever the machine's load: tokens are stamped one by one as they come.
        assert (t >= truth).all() and (t[:-1] <= truth[1:]).all(), t - truth
        assert t[0] - r.arrival >= TTFT  # the stub sleeps TTFT after the request arrived
        assert (np.diff(t) >= ITL).all(), np.diff(t)  # and ITL after the client's last stamp
        assert r.token_ids == []  # the stub sends text only: no ids are made up
    sent = stub.bodies[0]
    assert sent["prompt"] == [100, 5, 6, 7] and sent["max_tokens"] == 6 and sent["stream"] is True
    assert sent["ignore_eos"] is True and sent["min_tokens"] == 6 and sent["model"] == "stub-model"
    assert sent["stream_options"] == {"include_usage": True}


def test_a_role_only_first_chunk_is_not_a_token():
    with Stub(role_chunk=True) as stub:
        backend = backend_for(stub.url)
        result = backend.run(specs(2), None, concurrency=1, tag="", max_duration=None, on_progress=None)
    for r in result.requests:
        assert len(r.token_times) == 6 and r.output_check is None
        assert r.token_times[0] - r.arrival >= TTFT  # the role chunk came at once; the first token did not


def test_failures_are_counted_per_request_and_the_run_goes_on():
    with Stub(fail={1: "500", 2: "drop"}) as stub:
        backend = backend_for(stub.url)
        result = backend.run(specs(4), None, concurrency=1, tag="", max_duration=None, on_progress=None)
    assert result.status == "complete" and len(result.requests) == 4
    got = by_id(result)
    assert got["1"].finish_reason == "failed" and got["1"].error.startswith("HTTP 500")
    assert "stub says no" in got["1"].error
    assert got["2"].finish_reason == "failed" and "dropped" in got["2"].error
    assert len(got["2"].token_times) == 2  # what arrived before the drop is kept
    assert got["0"].finished and got["3"].finished


def test_a_refused_connection_fails_each_request_not_the_run():
    with Stub() as stub:
        backend = backend_for(stub.url)
    # The stub is gone: nothing listens on its port any more.
    result = backend.run(specs(2), None, concurrency=1, tag="", max_duration=None, on_progress=None)
    assert result.status == "complete"
    assert all(r.finish_reason == "failed" and "connection failed" in r.error for r in result.requests)


def test_a_dead_server_fails_at_start_before_anything_is_measured():
    with Stub() as stub:
        url = stub.url
    data = {**SCENARIO, "backend_options": {"openai": {"url": url, "connect_timeout_s": 2}}}
    with pytest.raises(RunFailed, match="cannot reach the openai server"):
        OpenAIBackend(Scenario.model_validate(data)).start()


def test_a_model_the_server_does_not_serve_is_named():
    with Stub(models=["other"]) as stub:
        with pytest.raises(RunFailed, match="serves other, not 'stub-model'"):
            backend_for(stub.url)


def test_output_shorter_than_asked_or_merged_chunks_are_flagged():
    with Stub(short={0: 4}, merge={1}) as stub:
        backend = backend_for(stub.url)
        result = backend.run(specs(3), None, concurrency=1, tag="", max_duration=None, on_progress=None)
    got = by_id(result)
    assert got["0"].finish_reason == "stop" and "asked for 6 tokens, got 4 (usage)" in got["0"].output_check
    # Two tokens in one chunk of text: the stream shows 5, the server's usage says 6. The output is as long
    # as asked: the count is in doubt, the length is not; the merged chunk's two tokens share its time.
    merged = got["1"]
    assert merged.reported_output_len == 6 and len(merged.token_times) == 6 and merged.output_check is None
    assert "the stream showed 5 tokens, the server's usage counted 6" in merged.count_check
    assert merged.output_len_source == "usage"
    assert got["2"].output_check is None and got["2"].count_check is None


def test_client_queue_is_its_own_figure_not_part_of_ttft():
    with Stub() as stub:
        backend = backend_for(stub.url, max_concurrency=1)
        offsets = [0.0, 0.0, 0.0]  # all due at once, but the client sends one at a time
        result = backend.run(specs(3), offsets, concurrency=None, tag="", max_duration=None, on_progress=None)
    waits = sorted(r.client_queue for r in result.requests)
    one_request = TTFT + 5 * ITL
    assert waits[0] < 0.010 and waits[1] > one_request * 0.9 and waits[2] > 2 * one_request * 0.9
    for r in result.requests:
        assert TTFT <= r.token_times[0] - r.arrival < TTFT + 0.030  # TTFT counts from the send


def test_close_delimited_bodies_and_token_ids_in_chunks():
    with Stub(chunked=False, usage=False) as stub:
        backend = backend_for(stub.url, token_ids=True, extra_body={"priority": 1})
        result = backend.run(specs(1), None, concurrency=1, tag="", max_duration=None, on_progress=None)
    (r,) = result.requests
    assert r.finished and len(r.token_times) == 6 and r.reported_output_len is None and r.output_check is None
    assert stub.bodies[0]["return_token_ids"] is True and stub.bodies[0]["priority"] == 1


def test_chunk_parsing():
    assert parse_chunk({"choices": [{"delta": {"role": "assistant"}}]}).num_tokens == 0
    assert parse_chunk({"choices": [{"text": ""}]}).num_tokens == 0
    assert parse_chunk({"choices": [{"text": "a", "token_ids": [3, 4]}]}).token_ids == [3, 4]
    assert parse_chunk({"choices": [{"text": "ab", "logprobs": {"tokens": ["a", "b"]}}]}).num_tokens == 2
    assert parse_chunk({"choices": [], "usage": {"completion_tokens": 3}}).usage == {"completion_tokens": 3}
    assert parse_chunk({"error": {"message": "overloaded"}}).error == "overloaded"


def test_endpoints_from_any_url_form():
    for url in ("http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/completions"):
        comp, models = endpoints(url)
        assert (comp.path, models.path, comp.port) == ("/v1/completions", "/v1/models", 8000)


def test_run_end_to_end_stores_failures_and_says_what_is_unavailable(tmp_path):
    with Stub(fail={2: "500"}) as stub:
        path = tmp_path / "oai.yaml"
        data = {**SCENARIO, "backend_options": {"openai": {"url": stub.url, "model": "stub-model"}}}
        path.write_text(yaml.safe_dump(data))
        res = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "r")])
    assert "Traceback" not in res.output, res.output
    assert res.exit_code == 0, res.output
    assert "1 of 4 requests failed: HTTP 500" in res.stderr
    (run,), _ = find_runs([tmp_path / "r"])
    assert run.meta["backend"] == "openai" and run.meta["engine_config"] is None
    assert run.meta["backend_config"]["completions_url"].endswith("/v1/completions")
    m = run.summary["points"][0]["metrics"]
    assert m["num_failed"]["value"] == 1 and m["num_completed"]["value"] == 3
    assert m["ttft_p50"]["value"] >= TTFT  # the stub sleeps TTFT first (its upper side: the lockstep test)
    assert m["queue_p50"]["value"] is None and m["prefix_cache_hit_rate"]["value"] is None
    una = run.summary["unavailable"]
    assert {"queue", "prefix_cache_hit_rate", "gpu_telemetry", "num_steps"} <= set(una)
    reqs = run.table("requests")
    assert list(reqs["finish_reason"]).count("failed") == 1 and reqs["error"].notna().sum() == 1
    assert len(run.table("steps")) == 0
    assert "unavailable" in res.stdout  # queue time and the engine-only rows say so, not 0


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"url": "ftp://h"}, "backend_options.openai.url: must be an http:// or https:// URL"),
        ({"url": "http://127.0.0.1:1", "max_concurrency": 0}, "backend_options.openai.max_concurrency: Input should be greater"),
        ({"url": "http://127.0.0.1:1", "timeout": 3}, "backend_options.openai.timeout: unknown key (did you mean 'timeout_s'?); allowed here: url, model"),
        ({"url": "http://127.0.0.1:1", "extra_body": {"max_tokens": 3}}, "backend_options.openai.extra_body: sets max_tokens"),
        ({"url": "http://127.0.0.1:1", "api_key_env": "sk-abc"}, "backend_options.openai.api_key_env: is the name of an environment variable"),
        (None, "backend_options.openai.url: required for backend 'openai'"),
    ],
)  # fmt: skip
def test_bad_backend_options_name_the_full_path(tmp_path, options, expected):
    data = {**SCENARIO, "backend_options": {"openai": options} if options else {}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and expected in res.stderr, res.output
    assert "sk-abc" not in res.output  # a secret pasted in the wrong place is not echoed
    assert not (tmp_path / "r").exists()


def test_a_missing_api_key_variable_is_an_error_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.delenv("LLMBENCH_TEST_KEY", raising=False)
    data = {
        **SCENARIO,
        "backend_options": {"openai": {"url": "http://127.0.0.1:1", "api_key_env": "LLMBENCH_TEST_KEY"}},
    }
    path = tmp_path / "k.yaml"
    path.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "environment variable LLMBENCH_TEST_KEY is not set" in res.stderr
    assert not (tmp_path / "r").exists()


def test_the_api_key_is_sent_and_never_stored(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMBENCH_TEST_KEY", "sekrit-123")
    seen = []
    with Stub() as stub:
        original = _Handler.do_POST

        def capture(self):
            seen.append(self.headers.get("Authorization"))
            original(self)

        monkeypatch.setattr(_Handler, "do_POST", capture)
        path = tmp_path / "k.yaml"
        options = {"url": stub.url, "model": "stub-model", "api_key_env": "LLMBENCH_TEST_KEY"}
        path.write_text(yaml.safe_dump({**SCENARIO, "backend_options": {"openai": options}}))
        res = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "r"), "-q"])
    assert res.exit_code == 0, res.output
    assert seen and all(h == "Bearer sekrit-123" for h in seen)
    stored = "".join(p.read_text(errors="replace") for p in Path(tmp_path / "r").rglob("*.json"))
    assert "sekrit-123" not in stored and "LLMBENCH_TEST_KEY" in stored


def test_the_shipped_vllm_scenario_runs_its_openai_side_against_a_server(tmp_path):
    shipped = Path(__file__).resolve().parents[1] / "scenarios" / "peers" / "vllm.yaml"
    with Stub() as stub:
        sets = [
            "backend=openai", f"backend_options.openai.url={stub.url}", "backend_options.openai.model=stub-model",
            "workload.num_requests=3", "workload.output_len=4", "warmup=1", "arrival={kind: poisson, rate: 50}",
        ]  # fmt: skip
        args = ["run", str(shipped), "--profile", "cpu", "--out", str(tmp_path / "r"), "-q"]
        res = CliRunner().invoke(app, args + [x for s in sets for x in ("--set", s)])
    assert res.exit_code == 0, res.output
    (run,), _ = find_runs([tmp_path / "r"])
    assert run.meta["backend"] == "openai" and run.summary["points"][0]["label"] == "rate=50"
    assert run.summary["points"][0]["metrics"]["num_completed"]["value"] == 3
    assert len(stub.bodies) == 4 and stub.bodies[0]["model"] == "stub-model"  # one warm-up, three measured


def test_a_request_past_its_timeout_fails_with_the_reason():
    with Stub(ttft=LIFETIME_S) as stub:  # no token comes before the stub ends
        backend = backend_for(stub.url, timeout_s=0.15)
        result = backend.run(specs(1), None, concurrency=1, tag="", max_duration=None, on_progress=None)
    (r,) = result.requests
    assert r.finish_reason == "failed" and r.error.startswith("timeout") and "timeout_s=0.15" in r.error


def test_ctrl_c_and_max_duration_keep_what_was_measured(monkeypatch):
    import llmbench.bench.backends.openai_driver as driver

    monkeypatch.setattr(driver, "PROGRESS_PERIOD_S", 0.0)
    calls = []

    def interrupt(progress):
        calls.append(progress)
        if len(calls) == 2:
            raise KeyboardInterrupt

    # Requests due in 600 s are never sent, and 2 and 3 stall after one token, so what becomes of each
    # does not depend on how fast this machine is; 0 and 1 need a small part of max_duration.
    offsets = [0.0, 0.0, 0.0, 0.0, 600.0, 600.0]
    with Stub(hang={"102", "103"}) as stub:
        backend = backend_for(stub.url)
        stopped = backend.run(
            specs(6),
            [0.0, 0.0] + [600.0] * 4,
            concurrency=None,
            tag="",
            max_duration=None,
            on_progress=interrupt,
        )
        timed = backend.run(specs(6), offsets, concurrency=None, tag="", max_duration=2.0, on_progress=None)
    assert stopped.status == "interrupted" and stopped.not_submitted == 4
    assert sorted(r.finish_reason for r in stopped.requests) == ["length", "length"]
    assert timed.status == "timeout" and timed.not_submitted == 2
    reasons = {r.request_id: r.finish_reason for r in timed.requests}
    assert reasons == {"0": "length", "1": "length", "2": "abort", "3": "abort"}
    assert all(len(r.token_times) > 0 for r in timed.requests)  # the aborted ones keep their tokens


def test_a_client_that_falls_behind_an_open_loop_schedule_says_so(monkeypatch):
    # Without a concurrency limit, a request held in the client was held by the client itself (here a
    # loop blocked 40 ms before each send): the server saw a gentler load than the schedule asked.
    from llmbench.bench.backends import openai_driver

    real = openai_driver.Client.send

    async def late(self, flight):
        time.sleep(0.04)
        await real(self, flight)

    with Stub() as stub:
        backend = backend_for(stub.url)
        on_time = backend.run(
            specs(3), [0.0, 0.3, 0.6], concurrency=None, tag="", max_duration=None, on_progress=None
        )
        assert all(r.client_queue < 0.010 for r in on_time.requests)
        assert not any("fell behind" in w for w in backend.warnings)
        monkeypatch.setattr(openai_driver.Client, "send", late)
        backend.run(specs(3), [0.0, 0.0, 0.0], concurrency=None, tag="", max_duration=None, on_progress=None)
    (said,) = [w for w in backend.warnings if "fell behind the arrival schedule" in w]
    assert "client queue" in said
    # The send is late, and so are the stamps of what was in flight meanwhile: the latencies are not clean.
    assert "stamps the tokens of requests in flight late" in said


def test_the_scenarios_cap_holds_requests_in_the_client_and_must_agree_with_the_backends():
    from llmbench.bench.errors import BenchError

    with Stub() as stub:
        result = backend_for(stub.url).run(
            specs(3), [0.0, 0.0, 0.0], concurrency=1, tag="", max_duration=None, on_progress=None
        )  # arrival.max_concurrency 1: one at a time, the others wait in the client
        waits = sorted(r.client_queue for r in result.requests)
        assert waits[0] < 0.010 and waits[2] > 2 * (TTFT + 5 * ITL) * 0.9
        with pytest.raises(BenchError, match="disagree"):
            backend_for(stub.url, max_concurrency=2).run(
                specs(1), [0.0], concurrency=1, tag="", max_duration=None, on_progress=None
            )


def test_a_model_folder_whose_tokenizer_cannot_load_still_sends_token_ids(tmp_path):
    from tiny_models import break_tokenizer, make_tiny

    folder = tmp_path / "model"
    make_tiny("qwen3", folder)
    break_tokenizer(folder)
    with Stub() as stub:
        path = tmp_path / "oai.yaml"
        options = {"url": stub.url, "model": "stub-model"}
        path.write_text(
            yaml.safe_dump({**SCENARIO, "model": str(folder), "backend_options": {"openai": options}})
        )
        res = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "r"), "-q"])
        assert res.exit_code == 0, res.output  # token ids need no tokenizer
        (run,), _ = find_runs([tmp_path / "r"])
        assert run.summary["points"][0]["metrics"]["num_completed"]["value"] == 4
        # text prompts do: the tokenizer's own error, before anything is sent
        texts = tmp_path / "text.yaml"
        options = {**options, "prompt": "text"}
        texts.write_text(
            yaml.safe_dump({**SCENARIO, "model": str(folder), "backend_options": {"openai": options}})
        )
        res = CliRunner().invoke(app, ["run", str(texts), "--out", str(tmp_path / "t"), "-q"])
    assert res.exit_code == 2, res.output
    said = " ".join(res.stderr.split())
    assert said.startswith(
        f"error: backend_options.openai.prompt: text needs a tokenizer: {folder}: its tokenizer "
        "(tokenizer_config.json) cannot be loaded by transformers"
    ), said
    assert not (tmp_path / "t").exists()
