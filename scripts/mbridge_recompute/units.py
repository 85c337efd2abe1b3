"""Byte units, in one place.

Decimal GB is what the tools read, predict and print: Bridge's runtime memory report
(mem-max-allocated-gigabytes) divides bytes by 1e9 (train_utils.py:1203-1209 @ Bridge 067f987).
Binary units are what PyTorch's OOM message and Megatron-LM's memory report use
(`format_size`: KiB, MiB, GiB; common_utils.py:313-334 @ MLM 2a75ac12), converted on reading.
"""

GB = 1e9
KIB = 2**10
MIB = 2**20
GIB = 2**30
TIB = 2**40


def gb(nbytes: float) -> str:
    """Decimal GB with two decimals, as every report prints sizes."""
    return f"{nbytes / GB:.2f}"
