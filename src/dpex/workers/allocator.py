"""A worker process's memory allocator: batch-sized blocks are reused, not faulted in again.

NOTE [ dpex Worker Allocator ]

What glibc does by default
  ``malloc`` serves a block above its mmap threshold with a mapping of its own and unmaps
  it when freed; the threshold starts at 128 KiB and rises, up to 32 MiB, to the size of
  such a block when one is freed. Free memory at the top of a heap goes back to the kernel
  once more than the trim threshold (twice the mmap threshold) is free there. Both hand
  the kernel back memory that the next task asks for again, and the kernel gives it back
  as fresh pages: zeroed and faulted in one 4 KiB page at a time.

Why a worker pays for it
  A worker builds a batch of several MB each task (decoded images, the collated tensor)
  and frees it once Ray has copied the batch into its object store. Measured on the
  bench's JPEG pipeline (18.4 MB batches, 2 ``ray start`` nodes of one core): the worker
  processes took 3,000-5,800 minor faults a batch, most of a batch's 4,500 pages, and
  some processes several times more than others (the dynamic threshold depends on what
  each process allocated first), so the processes ran at unequal speeds.

What dpex does
  Each worker process (``Worker.__init__``: a Ray actor or a local-start process) fixes
  the mmap threshold at glibc's largest, 32 MiB, and the trim threshold at 128 MiB, so
  blocks up to 32 MiB come from the heap and are reused from one task to the next. Same
  bench, two runs of 5 epochs each way, alternating: 6-360 faults a batch in the workers'
  steady epochs against 4,500-5,800, and 9.9 against 9.15 batches/s over the two nodes
  (+8%; +12% in an earlier pair with a 512 MiB trim threshold). The price: a worker
  process may keep up to 128 MiB of freed memory mapped instead of returning it. Bits do
  not change.

  A user who tunes glibc's malloc for the worker processes (``MALLOC_MMAP_THRESHOLD_``,
  ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_MAX_``, ``MALLOC_TOP_PAD_`` or a
  ``glibc.malloc`` entry in ``GLIBC_TUNABLES``, e.g. through ``WorkerOptions(ray_options=
  {"runtime_env": {"env_vars": ...}})``) keeps those settings: dpex sets nothing. Where
  the C library is not glibc (musl, macOS) nothing changes either.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

# mallopt parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest: 4 * 1024 * 1024 * sizeof(long)
TRIM_THRESHOLD = 128 * 1024 * 1024

_USER_MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                          "MALLOC_MMAP_MAX_", "MALLOC_TOP_PAD_")


def settings_to_apply(environ: Mapping[str, str], libc: str | None) -> list[tuple[int, int]]:
    """The ``mallopt`` calls a worker process makes: none where the C library is not glibc
    (``libc``: ``os.confstr("CS_GNU_LIBC_VERSION")``, None elsewhere) or where the user
    tuned glibc's malloc through its environment."""
    if not libc or not libc.startswith("glibc"):
        return []
    if any(name in environ for name in _USER_MALLOC_VARIABLES):
        return []
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return []
    return [(M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD)]


def _glibc_version() -> str | None:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):  # not glibc, or no confstr at all
        return None


def keep_freed_memory() -> bool:
    """Apply ``settings_to_apply`` to this process; whether anything was set."""
    settings = settings_to_apply(os.environ, _glibc_version())
    if not settings:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # a process without glibc's symbols in reach
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    answers = [mallopt(param, value) for param, value in settings]  # each, whatever the others say
    return all(answer == 1 for answer in answers)
