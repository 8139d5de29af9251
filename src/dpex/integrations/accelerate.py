"""HF accelerate: prepared dpex loaders keep loading on Ray.

``accelerate.Accelerator.prepare(loader)`` rebuilds every DataLoader as its own
``DataLoaderShard`` around a new ``torch.utils.data.DataLoader`` built from torch's
constructor arguments only, so a dpex loader becomes torch's (plain accelerate gets one
warning saying so: ``dpex.loader.rebuilt``). accelerate offers no
hook for the class it builds. Here, after accelerate has prepared a loader its own way
(sharding across processes, device placement, RNG synchronisation), the torch loader
inside the prepared one (its public ``base_dataloader``) is replaced by a dpex loader built
from exactly the same arguments plus the original's ``distribute_mode``, ``head_address``
and ``worker_options``. Everything accelerate does around it stays accelerate's:

* ``Accelerator``: accelerate's, with ``prepare_data_loader`` (so ``prepare``) and
  ``skip_first_batches`` keeping dpex loaders dpex's;
* ``prepare(accelerator, *objects)``: the same for an Accelerator created elsewhere.

The prepared loader's ``state_dict()`` / ``load_state_dict()`` are dpex's (accelerate keeps
the state of the batches handed out, one batch behind its look-ahead), so a mid-epoch
resume is bitwise. With ``DataLoaderConfiguration(use_stateful_dataloader=True)``,
``save_state`` / ``load_state`` keep it, as they keep torchdata's loader's (torchdata is not
needed), also when the job comes back on another number of processes. A result dpex
cannot reach inside (accelerate's XLA wrapper) falls back to torch's loader, with one
warning saying so.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import accelerate
from accelerate.data_loader import DataLoaderAdapter

from dpex.dataloader import DataLoader as DpexDataLoader
from dpex.dataloader import TorchDataLoader
from dpex.integrations import build_back
from dpex.loader import rebuilt

__all__ = ["Accelerator", "prepare"]

_warned = False


class Accelerator(accelerate.Accelerator):
    """``accelerate.Accelerator`` whose prepared dpex loaders still load on Ray.

    Takes accelerate's arguments. Loaders that are not dpex loaders are prepared exactly as
    accelerate prepares them.

    Example:
        >>> from dpex.integrations.accelerate import Accelerator  # doctest: +SKIP
        >>> accelerator = Accelerator()  # doctest: +SKIP
        >>> model, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # doctest: +SKIP
    """

    def prepare_data_loader(self, data_loader, device_placement=None, slice_fn_for_dispatch=None):
        stateful = (getattr(self, "use_stateful_dataloader", False)  # accelerate >= 0.34
                    and isinstance(data_loader, DpexDataLoader))
        with rebuilt.rebuild_expected(), _stateful_off(self, stateful):
            prepared = super().prepare_data_loader(data_loader, device_placement,
                                                   slice_fn_for_dispatch)
        prepared = keep_on_ray(prepared, data_loader)
        if stateful and isinstance(prepared, DataLoaderAdapter):
            # save_state / load_state keep the dpex loader's state, as they keep torchdata's
            # StatefulDataLoader's (which a dpex loader does not need).
            prepared.use_stateful_dataloader = True
        return prepared

    def skip_first_batches(self, dataloader, num_batches: int = 0):
        with rebuilt.rebuild_expected():
            skipped = super().skip_first_batches(dataloader, num_batches)
        return keep_on_ray(skipped, getattr(dataloader, "base_dataloader", dataloader))


def prepare(accelerator: accelerate.Accelerator, *objects: Any) -> Any:
    """``accelerator.prepare(*objects)``, with dpex loaders kept on Ray.

    For an Accelerator you did not create (a framework's). Returns what
    ``accelerator.prepare`` returns: one object, or a tuple in the order given.
    """
    with rebuilt.rebuild_expected():
        prepared = accelerator.prepare(*objects)
    results = prepared if len(objects) > 1 else (prepared,)
    kept = tuple(keep_on_ray(p, o) for p, o in zip(results, objects))
    return kept if len(objects) > 1 else kept[0]


def keep_on_ray(prepared: Any, original: Any) -> Any:
    """Put the dpex loader ``original`` back inside accelerate's ``prepared`` loader.

    ``prepared`` is returned as is when ``original`` is not a dpex loader.
    """
    if not isinstance(original, DpexDataLoader) or prepared is original:
        return prepared
    if isinstance(prepared, DataLoaderAdapter):  # DataLoaderShard, DataLoaderDispatcher, ...
        prepared.base_dataloader = build_back.dpex_like(prepared.base_dataloader, original)
        # accelerate before 1.13 "adjusts" a loader's state under DDP by rewriting torchdata
        # StatefulDataLoader's keys, which a dpex state does not have (KeyError); from 1.13
        # it leaves a state without them alone. The method is accelerate's documented hook
        # for a custom correction: a dpex state needs none (it records what was handed out).
        prepared.adjust_state_dict_for_prefetch = _no_adjustment
        if hasattr(prepared, "dl_state_dict"):
            prepared.dl_state_dict = prepared.base_dataloader.state_dict()
        return prepared
    if type(prepared) is TorchDataLoader:  # skip_first_batches of a plain loader
        return build_back.dpex_like(prepared, original)
    _warn_fallback(prepared)
    return prepared


def _no_adjustment() -> None:
    pass


@contextlib.contextmanager
def _stateful_off(accelerator: accelerate.Accelerator, off: bool):
    """accelerate builds its loader around torchdata's StatefulDataLoader where
    ``use_stateful_dataloader`` is set (an ImportError without torchdata); dpex replaces
    that loader with its own, so it is built around torch's."""
    config = accelerator.dataloader_config
    if not off:
        yield
        return
    config.use_stateful_dataloader = False
    try:
        yield
    finally:
        config.use_stateful_dataloader = True


def _warn_fallback(prepared: Any) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(
        f"dpex: accelerate returned a {type(prepared).__name__}, inside which dpex cannot put "
        "its loader back: this loader now runs torch's worker processes, not Ray actors. "
        "Iterate the dpex loader yourself (with a DistributedSampler) for Ray workers.",
        stacklevel=3,
    )
