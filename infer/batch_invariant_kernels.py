"""The Triton kernels of the batch-invariant linear layer (infer/batch_invariant.py launches them). Triton
reads TRITON_INTERPRET when this module is imported: the tests run the kernels in its interpreter, on the CPU.

`partial_product`: one program per (BLOCK_M rows, BLOCK_N columns, split of K): the fp32 product of the
rows of x and the columns of the weight over that split's positions, BLOCK_K at a time, in order.
`sum_splits`: each output element, the splits summed in order and the bias added, in fp32, then cast.
Every element's sums run in an order set by (N, K) and the constants alone, never by M.
"""

import triton
import triton.language as tl


@triton.jit
def partial_product(x_ptr, w_ptr, partial_ptr, M, N, K, k_chunk, stride_xm, stride_wn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    block_m, block_n, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    columns = block_n * BLOCK_N + tl.arange(0, BLOCK_N)
    inner = tl.arange(0, BLOCK_K)
    start = split * k_chunk
    end = tl.minimum(start + k_chunk, K)
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
    w_columns = w_ptr + columns.to(tl.int64)[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for first in range(start, end, BLOCK_K):
        k = first + inner
        in_k = k < end
        x = tl.load(x_rows + k[None, :], mask=(rows < M)[:, None] & in_k[None, :], other=0.0)
        w = tl.load(w_columns + k[:, None], mask=in_k[:, None] & (columns < N)[None, :], other=0.0)
        acc = tl.dot(x, w, acc, input_precision=PRECISION)
    offsets = split.to(tl.int64) * M * N + rows.to(tl.int64)[:, None] * N + columns[None, :]
    tl.store(partial_ptr + offsets, acc, mask=(rows < M)[:, None] & (columns < N)[None, :])


@triton.jit
def sum_splits(partial_ptr, bias_ptr, out_ptr, elements, N, splits, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < elements
    acc = tl.load(partial_ptr + offsets, mask=inside, other=0.0)
    for split in range(1, splits):
        acc += tl.load(partial_ptr + split * elements + offsets, mask=inside, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offsets % N, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=inside)
