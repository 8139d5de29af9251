"""The helper process of ``dpex.embedded_head`` (its NOTE): start the embedded Ray head,
print its address, and shut it down when stdin closes.

Run as a plain script, not as part of the ``dpex`` package, so that it imports Ray and
not torch: ``python _head_process.py NICENESS``.
"""

import importlib.util
import os
import sys


def _compat():
    """dpex's ``compat`` module, loaded alone (``import dpex`` would import torch)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compat.py")
    spec = importlib.util.spec_from_file_location("_dpex_compat", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    import ray

    context = _compat().start_embedded_ray(int(sys.argv[1]))
    port = context.address_info["gcs_address"].rsplit(":", 1)[1]
    print(f"127.0.0.1:{port}", flush=True)
    sys.stdin.read()  # until the trainer closes it, or dies
    ray.shutdown()


if __name__ == "__main__":
    main()
