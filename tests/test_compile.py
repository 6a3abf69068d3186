"""torch.compile through the Trainer and the Accelerator.

These tests compile with a backend that records each graph dynamo hands it and runs it as traced (no inductor: a
compile costs milliseconds), which shows what gets compiled; tests/test_gpt_example.py compiles the GPT example
with inductor itself.
"""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import Accelerator, TaskModule, Trainer, seed_everything
from tasktrain.checkpoint_io import load_plain_state_dict, plain_state_dict


class Recorder:
    """A torch.compile backend: counts the graphs it is given (their inputs' shapes) and runs them as traced."""

    def __init__(self):
        self.graphs = []

    def __call__(self, graph_module, example_inputs):
        self.graphs.append(graph_module)
        return graph_module.forward


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


class Regressor(TaskModule):
    def __init__(self, compile_net=None):
        super().__init__()
        self.net = torch.compile(mlp(), backend=compile_net) if compile_net is not None else mlp()
        self.forward_calls = 0

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def data():
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g)), batch_size=16)


def trainer(root, epochs=2, **kwargs):
    return Trainer(max_epochs=epochs, logger=False, enable_progress_bar=False, default_root_dir=str(root),
                   num_sanity_val_steps=0, **kwargs)


def test_fit_of_a_compiled_module_trains_the_module_with_its_forward_compiled(tmp_path):
    seed_everything(0)
    module = Regressor()
    eager = Regressor()
    eager.load_state_dict(module.state_dict())
    recorder = Recorder()
    fit = trainer(tmp_path / "compiled")
    fit.fit(torch.compile(module, backend=recorder), data())
    # The forward went through the compiler (training_step and the loop stayed eager: the graphs hold the MLP
    # only, no loss), and the module trained is the one inside the wrapper.
    assert recorder.graphs
    assert all("mse_loss" not in str(g.graph) for g in recorder.graphs)
    assert fit.module is module and fit.global_step == 8
    # After the run the module is as it was given: its own forward, not the compiled one.
    assert module._compiled_call_impl is None
    # Same weights as the same fit without compile (the recording backend runs the traced graph as is).
    trainer(tmp_path / "eager").fit(eager, data())
    for name, value in module.state_dict().items():
        assert torch.equal(value, eager.state_dict()[name]), name
    checkpoint = torch.load(fit.checkpoint_callback.best_model_path, weights_only=True)
    assert sorted(checkpoint["state_dict"]) == ["net.0.bias", "net.0.weight", "net.2.bias", "net.2.weight"]

    # A later stage without a module uses what fit was given: the compiled forward again (in eval mode and under
    # inference_mode, so dynamo traces it anew).
    graphs = len(recorder.graphs)
    fit.validate(dataloaders=data())
    assert len(recorder.graphs) > graphs
    assert module._compiled_call_impl is None


def test_a_module_compiled_in_place_and_a_compiled_submodule_save_plain_names(tmp_path):
    recorder = Recorder()
    in_place = Regressor()
    in_place.compile(backend=recorder)  # torch's own in-place compile: names unchanged
    trainer(tmp_path / "in_place").fit(in_place, data())
    assert recorder.graphs

    recorder = Recorder()
    seed_everything(0)
    module = Regressor(compile_net=recorder)  # self.net = torch.compile(mlp()): keys "net._orig_mod.0.weight"
    assert "net._orig_mod.0.weight" in module.state_dict()
    fit = trainer(tmp_path / "sub")
    fit.fit(module, data())
    assert recorder.graphs
    path = fit.checkpoint_callback.best_model_path
    saved = torch.load(path, weights_only=True)["state_dict"]
    assert sorted(saved) == ["net.0.bias", "net.0.weight", "net.2.bias", "net.2.weight"]
    # The file loads into the module compiled or not, and a fit resumes from it with the compiled submodule.
    for compiled in (Recorder(), None):
        loaded = Regressor.load_from_checkpoint(path, compile_net=compiled)
        assert torch.equal(plain_state_dict(loaded.state_dict())["net.0.weight"], saved["net.0.weight"])
    resumed = trainer(tmp_path / "sub", epochs=3)
    resumed.fit(Regressor(compile_net=Recorder()), data(), ckpt_path=path)
    assert resumed.global_step == 12


def test_plain_names_round_trip_keeps_metadata_and_strictness():
    wrapped = torch.nn.Module()
    wrapped.body = torch.compile(mlp(), backend=Recorder())
    state = wrapped.state_dict()
    plain = plain_state_dict(state)
    assert sorted(plain) == ["body.0.bias", "body.0.weight", "body.2.bias", "body.2.weight"]
    assert "body" in plain._metadata and not any("_orig_mod" in k for k in plain._metadata)
    target = torch.nn.Module()
    target.body = torch.compile(mlp(), backend=Recorder())
    load_plain_state_dict(target, plain)
    assert torch.equal(target.body._orig_mod[0].weight, wrapped.body._orig_mod[0].weight)
    with pytest.raises(RuntimeError, match="Missing key"):
        load_plain_state_dict(target, {k: v for k, v in plain.items() if k != "body.0.bias"})
    assert plain_state_dict({"a.weight": 1}) == {"a.weight": 1}  # nothing compiled: the same dict back


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_accelerator_prepares_a_compiled_model(tmp_path, precision):
    recorder = Recorder()
    accelerator = Accelerator(mixed_precision=precision)
    model = mlp()
    compiled = torch.compile(model, backend=recorder)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    prepared, optimizer, loader = accelerator.prepare(compiled, optimizer, data())
    for x, y in loader:
        out = prepared(x)
        accelerator.backward(F.mse_loss(out, y))
        optimizer.step()
        optimizer.zero_grad()
    assert recorder.graphs and out.dtype == torch.float32
    assert accelerator.unwrap_model(prepared) is model
    names = ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert sorted(accelerator.get_state_dict(prepared)) == names
    accelerator.save_state(tmp_path / "state")  # Accelerate's files: the weights in model.safetensors
    from safetensors.torch import load_file

    assert sorted(load_file(str(tmp_path / "state" / "model.safetensors"))) == names
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model[0].weight.zero_()
    accelerator.load_state(tmp_path / "state")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    accelerator.end_training()
