"""DeepSpeed strategy: the config translation (one process, no engine) and real ZeRO runs on 2 gloo processes.

The 2-process runs (tests/deepspeed_scripts/train.py) train the digits classifier with DDP and ZeRO 1, 2, 3, then
with optimizer/parameter offload (DeepSpeedCPUAdam: its C++ op compiles once into TORCH_EXTENSIONS_DIR, ~1-3 min on a
fresh machine) and bf16, all in one launch; and kill and resume a ZeRO-3 run.
"""
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

from tasktrain import DeepSpeed, Trainer
from tasktrain.strategies.deepspeed import ENGINE_TAG, STATE_FILE, build_config
from tasktrain.strategies.registry import strategy_from_name

from helpers import cli_commands_here

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "deepspeed_scripts", "train.py")
_SCRUB = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def run(*args, expect_ok=True, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith("TASKTRAIN_")}
    proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if expect_ok:
        assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    elif expect_ok is not None:  # None: the caller checks
        assert proc.returncode != 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    return proc


def classifier():
    """examples/digits.py's Classifier (the model the scripts train)."""
    examples = os.path.join(os.path.dirname(HERE), "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    from digits import Classifier

    return Classifier


def results(out):
    return [torch.load(f"{out}.rank{rank}.pt") for rank in (0, 1)]


# -- the config, one process, no engine --------------------------------------------------------------------------
def _op_folder(root, op, built=True, lock_age=0.0, others_age=None):
    """A fake op build folder under root: <op>.so (built) and an object file, `others_age` seconds old (default:
    the lock's age), and a lock file `lock_age` seconds old."""
    folder = root / op
    folder.mkdir(parents=True)
    now = time.time()
    for name in ([f"{op}.so"] if built else []) + [f"{op}.o", "build.ninja"]:
        (folder / name).write_bytes(b"")
        age = lock_age if others_age is None else others_age
        os.utime(folder / name, (now - age, now - age))
    (folder / "lock").write_bytes(b"")
    os.utime(folder / "lock", (now - lock_age, now - lock_age))
    return folder / "lock"


def test_a_stale_op_lock_is_removed_with_a_warning_and_a_live_one_is_kept(tmp_path):
    from tasktrain.strategies.deepspeed.ops import STALE_LOCK_SECONDS, clear_stale_op_locks

    old = STALE_LOCK_SECONDS + 60
    stale = _op_folder(tmp_path, "cpu_adam", lock_age=old)
    nested = _op_folder(tmp_path / "py311_cpu", "fused_adam", lock_age=old)  # (torch's default root's layout)
    fresh = _op_folder(tmp_path, "async_io", lock_age=5)  # a load checking or building now
    building = _op_folder(tmp_path, "first", built=False, lock_age=old)  # no .so: a first build may be running
    active = _op_folder(tmp_path, "rebuild", lock_age=old, others_age=30)  # a rebuild still writes its objects
    held = _op_folder(tmp_path, "held", lock_age=old)
    fd = os.open(held, os.O_RDONLY)  # a live FileBaton holder keeps its lock open
    try:
        with pytest.warns(RuntimeWarning) as caught:
            removed = clear_stale_op_locks(str(tmp_path))
    finally:
        os.close(fd)
    assert sorted(removed) == sorted([str(stale), str(nested)])
    assert not stale.exists() and not nested.exists()
    assert fresh.exists() and building.exists() and active.exists() and held.exists()
    messages = [str(w.message) for w in caught]
    assert any(f"Removed the stale lock file {str(stale)!r} of DeepSpeed's cpu_adam op" in m for m in messages)
    # an old lock it must keep is named, with what to do; a young one is not (every load takes it briefly)
    assert any(f"DeepSpeed's first op is locked by {str(building)!r}" in m and "delete that file" in m
               for m in messages)
    assert not any("async_io" in m for m in messages)
    with pytest.warns(RuntimeWarning) as caught:  # its holder gone, the held lock is stale too
        assert clear_stale_op_locks(str(tmp_path)) == [str(held)]
    assert len(caught) == 1 and "held op" in str(caught[0].message)  # (an old lock kept is named once a process)


def test_importing_the_strategy_does_not_import_deepspeed_and_deepspeed_comes_without_mlflow(tmp_path, monkeypatch):
    # (and the first import of deepspeed clears a stale op lock of TORCH_EXTENSIONS_DIR before any op is loaded)
    from tasktrain.strategies.deepspeed.ops import STALE_LOCK_SECONDS

    lock = _op_folder(tmp_path / "ext", "cpu_adam", lock_age=STALE_LOCK_SECONDS + 60)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    code = ("import sys, tasktrain; from tasktrain import DeepSpeed; DeepSpeed(stage=3).resolved_config(8, 2); "
            # Lightning's names too (tasktrain/strategies/lightning.py), without Lightning
            "from tasktrain.strategies import DeepSpeedStrategy, FSDPStrategy; DeepSpeedStrategy(); FSDPStrategy()\n"
            "assert 'lightning' not in sys.modules, 'lightning was imported'\n"
            "assert 'deepspeed' not in sys.modules, 'deepspeed was imported'\n"
            # then deepspeed as the strategy imports it: without mlflow (its autotuner's, ~2 s of CPU a process),
            # which stays importable for the user
            "from tasktrain.strategies.deepspeed import import_deepspeed; import_deepspeed()\n"
            "assert 'deepspeed' in sys.modules and 'mlflow' not in sys.modules, sorted(sys.modules)\n"
            "import deepspeed.autotuning.autotuner as tuner, mlflow; assert tuner.has_mlflow is False\n"
            "assert mlflow.__spec__ is not None and 'mlflow' in sys.modules\n"
            # and DeepSpeed's Muon module, which every ZeRO engine imports, loaded without torch's inductor: its
            # @torch.compile functions are compiled by torch.compile at their first call
            "import torch, deepspeed.runtime.zero.muon.original_muon as muon\n"
            "assert 'torch._inductor.compile_fx' not in sys.modules\n"
            "compiled = []; torch.compile = lambda f: compiled.append(f) or (lambda *a: ('compiled', f.__name__, a))\n"
            "assert muon.zeropower_via_newtonschulz5(1, 2) == ('compiled', 'zeropower_via_newtonschulz5', (1, 2))\n"
            "assert muon.zeropower_via_newtonschulz5(3, 4)[2] == (3, 4) and len(compiled) == 1\n"
            "assert compiled[0] is muon.zeropower_via_newtonschulz5.__wrapped__")
    proc = run("-c", code, timeout=120)
    assert not lock.exists() and f"Removed the stale lock file {str(lock)!r}" in proc.stderr


def test_deepspeeds_cpu_questions_start_one_py_cpuinfo_interpreter_per_process(monkeypatch):
    """py-cpuinfo's get_cpu_info starts a Python interpreter per call (~0.6 s of CPU); DeepSpeed asks it twice per op
    it loads and once per DeepSpeedCPUAdam. After import_deepspeed, DeepSpeed's calls share the first answer (each a
    copy); a call from anywhere else still gets a fresh one."""
    import cpuinfo

    from tasktrain.strategies.deepspeed.engine import import_deepspeed

    calls = []

    def probe():
        calls.append(1)
        return {"arch": "X86_64", "flags": ["avx2"], "vendor_id_raw": "GenuineIntel"}

    monkeypatch.setattr(cpuinfo, "get_cpu_info", probe)
    import_deepspeed()
    from deepspeed.ops.op_builder.cpu.cpu_adam import CPUAdamBuilder

    builder = CPUAdamBuilder()
    assert [builder.cpu_arch(), builder.simd_width(), builder.cpu_arch(), builder.simd_width()] == [
        "-march=native", "-D__AVX256__", "-march=native", "-D__AVX256__"]
    assert len(calls) == 1
    answer = cpuinfo.get_cpu_info()  # not DeepSpeed asking: a fresh answer
    assert len(calls) == 2 and answer == probe()
    calls.clear()
    import_deepspeed()  # a second import does not wrap the function twice
    builder.cpu_arch()
    assert calls == []


def test_registry_names():
    for name, stage, opt, par in [("deepspeed", 2, None, None), ("deepspeed_stage_1", 1, None, None),
                                  ("deepspeed_stage_2_offload", 2, True, None), ("deepspeed_stage_3", 3, None, None),
                                  ("deepspeed_stage_3_offload", 3, True, True)]:
        config = strategy_from_name(name).resolved_config(micro_batch_size=8)["zero_optimization"]
        assert config["stage"] == stage, name
        assert ("offload_optimizer" in config) == bool(opt), name
        assert ("offload_param" in config) == bool(par), name


def test_auto_values_are_filled_from_the_run():
    user = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "train_batch_size": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
            "zero_optimization": {"stage": 3, "overlap_comm": False}, "steps_per_print": 7}
    config = build_config(user, precision="bf16-mixed", micro_batch_size=16, accumulate_grad_batches=4,
                          gradient_clipping=0.5, world_size=2)
    assert config["train_micro_batch_size_per_gpu"] == 16
    assert config["gradient_accumulation_steps"] == 4
    assert config["train_batch_size"] == 16 * 4 * 2
    assert config["gradient_clipping"] == 0.5
    assert config["bf16"] == {"enabled": True}
    assert config["zero_optimization"] == {"stage": 3, "overlap_comm": False}  # as given
    assert config["steps_per_print"] == 7
    assert user["train_batch_size"] == "auto"  # the user's dict is not touched


def test_missing_values_and_clipping_is_always_explicit():
    config = build_config({}, precision="32-true", micro_batch_size=8)
    assert config["zero_optimization"] == {"stage": 2}
    assert config["gradient_clipping"] == 0.0  # DeepSpeed's own default would be 1.0
    assert config["gradient_accumulation_steps"] == 1 and config["train_batch_size"] == 8
    assert "bf16" not in config and "fp16" not in config
    # a number in the config is honoured when the run does not clip
    assert build_config({"gradient_clipping": 2.0}, precision="32-true", micro_batch_size=8)["gradient_clipping"] == 2.0


def test_offload_sections():
    zero = build_config({}, stage=3, offload_optimizer=True, offload_parameters=True, precision="32-true",
                        micro_batch_size=4)["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": False}
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": False}
    assert build_config({}, stage=3, save_16bit_model=True)["zero_optimization"][
        "stage3_gather_16bit_weights_on_model_save"] is True
    # the config's own section is used as given (tasktrain launch passes False for "not asked")
    own = {"zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memory": True, "buffer_count": 5}}}
    assert build_config(own, offload_optimizer=False)["zero_optimization"] == {"stage": 2, **own["zero_optimization"]}
    assert build_config(own, offload_optimizer=True)["zero_optimization"] == {"stage": 2, **own["zero_optimization"]}


@pytest.mark.parametrize("user, run_values, words", [
    ({"fp16": {"enabled": True}}, {"precision": "bf16-mixed"}, ["fp16", "'bf16-mixed'", "\"auto\""]),
    ({"bf16": {"enabled": True}}, {"precision": "32-true"}, ["bf16", "'32-true'"]),
    ({"gradient_accumulation_steps": 4}, {"accumulate_grad_batches": 2}, ["gradient_accumulation_steps=4",
                                                                           "accumulate_grad_batches"]),
    ({"gradient_clipping": 1.0}, {"gradient_clipping": 0.5}, ["gradient_clipping=1.0", "0.5"]),
    ({"train_micro_batch_size_per_gpu": 16}, {}, ["train_micro_batch_size_per_gpu=16", "batch_size"]),
    ({"train_batch_size": 100}, {}, ["train_batch_size=100", "x 2 processes"]),
    ({"zero_optimization": {"stage": 3}}, {"stage": 2}, ["stage=3", "stage 2"]),
    ({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}, {}, ["stage 3", "offload"]),
    ({"optimizer": {"type": "Adam"}}, {}, ["\"optimizer\"", "configure_optimizers"]),
    ({"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": False}},
     {"save_16bit_model": True}, ["stage3_gather_16bit_weights_on_model_save"]),
    ({}, {"precision": "16-mixed"}, ["fp16", "bf16-mixed"]),
    ({}, {"precision": "64-true"}, ["64-true"]),
])
def test_conflicts_are_errors(user, run_values, words):
    values = dict(precision="32-true", micro_batch_size=32, accumulate_grad_batches=1, world_size=2)
    values.update(run_values)
    with pytest.raises(ValueError) as err:
        build_config(user, **values)
    for word in words:
        assert word in str(err.value)


def test_json_config_file(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 1}, "gradient_accumulation_steps": "auto",
                                "train_micro_batch_size_per_gpu": "auto"}))
    config = DeepSpeed(config=str(path)).resolved_config(micro_batch_size=4, accumulate_grad_batches=3)
    assert config["zero_optimization"]["stage"] == 1
    assert config["gradient_accumulation_steps"] == 3 and config["train_batch_size"] == 12
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        DeepSpeed(config=str(path))
    with pytest.raises(FileNotFoundError, match="no such file"):
        DeepSpeed(config=str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="stage 3"):
        DeepSpeed(stage=2, zero3_init=True)


def test_fp16_on_cpu_fails_before_any_process_starts():
    from helpers import Linear, loader

    with pytest.warns(UserWarning, match="bf16-mixed"):  # the precision plugin's own CPU warning
        trainer = Trainer(strategy="deepspeed_stage_2", devices=2, precision="16-mixed", logger=False,
                          enable_progress_bar=False, enable_checkpointing=False)
    with pytest.raises(ValueError, match="precision='bf16-mixed'"):
        trainer.fit(Linear(), loader())
    assert "RANK" not in os.environ and not trainer.strategy.launcher.procs  # nobody was launched


@pytest.mark.timeout(300)
def test_a_new_engine_after_the_group_was_destroyed_with_torchs_call_trains():
    """DeepSpeed keeps its own copies of the process group; a script (or Lightning, or another strategy ending its
    world of one) that destroys the group with torch's own call leaves them stale, and the next DeepSpeed engine of
    the process failed looking ranks up in the destroyed group ("Group ... is not registered"). It trains now."""
    from helpers import Linear, loader, quiet

    for _ in range(2):
        trainer = Trainer(strategy="deepspeed", devices=1, max_steps=1, **quiet())
        trainer.fit(Linear(), loader())
        assert trainer.global_step == 1
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def test_one_process_trains_like_single_device_and_rejects_conflicts(tmp_path, capsys):
    """A world of one (no launcher): an accumulation conflict is an error before the engine starts; then the same
    process trains under ZeRO-2 exactly like SingleDevice (SGD, fp32), with the group set up again."""
    from helpers import Linear, loader, quiet, regression_data

    conflicting = DeepSpeed(stage=2, config={"gradient_accumulation_steps": 4})
    with pytest.raises(ValueError, match="accumulate_grad_batches"):
        Trainer(strategy=conflicting, devices=1, max_steps=2, accumulate_grad_batches=2, **quiet()).fit(
            Linear(), loader())

    def same_order(strategy, n):
        """The loader of n; on single_device with the order a distributed strategy gives it on one process (as
        Lightning's: DistributedSampler(shuffle=True, seed=0) for the training loader, sequential or not)."""
        if strategy != "single_device":
            return loader(n=n, batch_size=8)
        sampler = torch.utils.data.DistributedSampler(range(n), num_replicas=1, rank=0, shuffle=True, seed=0)
        return torch.utils.data.DataLoader(regression_data(n), batch_size=8, sampler=sampler)

    def train(strategy):
        module = Linear()
        trainer = Trainer(strategy=strategy, devices=1, max_epochs=2, accumulate_grad_batches=2,
                          gradient_clip_val=0.5, **quiet())
        trainer.fit(module, same_order(strategy, 40))
        return trainer.global_step, module.state_dict()

    steps, ref = train("single_device")  # 5 batches: windows of 2, 2 and 1 (cut short by the epoch)
    ds_steps, trained = train("deepspeed_stage_2")
    assert steps == ds_steps == 6
    assert not torch.equal(ref["layer.weight"], Linear().state_dict()["layer.weight"])
    for name, value in ref.items():
        torch.testing.assert_close(trained[name], value, rtol=0, atol=1e-6)

    class Manual(Linear):  # manual optimisation: the user's backward and step go through the engine
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            loss = torch.nn.functional.mse_loss(self(batch[0]), batch[1])
            self.manual_backward(loss)
            opt.step()
            opt.zero_grad()

    def train_manual(strategy):
        module = Manual()
        Trainer(strategy=strategy, devices=1, max_epochs=1, **quiet()).fit(module, same_order(strategy, 32))
        return module.state_dict()

    ref, trained = train_manual("single_device"), train_manual("deepspeed_stage_1")
    for name, value in ref.items():
        torch.testing.assert_close(trained[name], value, rtol=0, atol=1e-6)

    class Five(torch.utils.data.IterableDataset):  # no length: the loop reads ahead to end the last window (of 1)
        def __iter__(self):
            data = regression_data(40)
            for b in range(5):
                yield data[b * 8:(b + 1) * 8]

    def train_iterable(strategy):
        module = Linear()
        trainer = Trainer(strategy=strategy, devices=1, max_steps=3, accumulate_grad_batches=2, **quiet())
        trainer.fit(module, torch.utils.data.DataLoader(Five(), batch_size=None))
        return trainer.global_step, module.state_dict()

    (steps, ref), (ds_steps, trained) = train_iterable("single_device"), train_iterable("deepspeed_stage_2")
    assert steps == ds_steps == 3  # before the contract's windows, DeepSpeed refused the window cut short here
    for name, value in ref.items():
        torch.testing.assert_close(trained[name], value, rtol=0, atol=1e-6)

    # Lightning's: the engine outlives the run, so trainer.save_checkpoint(...) after fit (and after validate) writes
    # its shards; a world of one keeps its group for it until the next run sets up (its own group then)
    from tasktrain import Callback, CheckpointError

    class StopAtStart(Callback):
        def on_train_start(self, trainer, module):
            self.weights, self.step = {k: v.clone() for k, v in module.state_dict().items()}, trainer.global_step
            trainer.should_stop = True

    kept, module = Trainer(strategy="deepspeed_stage_2", devices=1, max_epochs=1, **quiet()), Linear()
    kept.fit(module, loader(n=16))
    kept.save_checkpoint(tmp_path / "after_fit")
    fitted = {k: v.clone() for k, v in module.state_dict().items()}
    kept.validate(module, loader(n=16), verbose=False)
    kept.save_checkpoint(tmp_path / "after_validate")
    start = StopAtStart()
    Trainer(strategy="deepspeed_stage_2", devices=1, max_epochs=2, callbacks=[start], **quiet()).fit(
        Linear(), loader(n=16), ckpt_path=tmp_path / "after_fit")
    assert start.step == kept.global_step == 2
    assert not torch.equal(fitted["layer.weight"], Linear().state_dict()["layer.weight"])
    for name, value in fitted.items():
        assert torch.equal(start.weights[name], value), name
    with pytest.raises(CheckpointError, match="saved after validate"):  # an evaluation engine has no optimizer
        Trainer(strategy="deepspeed_stage_2", devices=1, max_epochs=2, **quiet()).fit(
            Linear(), loader(n=16), ckpt_path=tmp_path / "after_validate")
    with pytest.raises(RuntimeError, match="holds no engine"):  # a later run set up: the kept engine went
        kept.save_checkpoint(tmp_path / "too_late")
    assert "LOCAL_RANK" not in os.environ  # set for DeepSpeed during the run only

    # Lightning's DeepSpeedStrategy(load_full_weights=True): a fit resumed from a single file (optimizer state
    # included) takes its weights and counters and drops the optimizer state with Lightning's warning, at any stage
    # here (Lightning's: stage 3); the weights then train on (the engine's fp32 copy is the loaded weights), as a
    # single-device resume does (plain SGD: no optimizer state to lose). Without it the file is refused.
    import warnings

    from tasktrain.strategies import DeepSpeedStrategy

    one = Trainer(strategy="single_device", devices=1, max_epochs=1, **quiet())
    one.fit(Linear(), loader(n=16))
    one.save_checkpoint(tmp_path / "one.ckpt")

    class SeenAtStart(Callback):
        def on_train_start(self, trainer, module):
            self.step = trainer.global_step  # (the ZeRO-3 partitions gathered:)
            self.weights = {k: v.clone() for k, v in trainer.strategy.full_state_dict().items()}

    def resume_from_file(strategy):
        start, module = SeenAtStart(), Linear()
        trainer = Trainer(strategy=strategy, devices=1, max_epochs=2, callbacks=[start], **quiet())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(module, same_order("single_device" if strategy == "single_device" else "deepspeed", 16),
                        ckpt_path=tmp_path / "one.ckpt")
        said = [str(w.message) for w in caught if "single checkpoint file" in str(w.message)]
        return start, trainer.global_step, module.state_dict(), said

    start, steps, ref, said = resume_from_file("single_device")
    assert start.step == 2 and steps == 4 and not said
    for stage in (2, 3):
        ds_start, ds_steps, trained, said = resume_from_file(DeepSpeedStrategy(stage=stage, load_full_weights=True))
        assert said == ["A single checkpoint file has been given. This means optimizer states cannot be restored. "
                        "If you'd like to restore these states, you must provide a path to the originally saved "
                        "DeepSpeed checkpoint. When using ZeRO 3, the original path should be a directory."], stage
        assert ds_start.step == 2 and ds_steps == 4, stage
        for name, value in start.weights.items():
            assert torch.equal(ds_start.weights[name], value), (stage, name)
        for name, value in ref.items():
            torch.testing.assert_close(trained[name], value, rtol=0, atol=1e-6, msg=f"stage {stage}: {name}")
    with pytest.raises(ValueError, match="plain optimizer state"):
        Trainer(strategy=DeepSpeedStrategy(stage=2), devices=1, max_epochs=2, **quiet()).fit(
            Linear(), loader(n=16), ckpt_path=tmp_path / "one.ckpt")

    # A bf16 engine that does not train (here validate's, stage 0) is built with DeepSpeed's BF16_Optimizer, which
    # reports memory on rank 0 (see_memory_usage(force=True), here twice): the report is printed, without the full
    # gc.collect() DeepSpeed runs before each (~0.15 s of CPU each); the teardown's own collection still runs.
    import gc

    from tasktrain.strategies.base import release_kept_runs

    collections, collect = [], gc.collect

    def spy(*args):
        collections.append(sys._getframe(1).f_code.co_name)
        return collect(*args)

    capsys.readouterr()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gc, "collect", spy)
        Trainer(strategy="deepspeed_stage_2", devices=1, precision="bf16-mixed", **quiet()).validate(
            Linear(), loader(n=16), verbose=False)
        release_kept_runs()  # the engine kept after validate goes now, through the strategy's teardown
    assert "begin bf16_optimizer" in capsys.readouterr().out  # DeepSpeed's report, as DeepSpeed prints it
    assert "see_memory_usage" not in collections and "teardown" in collections, collections


# -- 2 processes --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One 2-process launch: DDP, then ZeRO 1, 2 and 3 (fp32, accumulation 2, clipping 0.5; the ZeRO-3 run
    checkpoints every step, top 2 + last, and its last checkpoint is validated by a fresh Trainer); then optimizer
    offload and bf16 (the "offload" case). The script keeps the first part's results should the second fail. Last in
    the same launch, once the results are written, test_kill_and_resume's ZeRO-3 fit under ROOT/killed, whose rank 1
    is SIGKILLed after step 15: the launch ends there, non-zero (a launch of its own would start the processes and
    import DeepSpeed again). `proc.stdout` is what came before it (rank 0's line that says it starts), `proc.killed`
    whether it was reached."""
    root = tmp_path_factory.mktemp("ds_compare")
    proc = run(SCRIPT, "--root", str(root), "--out", str(root / "out"), "--case", "compare", "offload",
               "--kill-at", "15", expect_ok=None, timeout=840)
    marker = "-- the killed fit starts --"
    proc.killed = marker in proc.stdout
    proc.stdout = proc.stdout.split(marker)[0]
    return root, proc


@pytest.fixture(scope="module")
def compare(launched):
    root, proc = launched
    if not os.path.exists(f"{root / 'out'}.rank0.pt"):
        pytest.fail("the launch ended before the DDP/ZeRO comparison was written:\n" + proc.stdout[-5000:]
                    + proc.stderr[-5000:])
    return root, results(root / "out")


@pytest.mark.world_size(2)
@pytest.mark.timeout(900)  # its set-up is the whole launch
def test_zero_stages_train_like_ddp(compare):
    _, ranks = compare
    for rank, res in enumerate(ranks):
        ddp = res["ddp"]
        assert ddp["global_step"] == 22 and len(ddp["losses"]) == 44
        assert ddp["val_acc"] > 0.8
        for stage in ("stage1", "stage2", "stage3"):
            ds = res[stage]
            assert ds["global_step"] == 22, stage
            if stage != "stage3":
                torch.testing.assert_close(torch.tensor(ds["losses"]), torch.tensor(ddp["losses"]), rtol=0, atol=1e-5)
                for name, value in ddp["weights"].items():
                    torch.testing.assert_close(ds["weights"][name], value, rtol=0, atol=1e-5)
            else:
                # ZeRO-3 reduce-scatters each micro-batch and sums the window's partitions ((a1+b1)+(a2+b2) where
                # DDP has (a1+a2)+(b1+b2)): its weights drift from DDP's by ~1e-7, and once such a drift moves a hidden
                # unit's pre-activation across ReLU's kink, that unit's gradient differs (measured: one unit at step
                # 21 of 22, weights then 5e-4 apart, losses 3e-5). Compared per tensor by relative distance: the drift
                # gives <= 3.4e-4; a real difference (ZeRO-3 without the clipping) gives 4e-2 to 1e-1.
                torch.testing.assert_close(torch.tensor(ds["losses"]), torch.tensor(ddp["losses"]), rtol=0, atol=1e-4)
                for name, value in ddp["weights"].items():
                    assert float((ds["weights"][name] - value).norm() / value.norm()) < 2e-3, (rank, name)
            assert abs(ds["val_acc"] - ddp["val_acc"]) < 0.01, (rank, stage)
            assert ds["validate_after_fit"] == pytest.approx(ds["val_acc"], abs=1e-6), (rank, stage)
        assert res["stage3"]["validate_last"] == pytest.approx(res["stage3"]["val_acc"], abs=1e-6)
        # trainer.save_checkpoint after fit (Lightning's engine outlives the run): a new Trainer resumes from it at the
        # fit's step with its very weights; the save after validate holds the weights a fresh validate reads back
        stage2 = res["stage2"]
        assert stage2["resumed_step"] == 22
        for name, value in stage2["weights"].items():
            assert torch.equal(stage2["weights_after_fit"][name], value), (rank, name)
            assert torch.equal(stage2["resumed_weights"][name], value), (rank, name)
        assert stage2["validate_saved_after_validate"] == pytest.approx(stage2["val_acc"], abs=1e-6)
        assert res["stage3"]["created_partitioned"] and not res["stage2"]["created_partitioned"]  # zero3_init


@pytest.mark.world_size(2)
@pytest.mark.timeout(600)
def test_checkpoint_directories_and_convert(compare, tmp_path):
    root, ranks = compare
    directory = root / "stage3" / "checkpoints"
    names = sorted(os.listdir(directory))
    assert names == ["epoch=1-step=21.ckpt", "epoch=1-step=22.ckpt", "last.ckpt"]  # top 2 kept, older removed
    newest, last = directory / "epoch=1-step=22.ckpt", directory / "last.ckpt"
    for part in (STATE_FILE, "latest"):  # save_last=True: last.ckpt is a write of its own (Lightning's)
        assert os.stat(last / part).st_ino != os.stat(newest / part).st_ino
    assert sorted(os.listdir(last / ENGINE_TAG)) == sorted(os.listdir(newest / ENGINE_TAG))
    # the state file's top level is Lightning's; how the engine wrote the directory is among tasktrain's own keys
    state = torch.load(last / STATE_FILE, weights_only=True)
    assert "deepspeed" not in state and state["loops"]["deepspeed"]["stage"] == 3
    assert state["loops"]["deepspeed"]["world_size"] == 2
    assert not (root / "stage3" / ".last_checkpoint.json").exists()  # no launch restart: no record beside them

    from tasktrain import CheckpointError

    Classifier = classifier()
    with pytest.raises(CheckpointError, match="convert"):
        Classifier.load_from_checkpoint(str(last))
    # The three `tasktrain convert` commands below, through the CLI's entry point in this process (see
    # helpers.cli_commands_here): the directory to one file, that file given as a directory (an error), the
    # directory to safetensors shards.
    out = tmp_path / "model.ckpt"
    export = tmp_path / "export"
    (code, stdout, stderr), bad, (export_code, export_stdout, export_stderr) = cli_commands_here([
        ["convert", last, out], ["convert", out, tmp_path / "x.ckpt"],
        ["convert", last, export, "--format", "safetensors", "--max-shard-size", "10KB"]])
    assert code == 0 and "wrote" in stdout, stdout + stderr
    plain = torch.load(out, weights_only=True)
    assert plain["loops"]["weights_only"] is True and plain["hyper_parameters"]["hidden"] == 64
    module = Classifier.load_from_checkpoint(str(out))
    trained = ranks[0]["stage3"]["weights"]
    assert set(module.state_dict()) == set(trained)
    for name, value in module.state_dict().items():
        torch.testing.assert_close(value, trained[name], rtol=0, atol=1e-6)
    assert bad[0] != 0 and "not a directory" in bad[2], bad

    # The same directory as Hugging Face safetensors shards (issue 21): the consolidated fp32 weights, by key.
    assert export_code == 0, export_stdout + export_stderr
    index = json.loads((export / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(trained) and len(set(index["weight_map"].values())) > 1
    from tasktrain.inference.checkpoint_files import read_state_dict

    for shard in set(index["weight_map"].values()):
        for name, value in read_state_dict(export / shard).items():
            torch.testing.assert_close(value, trained[name], rtol=0, atol=1e-6)

    # ModelCheckpoint(save_weights_only=True) under ZeRO-1: one file, the consolidated fp32 weights
    weights_file = root / "weights" / "final.ckpt"
    assert weights_file.is_file() and not any(n.endswith("tmp") for n in os.listdir(root / "weights"))
    module = Classifier.load_from_checkpoint(str(weights_file))
    for name, value in module.state_dict().items():
        torch.testing.assert_close(value, ranks[0]["stage1"]["weights"][name], rtol=0, atol=1e-6)


@pytest.mark.world_size(2)
@pytest.mark.timeout(600)
def test_kill_and_resume_is_exact(launched, compare, tmp_path):
    root, launch = launched
    _, ranks = compare
    reference = ranks[0]["stage3"]
    # rank 1 was SIGKILLed after optimizer step 15 (mid-epoch, mid-accumulation-window bookkeeping), in the killed fit
    # that ended the compare launch (under root/killed)
    assert launch.killed and launch.returncode != 0, launch.stdout[-5000:] + launch.stderr[-5000:]
    assert not any("killed_fit_ended" in res for res in ranks)
    killed = root / "killed"
    assert os.path.isdir(killed / "stage3" / "checkpoints" / "last.ckpt")
    out = tmp_path / "out"
    proc = run(SCRIPT, "--root", str(killed), "--out", str(out), "--case", "resume", "--resume")
    assert "resumed from" in proc.stdout and "global step 14" in proc.stdout
    resumed = results(out)[0]["stage3"]
    assert resumed["global_step"] == 22
    assert resumed["losses"] == reference["losses"][-len(resumed["losses"]):]
    for name, value in reference["weights"].items():
        assert torch.equal(resumed["weights"][name], value), name


@pytest.mark.world_size(2)
@pytest.mark.timeout(900)
def test_offload_and_bf16(launched, compare):
    root, proc = launched
    # the offload case ran to its end: the launch went on to the killed fit that ends it (test_kill_and_resume)
    assert proc.killed, proc.stdout[-5000:] + proc.stderr[-5000:]
    _, ranks = compare
    ddp_acc = ranks[0]["ddp"]["val_acc"]
    out = root / "out"
    assert proc.stdout.count("replaced by DeepSpeedCPUAdam") == 1  # said once, by rank 0
    for res in results(out):
        offload = res["stage2_offload"]
        assert offload["global_step"] == 22 and abs(offload["val_acc"] - ddp_acc) < 0.03
        # one epoch, then resumed from its checkpoint for the second: the same run (CPUAdam recomputes its
        # bias-correction powers after a load, hence float-level, not bitwise, equality)
        resumed = res["stage2_offload_resumed"]
        assert resumed["global_step"] == 22 and len(resumed["losses"]) == 22
        for name, value in offload["weights"].items():
            torch.testing.assert_close(resumed["weights"][name], value, rtol=0, atol=1e-5)
        bf16 = res["stage3_offload_bf16"]
        assert bf16["global_step"] == 22 and bf16["val_acc"] > 0.8

    Classifier = classifier()
    sixteen = root / "s3off" / "checkpoints" / "last.ckpt" / "model_16bit.pt"
    state = torch.load(sixteen, weights_only=True)["state_dict"]
    assert {v.dtype for v in state.values()} == {torch.bfloat16}
    module = Classifier.load_from_checkpoint(str(sixteen))  # loads into the plain (fp32) module
    trained = results(out)[0]["stage3_offload_bf16"]["weights"]
    for name, value in module.state_dict().items():
        torch.testing.assert_close(value, trained[name], rtol=0, atol=0)


@pytest.mark.world_size(2)
@pytest.mark.timeout(300)
def test_memory_is_sharded(tmp_path):
    """benchmarks/deepspeed_memory.py --quick: per-rank tensor bytes at ZeRO 0-3 (the shares, not timings)."""
    out = tmp_path / "memory.json"
    run(os.path.join(os.path.dirname(HERE), "benchmarks", "deepspeed_memory.py"), "--quick", "--out", str(out))
    measured = json.loads(out.read_text())
    full = measured["parameters"] * 4  # fp32 bytes of the whole model
    for rank in (0, 1):
        b = {int(stage): rows[rank] for stage, rows in measured["bytes_per_rank"].items()}
        assert [b[s]["parameters"] for s in range(4)] == pytest.approx([full, full, full, full / 2], rel=0.01)
        assert b[0]["optimizer state"] == pytest.approx(2 * full, rel=0.01)  # AdamW: two moments
        for stage in (1, 2, 3):
            assert b[stage]["optimizer state"] == pytest.approx(full, rel=0.01)  # half of it on each rank
            assert b[stage]["master weights"] == pytest.approx(full / 2, rel=0.01)
        assert b[2]["gradients"] < b[1]["gradients"] - full / 3  # stage 2: half the gradients during the window


@pytest.mark.timeout(300)
def test_zero3_parameter_dtypes_do_not_depend_on_the_cpu(tmp_path):
    """Issue 13: with DeepSpeed's float16 probe forced to True and to False (whatever this CPU is), ZeRO-3 parameters
    created under zero3_init and the engine's working copies are fp32 under '32-true' and bf16 under 'bf16-mixed'.
    Before the fix, CPUs without float16 created bf16 parameters in fp32 runs (an explicit dtype dropped upstream)."""
    out = tmp_path / "dtypes.json"
    run(os.path.join(HERE, "deepspeed_scripts", "dtypes.py"), "--out", str(out), timeout=240)
    results = json.loads(out.read_text())
    for fp16 in (True, False):
        for precision, dtype in (("32-true", "torch.float32"), ("bf16-mixed", "torch.bfloat16")):
            made = results[f"fp16={fp16} {precision} zero3_init=True"]
            assert made["partitioned"], made  # really created by zero.Init
            assert made["created"] == [dtype] and made["engine"] == [dtype], (fp16, precision, made)
            plain = results[f"fp16={fp16} {precision} zero3_init=False"]
            assert plain["created"] == ["torch.float32"] and plain["engine"] == [dtype], (fp16, precision, plain)
    error = results["wrong dtype"]
    assert re.search(r"DeepSpeed \d+\.\d+", error), error
    for word in ("torch.float16", "precision='32-true'", "torch.float32"):
        assert word in error, error


# -- offload to disk ("nvme": a local folder; DeepSpeed's async_io op, which needs libaio-dev) ---------------------
NVME_SCRIPT = os.path.join(HERE, "deepspeed_scripts", "nvme.py")


def test_disk_offload_config_and_errors(tmp_path):
    """Offload to disk: the sections, the aio defaults and their overrides, and the errors raised at construction."""
    from tasktrain.utils.dataclasses import DeepSpeedPlugin

    config = DeepSpeed(stage=3, offload_optimizer=True, offload_parameters=True, offload_device="nvme",
                       nvme_path=str(tmp_path), aio={"queue_depth": 4}).resolved_config(4)
    zero = config["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "nvme", "nvme_path": str(tmp_path), "pin_memory": False,
                                         "buffer_count": 4}
    assert zero["offload_param"] == {"device": "nvme", "nvme_path": str(tmp_path), "pin_memory": False,
                                     "buffer_count": 5, "buffer_size": "auto", "max_in_cpu": 0}
    assert config["aio"]["queue_depth"] == 4 and config["aio"]["block_size"] == 1048576
    # one offload on disk, the other in memory; the config's own values win over the defaults
    own = {"zero_optimization": {"offload_param": {"device": "nvme", "buffer_size": 10 ** 6}}, "aio": {"block_size": 4096}}
    config = DeepSpeed(stage=3, config=own, offload_optimizer="cpu", nvme_path=str(tmp_path)).resolved_config(4)
    assert config["zero_optimization"]["offload_param"]["buffer_size"] == 10 ** 6
    assert config["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": False}
    assert config["aio"]["block_size"] == 4096 and config["aio"]["overlap_events"] is True
    # the registry name and the Accelerator's plugin give the same strategy
    named = strategy_from_name("deepspeed_stage_3_offload_nvme", nvme_path=str(tmp_path)).resolved_config(4)
    plugin = DeepSpeedPlugin(zero_stage=3, offload_optimizer_device="nvme", offload_param_device="nvme",
                             offload_optimizer_nvme_path=str(tmp_path), offload_param_nvme_path=str(tmp_path))
    assert plugin.strategy().resolved_config(4) == named
    for kwargs, words in [
        (dict(stage=3, offload_optimizer=True, offload_device="nvme"), ["nvme_path"]),
        (dict(stage=2, offload_optimizer="nvme", nvme_path=str(tmp_path)), ["stage 3", "stage 2"]),
        (dict(stage=2, offload_parameters=True, offload_device="nvme", nvme_path=str(tmp_path)), ["stage 3"]),
        (dict(stage=3, nvme_path=str(tmp_path)), ["nothing is offloaded to disk"]),
        (dict(stage=3, offload_optimizer="disk"), ["'cpu' or 'nvme'"]),
        (dict(stage=3, offload_optimizer="nvme", nvme_path=str(tmp_path), aio={"depth": 1}), ["not an aio setting"]),
        (dict(stage=3, offload_parameters="nvme", nvme_path=str(tmp_path), zero3_init=True), ["buffer_size"]),
    ]:
        with pytest.raises(ValueError) as err:
            DeepSpeed(**kwargs)
        for word in words:
            assert word in str(err.value), (kwargs, str(err.value))
    with pytest.raises(ValueError, match="nvme_path"):
        strategy_from_name("deepspeed_stage_3_offload_nvme")
    with pytest.raises(ValueError, match="two folders"):
        DeepSpeedPlugin(zero_stage=3, offload_optimizer_device="nvme", offload_param_device="nvme",
                        offload_optimizer_nvme_path=str(tmp_path), offload_param_nvme_path="/elsewhere").strategy()


def test_disk_offload_checks_before_training(tmp_path, monkeypatch):
    """The folder, libaio and the async_io op are checked before training (setup_environment runs this on every rank):
    a missing or read-only folder, no libaio (the Debian package named), a file system where async I/O fails."""
    from tasktrain.strategies.deepspeed import config as ds

    def config(folder):
        return DeepSpeed(stage=3, offload_optimizer="nvme", nvme_path=str(folder)).resolved_config(4)

    with pytest.raises(ValueError, match="does not exist.*mkdir -p"):
        ds.check_nvme_offload(config(tmp_path / "missing"))
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    monkeypatch.setattr(ds.os, "access", lambda path, mode: os.fspath(path) != str(read_only))
    with pytest.raises(ValueError, match="not writable"):
        ds.check_nvme_offload(config(read_only))
    monkeypatch.undo()
    monkeypatch.setattr(ds, "_async_io_available", lambda: False)
    with pytest.raises(RuntimeError, match="libaio-dev.*apt-get install -y libaio-dev"):
        ds.check_nvme_offload(config(tmp_path))
    monkeypatch.undo()
    monkeypatch.setattr(ds, "_probe_async_io", lambda folder, aio: "the write failed")
    with pytest.raises(RuntimeError, match="async I/O.*the write failed.*local disk"):
        ds.check_nvme_offload(config(tmp_path))
    monkeypatch.undo()
    # the real probe: a 1 MiB aio write and read in the folder works on this disk
    assert ds._probe_async_io(str(tmp_path), config(tmp_path)["aio"]) is None
    assert os.listdir(tmp_path) == ["read_only"]  # the probe's file is gone
    ds.check_nvme_offload(config(tmp_path))


@pytest.fixture(scope="module")
def on_disk(tmp_path_factory):
    """One launch: CPU offload, disk offload (checkpointing every step), disk offload killed after step 15; then the
    killed run resumed through `tasktrain launch` and the Accelerate YAML keys, into a new swap folder."""
    root = tmp_path_factory.mktemp("ds_nvme")
    out = root / "out"
    run(NVME_SCRIPT, "--root", str(root), "--out", str(out), "--kill-at", "15", expect_ok=False, timeout=600)
    first = results(out)
    (root / "swap2").mkdir()
    yaml = root / "nvme.yaml"
    yaml.write_text("distributed_type: DEEPSPEED\nnum_processes: 2\nuse_cpu: true\ndeepspeed_config:\n"
                    "  zero_stage: 3\n  offload_optimizer_device: nvme\n  offload_param_device: nvme\n"
                    f"  offload_optimizer_nvme_path: {root / 'swap2'}\n  offload_param_nvme_path: {root / 'swap2'}\n")
    proc = run("-m", "tasktrain.cli.main", "launch", "--config_file", str(yaml), NVME_SCRIPT, "--root", str(root),
               "--out", str(out), "--resume", timeout=600)
    resumed = [torch.load(f"{out}.resumed.rank{rank}.pt") for rank in (0, 1)]
    return root, first, resumed, proc.stdout


@pytest.mark.world_size(2)
@pytest.mark.timeout(1200)
def test_disk_offload_trains_like_cpu_offload_and_resumes_exactly(on_disk, tmp_path):
    root, first, resumed, stdout = on_disk
    for rank in (0, 1):
        cpu, nvme = first[rank]["cpu"], first[rank]["nvme"]
        assert nvme["global_step"] == cpu["global_step"] == 22 and len(nvme["losses"]) == 44
        torch.testing.assert_close(torch.tensor(nvme["losses"]), torch.tensor(cpu["losses"]), rtol=0, atol=1e-5)
        for name, value in cpu["weights"].items():
            torch.testing.assert_close(nvme["weights"][name], value, rtol=0, atol=1e-5)
        # both offloads really on disk, for this rank: the optimizer's swap files and the big weight's partition
        files = nvme["swap_files"]
        assert any(f.startswith(f"zero_stage_3/optimizer/rank{rank}/") and f.endswith(".swp") for f in files), files
        assert any(f.startswith(f"zero_stage_3/float32params/rank{rank}/") and f.endswith(".swp") for f in files), files
        # the resumed run (launched from the YAML, a new swap folder) continues with the uninterrupted run's losses:
        # Adam's moments and step counts came back (DeepSpeed 0.19.8 alone restarts them: lr x sign(grad))
        again = resumed[rank]["resumed"]
        assert again["global_step"] == 22 and 0 < len(again["losses"]) < 44
        torch.testing.assert_close(torch.tensor(again["losses"]), torch.tensor(nvme["losses"][-len(again["losses"]):]),
                                   rtol=0, atol=1e-5)
        for name, value in nvme["weights"].items():
            torch.testing.assert_close(again["weights"][name], value, rtol=0, atol=1e-5)
        assert any(f.startswith(f"zero_stage_3/optimizer/rank{rank}/") for f in again["swap_files"])
        # the Accelerator under the same launch config: disk offload, with the losses of CPU offload
        accelerated = resumed[rank]["accelerator"]
        assert f"to disk ({root / 'swap2'})" in accelerated["nvme"]["strategy"], accelerated["nvme"]["strategy"]
        assert "to disk" not in accelerated["cpu"]["strategy"] and len(accelerated["nvme"]["losses"]) == 4
        torch.testing.assert_close(torch.tensor(accelerated["nvme"]["losses"]),
                                   torch.tensor(accelerated["cpu"]["losses"]), rtol=0, atol=1e-5)
    assert "resumed from" in stdout and "global step 14" in stdout

    # `tasktrain convert` reads a disk-offload checkpoint directory (no swap folder needed): the trained weights
    out = tmp_path / "model.ckpt"
    [(code, stdout, stderr)] = cli_commands_here([["convert", root / "nvme" / "checkpoints" / "last.ckpt", out]])
    assert code == 0, stdout + stderr
    state = torch.load(out, weights_only=True)["state_dict"]
    assert set(state) == set(first[0]["nvme"]["weights"])
    for name, value in state.items():
        torch.testing.assert_close(value, first[0]["nvme"]["weights"][name], rtol=0, atol=1e-6)
