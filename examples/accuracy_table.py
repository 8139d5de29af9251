"""Run the examples in both loader modes and tabulate accuracy, loss and loss-curve identity.

    python examples/accuracy_table.py --epochs 10 --out examples/accuracy_table.md

Runs single device, DataParallel and DDP (``torchrun``, ``--nproc`` ranks), each with
``distribute_mode`` True and False and the same seed, each as its own process exactly as a
user would start it. Then it prints a markdown table like the Dpex README's, and compares
the runs of each setup step by step: with the same seed, the two modes must produce the
same loss at every optimiser step and the same final weights, bit for bit. The exit status
is 1 if any pair differs.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
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
            for mode in (True, False):
                path = os.path.join(tmp, f"{key}-{mode}.json")
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
    """For each setup run in both modes: are the step losses and final weights identical?"""
    checks = []
    for setup in dict.fromkeys(r.setup for r in records):
        by_mode = {r.distribute_mode: r for r in records if r.setup == setup}
        if set(by_mode) != {True, False}:
            continue
        on, off = by_mode[True], by_mode[False]
        a = [x for rank in on.step_losses for x in rank]
        b = [x for rank in off.step_losses for x in rank]
        diffs = [abs(x - y) for x, y in zip(a, b)]
        checks.append(ModeCheck(
            setup=setup,
            steps=len(a),
            identical_steps=len(a) == len(b) and a == b,
            max_abs_diff=max(diffs, default=0.0) if len(a) == len(b) else float("inf"),
            identical_weights=on.weights_sha == off.weights_sha,
        ))
    return checks


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
        "| Loss curve (sha256) | Final weights (sha256) | Samples/s | Data stall (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in records:
        last = r.log[-1]
        setup = r.setup + (f" ({r.world_size} ranks)" if r.world_size > 1 else "")
        throughput = sum(e.samples_per_s for e in r.log[1:] or r.log) / len(r.log[1:] or r.log)
        stall = sum(e.wait_s for e in r.log)
        lines.append(
            f"| {100 * last.test_acc:.2f} | {last.train_loss:.4f} | {setup} | {r.distribute_mode} "
            f"| {r.epochs} | {r.lr:g} | {r.batch_size} | `{r.loss_curve_sha}` "
            f"| `{r.weights_sha}` | {throughput:.0f} | {stall:.1f} |"
        )
    lines += [
        "",
        "Accuracy and loss on the held-out test images; Loss is the training loss of the last "
        "epoch. The loss-curve hash covers the loss of every optimiser step (of every rank), "
        "as float64. Samples/s averages the epochs after the first (which includes starting "
        "the workers); data stall is the time the training loop waited for the loader, over "
        "all epochs. Both depend on the machine; on a CPU-only machine training competes with "
        "the workers for the same cores.",
        "",
        "Training loss per epoch, every digit:",
        "",
        "| Epoch | " + " | ".join(f"{r.setup}, {r.distribute_mode}" for r in records) + " |",
        "| --- |" + " --- |" * len(records),
    ]
    for i in range(max(len(r.log) for r in records)):
        cells = [repr(r.log[i].train_loss) if i < len(r.log) else "" for r in records]
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
