"""Run the examples in both loader modes and tabulate accuracy, loss and loss-curve identity.

    python examples/accuracy_table.py --epochs 10 --out examples/accuracy_table.md

Runs single device, DataParallel and DDP (``torchrun``, ``--nproc`` ranks), each with
``distribute_mode`` True and False and the same seed (``--repeats`` times each, the modes
taking turns to go first), each as its own process exactly as a user would start it. Then it prints a markdown table like the Dpex README's, and compares
the runs of each setup step by step: with the same seed, the two modes must produce the
same loss at every optimiser step and the same final weights, bit for bit. The exit status
is 1 if any pair differs.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common.report import RunRecord  # noqa: E402  (needs HERE on the path)

# setup name -> (label in the table, how to start it)
SETUPS = {
    "single": ("single device", "single_device.py"),
    "dp": ("DataParallel", "data_parallel.py"),
    "ddp": ("DDP", "ddp.py"),
}


@dataclass(frozen=True)
class ModeCheck:
    """How the two modes' runs of one setup compare."""

    setup: str
    steps: int
    identical_steps: bool
    max_abs_diff: float
    identical_weights: bool

    @property
    def ok(self) -> bool:
        return self.identical_steps and self.identical_weights


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    records: list[RunRecord] = []
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.setups:
            for repeat in range(args.repeats):
                # Each mode first in turn: neither always meets the cold caches.
                for mode in (True, False) if repeat % 2 == 0 else (False, True):
                    path = os.path.join(tmp, f"{key}-{mode}-{repeat}.json")
                    command = _command(key, mode, args, path)
                    print(f"\n$ {shlex.join(command)}", flush=True)
                    subprocess.run(command, check=True)
                    records.append(RunRecord.read_json(path))
    checks = compare_modes(records)
    text = build_markdown(records, checks, _reproduce_command(argv))
    print("\n" + text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        print(f"written to {args.out}")
    return 0 if all(c.ok for c in checks) else 1


def compare_modes(records: list[RunRecord]) -> list[ModeCheck]:
    """For each setup run in both modes: are the step losses and final weights of every run
    (every repeat, both modes) identical to those of its first run with ``True``?"""
    checks = []
    for setup in dict.fromkeys(r.setup for r in records):
        runs = [r for r in records if r.setup == setup]
        if {r.distribute_mode for r in runs} != {True, False}:
            continue
        first = next(r for r in runs if r.distribute_mode)
        a = [x for rank in first.step_losses for x in rank]
        same_steps, same_weights, worst = True, True, 0.0
        for other in runs:
            b = [x for rank in other.step_losses for x in rank]
            same_steps = same_steps and len(a) == len(b) and a == b
            worst = max(worst, max((abs(x - y) for x, y in zip(a, b)), default=0.0)
                        if len(a) == len(b) else float("inf"))
            same_weights = same_weights and other.weights_sha == first.weights_sha
        checks.append(ModeCheck(setup=setup, steps=len(a), identical_steps=same_steps,
                                max_abs_diff=worst, identical_weights=same_weights))
    return checks


def throughput(record: RunRecord) -> float:
    """Samples/s over every epoch of a run, the first included."""
    return (sum(e.samples_per_s * e.seconds for e in record.log)
            / sum(e.seconds for e in record.log))


def _spread(values: list[float]) -> str:
    """The median, and [min-max] where there are several."""
    middle = f"{statistics.median(values):.0f}"
    return middle if len(values) == 1 else f"{middle} [{min(values):.0f}-{max(values):.0f}]"


def build_markdown(records: list[RunRecord], checks: list[ModeCheck], command: str) -> str:
    """The accuracy table, the per-epoch loss table and the identity checks, as markdown."""
    first = records[0]
    lines = [
        f"Dataset: {first.dataset} ({first.train_samples} training images), device: "
        f"{first.device}, seed {first.seed}, {first.workers} loader workers per process; "
        f"Adam; torch {_version('torch')}, ray {_version('ray')}, {platform.machine()}.",
        f"Reproduce: `{command}`",
        "",
        "| Accuracy (%) | Loss | Setup | distribute_mode | Epochs | Learning rate | Batch size "
        "| Loss curve (sha256) | Final weights (sha256) | Samples/s, all epochs "
        "| Samples/s, each epoch | Data stall (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key in dict.fromkeys((r.setup, r.distribute_mode) for r in records):
        runs = [r for r in records if (r.setup, r.distribute_mode) == key]
        r, last = runs[0], runs[0].log[-1]
        setup = r.setup + (f" ({r.world_size} ranks)" if r.world_size > 1 else "")
        each = ", ".join(_spread([run.log[e].samples_per_s for run in runs])
                         for e in range(len(r.log)))
        stall = statistics.median(sum(e.wait_s for e in run.log) for run in runs)
        lines.append(
            f"| {100 * last.test_acc:.2f} | {last.train_loss:.4f} | {setup} | {r.distribute_mode} "
            f"| {r.epochs} | {r.lr:g} | {r.batch_size} | `{r.loss_curve_sha}` "
            f"| `{r.weights_sha}` | {_spread([throughput(run) for run in runs])} | {each} "
            f"| {stall:.1f} |"
        )
    firsts = [next(r for r in records if (r.setup, r.distribute_mode) == key)
              for key in dict.fromkeys((r.setup, r.distribute_mode) for r in records)]
    repeats = max(sum(1 for r in records if (r.setup, r.distribute_mode) == key)
                  for key in {(r.setup, r.distribute_mode) for r in records})
    lines += [
        "",
        "Accuracy and loss on the held-out test images; Loss is the training loss of the last "
        "epoch. The loss-curve hash covers the loss of every optimiser step (of every rank), "
        "as float64. Samples/s, all epochs: the training samples of every epoch over the "
        "seconds they took, the first epoch included (a cold process: it starts the workers "
        "and, with distribute_mode=True, Ray); each epoch's figure follows, first to last. "
        "Data stall is the time the training loop waited for the loader, over all epochs. "
        + (f"Each setup ran {repeats} times per mode, each a fresh process, the modes "
           "alternating which ran first; figures are medians [min-max] over the runs. "
           if repeats > 1 else "")
        + "Both depend on the machine; on a CPU-only machine training competes with the "
        "workers for the same cores.",
        "",
        "Training loss per epoch, every digit (of each setup and mode's first run; the "
        "check below compares every run):",
        "",
        "| Epoch | " + " | ".join(f"{r.setup}, {r.distribute_mode}" for r in firsts) + " |",
        "| --- |" + " --- |" * len(firsts),
    ]
    for i in range(max(len(r.log) for r in firsts)):
        cells = [repr(r.log[i].train_loss) if i < len(r.log) else "" for r in firsts]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    lines += ["", "distribute_mode True vs False, same seed:", ""]
    for c in checks:
        verdict = "identical" if c.ok else "DIFFERENT"
        steps = ("bitwise equal" if c.identical_steps
                 else f"differ (max |diff| {c.max_abs_diff:.3g})")
        weights = "equal" if c.identical_weights else "differ"
        lines.append(f"- {c.setup}: {verdict}: {c.steps} step losses {steps}, "
                     f"final weights {weights}.")
    return "\n".join(lines) + "\n"


def _command(key: str, mode: bool, args: argparse.Namespace, results: str) -> list[str]:
    script = os.path.join(HERE, SETUPS[key][1])
    launcher = [sys.executable]
    if key == "ddp":
        launcher += ["-m", "torch.distributed.run", "--standalone",
                     f"--nproc_per_node={args.nproc}"]
    options = [
        "--distribute-mode" if mode else "--no-distribute-mode",
        f"--epochs={args.epochs}", f"--workers={args.workers}",
        f"--batch-size={args.batch_size}", f"--lr={args.lr}", f"--seed={args.seed}",
        f"--head-address={args.head_address}", f"--data-dir={args.data_dir}",
        f"--results-json={results}",
    ]
    if args.limit is not None:
        options.append(f"--limit={args.limit}")
    return launcher + [script] + options


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setups", default="single,dp,ddp",
                        help="comma-separated, of: " + ", ".join(SETUPS))
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nproc", type=int, default=2, help="DDP ranks (torchrun)")
    parser.add_argument("--head-address", default="auto",
                        help="passed to each example ('embedded' for the embedded Ray)")
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per setup and mode, each mode first in turn")
    parser.add_argument("--out", default=None, help="also write the markdown here")
    args = parser.parse_args(argv)
    args.setups = [s.strip() for s in args.setups.split(",") if s.strip()]
    unknown = [s for s in args.setups if s not in SETUPS]
    if unknown:
        parser.error(f"unknown setup(s) {unknown}; choose from {list(SETUPS)}")
    return args


def _reproduce_command(argv: list[str] | None) -> str:
    words = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", "examples/accuracy_table.py", *words])


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    raise SystemExit(main())
