"""What the three training examples share: data, augmentation, model, loop and options.

The examples import it as ``common`` (their own directory is first on ``sys.path``); the
loader's workers import ``common.data`` and ``common.augment`` the same way, to unpickle the
dataset. Import the submodules directly: this file stays empty so that neither the workers
nor ``accuracy_table.py`` pay for imports they do not use.
"""
