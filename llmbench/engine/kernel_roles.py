"""What each kernel, op and range of the engine is for: the categories a profile adds time up by.

A GPU kernel (or, on a CPU, an op) is put in the first category that applies:

1. its own name, when it says unambiguously what it does: a collective (NCCL, gloo, the one-shot
   all-reduce), a copy engine transfer (memcpy, memset), one of this project's Triton kernels
   (``OWN_KERNELS``, kept complete by a test), flash attention;
2. the layer it was launched from, when a profile marks layers (engine/ranges.py ``tag_layers``): a norm
   done with plain torch ops launches elementwise kernels that only the layer can name;
3. the phase it was launched in, for phases whose work is one thing (sampling, the copies to and from
   the device);
4. a generic reading of its name, or of the ops that launched it (cuBLAS ``nvjet``/``*gemm*`` kernels
   and ``aten::mm`` are GEMMs, ``elementwise`` kernels are elementwise, ...);
5. "other".
"""

from __future__ import annotations

GEMM = "GEMM"
ATTENTION = "attention"
NORM = "norm"
ELEMENTWISE = "activation and elementwise"
ROTARY_KV = "rotary and KV store"
SAMPLING = "sampling"
COMMUNICATION = "communication"
COPIES = "copies"
OTHER = "other"
CATEGORIES = (GEMM, ATTENTION, NORM, ELEMENTWISE, ROTARY_KV, SAMPLING, COMMUNICATION, COPIES, OTHER)

# The Triton kernels in llmbench/kernels/, by function name (a kernel's name in a CUDA trace).
OWN_KERNELS = {
    "_rms_norm_kernel": NORM,
    "_silu_and_mul_kernel": ELEMENTWISE,
    "_rotary_kernel": ROTARY_KV,
    "_store_kv_kernel": ROTARY_KV,
    "_prologue_kernel": ROTARY_KV,  # q/k norm, RoPE and the KV store in one kernel
    "_decode_kernel": ATTENTION,
    "_decode_reduce_kernel": ATTENTION,
    "_prefill_kernel": ATTENTION,
    "_skinny_matmul_kernel": GEMM,  # with the all-reduce fused in at tp > 1: still read-bound products
    "_allreduce_norm_kernel": COMMUNICATION,
    "_sample_kernel": SAMPLING,  # the Gumbel-max draw (and greedy rows' argmax)
    "_pick_kernel": SAMPLING,  # each row's winner among its split programs
    "_cut_kernel": SAMPLING,  # the top-p / min-p threshold search
    "_token_fill_kernel": COPIES,  # a decode graph's rows taking the last step's samples
}

LAYER_TAGS = {  # engine/ranges.py's layer ranges
    "norm": NORM,
    "rotary": ROTARY_KV,
    "activation": ELEMENTWISE,
    "attention": ATTENTION,
    "embedding": OTHER,  # a row gather
}

PHASE_CATEGORIES = {"sample": SAMPLING, "copy_to_device": COPIES, "copy_to_host": COPIES}

_SPECIFIC = (  # (category, lower-case fragments of the name)
    (COMMUNICATION, ("nccl", "allreduce", "all_reduce", "allgather", "all_gather", "reduce_scatter",
                     "broadcast", "c10d::", "gloo", "one_shot", "record_param_comms")),
    (COPIES, ("memcpy", "memset")),
    (ATTENTION, ("flash", "fmha")),
)  # fmt: skip

_GENERIC = (
    (GEMM, ("gemm", "gemv", "nvjet", "cutlass", "xmma", "wgmma", "splitk", "cublas", "aten::mm",
            "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")),
    (ATTENTION, ("scaled_dot_product", "attention")),
    (NORM, ("rms_norm", "rmsnorm", "layer_norm", "layernorm", "rsqrt")),
    (SAMPLING, ("argmax", "topk", "exponential", "multinomial")),
    (COPIES, ("copy", "fill", "zero_", "index_put", "aten::cat")),
    (ELEMENTWISE, ("silu", "gelu", "sigmoid", "elementwise", "vectorized", "unrolled", "triton_poi",
                   "triton_per", "triton_red", "aten::mul", "aten::add", "aten::sub", "aten::div",
                   "aten::neg", "aten::pow", "aten::mean", "aten::where", "aten::clamp")),
)  # fmt: skip


def _match(name: str, rules: tuple[tuple[str, tuple[str, ...]], ...]) -> str | None:
    low = name.lower()
    for category, fragments in rules:
        if any(f in low for f in fragments):
            return category
    return None


def _own(name: str) -> str | None:
    for kernel, category in OWN_KERNELS.items():
        if name == kernel or name.startswith(kernel + "_") or name.startswith(kernel + "("):
            return category
    return None


def classify(name: str, ops: tuple[str, ...] = (), tag: str | None = None, phase: str | None = None) -> str:
    """The category of a kernel or op ``name`` launched inside the ops ``ops`` (innermost first), the
    layer range ``tag`` and the phase ``phase`` (see the module docstring for the order)."""
    found = _own(name) or _match(name, _SPECIFIC)
    if found:
        return found
    if tag in LAYER_TAGS:
        return LAYER_TAGS[tag]
    if phase in PHASE_CATEGORIES:
        return PHASE_CATEGORIES[phase]
    for n in (name, *ops):
        found = _match(n, _GENERIC)
        if found:
            return found
    return OTHER
