"""Accelerate's gradient accumulation and scheduler rules, and the Accelerator options of issue 26 that were refused
before: GradientAccumulationPlugin(adjust_scheduler=False, sync_with_dataloader=False), write_basic_config read by
`tasktrain launch`, dynamo_backend / TorchDynamoPlugin, device_placement=False.

The rules (tests/accelerator_scripts/rules_worker.py): every loss / num_steps (a short last window too), the
scheduler stepped once per process at each optimizer step (OneCycleLR not past total_steps), windows ending at the
loader's end unless sync_with_dataloader=False. Checked against a hand loop on 1 and 2 real processes, and the hand
loop against Accelerate 1.15 itself (the worker run with `accelerate` imports).
"""
import json
import os
import signal
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from test_accelerator import SCRIPTS, clean_env, launch
from test_launch import free_port

WORKER = os.path.join(SCRIPTS, "rules_worker.py")
CASES = ["lambda", "lambda_no_adjust", "onecycle", "onecycle_no_adjust", "no_sync_with_dataloader",
         "scheduler_every_call", "compiled"]


def run_worker(tmp_path, framework):
    run = subprocess.run([sys.executable, WORKER, str(tmp_path), framework], cwd=tmp_path, env=clean_env(tmp_path),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads((tmp_path / f"{framework}_rank0.json").read_text())


def check_against_the_hand_loop(result, world, tolerance, ours=True):
    assert sorted(result) == sorted(CASES)
    for name, case in result.items():
        assert case["world"] == world
        assert case["syncs"] == case["hand_syncs"], name
        assert case["lrs"] == pytest.approx(case["hand_lrs"], rel=1e-12, abs=0), name
        assert case["difference"] <= tolerance, (name, case["difference"])
    # adjust_scheduler=False acts as True does (Accelerate 1.15: the flag reaches its GradientState only when it
    # differs from the default, and a missing flag reads False)
    assert result["lambda"]["lrs"] == result["lambda_no_adjust"]["lrs"]
    assert result["onecycle"]["lrs"] == result["onecycle_no_adjust"]["lrs"]
    assert result["compiled"]["compiled"]
    # ours unwraps to the module given to prepare; Accelerate's unwrap_model keeps the compile wrapper by default
    # (keep_torch_compile=True)
    assert result["compiled"]["unwrapped_type"] == ("Linear" if ours else "OptimizedModule")
    assert not result["lambda"]["compiled"]


@pytest.mark.timeout(700)
@pytest.mark.world_size(1)
def test_rules_match_the_hand_loop_and_accelerate_on_one_process(tmp_path):
    mine = run_worker(tmp_path, "tasktrain")
    check_against_the_hand_loop(mine, world=1, tolerance=0.0)  # the same operations in the same order
    lam = mine["lambda"]
    # 10 batches of 3 a window: windows 3 3 3 1 each epoch, the last one short (its loss / 3, not / 1)
    assert lam["syncs"] == [False, False, True, False, False, True, False, False, True, True] * 2
    assert lam["lrs"][2] == pytest.approx(0.1 / 2)  # one scheduler step per optimizer step on one process
    # windows across epochs: 20 micro-batches, a step every third
    assert mine["no_sync_with_dataloader"]["syncs"] == [(i + 1) % 3 == 0 for i in range(20)]
    assert mine["scheduler_every_call"]["lrs"][:3] == pytest.approx([0.1 / 2, 0.1 / 3, 0.1 / 4])
    # Accelerate itself, the same script with its imports: the same windows and learning rates, and its weights
    # equal the same hand loop (exactly, as ours do)
    theirs = run_worker(tmp_path, "accelerate")
    check_against_the_hand_loop(theirs, world=1, tolerance=0.0, ours=False)
    for name in CASES:
        assert theirs[name]["syncs"] == mine[name]["syncs"] and theirs[name]["lrs"] == mine[name]["lrs"], name


@pytest.mark.timeout(750)
@pytest.mark.world_size(2)
def test_rules_match_the_hand_loop_on_two_processes(tmp_path):
    launch(["--num_processes", "2", "--use_cpu", WORKER, str(tmp_path), "tasktrain"], tmp_path, timeout=360)
    ranks = [json.loads((tmp_path / f"tasktrain_rank{r}.json").read_text()) for r in range(2)]
    for result in ranks:
        check_against_the_hand_loop(result, world=2, tolerance=1e-6)  # DDP's all-reduce sums in its own order
    lam = ranks[0]["lambda"]
    # 5 batches a process: windows 3 2; each optimizer step steps the scheduler twice (once per process)
    assert lam["syncs"] == [False, False, True, False, True] * 2
    assert lam["lrs"][2] == pytest.approx(0.1 / 3) and lam["lrs"][4] == pytest.approx(0.1 / 5)
    # OneCycleLR(total_steps=6): 4 optimizer steps would step it 8 times (torch raises past its end); it stops at
    # its end: the third optimizer step takes it there, the fourth leaves it
    assert len(set(ranks[0]["onecycle"]["lrs"][-3:])) == 1
    # Accelerate itself on 2 CPU processes (torchrun, gloo): the same windows and learning rates on each rank, and
    # its weights follow the same hand loop
    env = {**clean_env(tmp_path), "ACCELERATE_USE_CPU": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                             "--master_addr", "127.0.0.1", "--master_port", str(free_port()), WORKER, str(tmp_path),
                             "accelerate"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output = proc.communicate(timeout=300)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate()[0]
        pytest.fail(f"Accelerate's run did not finish within 300 s:\n{output[-3000:]}")
    assert proc.returncode == 0, output[-4000:]
    for r in range(2):
        theirs = json.loads((tmp_path / f"accelerate_rank{r}.json").read_text())
        check_against_the_hand_loop(theirs, world=2, tolerance=1e-6, ours=False)
        for name in CASES:
            assert theirs[name]["syncs"] == ranks[r][name]["syncs"], name
            assert theirs[name]["lrs"] == pytest.approx(ranks[r][name]["lrs"], rel=1e-12, abs=0), name


def test_the_core_defaults_stay_its_own_rules():
    """The core Accelerator keeps its own rules unless told (a short window / its own length, one scheduler step
    per optimizer step); window_loss="steps" is Accelerate's (and the Trainer's), and differs on a short window."""
    from tasktrain.trainer.accelerator import Accelerator as Core

    def train(**options):
        accelerator = Core(gradient_accumulation_steps=3, **options)
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(0)
        data = DataLoader(TensorDataset(torch.randn(16, 4, generator=g)), batch_size=4)  # windows 3 1
        model, optimizer, data = accelerator.prepare(model, optimizer, data)
        for (x,) in data:
            with accelerator.accumulate(model):
                accelerator.backward(model(x).pow(2).mean())
                optimizer.step()
                optimizer.zero_grad()
        return model.weight.detach().clone()

    own, steps = train(), train(window_loss="steps")
    assert not torch.allclose(own, steps)
    with pytest.raises(ValueError, match="window_loss"):
        Core(window_loss="mean")


@pytest.mark.timeout(200)
@pytest.mark.world_size(1)
def test_write_basic_config_writes_the_file_launch_reads(tmp_path, monkeypatch):
    from test_launch import WORKER as ENV_WORKER
    from test_launch import results, run_cli

    from tasktrain.cli import config as cfg
    from tasktrain.utils import write_basic_config

    monkeypatch.setenv("TASKTRAIN_CONFIG_DIR", str(tmp_path / "config_dir"))  # the folder clean_env gives launch
    path = write_basic_config(mixed_precision="bf16")
    assert path == cfg.default_config_path() and os.path.isfile(path)
    values = cfg.read_config_file(path)
    assert values["mixed_precision"] == "bf16" and values["compute_environment"] == "LOCAL_MACHINE"
    assert values["num_processes"] == max(1, torch.cuda.device_count())
    # never overwritten, as Accelerate's
    assert write_basic_config(mixed_precision="fp16") is False
    assert cfg.read_config_file(path)["mixed_precision"] == "bf16"
    with pytest.raises(ValueError, match="mixed_precision"):
        write_basic_config(mixed_precision="fp8", save_location=tmp_path / "other.yaml")
    assert write_basic_config(save_location=tmp_path / "elsewhere" / "c.yaml") == str(tmp_path / "elsewhere" / "c.yaml")
    # `tasktrain launch` without --config_file reads it
    code, output = run_cli([ENV_WORKER, str(tmp_path), "env"], tmp_path)
    assert code == 0, output
    assert f"{path}   [default location]" in output
    (seen,) = results(tmp_path, 1)
    assert seen["env"]["TASKTRAIN_PRECISION"] == "bf16-mixed"


def small_run(accelerator, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    original = model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(4 * steps, 4, generator=g)), batch_size=4)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    for (x,) in data:
        accelerator.backward(model(x).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    return model, original


def test_dynamo_backend_compiles_prepared_models(tmp_path, monkeypatch):
    from tasktrain import Accelerator
    from tasktrain.utils import TorchDynamoPlugin

    plain, _ = small_run(Accelerator())
    seen = []
    real_compile = torch.compile

    def recording_compile(model, **kwargs):
        seen.append(kwargs)
        return real_compile(model, **kwargs)

    monkeypatch.setattr(torch, "compile", recording_compile)
    accelerator = Accelerator(dynamo_backend="eager")
    compiled, original = small_run(accelerator)
    assert seen == [{"backend": "eager"}] and isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
    assert accelerator.unwrap_model(compiled) is original
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), compiled.parameters()))
    assert set(accelerator.get_state_dict(compiled)) == set(plain.state_dict())  # no "_orig_mod."
    accelerator.save_state(tmp_path / "state")  # plain names in the checkpoint; it loads back
    accelerator.load_state(tmp_path / "state")

    seen.clear()
    plugin = TorchDynamoPlugin(backend="aot_eager", fullgraph=True, dynamic=False)
    small_run(Accelerator(dynamo_plugin=plugin), steps=1)
    assert seen == [{"backend": "aot_eager", "fullgraph": True, "dynamic": False}]
    seen.clear()
    model, _ = small_run(Accelerator(dynamo_backend="no"), steps=1)
    assert seen == [] and not hasattr(model, "_orig_mod")
    with pytest.raises(ValueError, match="not both"):
        Accelerator(dynamo_backend="eager", dynamo_plugin=plugin)
    with pytest.raises(ValueError, match="use_regional_compilation"):
        Accelerator(dynamo_plugin=TorchDynamoPlugin(backend="inductor", use_regional_compilation=True))
    with pytest.raises(ValueError, match="backend"):
        TorchDynamoPlugin(backend="turbo")


class Probe:
    """A batch that records every move a loader or the Accelerator asks of it."""

    moves = []

    def __init__(self, x):
        self.x = x

    def to(self, *args, **kwargs):
        Probe.moves.append(args or kwargs)
        return self


class PlacedModule(torch.nn.Linear):
    """A module that records every .to() call (a placement)."""

    def to(self, *args, **kwargs):
        self.moved = getattr(self, "moved", 0) + 1
        return super().to(*args, **kwargs)


@pytest.mark.parametrize("placement", [True, False])
def test_device_placement_false_leaves_models_and_batches_where_they_are(placement):
    from tasktrain import Accelerator

    accelerator = Accelerator(device_placement=placement)
    assert accelerator.device_placement is placement
    model = PlacedModule(4, 1)
    data = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4, collate_fn=lambda rows: Probe(
        torch.stack([r[0] for r in rows])))
    Probe.moves = []
    model, data = accelerator.prepare(model, data)
    batches = list(data)
    assert len(batches) == 2 and all(isinstance(b, Probe) for b in batches)
    if placement:  # the probes can tell: with placement on, the model and each batch are moved
        assert getattr(model, "moved", 0) >= 1 and len(Probe.moves) == 2
    else:
        assert getattr(model, "moved", 0) == 0 and Probe.moves == []
    model(batches[0].x).sum().backward()  # the model trains where the script put it
    assert model.weight.grad is not None


def test_device_placement_must_be_a_bool():
    from tasktrain import Accelerator

    with pytest.raises(TypeError, match="device_placement"):
        Accelerator(device_placement="no")


def test_dataloader_config_is_assignable_and_acts_on_the_next_loaders():
    """As Accelerate's scripts do (test_distributed_data_loop's stateful tests): a DataLoaderConfiguration assigned
    to accelerator.dataloader_config applies to the loaders prepared after it; the data seed only before the first."""
    import warnings

    from torch.utils.data import IterableDataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    from tasktrain import Accelerator
    from tasktrain.utils import DataLoaderConfiguration

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(torch.arange(6.0))

    accelerator = Accelerator()
    assert accelerator.dataloader_config.use_stateful_dataloader is False
    accelerator.dataloader_config = DataLoaderConfiguration(use_stateful_dataloader=True, even_batches=False)
    assert accelerator.even_batches is False and accelerator.use_stateful_dataloader
    stream = accelerator.prepare(DataLoader(Stream(), batch_size=2))
    assert isinstance(stream.base_dataloader, StatefulDataLoader)
    assert [b.tolist() for b in stream] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    with pytest.raises(ValueError, match="data seed"):
        accelerator.dataloader_config = DataLoaderConfiguration(data_seed=3)
    with pytest.raises(TypeError, match="DataLoaderConfiguration"):
        accelerator.dataloader_config = {"split_batches": True}

    # join_uneven_inputs(even_batches=...) over a loader that is not map-style: Accelerate's warning, no error
    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    accelerator.prepare(DataLoader(Stream(), batch_size=2))  # dispatched (an IterableDataset)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([model], even_batches=False):
            pass
    assert any("only supported for map-style datasets" in str(w.message) for w in caught)
