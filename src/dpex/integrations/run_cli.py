"""``dpex run [options] train.py ARGS...``: run a training script unchanged, with every torch
DataLoader it (or its framework) builds with workers on Ray (NOTE [ dpex Zero-Code Mode ],
zero_code.py). ``-m module`` runs a module, as ``python -m`` does."""

from __future__ import annotations

import argparse

from dpex.integrations import zero_code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.add_argument("--head-address", default=None,
                        help="the Ray cluster to use (default: DPEX_HEAD_ADDRESS, else 'auto': "
                             "RAY_ADDRESS, the cluster `ray start` recorded, or an embedded Ray)")
    parser.add_argument("--worker-options", default=None, metavar="JSON",
                        help="WorkerOptions fields as a JSON object, e.g. "
                             "'{\"num_cpus\": 1, \"autoscale\": {\"max_processes\": 8}}' "
                             "(default: DPEX_WORKER_OPTIONS)")
    parser.add_argument("-m", dest="module", action="store_true",
                        help="run TARGET as a module (python -m TARGET)")
    parser.add_argument("target", help="the training script (or module, with -m)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")


def run(args: argparse.Namespace) -> int:
    head_address, worker_options = zero_code.options_from_env()
    if args.head_address is not None:
        head_address = args.head_address
    if args.worker_options is not None:
        worker_options = zero_code.worker_options_from_json(args.worker_options)
    zero_code.run_script(args.target, args.args, module=args.module,
                         head_address=head_address, worker_options=worker_options)
    return 0
