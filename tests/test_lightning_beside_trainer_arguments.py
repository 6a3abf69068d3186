"""How a Trainer's arguments are checked and chosen (Lightning's trainer/connectors/accelerator_connector.py; tasktrain's
trainer/runtime.py and strategies/registry.py) beside Lightning 2.6's: the same arguments given to both Trainers, the
choice compared (strategy class, cluster environment, ranks), or the error raised (its type, and Lightning's words,
which tasktrain's message starts with)."""
import torch
import pytest

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.utilities.exceptions import MisconfigurationException as TheirMisconfiguration  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.exceptions import MisconfigurationException  # noqa: E402

LIBS = {"tasktrain": tasktrain, "lightning": pl}
QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # (conftest.py)


@pytest.mark.parametrize("name", ["DDP", "DDP_FIND_UNUSED_PARAMETERS_FALSE", "Ddp_Spawn", "AUTO"])
def test_strategy_names_are_case_insensitive_as_lightning(name):
    chosen = {}
    for lib_name, lib in LIBS.items():
        trainer = lib.Trainer(strategy=name, accelerator="cpu", devices=2, **QUIET)
        options = getattr(trainer.strategy, "ddp_kwargs", None) or getattr(trainer.strategy, "_ddp_kwargs", {})
        chosen[lib_name] = (isinstance(trainer.strategy, lib.strategies.DDPStrategy), trainer.world_size,
                            options.get("find_unused_parameters"))
    assert chosen["tasktrain"] == chosen["lightning"]
    assert chosen["tasktrain"][0]


def _error(lib, **flags):
    with pytest.raises(Exception) as caught:
        lib.Trainer(**QUIET, **flags)
    return caught.value


def _first_sentence(message):
    return message.split(". ")[0]


ERRORS = {
    "precision=12": dict(precision=12),
    "precision='invalid'": dict(precision="invalid"),
    "precision=1": dict(precision=1),
    "devices=0": dict(accelerator="cpu", devices=0),
    "devices='0'": dict(accelerator="cpu", devices="0"),
    "devices=[]": dict(accelerator="cpu", devices=[]),
    "devices=0 on cuda": dict(accelerator="cuda", devices=0),  # (the devices first, whether or not there is a GPU)
    "devices=[] on tpu": dict(accelerator="tpu", devices=[]),
    "devices='0' on auto": dict(devices="0"),
    "accelerator='invalid'": dict(accelerator="invalid"),
    "strategy='cocofruit'": dict(strategy="cocofruit"),
    "accelerator='cuda' without a GPU": dict(accelerator="cuda"),
    "accelerator='gpu' without a GPU": dict(accelerator="gpu"),
}


@pytest.mark.parametrize("case", ERRORS)
def test_invalid_arguments_raise_lightnings_error(case):
    if "without a GPU" in case and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    theirs, ours = _error(pl, **ERRORS[case]), _error(tasktrain, **ERRORS[case])
    if isinstance(theirs, TheirMisconfiguration):
        assert isinstance(ours, MisconfigurationException), repr(ours)  # (Lightning's class, a ValueError)
    assert isinstance(ours, type(theirs).__mro__[0] if type(theirs) is ValueError else ValueError), repr(ours)
    assert str(ours).startswith(_first_sentence(str(theirs))), (str(ours), str(theirs))


@pytest.mark.parametrize("devices", [["0"], [0, "1"], ["GPU"], [["0", "1"], [0, 1]], [False]])
def test_devices_of_an_invalid_type_are_lightnings_type_error(devices):
    from lightning.fabric.utilities.device_parser import _check_data_type

    with pytest.raises(TypeError) as theirs:  # (Lightning's check of a GPU's device list; its CPU one is a TypeError
        _check_data_type(devices)  # too, in other words)
    with pytest.raises(TypeError) as ours:
        tasktrain.Trainer(accelerator="cpu", devices=devices, **QUIET)
    assert str(ours.value) == str(theirs.value)
    with pytest.raises(TypeError):
        pl.Trainer(accelerator="cpu", devices=devices, **QUIET)


@pytest.mark.parametrize("strategy", ["ddp_fork", "ddp_notebook_find_unused_parameters_true"])
def test_fork_strategies_without_fork_raise_lightnings_error(strategy, monkeypatch):
    monkeypatch.setattr(torch.multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    theirs = _error(pl, strategy=strategy, accelerator="cpu")
    ours = _error(tasktrain, strategy=strategy, accelerator="cpu")
    assert isinstance(theirs, ValueError) and isinstance(ours, MisconfigurationException)
    assert str(ours).startswith(_first_sentence(str(theirs))), (str(ours), str(theirs))


# the variables of an sbatch script with --ntasks=2 whose body runs `python train.py` without srun
BATCH_SCRIPT = {"SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_NAME": "train", "SLURM_NODEID": "0",
                "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "78", "SLURM_NODELIST": "node01"}


def _place(lib, strategy, devices):
    trainer = lib.Trainer(strategy=strategy, accelerator="cpu", devices=devices, **QUIET)
    return trainer, (type(trainer.strategy.cluster_environment).__name__, trainer.world_size, trainer.global_rank,
                     trainer.local_rank, trainer.node_rank, trainer.num_devices)
    # (not num_nodes: left out, tasktrain reads it from the allocation, docs/slurm.md; Lightning's stays 1)


@pytest.mark.parametrize("job_name", ["train", "bash"])
@pytest.mark.parametrize(("strategy", "devices"), [("ddp", 2), ("auto", 2), ("ddp", 1)])
def test_slurm_batch_script_without_srun_is_read_as_lightning(strategy, devices, job_name, monkeypatch):
    """Trainer(...) in the batch script answers as Lightning's (SLURM's world of SLURM_NTASKS, or, in a job named
    "bash", no SLURM at all); the run then refuses to start (Lightning's would wait for the task srun never started)
    before any process group forms, naming srun."""
    for name, value in dict(BATCH_SCRIPT, SLURM_JOB_NAME=job_name).items():
        monkeypatch.setenv(name, value)
    for name in ("SLURM_STEP_ID", "SLURM_STEPID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    theirs = _place(pl, strategy, devices)[1]
    trainer, ours = _place(tasktrain, strategy, devices)
    assert ours == theirs
    if job_name == "bash":
        return  # (not SLURM's: the Trainer starts its own processes, as Lightning's)
    from tasktrain.demos.boring_classes import BoringModel
    from tasktrain.strategies.environment import SlurmAllocationError

    with pytest.raises(SlurmAllocationError, match=r"SLURM_STEP_ID is not.*SLURM_NTASKS=2.*srun python"):
        trainer.fit(BoringModel())
    assert not torch.distributed.is_initialized()


def test_the_accelerator_refuses_the_batch_script_at_construction(monkeypatch):
    """The Accelerator joins the process group when built (Accelerate's): the batch script without srun is refused
    there."""
    for name, value in BATCH_SCRIPT.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    from tasktrain.strategies.environment import SlurmAllocationError

    with pytest.raises(SlurmAllocationError, match=r"SLURM_STEP_ID is not.*srun python"):
        tasktrain.Accelerator(cpu=True)


@pytest.mark.parametrize("precision", ["32-true", "16-mixed", "bf16-mixed"])
def test_deepspeeds_precision_plugin_is_lightnings_class(precision):
    """Trainer(precision=..., strategy="deepspeed").precision_plugin is a DeepSpeedPrecision (Lightning's class, at its
    path in tasktrain.plugins), as Lightning's is its own."""
    pytest.importorskip("deepspeed")
    from lightning.pytorch.plugins.precision import DeepSpeedPrecision as Theirs

    from tasktrain.plugins.precision import DeepSpeedPrecision, MixedPrecision

    theirs = pl.Trainer(precision=precision, strategy="deepspeed", accelerator="cpu", **QUIET).precision_plugin
    ours = tasktrain.Trainer(precision=precision, strategy="deepspeed", accelerator="cpu", **QUIET).precision_plugin
    assert isinstance(theirs, Theirs) and isinstance(ours, DeepSpeedPrecision)
    assert not isinstance(ours, MixedPrecision)  # (neither is Lightning's)
    assert ours.precision == theirs.precision


def test_a_one_process_strategy_in_the_batch_script_is_built_as_lightning(monkeypatch):
    """A single-device strategy in the batch script of an allocation of two tasks: Trainer(...) builds (the world
    never formed: nothing to contradict yet), and the run is refused as the batch script's."""
    for name, value in BATCH_SCRIPT.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    trainers = {name: lib.Trainer(strategy=lib.strategies.SingleDeviceStrategy("cpu"), **QUIET)
                for name, lib in LIBS.items()}
    assert {name: type(trainer.strategy).__name__ for name, trainer in trainers.items()} == {
        "tasktrain": "SingleDeviceStrategy", "lightning": "SingleDeviceStrategy"}
    trainer = trainers["tasktrain"]
    from tasktrain.demos.boring_classes import BoringModel
    from tasktrain.strategies.environment import SlurmAllocationError

    with pytest.raises(SlurmAllocationError, match=r"srun python"):
        trainer.fit(BoringModel())


@pytest.mark.parametrize("sync_batchnorm", [True, False])
def test_sync_batchnorm_is_given_to_a_custom_parallel_strategy(sync_batchnorm):
    """A DDPStrategy subclass of one's own gets the Trainer's LayerSync as its _layer_sync, as Lightning's connector
    sets it (sync_batchnorm=True: a TorchSyncBatchNorm)."""
    given = {}
    for name, lib in LIBS.items():
        class CustomParallelStrategy(lib.strategies.DDPStrategy):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self._layer_sync = None

        strategy = CustomParallelStrategy()
        lib.Trainer(accelerator="cpu", strategy=strategy, sync_batchnorm=sync_batchnorm, **QUIET)
        given[name] = type(strategy._layer_sync).__name__
    assert given["tasktrain"] == given["lightning"]


def test_ddp_spawns_launcher_says_its_start_method_as_lightning():
    said = {name: lib.Trainer(strategy="ddp_spawn", accelerator="cpu", devices=2, **QUIET).strategy.launcher
            for name, lib in LIBS.items()}
    assert said["tasktrain"]._start_method == said["lightning"]._start_method == "spawn"
    assert said["tasktrain"].is_interactive_compatible == said["lightning"].is_interactive_compatible


@pytest.mark.parametrize(("plugin", "precision"), [("DeepSpeedPrecision", "16-true"), ("DeepSpeedPrecision", "bf16-true"),
                                                   ("DeepSpeedPrecision", "16-mixed"), ("FSDPPrecision", "16-true"),
                                                   ("FSDPPrecision", "bf16-true"), ("FSDPPrecision", "32-true")])
def test_an_engines_precision_plugin_on_its_own_sets_and_restores_the_default_dtype(plugin, precision):
    """Lightning's DeepSpeedPrecision / FSDPPrecision work outside a strategy: their module_init_context (and FSDP's
    forward_context) set the precision's default dtype and restore it, also when the block raises."""
    import lightning.pytorch.plugins as their_plugins

    import tasktrain.plugins as our_plugins

    contexts = ("module_init_context", "tensor_init_context") + (("forward_context",) if plugin == "FSDPPrecision"
                                                                 else ())
    seen = {}
    for name, plugins in (("tasktrain", our_plugins), ("lightning", their_plugins)):
        instance = getattr(plugins, plugin)(precision)
        for context in contexts:
            with pytest.raises(RuntimeError, match="foo"), getattr(instance, context)():
                seen[name, context] = torch.get_default_dtype()
                raise RuntimeError("foo")
            assert torch.get_default_dtype() is torch.float32
    assert {key[1]: dtype for key, dtype in seen.items() if key[0] == "tasktrain"} == {
        key[1]: dtype for key, dtype in seen.items() if key[0] == "lightning"}


@pytest.mark.parametrize("made", ["none", "one", "a list of one", "a list of two"])
def test_callbacks_registered_by_entry_points_are_added_as_lightning(made, monkeypatch):
    """Installed packages register callback factories under Lightning's entry-point group
    "lightning.pytorch.callbacks_factory"; both Trainers add what they return when built."""
    from unittest import mock

    import lightning.fabric.utilities.registry as their_registry

    import tasktrain.utilities.registry as our_registry

    found = {}
    for name, lib, registry in (("tasktrain", tasktrain, our_registry), ("lightning", pl, their_registry)):
        class External(lib.Callback):
            pass

        factory = {"none": lambda: [], "one": lambda: External(), "a list of one": lambda: [External()],
                   "a list of two": lambda: [External(), External()]}[made]
        entry_point = mock.Mock()
        entry_point.name = "mocked"
        entry_point.load.return_value = factory
        query = mock.MagicMock(return_value=[entry_point])
        monkeypatch.setattr(registry, "entry_points", query)
        trainer = lib.Trainer(**QUIET)
        query.assert_called_once_with(group="lightning.pytorch.callbacks_factory")
        found[name] = sum(isinstance(callback, External) for callback in trainer.callbacks)
    assert found["tasktrain"] == found["lightning"]
