"""A step's host arrays to the device in one copy.

Each step needs six or seven small integer arrays on the device. Pinning and copying them one by one
costs a pinned allocation and a copy call each (tens of microseconds of host time per step, on the
critical path of a small decode step). Here they are packed, 16-byte aligned, into one pinned byte
buffer, copied with one asynchronous transfer into one device byte buffer, and read back as typed views.

Two pinned buffers alternate, so packing step N+1 never overwrites the bytes of step N's transfer even if
that transfer is still in flight. The device buffer is reused: a later step's copy is ordered after the
earlier step's kernels on the same stream.

``separate=True`` (for torch.compile, whose guards see tensors that share one storage as aliases and
their offsets as shapes) still packs into the pinned buffer but copies each array into a tensor of its
own: no pinned allocation per array, one copy call per array.
"""

from __future__ import annotations

import numpy as np
import torch

ALIGN = 16  # bytes: where every array (field) of an upload starts


class Staging:
    def __init__(self, device: torch.device, separate: bool = False) -> None:
        self.device = device
        self.separate = separate
        self._host: list[torch.Tensor] = []
        self._turn = 0
        self._dev: torch.Tensor | None = None

    def upload(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        """Device tensors equal to ``arrays`` (same dtypes and shapes), after one host-to-device copy."""
        offsets, total = [], 0
        for a in arrays:
            offsets.append(total)
            total += -(-a.nbytes // ALIGN) * ALIGN
        total = max(total, ALIGN)
        if not self._host or self._host[0].numel() < total:
            size = max(total, 2 * self._host[0].numel() if self._host else 1 << 16)
            pin = self.device.type == "cuda"  # a CPU "device" (tests) needs, and may have, no pinning
            self._host = [host_buffer(size, pin) for _ in range(2)]
            self._dev = torch.empty(size, dtype=torch.uint8, device=self.device)
        host = self._host[self._turn]
        self._turn ^= 1
        packed = host.numpy()
        for a, off in zip(arrays, offsets, strict=True):
            packed[off : off + a.nbytes] = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
        if self.separate:
            return [
                torch.empty(a.shape, dtype=TORCH_DTYPES[a.dtype], device=self.device).copy_(
                    host[off : off + a.nbytes].view(TORCH_DTYPES[a.dtype]).view(a.shape), non_blocking=True
                )
                for a, off in zip(arrays, offsets, strict=True)
            ]
        assert self._dev is not None
        dev = self._dev
        dev[:total].copy_(host[:total], non_blocking=True)
        return [
            dev[off : off + a.nbytes].view(TORCH_DTYPES[a.dtype]).view(a.shape)
            for a, off in zip(arrays, offsets, strict=True)
        ]


def host_buffer(size: int, pin: bool) -> torch.Tensor:
    """``size`` bytes of host memory, zeroed, pinned if ``pin`` (an asynchronous copy needs it)."""
    buf = torch.zeros(size, dtype=torch.uint8)
    return buf.pin_memory() if pin else buf


TORCH_DTYPES = {
    np.dtype(np.int64): torch.int64,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.bool_): torch.bool,
}
