"""`TaskModule.to_torchscript` beside Lightning 2.6's `LightningModule.to_torchscript` (issue 37; the yardstick's
models/test_torchscript.py): the deprecation warning Lightning 2.6 gives (its class, its "deprecated in v2.7" words,
shown outside __main__ too), its errors, nested modules scripted (the class-wide `_jit_is_scripting` flag), a traced
example input through the module's batch hooks to its device, check_inputs, the training mode kept, and a file
written through fsspec. The same module runs under both frameworks, compared output by output."""
import os
import subprocess
import sys
import warnings

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

import tasktrain  # noqa: E402

FRAMEWORKS = {"lightning": pl.LightningModule, "tasktrain": tasktrain.TaskModule}
WORDS = "has been deprecated in v2.7 and will be removed in v2.8"


def _module(name):
    base = FRAMEWORKS[name]

    class Leaf(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.layer(x)

    class Parent(base):  # TaskModules inside the one exported: each reads `trainer` while jit probes it
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Sequential(Leaf(), Leaf())
            self.example_input_array = torch.ones(1, 2)

        def forward(self, x):
            return self.inner(x)

        def on_before_batch_transfer(self, batch, dataloader_idx):
            return batch["x"] if isinstance(batch, dict) else batch  # a traced input goes through it (Lightning's)

    torch.manual_seed(0)
    return Parent()


def _export(name, **kwargs):
    module = _module(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exported = module.to_torchscript(**kwargs)
    ours = [w for w in caught if WORDS in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    return module, exported, ours[0]


@pytest.mark.parametrize("method", ["script", "trace"])
def test_to_torchscript_exports_what_lightnings_does(method):
    seen = {}
    for name, base in FRAMEWORKS.items():
        assert base._jit_is_scripting is False
        module, exported, warning = _export(name, method=method)
        assert base._jit_is_scripting is False and module.training and not exported.training
        assert isinstance(exported, torch.jit.ScriptModule)
        x = torch.tensor([[1.0, -2.0]])
        seen[name] = (exported(x).tolist(), warning.category.__name__,
                      issubclass(warning.category, DeprecationWarning))
    assert seen["tasktrain"] == seen["lightning"]
    assert seen["tasktrain"][1:] == ("LightningDeprecationWarning", True)


def test_trace_takes_the_example_through_the_batch_hooks_and_checks_inputs():
    outputs = {}
    for name in FRAMEWORKS:
        module = _module(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = module.to_torchscript(method="trace", example_inputs={"x": torch.ones(1, 2)},
                                           check_inputs=[(torch.ones(1, 2),)])
        outputs[name] = traced(torch.full((1, 2), 2.0)).tolist()  # (the forward got the hook's tensor, not the dict)
    assert outputs["tasktrain"] == outputs["lightning"]


def test_to_torchscript_errors_are_lightnings():
    messages = {}
    for name in FRAMEWORKS:
        module = _module(name)
        module.example_input_array = None
        found = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for kwargs in ({"method": "compile"}, {"method": "trace"}):
                with pytest.raises(ValueError) as err:
                    module.to_torchscript(**kwargs)
                found.append(str(err.value))
        messages[name] = found
    assert messages["tasktrain"] == messages["lightning"]
    assert "only supports 'script' or 'trace'" in messages["tasktrain"][0]


def test_to_torchscript_writes_through_fsspec():
    fsspec = pytest.importorskip("fsspec")
    loaded = {}
    for name in FRAMEWORKS:
        url = f"memory://yardstick/{name}.pt"
        module, exported, _ = _export(name, file_path=url)
        with fsspec.open(url, "rb") as f:
            loaded[name] = torch.jit.load(f)(torch.ones(1, 2)).tolist()
        assert loaded[name] == exported(torch.ones(1, 2)).tolist()
    assert loaded["tasktrain"] == loaded["lightning"]


@pytest.mark.parametrize("name", list(FRAMEWORKS))
def test_the_deprecation_is_shown_outside_main_as_lightnings(name, tmp_path):
    # Python hides a DeprecationWarning raised from a module other than __main__; Lightning's filter shows its class
    (tmp_path / "exporting.py").write_text(
        "import torch\n"
        "import lightning.pytorch as pl\n"
        "import tasktrain\n"
        f"base = {'pl.LightningModule' if name == 'lightning' else 'tasktrain.TaskModule'}\n"
        "class Net(base):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.layer = torch.nn.Linear(2, 2)\n"
        "    def forward(self, x):\n"
        "        return self.layer(x)\n"
        "Net().to_torchscript()\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTHONWARNINGS", None)
    run = subprocess.run([sys.executable, "-c", "import exporting"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert f"`{'LightningModule' if name == 'lightning' else 'TaskModule'}.to_torchscript` {WORDS}" in run.stderr
