"""Turn a scenario file plus command-line overrides into one validated :class:`Scenario`.

Order of application: the file's ``extends:`` chain (each parent deep-merged under its child), then the
profile (chosen by name, or automatically by its ``when:`` and the device the run will land on; also
deep-merged), then ``--set key.path=value`` overrides (values parsed as YAML; each replaces what is at
its path, so ``--set arrival={kind: offline}`` drops the file's rate). Relative ``workload.path`` values are
resolved against the file that wrote them (against the working directory for ``--set``).

Every problem is a :class:`ScenarioError` whose message names the file and the full field path.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from pydantic import ValidationError

from llmbench.bench.errors import ScenarioError
from llmbench.bench.scenario.changes import profile_changes
from llmbench.bench.scenario.errors import format_validation_error
from llmbench.bench.scenario.schema import Scenario
from llmbench.suggest import did_you_mean

AUTO = "auto"
NONE = "none"
SHIPPED_DIR = Path(__file__).resolve().parents[3] / "scenarios"  # the repository's scenarios/


class ProfileChoice(NamedTuple):
    name: str | None
    reason: str
    changes: str = ""  # what the profile changed (changes.profile_changes), "" when none applies


class ResolvedScenario(NamedTuple):
    scenario: Scenario
    path: Path
    profile: ProfileChoice
    overrides: tuple[str, ...]


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with two changes for people writing scenarios: a number written with an
    exponent and no point (``1e9``, ``5e-1``) is a number, as in YAML 1.2 (YAML 1.1 makes it a string);
    a key given twice in one mapping is an error (YAML 1.1 keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str) -> Any:
    """YAML text as scenarios, --set and --toggle values read it (``_Loader``)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)


def read_mapping(path: Path) -> dict[str, Any]:
    """One YAML file that must hold a mapping."""
    if not path.exists():
        raise ScenarioError(f"Scenario file not found: {path}")
    if not path.is_file():
        raise ScenarioError(f"Scenario path is not a file: {path}")
    try:
        data = parse_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(f"{path}: not valid YAML{where}: {problem}") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}: not a text file (UTF-8 expected)") from None
    if data is None:
        raise ScenarioError(f"{path}: the file is empty; a scenario is a mapping with at least 'workload:'")
    if not isinstance(data, dict):
        raise ScenarioError(
            f"{path}: a scenario must be a mapping of keys (name, model, workload, ...), "
            f"got a {type(data).__name__}"
        )
    return data


def shipped_scenarios(recursive: bool = False) -> list[Path]:
    """The repository's scenario files (``recursive``: with those in subfolders, e.g. scenarios/bench/)."""
    if not SHIPPED_DIR.is_dir():
        return []
    return sorted(SHIPPED_DIR.rglob("*.yaml") if recursive else SHIPPED_DIR.glob("*.yaml"))


def find_scenario(arg: str | Path) -> Path:
    """A path as given; else ``scenarios/<arg>`` (``.yaml`` optional) here or in the repository."""
    path = Path(arg).expanduser()
    if path.exists():
        return path
    name = path.name if path.suffix in (".yaml", ".yml") else f"{path.name}.yaml"
    for folder in (Path.cwd() / "scenarios", SHIPPED_DIR):
        if len(path.parts) <= 2 and (folder / name).is_file():
            return folder / name
    stems = [p.stem for p in shipped_scenarios()]
    near = did_you_mean(Path(name).stem, stems)
    shipped = ", ".join(stems) or "(none found)"
    raise ScenarioError(f"Scenario file not found: {arg}{near}. Shipped scenarios: {shipped}")


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``: mappings merge key by key, anything else is replaced."""
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _absolutize(data: dict[str, Any], base: Path) -> dict[str, Any]:
    workload = data.get("workload")
    if isinstance(workload, dict) and isinstance(workload.get("path"), str):
        p = Path(workload["path"]).expanduser()
        if not p.is_absolute():
            workload["path"] = str((base / p).resolve())
    return data


def load_chain(path: Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The file merged over its ``extends:`` ancestors (relative to the file that names them)."""
    path = path.resolve()
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ScenarioError(f"extends: cycle between scenario files: {chain}")
    data = _absolutize(read_mapping(path), path.parent)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ScenarioError(f"{path}: extends: must be the path of another scenario file, got {parent!r}")
    parent_path = (path.parent / parent).expanduser()
    if (
        not parent_path.exists()
        and "/" not in parent
        and (SHIPPED_DIR / f"{Path(parent).stem}.yaml").is_file()
    ):
        parent_path = SHIPPED_DIR / f"{Path(parent).stem}.yaml"  # a shipped scenario's name, as `run` takes
    if not parent_path.exists():
        raise ScenarioError(f"{path}: extends: scenario file not found: {parent_path}")
    if not parent_path.is_file():
        raise ScenarioError(f"{path}: extends: {parent_path} is not a file")
    base = load_chain(parent_path, (*_seen, path))
    base.pop("name", None)  # a child is its own scenario
    return deep_merge(base, data)


class Override(NamedTuple):
    path: tuple[str, ...]
    value: Any


def parse_overrides(items: list[str] | tuple[str, ...]) -> list[Override]:
    """``["a.b=1", "c=[1, 2]"]`` -> overrides with YAML-parsed values (relative paths made absolute)."""
    out = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ScenarioError(f"--set expects KEY.PATH=VALUE (e.g. workload.num_requests=64), got {item!r}")
        parts = tuple(key.split("."))
        if any(not p for p in parts):
            raise ScenarioError(f"--set {item!r}: empty segment in key path {key!r}")
        try:
            value = parse_yaml(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw  # not YAML: keep it as the string the user typed
        if parts == ("workload", "path") and isinstance(value, str):
            value = str(Path(value).expanduser().resolve())
        elif parts == ("workload",) and isinstance(value, dict):
            value = _absolutize({"workload": dict(value)}, Path.cwd())["workload"]
        out.append(Override(parts, value))
    return out


def apply_overrides(data: dict[str, Any], overrides: list[Override]) -> dict[str, Any]:
    """Each override *replaces* the value at its path (a mapping given with --set is not merged)."""
    out = copy.deepcopy(data)
    for o in overrides:
        node = out
        for part in o.path[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[o.path[-1]] = copy.deepcopy(o.value)
    return out


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def choose_profile(data: dict[str, Any], requested: str) -> ProfileChoice:
    """Which profile applies: ``requested`` by name, none, or (``auto``) the one whose ``when`` matches (two
    that match are an error: which should apply is the scenario's to say)."""
    profiles = data.get("profiles") or {}
    if not isinstance(profiles, dict):
        return ProfileChoice(None, "no profiles in the scenario")
    if requested == NONE:
        return ProfileChoice(None, "profiles turned off (--profile none)")
    if requested != AUTO:
        if requested not in profiles:
            raise ScenarioError(
                f"--profile {requested!r}: no such profile; this scenario has: "
                f"{', '.join(profiles) or '(none)'} (or use 'auto' / 'none')"
            )
        return ProfileChoice(requested, "asked for with --profile")
    engine = data.get("engine") if isinstance(data.get("engine"), dict) else {}
    device = str(engine.get("device", "auto"))
    if device == "auto":
        on_gpu = _cuda_available()
        why = "torch sees a CUDA device" if on_gpu else "torch sees no CUDA device"
    else:
        on_gpu = device.startswith("cuda")
        why = f"engine.device is {device!r}"
    target = "gpu" if on_gpu else "cpu"
    matching = [n for n, p in profiles.items() if isinstance(p, dict) and p.get("when") == target]
    if len(matching) > 1:
        raise ScenarioError(
            f"profiles {', '.join(map(repr, matching))} all apply when: {target}; keep one, or pick one with "
            "--profile NAME"
        )
    if matching:
        return ProfileChoice(matching[0], f"the run lands on the {target.upper()} ({why})")
    return ProfileChoice(None, f"no profile for the {target.upper()} ({why})")


def _validate(data: dict[str, Any], origin: str) -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(exc, origin)) from None


def load_scenario(
    path: str | Path, overrides: list[str] | tuple[str, ...] = (), profile: str = AUTO
) -> ResolvedScenario:
    path = Path(path)
    data = load_chain(path)
    data.setdefault("name", path.stem)
    sets = parse_overrides(overrides)
    choice = choose_profile(apply_overrides(data, sets), profile)

    profiles = data.get("profiles") if isinstance(data.get("profiles"), dict) else {}
    merged = data
    if choice.name is not None:
        merged = deep_merge(data, profiles[choice.name].get("overrides") or {})
    origin = str(path) + (f" (with profile '{choice.name}')" if choice.name else "")
    after = apply_overrides(merged, sets)
    found: list[str] = []
    scenario = _collect(found, after, origin + (" and --set overrides" if sets else ""), set())
    # Every profile must be valid, not only the one this machine picks; all reported at once, each
    # mistake of the file itself once (a profile's own mistakes under its name).
    shown = _problem_lines(data) & {line for error in found for line in error.splitlines()[1:]}
    for name, prof in profiles.items():
        if name != choice.name and isinstance(prof, dict) and isinstance(prof.get("overrides"), dict):
            _collect(found, deep_merge(data, prof["overrides"]), f"{path} (with profile '{name}')", shown)
    if found or scenario is None:
        raise ScenarioError("\n".join(found))
    if choice.name is not None:
        overrides_of = profiles[choice.name].get("overrides") or {}
        choice = choice._replace(
            changes=profile_changes(apply_overrides(data, sets), after, overrides_of, scenario)
        )
    return ResolvedScenario(scenario, path.resolve(), choice, tuple(overrides))


def _collect(found: list[str], data: dict[str, Any], origin: str, shown: set[str]) -> Scenario | None:
    """``data`` validated; where it is not, its error added to ``found`` without the problem lines in
    ``shown`` (and not at all when none is left)."""
    try:
        return _validate(data, origin)
    except ScenarioError as exc:
        head, *lines = str(exc).splitlines()
        new = [line for line in lines if line not in shown]
        if new or not lines:
            found.append("\n".join([head, *new]))
        return None


def _problem_lines(data: dict[str, Any]) -> set[str]:
    """The problem lines of the file alone, without any profile."""
    try:
        _validate(data, "")
    except ScenarioError as exc:
        return set(str(exc).splitlines()[1:])
    return set()


def scenario_dict(scenario: Scenario) -> dict[str, Any]:
    """The resolved scenario as plain data (profiles dropped: they are already applied)."""
    return scenario.model_dump(mode="json", exclude={"profiles"}, exclude_none=True)


def scenario_settings(scenario: Scenario) -> dict[str, Any]:
    """The resolved scenario's settings as given (its file, overrides and profile applied; profiles
    dropped), defaults left to the schema: loaded again it is the same scenario, and what was set is still
    told apart from what was not (a backend's options given for a backend that does not serve the run...)."""
    return scenario.model_dump(mode="json", exclude={"profiles"}, exclude_unset=True)
