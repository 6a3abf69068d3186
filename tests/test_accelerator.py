"""Accelerator: the custom-loop API over the Trainer's Strategy and Precision.

One-process tests run in this process; the two-process DDP run goes through the real `tasktrain launch` in a
subprocess (tests/accelerator_scripts/ddp_worker.py writes what it measured, the test asserts on it).
"""
import copy
import os
import signal
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from accelerator_scripts.common import MyModel, Wrapped, accelerator_loop, make_dataset, max_difference, trainer_run
from tasktrain import Accelerator, Trainer, seed_everything
from tasktrain.checkpoint_io import load_checkpoint_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPTS = os.path.join(HERE, "accelerator_scripts")
FP32_TOLERANCE = 1e-6


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One torch thread for this file's in-process runs: `make test` runs two pytest workers on the 2-core
    machine, and a second torch thread per worker mostly waits for the other worker (measured, the one-process
    tests: 9.6 -> 6.0 CPU-s, pytest's start included). Their comparisons are within this process: the thread
    count changes none of them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def clean_env(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TASKTRAIN_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                "GROUP_RANK"))}
    env["TASKTRAIN_CONFIG_DIR"] = str(tmp_path / "config_dir")  # never the developer's default launch config
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def launch(args, tmp_path, timeout):
    """`tasktrain launch ARGS` in its own session; killed with its workers if it overruns."""
    proc = subprocess.Popen([sys.executable, "-m", "tasktrain.cli.main", "launch", *args], cwd=tmp_path,
                            env=clean_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate()[0]
        pytest.fail(f"tasktrain launch did not finish within {timeout} s:\n{output[-4000:]}")
    assert proc.returncode == 0, output[-6000:]
    return output


# -- one process ------------------------------------------------------------------------------------------------------
def test_snippet_matches_the_trainer_on_one_process(tmp_path):
    reference = trainer_run()
    seed_everything(0)
    accelerator = Accelerator()
    assert accelerator.strategy.name == "single_device" and accelerator.num_processes == 1
    assert accelerator.is_main_process and accelerator.is_local_main_process and accelerator.process_index == 0
    mine = accelerator_loop(accelerator)
    assert max_difference(reference, mine) <= FP32_TOLERANCE
    accelerator.save(mine, "model.pt")
    assert max_difference(torch.load("model.pt", weights_only=True), mine) == 0.0
    assert not [f for f in os.listdir(tmp_path) if ".tmp-" in f]  # atomic: no temporary file left


def test_accumulate_matches_the_trainer_including_a_short_last_window():
    # 100 samples / 32 = 4 batches; with 3 micro-batches per step the second window is cut short to 1.
    from tasktrain.trainer.accelerator import Accelerator as CoreAccelerator

    reference = trainer_run(accumulate=3)
    seed_everything(0)
    # tasktrain.Accelerator follows Accelerate's rule (every loss / 3, tests/test_accelerate_options.py), which is the
    # Trainer's (Lightning's closure divides the short window's losses by accumulate_grad_batches too)
    mine = accelerator_loop(Accelerator(gradient_accumulation_steps=3), accumulate=True)
    assert max_difference(reference, mine) <= FP32_TOLERANCE
    # the core Accelerator's default divides the short window's loss by its own length: the same windows, another
    # last step
    seed_everything(0)
    own_rule = accelerator_loop(CoreAccelerator(gradient_accumulation_steps=3), accumulate=True)
    assert max_difference(reference, own_rule) > 1e-4


def test_accumulate_steps_only_at_window_ends_and_zero_grad_keeps_the_window():
    def run(zero_first):
        seed_everything(0)
        accelerator = Accelerator(gradient_accumulation_steps=2)
        model = MyModel(dropout=0.0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = DataLoader(make_dataset(40), batch_size=8)  # 5 batches: windows [0, 1], [2, 3], [4]
        model, optimizer, data = accelerator.prepare(model, optimizer, data)
        syncs, steps = [], []
        for source, targets in data:
            with accelerator.accumulate(model):
                if zero_first:
                    optimizer.zero_grad()
                before = [p.detach().clone() for p in model.parameters()]
                accelerator.backward(F.cross_entropy(model(source), targets))
                optimizer.step()
                if not zero_first:
                    optimizer.zero_grad()
                syncs.append(accelerator.sync_gradients)
                steps.append(any(not torch.equal(b, p) for b, p in zip(before, model.parameters())))
        return syncs, steps, {k: v.clone() for k, v in model.state_dict().items()}

    syncs, steps, after_zero_last = run(zero_first=False)
    assert syncs == [False, True, False, True, True]
    assert steps == syncs  # parameters change exactly where a window ends
    _, _, after_zero_first = run(zero_first=True)
    assert max_difference(after_zero_last, after_zero_first) == 0.0  # zero_grad's place in the loop does not matter


def test_accumulate_over_a_loader_without_length_ends_the_window_at_its_last_batch():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter([(torch.randn(8), torch.tensor(1)) for _ in range(10)])

    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, optimizer, data = accelerator.prepare(MyModel(), torch.optim.SGD(MyModel().parameters(), lr=0.1),
                                                 DataLoader(Stream(), batch_size=2))  # 5 batches, no len()
    syncs = []
    for source, targets in data:
        with accelerator.accumulate(model):
            accelerator.backward(F.cross_entropy(model(source), targets))
            syncs.append(accelerator.sync_gradients)
    assert syncs == [False, False, False, True, True]


def test_save_state_inside_an_accumulation_window_warns(tmp_path):
    accelerator = Accelerator(gradient_accumulation_steps=2)
    model, optimizer = accelerator.prepare(torch.nn.Linear(2, 1), torch.optim.SGD([torch.nn.Parameter(torch.ones(1))],
                                                                                   lr=0.1))
    with accelerator.accumulate(model):
        accelerator.backward(model(torch.ones(1, 2)).sum())
        optimizer.step()
    with pytest.warns(UserWarning, match="inside a gradient accumulation window"):
        accelerator.save_state(tmp_path / "state")


def test_save_state_load_state_resumes_bitwise(tmp_path):
    """Stop mid-epoch after a step, save, rebuild everything in a fresh Accelerator, load, finish: bitwise equal."""

    class Counter:
        def __init__(self):
            self.count = 0

        def state_dict(self):
            return {"count": self.count}

        def load_state_dict(self, state):
            self.count = state["count"]

    def build():
        accelerator = Accelerator(gradient_accumulation_steps=2)
        torch.manual_seed(7)
        model = MyModel(dropout=0.2)  # dropout draws from the global RNG: its state must be restored too
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
        data = DataLoader(make_dataset(72), batch_size=8, shuffle=True)  # 9 batches per epoch
        counter = Counter()
        accelerator.register_for_checkpointing(counter)
        return (accelerator, counter, *accelerator.prepare(model, optimizer, data, scheduler))

    def train(accelerator, counter, model, optimizer, data, scheduler, stop_at=None):
        for epoch in range(data.epoch, 3):
            for source, targets in data:
                with accelerator.accumulate(model):
                    accelerator.backward(F.cross_entropy(model(source), targets))
                    accelerator.clip_grad_norm_(model.parameters(), 0.5)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
                counter.count += 1
                if counter.count == stop_at:
                    accelerator.save_state(tmp_path / "state")
                    return None
        return {k: v.clone() for k, v in accelerator.get_state_dict(model).items()}, optimizer.state_dict(), \
            scheduler.get_last_lr(), counter.count

    seed_everything(11)
    straight = train(*build())
    seed_everything(11)
    assert train(*build(), stop_at=13) is None  # epoch 1, 4th batch of 9: right after an optimizer step
    seed_everything(99)
    torch.rand(5)  # a different data seed and RNG position: load_state must restore both
    objects = build()
    objects[0].load_state(tmp_path / "state")
    assert objects[4].epoch == 1 and objects[1].count == 13
    resumed = train(*objects)
    assert max_difference(straight[0], resumed[0]) == 0.0
    assert straight[2] == resumed[2] and straight[3] == resumed[3] == 27
    for a, b in zip(straight[1]["state"].values(), resumed[1]["state"].values()):
        assert all(torch.equal(a[k], b[k]) for k in a)
    # What is on disk is plain data: it loads with weights_only=True.
    assert "rng_states" in load_checkpoint_file(str(tmp_path / "state" / "accelerator_state.pt"))


def test_bf16_forward_runs_under_autocast_and_returns_float32():
    accelerator = Accelerator(mixed_precision="bf16")
    assert accelerator.mixed_precision == "bf16"
    seen = {}

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def forward(self, x):
            out = self.layer(x)
            seen["dtype"] = out.dtype
            return out

    model = accelerator.prepare(Probe())
    out = model(torch.randn(3, 4))
    assert seen["dtype"] == torch.bfloat16 and out.dtype == torch.float32
    assert model.layer.weight.dtype == torch.float32
    with accelerator.autocast():
        assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.bfloat16
    # A deep copy (an EMA model, say) runs its own weights under the same autocast.
    twin = copy.deepcopy(model)
    torch.nn.init.zeros_(twin.layer.weight)
    torch.nn.init.zeros_(twin.layer.bias)
    assert torch.count_nonzero(twin(torch.randn(3, 4))) == 0 and seen["dtype"] == torch.bfloat16
    plain = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    plain(torch.randn(3, 4))
    assert seen["dtype"] == torch.float32 and "forward" not in plain.__dict__


def test_fp16_skipped_step_is_counted_and_the_scheduler_waits():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the "fp16 is slow on CPU" advice
        accelerator = Accelerator(mixed_precision="fp16")
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    x = torch.randn(8, 4)

    before = model.weight.detach().clone()
    accelerator.backward(model(x).sum() * float("inf"))  # inf gradients: GradScaler must skip this step
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    assert accelerator.optimizer_step_was_skipped and accelerator.strategy.precision.skipped_steps == 1
    assert torch.equal(model.weight, before) and scheduler.get_last_lr() == [0.1]

    accelerator.backward(model(x).pow(2).mean())
    expected = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]) / \
        accelerator.strategy.precision.scaler.get_scale()
    norm = accelerator.clip_grad_norm_(model.parameters(), 1e-3)  # unscaled first: the true norm is reported
    assert torch.allclose(norm, expected, rtol=1e-3)
    assert float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])) <= 1e-3 * 1.01
    optimizer.step()
    scheduler.step()
    assert not accelerator.optimizer_step_was_skipped and scheduler.get_last_lr() == [0.05]
    assert not torch.equal(model.weight, before)


def test_launch_config_fills_what_the_script_leaves_out(monkeypatch):
    monkeypatch.setenv("TASKTRAIN_LAUNCH", "1")
    monkeypatch.setenv("TASKTRAIN_STRATEGY", "single_device")
    monkeypatch.setenv("TASKTRAIN_PRECISION", "bf16-mixed")
    monkeypatch.setenv("TASKTRAIN_GRADIENT_ACCUMULATION_STEPS", "4")
    accelerator = Accelerator()
    assert (accelerator.mixed_precision, accelerator.gradient_accumulation_steps) == ("bf16", 4)
    with pytest.warns(UserWarning, match="overrides mixed_precision='bf16-mixed'"):
        accelerator = Accelerator(mixed_precision="no")
    assert accelerator.mixed_precision == "no"


def test_skip_first_batches_prepared_and_plain():
    accelerator = Accelerator()
    dataset = TensorDataset(torch.arange(40))
    seed_everything(0)
    shuffled = lambda: DataLoader(dataset, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3))  # noqa: E731
    data = accelerator.prepare(shuffled())
    full = [b[0].tolist() for b in shuffled()]  # epoch 0 of the plain loader: the prepared one's on one process
    skipped = accelerator.skip_first_batches(data, 3)
    assert len(skipped) == 7  # that iteration's length
    assert [b[0].tolist() for b in skipped] == full[3:]
    assert data.epoch == 1 and len(data) == 10 and len([b for b in data]) == 10  # the skip applied once
    plain = DataLoader(dataset, batch_size=4)
    assert [b[0].tolist() for b in accelerator.skip_first_batches(plain, 8)] == [list(range(32, 36)),
                                                                                   list(range(36, 40))]


def test_single_process_collectives_are_identities():
    accelerator = Accelerator()
    x = torch.arange(6.0).reshape(3, 2)
    assert torch.equal(accelerator.gather(x), x) and torch.equal(accelerator.gather_for_metrics(x), x)
    assert torch.equal(accelerator.reduce(x), x)
    accelerator.wait_for_everyone()
    with accelerator.main_process_first():
        pass


def test_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="gradient_accumulation_steps=0"):
        Accelerator(gradient_accumulation_steps=0)
    with pytest.raises(ValueError, match="Precision 'fp8' is invalid"):
        Accelerator(mixed_precision="fp8")
    with pytest.raises(ValueError, match="strategy 'dp' wraps modules for the Trainer only"):
        Accelerator(strategy="dp")
    accelerator = Accelerator()
    with pytest.raises(TypeError, match="prepare got a str"):
        accelerator.prepare("model.pt")
    with pytest.raises(FileNotFoundError, match="save_state"):
        accelerator.load_state(tmp_path / "nowhere")
    model, optimizer = accelerator.prepare(torch.nn.Linear(2, 2), torch.optim.SGD([torch.nn.Parameter(torch.ones(1))],
                                                                                   lr=0.1))
    accelerator.save_state(tmp_path / "state", layout="tasktrain")
    accelerator.save_state(tmp_path / "accelerate_state")  # Accelerate's files (the default, issue 41)
    other = Accelerator()
    other.prepare(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="holds 1 optimizers but this Accelerator has 0"):
        other.load_state(tmp_path / "state")
    with pytest.raises(ValueError, match="optimizer.bin exists: the folder holds more optimizers"):
        other.load_state(tmp_path / "accelerate_state")
    for var, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match="started 2 processes, but strategy 'single_device'"):
        Accelerator(strategy="single_device")


# -- two processes --------------------------------------------------------------------------------------------------
@pytest.mark.world_size(2)
@pytest.mark.timeout(240)
def test_ddp_two_processes_under_tasktrain_launch(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    launch(["--num_processes", "2", os.path.join(SCRIPTS, "ddp_worker.py"), str(out)], tmp_path, timeout=200)
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for rank, result in enumerate(ranks):
        assert (result["strategy"], result["world_size"], result["rank"]) == ("ddp", 2, rank)
        # The snippet and its accumulate() form give the Trainer's parameters on the same model, data and seed.
        assert result["plain_vs_trainer"] <= FP32_TOLERANCE
        assert result["accumulate_vs_trainer"] <= FP32_TOLERANCE
        # no_sync on micro-batches that do not step: ranks keep their own gradients there, and agree at the step.
        assert result["grads_equal_per_micro_batch"] == [False, True, False, True]
        # 37 samples, 8 per batch on 2 ranks (Accelerate's order): 5 batches, the last (5 samples) completed and a
        # sixth refilled from the epoch's start, 48 in all: gather keeps the 11 repeats, gather_for_metrics drops them.
        assert result["metrics_shuffle=False"] == list(range(37))
        assert sorted(result["metrics_shuffle=True"]) == list(range(37))
        assert result["metrics_shuffle=True"] != list(range(37))
        assert result["gather_count_shuffle=False"] == result["gather_count_shuffle=True"] == 48
        assert result["reduce_sum"] == 3.0
        assert result["resume_epoch"] == 1 and result["resume_difference"] == 0.0
    assert max_difference(ranks[0]["plain"], ranks[1]["plain"]) == 0.0  # DDP kept the replicas identical
    saved = torch.load(out / "model.pt", weights_only=True)  # written by the main process only
    assert max_difference(saved, ranks[0]["plain"]) == 0.0


@pytest.mark.world_size(2)
@pytest.mark.timeout(240)
def test_deepspeed_stage_2_two_processes_under_a_deepspeed_launch_config(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    # Accelerate's DeepSpeed keys, as `accelerate config` writes them: the script itself is unchanged.
    (tmp_path / "ds.yaml").write_text("distributed_type: DEEPSPEED\nnum_processes: 2\nuse_cpu: true\n"
                                      "deepspeed_config:\n  zero_stage: 2\n  gradient_clipping: 1.0\n")
    launch(["--config_file", str(tmp_path / "ds.yaml"), os.path.join(SCRIPTS, "deepspeed_worker.py"), str(out)],
           tmp_path, timeout=200)
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for result in ranks:
        assert "deepspeed (ZeRO stage 2), world_size=2" in result["strategy"]
        assert result["engine"] == "MyModel in DeepSpeedEngine"  # prepare returned the engine around the model
        # Same engine, same model, data and seed: the Accelerator's loop and the Trainer agree, with accumulate()
        # too (its window cut short by the end of the loader, which the engine is told).
        assert result["plain_vs_trainer"] <= FP32_TOLERANCE
        assert result["accumulate_vs_trainer"] <= FP32_TOLERANCE
        assert "ZeRO-3 placeholders" in result["placeholder_error"] and "get_state_dict" in result["placeholder_error"]
        assert result["zero3_shapes"] == {"net.0.weight": [16, 8], "net.0.bias": [16], "net.3.weight": [3, 16],
                                          "net.3.bias": [3]}
        assert result["resume_epoch"] == 1 and result["resume_difference"] == 0.0
    assert max_difference(ranks[0]["plain"], ranks[1]["plain"]) == 0.0
    assert max_difference(torch.load(out / "model.pt", weights_only=True), ranks[0]["plain"]) == 0.0
    assert not (out / "placeholders.pt").exists()
    assert list(torch.load(out / "zero3.pt", weights_only=True)["net.0.weight"].shape) == [16, 8]
