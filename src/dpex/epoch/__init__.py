"""What makes an epoch torch's, and where it stands: per-worker seeds exactly as torch
draws them (``seeding``), and each worker's position, to continue mid-epoch in another
process (``resume``). Pure: no Ray.

May import: the leaves only (``compat``, ``nested``).
"""
