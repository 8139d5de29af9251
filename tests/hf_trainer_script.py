"""tests/test_hf_trainer.py's job: an unmodified HF ``transformers.Trainer`` run, with no dpex
or Ray code, as a user writes one: a tiny GPT-2 built from a config (nothing downloaded), an
in-memory map-style dataset, CPU, 2 epochs, ``dataloader_num_workers=2`` and every other
loader argument at its default. The test runs it as ``python`` (torch's loader) and as
``python -m dpex run`` (the Trainer's loader becomes dpex's, its workers Ray actors).

It saves to ``OUT_DIR/batches.pt`` the batch the model received at each training step, and
to ``OUT_DIR/facts.json`` what the Trainer iterated: the prepared loader's class, the loader
inside it (accelerate's ``base_dataloader``), whether that is a dpex loader on Ray, and
this process's session and Ray session (for the test's leftover check).

    python tests/hf_trainer_script.py OUT_DIR
    python -m dpex run tests/hf_trainer_script.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

NUM_SAMPLES = 40
BATCH_SIZE = 8  # 5 steps per epoch
EPOCHS = 2
SEQ_LEN = 8
VOCAB = 64
SEED = 7


class Tokens(torch.utils.data.Dataset):
    """Fixed token rows, one position of each redrawn at random on every read: the batches
    depend on the worker seeds the Trainer sets (``seed_worker``), so their equality across
    the two runs says the workers were seeded as torch's."""

    def __init__(self, n: int = NUM_SAMPLES) -> None:
        self.rows = torch.arange(n * SEQ_LEN).reshape(n, SEQ_LEN) % VOCAB

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.rows[i].clone()
        ids[torch.randint(SEQ_LEN, ()).item()] = torch.randint(VOCAB, ()).item()
        return {"input_ids": ids, "labels": ids.clone()}


def tiny_model() -> GPT2LMHeadModel:
    """A 1-layer GPT-2 with tiny dimensions, from a config: nothing is downloaded."""
    transformers.set_seed(SEED)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ_LEN, n_embd=16, n_layer=1, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def record_inputs(model: torch.nn.Module) -> list[dict[str, torch.Tensor]]:
    """The batches the model receives, in order (a forward pre-hook: the Trainer calls
    ``model(**inputs)``)."""
    seen: list[dict[str, torch.Tensor]] = []

    def hook(module, args, kwargs):
        seen.append({k: v.detach().clone() for k, v in kwargs.items()
                     if isinstance(v, torch.Tensor)})

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


class KeepLoader(TrainerCallback):
    """Keeps the prepared loader the Trainer iterates (``get_train_dataloader()`` would build
    and prepare a new one)."""

    loader = None

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.loader = train_dataloader


def loader_facts(prepared) -> dict:
    """What the Trainer iterated. No dpex import here: under plain ``python`` dpex is never
    loaded, and ``sys.modules`` says so."""
    base = getattr(prepared, "base_dataloader", prepared)
    dpex = sys.modules.get("dpex")
    facts = {
        "prepared": f"{type(prepared).__module__}.{type(prepared).__qualname__}",
        "base": f"{type(base).__module__}.{type(base).__qualname__}",
        "dpex_loaded": dpex is not None,
        "is_dpex": dpex is not None and isinstance(base, dpex.DataLoader),
        "distribute_mode": getattr(base, "distribute_mode", None),
        # accelerate's rebuild: the Trainer's batch sampler, its RandomSampler swapped for
        # accelerate's SeedableRandomSampler (reshuffled by the shard's set_epoch).
        "sampler": [type(base.batch_sampler).__name__,
                    type(getattr(base.batch_sampler, "sampler", None)).__name__],
        "num_workers": base.num_workers,
        "persistent_workers": base.persistent_workers,
        "per_node": {}, "batches_served": None, "session": None,
        # The test looks for what is left of this session and of the embedded Ray's.
        "sessions": [os.getsid(0)],
    }
    if facts["is_dpex"]:
        stats = base.stats()
        facts.update(per_node=stats.per_node, batches_served=stats.batches)
        import ray  # loaded already, with dpex

        from dpex import compat

        if ray.is_initialized():  # joined the embedded Ray (a run this short may not)
            facts["session"] = compat.session_name()
        from dpex.ray_session import embedded

        if embedded.head_session() is not None:
            facts["sessions"].append(embedded.head_session())
    return facts


def main(out_dir: str) -> None:
    model = tiny_model()
    seen = record_inputs(model)
    args = TrainingArguments(
        output_dir=out_dir, use_cpu=True, report_to="none", save_strategy="no",
        num_train_epochs=EPOCHS, per_device_train_batch_size=BATCH_SIZE,
        dataloader_num_workers=2, seed=SEED, disable_tqdm=True, logging_strategy="no",
    )
    keep = KeepLoader()
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[keep])
    trainer.train()
    facts = loader_facts(keep.loader)
    facts.update(steps=trainer.state.global_step, transformers=transformers.__version__)
    torch.save(seen, os.path.join(out_dir, "batches.pt"))
    with open(os.path.join(out_dir, "facts.json"), "w") as f:
        json.dump(facts, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
