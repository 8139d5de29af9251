"""The elastic-worker experiments: this project's own measurements, not part of ``dpex bench``.

``runs`` starts the clusters and the trainer child (``trainer``) of ``scaleout``, ``unequal``
and ``autoscale``; ``grow`` runs the ``grow`` workload (an autoscaling Ray cluster on this
machine) in its own child; ``records`` is what they record, ``report``, ``autoscale_report``
and ``grow_report`` turn the records into tables, targets and plots, and ``cli`` is the
command behind ``benchmarks/bench_elastic.py`` and ``benchmarks/bench_grow.py``. The
children run as ``python -m elastic_bench.trainer`` / ``python -m elastic_bench.grow`` with
``benchmarks/`` on their ``PYTHONPATH`` (``clusters.nodes.plain_env``); they reuse what the
package keeps (``dpex.bench.workloads``, ``runners``, ``report``, ``env``).
"""
