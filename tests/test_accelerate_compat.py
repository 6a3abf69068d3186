"""The compatibility table of docs/accelerator.md is true: each name it calls supported (or partial) imports from
tasktrain / tasktrain.utils, or is an attribute or constructor argument of Accelerator; each one it calls refused
raises the error it names when called as shown. The names the issue requires are all in the table."""
import importlib
import inspect
import os
import re
import subprocess
import sys

import pytest

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "accelerator.md")

# Every Accelerate name the official examples use (issue 16), each of which the table must list.
REQUIRED = [
    "tasktrain.Accelerator", "tasktrain.DistributedType", "tasktrain.PartialState", "tasktrain.AcceleratorState",
    "tasktrain.DataLoaderConfiguration", "tasktrain.ProjectConfiguration", "tasktrain.GradientAccumulationPlugin",
    "tasktrain.DeepSpeedPlugin", "tasktrain.FullyShardedDataParallelPlugin", "tasktrain.InitProcessGroupKwargs",
    "tasktrain.DistributedDataParallelKwargs", "tasktrain.GradScalerKwargs", "tasktrain.AutocastKwargs",
    "tasktrain.notebook_launcher", "tasktrain.skip_first_batches", "tasktrain.find_executable_batch_size",
    "tasktrain.init_empty_weights", "tasktrain.utils.set_seed", "tasktrain.utils.find_executable_batch_size",
    "tasktrain.utils.ProjectConfiguration", "tasktrain.utils.DataLoaderConfiguration",
    "tasktrain.utils.DistributedType", "tasktrain.utils.gather", "tasktrain.utils.gather_object",
    "tasktrain.utils.broadcast", "tasktrain.utils.reduce", "tasktrain.utils.pad_across_processes",
    "tasktrain.utils.send_to_device", "tasktrain.utils.tqdm", "tasktrain.utils.LoggerType",
    "tasktrain.utils.PrecisionType", "tasktrain.utils.write_basic_config", "tasktrain.utils.wait_for_everyone",
    "tasktrain.utils.InitProcessGroupKwargs", "tasktrain.utils.DistributedDataParallelKwargs",
    "tasktrain.utils.GradScalerKwargs", "tasktrain.utils.AutocastKwargs",
] + [f"tasktrain.Accelerator.{name}" for name in (
    "distributed_type", "state", "project_dir", "logging_dir", "num_processes", "process_index",
    "local_process_index", "is_main_process", "is_local_main_process", "device", "mixed_precision",
    "use_distributed", "init_trackers", "log", "get_tracker", "end_training", "free_memory", "clear", "set_trigger",
    "check_trigger", "pad_across_processes", "split_between_processes", "on_main_process", "on_local_main_process",
    "on_process", "on_last_process", "main_process_first", "local_main_process_first", "join_uneven_inputs",
    "profile", "gather_for_metrics", "skip_first_batches", "save_state", "save_model", "register_for_checkpointing",
    "autocast", "no_sync", "accumulate", "unwrap_model", "wait_for_everyone", "print", "reduce", "gather",
    "prepare_model", "prepare_optimizer", "prepare_data_loader", "prepare_scheduler")]
CONSTRUCTOR = ["mixed_precision", "cpu", "gradient_accumulation_steps", "gradient_accumulation_plugin", "log_with",
               "project_dir", "project_config", "dataloader_config", "kwargs_handlers",
               "step_scheduler_with_optimizer", "deepspeed_plugin", "fsdp_plugin", "even_batches", "split_batches",
               "dispatch_batches", "rng_types"]


def table_rows():
    with open(DOC) as f:
        text = f.read()
    table = text[text.index("### Compatibility table"):]
    rows = []
    for line in table.splitlines():
        if not line.startswith("| ") or line.startswith("| Accelerate") or line.startswith("| ---"):
            continue
        cells = [c.strip() for c in line.strip().split("|")[1:-1]]
        assert len(cells) == 4, line
        rows.append((cells[0], re.findall(r"`([^`]+)`", cells[1]), cells[2]))
    return rows


ROWS = table_rows()


def resolve(path):
    """tasktrain.a.b.C.attr -> the object: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def namespace():
    import tasktrain
    import tasktrain.utils

    ns = {"tasktrain": tasktrain}
    ns.update({name: getattr(tasktrain, name) for name in tasktrain.__all__})
    ns.update({name: getattr(tasktrain.utils, name) for name in tasktrain.utils.__all__})
    return ns


def test_the_table_lists_every_required_name_and_argument():
    listed = {item for _, items, _ in ROWS for item in items}
    missing = [name for name in REQUIRED if name not in listed]
    assert not missing, f"docs/accelerator.md's compatibility table does not list {missing}"
    arguments = set()
    for _, items, status in ROWS:
        for item in items:
            match = re.fullmatch(r"Accelerator\.__init__\((.*)\)", item) or re.fullmatch(r"Accelerator\((\w+)=.*\)",
                                                                                          item)
            if match:
                arguments.update(a.strip() for a in match.group(1).split(","))
    assert not [a for a in CONSTRUCTOR if a not in arguments], [a for a in CONSTRUCTOR if a not in arguments]


@pytest.mark.parametrize("accelerate, items, status", [r for r in ROWS if r[2] in ("supported", "partial")],
                         ids=[r[0] for r in ROWS if r[2] in ("supported", "partial")])
def test_supported_names_import(accelerate, items, status):
    from tasktrain import Accelerator

    assert items, f"{accelerate}: no tasktrain name"
    parameters = inspect.signature(Accelerator.__init__).parameters
    for item in items:
        match = re.fullmatch(r"Accelerator\.__init__\((.*)\)", item)
        if match:
            for argument in match.group(1).split(","):
                assert argument.strip() in parameters, f"Accelerator has no argument {argument.strip()}"
            continue
        assert item.startswith("tasktrain."), item
        resolve(item)


@pytest.mark.parametrize("accelerate, items, status", [r for r in ROWS if r[2].startswith("refused")],
                         ids=[r[0] for r in ROWS if r[2].startswith("refused")])
def test_refused_names_raise_the_documented_error(accelerate, items, status):
    error = re.fullmatch(r"refused \((\w+)\)", status).group(1)
    assert len(items) == 1, items
    with pytest.raises(getattr(__builtins__, error, None) or eval(error)) as raised:
        eval(items[0], namespace())
    assert type(raised.value).__name__ == error
    assert len(str(raised.value)) > 30, "an error says what to do"


def test_instance_attributes_and_constructor_arguments_work(tmp_path):
    from tasktrain import Accelerator, DistributedType, GradientAccumulationPlugin, ProjectConfiguration

    accelerator = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=3),
                              project_config=ProjectConfiguration(project_dir=str(tmp_path)),
                              step_scheduler_with_optimizer=False, rng_types=["torch", "generator"])
    assert accelerator.sync_gradients is True and accelerator.gradient_accumulation_steps == 3
    assert accelerator.trackers == [] and accelerator.logging_dir == str(tmp_path)
    assert accelerator.distributed_type == DistributedType.NO and accelerator.state.num_processes == 1
    with pytest.raises(ValueError, match="not both"):
        Accelerator(gradient_accumulation_steps=2, gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=3))


def test_import_tasktrain_and_utils_stay_cheap():
    code = ("import sys, tasktrain, tasktrain.utils; heavy = [m for m in ('torch', 'deepspeed', 'tensorboard', "
            "'wandb', 'mlflow', 'safetensors') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
