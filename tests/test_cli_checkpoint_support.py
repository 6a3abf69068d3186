"""TaskCLI(load_from_checkpoint_support=True), Lightning 2.6's LightningCLI argument (default True), beside
LightningCLI itself (issue 37): the same command lines in subclass mode (`--model=Sub --model.scale=2.5`), in class
mode, with an injected nn.Module (`--model.encoder=torch.nn.Linear`), with save_hyperparameters called for some
arguments or not at all, and with the argument False, under both CLIs; each fits two steps, saves a checkpoint and
loads it back through the base classes, and what each library recorded, logged and rebuilt is compared. Then the trust
rule: a checkpoint naming an instantiator off the allow-list, or a class that is not an already imported subclass, or
a nested class in a module not imported, is refused with a clear error, and nothing it names is imported."""
import os
import sys
import uuid

import pytest
import torch
import yaml
from torch.utils.data import DataLoader, TensorDataset

import tasktrain

L = pytest.importorskip("lightning.pytorch")  # a test dependency (requirements-dev.txt), imported in tests only
pytest.importorskip("jsonargparse")


# -- one family of classes per library: the same code, on LightningModule or on TaskModule -------------------------

class Steps:
    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def family(prefix, module_base, data_base):
    """Base / Sub (subclass mode), Injected (an nn.Module argument), Quiet (no save_hyperparameters), Picky
    (save_hyperparameters("hidden")), Data / SubData; named prefix + name in this module, so their class paths
    resolve."""

    class Base(Steps, module_base):
        def __init__(self, hidden: int = 4):
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Linear(hidden, 1))

        def forward(self, x):
            return self.net(x)

    class Sub(Base):
        def __init__(self, hidden: int = 4, scale: float = 1.0):
            super().__init__(hidden)
            self.save_hyperparameters()
            self.scale = scale

    class Injected(Steps, module_base):
        def __init__(self, encoder: torch.nn.Module, lr: float = 0.1):
            super().__init__()
            self.save_hyperparameters()
            self.encoder, self.head = encoder, torch.nn.Linear(encoder.out_features, 1)

        def forward(self, x):
            return self.head(self.encoder(x))

    class Quiet(Steps, module_base):
        def __init__(self, hidden: int = 4):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Linear(hidden, 1))

        def forward(self, x):
            return self.net(x)

    class Picky(Quiet):
        def __init__(self, hidden: int = 4, scale: float = 1.0):
            super().__init__(hidden)
            self.save_hyperparameters("hidden")

    class Data(data_base):
        width = 5  # (what a link applied on instantiation reads)

        def __init__(self, batch_size: int = 8):
            super().__init__()
            self.save_hyperparameters()

        def train_dataloader(self):
            x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
            return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=self.hparams.batch_size)

        test_dataloader = train_dataloader

    class SubData(Data):
        def __init__(self, batch_size: int = 8, extra: int = 0):
            super().__init__(batch_size)
            self.save_hyperparameters()

    made = {}
    for cls in (Base, Sub, Injected, Quiet, Picky, Data, SubData):
        cls.__name__ = cls.__qualname__ = prefix + cls.__name__
        made[cls.__name__[1:]] = cls
        globals()[cls.__name__] = cls
    return made


FAMILIES = {"lightning": family("L", L.LightningModule, L.LightningDataModule),
            "tasktrain": family("T", tasktrain.TaskModule, tasktrain.DataModule)}
BASES = {"lightning": (L.LightningModule, L.LightningDataModule), "tasktrain": (tasktrain.TaskModule, tasktrain.DataModule)}
PREFIX = {"lightning": "L", "tasktrain": "T"}
INSTANTIATORS = {"lightning.pytorch.cli.instantiate_module", "tasktrain.cli.instantiate_module"}


def cli_class(lib):
    if lib == "lightning":
        from lightning.pytorch.cli import LightningCLI

        return LightningCLI
    from tasktrain.cli import TaskCLI

    return TaskCLI


def plain(value, lib):
    """`value` with what differs by library alone made the same: the instantiator's name, the class paths."""
    if isinstance(value, dict):
        return {k: plain(v, lib) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, lib) for v in value]
    if value in INSTANTIATORS:
        return "<instantiator>"
    if isinstance(value, str) and value.startswith(f"{__name__}.{PREFIX[lib]}"):
        return value[len(__name__) + 2:]
    return value


def linking(base):
    """A CLI subclass that links the DataModule's `width` to the model's `hidden` when both are built."""

    class Linking(base):
        def add_arguments_to_parser(self, parser):
            parser.link_arguments("data.width", "model.init_args.hidden", apply_on="instantiate")

    return Linking


def fit(lib, folder, model, data, args, cli=None, **cli_kwargs):
    """Run `fit` with the CLI of `lib` (or `cli`) on `args` (two steps, a CSVLogger), save a checkpoint: the CLI, its
    path, the hyper-parameters the logger wrote."""
    classes = FAMILIES[lib]
    os.makedirs(folder)
    cli = (cli or cli_class(lib))(
        model if model is None else classes[model], classes[data], args=[
            "fit", *args, "--trainer.max_steps=2", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false", "--trainer.enable_checkpointing=false",
            "--trainer.accelerator=cpu", "--trainer.devices=1", "--seed_everything=1",
            "--trainer.logger=CSVLogger", f"--trainer.logger.save_dir={folder}",
            f"--trainer.default_root_dir={folder}"], **cli_kwargs)
    ckpt = os.path.join(folder, "last.ckpt")
    cli.trainer.save_checkpoint(ckpt)
    with open(os.path.join(cli.trainer.logger.log_dir, "hparams.yaml")) as f:
        logged = yaml.safe_load(f) or {}
    return cli, ckpt, logged


def loaded(cls, ckpt, reference=None, **overrides):
    """(the class built, its hparams) of cls.load_from_checkpoint(ckpt); its weights must be the reference's. (An
    nn.Module argument is left out of the hparams: Lightning's frame-read save_hyperparameters keeps it, tasktrain's
    does not, a kept difference of docs/module.md.)"""
    built = cls.load_from_checkpoint(ckpt, **overrides)
    if reference is not None:
        mine, theirs = built.state_dict(), reference.state_dict()
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    return type(built).__name__[1:], {k: v for k, v in built.hparams.items() if not isinstance(v, torch.nn.Module)}


def runs(lib, tmp_path):
    """Every case under one library, as plain data to compare with the other's."""
    classes, (module_base, data_base) = FAMILIES[lib], BASES[lib]
    out = {}
    subclass_args = [f"--model={__name__}.{PREFIX[lib]}Sub", "--model.hidden=3", "--model.scale=2.5",
                     f"--data={__name__}.{PREFIX[lib]}SubData", "--data.extra=5"]
    # subclass mode: the base classes rebuild the subclass the command line named where Lightning's do
    cli, ckpt, logged = fit(lib, tmp_path / lib / "subclass", "Base", "Data", subclass_args,
                            subclass_mode_model=True, subclass_mode_data=True)
    raw = torch.load(ckpt, weights_only=True)
    out["subclass"] = {
        "model_hparams": dict(cli.model.hparams), "data_hparams": dict(cli.datamodule.hparams),
        "saved": raw["hyper_parameters"], "saved_data": raw["datamodule_hyper_parameters"],
        "hparams_name": raw["hparams_name"], "logged": logged,
        "loads": [loaded(cls, ckpt, cli.model) for cls in (module_base, classes["Base"], classes["Sub"])],
        "data_loads": [loaded(cls, ckpt) for cls in (data_base, classes["Data"], classes["SubData"])],
        "override": loaded(module_base, ckpt, cli.model, scale=0.5),
    }
    # `test --ckpt_path` with the base class on the command line: the checkpoint's class and arguments are parsed
    # into the config (LightningCLI's _parse_ckpt_path), so the model built is the one trained
    tested = cli_class(lib)(classes["Base"], classes["Data"], subclass_mode_model=True, subclass_mode_data=True, args=[
        "test", f"--model={__name__}.{PREFIX[lib]}Base", f"--data={__name__}.{PREFIX[lib]}Data", f"--ckpt_path={ckpt}",
        "--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        "--trainer.accelerator=cpu", "--trainer.devices=1", f"--trainer.default_root_dir={tmp_path / lib / 'tested'}"])
    with open(tmp_path / lib / "tested" / "config.yaml") as f:
        saved_config = yaml.safe_load(f)
    out["tested"] = {"model": [type(tested.model).__name__[1:], dict(tested.model.hparams)],
                     "config_model": saved_config["model"], "metrics": sorted(tested.trainer.callback_metrics),
                     "loss": round(float(tested.trainer.callback_metrics["test_loss"]), 5)}
    # the same with load_from_checkpoint_support=False: what __init__ received, nothing more
    cli, ckpt, logged = fit(lib, tmp_path / lib / "unsupported", "Base", "Data", subclass_args,
                            subclass_mode_model=True, subclass_mode_data=True, load_from_checkpoint_support=False)
    out["unsupported"] = {"saved": torch.load(ckpt, weights_only=True)["hyper_parameters"], "logged": logged,
                          "loads": [loaded(cls, ckpt) for cls in (classes["Base"], classes["Sub"])]}
    # class mode: recorded too (no class path), rebuilt through the instantiator
    cli, ckpt, logged = fit(lib, tmp_path / lib / "class", "Base", "Data", ["--model.hidden=3"])
    out["class"] = {"saved": torch.load(ckpt, weights_only=True)["hyper_parameters"], "logged": logged,
                    "loads": [loaded(classes["Base"], ckpt, cli.model)]}
    # a value a link gave when the classes were built is the one recorded
    cli, ckpt, logged = fit(lib, tmp_path / lib / "linked", "Base", "Data", [f"--model={__name__}.{PREFIX[lib]}Sub"],
                            cli=linking(cli_class(lib)), subclass_mode_model=True)
    out["linked"] = {"saved": torch.load(ckpt, weights_only=True)["hyper_parameters"], "logged": logged,
                     "loads": [loaded(module_base, ckpt, cli.model)]}
    # an injected nn.Module: kept as its config, built again on load
    cli, ckpt, logged = fit(lib, tmp_path / lib / "injected", None, "Data", [
        f"--model={__name__}.{PREFIX[lib]}Injected", "--model.encoder=torch.nn.Linear",
        "--model.encoder.in_features=4", "--model.encoder.out_features=3", "--model.lr=0.2"])
    built = module_base.load_from_checkpoint(ckpt)
    out["injected"] = {"saved": torch.load(ckpt, weights_only=True)["hyper_parameters"], "logged": logged,
                       "loads": [loaded(module_base, ckpt, cli.model)],
                       "encoder": [type(built.encoder).__name__, built.encoder.in_features,
                                   built.encoder.out_features]}
    # save_hyperparameters not called, or called with one name: nothing recorded, or that name alone
    for name in ("Quiet", "Picky"):
        cli, ckpt, logged = fit(lib, tmp_path / lib / name, None, "Data",
                                [f"--model={__name__}.{PREFIX[lib]}{name}", "--model.hidden=3", "--model.scale=2.0"]
                                if name == "Picky" else [f"--model={__name__}.{PREFIX[lib]}{name}",
                                                         "--model.hidden=3"])
        out[name] = {"saved": torch.load(ckpt, weights_only=True).get("hyper_parameters"), "logged": logged,
                     "loads": [loaded(classes[name], ckpt, cli.model, **({"hidden": 3} if name == "Quiet" else {}))]}
    return plain(out, lib)


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("cli_ckpt")
    return {lib: runs(lib, tmp_path) for lib in ("lightning", "tasktrain")}


def test_subclass_mode_records_the_class_and_the_base_classes_rebuild_it_as_lightnings(both):
    ours, theirs = both["tasktrain"]["subclass"], both["lightning"]["subclass"]
    assert ours == theirs
    expected = {"_class_path": "Sub", "hidden": 3, "scale": 2.5, "_instantiator": "<instantiator>"}
    assert ours["model_hparams"] == ours["saved"] == expected and ours["hparams_name"] == "kwargs"
    assert ours["saved_data"] == {"_class_path": "SubData", "batch_size": 8, "extra": 5,
                                  "_instantiator": "<instantiator>"}
    # TaskModule / DataModule (Lightning's take **kwargs) rebuild the subclass, with its arguments; a base class whose
    # __init__ names its own arguments gets those alone and builds itself, as Lightning's does
    assert ours["loads"] == [["Sub", {"hidden": 3, "scale": 2.5}], ["Base", {"hidden": 3}],
                             ["Sub", {"hidden": 3, "scale": 2.5}]]
    assert ours["data_loads"] == [["SubData", {"batch_size": 8, "extra": 5}], ["Data", {"batch_size": 8}],
                                  ["SubData", {"batch_size": 8, "extra": 5}]]
    assert ours["override"] == ["Sub", {"hidden": 3, "scale": 0.5}]


def test_test_with_a_ckpt_path_builds_the_class_the_checkpoint_recorded_as_lightnings(both):
    ours = both["tasktrain"]["tested"]
    assert ours == both["lightning"]["tested"]
    assert ours["model"] == ["Sub", {"_class_path": "Sub", "hidden": 3, "scale": 2.5, "_instantiator": "<instantiator>"}]
    assert ours["config_model"] == {"class_path": "Sub", "init_args": {"hidden": 3, "scale": 2.5}}
    assert ours["metrics"] == ["test_loss"]


def test_logged_hyperparameters_leave_the_class_path_out_as_lightnings(both):
    """Lightning's _log_hyperparams leaves "_class_path" out of what the loggers get, and logs "_instantiator" (2.6.6:
    lightning/pytorch/loggers/utilities.py filters "_class_path" alone): tasktrain the same."""
    for case in ("subclass", "class", "injected"):
        assert both["tasktrain"][case]["logged"] == both["lightning"][case]["logged"], case
    logged = both["tasktrain"]["subclass"]["logged"]
    assert logged == {"hidden": 3, "scale": 2.5, "batch_size": 8, "extra": 5, "_instantiator": "<instantiator>"}


def test_class_mode_links_an_injected_module_and_save_hyperparameters_calls_as_lightnings(both):
    for case in ("class", "linked", "injected", "Quiet", "Picky"):
        assert both["tasktrain"][case] == both["lightning"][case], case
    ours = both["tasktrain"]
    assert ours["linked"]["saved"] == {"_class_path": "Sub", "hidden": 5, "scale": 1.0, "_instantiator": "<instantiator>"}
    assert ours["linked"]["loads"] == [["Sub", {"hidden": 5, "scale": 1.0}]]
    assert ours["class"]["saved"] == {"hidden": 3, "_instantiator": "<instantiator>"}
    assert ours["class"]["loads"] == [["Base", {"hidden": 3}]]
    # the encoder is kept as its config (plain data a weights_only load reads) and built again on load
    encoder = ours["injected"]["saved"]["encoder"]
    assert encoder["class_path"] == "torch.nn.Linear" and encoder["init_args"]["out_features"] == 3
    assert ours["injected"]["encoder"] == ["Linear", 4, 3]
    assert ours["injected"]["loads"][0][0] == "Injected"
    # no save_hyperparameters: no key in the checkpoint, the DataModule's alone logged
    assert ours["Quiet"]["saved"] is None
    assert ours["Quiet"]["logged"] == {"batch_size": 8, "_instantiator": "<instantiator>"}
    assert ours["Picky"]["saved"] == {"hidden": 3}  # the names asked for, without the class path and instantiator


def test_load_from_checkpoint_support_false_records_what_init_received(both):
    ours = both["tasktrain"]["unsupported"]
    assert ours == both["lightning"]["unsupported"]
    assert ours["saved"] == {"hidden": 3, "scale": 2.5}
    assert ours["loads"] == [["Base", {"hidden": 3}], ["Sub", {"hidden": 3, "scale": 2.5}]]


# -- the trust rule: a checkpoint chooses no code ------------------------------------------------------------------

@pytest.fixture
def hostile_module(tmp_path, monkeypatch):
    """A module on sys.path that, imported, writes a marker file and defines a TaskModule subclass: the name of the
    module, the marker's path."""
    name = f"hostile_{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "import tasktrain\n"
        "class Evil(tasktrain.TaskModule):\n"
        "    def __init__(self, hidden: int = 4):\n"
        "        super().__init__()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, marker
    sys.modules.pop(name, None)


def checkpoint_with(tmp_path, hparams, key="hyper_parameters"):
    path = tmp_path / f"crafted_{uuid.uuid4().hex[:6]}.ckpt"
    torch.save({"state_dict": {}, key: hparams, "pytorch-lightning_version": "2.6.6"}, path)
    return path


@pytest.mark.parametrize("lib", ["lightning", "tasktrain"])
def test_an_instantiator_off_the_allow_list_is_refused_unimported(lib, tmp_path, hostile_module):
    name, marker = hostile_module
    module_base, data_base = BASES[lib]
    ckpt = checkpoint_with(tmp_path, {"_instantiator": f"{name}.run", "hidden": 3})
    with pytest.raises(ValueError, match="not in the allowlist" if lib == "lightning" else "not one of"):
        module_base.load_from_checkpoint(ckpt, strict=False)
    ckpt = checkpoint_with(tmp_path, {"_instantiator": f"{name}.run"}, key="datamodule_hyper_parameters")
    with pytest.raises(ValueError, match="not in the allowlist" if lib == "lightning" else "not one of"):
        data_base.load_from_checkpoint(ckpt)
    assert not marker.exists() and name not in sys.modules


@pytest.mark.parametrize("lib", ["lightning", "tasktrain"])
def test_a_class_path_not_an_imported_subclass_is_refused_unimported(lib, tmp_path, hostile_module):
    name, marker = hostile_module
    module_base = BASES[lib][0]
    allowed = "lightning.pytorch.cli.instantiate_module" if lib == "lightning" else "tasktrain.cli.instantiate_module"
    for class_path in (f"{name}.Evil", "collections.OrderedDict", f"{__name__}.{PREFIX[lib]}Data"):
        ckpt = checkpoint_with(tmp_path, {"_instantiator": allowed, "_class_path": class_path})
        with pytest.raises(ValueError, match="already imported subclass" if lib == "lightning"
                           else "not a subclass of .* in a module already imported"):
            module_base.load_from_checkpoint(ckpt, strict=False)
    assert not marker.exists() and name not in sys.modules


def test_lightnings_instantiator_name_is_allowed_and_builds_the_class(tmp_path):
    """A checkpoint LightningCLI wrote names lightning.pytorch.cli.instantiate_module: tasktrain's stands for it
    (tasktrain's package never imports Lightning)."""
    ckpt = checkpoint_with(tmp_path, {"_instantiator": "lightning.pytorch.cli.instantiate_module",
                                      "_class_path": f"{__name__}.TSub", "hidden": 2, "scale": 3.0})
    built = tasktrain.TaskModule.load_from_checkpoint(ckpt, strict=False)
    assert type(built) is FAMILIES["tasktrain"]["Sub"] and dict(built.hparams) == {"hidden": 2, "scale": 3.0}


def test_a_ckpt_path_naming_a_class_not_imported_stops_the_cli_unimported(tmp_path, hostile_module, capsys):
    """Stricter than Lightning, whose CLI imports the class a --ckpt_path's hyper-parameters name: TaskCLI refuses,
    and says to give the class on the command line."""
    from tasktrain.cli import TaskCLI

    name, marker = hostile_module
    ckpt = checkpoint_with(tmp_path, {"_instantiator": "tasktrain.cli.instantiate_module",
                                      "_class_path": f"{name}.Evil", "hidden": 3})
    with pytest.raises(SystemExit):
        TaskCLI(TBase, TData, subclass_mode_model=True, args=["test", f"--model={__name__}.TBase",
                                                              f"--ckpt_path={ckpt}", "--trainer.logger=false"])
    err = capsys.readouterr().err
    assert "Parsing of ckpt_path hyperparameters failed!" in err and f"names ['{name}'], which is not imported" in err
    assert not marker.exists() and name not in sys.modules


def test_a_nested_class_in_a_module_not_imported_is_refused_unimported(tmp_path, hostile_module):
    """Stricter than Lightning (whose parser imports a nested class_path's module): no module any string of the
    checkpoint's hyper-parameters names is imported while they are parsed and built."""
    name, marker = hostile_module
    ckpt = checkpoint_with(tmp_path, {"_instantiator": "tasktrain.cli.instantiate_module",
                                      "_class_path": f"{__name__}.TInjected",
                                      "encoder": {"class_path": f"{name}.Evil", "init_args": {}}})
    with pytest.raises(ValueError, match=f"name \\['{name}'.*nothing was imported or built"):
        tasktrain.TaskModule.load_from_checkpoint(ckpt, strict=False)
    assert not marker.exists() and name not in sys.modules
    # the same checkpoint naming an imported class loads
    ckpt = checkpoint_with(tmp_path, {"_instantiator": "tasktrain.cli.instantiate_module",
                                      "_class_path": f"{__name__}.TInjected",
                                      "encoder": {"class_path": "torch.nn.Linear",
                                                  "init_args": {"in_features": 4, "out_features": 2}}})
    built = tasktrain.TaskModule.load_from_checkpoint(ckpt, strict=False)
    assert type(built.encoder) is torch.nn.Linear and built.encoder.out_features == 2
