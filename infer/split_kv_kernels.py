"""The Triton kernels of split-KV decoding attention (infer/split_kv.py launches them). Triton reads
TRITON_INTERPRET when this module is imported: the tests run the kernels in its interpreter, on the CPU.

`partial`: one program per (row, key/value head, span of SPAN positions): the span's softmax numerator,
maximum and denominator for the query heads that share the key/value head. A span at or past the row's
length does nothing.
`merge`: one program per (row, HEADS query heads): the row's spans merged in order, so that the sums are
the same whatever the number of spans past its length.
"""

import triton
import triton.language as tl


@triton.jit
def partial(q_ptr, k_ptr, v_ptr, lengths_ptr, num_ptr, max_ptr, den_ptr,
            stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
            scale, heads, spans,
            GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
            SPAN: tl.constexpr, BLOCK: tl.constexpr, PRECISION: tl.constexpr):
    row, kv_head, span = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    length = tl.load(lengths_ptr + row)
    start = span * SPAN
    # a layer's cache may hold more than 2**31 elements (an H200's memory, a model with few layers): 64-bit offsets
    row_offset = row.to(tl.int64)
    if start < length:
        end = tl.minimum(start + SPAN, length)
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, D_PAD)
        head = kv_head * GROUP + g
        in_group = g < GROUP
        in_dim = d < HEAD_DIM
        q = tl.load(q_ptr + row_offset * stride_qb + head[:, None] * stride_qh + d[None, :],
                    mask=in_group[:, None] & in_dim[None, :], other=0.0)
        m = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
        den = tl.zeros((GROUP_PAD,), tl.float32)
        num = tl.zeros((GROUP_PAD, D_PAD), tl.float32)
        k_row = k_ptr + row_offset * stride_kb + kv_head.to(tl.int64) * stride_kh
        v_row = v_ptr + row_offset * stride_vb + kv_head.to(tl.int64) * stride_vh
        for first in range(start, end, BLOCK):
            n = first + tl.arange(0, BLOCK)
            inside = n < end
            k = tl.load(k_row + n[:, None] * stride_kn + d[None, :], mask=inside[:, None] & in_dim[None, :], other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            s = tl.where(inside[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m - m_new)
            v = tl.load(v_row + n[:, None] * stride_vn + d[None, :], mask=inside[:, None] & in_dim[None, :], other=0.0)
            num = num * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            den = den * alpha + tl.sum(p, 1)
            m = m_new
        at = (row * heads + head) * spans + span
        tl.store(num_ptr + at[:, None] * D_PAD + d[None, :], num, mask=in_group[:, None])
        tl.store(max_ptr + at, m, mask=in_group)
        tl.store(den_ptr + at, den, mask=in_group)


@triton.jit
def merge(num_ptr, max_ptr, den_ptr, lengths_ptr, out_ptr, heads, spans,
          HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, SPAN: tl.constexpr, HEADS: tl.constexpr):
    row, block = tl.program_id(0), tl.program_id(1)
    head = block * HEADS + tl.arange(0, HEADS)
    d = tl.arange(0, D_PAD)
    in_heads = head < heads
    length = tl.load(lengths_ptr + row)
    m = tl.full((HEADS,), float("-inf"), tl.float32)
    den = tl.zeros((HEADS,), tl.float32)
    num = tl.zeros((HEADS, D_PAD), tl.float32)
    for span in range(0, tl.cdiv(length, SPAN)):
        at = (row * heads + head) * spans + span
        m_span = tl.load(max_ptr + at, mask=in_heads, other=0.0)
        m_new = tl.maximum(m, m_span)
        alpha, beta = tl.exp(m - m_new), tl.exp(m_span - m_new)
        den = den * alpha + tl.load(den_ptr + at, mask=in_heads, other=0.0) * beta
        num = num * alpha[:, None] + tl.load(num_ptr + at[:, None] * D_PAD + d[None, :], mask=in_heads[:, None], other=0.0) * beta[:, None]
        m = m_new
    out = num / tl.where(in_heads, den, 1.0)[:, None]  # heads past the last: nothing to divide, nothing stored
    tl.store(out_ptr + (row * heads + head[:, None]) * HEAD_DIM + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=in_heads[:, None] & (d[None, :] < HEAD_DIM))
