"""Checkpoint safety: atomic writes, weights_only loads, clear errors, ckpt_path="last"."""
import json
import os
import pickle

import pytest
import torch

from helpers import Linear, loader, quiet
from tasktrain import CheckpointError, ModelCheckpoint, Trainer
from tasktrain import checkpoint_io as ckpt_io
from tasktrain.trainer import resume


def trained(tmp_path, **kwargs):
    module = Linear()
    trainer = Trainer(max_epochs=2, default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
                      num_sanity_val_steps=0, **kwargs)
    trainer.fit(module, loader(), loader())
    return trainer, module


def test_checkpoint_holds_every_documented_key(tmp_path):
    trainer, module = trained(tmp_path)
    path = trainer.checkpoint_callback.best_model_path
    ckpt = torch.load(path, weights_only=True)  # plain data only
    # Lightning's top-level keys exactly (no precision state: fp32 has none), tasktrain's own under "loops"
    assert set(ckpt) == {"epoch", "global_step", "pytorch-lightning_version", "state_dict", "loops", "callbacks",
                         "optimizer_states", "lr_schedulers", "hparams_name", "hyper_parameters"}
    assert set(ckpt["loops"]) == {"format_version", "tasktrain_version", "torch_version", "weights_only", "world_size",
                                  "train_state", "optimizer_param_names", "metrics", "rng_states",
                                  # Lightning's loop progress beside them (Lightning's Trainer resumes from it)
                                  "fit_loop", "validate_loop", "test_loop", "predict_loop"}
    assert ckpt["loops"]["format_version"] == 3 and ckpt["loops"]["weights_only"] is False
    assert ckpt["loops"]["train_state"]["global_step"] == ckpt["global_step"] == 8
    assert ckpt["hyper_parameters"] == {"lr": 0.1} and ckpt["hparams_name"] == "kwargs"
    assert ckpt["loops"]["world_size"] == 1
    assert set(ckpt["loops"]["rng_states"][0]) >= {"python", "numpy", "torch"}
    for name, value in module.state_dict().items():
        assert torch.equal(ckpt["state_dict"][name], value)


def test_load_from_checkpoint_rebuilds_from_hparams(tmp_path):
    trainer, module = trained(tmp_path)
    path = trainer.checkpoint_callback.best_model_path
    again = Linear.load_from_checkpoint(path)
    assert again.hparams.lr == 0.1 and torch.equal(again.layer.weight, module.layer.weight)
    assert Linear.load_from_checkpoint(path, lr=0.5).hparams.lr == 0.5


def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path = tmp_path / "evil.ckpt"
    torch.save({"format_version": 1, "state_dict": {}, "payload": Evil()}, path)
    with pytest.raises(CheckpointError, match="could run arbitrary code"):
        ckpt_io.load_checkpoint_file(path)
    with pytest.raises(CheckpointError, match=str(path.name)):
        Trainer(max_epochs=1, **quiet()).fit(Linear(), loader(), ckpt_path=path)
    with pytest.raises(CheckpointError):
        Linear.load_from_checkpoint(path)
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupted_checkpoint_names_the_file(tmp_path, damage):
    trainer, _ = trained(tmp_path)
    path = trainer.checkpoint_callback.best_model_path
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write({"truncate": data[: len(data) // 2], "garbage": os.urandom(2000), "empty": b""}[damage])
    with pytest.raises(CheckpointError, match="truncated or corrupted") as err:
        ckpt_io.load_checkpoint_file(path)
    assert os.path.basename(path) in str(err.value)


def test_a_checkpoint_url_that_fails_names_the_url_and_the_fix(tmp_path, monkeypatch):
    import functools
    import http.server
    import threading

    served, hub = tmp_path / "served", tmp_path / "hub"
    served.mkdir()
    monkeypatch.setenv("TORCH_HOME", str(hub))  # torch.hub's download cache: this test's own
    module = Linear()
    path = served / "run.ckpt"
    Trainer(max_epochs=1, limit_train_batches=1, **quiet()).fit(module, loader())
    module.trainer.save_checkpoint(path)
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)  # (port 0: a free one)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    cached = hub / "hub" / "checkpoints" / "run.ckpt"
    try:
        import urllib.error

        # torch.hub's error under Lightning (urllib's HTTPError), its words naming the URL and the fix
        with pytest.raises(urllib.error.HTTPError, match=r"HTTP Error 404: File not found: checkpoint "
                                                         r"'http://127\.0\.0\.1:\d+/missing\.ckpt' does not exist\. "
                                                         r"Check the URL"):
            Linear.load_from_checkpoint(f"{base}/missing.ckpt")
        assert not (hub / "hub" / "checkpoints" / "missing.ckpt").exists()
        from lightning.pytorch.demos.boring_classes import BoringModel  # Lightning's own: the same error type

        with pytest.raises(urllib.error.HTTPError, match="HTTP Error 404"):
            BoringModel.load_from_checkpoint(f"{base}/missing.ckpt")
        with pytest.raises(CheckpointError, match=r"'http://127\.0\.0\.1:\d+/run\.ckpt', downloaded to .*run\.ckpt"
                                                  r"', cannot be loaded: .*truncated or corrupted.*The downloaded copy "
                                                  r"was removed"):
            Trainer(max_epochs=2, **quiet()).fit(Linear(), loader(), ckpt_path=f"{base}/run.ckpt")
        assert not cached.exists()  # (else every later load would read the damaged copy again)
        path.write_bytes(whole)  # the file at the URL mended: the next load downloads it again and reads it
        again = Linear.load_from_checkpoint(f"{base}/run.ckpt")
        assert torch.equal(again.layer.weight, module.layer.weight) and cached.exists()
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(urllib.error.URLError, match=r"'http://127\.0\.0\.1:\d+/gone\.ckpt' could not be downloaded "
                                                    r"\(.*refused.*Check the network"):
        ckpt_io.load_checkpoint_file(f"{base}/gone.ckpt")  # (the server is down: nothing listens at the port)


def test_incompatible_format_version_says_so(tmp_path):
    path = tmp_path / "future.ckpt"
    torch.save({"format_version": 99, "tasktrain_version": "9.0", "state_dict": {}}, path)
    with pytest.raises(CheckpointError, match="format version 99"):
        ckpt_io.load_checkpoint_file(path)
    # the header where format 3 keeps it, under "loops"
    torch.save({"state_dict": {}, "loops": {"format_version": 99, "tasktrain_version": "9.0"}}, path)
    with pytest.raises(CheckpointError, match=r"format version 99.*reads versions 1, 2, 3.*\(9\.0\)"):
        ckpt_io.load_checkpoint_file(path)


def test_crash_during_save_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "model.ckpt"
    ckpt_io.atomic_save({"v": torch.ones(3)}, path)
    real_save = torch.save

    def crash(obj, f, *a, **k):
        real_save(obj, f, *a, **k)
        f.truncate(10)  # half a file on disk, then the process "dies"
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        ckpt_io.atomic_save({"v": torch.zeros(3)}, path)
    monkeypatch.setattr(torch, "save", real_save)
    assert torch.equal(torch.load(path)["v"], torch.ones(3))
    assert os.listdir(tmp_path) == ["model.ckpt"]  # no temporary left behind


def test_weights_only_checkpoint_loads_but_refuses_to_resume(tmp_path):
    trainer, module = trained(tmp_path, callbacks=[ModelCheckpoint(save_weights_only=True)])
    path = trainer.checkpoint_callback.best_model_path
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["loops"]["weights_only"] is True and "optimizer_states" not in ckpt
    assert set(ckpt) == {"epoch", "global_step", "pytorch-lightning_version", "state_dict", "loops",
                         "hparams_name", "hyper_parameters"}  # Lightning's weights-only keys
    assert torch.equal(Linear.load_from_checkpoint(path).layer.weight, module.layer.weight)
    with pytest.raises(KeyError, match="checkpoint contains only the model"):  # Lightning's error
        Trainer(max_epochs=3, **quiet()).fit(Linear(), loader(), ckpt_path=path)


class TwoOptimizers(Linear):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.steps = 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        return super().training_step(batch, batch_idx)

    def configure_optimizers(self):
        return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.SGD(self.parameters(), lr=0.1)]


def test_a_checkpoint_that_does_not_fit_the_optimizers_raises_before_training(tmp_path):
    # the module's part is restored before configure_optimizers (Lightning's order), the optimizers' after it: the
    # count is checked there, before the first step
    trainer, _ = trained(tmp_path)
    module = TwoOptimizers()
    with pytest.raises(ValueError, match="has 1 optimizer states but configure_optimizers returned 2 optimizers"):
        Trainer(max_epochs=3, **quiet()).fit(module, loader(), ckpt_path=trainer.checkpoint_callback.best_model_path)
    assert module.steps == 0


def test_last_is_the_newest_last_file_as_in_lightning(tmp_path, monkeypatch):
    """ckpt_path="last": the newest (file time) of the ModelCheckpoints' last files, nothing written beside them;
    none: Lightning's warning and a fresh fit; an earlier tasktrain's record of the root dir still resumes."""
    a = ModelCheckpoint(dirpath=tmp_path / "a", save_top_k=-1, save_last=True)
    b = ModelCheckpoint(dirpath=tmp_path / "b", save_top_k=1, save_last=True, every_n_epochs=2)
    trainer, _ = trained(tmp_path, callbacks=[a, b])
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]  # Lightning's folders: checkpoints only
    assert torch.load(tmp_path / "b" / "last.ckpt", weights_only=True)["global_step"] == 8
    os.utime(tmp_path / "a" / "last.ckpt", (2_000_000_000, 2_000_000_000))
    assert resume.resolve_ckpt_path(trainer, "last") == str(tmp_path / "a" / "last.ckpt")
    os.utime(tmp_path / "b" / "last.ckpt", (2_000_000_001, 2_000_000_001))
    assert resume.resolve_ckpt_path(trainer, "last") == str(tmp_path / "b" / "last.ckpt")
    # top-k files are not "last" (Lightning's rule): without a last file, a fresh fit and Lightning's warning
    (tmp_path / "a" / "last.ckpt").unlink()
    (tmp_path / "b" / "last.ckpt").unlink()
    again = Trainer(max_epochs=1, callbacks=[ModelCheckpoint(dirpath=tmp_path / "a")], logger=False,
                    enable_progress_bar=False, num_sanity_val_steps=0, default_root_dir=tmp_path)
    with pytest.warns(UserWarning, match='ckpt_path="last"\\) is set, but there is no last checkpoint available'):
        again.fit(Linear(), loader(), ckpt_path="last")
    assert again.global_step == 4  # one epoch from scratch
    # an earlier tasktrain recorded the newest checkpoint in the root dir: such a run still resumes from it
    ckpt_io.write_last_pointer(str(tmp_path), str(tmp_path / "a" / "epoch=1-step=8.ckpt"), 8, 1)
    again = Trainer(max_epochs=3, callbacks=[ModelCheckpoint(dirpath=tmp_path / "c")], logger=False,
                    enable_progress_bar=False, num_sanity_val_steps=0, default_root_dir=tmp_path)
    again.fit(Linear(), loader(), ckpt_path="last")
    assert again.global_step == 12  # resumed at step 8


def test_restart_record_only_in_a_launch_that_can_restart(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "launch-1")
    trainer, _ = trained(tmp_path, callbacks=[ModelCheckpoint(save_top_k=-1)])
    record = json.load(open(tmp_path / ckpt_io.POINTER_NAME))
    assert record["global_step"] == 8 and record["run_id"] == "launch-1"
    assert record["path"] == str(tmp_path / "checkpoints" / "epoch=1-step=8.ckpt")


def test_save_checkpoint_api_and_resume_by_path(tmp_path):
    module = Linear()
    trainer = Trainer(max_epochs=1, default_root_dir=tmp_path, **quiet())
    trainer.fit(module, loader())
    trainer.save_checkpoint(tmp_path / "manual.ckpt")
    again = Trainer(max_epochs=2, **quiet())
    again.fit(Linear(), loader(), ckpt_path=tmp_path / "manual.ckpt")
    assert again.global_step == 8 and again.current_epoch == 2


def test_hook_order_of_checkpoint_hooks(tmp_path):
    seen = []

    class M(Linear):
        def on_save_checkpoint(self, checkpoint):
            checkpoint["extra"] = torch.arange(3)
            seen.append("save")

        def on_load_checkpoint(self, checkpoint):
            seen.append(("load", checkpoint["extra"].tolist()))

    trainer = Trainer(max_epochs=1, default_root_dir=tmp_path, **quiet())
    trainer.fit(M(), loader())
    trainer.save_checkpoint(tmp_path / "x.ckpt")
    Trainer(max_epochs=2, **quiet()).fit(M(), loader(), ckpt_path=tmp_path / "x.ckpt")
    assert seen == ["save", ("load", [0, 1, 2])]


def test_validate_with_best_checkpoint(tmp_path):
    class Scored(Linear):
        def validation_step(self, batch, batch_idx):
            self.log("score", float(self.current_epoch == 1))  # epoch 1 is the best

    module = Scored()
    trainer = Trainer(max_epochs=3, default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
                      num_sanity_val_steps=0, callbacks=[ModelCheckpoint(monitor="score", mode="max")])
    trainer.fit(module, loader(), loader())
    assert trainer.checkpoint_callback.best_model_path.endswith("epoch=1-step=8.ckpt")
    best = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=True)["state_dict"]
    trainer.validate(module, loader(), ckpt_path="best")
    assert torch.equal(module.layer.weight, best["layer.weight"])


def test_a_file_without_the_trainers_loop_state_is_refused_before_training(tmp_path):
    path = tmp_path / "lightning_like.ckpt"  # Lightning's keys, but not tasktrain's loop state under "loops"
    torch.save({"epoch": 0, "global_step": 8, "state_dict": Linear().state_dict(), "loops": {"fit_loop": {}}}, path)
    module = Linear()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = Trainer(max_epochs=1, default_root_dir=tmp_path, logger=False, enable_progress_bar=False)
    with pytest.raises(ValueError, match="holds no tasktrain loop state.*load_state_dict"):
        trainer.fit(module, loader(), ckpt_path=str(path))
    assert trainer.global_step == 0 and all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    # a malformed loop state (hand-edited or hostile files, in either layout) gets the same error, not a crash inside
    for name, bad in (("loops_list", {"loops": [1]}), ("format2_int", {"format_version": 2, "train_state": 5}),
                      ("format3_str", {"loops": {"format_version": 3, "train_state": "x"}})):
        torch.save({"epoch": 0, "global_step": 0, "state_dict": Linear().state_dict(), **bad}, tmp_path / name)
        with pytest.raises(ValueError, match=f"{name} holds no tasktrain loop state"):
            Trainer(max_epochs=1, default_root_dir=tmp_path, logger=False, enable_progress_bar=False).fit(
                module, loader(), ckpt_path=str(tmp_path / name))


def test_hyper_parameters_saved_from_one_argument_come_back_as_that_argument(tmp_path):
    """save_hyperparameters(config) in __init__(self, config): the file says so (Lightning's hparams_name) and
    load_from_checkpoint passes the dict back as `config`, overrides still winning for their keys' argument."""
    class Configured(Linear):
        def __init__(self, config):
            super().__init__(lr=config["lr"])
            self.save_hyperparameters(config)

    module = Configured({"lr": 0.5, "width": 3})
    trainer = Trainer(max_steps=1, default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
                      enable_checkpointing=False)
    trainer.fit(module, loader())
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    ckpt = torch.load(tmp_path / "c.ckpt", weights_only=True)
    assert ckpt["hparams_name"] == "config" and ckpt["hyper_parameters"] == {"lr": 0.5, "width": 3}
    again = Configured.load_from_checkpoint(tmp_path / "c.ckpt")
    assert dict(again.hparams) == {"lr": 0.5, "width": 3} and torch.equal(again.layer.weight, module.layer.weight)
    assert dict(Configured.load_from_checkpoint(tmp_path / "c.ckpt", config={"lr": 0.1}).hparams) == {"lr": 0.1}


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "deepspeed_stage_2"])
def test_save_checkpoint_after_fit_on_one_process(strategy, tmp_path):
    """Lightning's `trainer.fit(model); trainer.save_checkpoint(path)`: a world of one's group ends with the run here,
    and its collectives are then local, so the file is written and resumes; DeepSpeed's engine (and its group of one)
    outlives the run, as Lightning's, until the next run sets up: its shards are written and resume."""
    from tasktrain.demos.boring_classes import BoringModel

    trainer = Trainer(strategy=strategy, devices=1, max_steps=2, limit_val_batches=0, default_root_dir=tmp_path,
                      **quiet(enable_model_summary=False))
    model = BoringModel()
    trainer.fit(model)
    path = str(tmp_path / "after.ckpt")
    trainer.save_checkpoint(path)
    full = {key: (value.full_tensor() if hasattr(value, "full_tensor") else value).detach().clone()
            for key, value in model.state_dict().items()}

    class Resumed(BoringModel):
        def on_train_start(self):
            self.restored = {key: (value.full_tensor() if hasattr(value, "full_tensor") else value).detach().clone()
                             for key, value in self.state_dict().items()}

    resumed = Resumed()
    again = Trainer(strategy=strategy, devices=1, max_steps=3, limit_val_batches=0, default_root_dir=tmp_path,
                    **quiet(enable_model_summary=False))
    again.fit(resumed, ckpt_path=path)  # (FSDP and DeepSpeed write a directory of shards; DDP one file)
    assert again.global_step == 3 and resumed.restored.keys() == full.keys()
    for key, value in full.items():
        torch.testing.assert_close(resumed.restored[key], value)
