"""``dpex cache ls`` / ``dpex cache rm``: this user's caches, in the Ray cluster's object
stores (their owners, owner.py) and in this node's cache folder (disk.py)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import time
from typing import Any

from dpex.cache.disk import folder_usage
from dpex.cache.options import default_folder, user
from dpex.cache.owner import RAY_NAMESPACE
from dpex.cache.private_folder import CacheFolderError, checked_folder


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("ls", help="list this user's caches")
    rm = sub.add_parser("rm", help="remove caches: their entries in memory and on this node's disk")
    rm.add_argument("namespaces", nargs="*", help="namespaces (or their first characters) to remove")
    rm.add_argument("--all", action="store_true", help="remove every cache of this user")
    for p in (ls, rm):
        p.add_argument("--address", default="auto",
                       help="the Ray cluster (default: the one this machine belongs to, if any)")
        p.add_argument("--disk-dir", default=None,
                       help=f"the cache folder on this node (default: {default_folder()})")
        p.add_argument("--disk-shared-with-group", action="store_true",
                       help="the folder is shared with its group (dpex.Cache's "
                            "disk_shared_with_group): trust its group too")
    ls.add_argument("--json", action="store_true", help="one JSON list, for scripts")


def run(args: argparse.Namespace) -> int:
    folder = checked_or_none(args.disk_dir or default_folder(), args.disk_shared_with_group)
    owners = _owners(args.address)
    caches = [dict(where="memory", **info) for _, info in owners] + _folders(folder)
    if args.action == "ls":
        if args.json:
            print(json.dumps(caches))
        else:
            _print_table(caches)
        return 0
    if not args.all and not args.namespaces:
        print("dpex cache rm: name the namespaces to remove, or --all", file=sys.stderr)
        return 2
    chosen = [c for c in caches if args.all or any(c["namespace"].startswith(n)
                                                    for n in args.namespaces)]
    import ray

    for handle, info in owners:
        if any(c is not None and c.get("where") == "memory" and c["namespace"] == info["namespace"]
               and c["node"] == info["node"] for c in chosen):
            ray.kill(handle, no_restart=True)
    for cache in chosen:
        if cache["where"] == "disk" and folder is not None:
            shutil.rmtree(os.path.join(folder, cache["namespace"]), ignore_errors=True)
    print(f"removed {len(chosen)} cache(s); folders on other nodes expire with their TTL",
          file=sys.stderr)
    return 0


def _owners(address: str) -> list[tuple[Any, dict]]:
    """(handle, describe()) of this user's owners in the cluster; none without a cluster
    (as a loader would find it: ``RAY_ADDRESS``, the one ``ray start`` recorded)."""
    import ray

    from dpex import ray_session

    if ray_session.would_start_embedded(address):  # no cluster: an embedded Ray ends with its process
        print("dpex cache: no Ray cluster on this machine; this node's disk only",
              file=sys.stderr)
        return []
    ray_session.connect(address)  # a clear ConnectionError within seconds if it does not answer
    found = []
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] != RAY_NAMESPACE or not actor["name"].startswith(user() + "/"):
            continue
        try:
            handle = ray.get_actor(actor["name"], namespace=RAY_NAMESPACE)
            found.append((handle, ray.get(handle.describe.remote(), timeout=30)))
        except Exception:  # ended meanwhile (its TTL)
            continue
    return found


def checked_or_none(folder: str, group: bool) -> str | None:
    """The real path of this node's cache folder, checked (private_folder.py); None where
    it is missing (nothing to list, and none is made) or refused (said on stderr: it is
    neither read nor removed)."""
    if not os.path.lexists(folder):
        return None
    try:
        return checked_folder(folder, group=group)
    except CacheFolderError as error:
        print(f"dpex cache: skipping this node's disk: {error}", file=sys.stderr)
        return None


def _folders(folder: str | None) -> list[dict]:
    out = []
    if folder is None:
        return out
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        path = os.path.join(folder, name)
        if os.path.isdir(path):
            entries, size, last, stage = folder_usage(path)
            out.append(dict(where="disk", namespace=name, stage=stage, node=socket.gethostname(),
                            entries=entries, bytes=size, last_use=last))
    return out


def _print_table(caches: list[dict]) -> None:
    if not caches:
        print("no caches")
        return
    print(f"{'namespace':34} {'where':7} {'stage':28} {'entries':>8} {'MiB':>9} {'idle':>8}")
    now = time.time()
    for c in caches:
        print(f"{c['namespace']:34} {c['where']:7} {c['stage'][:28]:28} {c['entries']:>8} "
              f"{c['bytes'] / 2**20:>9.1f} {now - c['last_use']:>7.0f}s")
