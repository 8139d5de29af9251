"""One stream, several trainers: loaders with the same ``share=`` name compute each batch
once (NOTE [ dpex Shared Stream ], hub.py). keys.py says when two loaders' batches are the
same bits; hub.py is the stream's owner; stream.py is a loader's place in it;
iterator_half.py is the iterator's side of it (claims, going on alone).

May import: elastic, workers, epoch, observe, cache, ray_session and the leaves.
"""
