"""The training loop the three examples share: reproducible setup, loaders, fit.

Reproducibility is what lets the accuracy table compare ``distribute_mode=True`` and
``False`` bit for bit: the model's initial weights and dropout come from the seeded global
RNG, the sampler and the loader's workers from seeded generators, and the arithmetic is
deterministic. If the two loaders hand out the same bytes, the loss curves are identical; if
a single pixel differed anywhere, they would drift apart.
"""

from __future__ import annotations

import argparse
import os
import random
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, Sampler, Subset
from tqdm import tqdm

import dpex
from common.augment import EvalTransform, TrainAugment
from common.data import ImageClassification, ImageData
from common.ranks import Ranks
from common.report import EpochLog, RunRecord, fingerprint_weights

EVAL_BATCH_SIZE = 256


def make_reproducible(seed: int) -> None:
    """Seed the trainer's RNGs and make its arithmetic deterministic."""
    # cuBLAS needs this to be deterministic; it must be set before CUDA starts.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    # One intra-op thread: CPU reductions always add in the same order, and the cores are
    # left to the loader's workers.
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def datasets(data: ImageData) -> tuple[Dataset, Dataset]:
    """The augmented training set and the plain test set."""
    train = ImageClassification(
        data.train_images, data.train_labels,
        TrainAugment(data.mean, data.std, flip=data.flip_invariant),
    )
    test = ImageClassification(
        data.test_images, data.test_labels, EvalTransform(data.mean, data.std)
    )
    return train, test


def train_loader(
    dataset: Dataset,
    args: argparse.Namespace,
    *,
    batch_size: int | None = None,
    sampler: Sampler | None = None,
    rank: int = 0,
) -> dpex.DataLoader:
    """The training loader: ``dpex.DataLoader`` used exactly like torch's, plus its mode."""
    return dpex.DataLoader(
        dataset,
        batch_size=batch_size or args.batch_size,
        shuffle=sampler is None,
        sampler=sampler,
        num_workers=args.workers,
        # Workers (torch processes or Ray actors) live across epochs: no restart per epoch.
        persistent_workers=args.workers > 0,
        # Seeds the shuffle and the workers' augmentation; one stream per rank.
        generator=torch.Generator().manual_seed(args.seed + rank),
        pin_memory=torch.cuda.is_available(),
        distribute_mode=args.distribute_mode,
        head_address=args.head_address,
    )


def eval_loader(dataset: Dataset, ranks: Ranks) -> dpex.DataLoader:
    """The test loader: this rank's share (``rank::world_size``), no augmentation, in-process.

    Evaluation only normalises, which costs less than shipping samples to a worker would.
    """
    if ranks.world_size > 1:
        dataset = Subset(dataset, range(ranks.rank, len(dataset), ranks.world_size))
    return dpex.DataLoader(dataset, batch_size=EVAL_BATCH_SIZE, shuffle=False)


def fit(
    model: nn.Module,
    train: dpex.DataLoader,
    test: dpex.DataLoader,
    args: argparse.Namespace,
    *,
    setup: str,
    device: torch.device,
    dataset_name: str,
    ranks: Ranks | None = None,
) -> RunRecord:
    """Train for ``args.epochs`` epochs, printing a line per epoch; return the record.

    ``model`` may be wrapped (DataParallel, DDP); its ``.module`` is then fingerprinted.
    """
    ranks = ranks or Ranks()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    record = RunRecord(
        setup=setup, distribute_mode=args.distribute_mode, epochs=args.epochs, lr=args.lr,
        batch_size=args.batch_size, workers=args.workers, seed=args.seed,
        world_size=ranks.world_size, device=str(device), dataset=dataset_name,
        train_samples=int(ranks.sum([len(train.sampler)])[0]),
    )
    steps: list[float] = []
    for epoch in range(1, args.epochs + 1):
        if hasattr(train.sampler, "set_epoch"):
            train.sampler.set_epoch(epoch - 1)  # DistributedSampler: a new shuffle per epoch
        started = time.perf_counter()
        loss_sum, correct, count = _train_epoch(model, train, optimizer, device, steps,
                                                _progress(args, ranks, epoch))
        seconds = time.perf_counter() - started
        test_loss, test_correct, test_count = _evaluate(model, test, device)
        wait = train.stats().epoch_wait_s
        totals = ranks.sum([loss_sum, correct, count, test_loss, test_correct, test_count, wait])
        seconds = max(ranks.gather(seconds))
        log = EpochLog(
            epoch=epoch, train_loss=totals[0] / totals[2], train_acc=totals[1] / totals[2],
            test_loss=totals[3] / totals[5], test_acc=totals[4] / totals[5], seconds=seconds,
            samples_per_s=totals[2] / seconds, wait_s=totals[6] / ranks.world_size,
        )
        record.log.append(log)
        if ranks.is_main:
            print(log.line(args.epochs), flush=True)
    record.step_losses = ranks.gather(steps)
    record.weights_sha = fingerprint_weights(getattr(model, "module", model))
    record.loader_summary = train.stats().summary()
    record.ray_cluster = _ray_cluster() if args.distribute_mode and args.workers else ""
    if ranks.is_main:
        print(record.summary(), flush=True)
        if args.results_json:
            record.write_json(args.results_json)
    return record


def _train_epoch(model, loader, optimizer, device, steps: list[float], progress: dict):
    """One pass over ``loader``; appends each step's loss to ``steps``."""
    model.train()
    loss_sum, correct, count = 0.0, 0, 0
    bar = tqdm(loader, **progress)
    for images, labels in bar:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        logits = model(images)
        loss = nn.functional.cross_entropy(logits, labels)
        loss.backward()
        optimizer.step()
        value = loss.item()
        steps.append(value)
        loss_sum += value * len(labels)
        correct += int((logits.argmax(1) == labels).sum())
        count += len(labels)
        bar.set_postfix(loss=f"{value:.4f}", refresh=False)
    return loss_sum, correct, count


@torch.no_grad()
def _evaluate(model, loader, device) -> tuple[float, int, int]:
    """Summed loss, correct predictions and sample count over ``loader``."""
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        logits = model(images)
        loss_sum += float(nn.functional.cross_entropy(logits, labels, reduction="sum"))
        correct += int((logits.argmax(1) == labels).sum())
        count += len(labels)
    return loss_sum, correct, count


def _progress(args: argparse.Namespace, ranks: Ranks, epoch: int) -> dict:
    """tqdm's options: rank 0 only; by default only when writing to a terminal."""
    disable = True if not ranks.is_main else (None if args.progress is None else not args.progress)
    return dict(desc=f"epoch {epoch}/{args.epochs}", unit="batch", leave=False,
                dynamic_ncols=True, disable=disable)


def _ray_cluster() -> str:
    """Which Ray cluster the loader's workers ran on, for the summary."""
    import ray

    from dpex.ray_session import embedded, owns_ray_session

    if not ray.is_initialized():
        # A cold process on a busy machine: the embedded Ray starts on what the loop
        # leaves of the cores, and a run this short may end before it is up.
        return ("none yet: the workers ran on local processes while the embedded Ray "
                "started" if embedded.started() else "")
    address = ray.get_runtime_context().gcs_address
    return f"{address} ({'embedded, started by this process' if owns_ray_session() else 'joined'})"
