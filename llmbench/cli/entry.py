"""The ``llmbench`` command's entry point. Ctrl-C and SIGTERM are an interrupt from its first moment, before
the command line's modules load (about a quarter of a second), so that an early one prints no traceback."""

from __future__ import annotations

import signal
import sys


def as_interrupt(signum, frame) -> None:
    """SIGTERM (a timeout, a batch scheduler, docker stop) handled as Ctrl-C is."""
    raise KeyboardInterrupt


def main() -> None:
    signal.signal(signal.SIGTERM, as_interrupt)
    try:
        from llmbench.cli.app import main as run_command
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    run_command()
