"""Linear layers whose every output row is the same bits whatever rows are computed beside it: the matrix
products of `judge-score --deterministic`'s decoding steps, as a Triton kernel.

Why: cuBLAS picks its kernel, and with it the order in which each output element's products are summed, by
the shape of the whole product, so a row's logits in a step of 48 rows are not the bits of the same row in
a step of 1. In bf16 the difference of one rounding in a logit is enough to flip a near tie of the argmax,
and the answer goes another way from there: on an H100, 8 of 16 generated texts differed alone and batched
(docs/performance.md).

How (the kernels are in infer/batch_invariant_kernels.py): fixed tiles of BLOCK_M x BLOCK_N outputs, each
summed over K BLOCK_K positions at a time in order; K may be cut into `splits(N, K)` parts, summed in order
by a second kernel, so that the narrow products of a decoding step still give the GPU PROGRAMS programs or
so. The tiles and the splits depend on N and K alone, never on the number of rows, so each row's sums run in
the same order in a batch of any size.

Used by the decoder's steps (infer/runner.py) when it is deterministic: `use_batch_invariant_linears`
patches a model's linear layers, which then run this kernel inside `batch_invariant()` and their own forward
everywhere else. The tests run the same kernels on the CPU in Triton's interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 128
# Programs a product aims at (an H100 has 132 multiprocessors): K is split until its tiles give this many.
PROGRAMS = 256
SUM_BLOCK = 1024  # output elements per program of the sum of the splits

_ACTIVE: ContextVar[bool] = ContextVar("batch_invariant", default=False)


def triton_runs_on(device: str | torch.device) -> bool:
    """The project's Triton kernels (these and split-KV attention's) run on `device`: a CUDA GPU, with Triton
    installed (it ships with PyTorch's CUDA builds)."""
    return torch.device(device).type == "cuda" and importlib.util.find_spec("triton") is not None


def deterministic_on(device: str | torch.device, deterministic: bool | None) -> bool:
    """Whether scoring on `device` is deterministic: as asked, or where not asked (None), wherever its
    kernels run (it costs next to nothing there: docs/performance.md)."""
    return triton_runs_on(device) if deterministic is None else deterministic


@contextmanager
def batch_invariant(active: bool = True) -> Iterator[None]:
    """Patched linear layers (use_batch_invariant_linears) run the batch-invariant kernel while the block runs."""
    token = _ACTIVE.set(active)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def splits(n: int, k: int) -> int:
    """Parts K is cut into: doubled while the product's column tiles give fewer than PROGRAMS programs and
    each part keeps at least four steps of BLOCK_K."""
    tiles, parts = -(-n // BLOCK_N), 1
    while tiles * parts < PROGRAMS and k // (2 * parts) >= 4 * BLOCK_K:
        parts *= 2
    return parts


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias (torch.nn.functional.linear), each row's bits independent of the other rows."""
    n, k = weight.shape
    rows = x.reshape(-1, k)
    rows = rows if rows.stride(-1) == 1 else rows.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    m = rows.shape[0]
    parts = splits(n, k)
    chunk = -(-(-(-k // parts)) // BLOCK_K) * BLOCK_K  # a whole number of BLOCK_K steps
    partial = torch.empty(parts, m, n, dtype=torch.float32, device=x.device)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    kernels = importlib.import_module("mmjudge.infer.batch_invariant_kernels")  # imports Triton: on first use only
    kernels.partial_product[(-(-m // BLOCK_M), -(-n // BLOCK_N), parts)](
        rows, weight, partial, m, n, k, chunk, rows.stride(0), weight.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32")  # fp32 as fp32, not TF32
    kernels.sum_splits[(-(-(m * n) // SUM_BLOCK),)](
        partial, partial if bias is None else bias, out, m * n, n, parts, HAS_BIAS=bias is not None, BLOCK=SUM_BLOCK)
    return out.reshape(*x.shape[:-1], n)


def use_batch_invariant_linears(model: torch.nn.Module) -> None:
    """Every torch.nn.Linear of `model` (PEFT's adapters and the layers they wrap included) runs `linear`
    inside `batch_invariant()`, its own forward elsewhere."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and not getattr(module.forward, "batch_invariant", False):
            _patch(module)


def _patch(module: torch.nn.Linear) -> None:
    eager = module.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        if not _ACTIVE.get():
            return eager(x)
        return linear(x, module.weight, module.bias)

    forward.batch_invariant = True
    module.forward = forward
