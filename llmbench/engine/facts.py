"""What "auto" may depend on: the facts of this machine, this process and the model.

``read_facts`` is the one place that looks (torch's view of the GPUs, which packages are installed,
TRITON_INTERPRET, how tensor-parallel ranks are started and whether symmetric memory was set up in this
process already); ``resolve`` (engine/resolve.py) decides from what it returns and looks at nothing
else, so a test can hand it the facts of any machine.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmbench.models.config import ModelConfig


@dataclass(frozen=True)
class ModelFacts:
    """What "auto" needs to know of the model."""

    name: str
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int
    num_params: int = 0  # 0: not known (facts a test made by hand)
    num_layers: int = 0  # ... and these two: the KV pool's shape (0: not known)
    head_dim: int = 0

    @classmethod
    def of(cls, name: str, model: ModelConfig) -> ModelFacts:
        return cls(
            name,
            model.hidden_size,
            model.num_attention_heads,
            model.num_key_value_heads,
            model.intermediate_size,
            model.max_position_embeddings,
            model.num_params(),
            model.num_hidden_layers,
            model.head_dim,
        )


@dataclass(frozen=True)
class Facts:
    """What this machine and process offer, and the model's facts."""

    model: ModelFacts
    cuda_devices: int = 0  # GPUs torch sees; 0: no CUDA
    device_name: str | None = None  # of the first GPU
    capability: tuple[int, int] | None = None  # its compute capability
    rocm: bool = False  # torch is a ROCm build (AMD GPUs behind torch.cuda)
    triton: bool = False  # the triton package is installed
    triton_gdc: bool = False  # ... with grid dependency control (programmatic dependent launch)
    flash_attn: bool = False  # flash-attn is installed
    triton_interpret: bool = False  # TRITON_INTERPRET=1: Triton kernels run on the CPU, interpreted
    launcher: str = "spawn"  # tensor-parallel ranks: "spawn" (rank 0 starts them on this host), "torchrun"
    world_size: int = 1  # torchrun: the ranks it started (WORLD_SIZE) ...
    local_world_size: int = 1  # ... and how many of them are on this host
    symm_mem_used: bool = False  # this process set up symmetric memory already (once per process)
    host_memory_available: int | None = None  # bytes the host can give this process now (None: unknown)
    device_memory: int | None = None  # bytes of the first GPU

    @property
    def ranks_share_memory(self) -> bool:
        """Whether tensor-parallel ranks can map each other's GPU memory: all on this host, and (spawned)
        symmetric memory not yet set up in this process (PyTorch numbers its exchanges per process, and
        freshly spawned ranks would wait for the first while this process is at a later one)."""
        if self.launcher == "torchrun":
            return self.local_world_size == self.world_size
        return not self.symm_mem_used


def read_facts(model: ModelFacts) -> Facts:
    """What this machine and process offer now (the only place that looks)."""
    import torch

    from llmbench.distributed import symmetric
    from llmbench.engine.tp import launched_rank

    cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    props = torch.cuda.get_device_properties(0) if cuda_devices else None
    launched = launched_rank()
    return Facts(
        model=model,
        cuda_devices=cuda_devices,
        device_name=props.name if props else None,
        capability=(props.major, props.minor) if props else None,
        rocm=torch.version.hip is not None,
        triton=_triton_installed(),
        triton_gdc=_triton_has_gdc(),
        flash_attn=_flash_attn_installed(),
        triton_interpret=os.environ.get("TRITON_INTERPRET") == "1",
        launcher="torchrun" if launched else "spawn",
        world_size=launched.world_size if launched else 1,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", launched.world_size)) if launched else 1,
        symm_mem_used=symmetric.rendezvous_count > 0,
        host_memory_available=_host_memory_available(),
        device_memory=props.total_memory if props else None,
    )


def _host_memory_available() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except (ImportError, OSError):
        return None


def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _triton_has_gdc() -> bool:
    from llmbench.kernels._triton import HAS_GDC

    return HAS_GDC


def _flash_attn_installed() -> bool:
    for name in ("flash_attn.cute", "flash_attn"):
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


def triton_usable(device: str) -> bool:
    """Whether Triton kernels can run on ``device`` here (on CUDA, or anywhere under TRITON_INTERPRET=1):
    for tests and scripts that pick what to exercise."""
    if not _triton_installed():
        return False
    return device.startswith("cuda") or os.environ.get("TRITON_INTERPRET") == "1"


def flash_attn_available() -> bool:
    """Whether flash-attn is installed (for tests and scripts)."""
    return _flash_attn_installed()
