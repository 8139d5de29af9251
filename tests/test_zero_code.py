"""Zero-code mode (dpex.integrations.zero_code): torch's DataLoader, as scripts and frameworks build it,
becomes dpex's on Ray while patched, with torch's batches; ``dpex run`` does it to an
unmodified script from a plain shell."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.utils.data
from conftest import SRC_DIR, TESTS_DIR, user_env
from helpers import REFERENCE_CONTEXT, AugmentedDataset, assert_batches_equal

import dpex
from dpex.dataloader import TorchDataLoader
from dpex.integrations import zero_code

BIN = os.path.dirname(sys.executable)


def torch_kwargs(**extra):
    return dict(batch_size=4, shuffle=True, num_workers=2,
                generator=torch.Generator().manual_seed(11), **extra)


# ----------------------------------------------------------------------------- pure


def test_options_come_from_the_environment():
    address, options = zero_code.options_from_env({
        "DPEX_HEAD_ADDRESS": "10.0.0.1:6379",
        "DPEX_WORKER_OPTIONS": '{"num_cpus": 1, "autoscale": {"max_processes": 4}}'})
    assert address == "10.0.0.1:6379"
    assert options.num_cpus == 1 and options.autoscale == dpex.Autoscale(max_processes=4)
    assert zero_code.options_from_env({}) == ("auto", dpex.WorkerOptions())


@pytest.mark.parametrize("text", ["[1]", "{not json", '{"no_such_field": 1}'])
def test_bad_worker_options_say_what_is_wrong(text):
    with pytest.raises((ValueError, TypeError)):
        zero_code.worker_options_from_json(text)


def test_the_undo_gives_torchs_names_back_and_isinstance_holds_meanwhile():
    before = torch.utils.data.DataLoader(list(range(4)), batch_size=2)
    with dpex.patch() as patched:
        assert torch.utils.data.DataLoader is zero_code.ZeroCodeDataLoader
        assert torch.utils.data.dataloader.DataLoader is zero_code.ZeroCodeDataLoader
        assert isinstance(before, torch.utils.data.DataLoader)
        assert issubclass(dpex.DataLoader, torch.utils.data.DataLoader)
        no_workers = torch.utils.data.DataLoader(list(range(4)), batch_size=2)
        assert type(no_workers) is TorchDataLoader  # nothing to move: torch's own loader
        # dpex's own class still builds while torch's name points at the patch.
        assert dpex.DataLoader(list(range(4)), batch_size=2).distribute_mode is False

        class Derived(torch.utils.data.DataLoader):  # a framework's subclass, made now
            pass

        derived = Derived(list(range(4)), batch_size=2, num_workers=2)
        assert isinstance(derived, dpex.DataLoader) and derived.distribute_mode
        assert isinstance(derived, TorchDataLoader)
    assert torch.utils.data.DataLoader is TorchDataLoader
    assert torch.utils.data.dataloader.DataLoader is TorchDataLoader
    patched.undo()  # a second undo changes nothing
    assert torch.utils.data.DataLoader is TorchDataLoader


def user_hook(runtime_env):
    """A runtime-env hook a user had set before dpex (RAY_RUNTIME_ENV_HOOK)."""
    return {**(runtime_env or {}), "env_vars": {"USERS_HOOK_RAN": "1"}}


def test_while_patched_the_scripts_ray_jobs_patch_their_workers(monkeypatch):
    """Ray's runtime-env hook gives each ray.init of the script (never dpex's own) a
    worker setup hook carrying the patch's options; a user's hook still runs first, and the
    undo gives the variable back."""
    from dpex.ray_session import join

    monkeypatch.setenv("RAY_RUNTIME_ENV_HOOK", "test_zero_code.user_hook")
    options = dpex.WorkerOptions(num_cpus=0.5)
    with dpex.patch(worker_options=options):
        hook = os.environ["RAY_RUNTIME_ENV_HOOK"]
        assert hook == "dpex.integrations.zero_code.ray_runtime_env_hook"
        env = zero_code.ray_runtime_env_hook({"pip": []})
        assert env["pip"] == [] and env["env_vars"]["USERS_HOOK_RAN"] == "1"
        assert env["worker_process_setup_hook"] == "dpex.integrations.zero_code._patch_ray_worker"
        token = join._joining.set(True)  # dpex's own ray.init: its actors stay default
        try:
            assert "worker_process_setup_hook" not in zero_code.ray_runtime_env_hook(None)
        finally:
            join._joining.reset(token)
        mine = zero_code.ray_runtime_env_hook({"worker_process_setup_hook": "mine.setup"})
        assert mine["worker_process_setup_hook"] == "mine.setup"  # the user's is kept
    assert os.environ["RAY_RUNTIME_ENV_HOOK"] == "test_zero_code.user_hook"
    # What a worker of such a job does first: patch itself with the script's options.
    monkeypatch.setenv(zero_code._PATCH_OPTIONS, env["env_vars"][zero_code._PATCH_OPTIONS])
    zero_code._patch_ray_worker()
    try:
        assert torch.utils.data.DataLoader is zero_code.ZeroCodeDataLoader
        assert zero_code._active[-1].worker_options == options
    finally:
        zero_code._active[-1].undo()
    assert torch.utils.data.DataLoader is TorchDataLoader


# ----------------------------------------------------------------------------- on Ray


@pytest.mark.usefixtures("ray_local")
def test_a_loader_built_by_torchs_name_runs_on_ray_with_torchs_batches():
    expected = list(torch.utils.data.DataLoader(
        AugmentedDataset(24), multiprocessing_context=REFERENCE_CONTEXT, **torch_kwargs()))
    with dpex.patch(worker_options=dpex.WorkerOptions(reuse_processes=False)):
        loader = torch.utils.data.DataLoader(AugmentedDataset(24), **torch_kwargs())
    assert type(loader) is zero_code.ZeroCodeDataLoader and loader.distribute_mode
    assert not loader.worker_options.reuse_processes
    assert_batches_equal(expected, list(loader))
    assert loader.stats().per_node  # its batches came from Ray processes


# ----------------------------------------------------------------------------- dpex run

SCRIPT = """
import json, sys
import torch
from torch.utils.data import DataLoader

class Noisy(torch.utils.data.Dataset):
    def __len__(self):
        return 24
    def __getitem__(self, i):
        return torch.full((2,), float(i)) + torch.rand(2)

loader = DataLoader(Noisy(), batch_size=4, shuffle=True, num_workers=2,
                    generator=torch.Generator().manual_seed(int(sys.argv[1])))
batches = [b.tolist() for b in loader]
print(json.dumps({"type": type(loader).__name__, "batches": batches,
                  "on_ray": bool(getattr(loader, "stats", None) and loader.stats().per_node)}))
"""

LIGHTNING_SCRIPT = """
import json
import lightning as L
import torch
from torch.utils.data import DataLoader

class Noisy(torch.utils.data.Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return torch.full((3,), float(i)) + torch.rand(3)

class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.seen = []
    def training_step(self, batch, batch_idx):
        self.seen.append(batch.tolist())
        return self.layer(batch).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
    def train_dataloader(self):  # Lightning asks the module for its loader, and wraps it
        return DataLoader(Noisy(), batch_size=4, shuffle=True, num_workers=2,
                          generator=torch.Generator().manual_seed(5))

model = Model()
trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(model)
loader = trainer.train_dataloader
print(json.dumps({"type": type(loader).__name__, "seen": model.seen}))
"""


def run_both(tmp_path, text: str, *args: str) -> tuple[dict, dict]:
    """The script as ``python train.py`` and as ``dpex run train.py``, from a user's shell."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(text))
    env = user_env(PYTHONPATH=os.pathsep.join([SRC_DIR, TESTS_DIR]))
    outs = []
    for command in ([os.path.join(BIN, "python"), str(script), *args],
                    [os.path.join(BIN, "dpex"), "run", "--worker-options",
                     '{"start_timeout_s": 90}', str(script), *args]):
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env,
                              cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-4000:]
        outs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return outs[0], outs[1]


def test_dpex_run_moves_an_unmodified_scripts_loader_to_ray(tmp_path):
    plain, patched = run_both(tmp_path, SCRIPT, "7")
    assert plain["type"] == "DataLoader" and not plain["on_ray"]
    assert patched["type"] == "ZeroCodeDataLoader" and patched["on_ray"]
    assert patched["batches"] == plain["batches"]  # floats printed exactly: the same bits


# Two Lightning processes (15-25 s): make test-slow. The default tier keeps `dpex run` of an
# unmodified script (above) and Lightning's own hook asking for a dpex loader
# (test_lightning.py).
@pytest.mark.slow
def test_dpex_run_under_lightning_which_asks_the_module_for_its_loader(tmp_path):
    pytest.importorskip("lightning")
    plain, patched = run_both(tmp_path, LIGHTNING_SCRIPT)
    assert plain["type"] == "DataLoader" and patched["type"] == "ZeroCodeDataLoader"
    assert len(patched["seen"]) == 8 and patched["seen"] == plain["seen"]
