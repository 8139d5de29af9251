"""dpex inside training frameworks that rebuild the user's DataLoader.

``dpex.integrations.accelerate``: HF accelerate's ``Accelerator.prepare`` (imports
accelerate). Lightning needs no module: its sampler injection keeps a dpex loader as is,
and DDP ranks share one Ray by themselves (``dpex.shared_ray``).
"""
