"""Tiny models and data shared by the tests."""
import json
import os

import torch
from torch.utils.data import BatchSampler, DataLoader, Sampler, TensorDataset

from tasktrain import Callback, DataModule, TaskModule
from tasktrain.demos.boring_classes import BoringModel


def regression_data(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    return TensorDataset(x, y)


def loader(n=32, batch_size=8, shuffle=False, seed=0):
    return DataLoader(regression_data(n, seed), batch_size=batch_size, shuffle=shuffle)


class Linear(TaskModule):
    def __init__(self, lr=0.1):
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self(x), y))

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        # the tests predict on (x, y) pairs and on x alone; the default, Lightning's, would give forward the pair
        return self(batch[0] if isinstance(batch, (list, tuple)) else batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class EpochSampler(Sampler):
    """A sampler of the user's: a permutation of range(n) drawn from its epoch, every set_epoch call noted in
    `calls` (what the beside-Lightning sampler tests compare)."""

    def __init__(self, n, calls):
        self.n, self.calls, self.epoch = n, calls, 0

    def set_epoch(self, epoch):
        self.calls.append(epoch)
        self.epoch = epoch

    def __iter__(self):
        return iter(torch.randperm(self.n, generator=torch.Generator().manual_seed(100 + self.epoch)).tolist())

    def __len__(self):
        return self.n


class MyBatchSampler(BatchSampler):
    """A batch sampler of the user's (a subclass: Lightning builds it again around its DistributedSampler)."""


def quiet(**kwargs):
    """Trainer keyword arguments for tests that do not test logging, progress or checkpointing."""
    base = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0)
    base.update(kwargs)
    return base


def outcome(make):
    """'ok', or the name of the exception's class (MisconfigurationException is one name for both frameworks):
    what the beside-Lightning tests compare for a configuration each framework accepts or refuses."""
    try:
        make()
    except Exception as error:  # noqa: BLE001 (the type is the result)
        return type(error).__name__
    return "ok"


# Several `tasktrain ...` commands in one fresh interpreter, each through the CLI's own main as if typed (what
# `python -m tasktrain.cli.main` does, its exit code, and what it printed on stdout / stderr), so that the imports
# (torch, DeepSpeed: seconds each) are paid once per test rather than once per command.
_CLI_COMMANDS = """import contextlib, io, json, sys, traceback
from tasktrain.cli.main import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's errors end the command line so
            code = e.code if isinstance(e.code, int) else 1
        except Exception:  # an uncaught error: its traceback and status 1, as the interpreter would end
            traceback.print_exc()
            code = 1
    results.append([code or 0, out.getvalue(), err.getvalue()])
with open(sys.argv[2], "w") as f:
    json.dump(results, f)
"""


def cli_commands(commands, tmp_path, timeout=300):
    """Run each command (a list of `tasktrain` arguments) in one subprocess; returns [(returncode, stdout, stderr)]
    in order. The subprocess itself must end cleanly (it does unless the interpreter crashes)."""
    import json
    import os
    import subprocess
    import sys

    scrub = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in scrub and not k.startswith("TASKTRAIN_")}
    results = os.path.join(str(tmp_path), "cli_commands.json")
    proc = subprocess.run([sys.executable, "-c", _CLI_COMMANDS, json.dumps([[str(a) for a in c] for c in commands]),
                           results], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    with open(results) as f:
        return [tuple(r) for r in json.load(f)]


def cli_commands_here(commands):
    """cli_commands' commands, each a `tasktrain` command line through the CLI's entry point (tasktrain.cli.main.main,
    as _CLI_COMMANDS runs it), in this process: no interpreter to start and no torch (or DeepSpeed) to import again
    (~3 s of CPU each, ~6 with DeepSpeed). The same [(returncode, stdout, stderr)], in order."""
    import contextlib
    import io
    import traceback

    from tasktrain.cli.main import main

    results = []
    for argv in commands:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as e:  # argparse's errors end the command line so
                code = e.code if isinstance(e.code, int) else 1
            except Exception:  # an uncaught error: its traceback and status 1, as the interpreter would end
                traceback.print_exc()
                code = 1
        results.append((code or 0, out.getvalue(), err.getvalue()))
    return results


class RecordsItsProcess:
    """Under ddp_spawn: the process that trains, and the DataLoader warnings it gives from on_fit_start to on_train_end
    (Lightning's come in its child, where the start method is "spawn"), written to `record_path` for the parent
    (tests/test_lightning_beside_connectors.py; here, where a spawned child imports it without Lightning)."""

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch[0], batch_idx)
        self.log("train_loss", out["loss"])
        return out

    def validation_step(self, batch, batch_idx):
        return super().validation_step(batch[0], batch_idx)

    def on_fit_start(self):
        import warnings

        self._caught = warnings.catch_warnings(record=True)
        self._warned = self._caught.__enter__()
        warnings.simplefilter("always")

    def on_train_end(self):
        import json
        import os

        self._caught.__exit__(None, None, None)
        with open(self.record_path, "w") as f:
            json.dump({"pid": os.getpid(), "warnings": [str(w.message) for w in self._warned
                                                        if "workers" in str(w.message)]}, f)


class OursRecords(RecordsItsProcess, BoringModel):
    pass


class HandsOutLoaders:
    """A DataModule that hands out the loaders it was given (at module level: ddp_spawn pickles it to its children;
    tests/test_lightning_beside_connectors.py puts it on tasktrain's DataModule and on Lightning's)."""

    def __init__(self, train, val):
        super().__init__()
        self.train, self.val = train, val

    def train_dataloader(self):
        return self.train

    def val_dataloader(self):
        return self.val


class OursHandsOutLoaders(HandsOutLoaders, DataModule):
    pass


class FailsAtStep3:
    """A module whose training_step raises at global step 3 (a failed ddp_spawn run: the child raises)."""

    def training_step(self, batch, batch_idx):
        if self.global_step == 3:
            raise ValueError("boom at step 3")
        return super().training_step(batch, batch_idx)


class OursFailsAtStep3(FailsAtStep3, BoringModel):
    pass


def note_process(path, parent_pid, *what):
    """Append `what` to the JSON lines at `path`, led by "parent" (the process that made the noting object) or
    "child" (a process it was pickled to)."""
    with open(path, "a") as f:
        f.write(json.dumps(["parent" if os.getpid() == parent_pid else "child", *what]) + "\n")


class NotesWhereException:
    """A callback that notes each on_exception (the exception's class, trainer.global_step) and its process."""

    def __init__(self, path):
        super().__init__()
        self.path, self.parent_pid = path, os.getpid()

    def on_exception(self, trainer, module, exception):
        note_process(self.path, self.parent_pid, "on_exception", type(exception).__name__, trainer.global_step)


class OursNotesWhereException(NotesWhereException, Callback):
    pass


class NotesWhereFinalize:
    """A logger of one's own (any object with Lightning's Logger methods, under both frameworks) that notes each
    finalize and its process."""
    name, version, save_dir, group_separator, experiment = "notes", 0, None, "/", None

    def __init__(self, path):
        self.path, self.parent_pid = path, os.getpid()

    def log_hyperparams(self, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        pass

    def log_graph(self, model, input_array=None):
        pass

    def save(self):
        pass

    def after_save_checkpoint(self, checkpoint_callback):
        pass

    def finalize(self, status):
        note_process(self.path, self.parent_pid, "finalize", status)


def recording_environment(base, *, local_rank=0, node_rank=0, main_address="127.0.0.1", main_port=1, rank=0, world=1,
                          record_checks=False):
    """A ClusterEnvironment of the user's (subclassing `base`: tasktrain's class or Lightning's, so the same one runs
    under both) that creates the processes itself (creates_processes_externally) and answers with the values given;
    it notes in `.calls`, in order, the ranks the Trainer tells it (("set_global_rank", r), ("set_world_size", n)),
    and with record_checks also ("validate_settings", devices, nodes) and ("teardown",). Returns an instance."""
    class Recording(base):
        creates_processes_externally = True

        def __init__(self):
            self.calls, self._rank, self._world = [], rank, world

        @property
        def main_address(self):
            return main_address

        @property
        def main_port(self):
            return main_port

        @staticmethod
        def detect():
            return True

        def world_size(self):
            return self._world

        def set_world_size(self, size):
            self.calls.append(("set_world_size", size))
            self._world = size

        def global_rank(self):
            return self._rank

        def set_global_rank(self, rank):
            self.calls.append(("set_global_rank", rank))
            self._rank = rank

        def local_rank(self):
            return local_rank

        def node_rank(self):
            return node_rank

        def validate_settings(self, num_devices, num_nodes):
            if record_checks:
                self.calls.append(("validate_settings", num_devices, num_nodes))
            super().validate_settings(num_devices, num_nodes)

        def teardown(self):
            if record_checks:
                self.calls.append(("teardown",))
            super().teardown()

    return Recording()
