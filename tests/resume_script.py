"""Run in a fresh interpreter by test_resume.py: load a saved loader state and finish.

argv: epochs to finish, then for each loader: state path, output path, distribute_mode (0/1),
persistent (0/1).
"""

import sys

import torch

import dpex
from helpers import REFERENCE_CONTEXT, AugmentedDataset


def mode_args(distribute_mode: bool) -> dict:
    """dpex's Ray workers, or torch's own started by forkserver (helpers.REFERENCE_CONTEXT)."""
    if distribute_mode:
        return dict(distribute_mode=True)
    return dict(distribute_mode=False, multiprocessing_context=REFERENCE_CONTEXT)


def make_loader(distribute_mode: bool, persistent: bool) -> dpex.DataLoader:
    return dpex.DataLoader(
        AugmentedDataset(30), batch_size=4, shuffle=True, num_workers=2,
        persistent_workers=persistent, generator=torch.Generator().manual_seed(21),
        **mode_args(distribute_mode))


if __name__ == "__main__":
    epochs, jobs = int(sys.argv[1]), sys.argv[2:]
    for i in range(0, len(jobs), 4):
        state_path, out_path, mode, persistent = jobs[i:i + 4]
        loader = make_loader(mode == "1", persistent == "1")
        loader.load_state_dict(torch.load(state_path, weights_only=True))
        torch.save([batch for _ in range(epochs) for batch in loader], out_path)
        del loader  # persistent workers go now, not at exit
