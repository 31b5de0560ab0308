"""Python's garbage collector kept off the measured steps and requests (the engine's, and a peer client's).

A full collection walks every object the collector tracks. Once an engine is built that is the model,
torch's, Triton's and the tokenizer's modules and caches: on the order of a million objects, so a
collection of the oldest generation stalls the decode loop for as long as dozens of steps each time it
comes due (once or twice a run of nano-vllm's workload on qwen3-0.6b, seen as one slow step per run).
Those objects live as long as the engine, so once it is built they are moved out of the
collector's reach (``gc.freeze``): later collections walk only what steps and requests create. When the
engine shuts down, and when the process exits (an engine never shut down), they are given back
(``gc.unfreeze``), so that what it leaves can be collected.
"""

from __future__ import annotations

import atexit
import gc

_at_exit = False


def freeze_startup() -> None:
    """Collect what start-up left behind, then keep every surviving object out of later collections."""
    global _at_exit
    if not _at_exit:  # the interpreter's last collection must see them (extension objects report leaks)
        atexit.register(thaw)
        _at_exit = True
    gc.collect()
    gc.freeze()


def thaw() -> None:
    """Give the frozen objects back to the collector (an engine shut down: its objects may be garbage)."""
    gc.unfreeze()
