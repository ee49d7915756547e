"""Upper bounds on run settings and on the files a run reads, shared by
``emu.spec.validate``, the CLI's flags and the readers of traces, configs and cost
profiles.

A value past one of these would start rank processes that then exhaust the machine
(every rank keeps each KV block id; one process per rank) or overflow the C timeouts of
the launcher and gloo, so it is refused before anything starts. A file is data, never
code (docs/security.md): a reader takes at most its limit, so that a huge file or a
device such as /dev/zero is one clear error instead of a machine out of memory.
"""

import os

MAX_DP_SIZE = 1024
MAX_NUM_SEQS = 65_536
MAX_GPU_BLOCKS = 1_000_000
MAX_SECONDS = 1e6

MAX_TRACE_BYTES = 256 * 2**20  # a workload trace (JSON Lines)
MAX_TRACE_REQUESTS = 1_000_000  # requests of a trace, read or generated (recipe: n=N)
MAX_SMALL_FILE_BYTES = 2**20  # an --additional-config @FILE or a --cost-model FILE


class FileTooLarge(ValueError):
    """A file holds more than the limit its reader allows; the message says how much."""

    def __init__(self, limit: int):
        self.limit = limit
        super().__init__(f"larger than the limit of {size_text(limit)}")


def read_limited(path, limit: int) -> bytes:
    """The file's bytes. FileTooLarge when it holds more than ``limit``: a regular file
    by its size, before anything is read, anything else (a device, a pipe) once
    ``limit + 1`` bytes have come. OSError as ``open`` raises it."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size > limit:
            raise FileTooLarge(limit)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(limit)
    return data


def size_text(n: int) -> str:
    """1048576 -> "1 MiB"."""
    return f"{n // 2**20} MiB" if n % 2**20 == 0 else f"{n:,} bytes"
