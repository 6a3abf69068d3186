"""save_state(layout="accelerate") and load_state against real Accelerate 1.15 (a test-only dependency), one
process each: tasktrain writes Accelerate's layout, an Accelerate script in a subprocess loads it and writes its
own folder after a few more steps, and tasktrain loads that folder (weights, optimizer, scheduler, registered
object and RNG state). Pickles are read with weights_only=True: one holding another object is refused."""
import datetime
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import Accelerator
from tasktrain.checkpoint_io import CheckpointError

pytest.importorskip("accelerate", minversion="1.15")

ACCELERATE_SCRIPT = textwrap.dedent("""\
    import sys, torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    ours, theirs = sys.argv[1], sys.argv[2]
    class Counter:
        def __init__(self): self.count = 0
        def state_dict(self): return {"count": self.count}
        def load_state_dict(self, state): self.count = state["count"]
    accelerator = Accelerator(cpu=True)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    accelerator.load_state(ours)                      # the folder tasktrain wrote
    loaded = {"weight": model.weight.detach().clone(), "count": counter.count, "lr": scheduler.get_last_lr()[0],
              "step": float(optimizer.state_dict()["state"][0]["step"]), "rand": torch.rand(3)}
    for _ in range(2):
        model(torch.ones(2, 4)).pow(2).mean().backward()
        optimizer.step(); scheduler.step(); optimizer.zero_grad()
    counter.count += 10
    accelerator.save_state(theirs)
    after = {"weight": model.weight.detach().clone(), "rand": torch.rand(3)}
    torch.save({"loaded": loaded, "after": after}, theirs + ".expected.pt")
""")


class Counter:
    def __init__(self):
        self.count = 0

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


def build():
    accelerator = Accelerator()
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
    return (accelerator, counter, *accelerator.prepare(model, optimizer, scheduler))


@pytest.mark.timeout(300)
def test_accelerate_reads_our_layout_and_we_read_accelerates(tmp_path):
    accelerator, counter, model, optimizer, scheduler = build()
    data = accelerator.prepare(DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2))
    for (x,) in data:
        accelerator.backward(model(x).pow(2).mean())
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    counter.count = 3
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    accelerator.save_state(ours, layout="accelerate")
    rand_after_save = torch.rand(3)
    assert {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl", "custom_checkpoint_0.pkl",
            "accelerator_state.pt"} == set(os.listdir(ours))
    (tmp_path / "acc.py").write_text(ACCELERATE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TASKTRAIN_", "RANK", "WORLD_SIZE"))}
    run = subprocess.run([sys.executable, str(tmp_path / "acc.py"), str(ours), str(theirs)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-4000:]
    expected = torch.load(str(theirs) + ".expected.pt", weights_only=True)
    # Accelerate read what we wrote: weights, optimizer steps, scheduler, the registered object, the RNG.
    loaded = expected["loaded"]
    assert torch.equal(loaded["weight"], model.weight.detach()) and loaded["count"] == 3
    assert loaded["step"] == 4.0 and loaded["lr"] == pytest.approx(0.1 * 0.5 ** 4)
    assert torch.equal(loaded["rand"], rand_after_save)
    # And we read what Accelerate wrote, two steps later.
    accelerator, counter, model, optimizer, scheduler = build()
    accelerator.load_state(theirs)
    assert torch.equal(model.weight.detach(), expected["after"]["weight"]) and counter.count == 13
    assert float(optimizer.state_dict()["state"][0]["step"]) == 6.0
    assert scheduler.get_last_lr()[0] == pytest.approx(0.1 * 0.5 ** 6)
    assert torch.equal(torch.rand(3), expected["after"]["rand"])  # the RNG continues as Accelerate's did


def test_a_pickle_holding_other_objects_is_refused(tmp_path):
    accelerator, counter, model, optimizer, scheduler = build()
    accelerator.save_state(tmp_path / "state", layout="accelerate")
    torch.save({"count": datetime.date(2026, 1, 1)}, tmp_path / "state" / "custom_checkpoint_0.pkl")
    with pytest.raises(CheckpointError, match="does not unpickle arbitrary objects"):
        accelerator.load_state(tmp_path / "state")
    with pytest.raises(ValueError, match="layout='accelerate' too"):
        accelerator.save_state(tmp_path / "other", safe_serialization=False)


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.bin", "random_states_0.pkl"])
def test_a_truncated_file_of_accelerates_layout_is_a_checkpoint_error(tmp_path, name):
    # issue 38: every loader says CheckpointError for a damaged file, naming it (no raw EOFError / SafetensorError)
    accelerator, counter, model, optimizer, scheduler = build()
    accelerator.save_state(tmp_path / "state", layout="accelerate")
    path = tmp_path / "state" / name
    path.write_bytes(path.read_bytes()[: max(8, path.stat().st_size // 2)])
    with pytest.raises(CheckpointError, match=f"{name}.*truncated or corrupted"):
        accelerator.load_state(tmp_path / "state")
