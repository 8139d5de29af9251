"""One stream, several trainers: loaders with the same ``share=`` name compute each batch
once (NOTE [ dpex Shared Stream ], hub.py). keys.py says when two loaders' batches are the
same bits; hub.py is the stream's owner; stream.py is a loader's place in it."""
