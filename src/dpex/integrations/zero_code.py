"""Zero-code mode: every torch DataLoader with workers that a script, or a framework it runs,
builds becomes dpex's, with no change to the script.

NOTE [ dpex Zero-Code Mode ]

What changes
  ``dpex.patch()`` (undone by ``.undo()``, or by leaving its ``with`` block) and
  ``dpex run train.py ARGS...`` (``python -m dpex run ...``; ``-m module`` too) point
  torch's public names ``torch.utils.data.DataLoader`` and
  ``torch.utils.data.dataloader.DataLoader`` at ``ZeroCodeDataLoader``:
    * built with ``num_workers > 0``, it is a ``dpex.DataLoader`` with
      ``distribute_mode=True`` and the patch's ``head_address`` and ``worker_options``:
      torch's batches, bit for bit, from Ray actors;
    * built with ``num_workers=0`` (no workers to move), it is torch's own loader;
    * ``isinstance(x, torch.utils.data.DataLoader)`` and ``issubclass`` stay true for
      every torch loader, built before the patch or during it;
    * a class a framework derives from the patched name (while patched) is a dpex loader
      with the same rule, and stays one after the undo.
  dpex itself keeps torch's class, taken once at import (dataloader.py): nothing of
  dpex's looks torch's class up by its public name.

Where options come from
  The arguments of ``patch``; for ``dpex run``, its flags, else the environment:
  ``DPEX_HEAD_ADDRESS`` (else ``RAY_ADDRESS``, as any loader with ``head_address="auto"``)
  and ``DPEX_WORKER_OPTIONS``, a JSON object of ``WorkerOptions`` fields, with
  ``"autoscale"`` an object of ``Autoscale`` fields.

The script's Ray workers
  Code the script runs in Ray's worker processes (Ray Train's ``train_loop_per_worker``,
  its tasks and actors) builds its loaders there. While patched, every ``ray.init`` of the
  script (not dpex's own) gives its job a ``worker_process_setup_hook`` that patches each
  worker process, with the same options, before it runs anything (Ray's
  ``RAY_RUNTIME_ENV_HOOK``; a hook the user set there runs first, and a setup hook of the
  user's own is kept instead). So Ray Train's own ``prepare_data_loader`` rebuilds a dpex
  loader, and a ``TorchTrainer`` script runs unmodified under ``dpex run``.

What it cannot reach
  A module that ran ``from torch.utils.data import DataLoader`` before the patch holds
  torch's class: patch first (``dpex run`` patches before the script's first line). A
  process a framework starts by running the script again (Lightning's DDP launcher,
  ``accelerate launch``) runs it unpatched: launch each rank through ``python -m dpex
  run`` (``torchrun -m dpex run train.py`` for torchrun). A ``ray.init`` before the patch,
  or under ``uv run`` (Ray replaces the runtime-env hook with its own there), leaves the
  job's workers unpatched.
"""

from __future__ import annotations

import base64
import importlib
import inspect
import json
import os
import pickle
import runpy
import sys
import threading
from typing import Any, Generic, TypeVar

import torch.utils.data
import torch.utils.data.dataloader

from dpex.dataloader import DataLoader, TorchDataLoader
from dpex.workers.autoscale import Autoscale
from dpex.workers.options import WorkerOptions

__all__ = ["Patch", "ZeroCodeDataLoader", "options_from_env", "patch", "run_script"]

_T_co = TypeVar("_T_co", covariant=True)
_NUM_WORKERS_AT = 5  # num_workers' position in torch's DataLoader(dataset, batch_size, ...)
_lock = threading.Lock()
_active: list[Patch] = []  # the patches in force, innermost last


class _TorchsName(type):
    """The patched name answers ``isinstance`` / ``issubclass`` as torch's class does."""

    def __instancecheck__(cls, obj: Any) -> bool:
        if cls is ZeroCodeDataLoader:
            return isinstance(obj, TorchDataLoader)
        return super().__instancecheck__(obj)

    def __subclasscheck__(cls, sub: type) -> bool:
        if cls is ZeroCodeDataLoader:
            return issubclass(sub, TorchDataLoader)
        return super().__subclasscheck__(sub)


class ZeroCodeDataLoader(DataLoader, Generic[_T_co], metaclass=_TorchsName):
    """What ``torch.utils.data.DataLoader`` builds while patched (see the NOTE).

    Generic as torch's class is: ``DataLoader[T]`` in an annotation, or as the base of a
    framework's class, keeps working (and such a class is a dpex loader).
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        if cls is ZeroCodeDataLoader and not _num_workers(args, kwargs):
            return TorchDataLoader(*args, **kwargs)  # not an instance: __init__ is skipped
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        options = _active[-1] if _active else Patch(install=False)
        if _num_workers(args, kwargs):
            kwargs.setdefault("distribute_mode", True)
            kwargs.setdefault("head_address", options.head_address)
            kwargs.setdefault("worker_options", options.worker_options)
        super().__init__(*args, **kwargs)


# Frameworks that rebuild a loader from its arguments (Lightning, accelerate) read them off
# the signature: dpex's, which is torch's plus dpex's own keywords.
ZeroCodeDataLoader.__init__.__signature__ = inspect.signature(DataLoader.__init__)


def _num_workers(args: tuple, kwargs: dict) -> int:
    if "num_workers" in kwargs:
        return kwargs["num_workers"] or 0
    return args[_NUM_WORKERS_AT] if len(args) > _NUM_WORKERS_AT else 0


class Patch:
    """A patch in force: ``undo()`` it, or use it as a context manager."""

    def __init__(self, head_address: str | None = "auto",
                 worker_options: WorkerOptions | None = None, install: bool = True) -> None:
        if worker_options is not None and not isinstance(worker_options, WorkerOptions):
            raise TypeError(
                f"worker_options should be a dpex.WorkerOptions, but got {worker_options!r}")
        self.head_address = head_address
        self.worker_options = worker_options or WorkerOptions()
        self._saved: tuple[Any, Any] | None = None
        if install:
            with _lock:
                self._saved = (torch.utils.data.DataLoader,
                               torch.utils.data.dataloader.DataLoader)
                torch.utils.data.DataLoader = ZeroCodeDataLoader
                torch.utils.data.dataloader.DataLoader = ZeroCodeDataLoader
                if not _active:
                    _reach_ray_workers()
                _active.append(self)

    def undo(self) -> None:
        """Give torch's names back what they were before this patch (once)."""
        with _lock:
            if self._saved is None:
                return
            torch.utils.data.DataLoader, torch.utils.data.dataloader.DataLoader = self._saved
            self._saved = None
            _active.remove(self)
            if not _active:
                _leave_ray_workers()

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.undo()


def patch(head_address: str | None = "auto",
          worker_options: WorkerOptions | None = None) -> Patch:
    """Make every torch DataLoader built from now on with ``num_workers > 0`` a dpex loader
    on Ray (``distribute_mode=True``), with these options. See the NOTE.

    Example:
        >>> import dpex
        >>> with dpex.patch():  # doctest: +SKIP
        ...     trainer.fit(model, datamodule)  # its loaders' workers are Ray actors
    """
    return Patch(head_address, worker_options)


def options_from_env(environ: dict[str, str] | None = None) -> tuple[str | None, WorkerOptions]:
    """``(head_address, worker_options)`` from ``DPEX_HEAD_ADDRESS`` and
    ``DPEX_WORKER_OPTIONS`` (a JSON object of ``WorkerOptions`` fields)."""
    environ = os.environ if environ is None else environ
    return (environ.get("DPEX_HEAD_ADDRESS") or "auto",
            worker_options_from_json(environ.get("DPEX_WORKER_OPTIONS") or "{}"))


def worker_options_from_json(text: str) -> WorkerOptions:
    """A ``WorkerOptions`` from a JSON object of its fields (``"autoscale"``: an object of
    ``Autoscale`` fields)."""
    try:
        fields = json.loads(text)
        if not isinstance(fields, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise ValueError(f"worker options should be a JSON object of WorkerOptions fields, "
                         f"got {text!r} ({exc})") from None
    if isinstance(fields.get("autoscale"), dict):
        fields["autoscale"] = Autoscale(**fields["autoscale"])
    return WorkerOptions(**fields)


def run_script(target: str, argv: list[str], module: bool = False,
               head_address: str | None = "auto",
               worker_options: WorkerOptions | None = None) -> None:
    """Run ``target`` (a path, or a module with ``module``) as ``__main__`` with ``argv``,
    patched: what ``dpex run`` does."""
    sys.argv = [target, *argv]
    with patch(head_address, worker_options):
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            runpy.run_path(target, run_name="__main__")


# ---------------------------------------------------------------- the script's Ray workers
# Ray reads RAY_RUNTIME_ENV_HOOK at each ray.init: a function that may change the job's
# runtime_env. While patched, dpex's adds a worker_process_setup_hook that patches each of
# the job's worker processes before it runs anything, so the loaders that Ray Train's
# train_loop_per_worker (or any task of the script) builds are dpex's too. A hook the user
# had set still runs first; dpex's own ray.init (ray_session's join) is left alone, so dpex's
# actors keep Ray's default runtime_env (and its prestarted workers).
_RUNTIME_ENV_HOOK = "RAY_RUNTIME_ENV_HOOK"
_PATCH_OPTIONS = "DPEX_ZERO_CODE_PATCH"  # the patch's options, for the job's workers
_users_hook: list[str | None] = []  # what the variable held before the first patch


def _reach_ray_workers() -> None:
    _users_hook[:] = [os.environ.get(_RUNTIME_ENV_HOOK)]
    os.environ[_RUNTIME_ENV_HOOK] = f"{__name__}.{ray_runtime_env_hook.__name__}"


def _leave_ray_workers() -> None:
    users = _users_hook[0] if _users_hook else None
    if users is None:
        os.environ.pop(_RUNTIME_ENV_HOOK, None)
    else:
        os.environ[_RUNTIME_ENV_HOOK] = users


def ray_runtime_env_hook(runtime_env: dict[str, Any] | None) -> dict[str, Any] | None:
    """Ray's runtime-env hook while patched: the job's workers are patched too."""
    from dpex import ray_session

    users = _users_hook[0] if _users_hook else None
    if users:  # "module.function", as Ray reads it
        module, _, name = users.rpartition(".")
        runtime_env = getattr(importlib.import_module(module), name)(runtime_env)
    if not _active or ray_session.joining():
        return runtime_env
    runtime_env = dict(runtime_env or {})
    if "worker_process_setup_hook" in runtime_env:  # the user's own: theirs to keep
        return runtime_env
    patch_in_force = _active[-1]
    options = pickle.dumps((patch_in_force.head_address, patch_in_force.worker_options))
    runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}),
                               _PATCH_OPTIONS: base64.b64encode(options).decode()}
    runtime_env["worker_process_setup_hook"] = f"{__name__}.{_patch_ray_worker.__name__}"
    return runtime_env


def _patch_ray_worker() -> None:
    """A Ray worker process of a patched script's job: patched for its whole life, with
    the script's patch options."""
    head_address, worker_options = pickle.loads(base64.b64decode(os.environ[_PATCH_OPTIONS]))
    Patch(head_address, worker_options)
