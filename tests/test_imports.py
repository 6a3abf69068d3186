"""What importing tasktrain brings in, read in one fresh interpreter (torch's import, ~3.5 s of CPU, paid once for all
these checks rather than once each; they were a fresh interpreter each in the files of what they check).

The interpreter takes the steps below in order, each importing more (or fitting), and notes sys.modules right after
each step. sys.modules only grows, so a module absent after a step was imported by none of the steps so far: each
check holds for its step's imports alone. A step whose module a later step may import legitimately is checked
before that step (the subpackages reached as attributes last: reaching them imports them).
"""
import json
import os
import subprocess
import sys
import types
import warnings

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

STEPS = """import json, sys, types
names = json.loads(sys.argv[1])
seen = {}

def absent(*modules):
    return [m for m in modules if m in sys.modules]

import tasktrain
seen["eager"] = [n for n in names if "tasktrain." + n in sys.modules]
import tasktrain.trainer.seed  # what a spawned DataLoader worker imports for seed_everything(workers=True)'s init fn
seen["worker"] = sorted(m for m in sys.modules if m.startswith("tasktrain"))
from tasktrain import Trainer, TaskModule
seen["trainer"] = absent("deepspeed", "tensorboard", "torch.utils.tensorboard")
import tasktrain.loggers, tasktrain.tracking, tasktrain.callbacks.loggers
from tasktrain.loggers import WandbLogger, MLFlowLogger, TensorBoardLogger, CSVLogger, CometLogger
from tasktrain.loggers.comet import CometLogger
from tasktrain import Trainer, WandbLogger, MLFlowLogger
from tasktrain.loggers.trackers import make_trackers, check_log_with
seen["loggers"] = absent("wandb", "mlflow", "comet_ml", "tensorboard", "torch.utils.tensorboard", "yaml")
import tasktrain.inference
tasktrain.init_empty_weights; tasktrain.save_model
seen["inference"] = absent("safetensors", "transformers", "deepspeed")
from helpers import Linear, loader, quiet
tasktrain.Trainer(max_steps=1, **quiet()).fit(Linear(), loader(8))
seen["fit"] = absent("torchmetrics")
import tasktrain.cli
seen["cli"] = absent("jsonargparse")
seen["missing"] = [n for n in names if not isinstance(getattr(tasktrain, n, None), types.ModuleType)]
print("SEEN " + json.dumps(seen))
"""


def lightning_subpackages():
    """Lightning's public subpackages that `import lightning.pytorch` makes attributes."""
    import pkgutil

    pl = pytest.importorskip("lightning.pytorch")
    names = sorted(m.name for m in pkgutil.iter_modules(pl.__path__) if not m.name.startswith("_")
                   and isinstance(getattr(pl, m.name, None), types.ModuleType))
    assert "loops" in names and "overrides" in names
    return names


@pytest.fixture(scope="module")
def seen():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", STEPS, json.dumps(lightning_subpackages())], cwd=HERE, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("SEEN ")]
    return json.loads(lines[-1][len("SEEN "):])


def test_a_spawned_loader_worker_imports_little_of_tasktrain(seen):
    """seed_everything(workers=True)'s worker_init_fn, the one object of the Trainer's that its loaders send to a
    spawned worker (test_what_a_spawned_loader_worker_unpickles below), imports no loop, module or strategy there
    (Lightning's pl_worker_init_function imports all of lightning in each worker)."""
    assert seen["worker"] == ["tasktrain", "tasktrain.trainer", "tasktrain.trainer.seed", "tasktrain.version"]


def _pickled_modules(obj):
    """The modules a process unpickling `obj` imports (each class and function the pickle names, read back here)."""
    import io
    import pickle

    modules = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module, name):
            modules.add(module)
            return super().find_class(module, name)

    Recording(io.BytesIO(pickle.dumps(obj))).load()
    return modules


@pytest.mark.parametrize("flags", [{}, dict(strategy="ddp", accelerator="cpu", devices=2)], ids=["one", "ddp"])
def test_what_a_spawned_loader_worker_unpickles(flags, monkeypatch):
    """What torch sends a spawned DataLoader worker (multiprocessing_context="spawn", persistent workers too) is the
    loader's dataset, collate_fn and worker_init_fn (the sampler stays in the main process): of the loaders the Trainer
    sets up for each stage (rebuilt around its samplers; on 2 devices, rank 0's before the launch), the user's objects
    and, with seed_everything(workers=True), tasktrain.trainer.seed's init fn alone."""
    import tasktrain
    from helpers import quiet
    from tasktrain.demos.boring_classes import BoringModel
    from torch.utils.data import DataLoader, TensorDataset

    for name in ("TASKTRAIN_GLOBAL_SEED", "TASKTRAIN_SEED_WORKERS", "PL_GLOBAL_SEED", "PL_SEED_WORKERS"):
        monkeypatch.setenv(name, "0")  # (put back after the test: seed_everything writes them)
    tasktrain.seed_everything(1, workers=True, verbose=False)
    import torch

    def loader(shuffle=False):
        return DataLoader(TensorDataset(torch.randn(8, 32)), batch_size=2, num_workers=1, shuffle=shuffle,
                          multiprocessing_context="spawn", persistent_workers=True)

    model = BoringModel()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the srun hint, where srun is installed)
        trainer = tasktrain.Trainer(**quiet(), **flags)
    model.trainer = trainer
    trainer.strategy.connect(model)
    trainer._data_connector.attach_dataloaders(model, loader(shuffle=True), loader(), loader(), loader())
    for view in (trainer.fit_loop, trainer.fit_loop.epoch_loop.val_loop, trainer.test_loop, trainer.predict_loop):
        view.setup_data()
    from tasktrain.trainer.loaders import train_loaders_read

    # (and the training loader the loop reads: trainer.train_dataloader is the one given where Lightning's is)
    loaders = [trainer.train_dataloader, trainer.val_dataloaders, trainer.test_dataloaders,
               trainer.predict_dataloaders, train_loaders_read(trainer)]
    assert all(isinstance(one, DataLoader) and one.worker_init_fn is not None for one in loaders)
    sent = set().union(*(_pickled_modules((one.dataset, one.collate_fn, one.worker_init_fn)) for one in loaders))
    assert {m for m in sent if m.startswith("tasktrain")} == {"tasktrain.trainer.seed"}, sent
    import functools

    from tasktrain.trainer import loaders as trainer_loaders  # (what the check would name: a partial of the loop's)
    assert "tasktrain.trainer.loaders" in _pickled_modules(functools.partial(trainer_loaders.train_data_now, None))


def test_import_is_light(seen):
    assert seen["trainer"] == []  # import tasktrain, Trainer, TaskModule: no DeepSpeed, no TensorBoard


def test_importing_the_loggers_imports_no_integration(seen):
    assert seen["loggers"] == []


def test_import_tasktrain_does_not_import_safetensors(seen):
    assert seen["inference"] == []  # (nor transformers, nor DeepSpeed: tasktrain.inference, init_empty_weights)


def test_torchmetrics_is_imported_only_when_a_metric_is_logged(seen):
    assert seen["fit"] == []  # a fit that logs nothing


def test_importing_tasktrain_cli_does_not_import_jsonargparse(seen):
    assert seen["cli"] == []


def test_lightnings_subpackages_are_attributes_after_import_tasktrain_as_they_are_after_import_lightning(seen):
    """`import lightning.pytorch as pl; pl.loops` works without importing pl.loops: each public subpackage Lightning's
    import reaches as an attribute is one of `import tasktrain`'s too (lazily: the package import stays light). Read in
    a fresh process, where nothing imported a subpackage before."""
    assert seen["missing"] == []  # each of Lightning's reachable subpackages is tasktrain's attribute
    assert not {"loops", "overrides", "tuner", "callbacks", "loggers"} & set(seen["eager"]), seen["eager"]
