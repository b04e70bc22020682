"""`deepspeed.ops.aio`: zerostream's async I/O handle (io_uring, thread fallback)."""

from zerostream.ops.aio import AsyncIOBuilder, aio_handle

__all__ = ["AsyncIOBuilder", "aio_handle"]
