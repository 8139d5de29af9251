"""Clusters on one machine for dpex's tests and ``dpex bench``: not part of the loader.

* ``nodes.NodeCluster``: Ray nodes from ``ray start``, each pinned to its own cores, in a
  private Ray temp directory (the scale-out and unequal-node benchmarks);
* ``autoscaling_head.AutoscalingHead``: a head whose real Ray autoscaler adds and removes
  such nodes (Ray's ``fake_multinode`` provider), for the cluster-growth tests and bench;
* ``process_tree``: finding and ending exactly the processes one of them started.

The loader never imports this package (tests/test_layout.py checks it).
"""
