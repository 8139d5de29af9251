"""Carrying an exception from a worker to the training loop, as the same exception type.
Pure: no Ray.

torch's idea (``ExceptionWrapper``), dpex's code: the worker records the exception type, the
formatted remote traceback and the sample indices it was loading; the trainer re-raises the
same type with all of that in the message.
"""

from __future__ import annotations

import os
import socket
import sys
import traceback
from dataclasses import dataclass
from typing import Any


@dataclass
class RemoteError:
    """An exception caught in a worker while it loaded one batch."""

    exc_type: type[BaseException]
    traceback_text: str
    where: str
    indices: Any
    original: BaseException | None

    @classmethod
    def capture(cls, worker_id: int, indices: Any) -> RemoteError:
        """Build from the exception being handled (call inside an ``except`` block)."""
        exc_type, exc, _ = sys.exc_info()
        assert exc_type is not None and exc is not None
        where = f"in dpex worker {worker_id} (host {socket.gethostname()}, pid {os.getpid()})"
        return cls(
            exc_type=exc_type,
            traceback_text="".join(traceback.format_exception(exc)),
            where=where,
            indices=indices,
            original=_picklable_or_none(exc),
        )

    def message(self) -> str:
        return (
            f"Caught {self.exc_type.__name__} {self.where} "
            f"while loading sample indices {_short(self.indices)}.\n"
            f"Original {self.traceback_text}"
        )

    def reraise(self) -> None:
        """Raise an exception of the original type whose message carries the remote story."""
        msg = self.message()
        if self.exc_type is KeyError:
            # KeyError's str() repr-quotes its argument, which would mangle the traceback.
            msg = KeyErrorMessage(msg)
        try:
            exception = self.exc_type(msg)
        except Exception:
            # The type's constructor wants other arguments: raise the original instance and
            # attach the remote story as a note (shown in the printed traceback).
            if self.original is None:
                raise RuntimeError(msg) from None
            exception = self.original
            exception.add_note(msg)
        raise exception


class KeyErrorMessage(str):
    """A string whose repr is itself, so ``KeyError(msg)`` prints the message readably."""

    def __repr__(self) -> str:
        return self


def _short(indices: Any, limit: int = 64) -> str:
    text = repr(indices)
    return text if len(text) <= limit * 8 else text[: limit * 8] + "...]"


def _picklable_or_none(exc: BaseException) -> BaseException | None:
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return None
