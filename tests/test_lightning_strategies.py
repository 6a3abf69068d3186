"""Lightning's DeepSpeedStrategy and FSDPStrategy under their names (tasktrain.strategies): constructed beside
Lightning 2.6's own classes with the same arguments, compared on what each builds (DeepSpeed's config dict, FSDP's
sharding / offload / precision / wrapping choices), and the arguments tasktrain refuses. No processes here: the real
engines run through these classes inside the 2-process launches of tests/test_deepspeed.py and tests/test_fsdp.py
(and that importing them imports neither deepspeed nor Lightning is the first test of tests/test_deepspeed.py)."""
import json
import logging

import pytest
import torch

import lightning.pytorch.strategies as L  # a test dependency (requirements-dev.txt): the spec, run beside ours

from tasktrain import FSDP
from tasktrain.strategies.deepspeed import DeepSpeed

DEEPSPEED_CASES = [
    {},
    {"stage": 1},
    {"stage": 3, "offload_optimizer": True, "offload_parameters": True},
    {"stage": 2, "offload_optimizer": True, "pin_memory": True},
    {"stage": 1, "allgather_bucket_size": 5e7, "reduce_bucket_size": 3e7, "overlap_comm": False,
     "contiguous_gradients": False, "allgather_partitions": False, "reduce_scatter": False, "sub_group_size": 10 ** 9},
    {"stage": 3, "offload_optimizer": True, "offload_parameters": True, "offload_params_device": "nvme",
     "offload_optimizer_device": "nvme", "nvme_path": "/tmp", "params_buffer_count": 3, "params_buffer_size": 10 ** 6,
     "max_in_cpu": 10, "optimizer_buffer_count": 5, "block_size": 4096, "queue_depth": 4, "single_submit": True,
     "overlap_events": False, "thread_count": 2},
    {"zero_optimization": False},
    {"stage": 2, "logging_batch_size_per_gpu": 4, "zero_allow_untested_optimizer": False},
    {"partition_activations": True, "cpu_checkpointing": True, "contiguous_memory_optimization": True,
     "synchronize_checkpoint_boundary": True},
]


def _contains(ours, theirs, where=""):
    """Every key Lightning sets, with Lightning's value, is in ours (ours may add keys tasktrain's engine needs)."""
    for key, value in theirs.items():
        assert key in ours, f"{where}{key} missing"
        if isinstance(value, dict):
            _contains(ours[key], value, f"{where}{key}.")
        else:
            assert ours[key] == value, (f"{where}{key}", ours[key], value)


@pytest.mark.parametrize("kwargs", DEEPSPEED_CASES, ids=lambda kw: ",".join(kw) or "defaults")
def test_deepspeed_strategy_builds_lightnings_config(kwargs):
    from tasktrain.strategies import DeepSpeedStrategy

    ours, theirs = DeepSpeedStrategy(**kwargs), L.DeepSpeedStrategy(**kwargs)
    assert isinstance(ours, DeepSpeed)
    _contains(ours.config, theirs.config)
    # the keys ours adds: DeepSpeed 0.19.8 reads aio's thread count under its new name
    assert set(ours.config) == set(theirs.config)
    assert ours.config["aio"]["intra_op_parallelism"] == theirs.config["aio"]["thread_count"]
    assert ours.zero_stage() == (theirs.config["zero_optimization"]["stage"] if "zero_optimization" in theirs.config
                                 else 0)
    assert ours.zero_stage_3 == theirs.zero_stage_3 and ours.deepspeed_engine is None


def test_deepspeed_strategy_engine_config_keeps_lightnings_keys_and_adds_the_runs():
    from tasktrain.strategies import DeepSpeedStrategy

    kwargs = {"stage": 2, "offload_optimizer": True, "reduce_bucket_size": 10 ** 7}
    ours, theirs = DeepSpeedStrategy(**kwargs), L.DeepSpeedStrategy(**kwargs)
    ours.configure("cpu", devices=2, precision="bf16-mixed")
    engine = ours.resolved_config(micro_batch_size=8, accumulate_grad_batches=2, gradient_clipping=0.5)
    _contains(engine, theirs.config)
    # what Lightning's _format_config adds at set-up for the same run: accumulation, micro batch, clipping, bf16
    _contains(engine, {"gradient_accumulation_steps": 2, "train_micro_batch_size_per_gpu": 8, "gradient_clipping": 0.5,
                       "bf16": {"enabled": True}})
    assert engine["train_batch_size"] == 8 * 2 * 2


def test_deepspeed_strategy_fp16_section_is_lightnings(monkeypatch):
    from lightning.fabric.strategies.deepspeed import _format_precision_config

    from tasktrain.strategies import DeepSpeedStrategy

    scale = {"loss_scale": 0, "initial_scale_power": 8, "loss_scale_window": 50, "hysteresis": 3, "min_loss_scale": 2}
    ours = DeepSpeedStrategy(**scale)
    # fp16 under DeepSpeed is refused on CPU: the config of a CUDA run is built here without running it
    monkeypatch.setattr(DeepSpeedStrategy, "root_device", property(lambda self: torch.device("cuda", 0)))
    ours.configure(precision="16-mixed")
    theirs = L.DeepSpeedStrategy(**scale).config
    _format_precision_config(theirs, "16-mixed", **scale)
    assert ours.resolved_config(micro_batch_size=1)["fp16"] == theirs["fp16"]
    with pytest.raises(ValueError, match="initial_scale_power.*loss scaling.*'bf16-mixed'"):
        DeepSpeedStrategy(initial_scale_power=8).configure(precision="bf16-mixed")  # Lightning ignores it there
    DeepSpeedStrategy().configure("cpu", precision="bf16-mixed")  # the defaults are no request


def test_deepspeed_strategy_takes_a_config_dict_a_json_path_or_lightnings_variable(tmp_path, monkeypatch):
    from tasktrain.strategies import DeepSpeedStrategy

    config = {"zero_optimization": {"stage": 3, "overlap_comm": False}, "train_micro_batch_size_per_gpu": 2}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    for given in (config, str(path)):
        ours, theirs = DeepSpeedStrategy(config=given), L.DeepSpeedStrategy(config=given)
        assert ours.config == theirs.config == config and ours.zero_stage() == 3 and ours.micro_batch_size == 2
    monkeypatch.setenv("PL_DEEPSPEED_CONFIG_PATH", str(path))
    assert DeepSpeedStrategy().config == L.DeepSpeedStrategy().config == config
    monkeypatch.delenv("PL_DEEPSPEED_CONFIG_PATH")
    # a config without a ZeRO stage goes to DeepSpeed as is under Lightning: stage 0
    assert DeepSpeedStrategy(config={"train_micro_batch_size_per_gpu": 1}).zero_stage() == 0
    # strategy.config is the dict the engine starts from: a change before fit is used
    ours = DeepSpeedStrategy()
    ours.config["zero_optimization"]["stage"] = 1
    assert ours.zero_stage() == 1
    with pytest.raises(ValueError, match=r"config=\.\.\., offload_optimizer, stage\).*ignored"):
        DeepSpeedStrategy(config=config, stage=3, offload_optimizer=True)  # Lightning drops both silently
    with pytest.raises(FileNotFoundError, match="missing.json"):
        DeepSpeedStrategy(config=str(tmp_path / "missing.json"))


@pytest.mark.parametrize("kwargs, words", [
    ({"remote_device": "cpu"}, r"remote_device='cpu'.*offload_parameters=True"),
    ({"exclude_frozen_parameters": True}, "exclude_frozen_parameters=True"),
    ({"parallel_devices": [torch.device("cuda", 1)]}, r"first 1 visible GPUs.*CUDA_VISIBLE_DEVICES"),
    ({"cluster_environment": object()}, "cluster_environment"),
    ({"precision_plugin": object()}, r"precision_plugin=object.*Trainer\(precision="),
    ({"nvme_path": "/x"}, r"nvme_path \(nothing is offloaded to 'nvme'\)"),
    ({"offload_optimizer": True, "params_buffer_size": 10}, "params_buffer_size .parameters are not offloaded"),
    ({"stage": 3, "offload_parameters": True, "optimizer_buffer_count": 8}, "optimizer_buffer_count"),
    ({"thread_count": 4}, "thread_count"),
    ({"pin_memory": True}, r"pin_memory \(nothing is offloaded\)"),
    ({"offload_params_device": "nvme"}, r"offload_params_device \(offload_parameters=False\)"),
    ({"zero_optimization": False, "stage": 3}, r"stage \(zero_optimization=False\)"),
    ({"offload_optimizer": True, "offload_optimizer_device": "disk"}, "offload_optimizer_device='disk'"),
    ({"stage": 2, "offload_parameters": True}, "Parameter offload needs ZeRO stage 3"),
    ({"logging_batch_size_per_gpu": 0}, "logging_batch_size_per_gpu=0"),
])
def test_deepspeed_strategy_refuses_what_it_would_not_do(kwargs, words):
    from tasktrain.strategies import DeepSpeedStrategy

    with pytest.raises(ValueError, match=words):
        DeepSpeedStrategy(**kwargs)


def test_deepspeed_strategy_keeps_lightnings_other_arguments():
    from tasktrain.strategies import DeepSpeedStrategy

    ours = DeepSpeedStrategy(load_full_weights=True, logging_level=logging.ERROR, process_group_backend="gloo",
                             accelerator="gpu", timeout=__import__("datetime").timedelta(seconds=90))
    assert ours.load_full_weights and ours.logging_level == logging.ERROR and ours.process_group_backend == "gloo"
    assert ours.accelerator == "cuda" and ours.timeout.total_seconds() == 90



# -- FSDP ----------------------------------------------------------------------------------------------------------
def _net():
    return torch.nn.Sequential(torch.nn.Linear(10, 100), torch.nn.Sequential(
        torch.nn.Linear(100, 100), torch.nn.ReLU(), torch.nn.Linear(100, 2)))


@pytest.mark.parametrize("sharding", ["FULL_SHARD", "full_shard", "SHARD_GRAD_OP", "shard_grad_op", "enum:FULL_SHARD",
                                      "enum:SHARD_GRAD_OP"])
@pytest.mark.parametrize("cpu_offload", [None, True, False, "CPUOffload(True)", "CPUOffload(False)"])
def test_fsdp_strategy_sharding_and_offload_are_lightnings(sharding, cpu_offload):
    from torch.distributed.fsdp import CPUOffload, ShardingStrategy

    from tasktrain.strategies import FSDPStrategy

    if sharding.startswith("enum:"):
        sharding = ShardingStrategy[sharding[5:]]
    if isinstance(cpu_offload, str):
        cpu_offload = CPUOffload(offload_params=cpu_offload == "CPUOffload(True)")
    ours = FSDPStrategy(sharding_strategy=sharding, cpu_offload=cpu_offload)
    theirs = L.FSDPStrategy(sharding_strategy=sharding, cpu_offload=cpu_offload)
    assert isinstance(ours, FSDP)
    # FULL_SHARD frees the gathered parameters after each unit's forward; SHARD_GRAD_OP keeps them to the backward
    assert ours.reshard_after_forward == (theirs.sharding_strategy == ShardingStrategy.FULL_SHARD)
    assert ours.cpu_offload == theirs.cpu_offload.offload_params
    assert ours.state_dict_type == theirs._state_dict_type == "full"  # Lightning's default: one file


def test_fsdp_strategy_state_dict_type_and_mixed_precision_are_lightnings():
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

    from tasktrain.strategies import FSDPStrategy

    ours, theirs = FSDPStrategy(state_dict_type="sharded"), L.FSDPStrategy(state_dict_type="sharded")
    assert ours.state_dict_type == theirs._state_dict_type == "sharded"
    for cast in (True, False):
        policy = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=cast,
                                cast_root_forward_inputs=cast)
        ours, theirs = FSDPStrategy(mixed_precision=policy), L.FSDPStrategy(mixed_precision=policy)
        assert isinstance(ours.mixed_precision, MixedPrecisionPolicy)
        for field in ("param_dtype", "reduce_dtype", "cast_forward_inputs"):
            assert getattr(ours.mixed_precision, field) == getattr(theirs.mixed_precision_config, field), field
    fsdp2 = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    assert FSDPStrategy(mixed_precision=fsdp2).mixed_precision is fsdp2  # FSDP2's own, as given
    ours = FSDPStrategy(process_group_backend="gloo", timeout=__import__("datetime").timedelta(seconds=60),
                        sync_module_states=True, use_orig_params=True)
    assert ours.process_group_backend == "gloo" and ours.timeout.total_seconds() == 60
    assert ours.cpu_ram_efficient_loading  # every rank starts from rank 0's weights


def test_fsdp_strategy_wraps_and_checkpoints_what_lightnings_policies_pick():
    import functools

    from torch.distributed.fsdp.wrap import CustomPolicy, ModuleWrapPolicy, size_based_auto_wrap_policy

    from tasktrain.strategies import FSDPStrategy

    net = _net()
    assert FSDPStrategy()._wrap_targets(net) == []  # no policy: the root alone, as Lightning's FSDP
    linear = ["0", "1.0", "1.2"]
    for policy in ({torch.nn.Linear}, ModuleWrapPolicy({torch.nn.Linear}),
                   CustomPolicy(lambda m: isinstance(m, torch.nn.Linear))):
        assert FSDPStrategy(auto_wrap_policy=policy)._wrap_targets(net) == linear
        theirs = L.FSDPStrategy(auto_wrap_policy=policy).kwargs["auto_wrap_policy"]
        assert theirs is policy or isinstance(theirs, ModuleWrapPolicy)  # what Lightning hands FSDP1
    # FSDP1's size-based traversal: "1" holds 10302 parameters, its first Linear 10100 of them (a unit); what is
    # left of "1" (202) and "0" (1100) stay below 5000
    size_based = functools.partial(size_based_auto_wrap_policy, min_num_params=5000)
    assert FSDPStrategy(auto_wrap_policy=size_based)._wrap_targets(net) == ["1.0"]
    for kwargs in ({"activation_checkpointing_policy": {torch.nn.Sequential}},
                   {"activation_checkpointing_policy": ModuleWrapPolicy({torch.nn.Sequential})},
                   {"activation_checkpointing": [torch.nn.Sequential]}):
        with pytest.warns(DeprecationWarning) if "activation_checkpointing" in kwargs else _no_warning():
            ours = FSDPStrategy(**kwargs)
        assert ours._select(net, ours.activation_checkpointing, "activation_checkpointing") == ["1"]
    with pytest.raises(ValueError, match=r"auto_wrap_policy=\['Conv2d'\]\): Sequential has no submodule"):
        FSDPStrategy(auto_wrap_policy={torch.nn.Conv2d})._wrap_targets(net)  # Lightning: the root alone, silently
    ours = FSDPStrategy(activation_checkpointing_policy=size_based)
    assert ours._select(net, ours.activation_checkpointing, "activation_checkpointing") == ["1.0"]
    with pytest.raises(ValueError, match="cannot set both") as theirs:
        L.FSDPStrategy(activation_checkpointing=torch.nn.Linear, activation_checkpointing_policy={torch.nn.Linear})
    with pytest.raises(ValueError, match="cannot set both") as ours:
        FSDPStrategy(activation_checkpointing=torch.nn.Linear, activation_checkpointing_policy={torch.nn.Linear})
    assert str(ours.value) == str(theirs.value)


def _no_warning():
    import contextlib

    return contextlib.nullcontext()


@pytest.mark.parametrize("kwargs, error, words", [
    ({"sharding_strategy": "NO_SHARD"}, ValueError, r"NO_SHARD.*strategy='ddp'"),
    ({"sharding_strategy": "HYBRID_SHARD", "auto_wrap_policy": {torch.nn.Linear}}, ValueError,
     r"HYBRID_SHARD.*ModelParallelStrategy\(data_parallel_replicate_size"),
    ({"sharding_strategy": "_HYBRID_SHARD_ZERO2", "auto_wrap_policy": {torch.nn.Linear}}, ValueError, "HYBRID"),
    ({"device_mesh": (2, 2)}, ValueError, r"device_mesh=\(2, 2\).*ModelParallelStrategy"),
    ({"sharding_strategy": "EVERYTHING"}, ValueError, "'FULL_SHARD' or 'SHARD_GRAD_OP'"),
    ({"checkpoint_io": object()}, ValueError, "checkpoint_io"),
    ({"parallel_devices": [torch.device("cpu"), torch.device("cuda", 0)]}, ValueError, "not a mix"),
    ({"use_orig_params": False}, ValueError, "use_orig_params=False"),
    ({"ignored_modules": []}, TypeError, "FSDP1 option ignored_modules"),
    ({"state_dict_type": "local"}, ValueError, "state_dict_type='local'"),
    ({"auto_wrap_policy": "Block"}, TypeError, "auto_wrap_policy='Block'"),
    ({"mixed_precision": "bf16"}, TypeError, "mixed_precision='bf16'"),
])
def test_fsdp_strategy_refuses_what_it_would_not_do(kwargs, error, words):
    from tasktrain.strategies import FSDPStrategy

    with pytest.raises(error, match=words):
        FSDPStrategy(**kwargs)


def test_fsdp_strategy_refuses_fsdp1_precision_fields_fsdp2_lacks_and_says_what_it_does_itself():
    from torch.distributed.fsdp import MixedPrecision

    from tasktrain.strategies import FSDPStrategy

    with pytest.raises(ValueError, match="buffer_dtype"):
        FSDPStrategy(mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="keep_low_precision_grads"):
        FSDPStrategy(mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, keep_low_precision_grads=True))
    with pytest.warns(UserWarning, match="limit_all_gathers=True.*FSDP2"):
        FSDPStrategy(limit_all_gathers=True)


def test_every_name_in_lightnings_strategy_registry_runs_as_lightnings_or_is_refused_by_name():
    from lightning.pytorch.strategies import StrategyRegistry

    from tasktrain.strategies.registry import LIGHTNING_REFUSED, strategy_from_name

    assert len(StrategyRegistry) >= 25
    for name, entry in StrategyRegistry.items():
        if name in LIGHTNING_REFUSED:
            with pytest.raises(ValueError, match=f"strategy='{name}' .Lightning's."):
                strategy_from_name(name)
            continue
        if name == "deepspeed_stage_3_offload_nvme":  # the folder comes with the name here (no /local_nvme default)
            with pytest.raises(ValueError, match="needs a folder"):
                strategy_from_name(name)
            ours = strategy_from_name(name, nvme_path="/tmp")
        else:
            ours = strategy_from_name(name)
        params = entry["init_params"]
        if "find_unused_parameters" in params:
            assert ours.ddp_kwargs == {"find_unused_parameters": params["find_unused_parameters"]}, name
        if "start_method" in params:
            assert ours.start_method == params["start_method"], name
        if "stage" in params:
            assert ours.zero_stage() == params["stage"], name
        if name.startswith("deepspeed"):
            zero = ours.resolved_config(micro_batch_size=1)["zero_optimization"]
            assert ("offload_optimizer" in zero) == bool(params.get("offload_optimizer")), name
            assert ("offload_param" in zero) == bool(params.get("offload_parameters")), name
            if "offload_params_device" in params:
                assert zero["offload_param"]["device"] == zero["offload_optimizer"]["device"] == "nvme"
        if name.startswith("fsdp"):
            assert ours.cpu_offload == bool(params.get("cpu_offload")), name


def test_model_parallel_strategy_takes_lightnings_arguments():
    from tasktrain.strategies import ModelParallelStrategy

    kwargs = {"data_parallel_size": 2, "tensor_parallel_size": "auto", "save_distributed_checkpoint": False,
              "process_group_backend": "gloo", "timeout": __import__("datetime").timedelta(seconds=60)}
    ours, theirs = ModelParallelStrategy(**kwargs), L.ModelParallelStrategy(**kwargs)
    assert ours.save_distributed_checkpoint == theirs._save_distributed_checkpoint is False
    assert ours.process_group_backend == theirs._process_group_backend == "gloo" and ours.timeout == theirs._timeout
    ours.configure("cpu", devices=2, num_nodes=2)  # Lightning's "auto": the 2 processes of each node
    assert ours.mesh_shape(4) == (2, 2)
    # the defaults of the arguments both have are Lightning's: ModelParallelStrategy() is every process of a node
    # tensor-parallel, the nodes data-parallel
    import inspect

    mine = inspect.signature(ModelParallelStrategy).parameters
    for name, parameter in inspect.signature(L.ModelParallelStrategy).parameters.items():
        assert mine[name].default == parameter.default, name
    default = ModelParallelStrategy()
    default.configure("cpu", devices=2, num_nodes=3)
    assert default.mesh_shape(6) == (3, 2)


def _model_parallel_precisions(trainer_class, strategy_class):
    """For each precision: 'ok', or the error's type and text, of Trainer(strategy=ModelParallelStrategy(), ...)."""
    seen = {}
    for precision in ("16-mixed", 16, "64-true", 64, "32-true", "bf16-mixed", "bf16-true", "16-true", None):
        try:
            trainer_class(strategy=strategy_class(), accelerator="cpu", devices=2, precision=precision, logger=False,
                          enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
            seen[precision] = "ok"
        except Exception as error:  # noqa: BLE001 (the type and words are the result)
            seen[precision] = (type(error).__name__, str(error))
    return seen


def test_model_parallel_strategy_refuses_lightnings_precisions_in_its_words():
    import lightning.pytorch as pl

    from tasktrain import Trainer
    from tasktrain.strategies import ModelParallelStrategy

    mine, theirs = (_model_parallel_precisions(Trainer, ModelParallelStrategy),
                    _model_parallel_precisions(pl.Trainer, L.ModelParallelStrategy))
    assert {k: v if v == "ok" else v[0] for k, v in mine.items()} == \
        {k: v if v == "ok" else v[0] for k, v in theirs.items()}
    refused = [k for k, v in theirs.items() if v != "ok"]
    assert refused == ["16-mixed", 16, "64-true", 64]
    for precision in refused:  # Lightning's words first, then ours
        assert mine[precision][1].startswith(theirs[precision][1]), precision
    with pytest.raises(ValueError, match="precision='16-mixed'"):  # the strategy's own precision too
        Trainer(strategy=ModelParallelStrategy(precision="16-mixed"), accelerator="cpu", devices=2)


def test_lightnings_fork_start_method_is_refused_with_what_to_use():
    from tasktrain.strategies import DDPStrategy

    with pytest.raises(ValueError, match="'popen'.*'spawn'.*Lightning's 'fork'.*notebook_launcher"):
        DDPStrategy(start_method="fork")


def test_single_device_strategy_is_lightnings_name_for_single_device():
    # Lightning's `Trainer(strategy=SingleDeviceStrategy(device=...))`: the same device and accelerator type after setup
    from lightning.pytorch import Trainer as LTrainer

    from tasktrain import Trainer
    from tasktrain.strategies import SingleDevice, SingleDeviceStrategy

    assert issubclass(SingleDeviceStrategy, SingleDevice) and isinstance(SingleDevice(), SingleDeviceStrategy)
    ours = Trainer(strategy=SingleDeviceStrategy(device=torch.device("cpu")), logger=False, enable_checkpointing=False)
    theirs = LTrainer(strategy=L.SingleDeviceStrategy(device=torch.device("cpu")), logger=False,
                      enable_checkpointing=False)
    assert ours.strategy.root_device == theirs.strategy.root_device == torch.device("cpu")
    assert type(ours.accelerator).__name__ == type(theirs.accelerator).__name__ == "CPUAccelerator"
    with pytest.raises(TypeError):  # an argument it does not take is named at construction, not ignored
        SingleDeviceStrategy(device="cpu", not_an_argument=1)


def test_deepspeed_micro_batch_size_of_several_training_loaders_is_lightnings():
    # Without train_micro_batch_size_per_gpu in the config, Lightning's DeepSpeedStrategy reads the training loader's
    # batch_sampler.batch_size (_auto_select_batch_size), 1 where the loader has no batch_sampler: a dict or list of
    # loaders; a CombinedLoader of one loader: that loader's. (A CombinedLoader of several: Lightning's lookup fails
    # with AttributeError on the structure of batch samplers; tasktrain takes 1 as for a dict, docs/lightning.md.)
    from types import SimpleNamespace

    from lightning.pytorch.trainer.connectors.data_connector import _DataLoaderSource
    from lightning.pytorch.utilities import CombinedLoader as TheirCombinedLoader
    from torch.utils.data import DataLoader

    from tasktrain.trainer import loaders
    from tasktrain.utilities import CombinedLoader

    def theirs(loader):
        source = _DataLoaderSource(loader, "train_dataloader")
        stand_in = SimpleNamespace(lightning_module=SimpleNamespace(trainer=SimpleNamespace(
            fit_loop=SimpleNamespace(_data_source=source))))
        return L.DeepSpeedStrategy._auto_select_batch_size(stand_in)

    def ours(loader):
        strategy = DeepSpeed(stage=2)
        strategy.configure("cpu", devices=2)
        return strategy.resolved_config(micro_batch_size=loaders.batch_size_of(loader))[
            "train_micro_batch_size_per_gpu"]

    def given(combined):
        return [DataLoader(range(8), batch_size=4), {"a": DataLoader(range(8), batch_size=3),
                                                     "b": DataLoader(range(8), batch_size=2)},
                [DataLoader(range(8), batch_size=3), DataLoader(range(8), batch_size=2)],
                combined(DataLoader(range(8), batch_size=5), "max_size_cycle")]

    assert [ours(one) for one in given(CombinedLoader)] == [theirs(one) for one in given(TheirCombinedLoader)] == \
        [4, 1, 1, 5]
    several = {"a": DataLoader(range(8), batch_size=3), "b": DataLoader(range(8), batch_size=2)}
    with pytest.raises(AttributeError):
        theirs(TheirCombinedLoader(several, "max_size_cycle"))
    assert ours(CombinedLoader(several, "max_size_cycle")) == 1
