"""``import dpex`` reads no Ray, and neither do torch's workers in ``distribute_mode=False``
(NOTE [ dpex Import Is Light ] in dpex/__init__.py): under forkserver or spawn, each
worker of each epoch imports dpex to unpickle its collate wrapper, and ``import ray`` there
cost about 0.45 s a worker, every epoch."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import SRC_DIR, user_env

SCRIPT = """
import json, multiprocessing, sys
import torch

class Seen(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):  # in a torch worker: what it imported
        return torch.tensor([int("ray" in sys.modules), int("dpex" in sys.modules)])

if __name__ == "__main__":
    import dpex
    after_import = "ray" in sys.modules
    from dpex import Cache, DataLoader  # names load on first use
    context = multiprocessing.get_context(sys.argv[1])
    if sys.argv[1] == "forkserver":
        context.set_forkserver_preload(["torch"])
    loader = DataLoader(Seen(), batch_size=2, num_workers=2, multiprocessing_context=context)
    batches = [b.tolist() for b in loader]
    print(json.dumps({"after_import": after_import, "batches": batches,
                      "names": [Cache.__name__, dpex.DataLoader is DataLoader,
                                dpex.distributed.__name__, dpex.compat.__name__],
                      "missing": not hasattr(dpex, "no_such_name")}))
"""


def run(folder, context: str) -> dict:
    """The script as a user runs a file (its workers find ``Seen`` in it)."""
    script = folder / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), context], capture_output=True,
                          text=True, timeout=120, cwd=folder, env=user_env(PYTHONPATH=SRC_DIR))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_dpex_and_torchs_workers_read_no_ray(tmp_path):
    out = run(tmp_path, "forkserver")
    assert out["after_import"] is False
    # Each sample: [ray imported, dpex imported] in the worker that made it. dpex, for its
    # collate wrapper; Ray, never.
    assert out["batches"] == [[[0, 1], [0, 1]], [[0, 1], [0, 1]]], out
    # The public names, and the package's modules as attributes (a module a worker
    # unpickles from may read ``dpex.compat`` after a bare ``import dpex``).
    assert out["names"] == ["Cache", True, "dpex.distributed", "dpex.compat"], out
    assert out["missing"]
