"""``python train.py`` from a cold interpreter over a stream without ``state_dict`` (a
``webdataset`` pipeline's shape): torch vs dpex.

The coldstart workload of ``dpex bench`` (``src/dpex/bench/coldstart.py``) with its script's
``stream`` data: the same 2,048 tensors (32 batches of 64, 2 workers, torch's defaults
otherwise) from an ``IterableDataset`` each worker reads every other item of. Its workers
cannot move, so dpex runs them on processes forked from the trainer and starts no Ray
(NOTE [ dpex Local Start ]). Timed from just before each Popen; torch and dpex alternate,
the order reversed every other repeat; medians with min and max over the repeats.

Usage: python benchmarks/stream_coldstart.py [--repeats 5] [--out FILE.md]
"""

from __future__ import annotations

import argparse

from dpex.bench import coldstart
from dpex.bench.startup import alternating


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="also write the table to this markdown file")
    args = parser.parse_args()
    records = []
    for repeat, loader in alternating(coldstart.LOADERS, args.repeats):
        record = coldstart.run_script(loader, repeat, coldstart.ITEMS["small"], data="stream")
        records.append(record)
        print(f"  {loader:8} repeat {repeat}: first batch {record.first_s:.2f}s, exit "
              f"{record.process_s:.2f}s, Ray {record.ray}", flush=True)
    table = coldstart.markdown_table(coldstart.summarise(records), records)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
