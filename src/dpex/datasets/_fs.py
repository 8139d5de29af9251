"""Resolving a path, URI or filesystem object into a pyarrow filesystem, with clear errors.

A ``FileSource`` is what a dataset keeps and pickles: the user's path or URI, their filesystem
object if they gave one, and plain options. The live ``pyarrow.fs.FileSystem`` it builds is
cached per *process* and never pickled: a Ray worker builds its own on first use, and a forked
torch worker rebuilds it too, because the AWS SDK and libhdfs clients inside a filesystem are
not safe to use across ``fork``.

Accepted sources:

* a local path (``str`` or ``os.PathLike``), made absolute here so workers with another
  working directory find it; ``file://`` URIs;
* ``s3://bucket/key`` -- built as ``pyarrow.fs.S3FileSystem(**storage_options)`` with short
  connect timeouts and few retries by default, so an unreachable endpoint fails in seconds;
* ``hdfs://host:port/path`` (and any other URI ``pyarrow.fs.FileSystem.from_uri`` knows);
* any path together with ``filesystem=`` a ``pyarrow.fs.FileSystem`` (it must pickle; all of
  pyarrow's own do, by their options).
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlparse

import pyarrow.fs as pafs

# Defaults for S3 sources given as URIs (storage_options override them). pyarrow's own
# defaults retry an unreachable endpoint for a long time; these fail within seconds.
S3_CONNECT_TIMEOUT_S = 3.0
S3_MAX_ATTEMPTS = 3

# Substrings of pyarrow/AWS SDK/libhdfs messages that mean "could not talk to the service".
_UNREACHABLE_MARKERS = (
    "NETWORK_CONNECTION",
    "curlCode",
    "Could not connect",
    "Couldn't connect",
    "Could not resolve host",
    "Connection refused",
    "Connection reset",
    "timed out",
    "Timeout was reached",
)


@dataclass
class FileSource:
    """A picklable pointer to data: where it is and how to open its filesystem.

    Build one with ``FileSource.resolve``.

    Attributes:
        uri: the source as the user gave it, for messages.
        path: the path inside the filesystem (no scheme; absolute for local files).
        scheme: ``"file"``, ``"s3"``, ``"hdfs"``, ... or ``"custom"`` for a given filesystem.
        user_filesystem: the filesystem object the user passed, or None.
        storage_options: keyword arguments for the filesystem built from ``uri``.
    """

    uri: str
    path: str
    scheme: str
    user_filesystem: pafs.FileSystem | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    _fs: pafs.FileSystem | None = field(default=None, repr=False, compare=False)
    _fs_pid: int | None = field(default=None, repr=False, compare=False)

    @classmethod
    def resolve(
        cls,
        source: str | os.PathLike,
        filesystem: pafs.FileSystem | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> FileSource:
        """Interpret ``source`` (see the module docstring).

        Only URIs that ``pyarrow.fs.FileSystem.from_uri`` resolves (``hdfs://`` without
        options, ``gs://``...) build their filesystem here; the others wait for first use.

        Raises:
            TypeError: ``source`` is not a path or URI, or ``filesystem`` does not pickle.
            ValueError: both ``filesystem`` and ``storage_options`` given, or options for a
                scheme that takes none.
        """
        if isinstance(source, os.PathLike):
            source = os.fspath(source)
        if not isinstance(source, str) or not source:
            raise TypeError(f"source should be a path or URI string, but got {source!r}")
        options = dict(storage_options or {})
        parsed = urlparse(source)
        # One-letter "schemes" are Windows drive letters.
        scheme = parsed.scheme.lower() if len(parsed.scheme) > 1 else "file"
        if filesystem is not None:
            return cls._with_filesystem(source, parsed, scheme, filesystem, options)
        if scheme == "file":
            local = parsed.path if parsed.scheme else source
            path = os.path.abspath(os.path.expanduser(local))
            if options:
                raise ValueError("storage_options are not used for local paths")
            return cls(uri=source, path=path, scheme="file")
        if scheme == "s3":
            # Options in the URI's query (endpoint_override=..., region=...) count too.
            query = {key: coerce_option(value) for key, value in parse_qsl(parsed.query)}
            options = {**query, **options}
            path = f"{parsed.netloc}{parsed.path}".rstrip("/")
            return cls(uri=source, path=path, scheme="s3", storage_options=options)
        if options and scheme != "hdfs":
            raise ValueError(
                f"storage_options are supported for s3:// and hdfs:// sources; for {scheme}:// "
                "pass a configured filesystem= instead"
            )
        if options:  # hdfs with options: the path is the URI's path
            return cls(uri=source, path=parsed.path or "/", scheme=scheme, storage_options=options)
        # Any other URI (hdfs://, gs://, abfs://...): pyarrow knows how its paths look.
        found = cls(uri=source, path="", scheme=scheme)
        with found.errors("connecting to"):
            fs, found.path = pafs.FileSystem.from_uri(source)
        found._fs, found._fs_pid = fs, os.getpid()
        return found

    @classmethod
    def _with_filesystem(
        cls, source: str, parsed: Any, scheme: str, filesystem: Any, options: dict
    ) -> FileSource:
        if not isinstance(filesystem, pafs.FileSystem):
            raise TypeError(
                f"filesystem should be a pyarrow.fs.FileSystem, but got {type(filesystem).__name__}"
            )
        if options:
            raise ValueError("pass either filesystem= or storage_options=, not both")
        try:
            pickle.dumps(filesystem)
        except Exception as exc:
            raise TypeError(
                "filesystem must be picklable so that each worker can reopen it "
                f"({type(filesystem).__name__}: {exc}); pass a URI and storage_options instead"
            ) from None
        if scheme == "file":
            path = source
            if isinstance(filesystem, pafs.LocalFileSystem):
                path = os.path.abspath(os.path.expanduser(parsed.path if parsed.scheme else source))
        else:
            # pyarrow filesystems take paths without a scheme: s3://b/k -> b/k.
            path = f"{parsed.netloc}{parsed.path}".rstrip("/")
        return cls(uri=source, path=path, scheme="custom", user_filesystem=filesystem)

    # ------------------------------------------------------------------ the live filesystem

    def filesystem(self) -> pafs.FileSystem:
        """This process's filesystem, built on first use (and again after a fork)."""
        if self._fs is None or self._fs_pid != os.getpid():
            self._fs = self._build()
            self._fs_pid = os.getpid()
        return self._fs

    def _build(self) -> pafs.FileSystem:
        if self.user_filesystem is not None:
            return self.user_filesystem
        if self.scheme == "file":
            return pafs.LocalFileSystem()
        if self.scheme == "s3":
            options = {"connect_timeout": S3_CONNECT_TIMEOUT_S, **self.storage_options}
            options.setdefault(
                "retry_strategy", pafs.AwsStandardS3RetryStrategy(max_attempts=S3_MAX_ATTEMPTS)
            )
            return pafs.S3FileSystem(**options)
        if self.scheme == "hdfs" and self.storage_options:
            parsed = urlparse(self.uri)
            return pafs.HadoopFileSystem(
                parsed.hostname or "default", parsed.port or 8020, **self.storage_options
            )
        with self.errors("connecting to"):
            fs, _path = pafs.FileSystem.from_uri(self.uri)
        return fs

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"] = state["_fs_pid"] = None  # each process opens its own
        return state

    # ------------------------------------------------------------------ checks and errors

    def endpoint(self) -> str:
        """Where the data is served from, in words, for error messages."""
        if self.scheme == "file":
            return "the local filesystem"
        if self.scheme == "s3":
            return str(self.storage_options.get("endpoint_override") or "AWS S3")
        if self.user_filesystem is not None:
            return _describe_filesystem(self.user_filesystem)
        parsed = urlparse(self.uri)
        return f"{parsed.scheme}://{parsed.netloc}"

    @contextlib.contextmanager
    def errors(self, doing: str) -> Iterator[None]:
        """Re-raise storage failures as FileNotFoundError / ConnectionError naming the source."""
        try:
            yield
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"no such file or directory: {self.uri!r} ({exc})") from None
        except ConnectionError:
            raise
        except OSError as exc:
            if any(marker in str(exc) for marker in _UNREACHABLE_MARKERS):
                raise ConnectionError(
                    f"cannot reach the storage endpoint {self.endpoint()} while {doing} "
                    f"{self.uri!r}: {exc}"
                ) from exc
            raise

    def require_exists(self) -> pafs.FileInfo:
        """The FileInfo of ``path``.

        Raises:
            FileNotFoundError: nothing exists there (a missing bucket counts).
            ConnectionError: the storage endpoint cannot be reached.
        """
        with self.errors("looking up"):
            info = self.filesystem().get_file_info(self.path)
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(
                f"no such file or directory: {self.uri!r} (path {self.path!r} on {self.endpoint()})"
            )
        return info


def coerce_option(value: str) -> Any:
    """A URI query value as the S3FileSystem argument it stands for (bool, number or str)."""
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    try:
        return float(value) if "." in value else int(value)
    except ValueError:
        return value


def _describe_filesystem(fs: pafs.FileSystem) -> str:
    # pyarrow filesystems pickle by their constructor options; that is the public way to read
    # an S3 filesystem's endpoint back.
    try:
        options = fs.__reduce__()[1][0]
    except Exception:
        options = None
    if isinstance(options, dict):
        if options.get("endpoint_override"):
            return str(options["endpoint_override"])
        if "host" in options:
            return f"{options['host']}:{options.get('port', '')}"
    return f"{type(fs).__name__} ({fs.type_name})"
