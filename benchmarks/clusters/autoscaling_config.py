"""The autoscaling config of ``autoscaling_head.AutoscalingHead``: Ray's ``fake_multinode``
provider, which starts "nodes" (raylets) on this machine, written out in full.

The autoscaler reads the file as it is (no defaults are filled in for a config given to
``ray start --autoscaling-config``), so every top-level key it touches is here: the command
lists and file-mount fields (empty: the provider runs no commands) and the provider flags
that keep it from trying SSH updaters or launch-config checks.
"""

from __future__ import annotations

from typing import Optional

# The fake provider gives the head this node id (``ray start`` sets it when RAY_FAKE_CLUSTER is
# in its environment) and its added nodes ...00001, ...00002, ... in launch order.
FAKE_HEAD_NODE_ID = "fffffffffffffffffffffffffffffffffffffffffffffffffff00000"
FAKE_PROVIDER_CLASS = "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider"
HEAD_NODE_TYPE = "ray.head.default"  # the name the fake provider gives the head's type
MIB = 1024 * 1024


def autoscaling_config(port: int, head_cpus: int, head_resources: dict, worker_types_spec: dict,
                       object_store_memory: int, idle_timeout_s: float, upscaling_speed: float,
                       max_workers: Optional[int], autoscaler_v2: bool) -> dict:
    """The full config (what example.yaml plus ``AutoscalingCluster`` would give) for a head
    whose GCS listens on ``port``; the arguments are ``AutoscalingHead``'s."""
    worker_types = {}
    for name, spec in worker_types_spec.items():
        spec = dict(spec)
        resources = dict(spec.get("resources", {}))
        resources.setdefault("object_store_memory", object_store_memory)
        node_type = {
            "resources": resources,  # the provider pops CPU/GPU/object_store_memory
            "node_config": spec.get("node_config", {}),
            "min_workers": spec.get("min_workers", 0),
            "max_workers": spec.get("max_workers", 1),
        }
        for key in ("labels", "idle_timeout_s", "priority"):
            if key in spec:
                node_type[key] = spec[key]
        worker_types[name] = node_type
    head_type = {"resources": {"CPU": head_cpus, **head_resources},
                 "node_config": {}, "max_workers": 0}
    provider = {
        "type": "fake_multinode",
        # Launched nodes dial this GCS (the provider's default is 6379 on this host).
        "gcs_address": f"127.0.0.1:{port}",
        "use_node_id_as_ip": True,  # all fake nodes share 127.0.0.1: key them by id
        "disable_node_updaters": True,  # no SSH setup of launched nodes
        "disable_launch_config_check": True,
    }
    if autoscaler_v2:  # as AutoscalingCluster(autoscaler_v2=True) sets them
        provider["launch_multiple"] = True
        provider["head_node_id"] = FAKE_HEAD_NODE_ID
        # v2 fills in the provider type's defaults file, and fake_multinode's
        # (example.yaml) is not in the wheel: the monitor dies with FileNotFoundError.
        # The same provider class named as an "external" module has built-in defaults.
        provider["type"] = "external"
        provider["module"] = FAKE_PROVIDER_CLASS
    if max_workers is None:
        max_workers = sum(t["max_workers"] for t in worker_types.values())
    return {
        "cluster_name": "fake_multinode",
        "max_workers": max_workers,
        "upscaling_speed": upscaling_speed,
        "idle_timeout_minutes": idle_timeout_s / 60.0,
        "provider": provider,
        "auth": {"ssh_user": "ray"},  # unused by this provider; the schema wants auth
        "docker": {},
        "available_node_types": {HEAD_NODE_TYPE: head_type, **worker_types},
        "head_node_type": HEAD_NODE_TYPE,
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


def validate(config: dict) -> None:
    """Validate against Ray's schema now: the autoscaler itself only debug-logs errors."""
    try:
        from ray.autoscaler._private.util import validate_config
    except ImportError:
        return
    validate_config(config)
