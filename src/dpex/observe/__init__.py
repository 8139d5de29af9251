"""What the training loop and its user see: how long the loop waited for data (``stats``),
where each task's time went (``timeline``), what each worker process delivers
(``delivery``), and the same figures as Ray metrics (``ray_metrics``).

May import: cache (its counters), ray_session and the leaves.
"""
