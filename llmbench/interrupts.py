"""How an interrupted command ends.

Ctrl-C (SIGINT) and SIGTERM (``timeout``, a batch scheduler, ``docker stop``) both stop a command the same
way: a KeyboardInterrupt, after which what was measured is written and marked incomplete. The exit status
then says which signal it was, as a shell reports a process a signal ended: 128 + the signal's number
(130 after Ctrl-C, 143 after SIGTERM).
"""

from __future__ import annotations

import signal

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


def interrupted_exit() -> int:
    """The exit status of a command stopped by an interrupt: 128 + the signal that came last."""
    return 128 + int(_received)


def is_interrupted_exit(code: int) -> bool:
    """Whether a child's exit status says it was interrupted (and so kept what it measured)."""
    return code in {128 + int(s) for s in INTERRUPT_SIGNALS}
