"""Failures a reader can meet without a GPU: each is answered in words, and nothing is corrupted."""
import json

import pytest

import helpers
from helpers import device
from helpers.record import Recording


@pytest.fixture
def no_gpu_state(monkeypatch):
    monkeypatch.delenv("BOOK_REPLAY", raising=False)
    monkeypatch.setattr(device, "_gpu", None)
    monkeypatch.setattr(device, "_no_gpu_reason", None)


def test_a_driver_too_old_for_cuda_python_is_explained(no_gpu_state, monkeypatch):
    from cuda.bindings import driver
    monkeypatch.setattr(driver, "cuInit", lambda flags: (driver.CUresult.CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,))
    reason = helpers.no_gpu_reason()
    assert "too old for cuda-python" in reason and "update the driver" in reason
    assert not helpers.gpu_available()


def test_a_driver_of_an_older_cuda_major_is_explained(no_gpu_state, monkeypatch):
    from cuda.bindings import driver
    monkeypatch.setattr(driver, "cuInit", lambda flags: (driver.CUresult.CUDA_SUCCESS,))
    monkeypatch.setattr(driver, "cuDriverGetVersion", lambda: (driver.CUresult.CUDA_SUCCESS, 12040))
    assert "supports CUDA 12.4, older than cuda-python" in helpers.no_gpu_reason()


def test_any_other_init_failure_is_replay_mode_not_a_crash(no_gpu_state, monkeypatch):
    from cuda.bindings import driver
    monkeypatch.setattr(driver, "cuInit", lambda flags: (driver.CUresult.CUDA_ERROR_OPERATING_SYSTEM,))
    assert helpers.no_gpu_reason() == "cuInit failed: CUDA_ERROR_OPERATING_SYSTEM"


def test_no_device_is_explained(no_gpu_state, monkeypatch):
    from cuda.bindings import driver
    monkeypatch.setattr(driver, "cuInit", lambda flags: (driver.CUresult.CUDA_ERROR_NO_DEVICE,))
    assert helpers.no_gpu_reason() == "the NVIDIA driver sees no GPU"


def test_an_interrupted_save_leaves_the_recording_intact(tmp_path, monkeypatch):
    row = {"provider": "p", "dtype": "float32", "shape": [4], "config": {}, "bytes": 32, "ms": 0.001,
           "gbs": 32 / 1e-6 / 1e9}
    recording = Recording(chapter="demo", device="X", recorded="2026-11-20", sources={}, copy_gbs=1.0, rows=[row])
    path = recording.save(tmp_path)
    before = path.read_text()
    recording.rows.append(dict(row, provider="q"))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C in the middle of writing
    monkeypatch.setattr(json, "dump", interrupted)
    with pytest.raises(KeyboardInterrupt):
        recording.save(tmp_path)
    assert path.read_text() == before and json.loads(before)["rows"] == [row]
    assert [p.name for p in tmp_path.iterdir()] == ["demo.json"]  # no half-written file left


def test_a_sweep_that_runs_out_of_memory_stops_with_a_message(capsys):
    from helpers.panel import Panel

    class LiveBench:
        live, label, copy_gbs = True, "measured on X on 2026-11-20", 4000.0

        def recorded_configs(self, provider):
            return []

    def measure(config, size):
        if size >= 1 << 22:
            raise helpers.DeviceOutOfMemoryError("cuMemAlloc failed: out of memory")
        return helpers.Row("k", "float32", [size], config, 8 * size, 1.0, 8 * size / 1e6)

    panel = Panel(LiveBench(), provider="k", knobs={"pack_size": [1, 2]}, sizes=[1 << 20, 1 << 22],
                  measure=measure)
    panel.sweep_all()
    out = capsys.readouterr().out
    assert "Sweep stopped at {'pack_size': 1}" in out and "out of memory" in out
    assert "The 1 measurements taken so far are kept" in out


def test_a_kernel_source_with_a_syntax_error_shows_the_log(tmp_path, fresh_cache):
    bad = tmp_path / "typo.cu"
    bad.write_text("__global__ void typo(float* x) {\n  x[0] = undefined_name;\n}\n")
    with pytest.raises(helpers.CompileError, match=r"typo.cu\(2\): error: identifier \"undefined_name\" is undefined"):
        helpers.compile_kernels(bad, ["typo"], arch="sm_90")


def test_every_chapter_module_has_sanitizer_cases():
    from helpers import sanitize
    names = [name for name, _ in sanitize.all_cases()]
    modules = {m.__name__.split(".")[-1] for m in sanitize.chapter_modules()}
    assert modules == {"copy_kernels", "gelu_kernels", "reduce_kernels", "softmax_kernels", "layernorm_kernels"}
    assert all(any(n.startswith(m) for n in names) for m in modules)
    assert any("n=1 " in n or n.endswith("n=1") for n in names) and any("offset=1" in n for n in names)


def test_sanitizer_reports_are_counted_per_case():
    from helpers.sanitize import MARKER, attribute, error_summary
    output = "\n".join([
        "========= COMPUTE-SANITIZER", MARKER + "a", MARKER + "b",
        "========= Invalid __global__ read of size 16 bytes", "=========     at k()+0x10", "=========",
        "========= Race reported between Write access at k()+0x20", MARKER + "c", MARKER + "done",
        "========= ERROR SUMMARY: 2 errors"])
    assert attribute(output) == {"b": 2} and error_summary(output) == 2
    racecheck = "\n".join([MARKER + "a", "========= Error: Race reported between Write access at k()+0x20",
                            MARKER + "done", "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"])
    assert attribute(racecheck) == {"a": 1} and error_summary(racecheck) == 1
    clean = MARKER + "done\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
    assert attribute(clean) == {} and error_summary(clean) == 0
    assert error_summary(MARKER + "done") is None  # no summary: the run cannot be called clean
