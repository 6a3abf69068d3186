"""Trainer(plugins=...) beside Lightning: how plugins are sorted and which combinations are refused (Lightning's
exception types and words), a CheckpointIO of the user's called as Lightning calls it, a precision plugin object
training as its precision name, and the attributes a Lightning script reads (trainer.precision,
trainer.strategy.precision_plugin, trainer.strategy.checkpoint_io). Tiny models, CPU, one process."""
import contextlib
import importlib
import os
import re
import signal
import warnings

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
import lightning.pytorch.plugins as their_plugins  # noqa: E402
from lightning.pytorch.demos import boring_classes as theirs  # noqa: E402
from lightning.pytorch.plugins.environments import SLURMEnvironment as TheirSLURM  # noqa: E402

import tasktrain  # noqa: E402
import tasktrain.plugins as our_plugins  # noqa: E402
from helpers import recording_environment  # noqa: E402
from tasktrain.demos import boring_classes as ours  # noqa: E402
from tasktrain.exceptions import MisconfigurationException  # noqa: E402
from tasktrain.plugins.environments import (ClusterEnvironment, LightningEnvironment, SLURMEnvironment,  # noqa: E402
                                            TorchElasticEnvironment)
from tasktrain.strategies import requeue  # noqa: E402

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
             accelerator="cpu", devices=1)


def _plugins(lib, names):
    """The same plugin list built from each library's classes."""
    if lib is pl:
        from lightning.pytorch.plugins import environments as envs
    else:
        from tasktrain.plugins import environments as envs
    p = their_plugins if lib is pl else our_plugins
    built = {"bf16": lambda: p.MixedPrecision("bf16-mixed", "cpu"), "half": lambda: p.HalfPrecision("bf16-true"),
             "double": lambda: p.DoublePrecision(), "io": lambda: p.TorchCheckpointIO(),
             "io2": lambda: p.AsyncCheckpointIO(), "env": lambda: envs.LightningEnvironment(),
             "env2": lambda: envs.LightningEnvironment(), "sync": lambda: p.TorchSyncBatchNorm(),
             "obj": lambda: object(), "slurm": lambda: envs.SLURMEnvironment(auto_requeue=False)}
    return [built[n]() for n in names]


def _outcome(lib, plugins, **kwargs):
    try:
        lib.Trainer(plugins=plugins, **{**QUIET, **kwargs})
    except Exception as err:  # noqa: BLE001 (the type and words are compared)
        return type(err).__name__, re.sub(r"<[^>]*>|\S+ object at 0x[0-9a-f]+", "<obj>", str(err))
    return None


@pytest.mark.parametrize("names,kwargs", [
    (["bf16"], {}), (["bf16", "io", "env", "sync"], {}), (["half", "io2"], {}), (["double"], {}), ([], {}),
    (["slurm"], {}),
    (["bf16", "half"], {}), (["io", "io2"], {}), (["env", "env2"], {}), (["sync", "sync"], {}),
    (["bf16"], {"precision": "bf16-mixed"}), (["double"], {"precision": 16}), (["obj"], {}),
    (["sync"], {"sync_batchnorm": True}),
])
def test_plugin_lists_are_accepted_and_refused_as_lightning_does(names, kwargs):
    theirs_out = _outcome(pl, _plugins(pl, names), **kwargs)
    ours_out = _outcome(tasktrain, _plugins(tasktrain, names), **kwargs)
    if theirs_out is None:
        assert ours_out is None
    else:
        assert ours_out is not None and ours_out[0] == theirs_out[0]
        assert ours_out[1].startswith(theirs_out[1].split("<obj>")[0]), (ours_out, theirs_out)


def test_a_string_or_a_single_plugin_is_read_as_lightning_reads_it():
    # one plugin, not in a list; and a string, which Lightning iterates character by character
    for lib, p in ((pl, their_plugins), (tasktrain, our_plugins)):
        trainer = lib.Trainer(plugins=p.DoublePrecision(), **QUIET)
        assert trainer.precision == "64-true"
    assert _outcome(pl, "16-mixed")[0] == _outcome(tasktrain, "16-mixed")[0] == "MisconfigurationException"
    with pytest.raises(MisconfigurationException, match="Found invalid type for plugin 1"):
        tasktrain.Trainer(plugins="16-mixed", **QUIET)


def test_the_plugin_attributes_a_lightning_script_reads():
    for precision_plugin, name in ((our_plugins.MixedPrecision("bf16-mixed", "cpu"), "bf16-mixed"),
                                   (our_plugins.HalfPrecision(), "16-true"), (our_plugins.Precision(), "32-true")):
        io = our_plugins.AsyncCheckpointIO()
        trainer = tasktrain.Trainer(plugins=[precision_plugin, io], **QUIET)
        assert trainer.precision == name == precision_plugin.precision
        assert trainer.strategy.precision_plugin is precision_plugin is trainer.precision_plugin
        assert trainer.strategy.checkpoint_io is io
    theirs_trainer = pl.Trainer(plugins=[their_plugins.MixedPrecision("bf16-mixed", "cpu")], **QUIET)
    assert theirs_trainer.precision == "bf16-mixed" and theirs_trainer.precision_plugin.device == "cpu"
    assert our_plugins.MixedPrecision("bf16-mixed", "cpu").device == "cpu"
    # the default, as Lightning's: a TorchCheckpointIO
    default = tasktrain.Trainer(**QUIET).strategy.checkpoint_io
    assert type(default).__name__ == type(pl.Trainer(**QUIET).strategy.checkpoint_io).__name__ == "TorchCheckpointIO"
    # Lightning's constructor checks
    for lib, p in ((pl, their_plugins), (tasktrain, our_plugins)):
        with pytest.raises(ValueError, match="Precision must be '16-mixed' or 'bf16-mixed'"):
            p.MixedPrecision("32-true", "cpu")
        with pytest.raises(MisconfigurationException if lib is tasktrain else pl.utilities.exceptions.
                           MisconfigurationException, match="does not use a scaler"):
            p.MixedPrecision("bf16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))


def test_a_strategy_objects_own_precision_or_checkpoint_io_beside_plugins_is_refused():
    from lightning.pytorch.strategies import DDPStrategy as TheirDDP, SingleDeviceStrategy

    cases = [  # (Lightning's Trainer arguments, ours)
        (dict(strategy=SingleDeviceStrategy("cpu", precision_plugin=their_plugins.Precision()),
              plugins=[their_plugins.DoublePrecision()]),
         dict(strategy=tasktrain.strategies.SingleDevice(precision="bf16-mixed"),
              plugins=[our_plugins.DoublePrecision()])),
        (dict(strategy=TheirDDP(checkpoint_io=their_plugins.TorchCheckpointIO()),
              plugins=[their_plugins.TorchCheckpointIO()]),
         dict(strategy=tasktrain.strategies.DDPStrategy(checkpoint_io=our_plugins.TorchCheckpointIO()),
              plugins=[our_plugins.TorchCheckpointIO()])),
    ]
    for theirs_args, ours_args in cases:
        theirs_out = _outcome(pl, theirs_args.pop("plugins"), **{**QUIET, "devices": "auto", **theirs_args})
        ours_out = _outcome(tasktrain, ours_args.pop("plugins"), **{**QUIET, "devices": "auto", **ours_args})
        assert theirs_out == ours_out and "set through both strategy class and plugins" in ours_out[1]
    io = our_plugins.AsyncCheckpointIO()
    trainer = tasktrain.Trainer(strategy=tasktrain.strategies.DDPStrategy(checkpoint_io=io), **QUIET)
    assert trainer.strategy.checkpoint_io is io


def test_what_tasktrain_cannot_honor_is_refused_before_training():
    class EngineStyle(our_plugins.FSDPPrecision):
        @property
        def mixed_precision_config(self):  # FSDP1's MixedPrecision: tasktrain's FSDP2 takes a MixedPrecisionPolicy
            return None

    cases = [([EngineStyle("bf16-mixed")], "overrides mixed_precision_config: Lightning's FSDPPrecision builds FSDP1"),
             ([our_plugins.MixedPrecision("bf16-mixed", "cuda")], r"MixedPrecision\('bf16-mixed', 'cpu'\)"),
             ([our_plugins.DeepSpeedPrecision("bf16-mixed")], "DeepSpeed strategy's precision plugin"),
             ([TorchElasticEnvironment()], "not started by torchrun")]
    for plugins, words in cases:
        with pytest.raises(ValueError, match=words):
            tasktrain.Trainer(plugins=plugins, **QUIET)
    for unavailable in ("BitsandbytesPrecision", "TransformerEnginePrecision", "XLAPrecision"):
        with pytest.raises(ValueError, match="tasktrain"):
            getattr(our_plugins, unavailable)()
    tasktrain.Trainer(plugins=[LightningEnvironment()], **QUIET)  # the default launcher: accepted


def test_a_checkpoint_io_that_the_engine_strategies_would_not_call_is_refused():
    pytest.importorskip("deepspeed")

    class Recording(our_plugins.TorchCheckpointIO):
        pass

    with pytest.raises(ValueError, match="directories of shards"):
        tasktrain.Trainer(strategy="deepspeed", plugins=[Recording()], **{**QUIET, "devices": 1})
    with pytest.raises(ValueError, match="directories of shards"):
        tasktrain.Trainer(strategy="fsdp", plugins=[our_plugins.AsyncCheckpointIO()], **{**QUIET, "devices": 1})
    # the engines' own precision plugins, by Lightning's names; Lightning's FSDP takes no other (its TypeError)
    for strategy, plugin in (("deepspeed", our_plugins.DeepSpeedPrecision("bf16-mixed")),
                             ("deepspeed", our_plugins.MixedPrecision("bf16-mixed", "cpu")),
                             ("fsdp", our_plugins.FSDPPrecision("bf16-mixed"))):
        trainer = tasktrain.Trainer(strategy=strategy, plugins=[plugin], **{**QUIET, "devices": 1})
        assert trainer.precision == "bf16-mixed" and type(trainer.strategy.precision).__module__.startswith(
            f"tasktrain.strategies.{strategy}")
        # Lightning's: the plugin object given is the trainer's and the strategy's (an engine's of that engine)
        given = plugin if plugin.engine is not None else trainer.strategy.precision
        assert trainer.precision_plugin is trainer.strategy.precision_plugin is given
    with pytest.raises(TypeError, match="The FSDP strategy can only work with the `FSDPPrecision` plugin"):
        tasktrain.Trainer(strategy="fsdp", plugins=[our_plugins.MixedPrecision("bf16-mixed", "cpu")],
                          **{**QUIET, "devices": 1})
    # a user's CheckpointIO under a strategy that writes files: ModelCheckpoint's background writer would bypass it
    trainer = tasktrain.Trainer(plugins=[Recording()], **QUIET)
    with pytest.raises(ValueError, match="AsyncCheckpointIO"):
        trainer.strategy.check_async_save()


def _recording_io(base):
    class RecordingIO(base):
        def __init__(self):
            self.calls = []

        def save_checkpoint(self, checkpoint, path, storage_options=None):
            self.calls.append(("save", os.path.basename(path), storage_options, sorted(checkpoint)[:3]))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            torch.save(checkpoint, path)

        def load_checkpoint(self, path, map_location=None, weights_only=None):
            self.calls.append(("load", os.path.basename(path), map_location, weights_only))
            return torch.load(path, map_location="cpu", weights_only=True)

        def remove_checkpoint(self, path):
            self.calls.append(("remove", os.path.basename(path)))
            os.remove(path)

    return RecordingIO()


def _fit_with_io(lib, classes, io_base, root, **extra):
    lib.seed_everything(3, verbose=False)
    io = _recording_io(io_base)
    callback = lib.callbacks.ModelCheckpoint(dirpath=str(root), save_top_k=1, monitor="step", mode="max",
                                             filename="{epoch}-{step}")
    args = dict(QUIET, enable_checkpointing=True, max_epochs=3, limit_train_batches=2, limit_val_batches=1,
                callbacks=[callback], plugins=[io], default_root_dir=str(root))
    args.update(extra)
    trainer = lib.Trainer(**args)
    trainer.fit(classes.BoringModel())
    return io, trainer


def test_a_users_checkpoint_io_gets_lightnings_calls(tmp_path):
    theirs_io, their_trainer = _fit_with_io(pl, theirs, their_plugins.CheckpointIO, tmp_path / "theirs")
    ours_io, trainer = _fit_with_io(tasktrain, ours, our_plugins.CheckpointIO, tmp_path / "ours")
    assert ours_io.calls == theirs_io.calls
    assert [c[0] for c in ours_io.calls] == ["save", "save", "remove", "save", "remove"]
    assert sorted(os.listdir(tmp_path / "ours")) == sorted(os.listdir(tmp_path / "theirs")) == ["epoch=2-step=6.ckpt"]
    # a resume loads through it too, with Lightning's arguments
    path = str(tmp_path / "ours" / "epoch=2-step=6.ckpt")
    ours_io.calls.clear()
    trainer = tasktrain.Trainer(**dict(QUIET, max_epochs=4, limit_train_batches=2, limit_val_batches=0,
                                       plugins=[ours_io]))
    trainer.fit(ours.BoringModel(), ckpt_path=path)
    assert ours_io.calls[0] == ("load", "epoch=2-step=6.ckpt", None, None) and trainer.global_step == 8
    # storage_options reach it (the default TorchCheckpointIO refuses them, as Lightning's)
    trainer.save_checkpoint(str(tmp_path / "x.ckpt"), storage_options={"bucket": 1})
    assert ours_io.calls[-1][:3] == ("save", "x.ckpt", {"bucket": 1})
    plain = tasktrain.Trainer(**dict(QUIET, max_steps=1, limit_val_batches=0))
    plain.fit(ours.BoringModel())
    with pytest.raises(TypeError, match="not supported for `TorchCheckpointIO`"):
        plain.save_checkpoint(str(tmp_path / "y.ckpt"), storage_options={"bucket": 1})


def test_async_checkpoint_io_writes_in_the_background_and_finishes_at_teardown(tmp_path):
    inner = _recording_io(our_plugins.CheckpointIO)
    _fit_with_io(tasktrain, ours, our_plugins.CheckpointIO, tmp_path / "a",
                 plugins=[our_plugins.AsyncCheckpointIO(inner)])
    assert [c[0] for c in inner.calls] == ["save", "save", "remove", "save", "remove"]
    assert os.listdir(tmp_path / "a") == ["epoch=2-step=6.ckpt"]
    loaded = torch.load(tmp_path / "a" / "epoch=2-step=6.ckpt", weights_only=True)
    assert loaded["global_step"] == 6


def _weights(lib, classes, **kwargs):
    lib.seed_everything(5, verbose=False)
    model = classes.BoringModel()
    lib.Trainer(**dict(QUIET, max_steps=4, limit_val_batches=0, **kwargs)).fit(model)
    return model.state_dict()


@pytest.mark.parametrize("name,make", [("bf16-mixed", lambda p: p.MixedPrecision("bf16-mixed", "cpu")),
                                       ("16-mixed", lambda p: p.MixedPrecision("16-mixed", "cpu")),
                                       ("bf16-true", lambda p: p.HalfPrecision("bf16-true")),
                                       ("64-true", lambda p: p.DoublePrecision())])
def test_a_precision_plugin_trains_as_its_name_and_as_lightnings_plugin(name, make):
    by_plugin = _weights(tasktrain, ours, plugins=[make(our_plugins)])
    lightning = _weights(pl, theirs, plugins=[make(their_plugins)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (16-mixed by name on a CPU: both say they run bf16-mixed)
        by_name = _weights(tasktrain, ours, precision=name)
        lightning_by_name = _weights(pl, theirs, precision=name)
    for key in by_name:
        torch.testing.assert_close(by_plugin[key], lightning[key], msg=key)
        torch.testing.assert_close(by_name[key], lightning_by_name[key], msg=key)
    # the plugin trains as its name, except 16-mixed by name on a CPU, which both run as bf16-mixed
    same = all(torch.equal(by_plugin[key], by_name[key]) for key in by_name)
    assert same == (name != "16-mixed")


def test_slurm_environment_sets_the_requeue_of_a_fit(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")  # a SLURM job (not a SLURM launch: no SLURM_PROCID / SLURM_NTASKS)
    monkeypatch.delenv("TASKTRAIN_SLURM_REQUEUE", raising=False)
    monkeypatch.delenv("TASKTRAIN_REQUEUE_SIGNAL", raising=False)
    assert requeue.requeue_signal() == signal.SIGUSR1  # the default, from the environment
    seen = {}

    class Handlers(tasktrain.Callback):
        def on_train_start(self, trainer, pl_module):
            seen.update({sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGUSR2)})

    for env, settings, installed in ((SLURMEnvironment(auto_requeue=False), (False, signal.SIGUSR1), None),
                                     (SLURMEnvironment(requeue_signal=signal.SIGUSR2), (True, signal.SIGUSR2),
                                      signal.SIGUSR2)):
        their = TheirSLURM(auto_requeue=env.auto_requeue, requeue_signal=env.requeue_signal)
        assert (their.auto_requeue, their.requeue_signal) == (env.auto_requeue, env.requeue_signal) == settings
        trainer = tasktrain.Trainer(plugins=[env], callbacks=[Handlers()], max_steps=1, limit_val_batches=0, **QUIET)
        trainer.fit(ours.BoringModel())
        for sig in (signal.SIGUSR1, signal.SIGUSR2):  # the run's handler on the plugin's signal only
            assert (seen[sig] is not signal.SIG_DFL) == (sig == installed), (settings, sig)
            assert signal.getsignal(sig) is signal.SIG_DFL  # put back after the fit
    monkeypatch.setenv("TASKTRAIN_SLURM_REQUEUE", "0")
    assert requeue.requeue_signal(settings=(True, signal.SIGUSR2)) == signal.SIGUSR2  # the script's plugin wins


def test_the_environment_plugins_are_checked_against_the_launchers_variables(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID",
                 "TORCHELASTIC_RUN_ID", "TASKTRAIN_LAUNCHER"):
        monkeypatch.delenv(name, raising=False)
    assert TorchElasticEnvironment.detect() is False and SLURMEnvironment.detect() is False
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert TorchElasticEnvironment.detect() is False  # (Lightning's: torchrun sets TORCHELASTIC_RUN_ID too)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    trainer = tasktrain.Trainer(plugins=[TorchElasticEnvironment()], **QUIET)  # torchrun's variables: accepted
    assert TorchElasticEnvironment.detect() and TorchElasticEnvironment().world_size() == trainer.world_size == 1
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name)
    for name, value in (("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1"), ("SLURM_STEP_ID", "0"), ("SLURM_JOB_ID", "9"),
                        ("SLURM_JOB_NAME", "train"), ("SLURM_NNODES", "1"), ("SLURM_TASKS_PER_NODE", "1")):
        monkeypatch.setenv(name, value)
    assert SLURMEnvironment.detect()
    with pytest.raises(ValueError, match="LightningEnvironment.*SLURM job step.*SLURMEnvironment"):
        tasktrain.Trainer(plugins=[LightningEnvironment()], **QUIET)
    with pytest.raises(ValueError, match="not started by torchrun"):
        tasktrain.Trainer(plugins=[TorchElasticEnvironment()], **QUIET)
    tasktrain.Trainer(plugins=[SLURMEnvironment()], **QUIET)


def test_a_failed_background_write_is_raised_at_the_next_call(tmp_path):
    class Failing(our_plugins.TorchCheckpointIO):
        def save_checkpoint(self, checkpoint, path, storage_options=None):
            raise OSError("disk full")

    io = our_plugins.AsyncCheckpointIO(Failing())
    io.save_checkpoint({"w": torch.ones(2)}, str(tmp_path / "a.ckpt"))  # returns: the write runs in the background
    with pytest.raises(tasktrain.checkpoint_io.CheckpointError, match="disk full"):
        io.teardown()
    good = our_plugins.AsyncCheckpointIO()
    tensor = torch.ones(2)
    good.save_checkpoint({"w": tensor}, str(tmp_path / "b.ckpt"))
    tensor.add_(1)  # the copy was taken when save_checkpoint returned
    assert torch.equal(good.load_checkpoint(str(tmp_path / "b.ckpt"))["w"], torch.ones(2))


def test_plugins_from_the_cli_as_lightnings_cli_takes_them():
    pytest.importorskip("jsonargparse")
    from tasktrain.cli import TaskCLI

    plugins = ('[{"class_path": "tasktrain.plugins.environments.SLURMEnvironment", "init_args": {"auto_requeue": '
               'false}}, {"class_path": "tasktrain.plugins.MixedPrecision", "init_args": {"precision": "bf16-mixed", '
               '"device": "cpu"}}]')
    cli = TaskCLI(ours.BoringModel, run=False, seed_everything_default=False,
                  args=["--trainer.plugins", plugins, "--trainer.logger", "false", "--trainer.accelerator", "cpu"])
    assert cli.trainer.precision == "bf16-mixed" and cli.trainer._requeue_settings == (False, signal.SIGUSR1)


def test_a_lightning_strategys_precision_plugin_and_cluster_environment_are_taken_as_plugins_are(monkeypatch):
    from lightning.pytorch.strategies import DDPStrategy as TheirDDP

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "77")  # a SLURM job, where SLURMEnvironment's requeue settings apply
    theirs_trainer = pl.Trainer(strategy=TheirDDP(precision_plugin=their_plugins.DoublePrecision()), **QUIET)
    env = SLURMEnvironment(auto_requeue=False, requeue_signal=signal.SIGUSR2)
    trainer = tasktrain.Trainer(strategy=tasktrain.strategies.DDPStrategy(
        precision_plugin=our_plugins.DoublePrecision(), cluster_environment=env), **QUIET)
    assert trainer.precision == theirs_trainer.precision == "64-true"
    assert trainer.strategy.cluster_environment is env and trainer._requeue_settings == (False, signal.SIGUSR2)
    fsdp = tasktrain.strategies.FSDPStrategy(cluster_environment=LightningEnvironment())
    assert isinstance(fsdp.cluster_environment, LightningEnvironment)
    # the strategy's beside a plugin: Lightning keeps the strategy's and drops the plugin unsaid; refused here
    with pytest.raises(MisconfigurationException, match="cluster_environment set through both"):
        tasktrain.Trainer(strategy=tasktrain.strategies.DDPStrategy(cluster_environment=SLURMEnvironment()),
                          plugins=[SLURMEnvironment(auto_requeue=False)], **QUIET)
    with pytest.raises(ValueError, match="give the precision once"):
        tasktrain.strategies.DDPStrategy(precision="bf16-mixed", precision_plugin=our_plugins.DoublePrecision())
    with pytest.raises(ValueError, match=r"DDPStrategy\(parallel_devices=.*CUDA_VISIBLE_DEVICES"):
        tasktrain.strategies.DDPStrategy(parallel_devices=[torch.device("cuda", 1)] * 2)  # (taken on CPUs: below)
    with pytest.raises(ValueError, match=r"cluster_environment=object.*tasktrain.plugins.environments"):
        tasktrain.strategies.DDPStrategy(cluster_environment=object())


def test_a_strategys_precision_plugin_with_lightnings_step_hooks_is_taken_as_in_plugins():
    class Hooked(our_plugins.MixedPrecision):
        def pre_backward(self, tensor, module):  # one of Lightning's step hooks: the step runs through them
            return super().pre_backward(tensor, module)

    for trainer in (tasktrain.Trainer(strategy=tasktrain.strategies.DDPStrategy(
            precision_plugin=Hooked("bf16-mixed", "cpu")), **QUIET),
            tasktrain.Trainer(plugins=[Hooked("bf16-mixed", "cpu")], **QUIET)):
        assert isinstance(trainer.precision_plugin, Hooked) and trainer.precision_plugin.lightning_steps


def test_single_device_strategy_under_lightnings_name_and_arguments(tmp_path):
    from lightning.pytorch.strategies import SingleDeviceStrategy as TheirSingle

    from tasktrain.strategies import SingleDeviceStrategy

    theirs_trainer = pl.Trainer(strategy=TheirSingle(device=torch.device("cpu"),
                                                     precision_plugin=their_plugins.DoublePrecision()), **QUIET)
    io = our_plugins.TorchCheckpointIO()
    strategy = SingleDeviceStrategy(device=torch.device("cpu"), precision_plugin=our_plugins.DoublePrecision(),
                                    checkpoint_io=io)
    trainer = tasktrain.Trainer(strategy=strategy, **QUIET)
    assert trainer.strategy is strategy and trainer.strategy.checkpoint_io is io
    assert trainer.strategy.root_device == theirs_trainer.strategy.root_device == torch.device("cpu")
    assert trainer.precision == theirs_trainer.precision == "64-true"
    with pytest.raises(ValueError, match="give the precision once"):
        SingleDeviceStrategy(precision="bf16-mixed", precision_plugin=our_plugins.DoublePrecision())


@pytest.mark.world_size(2)
@pytest.mark.timeout(280)
def test_cluster_environments_form_the_process_group_as_under_lightning(tmp_path):
    """2 processes started by the test with the cluster's own variables only (no torchrun's).
    A user's ClusterEnvironment (creates_processes_externally=True) gives each rank, the world size and the address
    and port; nothing is spawned; the environment gets Lightning's calls, and the weights after are Lightning's.
    Then tasktrain under Kubeflow's variables (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK as its operator gives each
    pod) and LSF's (LSB_JOBID, LSB_DJOB_RANKFILE, JSM_NAMESPACE_* as jsrun gives each task; a rank file in tmp_path
    naming this host twice): the environment's ranks form the group, LSF is detected without a plugin with its port
    LSB_JOBID % 1000 + 10000, and the weights after are the Lightning fit's (the same world of 2). One launch for all:
    the script runs the phases one after the other; Lightning's reading of these variables is compared without a
    launch (test_kubeflow_environment_... and test_lsf_environment_... below)."""
    import json
    import random
    import socket
    import subprocess
    import sys

    from ddp_scripts.common import child_env, free_port, script

    ports = [str(free_port()), str(free_port())]
    kubeflow_port = str(free_port())
    lsf_port = random.choice([p for p in range(10000, 11000) if _port_free(p)])
    jobid = str(7000 + lsf_port - 10000)  # (7000 % 1000 == 0: the port is 10000 + the rest)
    rankfile = tmp_path / "rankfile"
    rankfile.write_text(f"launchnode\n{socket.gethostname()}\n{socket.gethostname()}\n")
    root = os.path.dirname(os.path.dirname(__file__))
    procs = [subprocess.Popen(
        [sys.executable, script("custom_environment.py"), str(tmp_path)],
        env=child_env(MY_RANK=str(r), MY_WORLD="2", MY_ADDR="127.0.0.1", MY_PORT=ports[0], MY_PORT2=ports[1],
                      RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MY_KUBEFLOW_PORT=kubeflow_port,
                      LSB_DJOB_RANKFILE=str(rankfile), JSM_NAMESPACE_SIZE="2", JSM_NAMESPACE_RANK=str(r),
                      JSM_NAMESPACE_LOCAL_RANK=str(r), MY_JOBID=jobid,
                      PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    try:
        logs = [proc.communicate(timeout=240)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert [proc.returncode for proc in procs] == [0, 0], "\n".join(logs)
    seen = [json.load(open(tmp_path / f"rank{rank}.json")) for rank in (0, 1)]
    for rank in (0, 1):
        ours, theirs = seen[rank]["tasktrain"], seen[rank]["lightning"]
        # the ranks are set when the Trainer is built, then again at the set-up (Lightning's calls, in its order)
        assert ours["calls"] == theirs["calls"] == [["set_global_rank", rank], ["set_world_size", 2],
                                                    ["validate_settings", 2, 1], ["set_global_rank", rank],
                                                    ["set_world_size", 2], ["teardown"]]
        assert ours["strategy"] == ours["group"] == theirs["group"] == [rank, 2]
        assert ours["master"] == ["127.0.0.1", ports[0]] and theirs["master"] == ["127.0.0.1", ports[1]]
        assert ours["weights"] == theirs["weights"]
        for phase, environment, address, port in (("kubeflow", "KubeflowEnvironment", "127.0.0.1", kubeflow_port),
                                                  ("lsf", "LSFEnvironment", socket.gethostname(), lsf_port)):
            ours = seen[rank][phase]
            assert ours["environment"] == environment
            assert ours["strategy"] == ours["group"] == [rank, 2]
            assert ours["master"] == [address, str(port)]
            assert ours["weights"] == seen[rank]["lightning"]["weights"]


def _port_free(port):
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_users_cluster_environment_decides_whether_the_trainer_starts_the_processes(monkeypatch):
    """creates_processes_externally: False, the Trainer starts the other ranks itself (as Lightning's launcher);
    True, the cluster did. A world that is not devices x num_nodes is an error before any process group forms."""
    class Mine(ClusterEnvironment):
        def __init__(self, external, world=2):
            self.external, self.world = external, world

        @property
        def creates_processes_externally(self):
            return self.external

        main_address, main_port = "127.0.0.1", 1

        def world_size(self):
            return self.world

        def global_rank(self):
            return 0

        def local_rank(self):
            return 0

        def node_rank(self):
            return 0

    for external in (False, True):
        env = Mine(external)
        trainer = tasktrain.Trainer(plugins=[env], strategy="ddp", **{**QUIET, "devices": 2})
        assert trainer.strategy.cluster_environment is env
        assert trainer.strategy.needs_launch() is not external
        assert trainer.strategy.launcher.external is external  # Lightning's: a launcher, that starts nothing there
    trainer = tasktrain.Trainer(plugins=[Mine(True, world=3)], strategy="ddp", **{**QUIET, "devices": 2})
    # (the numbers to pass are the environment's world, not a count on this machine, which a ClusterEnvironment lacks)
    with pytest.raises(RuntimeError, match=r"environment Mine \(plugins=\[...\]\) formed a world of 3 processes, but "
                                           r"the Trainer asked for devices=2 x num_nodes=1 = 2\. .*whose product is 3"):
        trainer.strategy.setup_environment()

    # not external: the Trainer starts the workers, where the environment says they meet (Lightning's launcher)
    class Started(Exception):
        pass

    def launch(self):
        seen.update({name: os.environ.get(name) for name in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK")})
        raise Started

    seen = {}
    env = Mine(False)
    env.main_address, env.main_port = "127.0.0.2", 29871
    trainer = tasktrain.Trainer(plugins=[env], strategy="ddp", **{**QUIET, "devices": 2})
    from tasktrain.strategies import launcher

    monkeypatch.setattr(launcher.SubprocessLauncher, "launch", launch)
    for name in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK"):
        monkeypatch.setenv(name, "")  # (restored after the test)
    with pytest.raises(Started):
        trainer.strategy.setup_environment()
    assert seen == {"MASTER_ADDR": "127.0.0.2", "MASTER_PORT": "29871", "NODE_RANK": "0"}
    from tasktrain.plugins.environments import XLAEnvironment

    with pytest.raises(ValueError, match="subclass ClusterEnvironment"):  # (no torch_xla)
        tasktrain.Trainer(plugins=[XLAEnvironment()], **QUIET)


def _clear_launch_variables(monkeypatch):
    for name in [n for n in os.environ if n.startswith(("SLURM_", "TORCHELASTIC_", "JSM_", "LSB_")) or n in (
            "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
            "TASKTRAIN_LAUNCHER")]:
        monkeypatch.delenv(name)


def _outcome_of(call):
    try:
        return call()
    except Exception as err:  # noqa: BLE001 (the type and words are compared)
        return type(err).__name__, str(err)


def _environment_seen(lib, name, detected=True, **kwargs):
    """What a script reads from one of the built-in environments under each framework: its getters (or the error
    each raises), detect(), what its constructor left in MASTER_ADDR / MASTER_PORT, and the Trainer's ranks, world
    and environment right after Trainer(plugins=[it], **kwargs), and with no plugin (what each framework detects)."""
    import importlib

    environments = importlib.import_module("lightning.pytorch.plugins.environments" if lib is pl else
                                           "tasktrain.plugins.environments")
    cls = getattr(environments, name)
    env = _outcome_of(cls)
    if isinstance(env, tuple):  # (the constructor raised)
        return env
    getters = [_outcome_of(lambda g=g: g() if callable(g) else getattr(env, g)) for g in (
        "main_address", "main_port", "creates_processes_externally", env.world_size, env.global_rank,
        env.local_rank, env.node_rank, cls.detect)]
    env.set_global_rank(99)
    env.set_world_size(99)  # (ignored: the cluster decides)
    getters += [_outcome_of(env.global_rank), _outcome_of(env.world_size),
                [os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")]]
    rank_zero = importlib.import_module("tasktrain.compat.lightning.utilities.rank_zero" if lib is tasktrain else
                                        "lightning.pytorch.utilities.rank_zero").rank_zero_only
    from tasktrain.trainer import runtime

    trainers = []
    for plugins in ([cls()], None) if detected else ([cls()],):
        before, known = rank_zero.rank, list(runtime._KNOWN_RANK)
        try:
            trainer = lib.Trainer(plugins=plugins, **{**QUIET, **kwargs})
            trainers.append([trainer.global_rank, trainer.local_rank, trainer.node_rank, trainer.world_size,
                             trainer.is_global_zero, trainer.strategy.global_rank, rank_zero.rank,
                             # (which of them; a one-process strategy holds none: Lightning's has no such attribute)
                             type(getattr(trainer.strategy, "cluster_environment", None)).__name__.replace(
                                 "NoneType", "LightningEnvironment")])
        except Exception as err:  # noqa: BLE001
            trainers.append([type(err).__name__, str(err)])
        finally:
            rank_zero.rank, runtime._KNOWN_RANK[:] = before, known
    return getters, trainers


def _same_environment(name, monkeypatch, detected=True, **kwargs):
    seen = []
    for lib in (pl, tasktrain):
        with monkeypatch.context() as patch:  # (LSF's constructor sets MASTER_ADDR / MASTER_PORT: undone after each)
            for variable in ("MASTER_ADDR", "MASTER_PORT"):
                if variable in os.environ:
                    patch.setenv(variable, os.environ[variable])
                else:
                    patch.delenv(variable, raising=False)
            seen.append(_environment_seen(lib, name, detected, **kwargs))
    assert seen[0] == seen[1]
    return seen[1]


def test_kubeflow_environment_reads_its_variables_as_lightnings(monkeypatch):
    """MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK; local rank 0, node rank = RANK (one process a pod); never detected;
    a missing variable is the same KeyError; the Trainer's ranks right after it is built are the environment's."""
    _clear_launch_variables(monkeypatch)
    for name, value in dict(MASTER_ADDR="10.1.2.3", MASTER_PORT="23456", WORLD_SIZE="4", RANK="3").items():
        monkeypatch.setenv(name, value)
    # (never detected: what a Trainer without it reads from RANK alone is another matter, not compared here)
    getters, trainers = _same_environment("KubeflowEnvironment", monkeypatch, False, strategy="ddp", num_nodes=4)
    assert getters[:7] == ["10.1.2.3", 23456, True, 4, 3, 0, 3]
    assert getters[7][0] == "NotImplementedError"
    assert trainers == [[3, 0, 3, 4, False, 3, 3, "KubeflowEnvironment"]]
    monkeypatch.delenv("RANK")
    getters, _ = _same_environment("KubeflowEnvironment", monkeypatch, False, strategy="ddp", num_nodes=4)
    assert getters[4] == ("KeyError", "'RANK'")


def test_lsf_environment_reads_its_variables_and_is_detected_as_lightnings(monkeypatch, tmp_path):
    """LSB_DJOB_RANKFILE (its first line the launch node: the main address is the next, the node rank this host's place
    among the hosts), JSM_NAMESPACE_SIZE / _RANK / _LOCAL_RANK, the port MASTER_PORT or LSB_JOBID % 1000 + 10000,
    MASTER_ADDR / MASTER_PORT set by the constructor; detected with no plugin where the variables are set (not
    otherwise); missing variables are the same errors."""
    import socket

    _clear_launch_variables(monkeypatch)
    rankfile = tmp_path / "rankfile"
    rankfile.write_text(f"launch\nnode-a\nnode-a\n{socket.gethostname()}\n{socket.gethostname()}\nnode-c\n")
    for name, value in dict(LSB_JOBID="123456", LSB_DJOB_RANKFILE=str(rankfile), JSM_NAMESPACE_SIZE="6",
                            JSM_NAMESPACE_RANK="3", JSM_NAMESPACE_LOCAL_RANK="1").items():
        monkeypatch.setenv(name, value)
    getters, trainers = _same_environment("LSFEnvironment", monkeypatch, strategy="ddp", devices=2, num_nodes=3)
    assert getters[:8] == ["node-a", 10456, True, 6, 3, 1, 1, True]
    assert getters[-1] == ["node-a", "10456"]
    assert trainers == [[3, 1, 1, 6, False, 3, 3, "LSFEnvironment"]] * 2  # (the plugin, and detected)
    monkeypatch.setenv("MASTER_PORT", "24680")  # a port of one's own wins over the job id's
    getters, _ = _same_environment("LSFEnvironment", monkeypatch, strategy="ddp", devices=2, num_nodes=3)
    assert getters[1] == 24680
    monkeypatch.delenv("MASTER_PORT")
    monkeypatch.delenv("JSM_NAMESPACE_RANK")  # (not one detect() needs)
    getters, trainers = _same_environment("LSFEnvironment", monkeypatch, strategy="ddp", devices=2, num_nodes=3)
    assert getters[4][0] == "ValueError" and "JSM_NAMESPACE_RANK" in getters[4][1]
    monkeypatch.delenv("JSM_NAMESPACE_SIZE")  # not detected any more; the plugin's world size is the error
    getters, trainers = _same_environment("LSFEnvironment", monkeypatch, strategy="ddp", devices=2, num_nodes=3)
    assert getters[7] is False and trainers[1][-1] == "LightningEnvironment"
    monkeypatch.delenv("LSB_DJOB_RANKFILE")
    assert _same_environment("LSFEnvironment", monkeypatch) == (
        "ValueError", "Did not find the environment variable `LSB_DJOB_RANKFILE`")


def test_a_broken_lsf_rank_file_is_an_error_naming_it(monkeypatch, tmp_path):
    """A rank file with no compute host, or without this host, is a ValueError naming the file (Lightning's: an
    IndexError, or `'host' is not in list`)."""
    from tasktrain.plugins.environments import LSFEnvironment

    _clear_launch_variables(monkeypatch)
    rankfile = tmp_path / "rankfile"
    monkeypatch.setenv("LSB_JOBID", "1")
    monkeypatch.setenv("LSB_DJOB_RANKFILE", str(rankfile))
    for text, words in (("launch\n", "lists no compute host"), ("launch\nnode-x\n", "is not in LSF's rank file")):
        rankfile.write_text(text)
        with pytest.raises(ValueError, match=words) as error:
            LSFEnvironment()
        assert str(rankfile) in str(error.value)


class _FakeComm:
    """mpi4py's COMM_WORLD as rank 3 of 4 sees it on its host (the second of two): what rank 0 broadcasts and
    gathers is given."""

    def __init__(self, hosts, rank=3, local_rank=1):
        self.hosts, self.rank, self.local_rank, self.colors = hosts, rank, local_rank, []

    def Get_size(self):  # noqa: N802 (mpi4py's names)
        return len(self.hosts)

    def Get_rank(self):  # noqa: N802
        return self.rank

    def bcast(self, value, root=0):
        return 31337 if isinstance(value, int) else ("node-0" if isinstance(value, str) else value)

    def gather(self, value, root=0):
        return list(self.hosts)

    def Split(self, color):  # noqa: N802
        self.colors.append(color)
        return _FakeComm(self.hosts, rank=self.local_rank)


def test_mpi_environment_reads_mpi_as_lightnings(monkeypatch):
    """Without mpi4py (not a dependency): the same ModuleNotFoundError naming mpi4py, and not detected. With it (a
    stand-in module here: MPI's COMM_WORLD): ranks and world from MPI, the node rank this host's place among the
    sorted host names, the local rank from the host's split communicator, address and port broadcast from rank 0;
    detected with no plugin where MPI's world is larger than one."""
    import socket
    import sys
    import types

    from lightning.fabric.plugins.environments import mpi as their_mpi

    from tasktrain.plugins import environments as our_environments

    _clear_launch_variables(monkeypatch)
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # (not installed here either way: the import fails)
    ours_, theirs_ = (_outcome_of(lib.MPIEnvironment) for lib in (our_environments, their_mpi))
    assert ours_[0] == theirs_[0] == "ModuleNotFoundError" and "mpi4py" in ours_[1]
    assert our_environments.MPIEnvironment.detect() is their_mpi.MPIEnvironment.detect() is False

    comm = _FakeComm(["node-b", socket.gethostname(), "node-b", socket.gethostname()])
    module = types.ModuleType("mpi4py")
    module.MPI = types.SimpleNamespace(COMM_WORLD=comm)
    monkeypatch.setitem(sys.modules, "mpi4py", module)
    monkeypatch.setattr(their_mpi, "_MPI4PY_AVAILABLE", True)
    monkeypatch.setattr(our_environments, "_mpi4py_installed", lambda: True)
    getters, trainers = _same_environment("MPIEnvironment", monkeypatch, strategy="ddp", devices=2, num_nodes=2)
    host_rank = sorted({"node-b", socket.gethostname()}).index(socket.gethostname())
    assert getters[:8] == ["node-0", 31337, True, 4, 3, 1, host_rank, True]
    assert trainers == [[3, 1, host_rank, 4, False, 3, 3, "MPIEnvironment"]] * 2  # (the plugin, and detected)
    assert set(comm.colors) == {host_rank}


def _recording_environment(base):
    """A ClusterEnvironment of one's own (on `base`, tasktrain's or Lightning's class) that records the ranks it is
    told and reports local and node rank 1."""
    return recording_environment(base, local_rank=1, node_rank=1)


def test_a_users_cluster_environments_ranks_are_the_trainers_right_after_it_is_built():
    """Lightning's strategy with several processes tells the user's environment the ranks when it is built
    (set_global_rank(node_rank * devices + local_rank), set_world_size(num_nodes * devices)) and reads its ranks from it
    from then on: trainer.global_rank & co. right after Trainer(...) are the environment's (they were 0 here until the
    run's set-up). A one-process strategy calls nothing and reads rank 0."""
    from lightning.pytorch.plugins.environments import ClusterEnvironment as Theirs

    def built(lib, base, **kwargs):
        env = _recording_environment(base)
        import importlib

        rank_zero = importlib.import_module("tasktrain.compat.lightning.utilities.rank_zero" if lib is tasktrain else
                                            "lightning.pytorch.utilities.rank_zero").rank_zero_only
        from tasktrain.trainer import runtime

        before, known = rank_zero.rank, list(runtime._KNOWN_RANK)
        try:
            trainer = lib.Trainer(plugins=[env], **{**QUIET, **kwargs})
            rank = rank_zero.rank
        finally:
            rank_zero.rank, runtime._KNOWN_RANK[:] = before, known
        return env.calls, [trainer.global_rank, trainer.local_rank, trainer.node_rank, trainer.world_size,
                           trainer.is_global_zero, trainer.strategy.global_rank, rank]

    for kwargs in (dict(strategy="ddp", devices=2, num_nodes=2), dict(strategy="ddp", devices=3, num_nodes=2),
                   dict(devices=1)):
        ours_, theirs_ = built(tasktrain, ClusterEnvironment, **kwargs), built(pl, Theirs, **kwargs)
        assert ours_ == theirs_
    assert built(tasktrain, ClusterEnvironment, strategy="ddp", devices=2, num_nodes=2) == (
        [("set_global_rank", 3), ("set_world_size", 4)], [3, 1, 1, 4, False, 3, 3])


def test_a_strategys_parallel_devices_with_a_users_cluster_environment_as_under_lightning():
    """Lightning's DDPStrategy / FSDPStrategy(parallel_devices=[cpu, cpu], cluster_environment=...): the devices of a
    node, one process each, win over the Trainer's devices= (said here, silent there) and set the accelerator (another
    one is Lightning's error, its words); the environment gets the same calls and the Trainer the same ranks."""
    from lightning.pytorch.plugins.environments import ClusterEnvironment as Theirs

    def built(lib, base, strategy_name, devices, accelerator="cpu", parallel=("cpu", "cpu")):
        env = _recording_environment(base)
        strategy = getattr(lib.strategies, strategy_name)(parallel_devices=[torch.device(d) for d in parallel],
                                                         cluster_environment=env)
        import importlib

        rank_zero = importlib.import_module("tasktrain.compat.lightning.utilities.rank_zero" if lib is tasktrain else
                                            "lightning.pytorch.utilities.rank_zero").rank_zero_only
        from tasktrain.trainer import runtime

        before, known = rank_zero.rank, list(runtime._KNOWN_RANK)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                trainer = lib.Trainer(strategy=strategy, num_nodes=2, **{**QUIET, "devices": devices,
                                                                         "accelerator": accelerator})
        except Exception as err:  # noqa: BLE001 (the type and words are compared)
            return type(err).__name__, str(err)
        finally:
            rank_zero.rank, runtime._KNOWN_RANK[:] = before, known
        said = [str(w.message) for w in caught if "parallel_devices" in str(w.message)]
        return env.calls, [trainer.global_rank, trainer.local_rank, trainer.node_rank, trainer.world_size,
                           trainer.num_devices, trainer.strategy.root_device, trainer.strategy.parallel_devices,
                           trainer.accelerator.__class__.__name__], said

    for devices in ("auto", 2, 3):
        ours_, theirs_ = built(tasktrain, ClusterEnvironment, "DDPStrategy", devices), built(pl, Theirs, "DDPStrategy",
                                                                                          devices)
        assert ours_[:2] == theirs_[:2]
        assert ours_[:2] == ([("set_global_rank", 3), ("set_world_size", 4)],
                             [3, 1, 1, 4, 2, torch.device("cpu"), [torch.device("cpu")] * 2, "CPUAccelerator"])
        assert theirs_[2] == [] and len(ours_[2]) == (devices == 3)  # (Lightning drops devices=3 silently)
        # (Lightning's FSDPStrategy needs a GPU; tasktrain's runs on CPUs and reads parallel_devices as DDP's does)
        fsdp = built(tasktrain, ClusterEnvironment, "FSDPStrategy", devices)
        assert fsdp[:2] == ours_[:2] and [said.replace("FSDP", "DDP") for said in fsdp[2]] == ours_[2]
    assert built(tasktrain, ClusterEnvironment, "DDPStrategy", "auto", accelerator="gpu") == \
        built(pl, Theirs, "DDPStrategy", "auto", accelerator="gpu")[:2] == (
        "MisconfigurationException", "CPU parallel_devices set through DDPStrategy class, but accelerator set to gpu, "
                                     "please choose one device type")
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):  # (tasktrain's ranks use the first N GPUs)
        tasktrain.strategies.DDPStrategy(parallel_devices=[torch.device("cuda", 1)])


@pytest.mark.parametrize("variables", [dict(LOCAL_RANK="1", NODE_RANK="1"), dict(LOCAL_RANK="0", GROUP_RANK="1"),
                                       dict(LOCAL_RANK="1"), {}])
def test_local_rank_without_rank_is_a_process_launched_outside_as_under_lightning(variables, monkeypatch):
    """LOCAL_RANK (with NODE_RANK or GROUP_RANK) set without torchrun's RANK / WORLD_SIZE: Lightning's
    LightningEnvironment takes the process as one rank of a world a launcher of one's own started (global rank
    node_rank * devices + local_rank of devices * num_nodes) and starts nothing; tasktrain took it as a plain
    `python train.py` and would have started the other ranks itself. A world of several without MASTER_PORT is an
    error at the set-up (Lightning picks a free port in each process: the ranks would never meet)."""
    for name in [n for n in os.environ if n.startswith(("SLURM_", "TORCHELASTIC_")) or n in (
            "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "MASTER_PORT", "TASKTRAIN_LAUNCHER")]:
        monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)

    def built(lib):
        return lib.Trainer(strategy="ddp", num_nodes=2, **{**QUIET, "devices": 2})

    ours_, theirs_ = built(tasktrain), built(pl)
    assert [ours_.global_rank, ours_.local_rank, ours_.node_rank, ours_.world_size] == \
        [theirs_.global_rank, theirs_.local_rank, theirs_.node_rank, theirs_.world_size]
    # whether the Trainer starts the other ranks (Lightning's launcher asks its environment)
    assert ours_.strategy.needs_launch() is not theirs_.strategy.cluster_environment.creates_processes_externally
    assert ours_.strategy.needs_launch() is not bool(variables)
    if variables:
        with pytest.raises(RuntimeError, match="MASTER_PORT is not set"):
            ours_.strategy.setup_environment()


@pytest.mark.parametrize("devices, local_rank", [(1, 1), (2, 2)])
def test_a_local_rank_beyond_the_devices_is_refused_at_the_set_up(devices, local_rank, monkeypatch):
    """strategy="ddp" with LOCAL_RANK set (no torchrun) at or past `devices`: Lightning reads the ranks from it (rank 1
    of 1 for devices=1, LOCAL_RANK=1) and its set-up fails on `parallel_devices[local_rank]` with a bare IndexError.
    tasktrain read the same ranks for devices=2 and made devices=1 rank 0 of 1 (training as if LOCAL_RANK were not
    set); both now read Lightning's ranks and refuse at the set-up, before any process group, with an IndexError (a
    MisconfigurationException too) that names LOCAL_RANK, devices and the fix."""
    for name in [n for n in os.environ if n.startswith(("SLURM_", "TORCHELASTIC_")) or n in (
            "RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "TASKTRAIN_LAUNCHER")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")  # (never reached: the set-up refuses first)

    def run(lib, boring):
        trainer = lib.Trainer(strategy="ddp", max_steps=1, **{**QUIET, "devices": devices})
        ranks = [trainer.global_rank, trainer.local_rank, trainer.world_size, trainer.is_global_zero]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(IndexError) as refused:
                trainer.fit(boring.BoringModel())
        return ranks, refused.value

    (ours_, mine), (theirs_, their_error) = run(tasktrain, ours), run(pl, theirs)
    assert ours_ == theirs_ == [local_rank, local_rank, devices, False]
    assert str(their_error) == "list index out of range"
    assert isinstance(mine, MisconfigurationException)
    assert f"LOCAL_RANK={local_rank}" in str(mine) and f"devices={devices}" in str(mine)
    assert "LOCAL_RANK must be smaller than devices" in str(mine) and "Unset LOCAL_RANK" in str(mine)


def _layer_sync_record(lib, plugins_module, strategy, fail=False, validate=True, plugins=None):
    """A fit with a LayerSync of the user's that swaps the module's BatchNorm for a subclass in place (apply) and back
    (revert): the order of its calls among the module's hooks, and the layer's class each training step saw."""
    events = []

    class Synced(torch.nn.BatchNorm1d):
        pass

    class MySync(plugins_module.LayerSync):
        def apply(self, model):
            events.append(("apply", type(model.norm).__name__, model.trainer.state.fn))
            old = model.norm
            model.norm = Synced(old.num_features)
            model.norm.load_state_dict(old.state_dict())
            return model

        def revert(self, model):
            events.append(("revert", type(model.norm).__name__))
            model.norm = torch.nn.BatchNorm1d(model.norm.num_features)
            return model

    boring = theirs if lib is pl else ours

    class Model(boring.BoringModel):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.BatchNorm1d(32)

        def configure_model(self):
            events.append(("configure_model", type(self.norm).__name__))

        def configure_optimizers(self):
            events.append(("configure_optimizers", type(self.norm).__name__))
            return super().configure_optimizers()

        def on_fit_start(self):
            events.append(("on_fit_start",))

        def training_step(self, batch, batch_idx):
            events.append(("training_step", type(self.norm).__name__))
            if fail:
                raise RuntimeError("a failed step")
            return super().training_step(self.norm(batch), batch_idx)

        def on_fit_end(self):
            events.append(("on_fit_end",))

        def teardown(self, stage):
            events.append(("teardown", str(stage)))

    torch.manual_seed(0)
    model = Model()
    trainer = lib.Trainer(plugins=[MySync()] if plugins is None else plugins, strategy=strategy, max_steps=2,
                          limit_val_batches=0, **QUIET)
    try:
        trainer.fit(model, torch.utils.data.DataLoader(boring.RandomDataset(32, 16), batch_size=4))
    except RuntimeError as err:
        events.append(("raised", str(err)))
    finally:  # Lightning's world of one outlives its run (ours ends at teardown, or DeepSpeed's is kept for a save
        if lib is pl and torch.distributed.is_initialized():  # after the run and released by the next): not left
            torch.distributed.destroy_process_group()
    if validate:
        trainer.validate(model, verbose=False)  # not a fit: no apply
    events.append(("after", type(model.norm).__name__))
    return [tuple(str(part) for part in event) for event in events]


@pytest.mark.parametrize("strategy,fail", [("ddp", False), ("ddp", True), ("auto", False)])
def test_a_users_layer_sync_wraps_a_fit_as_lightnings_does(strategy, fail):
    ours_seen = _layer_sync_record(tasktrain, our_plugins, strategy, fail)
    theirs_seen = _layer_sync_record(pl, their_plugins, strategy, fail)
    assert ours_seen == theirs_seen
    if strategy == "ddp":  # applied after configure_model, before configure_optimizers; reverted before on_fit_end
        assert ("apply", "BatchNorm1d", "TrainerFn.FITTING") in ours_seen and ("revert", "Synced") in ours_seen
        assert ("training_step", "Synced") in ours_seen
    else:  # a one-process strategy does not call it, under either
        assert not any(event[0] in ("apply", "revert") for event in ours_seen)


def test_a_layer_sync_under_deepspeed_or_model_parallel_is_not_applied_as_under_lightning_and_said_so():
    """Lightning's DeepSpeed and ModelParallel strategies take a LayerSync (plugins=[...] or sync_batchnorm=True) and
    never apply it, saying nothing; tasktrain's do not apply it either and warn. ModelParallel runs beside Lightning on
    the CPU (the same events, no apply / revert); Lightning's DeepSpeed needs CUDA, so tasktrain's runs alone."""
    def recorded(lib, plugins_module, strategy, **kwargs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            events = _layer_sync_record(lib, plugins_module, strategy, **kwargs)
        return events, [str(w.message) for w in caught if "not applied" in str(w.message)]

    ours_seen, said = recorded(tasktrain, our_plugins, tasktrain.strategies.ModelParallelStrategy())
    theirs_seen, _ = recorded(pl, their_plugins, pl.strategies.ModelParallelStrategy())
    # (tasktrain's ModelParallel shards the layers with fully_shard where Lightning's leaves it to configure_model:
    # their class is torch's FSDPBatchNorm1d, a BatchNorm1d)
    assert [tuple(part.replace("FSDPBatchNorm1d", "BatchNorm1d") for part in e) for e in ours_seen] == theirs_seen
    assert not any(event[0] in ("apply", "revert") for event in ours_seen)
    assert [e for e in theirs_seen if e[0] == "training_step"] == [("training_step", "BatchNorm1d")] * 2
    assert len(said) == 1 and "plugins=[MySync(...)] is not applied under ModelParallelStrategy" in said[0]
    pytest.importorskip("deepspeed")
    for plugins, given in ((None, "plugins=[MySync(...)]"), ([our_plugins.TorchSyncBatchNorm()], "sync_batchnorm=True")):
        ours_seen, said = recorded(tasktrain, our_plugins, "deepspeed", validate=False, plugins=plugins)
        assert [e for e in ours_seen if e[0] in ("apply", "revert", "training_step")] == [
            ("training_step", "BatchNorm1d")] * 2
        assert len(said) == 1 and f"{given} is not applied under DeepSpeed" in said[0]
    with pytest.raises(RuntimeError, match="only supported on CUDA"):  # (Lightning's DeepSpeed: not on this CPU)
        _layer_sync_record(pl, their_plugins, "deepspeed")


def test_a_layer_sync_that_returns_another_module_is_refused():
    class Copying(our_plugins.LayerSync):
        def apply(self, model):
            return torch.nn.Sequential(model)

        def revert(self, model):
            return model

    trainer = tasktrain.Trainer(plugins=[Copying()], strategy="ddp", max_steps=1, **QUIET)
    try:
        with pytest.raises(ValueError, match=r"Copying.apply\(model\) returned another module.*in place"):
            trainer.fit(ours.BoringModel())
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _precision_hooks_record(lib, plugins_module, tmp_path):
    """A MixedPrecision("bf16-mixed", "cpu") subclass overriding the hooks tasktrain calls, each recording its call
    (and whether autocast was on inside the step contexts): fit with validation, a checkpoint, a resumed fit,
    validate, test, predict and init_module, the calls in order."""
    calls = []
    boring = theirs if lib is pl else ours

    class Recording(plugins_module.MixedPrecision):
        @contextlib.contextmanager
        def forward_context(self):
            with super().forward_context():
                calls.append(("forward_context", torch.is_autocast_enabled("cpu")))
                yield

        @contextlib.contextmanager
        def train_step_context(self):
            calls.append(("train_step_context",))
            with super().train_step_context():
                yield

        @contextlib.contextmanager
        def val_step_context(self):
            calls.append(("val_step_context",))
            with super().val_step_context():
                yield

        @contextlib.contextmanager
        def test_step_context(self):
            calls.append(("test_step_context",))
            with super().test_step_context():
                yield

        @contextlib.contextmanager
        def predict_step_context(self):
            calls.append(("predict_step_context",))
            with super().predict_step_context():
                yield

        def convert_module(self, module):
            calls.append(("convert_module", type(module).__name__))
            return super().convert_module(module)

        @contextlib.contextmanager
        def tensor_init_context(self):
            calls.append(("tensor_init_context",))
            with super().tensor_init_context():
                yield

        @contextlib.contextmanager
        def module_init_context(self):
            calls.append(("module_init_context",))
            with super().module_init_context():
                yield

        def state_dict(self):
            calls.append(("state_dict",))
            return {"mine": 1}

        def load_state_dict(self, state):
            calls.append(("load_state_dict", state))

        def teardown(self):
            calls.append(("teardown",))

    class Model(boring.BoringModel):
        def configure_model(self):
            calls.append(("configure_model", torch.get_default_dtype()))

        def on_fit_start(self):
            calls.append(("on_fit_start",))

        def on_fit_end(self):
            calls.append(("on_fit_end",))

    def trainer(**kwargs):
        return lib.Trainer(plugins=[Recording("bf16-mixed", "cpu")], default_root_dir=str(tmp_path), logger=False,
                           enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                           accelerator="cpu", devices=1, **kwargs)

    torch.manual_seed(0)
    model = Model()
    fit = trainer(max_steps=2, limit_val_batches=1, val_check_interval=2, num_sanity_val_steps=0)
    fit.fit(model)
    fit.save_checkpoint(str(tmp_path / "mid.ckpt"))
    calls.append(("resume",))
    trainer(max_steps=3, limit_val_batches=0).fit(model, ckpt_path=str(tmp_path / "mid.ckpt"))
    calls.append(("validate",))
    trainer(limit_val_batches=1).validate(model, verbose=False)
    calls.append(("test",))
    trainer(limit_test_batches=1).test(model, verbose=False)
    calls.append(("predict",))
    trainer(limit_predict_batches=1).predict(model)
    calls.append(("init_module",))
    with fit.init_module():
        torch.nn.Linear(2, 2)
    calls.append(("double",))  # configure_model under DoublePrecision's module_init_context: float64 by default
    lib.Trainer(plugins=[plugins_module.DoublePrecision()], max_steps=1, logger=False, enable_progress_bar=False,
                enable_model_summary=False, enable_checkpointing=False, accelerator="cpu", devices=1,
                limit_val_batches=0).fit(model)
    saved = torch.load(tmp_path / "mid.ckpt", weights_only=True)
    return calls, {key.rsplit(".", 1)[-1]: value for key, value in saved.items() if "Recording" in key}


def test_a_precision_subclass_gets_lightnings_calls_of_the_hooks_it_overrides(tmp_path):
    ours_seen = _precision_hooks_record(tasktrain, our_plugins, tmp_path / "ours")
    theirs_seen = _precision_hooks_record(pl, their_plugins, tmp_path / "theirs")
    assert ours_seen == theirs_seen
    calls, saved = ours_seen
    assert saved == {"Recording": {"mine": 1}}  # its state_dict, under its class's name, as Lightning saves it
    assert ("train_step_context",) in calls and ("forward_context", True) in calls and ("teardown",) in calls
    for lib in (tasktrain, pl):  # a precision by name has Lightning's forward_context too (a script enters it)
        plugin = lib.Trainer(precision="bf16-mixed", **QUIET).precision_plugin
        with plugin.forward_context():
            assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


def _step_hooks_record(lib, plugins_module, base, manual, tmp_path, hooked=True):
    """A precision subclass overriding every step hook (each recording its call and arguments, then calling super),
    the module recording the hooks around them: a fit of 3 windows of accumulate_grad_batches=2 with
    gradient_clip_val (automatic) or self.clip_gradients (manual), a checkpoint, a resumed fit, a validation. The calls
    in order, and the weights after the first fit."""
    calls, fitted = [], []
    boring = theirs if lib is pl else ours
    parent = getattr(plugins_module, base[0])

    def num(t):  # (a resumed fit's: Lightning reads the epoch's batches from its start again, tasktrain goes on)
        return f"{float(t.detach().float().sum()):.4f}" if ("resume",) not in calls else "-"  # (nan == nan)

    class Recording(parent):
        def connect(self, model, optimizers, lr_schedulers):
            calls.append(("connect", len(optimizers), len(lr_schedulers)))
            return super().connect(model, optimizers, lr_schedulers)

        def convert_input(self, data):
            calls.append(("convert_input", str(data.dtype)))
            return super().convert_input(data)

        def pre_backward(self, tensor, module):
            calls.append(("pre_backward", num(tensor), module is fitted[0]))
            return super().pre_backward(tensor, module)

        def backward(self, tensor, model, optimizer, *args, **kwargs):
            calls.append(("backward", num(tensor), model is fitted[0], type(optimizer).__name__, args, kwargs))
            return super().backward(tensor, model, optimizer, *args, **kwargs)

        def post_backward(self, tensor, module):
            out = super().post_backward(tensor, module)
            calls.append(("post_backward", num(tensor), out.requires_grad))
            return out

        def optimizer_step(self, optimizer, model, closure, **kwargs):
            calls.append(("optimizer_step", type(optimizer).__name__, model is fitted[0], callable(closure), kwargs))
            out = super().optimizer_step(optimizer, model, closure, **kwargs)
            calls.append(("stepped", type(out).__name__))
            return out

        def clip_gradients(self, optimizer, clip_val=0.0, gradient_clip_algorithm=None):
            calls.append(("clip_gradients", clip_val, str(getattr(gradient_clip_algorithm, "value", None))))
            return super().clip_gradients(optimizer, clip_val, gradient_clip_algorithm)

        def clip_grad_by_norm(self, optimizer, clip_val):
            calls.append(("clip_grad_by_norm", clip_val))
            return super().clip_grad_by_norm(optimizer, clip_val)

        def clip_grad_by_value(self, optimizer, clip_val):
            calls.append(("clip_grad_by_value", clip_val))
            return super().clip_grad_by_value(optimizer, clip_val)

        def main_params(self, optimizer):
            calls.append(("main_params",))
            return super().main_params(optimizer)

        def on_save_checkpoint(self, checkpoint):
            calls.append(("on_save_checkpoint", "Recording" in checkpoint, "hyper_parameters" in checkpoint))

        def on_load_checkpoint(self, checkpoint):
            calls.append(("on_load_checkpoint", "Recording" in checkpoint))

    class Model(boring.BoringModel):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = not manual

        def training_step(self, batch, batch_idx):
            calls.append(("training_step", batch_idx))
            if not manual:
                return super().training_step(batch, batch_idx)
            opt = self.optimizers()
            loss = self.step(batch)
            self.manual_backward(loss)
            self.clip_gradients(opt, gradient_clip_val=0.5, gradient_clip_algorithm="value")
            opt.step()
            opt.zero_grad()
            return None

        def on_before_batch_transfer(self, batch, dataloader_idx):
            calls.append(("on_before_batch_transfer", str(batch.dtype)))
            return batch

        def on_before_backward(self, loss):
            calls.append(("on_before_backward", num(loss)))

        def on_after_backward(self):
            calls.append(("on_after_backward",))

        def on_before_optimizer_step(self, optimizer):
            calls.append(("on_before_optimizer_step", num(self.layer.weight.grad)))

        def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
            calls.append(("configure_gradient_clipping", gradient_clip_val))
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def trainer(**kwargs):
        return lib.Trainer(plugins=[(Recording if hooked else parent)(*base[1:])], default_root_dir=str(tmp_path),
                           **dict(QUIET, **kwargs))

    lib.seed_everything(3, verbose=False)
    model = Model()
    fitted.append(model)
    clip = {} if manual else dict(accumulate_grad_batches=2, gradient_clip_val=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (16-mixed on a CPU)
        fit = trainer(max_steps=3, limit_train_batches=8, limit_val_batches=0, **clip)
        fit.fit(model)
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        fit.save_checkpoint(str(tmp_path / "a.ckpt"))
        calls.append(("resume",))
        trainer(max_steps=4, limit_train_batches=8, limit_val_batches=0, **clip).fit(
            model, ckpt_path=str(tmp_path / "a.ckpt"))
        calls.append(("validate",))
        trainer(limit_val_batches=1).validate(model, verbose=False)
    return calls, weights


@pytest.mark.parametrize("base,manual", [(("Precision",), False), (("MixedPrecision", "16-mixed", "cpu"), False),
                                         (("MixedPrecision", "bf16-mixed", "cpu"), True)])
def test_a_precision_subclass_gets_every_step_hook_in_lightnings_order(base, manual, tmp_path):
    ours_calls, ours_weights = _step_hooks_record(tasktrain, our_plugins, base, manual, tmp_path / "ours")
    their_calls, their_weights = _step_hooks_record(pl, their_plugins, base, manual, tmp_path / "theirs")
    assert ours_calls == their_calls
    for key in their_weights:
        torch.testing.assert_close(ours_weights[key], their_weights[key], msg=key)
    names = [c[0] for c in ours_calls]
    for hook in ("connect", "convert_input", "pre_backward", "backward", "post_backward", "optimizer_step",
                 "clip_gradients", "main_params", "on_save_checkpoint", "on_load_checkpoint"):
        assert hook in names, hook
    # the hooks' defaults compute what tasktrain's own step computes (the plugin as it is takes that step)
    own_calls, own_weights = _step_hooks_record(tasktrain, our_plugins, base, manual, tmp_path / "own", hooked=False)
    assert "pre_backward" not in [c[0] for c in own_calls]
    for key in own_weights:
        assert torch.equal(own_weights[key], ours_weights[key]), key


def _scaled_backward_weights(lib, plugins_module, factor, manual):
    boring = theirs if lib is pl else ours

    class Doubled(plugins_module.MixedPrecision):
        def backward(self, tensor, model, optimizer, *args, **kwargs):  # the loss scaled before its backward
            super().backward(tensor * factor, model, optimizer, *args, **kwargs)

    class Model(boring.BoringModel):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = not manual

        def training_step(self, batch, batch_idx):
            if not manual:
                return super().training_step(batch, batch_idx)
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(self.step(batch))
            opt.step()

    lib.seed_everything(5, verbose=False)
    model = Model()
    plugin = Doubled("bf16-mixed", "cpu") if factor != 1 else plugins_module.MixedPrecision("bf16-mixed", "cpu")
    lib.Trainer(plugins=[plugin], max_steps=4, limit_val_batches=0, **QUIET).fit(model)
    return model.state_dict()


@pytest.mark.parametrize("manual", [False, True])
def test_a_precision_subclass_scaling_the_loss_in_backward_trains_as_under_lightning(manual):
    ours_scaled = _scaled_backward_weights(tasktrain, our_plugins, 3.0, manual)
    theirs_scaled = _scaled_backward_weights(pl, their_plugins, 3.0, manual)
    plain = _scaled_backward_weights(tasktrain, our_plugins, 1, manual)
    for key in plain:
        torch.testing.assert_close(ours_scaled[key], theirs_scaled[key], msg=key)
    assert not torch.equal(ours_scaled["layer.weight"], plain["layer.weight"])  # (the override did change the step)


def test_an_engine_precision_subclass_and_fabrics_hooks_are_said_so():
    class Helper(our_plugins.MixedPrecision):
        def describe(self):  # a method of one's own, no hook: accepted
            return "mine"

    class Fabrics(our_plugins.MixedPrecision):
        def convert_output(self, data):  # Fabric's: Lightning's Trainer never calls it
            return data

    assert tasktrain.Trainer(plugins=[Helper("bf16-mixed", "cpu")], **QUIET).precision_plugin.describe() == "mine"
    with pytest.warns(UserWarning, match="overrides convert_output: Fabric calls it, Lightning's Trainer does not"):
        tasktrain.Trainer(plugins=[Fabrics("bf16-mixed", "cpu")], **QUIET)

    class Engine(our_plugins.FSDPPrecision):
        def forward_context(self):  # an engine's plugin: called where Lightning's FSDP calls it (the test below)
            return contextlib.nullcontext()

    with pytest.raises(ValueError, match="that is the FSDP strategy's precision plugin"):
        tasktrain.Trainer(plugins=[Engine("bf16-mixed")], **QUIET)


@pytest.mark.parametrize("strategy", ["deepspeed", "fsdp"])
def test_an_engine_precision_subclass_gets_the_hooks_lightning_calls_around_the_engine(strategy, tmp_path):
    """A DeepSpeedPrecision / FSDPPrecision subclass overriding the hooks Lightning's Trainer and its DeepSpeed / FSDP
    strategies call around the engine (Lightning's Strategy.training_step / validation_step contexts, connect in
    setup_precision_plugin, the checkpoint connector's state_dict / on_save_checkpoint / on_load_checkpoint /
    load_state_dict, teardown in the strategy's teardown): each is called where Lightning calls it (the order of
    test_a_precision_subclass_gets_lightnings_calls_of_the_hooks_it_overrides), under the real engine (one process),
    its super() the engine's own plugin's, its state saved under its class's name. (Lightning's DeepSpeed and FSDP
    strategies need CUDA: not run beside here.) The step's hooks: the test below."""
    if strategy == "deepspeed":
        pytest.importorskip("deepspeed")
    calls = []
    base = our_plugins.DeepSpeedPrecision if strategy == "deepspeed" else our_plugins.FSDPPrecision

    class Mine(base):
        def train_step_context(self):
            context = super().train_step_context()
            calls.append(("train_step_context", type(context).__name__))
            return context

        def val_step_context(self):
            calls.append(("val_step_context",))
            return super().val_step_context()

        def connect(self, model, optimizers, lr_schedulers):
            calls.append(("connect", len(optimizers)))
            return super().connect(model, optimizers, lr_schedulers)

        def state_dict(self):
            calls.append(("state_dict",))
            return {"mine": 1, **super().state_dict()}

        def load_state_dict(self, state):
            calls.append(("load_state_dict", state))
            super().load_state_dict({k: v for k, v in state.items() if k != "mine"})

        def on_save_checkpoint(self, checkpoint):
            calls.append(("on_save_checkpoint", checkpoint.get(type(self).__qualname__)))

        def on_load_checkpoint(self, checkpoint):
            calls.append(("on_load_checkpoint", checkpoint.get(type(self).__qualname__)))

        def teardown(self):
            calls.append(("teardown",))
            super().teardown()

    trainer = tasktrain.Trainer(strategy=strategy, plugins=[Mine("bf16-mixed")], max_steps=2, limit_val_batches=1,
                                num_sanity_val_steps=1, **QUIET)
    own = trainer.strategy.precision  # the engine's own plugin, which the run steps through
    engine_context = type(type(own).step_context(own, "training_step")).__name__
    model = ours.BoringModel()
    trainer.fit(model)
    trainer.save_checkpoint(tmp_path / "saved")
    trainer.validate(model, ckpt_path=tmp_path / "saved", verbose=False)
    assert calls == [("connect", 1), ("val_step_context",), ("train_step_context", engine_context),
                     ("train_step_context", engine_context), ("teardown",), ("state_dict",),
                     ("on_save_checkpoint", {"mine": 1}),
                     ("connect", 0), ("on_load_checkpoint", {"mine": 1}), ("load_state_dict", {"mine": 1}),
                     ("val_step_context",), ("teardown",)]


# Every hook of Lightning's precision plugins that its Trainer and its DeepSpeed / FSDP strategies call
_ENGINE_HOOKS = ("forward_context", "train_step_context", "val_step_context", "convert_module", "tensor_init_context",
                 "module_init_context", "connect", "convert_input", "pre_backward", "backward", "post_backward",
                 "optimizer_step", "clip_gradients", "clip_grad_by_norm", "teardown")


def _recording_engine_plugin(base, calls):
    """A subclass of `base` overriding every hook of _ENGINE_HOOKS: each records its call (its name, and what its
    arguments are, told apart from the run's own objects by _what), then returns super()'s."""
    def recorder(name):
        def hook(self, *args, **kwargs):
            calls.append((name, *(_what(self, a) for a in (*args, *kwargs.values()))))
            return getattr(super(cls, self), name)(*args, **kwargs)
        return hook

    cls = type(f"Recording{base.__name__}", (base,), {"__module__": __name__,
                                                     **{name: recorder(name) for name in _ENGINE_HOOKS}})
    return cls


def _what(plugin, value):
    trainer = plugin._strategy._recorded_trainer
    if isinstance(value, tasktrain.TaskModule):
        return "module"
    if isinstance(value, torch.nn.Module):
        return "engine"  # (DeepSpeed's engine around the module, as Lightning's DeepSpeedStrategy.model)
    if any(value is o for o in trainer.optimizers):
        return "optimizer"
    if callable(value) and not isinstance(value, torch.nn.Module):
        return "closure"
    if isinstance(value, torch.Tensor):
        return "loss" if value.requires_grad else "batch" if value.dim() == 2 else "tensor"
    if isinstance(value, list):
        return f"list of {len(value)}"
    return value


def _engine_fit(strategy, plugin, manual=False):
    """A two-step fit (validation before and after, gradient_clip_val=1.0) of BoringModel under `strategy` with
    plugins=[plugin]; returns the trainer and the module's weights after it."""
    torch.manual_seed(0)

    class Model(ours.BoringModel):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = not manual

        def configure_model(self):
            pass

        def training_step(self, batch, batch_idx):
            if not manual:
                return super().training_step(batch, batch_idx)
            opt = self.optimizers()
            loss = super().training_step(batch, batch_idx)["loss"]
            self.manual_backward(loss)
            opt.step()
            opt.zero_grad()

    model = Model()
    trainer = tasktrain.Trainer(strategy=strategy, plugins=[plugin], max_steps=2, limit_val_batches=1,
                                num_sanity_val_steps=0, val_check_interval=2,
                                gradient_clip_val=None if manual else 1.0, **{**QUIET, "devices": 1})
    trainer.strategy._recorded_trainer = trainer
    trainer.fit(model)
    # (FSDP's DTensors: a world of one holds them whole; its group is gone after the fit)
    return trainer, {k: getattr(v, "_local_tensor", v).detach().float().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("strategy,precision", [("deepspeed", "bf16-mixed"), ("fsdp", "16-mixed"),
                                                ("fsdp", "32-true")])
def test_an_engine_precision_subclass_is_the_trainers_plugin_and_its_hooks_run_the_engines_step(strategy, precision):
    """A DeepSpeedPrecision / FSDPPrecision subclass overriding every hook Lightning calls, each calling super():
    trainer.precision_plugin is the object given; each hook is called where Lightning 2.6.6 calls it, with its
    arguments, in its order: convert_module in the strategy's setup before the engine wraps the module
    (strategies/deepspeed.py DeepSpeedStrategy.setup, strategies/fsdp.py FSDPStrategy.setup), connect after
    (strategy.py setup_precision_plugin), tensor_init_context then module_init_context around configure_model
    (trainer/call.py _call_configure_model), convert_input on each batch (loops/training_epoch_loop.py), then
    optimizer_step(optimizer, model, closure) (strategy.py Strategy.optimizer_step), whose closure runs the step in
    train_step_context (strategy.py training_step; its default enters forward_context, precision.py), then
    pre_backward -> backward(loss, model, optimizer) -> post_backward (strategy.py Strategy.backward), then the
    clipping (precision.py _after_closure -> the module's configure_gradient_clipping -> clip_gradients(optimizer,
    clip_val, algorithm)), validation in val_step_context, teardown at the end (strategy.py teardown). Lightning's
    DeepSpeed / FSDP strategies need CUDA: not run beside here. The defaults are the engine's own step: the weights
    equal those of the plugin without a subclass, bit for bit."""
    if strategy == "deepspeed":
        pytest.importorskip("deepspeed")
    base = our_plugins.DeepSpeedPrecision if strategy == "deepspeed" else our_plugins.FSDPPrecision
    _, plain = _engine_fit(strategy, base(precision))
    calls = []
    plugin = _recording_engine_plugin(base, calls)(precision)
    trainer, recorded = _engine_fit(strategy, plugin)
    assert trainer.precision_plugin is trainer.strategy.precision_plugin is plugin
    assert trainer.strategy.precision is not plugin and plugin.skipped_steps == trainer.strategy.precision.skipped_steps
    for key in plain:
        assert torch.equal(recorded[key], plain[key]), key
    step = [("convert_input", "batch"), ("optimizer_step", "optimizer", "module", "closure"), ("train_step_context",),
            ("forward_context",), ("pre_backward", "loss", "module"), ("backward", "loss", "module", "optimizer"),
            ("post_backward", "loss", "module"), ("clip_gradients", "optimizer", 1.0, "norm"),
            ("clip_grad_by_norm", "optimizer", 1.0)]
    validation = [("convert_input", "batch"), ("val_step_context",), ("forward_context",)]
    connected = "engine" if strategy == "deepspeed" else "module"
    assert calls == [("tensor_init_context",), ("module_init_context",), ("convert_module", "module"),
                     ("connect", connected, "list of 1", "list of 1"), *step, *step, *validation, ("teardown",)]


def test_a_deepspeed_precision_subclass_gets_manual_optimisations_calls():
    """Manual optimisation under DeepSpeed: manual_backward runs pre_backward -> backward(loss, model, None) ->
    post_backward (core/module.py manual_backward -> strategy.py Strategy.backward with optimizer None), opt.step()
    the plugin's optimizer_step(optimizer, model, closure) (core/optimizer.py LightningOptimizer.step ->
    Strategy.optimizer_step); trained as without the subclass."""
    pytest.importorskip("deepspeed")
    base = our_plugins.DeepSpeedPrecision
    _, plain = _engine_fit("deepspeed", base("bf16-mixed"), manual=True)
    calls = []
    _, recorded = _engine_fit("deepspeed", _recording_engine_plugin(base, calls)("bf16-mixed"), manual=True)
    for key in plain:
        assert torch.equal(recorded[key], plain[key]), key
    step = [("convert_input", "batch"), ("train_step_context",), ("forward_context",), ("pre_backward", "loss", "module"),
            ("backward", "loss", "module", None), ("post_backward", "loss", "module"),
            ("optimizer_step", "optimizer", "module", "closure")]
    assert calls[4:] == [*step, *step, ("convert_input", "batch"), ("val_step_context",), ("forward_context",),
                         ("teardown",)]


@pytest.mark.parametrize("strategy", ["deepspeed", "fsdp"])
def test_an_engine_precision_subclass_given_to_the_strategy_is_its_plugin_and_is_called(strategy):
    """Lightning's DeepSpeedStrategy(precision_plugin=...) / FSDPStrategy(precision_plugin=...): the object is
    trainer.precision_plugin, and its overrides are called as from plugins=[...] (Lightning's Strategy.__init__ sets
    it as its precision_plugin, strategy.py)."""
    if strategy == "deepspeed":
        pytest.importorskip("deepspeed")
    from tasktrain.strategies import DeepSpeedStrategy, FSDPStrategy

    calls = []
    base = our_plugins.DeepSpeedPrecision if strategy == "deepspeed" else our_plugins.FSDPPrecision

    class Mine(base):
        def forward_context(self):
            calls.append("forward_context")
            return super().forward_context()

        def backward(self, tensor, model, optimizer, *args, **kwargs):
            calls.append("backward")
            super().backward(tensor, model, optimizer, *args, **kwargs)

    plugin = Mine("bf16-mixed")
    made = DeepSpeedStrategy(precision_plugin=plugin) if strategy == "deepspeed" else \
        FSDPStrategy(precision_plugin=plugin)
    trainer = tasktrain.Trainer(strategy=made, max_steps=1, limit_val_batches=0, **{**QUIET, "devices": 1})
    assert trainer.precision_plugin is made.precision_plugin is plugin
    trainer.fit(ours.BoringModel())
    assert calls == ["forward_context", "backward"]

    class Other(our_plugins.MixedPrecision):  # not the engine's plugin: the engine runs its own of that name
        def forward_context(self):
            return super().forward_context()

    made = (DeepSpeedStrategy if strategy == "deepspeed" else FSDPStrategy)(precision_plugin=Other("bf16-mixed", "cpu"))
    with pytest.raises(ValueError, match=r"\(precision_plugin=Other\(...\)\): the strategy runs its engine's own"):
        tasktrain.Trainer(strategy=made, **{**QUIET, "devices": 1})


def test_tensors_a_step_creates_have_the_precisions_dtype_as_under_lightning():
    """precision="64-true": a tensor made inside a step (torch.zeros) is float64, as under Lightning's
    DoublePrecision.forward_context; outside the steps the default dtype is float32 again."""
    def dtypes(lib):
        seen = []
        boring = theirs if lib is pl else ours

        class Model(boring.BoringModel):
            def training_step(self, batch, batch_idx):
                seen.append(("train", str(torch.zeros(1).dtype)))
                return super().training_step(batch, batch_idx)

            def validation_step(self, batch, batch_idx):
                seen.append(("val", str(torch.zeros(1).dtype)))
                return super().validation_step(batch, batch_idx)

            def on_train_epoch_end(self):
                seen.append(("epoch end", str(torch.zeros(1).dtype)))

        for precision in ("64-true", "32-true"):
            lib.Trainer(precision=precision, max_epochs=1, limit_train_batches=1, limit_val_batches=1,
                        num_sanity_val_steps=0, **QUIET).fit(Model())
        return seen

    assert dtypes(tasktrain) == dtypes(pl) == [("train", "torch.float64"), ("val", "torch.float64"),
                                               ("epoch end", "torch.float32"), ("train", "torch.float32"),
                                               ("val", "torch.float32"), ("epoch end", "torch.float32")]


def _layered(seed=0):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3),
                              torch.nn.Sequential(torch.nn.Unflatten(1, (3, 1, 1)), torch.nn.BatchNorm2d(3)))
    net.train()(torch.randn(8, 4))  # running statistics other than their start
    with torch.no_grad():
        net[1].weight.mul_(2)
    return net


def test_torch_sync_batchnorm_reverts_as_lightnings_does():
    """apply then revert on the same module under both plugins: the layers' classes, the Parameter objects kept,
    the values and an eval forward alike; a bare SyncBatchNorm becomes another object under both."""
    seen = {}
    for lib, plugins_module in ((pl, their_plugins), (tasktrain, our_plugins)):
        net = _layered()
        params = list(net.parameters())
        sync = plugins_module.TorchSyncBatchNorm()
        assert sync.apply(net) is net and isinstance(net[2][1], torch.nn.SyncBatchNorm)
        assert sync.revert(net) is net
        assert all(a is b for a, b in zip(net.parameters(), params, strict=True))
        assert not any(isinstance(m, torch.nn.SyncBatchNorm) for m in net.modules())
        bare = torch.nn.SyncBatchNorm(3)
        back = sync.revert(bare)
        assert back is not bare and back.weight is bare.weight
        seen[lib.__name__] = ([type(m).__name__ for m in net.modules()], net.state_dict(),
                              net.eval()(torch.randn(5, 4, generator=torch.Generator().manual_seed(1))),
                              type(back).__name__)
    (their_names, their_state, their_out, their_bare), (our_names, our_state, our_out, our_bare) = seen.values()
    assert our_names == their_names and "_BatchNormXd" in our_names and our_bare == their_bare == "_BatchNormXd"
    assert our_state.keys() == their_state.keys()
    assert all(torch.equal(our_state[k], their_state[k]) for k in our_state)
    assert torch.equal(our_out, their_out)


def _sync_batchnorm_fit_record(lib):
    """Trainer(strategy="ddp", devices=1, sync_batchnorm=True) on the CPU, the norm in eval mode inside
    training_step (torch's SyncBatchNorm then syncs nothing, where in training mode it needs a GPU): the norm's
    class in training_step and after the fit (or torch's error), and the trained values."""
    boring = theirs if lib is pl else ours
    seen = []

    class Model(boring.BoringModel):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.BatchNorm1d(32)

        def training_step(self, batch, batch_idx):
            self.norm.eval()
            seen.append(type(self.norm).__name__)
            return super().training_step(self.norm(batch), batch_idx)

    torch.manual_seed(0)
    model = Model()
    trainer = lib.Trainer(strategy="ddp", sync_batchnorm=True, max_steps=3, limit_val_batches=0, **QUIET)
    try:
        trainer.fit(model, torch.utils.data.DataLoader(boring.RandomDataset(32, 16), batch_size=4))
    except ValueError as err:
        seen.append(str(err))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    seen.append(type(model.norm).__name__)
    return seen, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("cpu_wrap", ["refused", "allowed"])
def test_sync_batchnorm_layers_are_reverted_after_a_fit_as_lightnings_are(cpu_wrap, monkeypatch):
    if cpu_wrap == "allowed":  # torch's DDP refuses SyncBatchNorm on CPU modules; let it wrap, to train on CPU
        monkeypatch.setattr(torch.nn.parallel.DistributedDataParallel, "_passing_sync_batchnorm_handle",
                            lambda self, module: None)
    ours_seen, ours_state = _sync_batchnorm_fit_record(tasktrain)
    theirs_seen, theirs_state = _sync_batchnorm_fit_record(pl)
    assert ours_seen == theirs_seen
    assert ours_seen[-1] == "_BatchNormXd"  # converted for the fit, then back (also after a failed one)
    if cpu_wrap == "refused":
        assert ours_seen == ["SyncBatchNorm layers only work with GPU modules", "_BatchNormXd"]
    else:
        assert ours_seen == ["SyncBatchNorm"] * 3 + ["_BatchNormXd"]
        assert not torch.equal(ours_state["norm.weight"], torch.ones(32))  # trained through the synced layer
        assert ours_state.keys() == theirs_state.keys()
        assert all(torch.allclose(ours_state[k].float(), theirs_state[k].float()) for k in theirs_state)


@pytest.mark.parametrize("variables,devices,num_nodes", [
    ({}, 2, 1),  # a plain `python train.py`: rank 0 of the world it will start
    ({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "GROUP_RANK": "0", "LOCAL_WORLD_SIZE": "2",
      "TORCHELASTIC_RUN_ID": "x"}, 2, 1),  # torchrun
    ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "2",
      "TORCHELASTIC_RUN_ID": "x"}, 2, 2),  # torchrun, second machine
    ({"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "NODE_RANK": "1"}, 2, 2),  # launcher variables, no torchrun
    ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}, 2, 2),  # the same, RANK not node * devices + local: not read
    ({"RANK": "1", "WORLD_SIZE": "2"}, 2, 1),  # RANK / WORLD_SIZE without LOCAL_RANK: read by neither, rank 0
    ({"RANK": "1", "WORLD_SIZE": "2"}, 1, 1),
    ({"LOCAL_RANK": "1", "NODE_RANK": "1"}, 2, 2),  # a launcher of one's own: rank 3, started outside
    ({"SLURM_NTASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_ID": "0",
      "SLURM_JOB_NAME": "train", "SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2(x2)",
      "SLURM_JOB_ID": "123", "SLURM_NODELIST": "127.0.0.1"}, 2, 2),  # srun: rank 3 of 4
])
def test_ranks_read_right_after_the_trainer_is_built_as_lightnings(variables, devices, num_nodes, monkeypatch):
    """trainer.global_rank / local_rank / node_rank / world_size / is_global_zero from a launcher's variables
    as soon as Trainer(strategy="ddp") returns, before any run, and no process group formed, under both; also
    rank_zero_only.rank, the environment Lightning's connector picks with none given (its class, whether it says the
    processes are started outside, its global rank and world size) and whether the Trainer will start the processes
    itself. With RANK / WORLD_SIZE but no LOCAL_RANK (and no torchrun), Lightning's LightningEnvironment ignores RANK:
    this is rank 0 of the world the Trainer starts, and rank_zero_only.rank (RANK when imported) is 0 from then on."""
    _clear_launch_variables(monkeypatch)
    for name, value in {**variables, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}.items():
        monkeypatch.setenv(name, value)
    from tasktrain.compat.lightning.utilities.rank_zero import rank_zero_only as our_rank_zero
    from tasktrain.trainer import runtime

    seen = []
    for lib in (pl, tasktrain):
        rank_zero = our_rank_zero if lib is tasktrain else importlib.import_module(
            "lightning.pytorch.utilities.rank_zero").rank_zero_only
        before, known = rank_zero.rank, list(runtime._KNOWN_RANK)
        rank_zero.rank = int(variables.get("RANK", variables.get("LOCAL_RANK", 0)))  # (what each reads at import)
        try:
            trainer = lib.Trainer(strategy="ddp", num_nodes=num_nodes, **{**QUIET, "devices": devices})
            environment = trainer.strategy.cluster_environment
            seen.append((trainer.global_rank, trainer.local_rank, trainer.node_rank, trainer.world_size,
                         trainer.is_global_zero, torch.distributed.is_initialized(), rank_zero.rank,
                         type(environment).__name__, environment.creates_processes_externally,
                         environment.global_rank(), environment.world_size(), environment.local_rank(),
                         environment.node_rank()))
            if lib is tasktrain and devices > 1:  # (Lightning's launcher starts the other ranks where its
                # environment does not say they are started outside)
                assert trainer.strategy.needs_launch() is not environment.creates_processes_externally
        finally:
            rank_zero.rank, runtime._KNOWN_RANK[:] = before, known
    assert seen[1] == seen[0]
    node = int(variables.get("NODE_RANK", variables.get("GROUP_RANK", variables.get("SLURM_NODEID", 0))))
    local = int(variables.get("LOCAL_RANK", variables.get("SLURM_LOCALID", 0)))
    expected_rank = node * devices + local  # (RANK itself is read by neither)
    assert seen[1][0] == seen[1][6] == expected_rank and seen[1][3] == devices * num_nodes and seen[1][5] is False
    assert seen[1][7] == ("TorchElasticEnvironment" if "TORCHELASTIC_RUN_ID" in variables else "SLURMEnvironment"
                          if "SLURM_NTASKS" in variables else "LightningEnvironment")


def test_lightning_environment_teardown_keeps_world_size_unlike_lightnings(monkeypatch):
    """A kept difference (docs/lightning.md, the LightningEnvironment row): Lightning's teardown() deletes WORLD_SIZE,
    tasktrain's keeps it, because tasktrain reads the launch's RANK / WORLD_SIZE / LOCAL_RANK again after a run: a
    self-launched rank 1 without WORLD_SIZE reads as rank 0 of a world of one (what the Accelerator, a logger not yet
    set up and strategy="auto" go by)."""
    from lightning.fabric.plugins.environments import LightningEnvironment as Theirs

    from tasktrain.plugins.environments import LightningEnvironment as Ours
    from tasktrain.strategies.environment import detect_environment

    launched = dict(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
                    TASKTRAIN_LAUNCHER="self")
    for name, value in launched.items():
        monkeypatch.setenv(name, value)
    Theirs().teardown()
    assert "WORLD_SIZE" not in os.environ
    assert (detect_environment().global_rank, detect_environment().world_size) == (0, 1)  # the breakage
    monkeypatch.setenv("WORLD_SIZE", "2")
    Ours().teardown()
    assert os.environ["WORLD_SIZE"] == "2"
    assert (detect_environment().global_rank, detect_environment().world_size) == (1, 2)


@pytest.mark.parametrize("name", ["32-true", "64-true", "bf16-true", "16-true", "bf16-mixed", "16-mixed"])
def test_the_plugin_a_precision_name_builds_is_lightnings_class_of_that_name(name):
    """`Trainer(precision=name).precision_plugin` is an instance of Lightning's plugin class of that name (a script's
    `isinstance(trainer.precision_plugin, MixedPrecision)`), with its `device`; it was tasktrain's core class, an
    instance of none of tasktrain.plugins' classes."""
    classes = ("Precision", "DoublePrecision", "HalfPrecision", "MixedPrecision")
    seen = {}
    for trainer_class, plugins in ((theirs_trainer(), their_plugins), (tasktrain.Trainer, our_plugins)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (both: "16-mixed" on a CPU is bf16-mixed, with a warning)
            plugin = trainer_class(precision=name, accelerator="cpu", logger=False, enable_progress_bar=False,
                                   enable_checkpointing=False).precision_plugin
        seen[plugins.__name__.split(".")[0]] = ([c for c in classes if isinstance(plugin, getattr(plugins, c))],
                                                getattr(plugin, "device", None))
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"][0][0] == "Precision"
    # a subclass of one's own keeps the plain rule: the Trainer's plugin is not one
    assert not isinstance(tasktrain.Trainer(precision=name, accelerator="cpu", logger=False).precision_plugin,
                          type("Mine", (our_plugins.MixedPrecision,), {}))


def theirs_trainer():
    import lightning.pytorch
    return lightning.pytorch.Trainer
