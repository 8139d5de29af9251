"""Clusters on one machine for dpex's tests and benchmarks: not part of the package.

* ``nodes.NodeCluster``: Ray nodes from ``ray start``, each pinned to its own cores, in a
  private Ray temp directory (the scale-out and unequal-node benchmarks);
* ``autoscaling_head.AutoscalingHead``: a head whose real Ray autoscaler adds and removes
  such nodes (Ray's ``fake_multinode`` provider), for the cluster-growth tests and the
  ``grow`` benchmark;
* ``process_tree``: finding and ending exactly the processes one of them started.

It lives in ``benchmarks/`` (import it as ``clusters`` with that folder on ``sys.path``:
tests/conftest.py puts it there); ``nodes.plain_env`` gives the processes it starts dpex's
source folder and ``benchmarks/`` on their ``PYTHONPATH``.
"""
