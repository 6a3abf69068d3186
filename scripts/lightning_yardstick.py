"""The yardstick: Lightning's own test suite (tests/tests_pytorch at a tag of Lightning-AI/pytorch-lightning) run
against tasktrain, its imports renamed as docs/lightning.md tells a user to rename them, to see where tasktrain
behaves differently from Lightning. Not part of `make test`; the tests are extracted at build time and never kept in
this repository.

    # the Lightning repository, as a bare git dir (the session's fetch tool, or a clone):
    #   git clone --bare https://github.com/Lightning-AI/pytorch-lightning /work/.mirror/Lightning-AI+pytorch-lightning/repo
    PY=/work/main/.venv/bin/python
    $PY scripts/lightning_yardstick.py build                      # -> /work/ltests (tag 2.6.5)
    $PY scripts/lightning_yardstick.py run callbacks checkpointing/test_model_checkpoint.py trainer/flags
    $PY scripts/lightning_yardstick.py table                      # the counts in /work/ltests/results.json
    $PY scripts/lightning_yardstick.py failures core/test_saving.py   # each failing test and its first error line

build: `git archive <tag> tests/tests_pytorch tests/legacy` into OUT/tests/; then every .py file there has its
imports renamed name by name (the rule of docs/lightning.md): `from lightning.pytorch.a.b import X` (or
pytorch_lightning.a.b) becomes `from tasktrain.a.b import X` where tasktrain.a.b imports and has X, with
LightningModule -> TaskModule, LightningDataModule -> DataModule, LightningCLI -> TaskCLI (imported `as` the Lightning
name, so the test's code is untouched); a name tasktrain lacks stays on Lightning, in an import of its own.
A Fabric name (`from lightning.fabric.a.b import X`) comes from tasktrain.a.b where tasktrain has it there (as
docs/lightning.md renames lightning.fabric.utilities.spike), or where lightning.pytorch re-exports Fabric's very
object (PossibleUserWarning, TorchCheckpointIO, the cluster environments) and tasktrain has that lightning.pytorch
path; else it stays Fabric's. `__version__`, which the tests compare with a checkpoint's "pytorch-lightning_version", is the Lightning layout
version tasktrain writes there (tasktrain.checkpoint_io.LIGHTNING_LAYOUT_VERSION; docs/lightning.md).
`import lightning.pytorch as pl` (or `import lightning.pytorch.a.b as m`) becomes `import tasktrain as pl` where every
`pl.NAME` the file uses resolves on tasktrain (`pl.LightningModule` is rewritten `pl.TaskModule`); otherwise it stays.
PyTorchProfiler's record names ("[pl][profile]<action>", "[pl][module]<class>: <name>": a string that begins so) are
renamed "[tasktrain]...", as docs/lightning.md's table renames them. A string that is a whole dotted path on
Lightning ("lightning.pytorch.loggers.mlflow._MLFLOW_AVAILABLE" in mock.patch, a logger name in caplog) becomes the tasktrain path where that path resolves on tasktrain. Plain
`import lightning.pytorch` and everything under lightning.fabric / lightning_utilities stay Lightning's. What stayed
on Lightning is written to OUT/RENAMES.txt (name, then the files). Lightning's helpers (tests_pytorch/helpers:
BoringModel from demos.boring_classes, ...) are renamed the same way, so they come from tasktrain where tasktrain has
them. Lightning's conftest.py is replaced by ours (scripts/lightning_yardstick/conftest.py: the same fixtures, written
for both packages) and OUT/tests/pytest.ini by ours (Lightning's pytest options).

run: each test file under the given files/folders (relative to OUT/tests/tests_pytorch) runs in its own pytest, one
after the other, xdist off, with `--timeout` per test and a wall limit per file; the failed/ran/skipped counts per
file and each failure's first line are merged into OUT/results.json (or --results) and printed as a table. `ran`
counts tests that were not skipped (errors in set-up count as failed).

The interpreter is the one that runs this script (tasktrain and Lightning must both import in it): use the project's
venv. The tests run with PYTHONPATH=OUT/tests:<this repo>, so they exercise this checkout's tasktrain.
"""
import argparse
import ast
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import io
import time
import xml.etree.ElementTree as ET

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STANDIN = os.path.join(REPO_ROOT, "scripts", "lightning_yardstick")
DEFAULT_OUT = "/work/ltests"
DEFAULT_MIRROR = "/work/.mirror/Lightning-AI+pytorch-lightning/repo"
DEFAULT_TAG = "2.6.5"
LIGHTNING_PACKAGES = ("lightning.pytorch", "pytorch_lightning", "lightning.fabric")
NAME_RENAMES = {"LightningModule": "TaskModule", "LightningDataModule": "DataModule", "LightningCLI": "TaskCLI"}
# Lightning's tests read `__version__` as the "pytorch-lightning_version" a checkpoint file holds; tasktrain's files
# hold the Lightning layout they follow there (docs/lightning.md), not tasktrain's own __version__.
SPECIAL = {"__version__": ("tasktrain.checkpoint_io", "LIGHTNING_LAYOUT_VERSION")}
# PyTorchProfiler's record names: "[pl][profile]<action>", "[pl][module]<class>: <name>" are "[tasktrain]..." here
# (docs/lightning.md's rename table), so a string that begins with one is renamed
PROFILER_RECORD_PREFIXES = ("[pl][profile]", "[pl][module]")
DOTTED = re.compile(r"(lightning\.pytorch|pytorch_lightning|lightning\.fabric)(\.[A-Za-z_][A-Za-z0-9_]*)*")

PYTEST_INI = """\
# written by scripts/lightning_yardstick.py build: Lightning's pytest options (its pyproject.toml at the tag)
[pytest]
addopts = --strict-markers --disable-pytest-warnings -p no:cacheprovider
markers =
    cloud: Run the cloud tests for example
    flaky: pytest-rerunfailures' mark in Lightning's CI (not installed here: no reruns)
filterwarnings =
    error::FutureWarning
    ignore::FutureWarning:onnxscript
    ignore:You are using `torch.load` with `weights_only=False`.*:FutureWarning
    ignore::FutureWarning:torch.distributed.algorithms.ddp_comm_hooks
    ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated.*:FutureWarning
xfail_strict = true
junit_duration_report = call
"""


# ----------------------------------------------------------------------------------------------------------- names

def _tasktrain_module_name(lightning_module):
    """lightning.pytorch.a.b / pytorch_lightning.a.b / lightning.fabric.a.b -> tasktrain.a.b (None for anything
    else)."""
    for package in LIGHTNING_PACKAGES:
        if lightning_module == package:
            return "tasktrain"
        if lightning_module.startswith(package + "."):
            return "tasktrain" + lightning_module[len(package):]
    return None


_MODULES = {}


def _fabric_reexport(fabric_module, name):
    """For `from lightning.fabric.a.b import N` where tasktrain has no tasktrain.a.b.N: the tasktrain module that has
    N where lightning.pytorch re-exports Fabric's very object (at lightning.pytorch.a.b or a package above it:
    PossibleUserWarning at lightning.pytorch.utilities.warnings, TorchCheckpointIO at lightning.pytorch.plugins), else
    None."""
    if not fabric_module.startswith("lightning.fabric"):
        return None
    try:
        value = getattr(importlib.import_module(fabric_module), name)
    except Exception:  # noqa: BLE001 - a name the installed Fabric lacks stays as it is
        return None
    parts = fabric_module.split(".")[2:]
    for cut in range(len(parts), -1, -1):
        lightning_module = ".".join(["lightning", "pytorch", *parts[:cut]])
        try:
            reexported = getattr(importlib.import_module(lightning_module), name, None) is value
        except Exception:  # noqa: BLE001
            continue
        target = _tasktrain_module_name(lightning_module)
        if reexported and _attribute(target, name):
            return target
    return None


def _import(name):
    """The tasktrain module `name`, or None where it does not import."""
    if name not in _MODULES:
        try:
            _MODULES[name] = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module that does not import is a module tasktrain does not have
            _MODULES[name] = None
    return _MODULES[name]


def _attribute(module_name, name):
    """True where tasktrain's `module_name` has `name` (an attribute or a submodule)."""
    module = _import(module_name)
    if module is None:
        return False
    try:
        getattr(module, name)
        return True
    except AttributeError:
        return _import(f"{module_name}.{name}") is not None


def _resolve_dotted(path):
    """The tasktrain spelling of a dotted Lightning path when it resolves on tasktrain (the longest importable module,
    then attributes), else None."""
    target = _tasktrain_module_name(path)
    if target is None:
        return None
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        module = _import(".".join(parts[:cut]))
        if module is None:
            continue
        value = module
        for attr in parts[cut:]:
            try:
                value = getattr(value, attr)
            except AttributeError:
                return None
        return target
    return None


# ----------------------------------------------------------------------------------------------------------- rename

def _alias_text(name, asname):
    return f"{name} as {asname}" if asname and asname != name else name


def _rename_source(source, left, filename):
    """`source` with its Lightning imports renamed where tasktrain has the names; what stayed is added to `left`
    ({"module.name": set(files)})."""
    tree = ast.parse(source)
    lines = source.encode().splitlines(keepends=True)
    edits = []  # (line, col, end_line, end_col, text): 1-based lines, byte columns

    def keep(what):
        left.setdefault(what, set()).add(filename)

    def replace_statement(node, statements):
        prefix = lines[node.lineno - 1][:node.col_offset]
        joiner = "\n" + prefix.decode() if not prefix.strip() else "; "
        edits.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, joiner.join(statements)))

    # attribute uses per alias of a plain module import, for `import lightning.pytorch as pl`
    uses = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            uses.setdefault(node.value.id, []).append(node)

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            target = _tasktrain_module_name(node.module)
            if target is None or any(alias.name == "*" for alias in node.names):
                continue
            moved, kept = {}, []  # moved: {tasktrain module: [names]}
            for alias in node.names:
                name = NAME_RENAMES.get(alias.name, alias.name)
                where = target if _attribute(target, name) else _fabric_reexport(node.module, alias.name)
                if alias.name in SPECIAL:
                    where, name = SPECIAL[alias.name]
                if where is None:
                    kept.append(_alias_text(alias.name, alias.asname))
                    keep(f"{node.module}.{alias.name}")
                else:
                    moved.setdefault(where, []).append(_alias_text(name, alias.asname or alias.name))
            if not moved:
                continue
            statements = [f"from {where} import {', '.join(names)}" for where, names in moved.items()]
            if kept:
                statements.append(f"from {node.module} import {', '.join(kept)}")
            replace_statement(node, statements)
        elif isinstance(node, ast.Import):
            if len(node.names) != 1 or not node.names[0].asname:
                for alias in node.names:
                    if _tasktrain_module_name(alias.name):
                        keep(f"import {alias.name}")
                continue
            alias = node.names[0]
            target = _tasktrain_module_name(alias.name)
            if target is None:
                continue
            attributes = uses.get(alias.asname, [])
            missing = [a.attr for a in attributes if not _attribute(target, NAME_RENAMES.get(a.attr, a.attr))]
            if _import(target) is None or missing:
                keep(f"import {alias.name} as {alias.asname} (uses {', '.join(sorted(set(missing))) or 'the module'})")
                continue
            replace_statement(node, [f"import {target} as {alias.asname}"])
            for attribute in attributes:
                if attribute.attr in NAME_RENAMES:
                    end = attribute.end_col_offset
                    edits.append((attribute.end_lineno, end - len(attribute.attr), attribute.end_lineno, end,
                                  NAME_RENAMES[attribute.attr]))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                node.value.startswith(PROFILER_RECORD_PREFIXES):
            text = lines[node.lineno - 1][node.col_offset:node.end_col_offset].decode()
            if node.lineno == node.end_lineno and text[:1] in "'\"" and text[1:].startswith("[pl]["):
                edits.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset,
                              text[0] + "[tasktrain]" + text[5:]))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.fullmatch(node.value):
            target = _resolve_dotted(node.value)
            if target is None:
                keep(f'"{node.value}"')
                continue
            text = lines[node.lineno - 1][node.col_offset:node.end_col_offset].decode()
            if node.lineno != node.end_lineno or len(text) < 2 or text[0] not in "'\"" or text[-1] != text[0]:
                continue  # a string split over lines or concatenated: left as it is
            edits.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset,
                          text[0] + target + text[0]))

    for line, col, end_line, end_col, text in sorted(edits, reverse=True):
        head = lines[line - 1][:col]
        tail = lines[end_line - 1][end_col:]
        lines[line - 1:end_line] = [head + text.encode() + tail]
    return b"".join(lines).decode()


def build(args):
    out = os.path.abspath(args.out)
    tests = os.path.join(out, "tests")
    if os.path.exists(tests):
        shutil.rmtree(tests)
    os.makedirs(tests)
    # tests/legacy: the list of Lightning versions test_legacy_checkpoints reads (their checkpoint files are not in
    # the repository: CI downloads them, and without them those tests have nothing to load)
    archive = subprocess.run(["git", "--git-dir", args.mirror, "archive", args.tag, "tests/tests_pytorch",
                              "tests/legacy"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith("tests/")]
        for member in members:
            member.name = member.name[len("tests/"):]
        tar.extractall(tests, members=members, filter="data")
    root = os.path.join(tests, "tests_pytorch")

    sys.path.insert(0, REPO_ROOT)  # tasktrain as this checkout has it: the names are looked up there
    left = {}
    renamed = 0
    for folder, _, files in os.walk(root):
        for file in sorted(files):
            if not file.endswith(".py"):
                continue
            path = os.path.join(folder, file)
            relative = os.path.relpath(path, root)
            if relative == "conftest.py":
                continue  # replaced by ours below
            with open(path, encoding="utf-8") as f:
                source = f.read()
            try:
                new = _rename_source(source, left, relative)
            except SyntaxError as error:
                print(f"not renamed (does not parse here): {relative}: {error}", file=sys.stderr)
                continue
            if new != source:
                renamed += 1
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)

    shutil.copy(os.path.join(STANDIN, "conftest.py"), os.path.join(root, "conftest.py"))
    with open(os.path.join(tests, "pytest.ini"), "w") as f:
        f.write(PYTEST_INI)
    with open(os.path.join(out, "RENAMES.txt"), "w") as f:
        f.write(f"# Lightning {args.tag}'s tests: names left on Lightning (tasktrain has no such name), with the "
                f"files that use them; {renamed} files renamed. Written by scripts/lightning_yardstick.py build.\n")
        for what in sorted(left):
            f.write(f"{what}\t{', '.join(sorted(left[what]))}\n")
    print(f"built {root}: {renamed} files renamed, {len(left)} names left on Lightning ({out}/RENAMES.txt)")


# ----------------------------------------------------------------------------------------------------------- run

def _test_files(root, paths):
    """The test files under `paths`. A folder's test_legacy_checkpoints.py is left out where Lightning's legacy
    checkpoint files are missing (its CI downloads them into tests/legacy/checkpoints; they are not in the
    repository): each of its tests would fail on "No checkpoints found". Named as a file, it runs."""
    files = []
    legacy = os.path.join(os.path.dirname(root), "legacy", "checkpoints")
    has_legacy = os.path.isdir(legacy) and any(n != ".gitkeep" for n in os.listdir(legacy))
    for path in paths:
        full = path if os.path.isabs(path) else os.path.join(root, path)
        if os.path.isdir(full):
            for folder, _, names in sorted(os.walk(full)):
                for name in sorted(names):
                    if name == "test_legacy_checkpoints.py" and not has_legacy:
                        print(f"left out: {os.path.relpath(os.path.join(folder, name), root)} (no legacy checkpoint "
                              f"files in {legacy})")
                    elif name.startswith("test_") and name.endswith(".py"):
                        files.append(os.path.join(folder, name))
        elif os.path.isfile(full):
            files.append(full)
        else:
            raise SystemExit(f"no such test file or folder: {full} (paths are relative to {root})")
    return files


def _read_junit(path):
    """(failed, ran, skipped, failures) from a junit xml; failures: [(test id, first line of the error)]."""
    failed = ran = skipped = 0
    failures = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name')}"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if case.find("skipped") is not None and bad is None:
            skipped += 1
            continue
        ran += 1
        if bad is not None:
            failed += 1
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            failures.append([name, message[0][:300] if message else ""])
    return failed, ran, skipped, failures


def run(args):
    out = os.path.abspath(args.out)
    tests = os.path.join(out, "tests")
    root = os.path.join(tests, "tests_pytorch")
    if not os.path.isdir(root):
        raise SystemExit(f"{root} is missing: run `{sys.argv[0]} build` first")
    results_path = args.results or os.path.join(out, "results.json")
    results = {}
    if os.path.exists(results_path):
        with open(results_path) as f:
            results = json.load(f)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([tests, REPO_ROOT])
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.normpath(os.path.join(sys.prefix, "..", ".cache", "torch_extensions")))
    ran_now = []
    for file in _test_files(root, args.paths):
        relative = os.path.relpath(file, root)
        junit = os.path.join(out, "junit", relative.replace(os.sep, "__") + ".xml")
        os.makedirs(os.path.dirname(junit), exist_ok=True)
        if os.path.exists(junit):
            os.remove(junit)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "--timeout", str(args.timeout),
                   f"--junitxml={junit}", os.path.relpath(file, tests)] + args.pytest_args
        start = time.time()
        try:
            proc = subprocess.run(command, cwd=tests, env=env, capture_output=True, text=True,
                                  timeout=args.file_timeout)
            tail = proc.stdout[-3000:]
        except subprocess.TimeoutExpired:
            tail = f"the file ran past --file-timeout {args.file_timeout} s"
        seconds = round(time.time() - start, 1)
        if os.path.exists(junit):
            failed, ran, skipped, failures = _read_junit(junit)
            entry = {"failed": failed, "ran": ran, "skipped": skipped, "seconds": seconds, "failures": failures}
        else:
            entry = {"failed": None, "ran": None, "skipped": None, "seconds": seconds, "failures": [],
                     "error": tail[-1500:]}
        results[relative] = entry
        ran_now.append(relative)
        print(f"{relative}: {_counts(entry)} ({seconds} s)", flush=True)
        with open(results_path, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    _print_table(results, ran_now)


def _counts(entry):
    if entry["failed"] is None:
        return "no result (" + entry.get("error", "").strip().splitlines()[-1][:120] + ")" if entry.get("error") \
            else "no result"
    return f"{entry['failed']}/{entry['ran']} failed/ran, {entry['skipped']} skipped"


def _print_table(results, files=None):
    print(f"{'file':70s} failed/ran  skipped")
    for file in files or sorted(results):
        entry = results[file]
        if entry["failed"] is None:
            print(f"{file:70s} no result")
        else:
            print(f"{file:70s} {entry['failed']:>4}/{entry['ran']:<5} {entry['skipped']:>5}")


def _load(args):
    path = args.results or os.path.join(os.path.abspath(args.out), "results.json")
    with open(path) as f:
        return json.load(f)


def table(args):
    _print_table(_load(args))


def failures(args):
    results = _load(args)
    for file in args.paths or sorted(results):
        for name, message in results[file]["failures"]:
            print(f"{name}\n    {message}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"the yardstick's folder, outside the repo ({DEFAULT_OUT})")
    parser.add_argument("--results", help="results file (default OUT/results.json)")
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build", help="extract Lightning's tests at the tag and rename their imports")
    b.add_argument("--mirror", default=DEFAULT_MIRROR, help="the Lightning repository's git dir")
    b.add_argument("--tag", default=DEFAULT_TAG)
    r = commands.add_parser("run", help="run test files/folders one pytest at a time and record the counts")
    r.add_argument("paths", nargs="+", help="files or folders, relative to OUT/tests/tests_pytorch")
    r.add_argument("--timeout", type=int, default=300, help="seconds per test (pytest-timeout)")
    r.add_argument("--file-timeout", type=int, default=3600, help="seconds per file, all its tests")
    r.add_argument("--pytest-args", nargs=argparse.REMAINDER, default=[], help="passed on to pytest (last)")
    commands.add_parser("table", help="print the counts recorded in the results file")
    f = commands.add_parser("failures", help="print the failing tests recorded for files (all by default)")
    f.add_argument("paths", nargs="*")
    args = parser.parse_args()
    {"build": build, "run": run, "table": table, "failures": failures}[args.command](args)


if __name__ == "__main__":
    main()
