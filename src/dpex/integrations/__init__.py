"""dpex inside training frameworks that rebuild the user's DataLoader, or report its numbers.

* ``dpex.integrations.accelerate``: HF accelerate's ``Accelerator.prepare`` keeps a dpex
  loader on Ray (imports accelerate).
* ``dpex.integrations.ray_train``: Ray Train's ``prepare_data_loader`` with a dpex loader
  kept on Ray (imports ray.train).
* ``dpex.integrations.lightning``: ``DataStallCallback`` logs each epoch's data stall to
  the trainer's loggers (imports lightning). Lightning needs nothing else: its sampler
  injection keeps a dpex loader as is, and DDP ranks share one Ray by themselves
  (``dpex.ray_session``).
* ``dpex.loader.rebuilt``: the one warning when plain accelerate or Ray Train
  rebuilds a dpex loader as torch's, and the rebuild back (``dpex_like``).

Frameworks that build torch's loader themselves (HF ``transformers.Trainer``) need no
module: run the script with ``dpex run`` (``dpex.integrations.zero_code``).
"""
