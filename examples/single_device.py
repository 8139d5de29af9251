"""Train an image classifier on one device (a GPU if there is one, else the CPU) with dpex.

    python examples/single_device.py                          # Ray-actor workers
    python examples/single_device.py --no-distribute-mode     # torch's worker processes

The only dpex-specific line is the loader (see ``common/train.py``): ``dpex.DataLoader``
takes torch's arguments plus ``distribute_mode``.
"""

from __future__ import annotations

import torch

from common.cli import parse_args
from common.data import load_image_data
from common.model import SmallCNN
from common.ranks import Ranks
from common.train import datasets, eval_loader, fit, make_reproducible, train_loader


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    make_reproducible(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = load_image_data(args.data_dir, args.limit)
    train_set, test_set = datasets(data)
    print(f"single device ({device}): {data.name}, {len(train_set)} train / {len(test_set)} "
          f"test images; distribute_mode={args.distribute_mode}, {args.workers} workers",
          flush=True)
    model = SmallCNN(data.num_classes).to(device)  # after seeding: the same weights every run
    fit(model, train_loader(train_set, args), eval_loader(test_set, Ranks()), args,
        setup="single device", device=device, dataset_name=data.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
