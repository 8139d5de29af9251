"""``dpex bench``: a user's own measurement of dpex against torch's DataLoader and Ray Data.

On their machine or cluster (``--address``), the same dataset, batch size and workers go to
every loader, in alternating order, and the command writes a results table, targets and a
plot. Modules: ``workloads`` (datasets generated locally: ``cpu``, ``tiny``, ``large``,
``shards``, ``ceiling``), ``runners`` (one factory per loader kind and the one measuring
loop), ``raydata`` (the Ray Data pipeline doing the same work), ``memwatch`` (peak memory,
from a separate process), ``report`` (medians, ratios, targets, table, plot), ``suite`` (the
alternating schedule), ``cli`` (the command); the fresh-process workloads ``startup`` and
``coldstart`` (with ``coldstart_train``, the user's script); ``images``, ``env`` (helpers).
The project's own experiments (elastic workers, cluster growth) live in ``benchmarks/``.
"""
