"""Read the machine code of a compiled kernel, without a GPU.

Chapter 1 uses this to show that a float4 copy issues ``LDG.E.128`` and the
tests use it to assert that the vector loads they expect are really there.
"""
from __future__ import annotations

import os
import re
import tempfile
from collections import Counter

from .compiler import find_tool, run_tool


def disassemble(cubin: bytes, symbol: str) -> str:
    """SASS of one function of a cubin, one instruction per line."""
    fd, path = tempfile.mkstemp(suffix=".cubin")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(cubin)
        text = run_tool([find_tool("cuobjdump"), "-sass", "-fun", symbol, path])
    finally:
        os.unlink(path)
    lines = []
    for line in text.splitlines():
        found = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if found:
            lines.append(found.group(1))
    if not lines:
        raise RuntimeError(f"cuobjdump found no SASS for {symbol}")
    return "\n".join(lines)


def resource_usage(cubin: bytes, symbol: str) -> dict:
    """{'REG': 16, 'STACK': 0, 'SHARED': 0, 'LOCAL': 0, ...} of one function, from cuobjdump."""
    fd, path = tempfile.mkstemp(suffix=".cubin")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(cubin)
        text = run_tool([find_tool("cuobjdump"), "-res-usage", path])
    finally:
        os.unlink(path)
    found = re.search(rf"Function {re.escape(symbol)}:\s*\n\s*(.*)", text)
    if found is None:
        raise RuntimeError(f"cuobjdump reports no resource usage for {symbol}")
    return {key: int(value) for key, value in re.findall(r"(\w+)(?:\[\d+\])?:(\d+)", found.group(1))}


def opcodes(sass: str) -> Counter:
    """How many times each opcode (with its modifiers, e.g. ``LDG.E.128``) appears."""
    counts = Counter()
    for line in sass.splitlines():
        line = re.sub(r"^@!?U?P\w+\s+", "", line.strip())  # drop a predicate guard
        if line:
            counts[line.split()[0]] += 1
    return counts


def memory_ops(sass: str) -> dict:
    """Global loads and stores by width: {'LDG.E.128': 2, 'STG.E.128': 2, ...}."""
    return {op: n for op, n in sorted(opcodes(sass).items()) if op.startswith(("LDG", "STG"))}
