"""The benchmark engine behind ``dpex bench`` and ``benchmarks/``.

Modules: ``workloads`` (datasets generated locally), ``runners`` (one factory per loader kind
and the one measuring loop), ``raydata`` (the Ray Data pipeline doing the same work),
``memwatch`` (peak memory, from a separate process), ``report`` (medians, ratios, targets,
table, plot), ``suite`` (the alternating schedule), ``cli`` (the command).
"""
