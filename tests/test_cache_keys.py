"""What a cache entry is keyed on, without Ray: the code a stage reaches in the user's own
modules (code_reach.py), the files each computation read (reads.py), and the runtime
that checks them on every hit and keeps nothing it cannot check."""

from __future__ import annotations

import ctypes
import importlib
import os
import sys
import textwrap
import time

import numpy as np
import pytest

import dpex
from dpex.cache import fingerprint, reads, runtime


HELPERS = '''
SCALE = 2.0

def finish(x):
    return _inner(x) * SCALE

def _inner(x):
    return x + 1

def unrelated():
    return 42

class Decoder:
    def __init__(self, quality=90):
        self.quality = quality
        self.scale = self._scale  # a bound method kept as an attribute

    def _scale(self, x):
        return x * 1

    def run(self, x):
        return self.scale(x) * self.quality

    def unused(self):
        return 0
'''

PHOTOS = '''
import numpy as np

import dpex
import my_transforms
import my_registry


class Photos:
    def __init__(self):
        self.names = ["a", "b"]
        self.decoder = my_transforms.Decoder()

    def _load(self, i):
        return my_transforms.finish(i)

    @dpex.cached
    def decode(self, i):
        return np.float32(self._load(i) + self.decoder.run(i))

    @dpex.cached
    def lazy(self, i):
        import my_lazy

        return my_lazy.value(i)

    def __getitem__(self, i):
        return self.decode(i) + 1


class ByName:
    @dpex.cached
    def by_name(self, i, kind="double"):
        return getattr(my_registry, "TABLE")[kind](i)
'''

REGISTRY = '''
TABLE = {"double": lambda x: 2 * x}

def other():
    return 7
'''

LAZY = '''
def value(i):
    return i * 3
'''


def _namespaces(folder, files: dict[str, str]) -> dict[str, str]:
    """Each stage's namespace with the user's project ``files`` written in ``folder`` and
    imported afresh, as a new job would."""
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))
    modules = ("my_photos", "my_transforms", "my_lazy", "my_registry")  # names no test uses
    for name in modules:
        sys.modules.pop(name, None)
    sys.path.insert(0, str(folder))
    try:
        importlib.invalidate_caches()
        photos = importlib.import_module("my_photos")
        stages = {"decode": photos.Photos, "lazy": photos.Photos, "by_name": photos.ByName}
        return {stage: fingerprint.namespace(getattr(cls, stage).fn, cls(), None)
                for stage, cls in stages.items()}
    finally:
        sys.path.remove(str(folder))
        for name in modules:
            sys.modules.pop(name, None)


@pytest.mark.parametrize("edit, changes", [
    (("my_transforms.py", "x + 1", "x + 2"), {"decode"}),  # a function the stage's helper calls
    (("my_transforms.py", "SCALE = 2.0", "SCALE = 3.0"), {"decode"}),  # a module-level value
    (("my_transforms.py", "self.scale(x) * self.quality", "self.scale(x) * self.quality + 0"),
     {"decode"}),  # a method of an object in the dataset's state (self.decoder)
    # A callable kept in the dataset's state counts for each of its stages.
    (("my_transforms.py", "x * 1", "x * 2"), {"decode", "lazy"}),
    (("my_transforms.py", "return 42", "return 43"), set()),  # a function no stage reaches
    (("my_transforms.py", "return 0", "return 1"), set()),  # a method of a reached class, not named
    (("my_registry.py", "2 * x", "3 * x"), {"by_name"}),  # a registry reached by getattr
    (("my_registry.py", "return 7", "return 8"), {"by_name"}),  # all getattr could find there
    (("my_photos.py", "self.decode(i) + 1", "self.decode(i) + 2"), set()),  # __getitem__: random
    (("my_lazy.py", "i * 3", "i * 4"), {"lazy"}),  # a module the stage imports itself
])
def test_an_edit_of_the_users_code_changes_the_namespace_of_the_stages_that_reach_it(
        tmp_path, edit, changes):
    files = {"my_transforms.py": HELPERS, "my_photos.py": PHOTOS, "my_lazy.py": LAZY,
             "my_registry.py": REGISTRY}
    before = _namespaces(tmp_path / "before", files)
    assert before == _namespaces(tmp_path / "again", files)  # the same code: the same keys
    name, old, new = edit
    assert old in files[name]
    after = _namespaces(tmp_path / "after", {**files, name: files[name].replace(old, new)})
    assert {stage for stage in before if before[stage] != after[stage]} == changes


def test_a_library_counts_by_its_version_and_the_standard_library_by_pythons():
    from dpex.cache import code_origin, code_reach

    def stage(x):
        import json

        return np.asarray(json.loads(x))

    digest, libraries = code_reach.reach(stage)
    assert libraries == {"numpy"}
    assert code_origin.library_versions(libraries) == f"numpy={np.__version__}"
    assert not code_origin.is_user_file(np.__file__) and not code_origin.is_user_file(os.__file__)
    assert not code_origin.is_user_file(dpex.__file__)
    assert code_origin.is_user_file(__file__)


def test_reads_records_what_python_opens_and_lists_and_not_what_it_writes(tmp_path):
    image, listed, missing = tmp_path / "a.jpg", tmp_path / "shards", tmp_path / "none.npy"
    image.write_bytes(b"jpeg")
    listed.mkdir()
    np.save(tmp_path / "b.npy", np.arange(3))
    with reads.record() as out:
        with open(image, "rb") as f:
            f.read()
        np.load(tmp_path / "b.npy")
        os.listdir(listed)
        with open(tmp_path / "log.txt", "a") as f:  # written, not read
            f.write("x")
        try:
            open(missing, "rb")
        except FileNotFoundError:
            pass
    (read,) = out
    assert dict(read.files).keys() == {str(image), str(tmp_path / "b.npy"), str(listed),
                                       str(missing)}
    assert dict(read.files)[str(missing)] == ("absent",)
    assert not read.unseen and reads.unchanged(read.files)


@pytest.mark.parametrize("change", ["same size and time", "removed", "created", "listed"])
def test_an_entry_is_stale_once_a_file_it_read_changes(tmp_path, change):
    image, folder = tmp_path / "a.jpg", tmp_path / "folder"
    image.write_bytes(b"1234")
    folder.mkdir()
    with reads.record() as out:
        open(image, "rb").read()
        os.listdir(folder)
        try:
            open(tmp_path / "b.jpg", "rb")
        except FileNotFoundError:
            pass
    (read,) = out
    assert reads.unchanged(read.files)
    if change == "same size and time":  # rewritten in place, its time set back (cp -p)
        st = os.stat(image)
        image.write_bytes(b"5678")
        os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif change == "removed":
        image.unlink()
    elif change == "created":  # a path it tried and did not find
        (tmp_path / "b.jpg").write_bytes(b"")
    else:
        (folder / "new").write_bytes(b"")
    assert not reads.unchanged(read.files)


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/io"), reason="Linux counts no reads")
def test_reads_python_cannot_see_are_flagged(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"x" * 100)
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fread.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    with reads.record() as out:  # a C library opening the file itself (OpenCV's imread)
        handle = libc.fopen(str(path).encode(), b"rb")
        libc.fread(ctypes.create_string_buffer(100), 1, 100, handle)
        libc.fclose(handle)
    assert out[0].unseen and out[0].files == ()
    fd = os.open(path, os.O_RDONLY)
    try:
        with reads.record() as out:  # a handle opened before the call (h5py, LMDB)
            os.pread(fd, 10, 0)
        assert out[0].unseen
    finally:
        os.close(fd)
    with reads.record() as out:  # computing only
        sum(range(1000))
    assert not out[0].unseen


class Folder:
    """A dataset of a folder and names, as ImageFolder's: the stage builds each path."""

    def __init__(self, root, names, reader="python"):
        self.root, self.names, self.reader = str(root), names, reader
        self.runs = 0

    @dpex.cached
    def decode(self, i):
        self.runs += 1
        path = os.path.join(self.root, self.names[i])
        if self.reader == "python":
            with open(path, "rb") as f:
                data = f.read()
        else:  # a C library reading the file itself
            data = _read_in_c(path)
        time.sleep(0.002)  # dearer than reading back: the cost model keeps it
        return np.frombuffer(data, dtype=np.uint8).copy()


def _read_in_c(path: str) -> bytes:
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fread.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
    libc.fread.restype = ctypes.c_size_t
    libc.fclose.argtypes = [ctypes.c_void_p]
    buffer = ctypes.create_string_buffer(4096)
    handle = libc.fopen(path.encode(), b"rb")
    n = libc.fread(buffer, 1, 4096, handle)
    libc.fclose(handle)
    return buffer.raw[:n]


@pytest.fixture
def local_cache(tmp_path):
    """The cache of a local worker process (no Ray: the disk tier), in this process."""
    def activate(**options):
        runtime.activate(dpex.Cache(disk_dir=str(tmp_path / "cache"), **options), use_ray=False)
        return runtime.active()

    yield activate
    runtime.flush()
    runtime.activate(None, use_ray=False)


def _images(tmp_path, n: int):
    """A folder of ``n`` files of 64 bytes, file ``k`` of bytes ``k``."""
    root = tmp_path / "images"
    root.mkdir()
    for k in range(n):
        (root / f"{k}.jpg").write_bytes(bytes([k]) * 64)
    return root


def _epoch(dataset, n):
    out = [dataset.decode(i) for i in range(n)]
    for space in runtime.active()._spaces.values():
        space.disk.settle()
    return out


def test_a_hit_checks_the_files_its_entry_read(tmp_path, local_cache):
    """A folder plus names: a file rewritten in place is read again, and only that one."""
    root = _images(tmp_path, 12)
    local_cache()
    dataset = Folder(root, sorted(os.listdir(root), key=lambda name: int(name[:-4])))
    _epoch(dataset, 12)
    assert dataset.runs == 12
    assert [bytes(x) for x in _epoch(dataset, 12)] == [bytes([n]) * 64 for n in range(12)]
    assert dataset.runs == 12  # every one a hit
    st = os.stat(root / "5.jpg")
    (root / "5.jpg").write_bytes(b"\xff" * 64)  # the same size and time
    os.utime(root / "5.jpg", ns=(st.st_atime_ns, st.st_mtime_ns))
    got = _epoch(dataset, 12)
    assert bytes(got[5]) == b"\xff" * 64 and dataset.runs == 13
    assert bytes(_epoch(dataset, 12)[5]) == b"\xff" * 64 and dataset.runs == 13  # stored anew
    (counters,) = runtime.take_counters().values()
    assert counters["stale"] == 1


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/io"), reason="Linux counts no reads")
def test_what_a_stage_reads_unseen_is_not_kept_unless_vouched_for(tmp_path, local_cache):
    root = _images(tmp_path, 4)
    local_cache()
    dataset = Folder(root, os.listdir(root), reader="c")
    _epoch(dataset, 4)
    _epoch(dataset, 4)
    assert dataset.runs == 8  # nothing kept: a changed file would go unnoticed
    (counters,) = runtime.take_counters().values()
    assert counters["unseen_reads"] == 8 and counters["decision"] == "unseen-reads"
    local_cache(fingerprint="images-v1")  # the user's word for the data
    _epoch(dataset, 4)
    _epoch(dataset, 4)
    assert dataset.runs == 12


def test_the_wrappers_are_in_place_only_while_a_stage_computes_and_see_only_its_thread(tmp_path):
    import builtins
    import threading

    originals = (builtins.open, os.open, os.listdir, os.scandir)
    path = tmp_path / "a.bin"
    path.write_bytes(b"x")
    other = tmp_path / "b.bin"
    other.write_bytes(b"y")
    started, done = threading.Event(), threading.Event()

    def another_thread():  # a thread that reads while the stage computes: not its read
        started.wait()
        with open(other, "rb") as f:
            f.read()
        done.set()

    thread = threading.Thread(target=another_thread)
    thread.start()
    with reads.record() as out:
        assert builtins.open is not originals[0]
        started.set()
        done.wait(10)
        with open(path, "rb") as f:
            f.read()
    thread.join()
    assert (builtins.open, os.open, os.listdir, os.scandir) == originals
    import io

    assert io.open is builtins.open
    assert [p for p, _ in out[0].files] == [str(path)]


class Nested:
    """A cached stage that calls another: the outer's entry depends on the inner's files,
    whether the inner computed or hit."""

    def __init__(self, root):
        self.root = str(root)

    @dpex.cached
    def inner(self, i):
        with open(os.path.join(self.root, f"{i}.jpg"), "rb") as f:
            time.sleep(0.002)
            return f.read()

    @dpex.cached
    def outer(self, i):
        time.sleep(0.002)
        return self.inner(i) + b"!"


def test_a_stage_inside_another_makes_the_outer_depend_on_its_files(tmp_path, local_cache):
    root = _images(tmp_path, 4)
    local_cache()
    dataset = Nested(root)
    for first in (dataset.inner, dataset.outer):  # the inner computed alone, or inside
        for i in range(4):
            first(i)
    for space in runtime.active()._spaces.values():
        space.disk.settle()
    assert dataset.outer(2) == bytes([2]) * 64 + b"!"  # a hit
    (root / "2.jpg").write_bytes(b"\xff" * 64)
    assert dataset.outer(2) == b"\xff" * 64 + b"!"  # stale through the inner's file
