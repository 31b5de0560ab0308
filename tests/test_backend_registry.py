"""The backend registry is what every layer reads: each entry builds the backend of its name, the
scenario's ``backend_options:`` has a key for each backend with options, a name outside it is refused
everywhere with the names allowed, and what an entry says (remote) is what the run says."""

from __future__ import annotations

import importlib

import pytest
from pydantic import ValidationError

from llmbench.bench.ablation.plan import plan_backends
from llmbench.bench.backends import make_backend
from llmbench.bench.backends.base import peer_unavailable
from llmbench.bench.errors import BenchError
from llmbench.bench.scenario.backend_registry import BACKENDS, BackendOptions
from llmbench.bench.scenario.schema import Scenario
from llmbench.bench.workload import context_check

WORKLOAD = {"num_requests": 2, "input_len": 4, "output_len": 2}
ALLOWED = "Supported: " + ", ".join(BACKENDS)


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_each_entry_builds_the_backend_of_its_name(name):
    module, _, cls = BACKENDS[name].builder.partition(":")
    assert getattr(importlib.import_module(module), cls).name == name


def test_backend_options_has_a_key_for_each_backend_with_options():
    assert set(BackendOptions.model_fields) == {n for n, e in BACKENDS.items() if e.options is not None}
    for name, field in BackendOptions.model_fields.items():
        assert field.is_required() is False  # a scenario gives only the options of what it names
        assert (field.get_default(call_default_factory=True) is None) == (
            BACKENDS[name].required_option is not None
        )


def test_a_backend_outside_the_registry_is_refused_with_the_names_allowed():
    with pytest.raises(ValidationError, match=f"Unsupported backend: 'vllm'. {ALLOWED}"):
        Scenario.model_validate({"name": "x", "backend": "vllm", "workload": WORKLOAD})
    with pytest.raises(BenchError, match=f"Unsupported backend: 'vllm'. {ALLOWED}"):
        plan_backends(["engine", "vllm"])
    built = Scenario.model_construct(name="x", backend="vllm")  # one made in code, past the schema
    with pytest.raises(BenchError, match=f"Unsupported backend: 'vllm'. {ALLOWED}"):
        make_backend(built)
    with pytest.raises(ValidationError, match=r"Unsupported backend: 'openia' \(did you mean 'openai'\?\)"):
        Scenario.model_validate({"name": "x", "backend": "openia", "workload": WORKLOAD})


@pytest.mark.parametrize("name", [n for n in BACKENDS if n != "engine"])
def test_what_a_peer_cannot_give_follows_from_its_entry(name):
    unavailable = peer_unavailable(name)
    assert "prefix_cache_hit_rate" in unavailable  # the engine's own figures, for every peer
    assert ("gpu_telemetry" in unavailable) == BACKENDS[name].remote
    fits = context_check(8, name)
    assert fits is not None and fits(4, 4) is None
    advice = fits(8, 4)
    assert advice is not None and ("engine.max_model_len" in advice) != BACKENDS[name].remote
