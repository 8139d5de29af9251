"""The code a cached stage runs: its own, and all it reaches in the user's code (pure).

NOTE [ dpex Cache Code Reach ]

A namespace must change when any code the stage runs changes. ``reach`` follows what the
stage can call, from its function, as cloudpickle follows a function it pickles by value:
* a function: its bytecode, constants and names, its nested functions, defaults and
  closure, and the globals its code names (``helpers``, ``finish`` in ``helpers.finish``),
  each followed in turn: a function, a class, a module, a value (pickled);
* a class: its bases, and its attributes that the reached code names (``self._load``
  reaches ``_load``), with every dunder method, which Python calls without naming it
  (``__init__``, ``__call__``, ``__getitem__``...). The stage's own dataset class gives only
  the attributes named: its ``__getitem__``, the random part, is not the stage's code;
* a module: its attributes that the reached code names. A module the stage imports
  inside itself is imported here, as its first call would;
* an object in a value, a default or the dataset's state: its class, as above.
Names are matched without types, so the reach is a superset of what runs: an edit it
takes in by a shared name costs a cold cache, never a stale bit.

What is followed is the user's code (code_origin.py): code whose file lies outside the
interpreter's standard library and its installed packages (an editable install of the
user's own project is followed; dpex itself is not). A library counts by its version
(``code_origin.library_versions``), as Python's version counts for the standard library.

Code reached by name at run time (``getattr(obj, name)``, ``eval``, ``globals()``,
``vars``, ``importlib.import_module``) cannot be followed by name. Where reached code
names such a function, every attribute of every class and module reached counts, which
takes in all the code that dynamic lookup could find there (a registry, a dispatch on a
string). A lookup beyond them (a module not otherwise reached) is not seen: name its
module in the stage, or set ``Cache(fingerprint=...)`` per version of it.
"""

from __future__ import annotations

import dis
import functools
import hashlib
import importlib
import importlib.util
import pickle
import sys
import types
from typing import Any

from dpex.cache.code_origin import is_user_class, is_user_file, is_user_module

_DYNAMIC = frozenset({"getattr", "eval", "exec", "compile", "globals", "locals", "vars",
                      "__import__", "import_module", "attrgetter", "methodcaller",
                      "__dict__", "__getattribute__"})
# Attributes that are not code, or that Python sets as it goes (copyreg's __slotnames__ on
# a class's first pickling, 3.13's __firstlineno__, which an edit above the class moves).
_NOT_CODE = frozenset({"__dict__", "__weakref__", "__module__", "__qualname__", "__doc__",
                       "__slotnames__", "__firstlineno__", "__static_attributes__",
                       "__builtins__", "__loader__", "__spec__", "__file__", "__cached__",
                       "__package__", "__name__", "__path__"})


def reach(fn: Any, owner: Any = None, state: Any = None, state_counts: bool = True
          ) -> tuple[bytes, frozenset[str]]:
    """(digest of the user code ``fn`` reaches, top-level names of the libraries it
    reaches). ``owner``: the object ``fn`` is a method of; ``state``: a value whose
    functions and classes are followed too (the dataset's attributes), and whose pickled
    bytes count only where ``state_counts``."""
    owners = tuple(c for c in type(owner).__mro__ if is_user_class(c)) if owner is not None else ()
    walk = _Reach(owners)
    walk.function(fn)
    if owner is not None:
        walk.klass(type(owner))
    if state is not None:
        walk.value(state, counts=state_counts)
    walk.resolve()
    return walk.digest.digest(), frozenset(walk.libraries)


_CANONICAL_BUDGET = 10_000  # members visited at most: a list of a million paths is not walked


def canonical(value: Any, depth: int = 4, budget: list[int] | None = None) -> Any:
    """``value`` with its sets sorted: a set's order follows the process's hash seed, and
    every process of a job, and a later job, must compute the same digest. It visits the
    first ``_CANONICAL_BUDGET`` members, in order (the same ones in every process): a set
    past them, in a long list, keeps its order, which costs misses, never a stale bit."""
    budget = [_CANONICAL_BUDGET] if budget is None else budget
    if depth == 0 or budget[0] <= 0:
        return value
    kind = type(value)
    if kind in (set, frozenset, list, tuple, dict):
        budget[0] -= len(value)
        if budget[0] < 0:
            return value
    if kind in (set, frozenset):
        try:
            return (kind.__name__, sorted(canonical(v, depth - 1, budget) for v in value))
        except TypeError:  # unorderable members
            return value
    if kind in (list, tuple):
        return kind(canonical(v, depth - 1, budget) for v in value)
    if kind is dict:
        return {k: canonical(v, depth - 1, budget) for k, v in value.items()}
    return value


class _Reach:
    def __init__(self, owner_classes: tuple[type, ...]) -> None:
        self.digest = hashlib.blake2b(digest_size=16)
        self.libraries: set[str] = set()
        self.names: set[str] = set()
        self.dynamic = False
        self._owner_classes = owner_classes
        self._seen: set[int] = set()
        self._alive: list[Any] = []  # what was seen, so that no id is reused meanwhile
        self._containers: list[Any] = []  # user classes and modules reached, in order
        self._resolved: set[tuple[int, str]] = set()

    def _first(self, obj: Any) -> bool:
        if id(obj) in self._seen:
            return False
        self._seen.add(id(obj))
        self._alive.append(obj)
        return True

    def function(self, fn: Any) -> None:
        if _is_cached(fn):
            fn = fn.fn
        if isinstance(fn, (staticmethod, classmethod, types.MethodType)):
            fn = fn.__func__
        if isinstance(fn, functools.partial):
            self.function(fn.func)
            self.value((fn.args, fn.keywords))
            return
        if isinstance(fn, property):
            for accessor in (fn.fget, fn.fset, fn.fdel):
                if accessor is not None:
                    self.function(accessor)
            return
        if not isinstance(fn, types.FunctionType):
            self.value(fn)
            return
        if not self._first(fn):
            return
        if not is_user_file(fn.__code__.co_filename):
            self._library(fn.__module__)
            return
        names, global_names, imports = self._code(fn.__code__)
        self.names |= names
        self.dynamic = self.dynamic or bool(names & _DYNAMIC)
        self.value((fn.__defaults__, fn.__kwdefaults__))
        for cell in fn.__closure__ or ():
            try:
                self.value(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
        module_globals = fn.__globals__
        for name in sorted(global_names):  # not an attribute's name: self.samples is no global
            if name in module_globals:
                self.digest.update(f"global {name}\0".encode())
                self.value(module_globals[name])
        for name, level in imports:
            self._imported(name, level, module_globals)

    def _code(self, code: types.CodeType) -> tuple[set[str], set[str], list[tuple[str, int]]]:
        """Hash ``code`` and its nested code; the names they use, those of them they load
        as globals, and the modules they import."""
        names = set(code.co_names)
        global_names, imports = _scan(code)
        global_names, imports = set(global_names), list(imports)
        self.digest.update(code.co_code)
        self.digest.update(repr(code.co_names).encode())
        consts = []
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                nested = self._code(const)
                names |= nested[0]
                global_names |= nested[1]
                imports += nested[2]
            else:
                consts.append(const)
        self.digest.update(_const_repr(tuple(consts)).encode())
        return names, global_names, imports

    def value(self, value: Any, counts: bool = True) -> None:
        if not counts:  # followed, not hashed
            _ReachingPickler.digest(value, self)
        elif value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
            self.digest.update(repr(value).encode())
        elif isinstance(value, (types.FunctionType, types.MethodType, functools.partial,
                                staticmethod, classmethod, property)) or _is_cached(value):
            self.function(value)
        elif isinstance(value, type):
            self.klass(value)
        elif isinstance(value, types.ModuleType):
            self.module(value)
        elif isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType)):
            self._library(getattr(value, "__module__", None) or "builtins")
            self.digest.update(repr(getattr(value, "__qualname__", "")).encode())
        else:
            self.digest.update(_ReachingPickler.digest(value, self))

    def klass(self, cls: type) -> None:
        if not self._first(cls):
            return
        if not is_user_class(cls):
            self._library(cls.__module__)
            self.digest.update(f"class {cls.__module__}.{cls.__name__}\0".encode())
            return
        self.digest.update(f"class {cls.__name__}\0".encode())  # __name__: NOTE in fingerprint
        for base in cls.__mro__[1:]:
            self.klass(base)
        self._containers.append(cls)
        if cls not in self._owner_classes:
            for name in sorted(vars(cls)):
                if name.startswith("__") and name.endswith("__"):
                    self._attribute(cls, name)

    def module(self, module: types.ModuleType) -> None:
        if not self._first(module):
            return
        if is_user_module(module):
            self._containers.append(module)
        else:
            self._library(module.__name__)

    def resolve(self) -> None:
        """Follow the attributes of the reached classes and modules that the reached code
        names (all of them where it looks names up at run time), until nothing new."""
        while True:
            before = (len(self._resolved), len(self._containers))
            for container in list(self._containers):
                attributes = vars(container)
                wanted = attributes.keys() if self.dynamic else self.names & attributes.keys()
                for name in sorted(wanted):
                    self._attribute(container, name)
            if (len(self._resolved), len(self._containers)) == before:
                return

    def _attribute(self, container: Any, name: str) -> None:
        if (id(container), name) in self._resolved:
            return
        self._resolved.add((id(container), name))
        if name in _NOT_CODE:
            return
        self.digest.update(f"attr {name}\0".encode())
        self.value(vars(container)[name])

    def _imported(self, name: str, level: int, module_globals: dict) -> None:
        """A module the code imports itself: imported now, as its first call would."""
        try:
            if level:
                name = importlib.util.resolve_name("." * level + name,
                                                   module_globals.get("__package__"))
            self.module(importlib.import_module(name))
        except Exception:  # it fails in the stage too; nothing here to follow
            self.digest.update(f"unimportable {name}\0".encode())

    def _library(self, module_name: str | None) -> None:
        top = (module_name or "").split(".")[0]
        if top and top not in sys.stdlib_module_names and top not in ("builtins", "__main__"):
            self.libraries.add(top)


_PARTS_AT_ONCE = 256  # of a value pickle refused, its parts pickled together at most


class _ReachingPickler(pickle.Pickler):
    """Pickles a value for its digest, and follows the functions, classes and modules in
    it (a class by the class, never by an import: it may be one shipped by value)."""

    def __init__(self, file: Any, walk: _Reach) -> None:
        super().__init__(file, protocol=4)
        self._walk = walk

    @classmethod
    def digest(cls, value: Any, walk: _Reach, depth: int = 8) -> bytes:
        sink = _HashSink()
        try:
            cls(sink, walk).dump(canonical(value))
        except Exception:  # a lock, a socket somewhere in it
            return cls._by_parts(value, walk, depth)
        return sink.hash.digest()

    @classmethod
    def _by_parts(cls, value: Any, walk: _Reach, depth: int) -> bytes:
        """The digest of a value pickle refused, from its parts, so that a lock in one
        attribute leaves the others counting: a container's members, an object's
        attributes; what refuses itself counts by its type."""
        if isinstance(value, dict):
            parts: Any = sorted(value.items(), key=lambda item: repr(item[0]))
        elif isinstance(value, (list, tuple)):
            parts = value
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            walk.klass(type(value))
            parts = (f"object {type(value).__name__}",
                     sorted(vars(value).items(), key=lambda item: str(item[0])))
        else:
            parts = None
        if parts is None or depth == 0:
            walk.klass(type(value))
            return f"unpicklable {type(value).__name__}".encode()
        digest = hashlib.blake2b(type(value).__name__.encode(), digest_size=16)
        parts = list(parts)
        for start in range(0, len(parts), _PARTS_AT_ONCE):  # a long list: few pickles
            chunk = parts[start:start + _PARTS_AT_ONCE]
            whole = cls.digest(chunk, walk, 0) if len(chunk) > 1 else b"unpicklable"
            if not whole.startswith(b"unpicklable"):
                digest.update(whole)
                continue
            for part in chunk:
                digest.update(cls.digest(part, walk, depth - 1))
        return digest.digest()

    def reducer_override(self, obj: Any) -> Any:
        if obj is _token:  # the callable of the reductions below: by its name, as pickle
            return NotImplemented  # does (reduced again, it was a recursion without end,
            # and the whole state digested as "unpicklable": its values counted for nothing)
        if isinstance(obj, type):
            self._walk.klass(obj)
            return _token, (f"class {obj.__name__}",)
        if isinstance(obj, (types.FunctionType, types.ModuleType)) or _is_cached(obj):
            self._walk.value(obj)
            return _token, (f"{type(obj).__name__} {getattr(obj, '__name__', '')}",)
        if isinstance(obj, types.MethodType):  # self.transform = self._normalize
            self._walk.function(obj.__func__)
        elif not isinstance(obj, types.BuiltinFunctionType):
            cls = type(obj)
            if cls.__module__ != "builtins":
                self._walk.klass(cls)
        return NotImplemented


class _HashSink:
    def __init__(self) -> None:
        self.hash = hashlib.blake2b(digest_size=16)

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        return len(data)


def _const_repr(const: Any) -> str:
    """A constant's repr, a frozenset's members sorted (``x in {"a", "b"}`` compiles to one,
    and its order follows the process's hash seed)."""
    if isinstance(const, frozenset):
        return "frozenset(" + repr(sorted(_const_repr(c) for c in const)) + ")"
    if isinstance(const, tuple):
        return "(" + ", ".join(_const_repr(c) for c in const) + ")"
    return repr(const)


def _token(text: str) -> str:
    return text


def _is_cached(value: Any) -> bool:
    """A ``dpex.cached`` stage (by its class's module: stage.py reaches the runtime, which
    reaches this module)."""
    return type(value).__module__ == "dpex.cache.stage" and hasattr(value, "fn")


_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL",
                         "LOAD_FROM_DICT_OR_GLOBALS"})


@functools.lru_cache(maxsize=4096)
def _scan(code: types.CodeType) -> tuple[frozenset[str], tuple[tuple[str, int], ...]]:
    """The names ``code`` itself (not its nested code) loads as globals, and (module,
    level) of each ``import`` in it."""
    global_names, imports, consts = set(), [], []
    for instruction in dis.get_instructions(code):
        if instruction.opname in _GLOBAL_OPS:
            global_names.add(instruction.argval)
        elif instruction.opname == "LOAD_CONST":
            consts.append(instruction.argval)
        elif instruction.opname == "IMPORT_NAME":
            level = consts[-2] if len(consts) >= 2 and isinstance(consts[-2], int) else 0
            imports.append((instruction.argval, level))
    return frozenset(global_names), tuple(imports)

