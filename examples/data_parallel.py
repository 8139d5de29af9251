"""Train an image classifier with ``nn.DataParallel`` over all visible GPUs, with dpex.

    python examples/data_parallel.py                          # Ray-actor workers
    python examples/data_parallel.py --no-distribute-mode     # torch's worker processes

DataParallel splits each batch across the GPUs of this one process; the loader is unchanged.
With no GPU, ``nn.DataParallel`` simply runs the wrapped module on the CPU (one replica), so
the example still runs, and says so.
"""

from __future__ import annotations

import torch
from torch import nn

from common.cli import parse_args
from common.data import load_image_data
from common.model import SmallCNN
from common.ranks import Ranks
from common.train import datasets, eval_loader, fit, make_reproducible, train_loader


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    make_reproducible(args.seed)
    gpus = torch.cuda.device_count()
    device = torch.device("cuda:0" if gpus else "cpu")
    data = load_image_data(args.data_dir, args.limit)
    train_set, test_set = datasets(data)
    if gpus:
        where = f"{gpus} GPU(s), each batch split across them"
    else:
        where = "no GPU: nn.DataParallel runs the module on the CPU as is (one replica)"
    print(f"DataParallel ({where}): {data.name}, {len(train_set)} train / {len(test_set)} "
          f"test images; distribute_mode={args.distribute_mode}, {args.workers} workers",
          flush=True)
    # DataParallel wants the module on its first device; with no GPU it uses none.
    model = nn.DataParallel(SmallCNN(data.num_classes).to(device))
    fit(model, train_loader(train_set, args), eval_loader(test_set, Ranks()), args,
        setup="DataParallel", device=device, dataset_name=data.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
