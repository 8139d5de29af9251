"""The loader's pass over an epoch on Ray: the trainer's side of it. ``remote_iter`` is the
iterator ``DataLoader.__iter__`` returns in distribute mode; ``dispatch`` sends each task to
a worker slot, ``receive`` takes results back in torch's order, ``torch_mode`` times torch's
own iterator, ``rebuilt`` notices a framework rebuilding the loader.

May import: share, elastic, workers, epoch, observe, cache, ray_session and the leaves
(``compat``, ``process_ends``, ``nested``); never the package front or ``dataloader``.
"""
