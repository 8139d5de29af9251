"""Two trials, one stream: two models with different learning rates read the same batches,
and each batch is made once (``share=``), beside torch's DataLoader.

    python examples/shared_stream.py [--images 256] [--epochs 16] [--head-address embedded]

The trials of a sweep usually run as separate jobs on one cluster; here they take turns in
one script, so that it runs anywhere. Each trial has its own loader (the same dataset and
seed, ``share="lr-sweep"``) and its own model. The script checks that every batch of both
trials is bitwise torch's, and prints how many batches each trial read from the stream and
how many its workers made. On the embedded Ray of a cold start the first seconds run on
local processes, each trial on its own; the stream begins once the workers are on Ray.
"""

from __future__ import annotations

import tempfile

import torch

import dpex
from cached_decode import Photos, arguments, make_images


def loader_for(dataset, **kwargs):
    # One worker each: the two trials' worker processes fit a 2-core machine's embedded Ray
    # (a worker process asks for a CPU), where the stream begins once they are on Ray.
    return kwargs.pop("cls", dpex.DataLoader)(
        dataset, batch_size=32, shuffle=True, num_workers=1,
        generator=torch.Generator().manual_seed(0), **kwargs)


def main(argv: list[str] | None = None) -> int:
    args, head = arguments(argv, __doc__, images=256, epochs=16)
    with tempfile.TemporaryDirectory(prefix="dpex-example-") as folder:
        dataset = Photos(make_images(folder, args.images))
        reference = loader_for(dataset, cls=torch.utils.data.DataLoader, persistent_workers=True)
        expected = [list(reference) for _ in range(args.epochs)]
        trials = []
        for lr in (0.1, 0.01):
            loader = loader_for(dataset, distribute_mode=True, head_address=head,
                                persistent_workers=True, share="lr-sweep", cache=False)
            model = torch.nn.Linear(3 * 56 * 56, 10)
            trials.append((lr, loader, model, torch.optim.SGD(model.parameters(), lr=lr)))
        same = True
        for epoch in range(args.epochs):
            iterators = [iter(loader) for _, loader, _, _ in trials]
            losses = [0.0] * len(trials)
            for step, want in enumerate(expected[epoch]):
                for t, (lr, _, model, optimiser) in enumerate(trials):  # the trials take turns
                    images, labels = next(iterators[t])
                    same &= torch.equal(images, want[0]) and torch.equal(labels, want[1])
                    small = torch.nn.functional.avg_pool2d(images, 4).flatten(1)
                    loss = torch.nn.functional.cross_entropy(model(small), labels)
                    optimiser.zero_grad()
                    loss.backward()
                    optimiser.step()
                    losses[t] += loss.item()
            print(f"epoch {epoch}: " + ", ".join(
                f"lr {lr}: loss {losses[t] / len(expected[epoch]):.3f}"
                for t, (lr, *_rest) in enumerate(trials)), flush=True)
        print(f"bitwise equal to torch's batches: {same}")
        for lr, loader, _, _ in trials:
            share = loader.stats().share
            print(f"lr {lr}: {share['from_stream']} batches read from the stream, "
                  f"{share['computed']} made by its workers")
        del trials, iterators
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
