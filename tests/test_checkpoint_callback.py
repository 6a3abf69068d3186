"""ModelCheckpoint: top-k on disk, file names, last.ckpt, step/epoch schedules, fresh scores, separate state."""
import json
import math
import os

import pytest
import torch
from helpers import Linear, loader

from tasktrain import ModelCheckpoint, Trainer
from tasktrain.exceptions import MisconfigurationException

SCORES = [5.0, 3.0, 4.0, 1.0, 2.0, 6.0]


class Scripted(Linear):
    """Validation logs `score` from a fixed sequence (one value per validation run) and `double` = 2 * score."""

    def __init__(self, scores=SCORES):
        super().__init__()
        self.scores, self.runs = list(scores), 0

    def on_validation_start(self):
        if not self.trainer.sanity_checking:
            self.runs += 1

    def validation_step(self, batch, batch_idx):
        score = self.scores[self.runs - 1] if self.runs else 0.0
        self.log("score", float(score))
        self.log("double", 2.0 * score)


def fit(callbacks, epochs=len(SCORES), module=None, **kwargs):
    trainer = Trainer(max_epochs=epochs, callbacks=callbacks, logger=False, enable_progress_bar=False,
                      num_sanity_val_steps=0, **kwargs)
    trainer.fit(module or Scripted(), loader(16), loader(8))
    return trainer


def ckpt_files(directory):
    return sorted(f for f in os.listdir(directory) if f.endswith(".ckpt"))


@pytest.mark.parametrize("mode,k", [("min", 2), ("max", 3), ("min", 1)])
def test_top_k_files_on_disk_are_the_k_best_scores(tmp_path, mode, k):
    mc = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}-{score:.1f}", monitor="score", mode=mode, save_top_k=k)
    fit([mc])
    ranked = sorted(range(len(SCORES)), key=lambda e: SCORES[e], reverse=mode == "max")[:k]
    assert ckpt_files(tmp_path) == sorted(f"epoch={e}-score={SCORES[e]:.1f}.ckpt" for e in ranked)
    best = ranked[0]
    assert mc.best_model_path == str(tmp_path / f"epoch={best}-score={SCORES[best]:.1f}.ckpt")
    assert float(mc.best_model_score) == SCORES[best]
    assert sorted(mc.best_k_models.values()) == sorted(SCORES[e] for e in ranked)
    # each file really holds the weights of the epoch in its name
    saved = torch.load(mc.best_model_path, weights_only=True)
    assert saved["loops"]["train_state"]["epoch"] == best and saved["loops"]["train_state"]["global_step"] == 2 * (best + 1)


def test_old_files_are_deleted_only_after_the_new_one_is_on_disk(tmp_path):
    mc = ModelCheckpoint(dirpath=tmp_path, monitor="score", save_top_k=1)
    trainer = Trainer(max_epochs=4, callbacks=[mc], logger=False, enable_progress_bar=False, num_sanity_val_steps=0)
    removals = []
    remove = trainer.strategy.remove_checkpoint

    def checked_remove(path):
        removals.append((path, mc.best_model_path, os.path.exists(mc.best_model_path)))
        remove(path)

    trainer.strategy.remove_checkpoint = checked_remove
    trainer.fit(Scripted([5.0, 3.0, 4.0, 1.0]), loader(16), loader(8))
    # better scores at epochs 1 and 3: each removal of the old best happened with the new best already written
    assert [(os.path.basename(p), os.path.basename(b), on_disk) for p, b, on_disk in removals] == [
        ("epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt", True), ("epoch=1-step=4.ckpt", "epoch=3-step=8.ckpt", True)]
    assert ckpt_files(tmp_path) == ["epoch=3-step=8.ckpt"]


def test_a_checkpoint_file_records_itself_in_its_top_k(tmp_path):
    mc = ModelCheckpoint(dirpath=tmp_path, monitor="score", save_top_k=2)
    fit([mc], epochs=4)
    for name in ckpt_files(tmp_path):
        state = torch.load(tmp_path / name, weights_only=True)["callbacks"][mc.state_key]
        assert str(tmp_path / name) in state["best_k_models"]  # a resume from it keeps deleting the right files


def test_filename_template_and_default_name(tmp_path):
    mc = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}-{step}-{double:.3f}", monitor="score", save_top_k=-1)
    fit([mc], epochs=2)
    assert ckpt_files(tmp_path) == ["epoch=0-step=2-double=10.000.ckpt", "epoch=1-step=4-double=6.000.ckpt"]
    trainer = fit([], epochs=1, default_root_dir=tmp_path / "root")  # the default ModelCheckpoint
    assert ckpt_files(tmp_path / "root" / "checkpoints") == ["epoch=0-step=2.ckpt"]
    assert trainer.checkpoint_callback.best_model_path.endswith("epoch=0-step=2.ckpt")
    # Lightning's rule: a field that was not logged is written as 0 (we warn, naming it)
    with pytest.warns(UserWarning, match=r"uses \{nope\}, which was not logged: it is written as 0"):
        fit([ModelCheckpoint(dirpath=tmp_path / "x", filename="{nope}")], epochs=1)
    assert ckpt_files(tmp_path / "x") == ["nope=0.ckpt"]


def test_missing_monitor_is_a_clear_error(tmp_path):
    with pytest.raises(KeyError, match=r"monitor='val_score'.*Logged metrics: \['double', 'score', 'train_loss'\]"):
        fit([ModelCheckpoint(dirpath=tmp_path, monitor="val_score")], epochs=1)
    # without validation, the first save is the check
    trainer = Trainer(max_epochs=1, callbacks=[ModelCheckpoint(dirpath=tmp_path, monitor="val_loss")], logger=False,
                      enable_progress_bar=False)
    with pytest.raises(KeyError, match=r"Logged metrics: \['train_loss'\]"):
        trainer.fit(Linear(), loader(16))
    with pytest.raises(ValueError, match="mode"):
        ModelCheckpoint(mode="best")
    # Lightning's rule: every_n_epochs=None with no other schedule is each epoch; 0 is accepted and means none
    assert ModelCheckpoint(every_n_epochs=None).every_n_epochs == 1
    assert ModelCheckpoint(every_n_epochs=0).every_n_epochs == 0


def test_save_last_keeps_last_ckpt_for_resuming(tmp_path):
    mc = ModelCheckpoint(monitor="score", save_top_k=1, save_last=True)
    trainer = fit([mc], epochs=3, default_root_dir=tmp_path)
    directory = tmp_path / "checkpoints"
    assert ckpt_files(directory) == ["epoch=1-step=4.ckpt", "last.ckpt"]
    assert mc.last_model_path == str(directory / "last.ckpt")
    last = torch.load(directory / "last.ckpt", weights_only=True)
    # Lightning's rule: last is written with each checkpoint file written, so it is the best's step (4) here
    assert last["loops"]["train_state"]["global_step"] == 4
    assert sorted(os.listdir(tmp_path)) == ["checkpoints"]  # Lightning's folder: nothing beside the checkpoints
    # fit(ckpt_path="last") continues from it
    trainer = Trainer(max_epochs=4, callbacks=[ModelCheckpoint(monitor="score", save_last=True)], logger=False,
                      enable_progress_bar=False, default_root_dir=tmp_path, num_sanity_val_steps=0)
    module = Scripted([9.0, 9.0, 9.0, 0.5])
    module.runs = 2
    trainer.fit(module, loader(16), loader(8), ckpt_path="last")
    assert trainer.global_step == 8 and module.runs == 4
    assert os.path.basename(trainer.checkpoint_callback.best_model_path) == "epoch=3-step=8.ckpt"
    assert ckpt_files(directory) == ["epoch=3-step=8.ckpt", "last.ckpt"]  # the restored top-k was cleaned up


def test_resuming_another_runs_checkpoint_never_touches_that_runs_files(tmp_path):
    """Fine-tuning from another run's checkpoint: its folder and top-k are not this run's. Without a dirpath, and
    with a dirpath of its own, the new run writes to its own folder and the first run's files stay as they were."""
    first = tmp_path / "first"
    fit([ModelCheckpoint(monitor="score", save_top_k=1, save_last=True)], epochs=3, default_root_dir=first)
    before = ckpt_files(first / "checkpoints")
    assert before == ["epoch=1-step=4.ckpt", "last.ckpt"]
    for dirpath in (None, tmp_path / "mine"):
        second = tmp_path / f"second_{dirpath is None}"
        mc = ModelCheckpoint(dirpath=dirpath, monitor="score", save_top_k=1, save_last=True)
        module = Scripted([9.0, 9.0, 9.0, 0.1, 9.0])  # its 0.1 beats the first run's best
        module.runs = 2  # last.ckpt is the first run's step 4 (written with its best)
        trainer = Trainer(max_epochs=5, callbacks=[mc], logger=False, enable_progress_bar=False,
                          default_root_dir=second, num_sanity_val_steps=0)
        with pytest.warns(UserWarning, match="The dirpath has changed from .* Only `best_model_path` will be "
                                             "reloaded .*starts its own top-k"):  # Lightning's warning
            trainer.fit(module, loader(16), loader(8), ckpt_path=str(first / "checkpoints" / "last.ckpt"))
        own = dirpath or second / "checkpoints"
        assert ckpt_files(first / "checkpoints") == before  # nothing of the first run deleted or overwritten
        assert ckpt_files(own) == ["epoch=3-step=8.ckpt", "last.ckpt"]
        assert mc.best_model_path == str(own / "epoch=3-step=8.ckpt")


def test_save_top_k_zero_with_save_last_writes_only_last(tmp_path):
    fit([ModelCheckpoint(dirpath=tmp_path, monitor="score", save_top_k=0, save_last=True)], epochs=2)
    assert ckpt_files(tmp_path) == ["last.ckpt"]


def test_no_monitor_keeps_the_newest_k(tmp_path):
    with pytest.raises(MisconfigurationException, match=r"ModelCheckpoint\(save_top_k=2, monitor=None\) is not a "
                                                         "valid configuration. No quantity for top_k to track."):
        ModelCheckpoint(dirpath=tmp_path, save_top_k=2)  # Lightning's refusal
    mc = ModelCheckpoint(dirpath=tmp_path, save_top_k=2, monitor="step", mode="max")  # the newest k
    fit([mc], epochs=4)
    assert ckpt_files(tmp_path) == ["epoch=2-step=6.ckpt", "epoch=3-step=8.ckpt"]
    assert mc.best_model_path == str(tmp_path / "epoch=3-step=8.ckpt")


def test_every_n_train_steps_with_accumulation_saves_once_per_step(tmp_path):
    mc = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, every_n_epochs=None, save_top_k=-1)
    trainer = Trainer(max_epochs=2, accumulate_grad_batches=2, callbacks=[mc], logger=False,
                      enable_progress_bar=False)
    trainer.fit(Linear(), loader(64))  # 8 batches, 4 steps an epoch
    assert ckpt_files(tmp_path) == ["epoch=0-step=3.ckpt", "epoch=1-step=6.ckpt"]


def test_every_n_epochs(tmp_path):
    fit([ModelCheckpoint(dirpath=tmp_path, every_n_epochs=2, save_top_k=-1)], epochs=5)
    assert ckpt_files(tmp_path) == ["epoch=1-step=4.ckpt", "epoch=3-step=8.ckpt"]


def test_a_step_save_at_an_epoch_end_is_lightnings(tmp_path):
    # steps 2, 4, 6 are each the last step of an epoch, saves at epoch ends (validation every epoch): Lightning 2.6
    # saves at the batch's end, before that epoch's validation; step 2 has no score yet (deferred to a validation
    # end, which saves nothing here), step 4 scores epoch 0's validation, step 6 epoch 1's (checked beside Lightning)
    mc = ModelCheckpoint(dirpath=tmp_path, monitor="score", every_n_train_steps=2, every_n_epochs=None,
                         save_top_k=-1, filename="{step}-{score:.0f}")
    fit([mc], epochs=3)
    assert ckpt_files(tmp_path) == ["step=4-score=5.ckpt", "step=6-score=3.ckpt"]


def test_saves_after_each_validation_inside_the_epoch_and_stale_values_as_lightning(tmp_path):
    mc = ModelCheckpoint(dirpath=tmp_path, monitor="score", save_top_k=-1, filename="{epoch}-{step}-{score:.0f}")
    trainer = Trainer(max_epochs=2, val_check_interval=2, callbacks=[mc], logger=False, enable_progress_bar=False,
                      num_sanity_val_steps=0)
    trainer.fit(Scripted(), loader(32), loader(8))  # 4 batches: validation after batch 2 and at the end
    assert ckpt_files(tmp_path) == ["epoch=0-step=2-score=5.ckpt", "epoch=0-step=4-score=3.ckpt",
                                    "epoch=1-step=6-score=4.ckpt", "epoch=1-step=8-score=1.ckpt"]
    # every step with check_val_every_n_epoch=2 (Lightning 2.6, checked beside it): the steps before the first
    # validation defer (no score yet; made at epoch 1's validation end), later steps score the last validation's
    # value again (a stale value is a candidate, as in Lightning), the last batch of a validating epoch waits for it
    mc = ModelCheckpoint(dirpath=tmp_path / "b", monitor="score", save_top_k=-1, every_n_train_steps=1,
                         every_n_epochs=None, save_last=True)
    fit([mc], epochs=4, check_val_every_n_epoch=2)
    assert sorted(mc.best_k_models.values()) == [3.0, 5.0, 5.0, 5.0, 5.0]
    assert ckpt_files(tmp_path / "b") == ["epoch=1-step=4.ckpt", "epoch=2-step=5.ckpt", "epoch=2-step=6.ckpt",
                                          "epoch=3-step=7.ckpt", "epoch=3-step=8.ckpt", "last.ckpt"]


def test_nan_score_is_never_the_best(tmp_path):
    mc = ModelCheckpoint(dirpath=tmp_path, monitor="score", save_top_k=2, mode="max")
    fit([mc], module=Scripted([math.nan, 1.0, math.nan, 0.5]), epochs=4)
    assert float(mc.best_model_score) == 1.0
    assert ckpt_files(tmp_path) == ["epoch=1-step=4.ckpt", "epoch=3-step=8.ckpt"]


def test_two_checkpoints_with_different_monitors_keep_separate_state(tmp_path):
    low = ModelCheckpoint(dirpath=tmp_path / "low", monitor="score", mode="min", save_top_k=2)
    high = ModelCheckpoint(dirpath=tmp_path / "high", monitor="double", mode="max", save_top_k=1, save_last=True)
    assert low.state_key != high.state_key
    fit([low, high], epochs=4)
    ckpt = torch.load(tmp_path / "high" / "last.ckpt", weights_only=True)
    saved = ckpt["callbacks"]
    # high's last.ckpt is written with its best file (epoch 0, Lightning's rule): low's state then was its first
    assert saved[low.state_key]["best_model_score"] == 5.0 and saved[high.state_key]["best_model_score"] == 10.0
    assert len(saved[low.state_key]["best_k_models"]) == 1 and len(saved[high.state_key]["best_k_models"]) == 1

    # a fresh pair, listed the other way round, gets each its own state back
    low2 = ModelCheckpoint(dirpath=tmp_path / "low", monitor="score", mode="min", save_top_k=2)
    high2 = ModelCheckpoint(dirpath=tmp_path / "high", monitor="double", mode="max", save_top_k=1, save_last=True)
    restored = {}

    class Peek(Linear):  # (last.ckpt ends epoch 0: with max_epochs=1 nothing is trained, no on_train_start)
        def on_fit_end(self):
            restored.update(low=(float(low2.best_model_score), dict(low2.best_k_models)),
                            high=(float(high2.best_model_score), high2.best_model_path))

    trainer = Trainer(max_epochs=1, callbacks=[high2, low2], logger=False, enable_progress_bar=False)
    trainer.fit(Peek(), loader(16), loader(8), ckpt_path=tmp_path / "high" / "last.ckpt")
    assert restored["low"] == (5.0, saved[low.state_key]["best_k_models"])
    assert restored["high"] == (10.0, high.best_model_path)


def test_save_weights_only(tmp_path):
    mc = ModelCheckpoint(dirpath=tmp_path, save_weights_only=True)
    fit([mc], epochs=1)
    ckpt = torch.load(mc.best_model_path, weights_only=True)
    assert ckpt["loops"]["weights_only"] is True and "optimizer_states" not in ckpt and "state_dict" in ckpt
    trainer = Trainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_checkpointing=False)
    with pytest.raises(KeyError, match="checkpoint contains only the model.*save_weights_only"):  # (Lightning's KeyError)
        trainer.fit(Scripted(), loader(16), ckpt_path=mc.best_model_path)
