"""The run state (tasktrain/trainer/run_state.py) and the epoch iterator (tasktrain/trainer/epoch.py): one schema
under the Trainer's checkpoints and the Accelerator's save_state, one epoch bookkeeping under both loops.

tests/data/format_v1 holds files written by tasktrain before the run state (main at 9dac750, format 1): a Trainer
checkpoint after 4 steps of a 6-batch epoch and an Accelerator save_state after 3 batches, and the weights each
reached when that version resumed them (to 9 steps; to the end of the next epoch). This version must load them and
continue to the very same weights.
"""
import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import Accelerator, TaskModule, Trainer
from tasktrain.checkpoint_io import CHECKPOINT_FORMAT_VERSION
from tasktrain.trainer.accelerator import STATE_FILE
from tasktrain.trainer.data import prepare_train_data
from tasktrain.trainer.epoch import DataPosition, EpochIterator
from tasktrain.trainer.run_state import upgrade

V1 = os.path.join(os.path.dirname(__file__), "data", "format_v1")


def _data():
    torch.manual_seed(0)
    x = torch.randn(24, 4)
    return TensorDataset(x, x.sum(1, keepdim=True))


class Reg(TaskModule):
    def __init__(self):
        super().__init__()
        self.save_hyperparameters({"width": 4})
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, on_epoch=True)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=0.01)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 2)}


def _trainer(tmp_path, **kwargs):
    return Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                   default_root_dir=str(tmp_path), **kwargs)


def test_a_trainer_checkpoint_of_format_1_resumes_to_the_weights_that_version_reached(tmp_path):
    expected = torch.load(os.path.join(V1, "expected.pt"), weights_only=True)
    data = _data()
    module = Reg()
    trainer = _trainer(tmp_path, max_steps=9)
    trainer.fit(module, DataLoader(data, batch_size=4, shuffle=True), ckpt_path=os.path.join(V1, "trainer_v1.ckpt"))
    assert trainer.global_step == expected["trainer_step"] == 9
    for name, value in expected["trainer"].items():
        assert torch.equal(module.state_dict()[name], value), name
    # what it writes now is format 3: Lightning's keys, tasktrain's own under "loops"
    trainer.save_checkpoint(tmp_path / "now.ckpt")
    now = torch.load(tmp_path / "now.ckpt", weights_only=True)
    assert now["loops"]["format_version"] == CHECKPOINT_FORMAT_VERSION == 3
    assert set(now) == {"epoch", "global_step", "pytorch-lightning_version", "state_dict", "loops", "callbacks",
                        "optimizer_states", "lr_schedulers", "hparams_name", "hyper_parameters"}
    for key in ("optimizer_param_names", "metrics", "rng_states", "train_state", "world_size", "weights_only"):
        assert key in now["loops"], key


def test_an_accelerator_state_of_format_1_loads_and_continues_to_the_weights_that_version_reached(tmp_path):
    expected = torch.load(os.path.join(V1, "expected.pt"), weights_only=True)
    data = _data()
    accelerator = Accelerator()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    model, opt, loader, sched = accelerator.prepare(model, opt, DataLoader(data, batch_size=4, shuffle=True), sched)
    old = torch.load(os.path.join(V1, "accelerator_v1", STATE_FILE), weights_only=True)
    assert old["format_version"] == 1 and "steps" in old and "loop" not in old  # really the old layout
    accelerator.load_state(os.path.join(V1, "accelerator_v1"))
    seen = 0
    for _ in range(2):
        for x, y in loader:
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            sched.step()
            opt.zero_grad()
            seen += 1
    assert seen == expected["accelerator_batches"] == 9  # the rest of epoch 0 (3 of 6), then epoch 1
    for name, value in expected["accelerator"].items():
        assert torch.equal(model.state_dict()[name], value), name
    assert sched.get_last_lr() == expected["lr"]
    # saved now: one header for both kinds of file, the loop's position as its own part
    accelerator.save_state(str(tmp_path / "state"))
    now = torch.load(tmp_path / "state" / STATE_FILE, weights_only=True)
    assert now["format_version"] == CHECKPOINT_FORMAT_VERSION and now["loop"]["steps"] == 12 and "steps" not in now
    assert "loops" not in now  # the Accelerator's layout is its own: the header at the top level


def test_upgrade_maps_the_accelerator_format_1_loop_keys():
    old = {"format_version": 1, "loaders": [], "data_seed": 5, "accumulation": {"micro_step": 1}, "steps": 7}
    assert upgrade(old)["loop"] == {"data_seed": 5, "micro_step": 1, "steps": 7}
    current = {"format_version": 2, "loop": {"steps": 1}}
    assert upgrade(current) is current


# -- the epoch iterator -------------------------------------------------------------------------------------------------
def _iterator(n=10, batch_size=2, world=2, rank=0, shuffle=False):
    data = prepare_train_data(DataLoader(TensorDataset(torch.arange(n)), batch_size=batch_size, shuffle=shuffle),
                              world, rank, seed=3)
    return EpochIterator(data, world, len(data), DataPosition())


def test_the_epoch_iterator_counts_batches_and_global_samples_and_resumes_on_another_world_size():
    it = _iterator(n=12, batch_size=2, world=2, rank=0)
    assert it.begin(0) == 3
    seen = []
    for index, (batch,), last in it.batches():
        seen.append(batch.tolist())
        it.advance(index)
        if index == 1:
            break
    assert seen == [[0, 2], [4, 6]] and it.position.batch_in_epoch == 2 and it.position.samples_in_epoch == 8
    saved = it.position.state_dict()
    # on one process: the 4 samples left of the epoch's order, in 2 batches of 2
    one = _iterator(n=12, batch_size=2, world=1, rank=0)
    one.resume(saved, 2, 1, source="here", epoch_name="epoch 0", world=1, order_remedy="-")
    assert one.begin(0) == 4 + 2  # this run's numbering: 4 batches done, 2 left
    rest = []
    for index, (batch,), last in one.batches():
        rest.extend(batch.tolist())
        one.advance(index)
    assert rest == [8, 9, 10, 11] and one.position.samples_in_epoch == 12
    one.end_epoch()
    assert (one.position.epoch, one.position.batch_in_epoch, one.position.samples_in_epoch) == (1, 0, 0)


def test_the_epoch_iterator_reads_ahead_without_a_length_and_refuses_a_users_order_on_another_world_size():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(5))

    data = prepare_train_data(DataLoader(Stream(), batch_size=None), 1, 0, seed=0)
    it = EpochIterator(data, 1, None, DataPosition())
    assert it.begin(0) is None
    flags = [(index, last) for index, _, last in it.batches()]
    assert flags == [(0, False), (1, False), (2, False), (3, False), (4, True)]
    assert EpochIterator.window(4, 3, None) == (3, 3) and EpochIterator.window(4, 3, 5) == (3, 2)
    with pytest.raises(ValueError, match=r"stopped in the middle of epoch 2 on 2 processes, and this run has 1; the "
                                         r"training loader's order is its own.*or do this"):
        it.resume({"batch_in_epoch": 3}, 2, 1, source="ckpt", epoch_name="epoch 2", world=1, order_remedy="do this")


def test_gathering_the_random_states_writes_nothing_through_torch_save(monkeypatch):
    # all_gather_object pickles what it sends: a tensor's storage pickles through torch.save, which a user's (or
    # Lightning's test's) hook on torch.save counts as a checkpoint write on every rank. Lightning's ranks other than
    # 0 write nothing; the states come back as the tensors the checkpoint holds.
    import io
    import pickle

    from tasktrain.checkpoint_io import collect_rng_states
    from tasktrain.trainer.run_state import RandomStates

    class PicklingTwoRanks:  # all_gather_object as torch.distributed sends it: pickled, for each of 2 ranks
        def all_gather_object(self, obj):
            buffer = io.BytesIO()
            pickle.Pickler(buffer).dump(obj)
            return [pickle.loads(buffer.getvalue()) for _ in range(2)]

    saves = []
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda *args, **kwargs: saves.append(1) or real_save(*args, **kwargs))
    states = RandomStates(PicklingTwoRanks()).state_dict()
    assert saves == []
    expected = collect_rng_states()
    assert len(states) == 2 and torch.equal(states[1]["torch"], expected["torch"])
    assert torch.equal(states[0]["numpy"][1], expected["numpy"][1]) and states[0]["python"] == expected["python"]


LIGHTNING_LOOPS = ("fit_loop", "validate_loop", "test_loop", "predict_loop")


def _format_2(ckpt):
    """A checkpoint of this format in format 2's layout, as tasktrain wrote them before: its own keys at the top
    level, the precision plugin's state as "precision", hyper_parameters always."""
    old = {key: value for key, value in ckpt.items() if key not in ("loops", "pytorch-lightning_version")}
    old.update({key: value for key, value in ckpt["loops"].items() if key not in LIGHTNING_LOOPS}, format_version=2,
               precision={})
    old.setdefault("hyper_parameters", {})
    return old


def test_a_trainer_checkpoint_of_format_2_resumes_as_the_current_one(tmp_path):
    """Saved inside an epoch (position, random states and metrics matter), written again in format 2's layout: both
    files resume to the same weights, and on_load_checkpoint sees format 3's layout for both."""
    data = _data()
    _trainer(tmp_path, max_steps=4).fit(Reg(), DataLoader(data, batch_size=4, shuffle=True))
    trainer = _trainer(tmp_path, max_steps=4)
    module = Reg()
    trainer.fit(module, DataLoader(data, batch_size=4, shuffle=True))
    trainer.save_checkpoint(tmp_path / "now.ckpt")
    now = torch.load(tmp_path / "now.ckpt", weights_only=True)
    assert now["loops"]["train_state"]["batch_in_epoch"] == 4 and not now["loops"]["train_state"]["epoch_finished"]
    torch.save(_format_2(now), tmp_path / "old.ckpt")
    weights, seen = {}, {}
    for name in ("now", "old"):
        class Seen(Reg):
            def on_load_checkpoint(self, checkpoint):
                seen[name] = checkpoint

        module = Seen()
        resumed = _trainer(tmp_path, max_steps=9)
        resumed.fit(module, DataLoader(data, batch_size=4, shuffle=True), ckpt_path=str(tmp_path / f"{name}.ckpt"))
        assert resumed.global_step == 9
        weights[name] = module.state_dict()
    for key, value in weights["now"].items():
        assert torch.equal(weights["old"][key], value), key
    # (Lightning's loop progress beside tasktrain's keys is written since format 3's files carry it; older files lack it)
    assert set(seen["old"]) == set(seen["now"]) and set(seen["old"]["loops"]) == set(seen["now"]["loops"]) - set(
        LIGHTNING_LOOPS)
    assert seen["old"]["loops"]["format_version"] == 2 and seen["now"]["loops"]["format_version"] == 3


def test_upgrade_keeps_a_format_2_precision_state_and_drops_empty_hyper_parameters():
    scaler = {"scaler": {"scale": 1024.0}}
    old = {"format_version": 2, "tasktrain_version": "0.1.0", "torch_version": "2.13", "state_dict": {},
           "train_state": {"epoch": 1, "global_step": 6}, "precision": scaler, "hyper_parameters": {},
           "world_size": 2, "weights_only": False, "callbacks": {}, "rng_states": []}
    new = upgrade(old)
    assert list(new) == ["epoch", "global_step", "pytorch-lightning_version", "state_dict", "callbacks", "loops"]
    assert (new["epoch"], new["global_step"], new["pytorch-lightning_version"]) == (1, 6, "0.1.0")  # (as written)
    assert new["loops"]["precision"] == scaler and new["loops"]["world_size"] == 2
    assert upgrade(new) is new


def test_callback_states_load_beside_a_dummy_logger():
    """fast_dev_run's DummyLogger (a callback here) answers every attribute, `_legacy_state_keys` included, with a
    function: the callbacks' states still load (a spawned run's parent loads them back; it raised a TypeError)."""
    from tasktrain import ModelCheckpoint
    from tasktrain.loggers.logger import DummyLogger
    from tasktrain.trainer.run_state import Callbacks

    saver = ModelCheckpoint(monitor="loss")
    saver.best_model_path = "best.ckpt"
    states = Callbacks([saver]).state_dict()
    loaded = ModelCheckpoint(monitor="loss")
    Callbacks([DummyLogger(), loaded]).load_state_dict(states)
    assert loaded.best_model_path == "best.ckpt"


def test_engine_records_of_older_files_move_under_loops():
    """DeepSpeed's, FSDP's and the model-parallel mesh's records (checkpoint_io.ENGINE_KEYS) are tasktrain's own keys:
    a format 3 file written when they sat at the top level (or a format 2 one) loads with them under "loops",
    Lightning's top level left; the current layout and the Accelerator's are left as they are."""
    from tasktrain.checkpoint_io import with_own, without_own

    meta = {"deepspeed": {"tag": "zero", "stage": 3, "world_size": 2, "key_prefix": ""},
            "fsdp": {"world_size": 2, "layout": "dcp"}, "device_mesh": {"data_parallel": 2, "tensor_parallel": 1}}
    loops = {"format_version": 3, "train_state": {"epoch": 0, "global_step": 2}, "world_size": 2}
    for old in ({"epoch": 0, "global_step": 2, "state_dict": {}, "loops": loops, **meta},
                {"format_version": 2, "state_dict": {}, "train_state": loops["train_state"], "world_size": 2, **meta}):
        new = upgrade(old)
        assert not set(meta) & set(new) and all(new["loops"][key] == value for key, value in meta.items())
        assert upgrade(new) is new
    accelerators = {"format_version": 3, "models": [], **meta}
    assert upgrade(accelerators) is accelerators
    written = with_own({"state_dict": {}, "loops": loops}, fsdp=meta["fsdp"])
    assert "fsdp" not in written and written["loops"]["fsdp"] == meta["fsdp"] and "fsdp" not in loops
    assert with_own(accelerators, fsdp=1)["fsdp"] == 1
    assert "fsdp" not in without_own(written, "fsdp")["loops"] and "fsdp" in written["loops"]
