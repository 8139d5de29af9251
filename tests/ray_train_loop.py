"""The ``train_loop_per_worker`` of tests/test_ray_train.py, run by a real ``TorchTrainer``.

Each rank loads 2 epochs of noisy samples through a loader prepared for Ray Train, as Ray's
recipe does: ``config["kind"]`` is ``"torch"`` (torch's loader, Ray's
``prepare_data_loader``) or ``"dpex"`` (a dpex loader, ``dpex.integrations.ray_train``'s).
After every batch it reports a checkpoint holding the batches trained so far and, for dpex,
``loader.state_dict()``; a restarted rank resumes from the last one. Run by
tests/ray_train_script.py. ``config["die_at"]``
(epoch, step) makes rank 0 of the first attempt exit there, as a killed worker would. At
the end each rank writes what it trained, and facts about its loader, to ``config["out"]``;
with ``config["reference"]``, also the batches of Ray's recipe in that rank (``"torch"``).
``config["stop_at"]`` (epoch, step) ends every rank's loop after that step's checkpoint (a
job stopped there), and ``config["resized"]`` marks a job restored from another job's
checkpoint on another number of workers (tests/ray_train_resize_script.py), which reports
as each epoch ends, not after every batch: Ray Train's controller takes a worker's next
report only at its next health check, every 2 s (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``), so
a report a batch held that job's one worker 2 s a batch, 36 s in all.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings

import torch
import ray.train
import ray.train.torch
from helpers import AugmentedDataset

import dpex
from dpex.integrations.ray_train import prepare_data_loader

EPOCHS = 2


def train_loop(config: dict) -> None:
    rank = ray.train.get_context().get_world_rank()
    # Ray's recipe for a run that repeats: seeds this process, and has prepare_data_loader
    # give the loader a seeded generator and worker_init_fn.
    ray.train.torch.enable_reproducibility(seed=7)
    loader = _prepared(config["kind"])
    iterated = getattr(loader, "_dataloader", loader)  # inside Ray's device wrapper, if any
    facts = {"type": type(iterated).__module__ + "." + type(iterated).__qualname__,
             "on_ray": isinstance(iterated, dpex.DataLoader) and iterated.distribute_mode,
             "ray_prepare_warnings": _what_rays_prepare_says() if rank == 0 else []}
    epoch, trained = 0, []
    checkpoint = ray.train.get_checkpoint()
    facts["resumed"] = checkpoint is not None
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            own = os.path.join(folder, f"rank{rank}.pt")
            # A rank the saving job did not have (resized) loads rank 0's: ranks step together.
            saved = torch.load(own if os.path.exists(own) else os.path.join(folder, "rank0.pt"),
                               weights_only=False)
        epoch, trained = saved["epoch"], saved["trained"]
        loader.load_state_dict(saved["loader"])
        facts["resumed_at"] = [epoch, len(trained)]
        if config.get("resized"):
            trained = []  # this job's batches only: another job's ranks trained the rest
    stop_at = tuple(config["stop_at"]) if config.get("stop_at") else None
    for epoch in range(epoch, EPOCHS):
        if ray.train.get_context().get_world_size() > 1:  # Ray's recipe: a DistributedSampler
            loader.sampler.set_epoch(epoch)
        step = None  # a checkpoint made as the epoch ended leaves it no batch
        for step, batch in enumerate(loader):
            if (rank == 0 and checkpoint is None and config["die_at"] is not None
                    and (epoch, len(trained) % len(loader)) == tuple(config["die_at"])):
                os._exit(1)  # mid-epoch, after the checkpoint of the batch before
            trained.append(batch)
            # The loader's state continues this epoch (after its last batch, with its empty
            # rest, as torchdata's StatefulDataLoader's does), so the epoch is saved as is.
            if not config.get("resized"):
                _report(rank, epoch, trained, loader, config["kind"])
            if (epoch, step) == stop_at:
                break  # the job is stopped here (preempted), after this step's checkpoint
        if (epoch, step) == stop_at:
            break
        if config.get("resized"):  # a job nothing stops again reports as each epoch ends
            _report(rank, epoch, trained, loader, config["kind"])
    if facts["on_ray"]:
        stats = iterated.stats()
        facts["nodes"] = sorted(stats.per_node)
        facts["delivered"], facts["events"] = stats.batches, [
            e.reason for e in stats.scaling_events]
    torch.save(trained, os.path.join(config["out"], f"{config['kind']}-rank{rank}.pt"))
    if config.get("reference"):  # and, in the same rank, what Ray's recipe gives
        torch.save(_recipe_batches(), os.path.join(config["out"], f"torch-rank{rank}.pt"))
    with open(os.path.join(config["out"], f"{config['kind']}-rank{rank}.json"), "w") as f:
        json.dump(facts, f)


def _prepared(kind: str):
    options = dict(batch_size=4, shuffle=True, num_workers=2)
    if kind == "torch":
        return ray.train.torch.prepare_data_loader(
            torch.utils.data.DataLoader(AugmentedDataset(48), **options))
    return prepare_data_loader(dpex.DataLoader(AugmentedDataset(48), **options,
                                               distribute_mode=True))


def _recipe_batches() -> list:
    """The reference: Ray's recipe (torch's DataLoader, Ray's ``prepare_data_loader``) in this
    rank, seeded as ``train_loop`` seeds, over every epoch."""
    ray.train.torch.enable_reproducibility(seed=7)
    loader = _prepared("torch")
    batches = []
    for epoch in range(EPOCHS):
        if ray.train.get_context().get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        batches.extend(loader)
    return batches


def _report(rank: int, epoch: int, trained: list, loader, kind: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        if kind == "dpex":
            state = {"epoch": epoch, "trained": trained, "loader": loader.state_dict()}
            torch.save(state, os.path.join(folder, f"rank{rank}.pt"))
            ray.train.report({"batches": len(trained)},
                             checkpoint=ray.train.Checkpoint.from_directory(folder))
        else:
            ray.train.report({"batches": len(trained)})


def _what_rays_prepare_says() -> list[str]:
    """Ray's own prepare_data_loader on a dpex loader: what it warns (not iterated)."""
    on_ray = dpex.DataLoader(AugmentedDataset(48), batch_size=4, shuffle=True, num_workers=2,
                             distribute_mode=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rebuilt = ray.train.torch.prepare_data_loader(on_ray, move_to_device=False)
        ray.train.torch.prepare_data_loader(on_ray, move_to_device=False)  # once only
    return [type(rebuilt).__name__] + [str(w.message) for w in caught
                                       if "dpex" in str(w.message)]
