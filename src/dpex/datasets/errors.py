"""Errors of ``dpex.datasets``."""

from __future__ import annotations

from collections.abc import Sequence


class ColumnNotFoundError(KeyError):
    """A requested column is not in the data's schema.

    A ``KeyError`` (as ``pyarrow.Table.column`` and pandas raise for a missing column), whose
    message reads normally instead of being repr-quoted.

    Args:
        column: the missing column.
        uri: where the data is.
        available: the columns the data has.
    """

    def __init__(self, column: str, uri: str, available: Sequence[str]) -> None:
        super().__init__(column)
        self.column = column
        self.uri = uri
        self.available = list(available)

    def __str__(self) -> str:
        return (
            f"column {self.column!r} not found in {self.uri!r}; "
            f"available columns: {self.available}"
        )

    def __reduce__(self):
        # Rebuild from our own arguments when the error crosses a process boundary.
        return (type(self), (self.column, self.uri, self.available))
