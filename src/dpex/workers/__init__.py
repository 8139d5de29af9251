"""The worker processes: what runs in one (``worker``, ``fetcher``, ``user_code``,
``transport``, ``pipe_slots``, ``allocator``, ``niceness``, ``errors``, ``worker_info``), how
they start, are reused, replaced and moved (``lifecycle``, ``pool``, ``local_start``,
``local_workers``, ``process_handle``), and what a user asks of them (``options``:
``WorkerOptions``; ``autoscale``: ``Autoscale``). How each process ends is the leaf ``dpex.process_ends``.

May import: epoch, observe, cache, ray_session and the leaves.
"""
