"""Bit addressing in a packed bitmap row (``ops.bitmap``), inside Triton kernels."""

import triton
import triton.language as tl


@triton.jit
def word_and_bit(token):
    """(word offset, int32 mask) of a token's bit in a packed bitmap row (ops.bitmap)."""
    return token >> 5, tl.full(token.shape, 1, tl.int32) << (token & 31).to(tl.int32)
