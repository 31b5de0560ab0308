"""The nearest valid name to a mistyped one, for error messages at every layer (scenario keys, engine
options, toggles, presets, metrics)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def nearest(name: str, choices: Iterable[str]) -> str | None:
    """The choice closest to a mistyped ``name``, else the first that it begins (``tpot`` -> ``tpot_p50``);
    None when none is close."""
    options = list(choices)
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.75)
    close = close or [c for c in options if len(name) >= 3 and c.startswith(name)][:1]
    return close[0] if close else None


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the ``nearest`` choice to a mistyped ``name``; "" when none is close."""
    close = nearest(name, choices)
    return f" (did you mean {close!r}?)" if close is not None else ""
