"""Run every kernel of the book under compute-sanitizer, and fail on any report.

    python -m helpers.sanitize            # memcheck, racecheck, synccheck, initcheck
    python -m helpers.sanitize --tool memcheck

Each chapter's host module (``helpers/*_kernels.py``) exposes ``sanitizer_cases()``:
(name, run) pairs that launch one kernel at irregular sizes (one element, sizes
that are not a multiple of the pack or the block, misaligned views where the
kernel takes them). This runner finds them by itself, so a new chapter is
covered as soon as its module defines that function. For each tool, one
sanitized child process runs every case, printing a marker before each; reports
are attributed to the case whose marker precedes them. Needs a GPU, and
compute-sanitizer (CUDA toolkit; found on PATH or in $CUDA_HOME/bin).
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
MARKER = "@@ sanitizer case: "


def chapter_modules() -> list:
    """Every helpers/*_kernels.py module, imported."""
    folder = Path(__file__).parent
    return [importlib.import_module(f"helpers.{p.stem}") for p in sorted(folder.glob("*_kernels.py"))]


def all_cases() -> list:
    cases = []
    for module in chapter_modules():
        if not hasattr(module, "sanitizer_cases"):
            raise RuntimeError(f"{module.__name__} has kernels but no sanitizer_cases(): add one")
        cases += [(f"{module.__name__.split('.')[-1]}:{name}", run) for name, run in module.sanitizer_cases()]
    return cases


def run_cases(pattern: str = ""):
    """The child: run every case (matching pattern), announcing each on stdout."""
    from . import device
    for name, run in all_cases():
        if pattern in name:
            print(MARKER + name, flush=True)
            run()
            device.synchronize()
    print(MARKER + "done", flush=True)


def attribute(output: str) -> Counter:
    """Reports per case, from a sanitizer's output with our markers in it. A report
    starts with '========= ' followed by an error kind (not a continuation line,
    which is indented further, nor the summary)."""
    counts, case = Counter(), "(before the first case)"
    for line in output.splitlines():
        if line.startswith(MARKER):
            case = line[len(MARKER):].strip()
        elif re.match(r"^========= (?!\s)(?![A-Z]+ SUMMARY)(?!COMPUTE-SANITIZER)(?!Target application)\S", line):
            counts[case] += 1
    return counts


def kernel_of(case: str) -> str:
    """'gelu_kernels:gelu_packed<float, 4, 128, 0> n=7' -> 'gelu_kernels:gelu_packed<float, 4, 128, 0>'."""
    return re.split(r" (?:n=|shape=|offset=|strides )", case)[0]


def error_summary(output: str) -> int | None:
    """The tool's own count: 'ERROR SUMMARY: n errors' (memcheck, synccheck, initcheck),
    or 'RACECHECK SUMMARY: n hazards displayed (e errors, w warnings)', where every
    hazard counts, warnings included. None when the tool printed no summary."""
    found = re.findall(r"ERROR SUMMARY: (\d+) error", output)
    if found:
        return int(found[-1])
    races = re.findall(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", output)
    return max(int(races[-1][0]), int(races[-1][1]) + int(races[-1][2])) if races else None


def find_sanitizer() -> str:
    found = shutil.which("compute-sanitizer")
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if found is None and Path(home, "bin", "compute-sanitizer").is_file():
        found = str(Path(home, "bin", "compute-sanitizer"))
    if found is None:
        raise SystemExit("compute-sanitizer not found: it comes with the CUDA toolkit (set CUDA_HOME)")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tool", choices=TOOLS, action="append", help="one tool (repeatable); default all four")
    parser.add_argument("--cases", default="", help="only cases whose name contains this")
    parser.add_argument("--per-kernel", action="store_true", help="print the report count of every kernel, zeros too")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run_cases(args.cases)
        return 0
    sanitizer, failed = find_sanitizer(), False
    names = [name for name, _ in all_cases() if args.cases in name]
    print(f"{len(names)} cases from {len(chapter_modules())} chapters")
    for tool in args.tool or TOOLS:
        extra = ["--racecheck-report", "all"] if tool == "racecheck" else []
        command = [sanitizer, "--tool", tool, "--error-exitcode", "86", "--print-limit", "100", *extra,
                   sys.executable, "-m", "helpers.sanitize", "--child", "--cases", args.cases]
        done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        output = done.stdout + done.stderr
        per_case, total = attribute(output), error_summary(output)
        finished = MARKER + "done" in output
        ok = done.returncode == 0 and total == 0 and finished
        failed |= not ok
        print(f"{tool:10s} {'clean' if ok else 'FAILED'}: {total} errors reported, "
              f"{len(names)} cases{'' if finished else ' (the run did not finish)'}")
        for case, count in sorted(per_case.items()):
            print(f"    {count:4d}  {case}")
        if args.per_kernel:
            per_kernel = Counter({kernel_of(name): 0 for name in names})
            for case, count in per_case.items():
                per_kernel[kernel_of(case)] += count
            for kernel, count in sorted(per_kernel.items()):
                print(f"    {tool}: {count} reports  {kernel}")
        if not ok:
            print(output[-4000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
