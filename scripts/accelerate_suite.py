"""Run Accelerate's own test scripts (the ones `accelerate test` runs) one function at a time, under Accelerate or
under tasktrain, on 1 process and on 2 CPU processes, and print which pass.

    python scripts/accelerate_suite.py                        # under tasktrain, every function, 1 and 2 processes
    python scripts/accelerate_suite.py --under accelerate     # the baseline: the same functions under Accelerate
    python scripts/accelerate_suite.py --scripts test_ops --processes 2 --functions 'test_reduce_*'
    python scripts/accelerate_suite.py --results run.json --baseline scripts/accelerate_suite_baseline.json

Under tasktrain each script is copied with `accelerate` renamed to `tasktrain` in its imports (`from accelerate.utils
import X` -> `from tasktrain.utils import X`), as a user who switches would do; the fixtures it imports from
`accelerate.test_utils` (RegressionModel, RegressionDataset, ...) stay Accelerate's unless --rename-test-utils is given
(then they are tasktrain.test_utils'). Each function runs in a fresh process (or a fresh pair under
torch.distributed.run: gloo, 127.0.0.1, a free port) started on a small generated driver that imports the copied script
as a module, builds what the script's main() builds before calling it (an Accelerator, a PartialState, ...) and calls
the function as main() does. A function passes when every process exits 0 after it returned. A function main() only
runs on one process (or only on several) is reported "n/a" on the other; one whose own skip mark is set (pytest
skipif, unittest skip) is reported "skip". test_notebook's functions start their processes themselves
(notebook_launcher): they run in one plain process with ACCELERATE_NUM_PROCESSES set to the process count.

Under Accelerate the driver sets ACCELERATE_USE_CPU=yes and builds PartialState(cpu=True) first: without it Accelerate
1.15 does not form a world of two CPU processes here (docs/accelerator.md, "Accelerate's own test scripts").
"""
import argparse
import concurrent.futures
import contextlib
import fnmatch
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PASS_MARKER = "ACCELERATE_SUITE_FUNCTION_RETURNED"
SCRIPTS = ["test_script", "test_sync", "test_ops", "test_distributed_data_loop", "test_cli", "test_notebook"]

# What each script's main() builds before it calls its functions; the driver runs it first (S is the script module).
SETUP = {
    "test_script": "accelerator = S.Accelerator()",
    "test_sync": "accelerator = S.Accelerator()",
    "test_ops": "state = S.PartialState()",
    "test_distributed_data_loop": "accelerator = S.create_accelerator()\ntorch.manual_seed(accelerator.process_index)",
    "test_cli": "",
    "test_notebook": "",
}

# test_distributed_data_loop's four DataLoader variants that main() hands to test_data_loader.
_DDL_LOADERS = {
    "shuffle_false": "torch.utils.data.DataLoader(S.DummyDataset(), shuffle=False, batch_size=S.BATCH_SIZE, "
                     "num_workers=S.NUM_WORKERS)",
    "shuffle_true": "torch.utils.data.DataLoader(S.DummyDataset(), shuffle=True, batch_size=S.BATCH_SIZE, "
                    "num_workers=S.NUM_WORKERS)",
    "batch_sampler": "torch.utils.data.DataLoader(S.DummyDataset(), batch_sampler=S.BatchSampler(S.RandomSampler("
                     "S.DummyDataset()), batch_size=S.BATCH_SIZE, drop_last=False), num_workers=S.NUM_WORKERS)",
    "sampler_is_batch_sampler": "torch.utils.data.DataLoader(S.DummyDataset(), sampler=S.BatchSampler(S.RandomSampler("
                                "S.DummyDataset()), batch_size=S.BATCH_SIZE, drop_last=False), batch_size=None, "
                                "collate_fn=S.default_collate, num_workers=S.NUM_WORKERS)",
}


def _case(script, name, call, only=None, function=None, setup=None):
    """One unit: `call` is the statement main() runs (S. prefixes the script's names); `only` is "single" or
    "multi" where main() runs it on one process only or on several only; `function` names the script function whose
    skip marks apply (default: the case name up to its first '['); `setup` replaces the script's SETUP."""
    return {"script": script, "name": name, "call": call, "only": only, "function": function or name.split("[")[0],
            "setup": SETUP[script] if setup is None else setup}


# test_script's main() calls rng_sync_check() before its data loader and training checks: those rely on the torch
# RNG being the same on every process (the shuffles must agree), which is what rng_sync_check leaves behind.
_AFTER_RNG_SYNC = SETUP["test_script"] + "\nS.synchronize_rng_states(['torch'])"


def _build_cases():
    cases = []
    plain_script = ["init_state_check", "process_execution_check", "test_split_between_processes_list",
                    "test_split_between_processes_nested_dict", "test_split_between_processes_tensor",
                    "test_split_between_processes_evenly", "rng_sync_check", "dl_preparation_check",
                    "central_dl_preparation_check", "custom_sampler_check", "check_seedable_sampler",
                    "check_seedable_sampler_with_data_seed"]
    after_rng_sync = plain_script[plain_script.index("rng_sync_check") + 1:]
    for name in plain_script:
        setup = _AFTER_RNG_SYNC if name in after_rng_sync else None
        cases.append(_case("test_script", name, f"S.{name}()", setup=setup))
    cases.append(_case("test_script", "test_split_between_processes_dataset",
                       "from datasets import Dataset as datasets_Dataset\n"
                       "S.test_split_between_processes_dataset(datasets_Dataset)"))
    cases.append(_case("test_script", "check_seedable_sampler_in_batch_sampler_shard",
                       "S.check_seedable_sampler_in_batch_sampler_shard()", only="multi", setup=_AFTER_RNG_SYNC))
    for flag in (False, True):
        cases.append(_case("test_script", f"training_check[use_seedable_sampler={flag}]",
                           f"S.training_check(use_seedable_sampler={flag})", setup=_AFTER_RNG_SYNC))
    cases.append(_case("test_script", "test_trigger", "S.test_trigger()", setup=_AFTER_RNG_SYNC))
    cases.append(_case("test_script", "test_reinstantiated_state", "S.test_reinstantiated_state()",
                       setup=_AFTER_RNG_SYNC))

    cases.append(_case("test_sync", "test_dataloader_break", "S.test_dataloader_break()"))
    cases.append(_case("test_sync", "test_noop_sync", "S.test_noop_sync(accelerator)", only="single"))
    cases.append(_case("test_sync", "test_distributed_sync", "S.test_distributed_sync(accelerator)", only="multi"))
    cases.append(_case("test_sync", "test_distributed_sync_multiple_fwd",
                       "S.test_distributed_sync_multiple_fwd(accelerator)", only="multi"))
    # main() runs these combinations on multi-GPU/NPU/... only; they run here on CPU too, as what they check
    # (split_batches, dispatch_batches, sync_each_batch under accumulate) is not GPU-specific.
    for function in ("test_gradient_accumulation", "test_gradient_accumulation_with_opt_and_scheduler"):
        for split in (True, False):
            for dispatch in (True, False):
                for sync_each in (True, False):
                    label = f"{function}[split_batches={split},dispatch_batches={dispatch},sync_each_batch={sync_each}]"
                    cases.append(_case("test_sync", label, f"S.{function}({split}, {dispatch}, {sync_each})"))

    for name in ["test_gather", "test_gather_object", "test_gather_non_contiguous", "test_broadcast",
                 "test_pad_across_processes", "test_reduce_sum", "test_reduce_mean", "test_reduce_max",
                 "test_op_checker", "test_copy_tensor_to_devices"]:
        cases.append(_case("test_ops", name, f"S.{name}(state)"))

    for name in ["test_default_ensures_even_batch_sizes", "test_can_disable_even_batches",
                 "test_can_join_uneven_inputs", "test_join_can_override_even_batches",
                 "test_join_can_override_for_mixed_type_dataloaders",
                 "test_join_raises_warning_for_iterable_when_overriding_even_batches", "test_pickle_accelerator"]:
        cases.append(_case("test_distributed_data_loop", name, f"S.{name}()"))
    cases.append(_case("test_distributed_data_loop", "test_join_raises_warning_for_non_ddp_distributed",
                       "original_state = accelerator.state.distributed_type\n"
                       "accelerator.state.distributed_type = S.DistributedType.FSDP\n"
                       "S.test_join_raises_warning_for_non_ddp_distributed(accelerator)\n"
                       "accelerator.state.distributed_type = original_state"))
    for label, loader in _DDL_LOADERS.items():
        cases.append(_case("test_distributed_data_loop", f"test_data_loader[{label}]",
                           f"S.test_data_loader({loader}, accelerator)"))
    cases.append(_case("test_distributed_data_loop", "test_stateful_dataloader", "S.test_stateful_dataloader(accelerator)"))
    cases.append(_case("test_distributed_data_loop", "test_stateful_dataloader_save_state",
                       "S.test_stateful_dataloader_save_state(accelerator)"))

    cases.append(_case("test_cli", "main", "S.main()"))

    for name in ["test_can_initialize", "test_clean_cuda_fork", "test_static_rdzv_backend", "test_c10d_rdzv_backend",
                 "test_fault_tolerant", "test_monitoring", "test_problematic_imports"]:
        cases.append(_case("test_notebook", name, f"S.{name}()"))
    return cases


CASES = _build_cases()


def upstream_scripts_dir():
    """Accelerate's installed test scripts (the baseline reads them where they are; the rename copies them)."""
    import importlib.util
    spec = importlib.util.find_spec("accelerate")
    if spec is None or spec.origin is None:
        raise SystemExit("accelerate is not installed in this interpreter; it holds the scripts this harness runs "
                         "(pip install 'accelerate==1.15.*').")
    return os.path.join(os.path.dirname(spec.origin), "test_utils", "scripts")


_FROM_IMPORT = re.compile(r"^(\s*from\s+)accelerate(\.[\w.]*)?(\s+import\b)", re.MULTILINE)
_PLAIN_IMPORT = re.compile(r"^(\s*import\s+)accelerate(\.[\w.]*)?(\s*)$", re.MULTILINE)


def rename_imports(source, rename_test_utils=False):
    """The script's text with its `accelerate` imports pointing at `tasktrain`; `accelerate.test_utils...` imports
    are kept unless rename_test_utils (the fixtures then come from tasktrain.test_utils)."""
    def keep(submodule):
        return not rename_test_utils and (submodule or "").startswith(".test_utils")

    def from_import(match):
        if keep(match.group(2)):
            return match.group(0)
        return f"{match.group(1)}tasktrain{match.group(2) or ''}{match.group(3)}"

    def plain_import(match):
        if keep(match.group(2)):
            return match.group(0)
        # `import accelerate.x` binds the name `accelerate`; keep that name bound so the script's references resolve.
        return f"{match.group(1)}tasktrain{match.group(2) or ''} as accelerate{match.group(3)}" if not match.group(2) \
            else f"{match.group(1)}tasktrain{match.group(2)}{match.group(3)}"

    return _PLAIN_IMPORT.sub(plain_import, _FROM_IMPORT.sub(from_import, source))


def skip_reason_code():
    """Driver code that reports a function's own skip marks (pytest.mark.skipif / skip, unittest.skip*)."""
    return '''
def _skip_reason(fn):
    if getattr(fn, "__unittest_skip__", False):
        return getattr(fn, "__unittest_skip_why__", "unittest skip")
    for mark in getattr(fn, "pytestmark", []):
        if mark.name == "skip":
            return mark.kwargs.get("reason", "pytest skip")
        if mark.name == "skipif" and mark.args and mark.args[0]:
            return mark.kwargs.get("reason", "pytest skipif")
    return None
'''


def driver_source(case, script_path, under):
    lines = ["import importlib.util, os, sys", "import torch, torch.utils.data"]
    if under == "accelerate":
        lines += ["from accelerate import PartialState as _PartialState", "_PartialState(cpu=True)"]
    lines += [
        f"_spec = importlib.util.spec_from_file_location({case['script']!r}, {script_path!r})",
        "S = importlib.util.module_from_spec(_spec)",
        f"sys.modules[{case['script']!r}] = S",
        "_spec.loader.exec_module(S)",
        skip_reason_code(),
        f"_reason = _skip_reason(getattr(S, {case['function']!r}))",
        "if _reason:",
        "    print('ACCELERATE_SUITE_SKIPPED:', _reason, flush=True)",
        "    sys.exit(0)",
        case["setup"],
        case["call"],
        f"print({PASS_MARKER!r}, flush=True)",
    ]
    return "\n".join(lines) + "\n"


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_ERROR_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Failure)"
                         r"\b(?::.*)?)$")


def first_error_line(output):
    """The exception line of the first traceback (a child's, before the launcher's own summary), without the
    file path an ImportError names (so runs from different checkouts compare)."""
    return _IMPORT_PATH.sub("", _first_error_line(output))


_IMPORT_PATH = re.compile(r" \((?:/|[A-Za-z]:\\)[^()]*\.py\)$")


def _first_error_line(output):
    seen_traceback = False
    for line in output.splitlines():
        stripped = line.strip()
        if "Traceback (most recent call last)" in stripped:
            seen_traceback = True
            continue
        if seen_traceback and _ERROR_LINE.match(stripped):
            return _ERROR_LINE.match(stripped).group(1)[:300]
    for line in output.splitlines():
        if _ERROR_LINE.match(line.strip()):
            return _ERROR_LINE.match(line.strip()).group(1)[:300]
    tail = [line for line in output.splitlines() if line.strip()]
    return tail[-1][:300] if tail else ""


def _descendants(pid):
    """Every live process below `pid`, from /proc (torchrun's workers run in sessions of their own)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(process):
    """Stop a run past its timeout and everything it started: SIGTERM first (torchrun then stops its workers), then
    SIGKILL to whatever is left; a worker left alive would hold the output pipe open and hang the harness."""
    tree = _descendants(process.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    for pid in [process.pid] + tree + _descendants(process.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def run_case(case, processes, under, scripts_dir, workdir, timeout, rename_test_utils, repo):
    """Run one function on `processes` processes; returns its result record."""
    record = {"script": case["script"], "function": case["name"], "processes": processes, "under": under}
    timeout = case.get("timeout", timeout)  # a case may carry its own (the harness's own tests do)
    if case["only"] == "single" and processes > 1 or case["only"] == "multi" and processes == 1:
        record.update(status="n/a", error=f"main() runs it on {'one process' if case['only'] == 'single' else 'several processes'} only",
                      seconds=0.0)
        return record
    case_dir = tempfile.mkdtemp(prefix=f"{case['script']}-", dir=workdir)
    source_path = os.path.join(scripts_dir, case["script"] + ".py")
    with open(source_path) as handle:
        source = handle.read()
    if under == "tasktrain":
        source = rename_imports(source, rename_test_utils)
    script_path = os.path.join(case_dir, case["script"] + "_under_test.py")
    with open(script_path, "w") as handle:
        handle.write(source)
    driver_path = os.path.join(case_dir, "driver.py")
    with open(driver_path, "w") as handle:
        handle.write(driver_source(case, script_path, under))

    env = dict(os.environ)
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        env.pop(name, None)
    if under == "accelerate":
        env["ACCELERATE_USE_CPU"] = "yes"
    if case["script"] == "test_notebook" or processes == 1:
        # notebook_launcher starts its own processes from this one; other functions run as `python script.py`.
        env["ACCELERATE_NUM_PROCESSES"] = str(processes)
        command = [sys.executable, driver_path]
        expected_markers = 1
    else:
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}", "--nnodes=1",
                   "--master_addr=127.0.0.1", f"--master_port={free_port()}", driver_path]
        expected_markers = processes
    start = time.monotonic()
    process = subprocess.Popen(command, cwd=case_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill_tree(process)
        try:
            output, _ = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # something outside the tree still holds the pipe: report without it
            output = ""
        timed_out = True
    record["seconds"] = round(time.monotonic() - start, 1)
    skipped = re.search(r"ACCELERATE_SUITE_SKIPPED: (.*)", output)
    if timed_out:
        record.update(status="fail", error=f"timed out after {timeout} s; last line: {first_error_line(output)}")
    elif skipped and process.returncode == 0:
        record.update(status="skip", error=skipped.group(1).strip())
    elif process.returncode == 0 and output.count(PASS_MARKER) == expected_markers:
        record.update(status="pass", error="")
    else:
        record.update(status="fail", error=first_error_line(output) or f"exit status {process.returncode}")
    record["output_tail"] = output[-4000:] if record["status"] == "fail" else ""
    shutil.rmtree(case_dir, ignore_errors=True)
    return record


def run_cases(jobs, under, scripts_dir, timeout, rename_test_utils=False, repo=REPO_ROOT, parallel=1,
              progress=False, workdir=None):
    """Run each (case, processes) of `jobs`, `parallel` at a time; the records come back in the order of `jobs`.
    Each run works in a fresh folder under `workdir` (default: a temporary one, removed after)."""
    own_workdir = workdir is None
    workdir = tempfile.mkdtemp(prefix="accelerate_suite-") if own_workdir else workdir
    records = []
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            futures = [pool.submit(run_case, case, n, under, scripts_dir, workdir, timeout, rename_test_utils, repo)
                       for case, n in jobs]
            for future in futures:
                record = future.result()
                records.append(record)
                if progress:
                    print(f"[{len(records)}/{len(jobs)}] {record['script']}:{record['function']} "
                          f"x{record['processes']}: {record['status']} {record['error']}", file=sys.stderr, flush=True)
    finally:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return records


def select_cases(scripts, patterns):
    chosen = []
    for case in CASES:
        if case["script"] not in scripts:
            continue
        key = f"{case['script']}:{case['name']}"
        if patterns and not any(fnmatch.fnmatchcase(case["name"], p) or fnmatch.fnmatchcase(key, p) for p in patterns):
            continue
        chosen.append(case)
    return chosen


def counts_table(records):
    """{(script, processes): (passed, ran)} where ran excludes n/a and skip."""
    table = {}
    for record in records:
        key = (record["script"], record["processes"])
        passed, ran = table.get(key, (0, 0))
        if record["status"] in ("pass", "fail"):
            table[key] = (passed + (record["status"] == "pass"), ran + 1)
        else:
            table.setdefault(key, (passed, ran))
    return table


def print_report(records, baseline=None):
    width = max([len(r["function"]) for r in records] + [8])
    print(f"{'script':<27} {'function':<{width}} {'procs':>5}  {'result':<6} first error line")
    for record in records:
        print(f"{record['script']:<27} {record['function']:<{width}} {record['processes']:>5}  "
              f"{record['status']:<6} {record['error']}")
    table = counts_table(records)
    base_table = counts_table(baseline) if baseline else {}
    print()
    print(f"{'script':<27} {'procs':>5}  passed/ran" + ("   baseline passed/ran" if baseline else ""))
    total, total_ran, base_total, base_ran = 0, 0, 0, 0
    for (script, processes), (passed, ran) in sorted(table.items(), key=lambda item: (SCRIPTS.index(item[0][0]), item[0][1])):
        line = f"{script:<27} {processes:>5}  {passed:>6}/{ran:<3}"
        total, total_ran = total + passed, total_ran + ran
        if baseline:
            b_passed, b_ran = base_table.get((script, processes), (0, 0))
            base_total, base_ran = base_total + b_passed, base_ran + b_ran
            line += f"   {b_passed:>6}/{b_ran:<3}"
        print(line)
    print(f"{'total':<27} {'':>5}  {total:>6}/{total_ran:<3}" + (f"   {base_total:>6}/{base_ran:<3}" if baseline else ""))
    if baseline:
        base_pass = {(r["script"], r["function"], r["processes"]) for r in baseline if r["status"] == "pass"}
        missing = [r for r in records if (r["script"], r["function"], r["processes"]) in base_pass
                   and r["status"] != "pass"]
        print(f"\n{len(missing)} function runs pass under the baseline and not here:")
        for record in missing:
            print(f"  {record['script']}:{record['function']} on {record['processes']}: {record['error']}")


def markdown_report(records, baseline):
    """docs/accelerator.md's numbers: passes per script and process count against the baseline, then the functions
    that pass under the baseline and not here, grouped by their first error line."""
    table, base_table = counts_table(records), counts_table(baseline)
    lines = ["| script | processes | pass under Accelerate (of those run) | pass under tasktrain |", "| --- | --- | --- | --- |"]
    totals = [0, 0, 0]
    for (script, processes) in sorted(base_table, key=lambda key: (SCRIPTS.index(key[0]), key[1])):
        b_passed, b_ran = base_table[(script, processes)]
        passed = table.get((script, processes), (0, 0))[0]
        totals = [totals[0] + b_passed, totals[1] + b_ran, totals[2] + passed]
        lines.append(f"| {script} | {processes} | {b_passed} ({b_ran}) | {passed} |")
    lines.append(f"| all | 1 and 2 | {totals[0]} ({totals[1]}) | {totals[2]} |")
    base_pass = {(r["script"], r["function"], r["processes"]) for r in baseline if r["status"] == "pass"}
    # error -> script -> function -> [process counts]; a script whose every baseline pass fails alike reads "all".
    by_error = {}
    for record in records:
        if (record["script"], record["function"], record["processes"]) in base_pass and record["status"] != "pass":
            functions = by_error.setdefault(record["error"], {}).setdefault(record["script"], {})
            functions.setdefault(record["function"], []).append(record["processes"])
    lines.append("")
    for error, scripts in sorted(by_error.items(), key=lambda item: -sum(len(p) for f in item[1].values()
                                                                           for p in f.values())):
        parts = []
        for script, functions in scripts.items():
            runs = sum(len(counts) for counts in functions.values())
            if runs == sum(1 for key in base_pass if key[0] == script):
                parts.append(f"all {runs} of {script}")
            else:
                parts.append(", ".join(f"{script}:{name} ({'/'.join(map(str, counts))})"
                                       for name, counts in functions.items()))
        lines.append(f"- `{error}`: {'; '.join(parts)}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--under", choices=["tasktrain", "accelerate"], default="tasktrain")
    parser.add_argument("--scripts", nargs="+", choices=SCRIPTS, default=SCRIPTS)
    parser.add_argument("--functions", nargs="+", default=[], metavar="PATTERN",
                        help="fnmatch patterns on the function name or script:function (default: all)")
    parser.add_argument("--processes", default="1,2", help="comma-separated process counts (default: 1,2)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per function run (default: 180)")
    parser.add_argument("--jobs", type=int, default=1, help="function runs at the same time (default: 1)")
    parser.add_argument("--rename-test-utils", action="store_true",
                        help="rename accelerate.test_utils imports too (fixtures from tasktrain.test_utils)")
    parser.add_argument("--repo", default=REPO_ROOT, help="the tasktrain checkout put on PYTHONPATH")
    parser.add_argument("--results", help="write the result records to this JSON file")
    parser.add_argument("--baseline", help="a --results file to compare with (e.g. scripts/accelerate_suite_baseline.json)")
    parser.add_argument("--markdown", action="store_true",
                        help="with --baseline: also print the summary as docs/accelerator.md shows it")
    parser.add_argument("--report-only", metavar="RESULTS",
                        help="print the report of an earlier --results file instead of running anything")
    parser.add_argument("--list", action="store_true", help="print the selected functions and exit")
    args = parser.parse_args(argv)

    process_counts = [int(n) for n in args.processes.split(",") if n.strip()]
    if not process_counts or any(n < 1 for n in process_counts):
        parser.error(f"--processes wants positive counts such as 1,2; got {args.processes!r}")
    baseline = None
    if args.baseline:
        with open(args.baseline) as handle:
            baseline = json.load(handle)["records"]
    if args.report_only:
        with open(args.report_only) as handle:
            records = json.load(handle)["records"]
        print_report(records, baseline)
        if args.markdown and baseline:
            print("\n" + markdown_report(records, baseline))
        return 0
    cases = select_cases(args.scripts, args.functions)
    if not cases:
        parser.error(f"no function matches --scripts {args.scripts} --functions {args.functions}")
    if args.list:
        for case in cases:
            print(f"{case['script']}:{case['name']}")
        return 0
    jobs = [(case, n) for case in cases for n in process_counts]
    scripts_dir = upstream_scripts_dir()
    records = run_cases(jobs, args.under, scripts_dir, args.timeout, args.rename_test_utils,
                        os.path.abspath(args.repo), args.jobs, progress=True)
    print_report(records, baseline)
    if args.markdown and baseline:
        print("\n" + markdown_report(records, baseline))
    if args.results:
        meta = {"under": args.under, "rename_test_utils": args.rename_test_utils, "processes": process_counts,
                "accelerate_scripts": scripts_dir, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        with open(args.results, "w") as handle:
            json.dump({"meta": meta, "records": records}, handle, indent=1)
    return 0 if all(r["status"] != "fail" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
