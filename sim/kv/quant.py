"""Quantized KV storage (ALISE §3.3): the same GPU bytes hold 16/bits times the tokens; reads pay dequantization."""
from __future__ import annotations

from costmodels.errors import UserError

ALLOWED_BITS = (4, 8, 16)


def quantize_kv(memory, bits: int, kv_dtype: str | None = None) -> None:
    """Re-denominate an empty KVCacheManager so its byte budget stores `bits`-bit KV.

    M and the swap space are given in FP16 tokens (the unquantized KV); at 8 bits each block of GPU and CPU
    memory holds twice the tokens, so the block count doubles. The engine reads `memory.kv_bits` to charge
    dequantization of every cached token a step reads and to halve swap volumes. The per-channel scale and
    zero point (two FP16 values per channel per block) are ignored: < 1% of a 16-token block."""
    if bits not in ALLOWED_BITS:
        raise UserError(f"memory.kv_quant_bits: {bits!r} is not allowed; allowed: {', '.join(map(str, ALLOWED_BITS))}")
    if kv_dtype is not None and bits != 16:
        raise UserError("memory.kv_quant_bits: set either kv_dtype or kv_quant_bits, not both "
                        "(kv_dtype already sizes M in that dtype)")
    if memory.free_blocks != memory.total_blocks:
        raise UserError("memory.kv_quant_bits: quantization must be applied before any KV is allocated")
    factor = 16 // bits
    memory.total_blocks *= factor
    memory.free_blocks = memory.total_blocks
    memory.capacity_tokens = memory.total_blocks * memory.block_size
    memory.watermark_blocks *= factor
    memory.swap_total_blocks *= factor
    memory.swap_free_blocks = memory.swap_total_blocks
    memory.kv_bits = bits
