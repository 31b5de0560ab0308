"""How an interrupted command ends.

Ctrl-C (SIGINT) and SIGTERM (``timeout``, a batch scheduler, ``docker stop``) both stop a command the same
way: a KeyboardInterrupt, after which what was measured is written and marked incomplete. The exit status
then says which signal it was, as a shell reports a process a signal ended: 128 + the signal's number
(130 after Ctrl-C, 143 after SIGTERM).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: int = signal.SIGINT


def raise_interrupt(signum: int, frame: object) -> None:
    """The handler of both signals: records which one came and raises KeyboardInterrupt."""
    global _received
    _received = signum
    raise KeyboardInterrupt


def handle_interrupts() -> None:
    """Install ``raise_interrupt`` for SIGINT and SIGTERM (from the main thread)."""
    for signum in INTERRUPT_SIGNALS:
        signal.signal(signum, raise_interrupt)


@contextmanager
def held_interrupts() -> Iterator[None]:
    """Ctrl-C or SIGTERM during the block is held until the block ends, then raised: work that is only
    worth anything whole (a trace being written out) is not cut in half. Outside the main thread, where
    handlers cannot be set, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    before = {s: signal.signal(s, lambda signum, frame: came.append(signum)) for s in INTERRUPT_SIGNALS}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        if came:
            raise_interrupt(came[-1], None)


def interrupted_exit() -> int:
    """The exit status of a command stopped by an interrupt: 128 + the signal that came last."""
    return 128 + int(_received)


def is_interrupted_exit(code: int) -> bool:
    """Whether a child's exit status says it was interrupted (and so kept what it measured)."""
    return code in {128 + int(s) for s in INTERRUPT_SIGNALS}
