"""ThroughputMonitor's FLOPs (counted once by FlopCounterMode), MFU and step split, against hand counts on CPU."""
import csv
import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import CSVLogger, ModelCheckpoint, TaskModule, ThroughputMonitor, Trainer
from tasktrain.callbacks import throughput_monitor as tm

IN, HIDDEN, OUT, BATCH = 4, 16, 2, 8


class TwoLayers(TaskModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = torch.nn.Linear(IN, HIDDEN), torch.nn.Linear(HIDDEN, OUT)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.second(torch.relu(self.first(x))), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.second(torch.relu(self.first(x))), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def data(n, batch_size=BATCH, collate_fn=None):
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, IN, generator=g), torch.randn(n, OUT, generator=g)),
                      batch_size=batch_size, collate_fn=collate_fn)


def rows(logger, key):
    with open(logger.metrics_file_path) as f:
        return [r for r in csv.DictReader(f) if r.get(key)]


def test_flops_are_counted_once_and_match_a_hand_count(tmp_path):
    # By hand: a product of (B x i) by (i x o) is 2*B*i*o FLOPs. Forward: both layers. Backward: the second layer's
    # input and weight gradients (2 products), the first layer's weight gradient only (its input needs none).
    forward = 2 * BATCH * IN * HIDDEN + 2 * BATCH * HIDDEN * OUT
    train = forward + 2 * BATCH * IN * HIDDEN + 2 * 2 * BATCH * HIDDEN * OUT
    logger = CSVLogger(tmp_path)
    monitor = ThroughputMonitor(batch_size_fn=lambda b: b[0].shape[0], window_size=2, peak_flops=1e9,
                                measure_flops=True)
    trainer = Trainer(max_epochs=1, callbacks=[monitor], logger=logger, log_every_n_steps=2, enable_progress_bar=False,
                      enable_checkpointing=False, num_sanity_val_steps=0)
    trainer.fit(TwoLayers(), data(48), data(16, batch_size=4))
    assert monitor.flops_per_batch == {"train": train, "validate": 2 * 4 * IN * HIDDEN + 2 * 4 * HIDDEN * OUT}
    written = rows(logger, "train/device/flops_per_sec")
    assert len(written) == 3
    for r in written:
        rate = float(r["train/device/batches_per_sec"])
        assert float(r["train/device/flops_per_sec"]) == pytest.approx(train * rate)
        assert float(r["train/device/mfu"]) == pytest.approx(train * rate / 1e9)  # the peak passed


def test_the_modules_flops_per_batch_wins_and_no_peak_means_no_mfu_on_cpu(tmp_path):
    logger = CSVLogger(tmp_path)
    module = TwoLayers()
    module.flops_per_batch = 1000
    monitor = ThroughputMonitor(batch_size_fn=lambda b: b[0].shape[0], window_size=2)
    Trainer(max_epochs=1, callbacks=[monitor], logger=logger, log_every_n_steps=2, enable_progress_bar=False,
            enable_checkpointing=False).fit(module, data(32))
    assert monitor.flops_per_batch == {} and monitor.device_peak_flops is None
    written = rows(logger, "train/device/flops_per_sec")
    assert written and all(not r.get("train/device/mfu") for r in written)
    for r in written:
        assert float(r["train/device/flops_per_sec"]) == pytest.approx(1000 * float(r["train/device/batches_per_sec"]))


def test_peak_table_by_device_name_and_precision(monkeypatch):
    names = {"NVIDIA H100 80GB HBM3": 989.4, "NVIDIA H100 PCIe": 756.5, "NVIDIA H100 NVL": 835.5, "NVIDIA H200": 989.4,
             "NVIDIA A100-SXM4-80GB": 312.0, "NVIDIA A100-PCIE-40GB": 312.0, "NVIDIA A10G": 70.0, "NVIDIA L4": 121.0,
             "NVIDIA GeForce RTX 4090": 165.2, "NVIDIA L40S": 362.1}
    for name, bf16 in names.items():
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        assert tm.device_peak_flops("cuda:0", "bf16-mixed") == pytest.approx(bf16 * 1e12), name
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-16GB")
    assert tm.device_peak_flops("cuda:0", "16-mixed") == pytest.approx(125e12)
    assert tm.device_peak_flops("cuda:0", "bf16-mixed") is None  # no bf16 on a V100
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    assert tm.device_peak_flops("cuda:0", "bf16-mixed") is None
    assert tm.device_peak_flops("cpu", "bf16-mixed") is None
    # fp32: plain fp32, or TF32 where torch lets matmuls use it
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    assert tm.device_peak_flops("cuda:0", "32-true") == pytest.approx(19.5e12)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert tm.device_peak_flops("cuda:0", "32-true") == pytest.approx(156e12)
    with pytest.raises(ValueError, match="peak FLOP/s"):
        ThroughputMonitor(batch_size_fn=len, peak_flops=0)


def test_step_split_puts_each_phase_where_its_time_went(tmp_path):
    # Each phase sleeps a different, known time; the split must find each sleep in its own phase.
    sleeps = {"data_wait": 0.04, "forward": 0.08, "backward": 0.12, "optimizer": 0.16}
    checkpoint_sleep = 0.2  # saved at steps 2 and 4

    def collate(items):
        time.sleep(sleeps["data_wait"])
        return [torch.stack(t) for t in zip(*items)]

    class Slow(TwoLayers):
        def training_step(self, batch, batch_idx):
            time.sleep(sleeps["forward"])
            loss = super().training_step(batch, batch_idx)
            loss.register_hook(lambda grad: time.sleep(sleeps["backward"]))
            return loss

        def configure_optimizers(self):
            optimizer = super().configure_optimizers()
            # (a post-hook: the update's own time; a pre-hook runs before the closure that torch's step is given)
            optimizer.register_step_post_hook(lambda *args: time.sleep(sleeps["optimizer"]))
            return optimizer

        def on_save_checkpoint(self, checkpoint):
            time.sleep(checkpoint_sleep)

    monitor = ThroughputMonitor(batch_size_fn=lambda b: b[0].shape[0], window_size=2, step_split=True)
    saving = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    logger = CSVLogger(tmp_path)
    with pytest.warns(UserWarning, match="define a `flops_per_batch` attribute"):
        Trainer(max_steps=4, callbacks=[monitor, saving], logger=logger, log_every_n_steps=4,
                enable_progress_bar=False, enable_model_summary=False).fit(Slow(), data(40, collate_fn=collate))
    split = {k.rsplit("/", 1)[1]: float(v) for k, v in rows(logger, "train/split/rank0/forward")[-1].items()
             if k.startswith("train/split/rank0/")}
    assert set(split) == set(tm.SPLIT_PHASES)
    # The first batch's wait is before the run's first stamp: 3 waits over 4 batches. The save at step 4 comes after
    # the write at step 4 (ModelCheckpoint runs after the other callbacks): it is the next interval's.
    expected = dict(sleeps, data_wait=sleeps["data_wait"] * 3 / 4, checkpoint=checkpoint_sleep / 4, other=0.0)
    for phase, seconds in expected.items():
        assert seconds <= split[phase] + 1e-3 and split[phase] < seconds + 0.035, (phase, split)
    assert monitor.split == pytest.approx(split)  # this rank's, as last written


class FakeClock:
    """The monitor's time.perf_counter: it moves only when the test moves it, so every figure has an exact hand
    count (the phases' lengths are binary fractions: their sums and differences are exact floats)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


def test_tokens_per_second_mfu_and_step_split_equal_a_hand_count(tmp_path, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(tm, "time", clock)
    phases = {"data_wait": 1 / 16, "forward": 1 / 2, "backward": 1 / 4, "optimizer": 1 / 8}
    cycle = sum(phases.values())  # 15/16 s from one batch's end to the next's
    tokens_per_sample = 12

    def collate(items):
        clock.advance(phases["data_wait"])
        return [torch.stack(t) for t in zip(*items)]

    class Clocked(TwoLayers):
        def training_step(self, batch, batch_idx):
            clock.advance(phases["forward"])
            loss = super().training_step(batch, batch_idx)
            loss.register_hook(lambda grad: clock.advance(phases["backward"]))
            return loss

        def configure_optimizers(self):
            optimizer = super().configure_optimizers()
            # (a post-hook: the update's own time; a pre-hook runs before the closure that torch's step is given)
            optimizer.register_step_post_hook(lambda *args: clock.advance(phases["optimizer"]))
            return optimizer

    monitor = ThroughputMonitor(batch_size_fn=lambda b: b[0].shape[0],
                                length_fn=lambda b: tokens_per_sample * b[0].shape[0], window_size=2, peak_flops=1e9,
                                measure_flops=True, step_split=True)
    logger = CSVLogger(tmp_path)
    Trainer(max_steps=4, callbacks=[monitor], logger=logger, log_every_n_steps=2, enable_progress_bar=False,
            enable_checkpointing=False, enable_model_summary=False).fit(Clocked(), data(48, collate_fn=collate))
    written = rows(logger, "train/device/items_per_sec")
    assert [int(r["step"]) for r in written] == [1, 3]  # Lightning's step: batches_that_stepped
    train_flops = monitor.flops_per_batch["train"]
    assert train_flops == (2 * BATCH * IN * HIDDEN + 2 * BATCH * HIDDEN * OUT) * 2 + 2 * BATCH * HIDDEN * OUT
    for r in written:  # by hand: 8 samples of 12 tokens each 15/16 s
        assert float(r["train/device/batches_per_sec"]) == pytest.approx(1 / cycle, rel=1e-12)
        assert float(r["train/device/samples_per_sec"]) == pytest.approx(BATCH / cycle, rel=1e-12)
        assert float(r["train/device/items_per_sec"]) == pytest.approx(102.4, rel=1e-12)  # tokens/s = 96 / (15/16)
        assert float(r["train/device/flops_per_sec"]) == pytest.approx(train_flops / cycle, rel=1e-12)
        assert float(r["train/device/mfu"]) == pytest.approx(train_flops / cycle / 1e9, rel=1e-12)
    # the split, mean seconds per batch of each interval: the run's first batch has no wait before it (its fetch
    # came before the first stamp), so the first interval (batches 1-2) shows half a wait per batch
    first, second = ({k.rsplit("/", 1)[1]: float(v) for k, v in r.items() if k.startswith("train/split/rank0/")}
                     for r in written)
    assert second == dict(phases, checkpoint=0.0, other=0.0)
    assert first == dict(phases, data_wait=phases["data_wait"] / 2, checkpoint=0.0, other=0.0)
