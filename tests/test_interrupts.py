"""How an interrupt ends a command, and work that an interrupt must not cut in half."""

from __future__ import annotations

import os
import signal
import time

import pytest

from llmbench.interrupts import held_interrupts, interrupted_exit, is_interrupted_exit, raise_interrupt


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_during_held_work_comes_after_it_and_names_its_signal(signum):
    done = []
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(KeyboardInterrupt):
        with held_interrupts():
            os.kill(os.getpid(), signum)
            time.sleep(0.05)  # the signal is delivered here: the block goes on
            done.append("written")
    assert done == ["written"]
    assert interrupted_exit() == 128 + signum and is_interrupted_exit(128 + signum)
    assert {s: signal.getsignal(s) for s in before} == before  # the handlers are as they were
    with pytest.raises(KeyboardInterrupt):
        raise_interrupt(signal.SIGINT, None)  # and the next interrupt is Ctrl-C's again
    assert interrupted_exit() == 130


def test_held_work_without_an_interrupt_ends_as_it_would():
    with held_interrupts():
        value = 1
    assert value == 1
    with pytest.raises(ValueError), held_interrupts():
        raise ValueError("its own error goes up")
