"""dpex inside training frameworks that rebuild the user's DataLoader, or report its numbers.

* ``dpex.integrations.accelerate``: HF accelerate's ``Accelerator.prepare`` keeps a dpex
  loader on Ray (imports accelerate).
* ``dpex.integrations.ray_train``: Ray Train's ``prepare_data_loader`` with a dpex loader
  kept on Ray (imports ray.train).
* ``dpex.integrations.lightning``: ``DataStallCallback`` logs each epoch's data stall to
  the trainer's loggers (imports lightning). Lightning needs nothing else: its sampler
  injection keeps a dpex loader as is, and DDP ranks share one Ray by themselves
  (``dpex.ray_session``).
* ``build_back``: the rebuild back to a dpex loader (``dpex_like``); the one warning when
  plain accelerate or Ray Train rebuilds a dpex loader as torch's is the loader's own
  (``dpex.loader.rebuilt``).

Frameworks that build torch's loader themselves (HF ``transformers.Trainer``) need no
module: run the script with ``dpex run`` (``zero_code``, ``run_cli``): torch's DataLoader
becomes dpex's, with no code change.

The top part: it may import ``dpex.dataloader`` and every part below it.
"""
