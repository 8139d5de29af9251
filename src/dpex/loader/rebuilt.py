"""Frameworks that rebuild a dpex loader as torch's: noticing it, and building dpex's back.

``accelerate.Accelerator().prepare(loader)`` (and accelerate's ``skip_first_batches``) and
Ray Train's ``ray.train.torch.prepare_data_loader(loader)`` build a new
``torch.utils.data.DataLoader`` from the loader's constructor arguments, read one by one as
attributes; the dpex loader is never iterated again and its workers are torch's local
processes from then on. Neither framework calls anything of dpex's, so dpex notices the one
read that every such rebuild makes: ``timeout`` (a property of ``dpex.DataLoader``) read by
the framework's own code. It warns once per framework, naming dpex's integration for it.

No warning when the name the framework builds with (its module's ``DataLoader``) is a dpex
class, as under ``dpex run`` / ``dpex.patch()`` (zero-code mode): the rebuilt loader is then
dpex's. dpex's own integrations rebuild on purpose, inside ``rebuild_expected()``, and put
a dpex loader back (``build_back.dpex_like``).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from contextvars import ContextVar
from types import FrameType

_expected: ContextVar[bool] = ContextVar("dpex_rebuild_expected", default=False)

# The frameworks known to rebuild loaders: their top module prefix, and dpex's fix.
FIXES = {
    "accelerate": (
        "accelerate",
        "use dpex.integrations.accelerate.Accelerator in place of accelerate.Accelerator (or "
        "dpex.integrations.accelerate.prepare(accelerator, ...) for one you did not create)"),
    "ray.train": (
        "Ray Train's prepare_data_loader",
        "use dpex.integrations.ray_train.prepare_data_loader in place of "
        "ray.train.torch.prepare_data_loader"),
}
_warned: set[str] = set()


def note_read(caller: FrameType | None) -> None:
    """A Ray-backed dpex loader's ``timeout`` was read by ``caller``: warn once per framework
    if that is a framework rebuilding the loader as torch's behind dpex's back."""
    if _expected.get() or caller is None:
        return
    framework = _framework_of(caller)
    if framework is None or framework in _warned or _builds_dpex(caller):
        return
    _warned.add(framework)
    level, frame = 3, caller  # this function, the property, then the caller's frames
    while frame.f_back is not None and _framework_of(frame) == framework:
        level, frame = level + 1, frame.f_back
    who, fix = FIXES[framework]
    warnings.warn(
        f"dpex: {who} rebuilt this dpex loader as torch's DataLoader, so it now loads with "
        f"torch's local worker processes, not Ray actors. To keep the workers on Ray, {fix}; "
        "or run the script with `dpex run`.",
        stacklevel=level,  # the user's line that called the framework
    )


def _framework_of(frame: FrameType) -> str | None:
    module = frame.f_globals.get("__name__", "")
    for prefix in FIXES:
        if module == prefix or module.startswith(prefix + "."):
            return prefix
    return None


def _builds_dpex(frame: FrameType) -> bool:
    """The framework's module builds with a dpex class (zero-code mode patched it first):
    dpex's loader, or a class derived from it (known by its module, so that this module,
    which the loader imports, never imports the loader)."""
    built = frame.f_globals.get("DataLoader")
    return isinstance(built, type) and any(c.__module__ == "dpex.dataloader" for c in built.__mro__)


@contextlib.contextmanager
def rebuild_expected() -> Iterator[None]:
    """A framework's rebuilds inside this block are dpex's own (it puts its loader back)."""
    token = _expected.set(True)
    try:
        yield
    finally:
        _expected.reset(token)
