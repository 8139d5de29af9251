"""A training script that ends one of the ways a training process ends (benchmarks/ending.py,
tests/test_ending.py).

    python benchmarks/ending_script.py END [--loader dpex|torch] [--framework plain|lightning|
        accelerate] [--handler] [--no-local-start] [--address HOST:PORT] [--autoscale]

END is one of ``exit`` (runs its 3 epochs), ``exception`` (raises in epoch 2), ``break``
(leaves epoch 2 early, then exits), ``os_exit`` (``os._exit(3)`` in epoch 2), or ``wait``:
it prints ``READY`` in epoch 2 and goes on slowly, for the test to send SIGINT, SIGTERM
or SIGKILL. ``--handler`` installs, first thing, a SIGTERM handler as preemption-aware scripts have:
it logs, and the loop stops at its next step (the script then ends normally). The loader takes torch's defaults, plus
``distribute_mode=True`` for dpex: non-persistent workers, no ``head_address``. Run to its
end (``exit``) with dpex on a plain loop, it prints the nodes its loader loaded on
(``NODES [...]``) before it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def main() -> None:
    args = _parse()
    if args.handler:
        signal.signal(signal.SIGTERM, _on_sigterm)
    import dpex

    dataset = Items()
    kwargs = {}
    if args.loader == "dpex":
        kwargs["distribute_mode"] = True
        if args.address:
            kwargs["head_address"] = args.address
        if args.no_local_start:
            kwargs["worker_options"] = dpex.WorkerOptions(local_start=False)
        if args.autoscale:  # grow the cluster through its autoscaler when the loop starves
            kwargs["worker_options"] = dpex.WorkerOptions(autoscale=dpex.Autoscale(
                min_processes=1, max_processes=2, window_s=1.0))
    loader = dpex.DataLoader(dataset, batch_size=8, shuffle=True, num_workers=2, **kwargs)
    if args.framework == "lightning":
        _lightning(loader, args.end)
    elif args.framework == "accelerate":
        from accelerate import Accelerator

        _loop(Accelerator(cpu=True).prepare(loader), args.end)
    else:
        _loop(loader, args.end)
    if args.end == "exit" and args.loader == "dpex" and args.framework == "plain":
        print("NODES", json.dumps(sorted(loader.stats().per_node)), flush=True)  # where it loaded
    if args.end == "exit":
        _ending()
    print("done", flush=True)


def _ending() -> None:
    """The moment the script starts to end (the harness times its exit from here)."""
    print(f"ENDING {time.time():.3f}", flush=True)


class Items:
    """48 items of 20 ms each that draw from torch's RNG (a map-style dataset)."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int):
        import torch

        time.sleep(0.02)
        return {"x": torch.full((3,), float(i)) + torch.rand(3), "y": i}


_preempted = False


def _on_sigterm(signum, frame) -> None:
    """A preemption handler: it logs, and the loop stops at its next step."""
    global _preempted
    print("handler: SIGTERM", flush=True)
    _preempted = True


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("end", choices=["exit", "exception", "break", "os_exit", "wait"])
    parser.add_argument("--loader", choices=["dpex", "torch"], default="dpex")
    parser.add_argument("--framework", choices=["plain", "lightning", "accelerate"],
                        default="plain")
    parser.add_argument("--handler", action="store_true")
    parser.add_argument("--no-local-start", action="store_true")
    parser.add_argument("--address")
    parser.add_argument("--autoscale", action="store_true")
    return parser.parse_args()


def _step(end: str, epoch: int, step: int) -> bool:
    """What happens at this step of the loop; False: leave the epoch."""
    if epoch == 1 and step == 2:
        if end in ("exception", "os_exit", "break"):
            _ending()
        if end == "exception":
            raise RuntimeError("the training step failed")
        if end == "os_exit":
            os._exit(3)
        if end == "break":
            return False
        if end == "wait":
            print("READY", flush=True)
    if end == "wait" and epoch >= 1:
        time.sleep(0.2)  # a slow training step: the test's signal comes meanwhile
    return not _preempted


def _loop(loader, end: str) -> None:
    for epoch in range(3 if end != "wait" else 100):
        for step, _batch in enumerate(loader):
            if not _step(end, epoch, step):
                break
        if (end == "break" and epoch == 1) or _preempted:
            return


def _lightning(loader, end: str) -> None:
    import lightning as L
    import torch

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            if not _step(end, self.current_epoch, batch_idx):
                return -1  # Lightning: skip the rest of this epoch
            return self.layer(batch["x"]).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=3 if end != "wait" else 100,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Model(), train_dataloaders=loader)


if __name__ == "__main__":
    sys.exit(main())
