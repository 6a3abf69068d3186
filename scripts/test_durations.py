"""Per-file test durations from a junit report, for `make test`'s scheduling (tests/conftest.py runs the slowest
files first), and a simulation of the two workers' schedule.

    python -m pytest -n 2 --dist loadfile tests --junitxml=/tmp/tests.xml ...
    python scripts/test_durations.py /tmp/tests.xml            # prints the simulated wall time of each order
    python scripts/test_durations.py /tmp/tests.xml --write    # and writes tests/durations.json

The simulation follows pytest-xdist's loadfile scheduler: each worker starts with one file and is handed the next
one in the queue when two or fewer of its assigned tests are left."""
import argparse
import collections
import json
import os
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(path):
    """{file name: [seconds of each test, in order]} from a junit xml."""
    tests = collections.OrderedDict()
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("classname", "").split(".")
        module = next((part for part in name if part.startswith("test_")), name[-1])
        tests.setdefault(f"{module}.py", []).append(float(case.get("time", 0)))
    return tests


def simulate(queue, tests, workers=2):
    """Wall time of running the files of `queue` (in that order) on `workers` as xdist's loadfile does."""
    queue = list(queue)
    clock = [0.0] * workers
    pending = [collections.deque() for _ in range(workers)]
    for w in range(workers):
        if queue:
            pending[w].extend(tests[queue.pop(0)])
    while any(pending):
        w = min((w for w in range(workers) if pending[w]), key=lambda w: clock[w])
        clock[w] += pending[w].popleft()
        if len(pending[w]) <= 2 and queue:
            pending[w].extend(tests[queue.pop(0)])
    return max(clock)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("junit")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    tests = read(args.junit)
    totals = {name: round(sum(times), 1) for name, times in tests.items()}
    by_count = sorted(tests, key=lambda name: -len(tests[name]))  # xdist's default --loadscope-reorder
    slowest_first = sorted(tests, key=lambda name: -totals[name])
    print(f"{len(tests)} files, {sum(totals.values()):.0f} s of tests in all")
    for name in slowest_first[:15]:
        print(f"  {totals[name]:7.1f} s  {len(tests[name]):4d} tests  {name}")
    print(f"two workers, files by number of tests (xdist's default): {simulate(by_count, tests):.0f} s")
    print(f"two workers, slowest file first (tests/conftest.py):      {simulate(slowest_first, tests):.0f} s")
    if args.write:
        with open(os.path.join(ROOT, "tests", "durations.json"), "w") as f:
            json.dump(dict(sorted(totals.items())), f, indent=0)
            f.write("\n")


if __name__ == "__main__":
    main()
