"""The benchmark engine behind ``dpex bench`` and ``benchmarks/``.

Modules: ``workloads`` (datasets generated locally), ``runners`` (one factory per loader kind
and the one measuring loop), ``raydata`` (the Ray Data pipeline doing the same work),
``memwatch`` (peak memory, from a separate process), ``report`` (medians, ratios, targets,
table, plot), ``suite`` (the alternating schedule), ``cli`` (the command). Fresh-process
workloads: ``startup``, ``coldstart`` (with ``coldstart_train``, the user's script); the
elastic ones: ``elastic`` with ``elastic_report`` and ``autoscale_report``.
"""
