"""Compile with NVRTC, cache, read resources and SASS: all without a GPU."""
import os

import pytest

import helpers
from helpers import compiler
from helpers.copy_kernels import CopyVariant, ladder


def test_compiles_a_template_instance_to_a_cubin(fresh_cache):
    compiled = helpers.compile_kernels("copy.cu", ["copy_packed<float, 4, 256, 1>"], arch="sm_90")
    assert compiled.cubin[:4] == b"\x7fELF"
    assert compiled.mangled["copy_packed<float, 4, 256, 1>"].startswith("_Z11copy_packed")
    assert compiled.arch == "sm_90"


def test_a_setting_seen_before_is_not_recompiled(fresh_cache):
    names = ["copy_packed<float, 2, 128, 1>"]
    before = compiler.stats["nvrtc_compiles"]
    first = helpers.compile_kernels("copy.cu", names, arch="sm_90")
    assert compiler.stats["nvrtc_compiles"] == before + 1
    assert helpers.compile_kernels("copy.cu", names, arch="sm_90") is first  # memory cache
    compiler._memory_cache.clear()
    again = helpers.compile_kernels("copy.cu", names, arch="sm_90")  # disk cache
    assert compiler.stats["nvrtc_compiles"] == before + 1
    assert again.cubin == first.cubin and again.mangled == first.mangled
    helpers.compile_kernels("copy.cu", names, arch="sm_90", defines=["UNUSED_FLAG=1"])
    assert compiler.stats["nvrtc_compiles"] == before + 2  # other options: compiled again
    assert len(list(fresh_cache.glob("*.cubin"))) == 2


def test_spills_are_never_guessed_from_a_log_without_ptxas_report(fresh_cache):
    """A log that lost ptxas' report cannot say 'no spills': resources() refuses, and a cache
    entry without it is compiled again rather than trusted."""
    import dataclasses
    import json
    names = ["copy_packed<float, 4, 128, 1>"]
    compiled = helpers.compile_kernels("copy.cu", names, arch="sm_90")
    assert compiled.resources(names[0]).spill_store_bytes == 0
    with pytest.raises(helpers.CompileError, match="no ptxas report on copy_packed"):
        dataclasses.replace(compiled, log="").resources(names[0])
    (entry,) = fresh_cache.glob("*.json")
    entry.write_text(json.dumps({**json.loads(entry.read_text()), "log": ""}))
    compiler._memory_cache.clear()
    before = compiler.stats["nvrtc_compiles"]
    again = helpers.compile_kernels("copy.cu", names, arch="sm_90")
    assert compiler.stats["nvrtc_compiles"] == before + 1 and again.resources(names[0]).spill_store_bytes == 0


def test_every_compile_runs_ptxas_even_on_a_kernel_nvrtc_has_seen(gpu, fresh_cache):
    """NVRTC 12.9+ caches cubins of its own where there is a driver, and a cubin it hands back
    comes without ptxas' report: on the GPU host (NVRTC 13.0, 2026-11-27) every kernel compiled
    before on the machine did. --no-cache makes ptxas run, and report, every time."""
    from helpers.paths import kernel_path
    path, name = kernel_path("copy.cu"), "copy_packed<float, 4, 96, 1>"
    options = compiler.nvrtc_options(compiler.default_arch())
    first, second = (compiler._run_nvrtc(path, path.read_text(), [name], options, compiler.default_arch(), "twice")
                     for _ in range(2))
    assert first.cubin == second.cubin and compiler._spill_report(second.log, second.mangled[name]) == (0, 0)


def test_an_empty_nvrtc_log_leaves_python_intact(tmp_path):
    """Compiled without ptxas --verbose, NVRTC's log is empty (its NUL alone). Reading it into
    b" " * 1 wrote that NUL into CPython's shared b" ", after which f"{a} {b}" compiled as "ab":
    the lost spaces of a chapter 4 recording. Run in a fresh interpreter, since the damage is
    for the life of the process; the compile itself is refused, its spills unknown."""
    import subprocess
    import sys
    script = """
import helpers
from helpers import compiler
from helpers.paths import kernel_path
path, name = kernel_path("copy.cu"), "copy_packed<float, 4, 128, 1>"
options = [o for o in compiler.nvrtc_options("sm_90") if o != "--ptxas-options=--verbose"]
try:
    compiler._run_nvrtc(path, path.read_text(), [name], options, "sm_90", "no-report")
except helpers.CompileError as refused:
    print("refused:", refused)
print(compiler.stats["nvrtc_compiles"], repr(b" "), repr(eval('f"{1} {2}"')))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "BOOK_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    refused, counts = done.stdout.strip().splitlines()
    assert refused.startswith("refused: NVRTC compiled kernels/copy.cu, but its log (0 characters) holds no ptxas "
                              "report on copy_packed<float, 4, 128, 1>")
    assert counts == "1 b' ' '1 2'"


def test_a_changed_header_invalidates_the_cache(fresh_cache, tmp_path):
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "k.cu").write_text('#include "h.cuh"\n__global__ void k(float* x) { x[0] = VALUE; }\n')
    (folder / "h.cuh").write_text("#define VALUE 1.0f\n")
    before = compiler.stats["nvrtc_compiles"]
    helpers.compile_kernels(folder / "k.cu", ["k"], arch="sm_90", extra_options=[f"--include-path={folder}"])
    (folder / "h.cuh").write_text("#define VALUE 2.0f\n")
    helpers.compile_kernels(folder / "k.cu", ["k"], arch="sm_90", extra_options=[f"--include-path={folder}"])
    assert compiler.stats["nvrtc_compiles"] == before + 2


def test_a_compile_error_shows_nvrtc_log_with_file_and_line(fresh_cache, tmp_path):
    bad = tmp_path / "broken.cu"
    bad.write_text("__global__ void broken(float* x) {\n  x[0] = 1.0f\n}\n")
    with pytest.raises(helpers.CompileError) as caught:
        helpers.compile_kernels(bad, ["broken"], arch="sm_90")
    message = str(caught.value)
    assert "broken.cu(3): error" in message  # the missing ';' is reported at the brace
    assert "NVRTC could not compile" in message


def test_unknown_files_and_kernels_are_named(fresh_cache):
    with pytest.raises(FileNotFoundError, match="kernels/ holds: copy.cu"):
        helpers.compile_kernels("nope.cu", ["x"])
    compiled = helpers.compile_kernels("copy.cu", ["copy_one_per_thread<float>"], arch="sm_90")
    with pytest.raises(KeyError, match="was not compiled"):
        compiled.resources("copy_grid_stride<float>")
    with pytest.raises(ValueError, match="arch"):
        helpers.compile_kernels("copy.cu", ["copy_one_per_thread<float>"], arch="90")


def test_vector_steps_issue_16_byte_loads_and_stores():
    for variant in ladder("float32") + ladder("float16"):
        ops = helpers.memory_ops(variant.compiled(arch="sm_90").sass(variant.name_expression))
        width = variant.pack_size * (4 if variant.dtype == "float32" else 2) if variant.packed else None
        if width == 16:
            assert "LDG.E.128.CONSTANT" in ops and "STG.E.128" in ops, (variant, ops)
        elif width == 8:
            assert "LDG.E.64.CONSTANT" in ops and "STG.E.64" in ops, (variant, ops)
        else:
            assert not any(op.endswith((".64", ".128")) or ".128." in op or ".64." in op for op in ops), ops


def test_resources_report_registers_and_no_spills():
    for variant in ladder("float32"):
        resources = variant.compiled(arch="sm_90").resources(variant.name_expression)
        assert 0 < resources.registers <= 64
        assert not resources.spills and resources.stack_bytes == 0 and resources.local_bytes == 0


def test_spills_and_local_arrays_are_reported(fresh_cache, tmp_path):
    squeezed = tmp_path / "squeezed.cu"  # 16 float4 in flight need 64 registers; allow 16
    squeezed.write_text("__global__ void squeezed(const float4* x, float4* y) {\n  float4 r[16];\n"
                        "  for (int k = 0; k < 16; ++k) r[k] = x[threadIdx.x + 256 * k];\n"
                        "  for (int k = 0; k < 16; ++k) y[threadIdx.x + 256 * k] = r[15 - k];\n}\n")
    compiled = helpers.compile_kernels(squeezed, ["squeezed"], arch="sm_90",
                                       extra_options=["--maxrregcount=16"])
    resources = compiled.resources("squeezed")
    assert resources.spills and resources.spill_store_bytes > 0 and resources.uses_local_memory
    source = tmp_path / "local.cu"
    source.write_text("__global__ void local(float* x, int i) {\n  float a[64];\n"
                      "  for (int k = 0; k < 64; ++k) a[k] = x[k * i];\n  a[i & 63] += 1.0f;\n"
                      "  x[0] = a[(i + 1) & 63];\n}\n")
    compiled = helpers.compile_kernels(source, ["local"], arch="sm_90")
    resources = compiled.resources("local")
    assert resources.stack_bytes == 256 and not resources.spills  # a[] indexed at run time
    assert any(op.startswith("STL") for op in helpers.opcodes(compiled.sass("local")))


def test_every_launch_path_loads_its_kernel_once(fresh_cache, monkeypatch):
    """Elementwise variants, reductions and the timer share compiler.loaded_kernel:
    the first call compiles and loads, later calls are a lookup."""
    from helpers.copy_kernels import CopyVariant
    from helpers.reduce_kernels import SOURCE as REDUCE, SumVariant
    monkeypatch.setattr(compiler, "_loaded", {})
    loads = []
    monkeypatch.setattr(compiler.CompiledKernels, "kernel", lambda self, name: loads.append(name) or f"kernel:{name}")
    before = compiler.stats["nvrtc_compiles"]
    copy = CopyVariant("packed", "float32", 4, 256)
    assert copy.loaded() == copy.loaded() == "kernel:copy_packed<float, 4, 256, 1>"
    assert compiler.loaded_kernel(REDUCE, SumVariant().name_expression) == "kernel:reduce_single_pass<256, 4, false>"
    assert compiler.loaded_kernel("timing.cu", "hold_gpu") == compiler.loaded_kernel("timing.cu", "hold_gpu")
    assert loads == ["copy_packed<float, 4, 256, 1>", "reduce_single_pass<256, 4, false>", "hold_gpu"]
    assert compiler.stats["nvrtc_compiles"] == before + 3
