"""A torch.profiler recording over one process's engine work, written out as a gzipped Chrome trace.

The caller decides when it records (``LLMEngine.start_trace``/``stop_trace``, between steps); at
tensor-parallel degree > 1 every rank runs a recording of its own over the same steps and writes its own
file. A recording takes CPU activity, and CUDA activity on a GPU, with input shapes (the GEMMs' FLOPs and
bytes are read from them); the phase ranges (engine/ranges.py) and, outside torch.compile, the layer
ranges mark what the engine was doing. Nothing here reads the traces.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from llmbench.engine.ranges import PREFIX, tag_layers


def rank_path(template: str, rank: int) -> Path:
    """The trace file of one rank: ``template`` with ``{rank}`` replaced."""
    return Path(template.replace("{rank}", str(rank)))


class Tracer:
    def __init__(self, model: nn.Module, device: torch.device, compiled: bool) -> None:
        self.model = model
        self.device = device
        self.compiled = compiled
        self._recording: profile | None = None
        self._untag: Callable[[], None] | None = None

    @property
    def active(self) -> bool:
        return self._recording is not None

    def start(self) -> None:
        if self._recording is not None:
            raise RuntimeError("a trace is already being recorded")
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
            torch.cuda.synchronize(self.device)  # earlier steps' kernels stay out of the trace
        self._recording = profile(activities=activities, record_shapes=True)
        self._recording.start()
        # The first range a recording takes pays for setting the profiler up on this thread (milliseconds
        # on a CPU): pay it here, not inside the first step.
        with record_function(PREFIX + "trace_start"):
            pass
        if not self.compiled:
            self._untag = tag_layers(self.model)

    def stop(self, path: Path | None) -> Path | None:
        """End the recording; write it to ``path`` (gzipped Chrome JSON), or drop it when ``path`` is None."""
        recording, self._recording = self._recording, None
        if recording is None:
            return None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the last step's kernels are in the trace
        try:
            recording.stop()
        finally:
            if self._untag is not None:
                self._untag()
                self._untag = None
        if path is None:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written beside, then renamed: a reader never sees half a file (the name must end in .gz for
        # torch to compress it).
        part = path.with_name(f".{path.name}.{os.getpid()}.part.gz")
        recording.export_chrome_trace(str(part))
        os.replace(part, path)
        return path
