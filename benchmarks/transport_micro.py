"""How a batch comes out of Ray's object store: torch tensors pickled in-band vs numpy arrays.

Puts one batch (``{"x": 32x3x224x224 float32, "y": int64[32]}`` by default, about 19 MB) in
the object store from a Ray actor, then times the trainer's ``ray.get`` of it, alternating
the two wire formats:

* ``torch``: the tensors as they are. Ray pickles a CPU tensor in-band through
  ``torch.storage._load_from_bytes``: the trainer copies the bytes out of the object store
  while unpickling, then ``torch.load`` copies them again into a new storage.
* ``numpy``: the tensors as numpy arrays (``tensor.numpy()``), which Ray pickles with
  protocol-5 out-of-band buffers; ``torch.from_numpy`` on the trainer is then a view of the
  shared-memory object, no copy.

Usage: python benchmarks/transport_micro.py [--batch 32] [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=32, help="images of 3x224x224 float32")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)

    import ray
    import torch

    from dpex import ray_session

    ray_session.connect(None)

    @ray.remote
    class Producer:
        def make(self, fmt: str, n: int):
            batch = {"x": torch.rand(n, 3, 224, 224), "y": torch.arange(n)}
            if fmt == "numpy":
                return {k: v.numpy() for k, v in batch.items()}
            return batch

    producer = Producer.remote()
    times: dict[str, list[float]] = {"torch": [], "numpy": []}
    cpu: dict[str, list[float]] = {"torch": [], "numpy": []}
    for i in range(args.repeats):
        for fmt in (("torch", "numpy") if i % 2 == 0 else ("numpy", "torch")):
            ref = producer.make.remote(fmt, args.batch)
            ray.wait([ref], fetch_local=True)
            c0, t0 = time.process_time(), time.perf_counter()
            obj = ray.get(ref)
            if fmt == "numpy":
                with warnings.catch_warnings():  # the arrays are read-only views of the store
                    warnings.simplefilter("ignore", UserWarning)
                    obj = {k: torch.from_numpy(v) for k, v in obj.items()}
            times[fmt].append(time.perf_counter() - t0)
            cpu[fmt].append(time.process_time() - c0)
            del obj, ref
    mb = args.batch * 3 * 224 * 224 * 4 / 1e6
    print(f"ray.get of a {mb:.1f} MB batch, median of {args.repeats} (alternating):")
    for fmt in times:
        print(f"  {fmt:6}: {1e3 * statistics.median(times[fmt]):7.2f} ms wall, "
              f"{1e3 * statistics.median(cpu[fmt]):7.2f} ms trainer CPU")
    ratio = statistics.median(times["torch"]) / statistics.median(times["numpy"])
    print(f"  numpy is {ratio:.0f}x faster to get")
    return 0


if __name__ == "__main__":
    sys.exit(main())
