"""Noticing that plain accelerate rebuilt a dpex loader as torch's, and saying so once.

``accelerate.Accelerator().prepare(loader)`` (and accelerate's module-level
``skip_first_batches``) build a new ``torch.utils.data.DataLoader`` from the loader's
constructor arguments, read one by one with ``getattr``; the dpex loader is never iterated
again and its workers are torch's local processes from then on. accelerate calls nothing of
dpex's, so dpex notices the one read that only such a rebuild makes: an attribute read
(``multiprocessing_context``, see ``DataLoader``) whose caller is accelerate's code.
``dpex.integrations.accelerate`` makes the same rebuild on purpose, inside
``rebuild_expected()``, and then puts a dpex loader back.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from contextvars import ContextVar
from types import FrameType

_expected: ContextVar[bool] = ContextVar("dpex_rebuild_expected", default=False)
_warned = False


def note_read(caller: FrameType | None) -> None:
    """A Ray-backed dpex loader's attribute was read by ``caller``: warn once if that is
    accelerate rebuilding the loader behind dpex's back."""
    global _warned
    if _warned or _expected.get() or caller is None:
        return
    if not _in_accelerate(caller):
        return
    _warned = True
    level, frame = 3, caller  # this function, the property, then the caller's frames
    while frame.f_back is not None and _in_accelerate(frame):
        level, frame = level + 1, frame.f_back
    warnings.warn(
        "dpex: accelerate rebuilt this dpex loader as torch's DataLoader, so it now loads "
        "with torch's local worker processes, not Ray actors. To keep the workers on Ray, "
        "use dpex.integrations.accelerate.Accelerator in place of accelerate.Accelerator "
        "(or dpex.integrations.accelerate.prepare(accelerator, ...) for one you did not "
        "create).",
        stacklevel=level,  # the user's line that called accelerate
    )


def _in_accelerate(frame: FrameType) -> bool:
    return frame.f_globals.get("__name__", "").partition(".")[0] == "accelerate"


@contextlib.contextmanager
def rebuild_expected() -> Iterator[None]:
    """accelerate's rebuilds inside this block are dpex's own (it puts its loader back)."""
    token = _expected.set(True)
    try:
        yield
    finally:
        _expected.reset(token)
