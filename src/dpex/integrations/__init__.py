"""dpex inside training frameworks that rebuild the user's DataLoader.

``dpex.integrations.accelerate``: HF accelerate's ``Accelerator.prepare`` (imports
accelerate); plain ``accelerate.Accelerator`` gets one warning that it swapped in torch's
loader (``dpex.integrations.rebuilt``). Lightning needs no module: its sampler injection keeps a dpex loader as is,
and DDP ranks share one Ray by themselves (``dpex.shared_ray``).
"""
