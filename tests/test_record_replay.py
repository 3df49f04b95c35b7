"""Recordings: schema, atomic writes, replay, and stale figures."""
import ast
import inspect
import json
import re
import shutil
from pathlib import Path

import pytest

import helpers
from helpers import device, sanitize
from helpers.bench import Bench
from helpers.display import kernel_source
from helpers.paths import DATA, KERNELS, ROOT
from helpers.record import Recording, sha256_of, source_hashes, stale_sources, validate

RECORDINGS = sorted(DATA.glob("*.json"))
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))


def make_recording(**changes):
    row = {"provider": "copy_packed", "dtype": "float32", "shape": [1024], "config": {"pack_size": 4},
           "bytes": 8192, "ms": 0.002, "gbs": 8192 / 0.002e-3 / 1e9, "rel_err": 0.0}
    data = dict(chapter="demo", device="NVIDIA H200", recorded="2026-11-20",
                sources={"kernels/copy.cu": "0" * 64}, copy_gbs=4200.0, rows=[row])
    data.update(changes)
    return data


def test_a_valid_recording_has_no_problems():
    assert validate(make_recording()) == []


@pytest.mark.parametrize("change, problem", [
    (dict(device=None), "'device'"), (dict(copy_gbs=-1.0), "copy_gbs"),
    (dict(rows=[{"provider": "x"}]), "lacks dtype"),
])
def test_invalid_recordings_are_described(change, problem):
    assert any(problem in p for p in validate(make_recording(**change)))


def test_gbs_must_follow_from_bytes_and_time():
    data = make_recording()
    data["rows"][0]["gbs"] *= 2
    assert any("gbs does not equal" in p for p in validate(data))


def test_save_is_atomic_and_round_trips(tmp_path):
    recording = Recording(**make_recording())
    path = recording.save(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["demo.json"]  # no temporary file left
    assert Recording.load("demo", tmp_path) == recording
    broken = Recording(**make_recording(copy_gbs=0.0))
    with pytest.raises(ValueError, match="copy_gbs"):
        broken.save(tmp_path)
    assert json.loads(path.read_text())["copy_gbs"] == 4200.0  # the good file is intact


def test_add_replaces_the_same_measurement():
    recording = Recording(**make_recording())
    newer = dict(recording.rows[0], ms=0.001, gbs=8.192)
    recording.add(newer)
    assert recording.rows == [newer]


def test_stale_sources_are_detected(tmp_path, monkeypatch):
    kernel = tmp_path / "kernels" / "k.cu"
    kernel.parent.mkdir()
    kernel.write_text("// v1\n")
    monkeypatch.setattr("helpers.record.ROOT", tmp_path)
    recording = Recording(**make_recording(sources={"kernels/k.cu": sha256_of(kernel)}))
    assert stale_sources(recording) == []
    kernel.write_text("// v2\n")
    assert stale_sources(recording) == ["kernels/k.cu"]


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.stem for p in RECORDINGS])
def test_recorded_figures_match_the_kernels_they_were_measured_with(path):
    recording = Recording.load(path.stem)
    assert stale_sources(recording) == [], (
        f"{path.name} was recorded with other kernel sources: re-record it on a GPU "
        "(BOOK_RECORD=1 python -m pytest book/)")
    assert recording.rows and recording.copy_gbs > 0
    assert all(row["rel_err"] is None or row["rel_err"] < 1e-2 for row in recording.rows)


def test_every_chapter_has_a_recording():
    assert NOTEBOOKS, "no chapter notebooks in book/"
    assert {p.stem for p in NOTEBOOKS} <= {p.stem for p in RECORDINGS}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_outputs_come_from_the_recorded_gpu_run(notebook):
    recording = Recording.load(notebook.stem)
    cells = json.loads(notebook.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"
            and "remove-cell" not in c.get("metadata", {}).get("tags", [])]  # the hidden install cell
    assert all(c.get("outputs") or not c["source"] for c in code[:-1]), "a cell has no output"
    text = json.dumps([c.get("outputs") for c in code])
    assert f"measured on {recording.device} on {recording.recorded}" in text
    assert "image/png" in text  # the figures are there


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_source_printed_in_the_recorded_notebooks_is_the_source_today(notebook):
    """A recorded chapter shows code as it was when it ran: helpers printed with
    inspect.getsource, kernels with show_kernel. The recording's hashes cover the kernels, not
    the helpers, so a helper edited since would be shown as it was; this says which."""
    cells = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    namespace = {}
    for cell in cells:  # the chapter's own imports from helpers
        for statement in re.findall(r"^from helpers[\w.]* import (?:\([^)]*\)|.*)$", "".join(cell["source"]), re.M):
            exec(statement, namespace)
    shown = 0
    for cell in cells:
        source, outputs = "".join(cell["source"]), cell.get("outputs", [])
        printed = "".join("".join(o["text"]) for o in outputs if o["output_type"] == "stream")
        for name in re.findall(r"print\(inspect\.getsource\((\w+)\)\)", source):
            assert inspect.getsource(namespace[name]) in printed, f"{notebook.name}: {name} is printed as it was"
            shown += 1
        markdown = "".join("".join(o.get("data", {}).get("text/markdown", "")) for o in outputs)
        for call in re.findall(r"show_kernel\(([^)]*)\)", source):
            file, *names = ast.literal_eval(f"({call},)")
            for name in names:
                assert kernel_source(file, name) in markdown, f"{notebook.name}: {name} is shown as it was"
                shown += 1
    assert shown, f"{notebook.name} shows no source: is this test still reading it?"


@pytest.fixture
def replay(monkeypatch):
    monkeypatch.setenv("BOOK_REPLAY", "1")
    monkeypatch.setattr(device, "_gpu", None)
    monkeypatch.setattr(device, "_no_gpu_reason", None)


@pytest.mark.skipif(not RECORDINGS, reason="no recordings yet")
def test_replay_returns_recorded_rows_and_names_what_is_missing(replay, capsys):
    chapter = RECORDINGS[0].stem
    recording = Recording.load(chapter)
    bench = Bench(chapter, sources=list(recording.sources))
    assert not bench.live and bench.label.startswith(f"recorded on {recording.device}")
    bench.banner()
    assert "Replay mode is on: BOOK_REPLAY=1" in capsys.readouterr().out
    first = recording.rows[0]
    row = bench.measure(first["provider"], dtype=first["dtype"], shape=first["shape"],
                        config=first["config"], bytes=first["bytes"], setup=None)
    assert row.gbs == first["gbs"] and bench.copy_gbs == recording.copy_gbs
    with pytest.raises(helpers.NotRecordedError, match="was not recorded on"):
        bench.measure(first["provider"], dtype=first["dtype"], shape=[3], config=first["config"],
                      bytes=12, setup=None)


@pytest.mark.skipif(not RECORDINGS, reason="no recordings yet")
def test_rows_timed_in_turns_are_kept_apart_from_rows_timed_alone(replay):
    chapter = RECORDINGS[0].stem
    bench = Bench(chapter, sources=list(Recording.load(chapter).sources))
    alone = dict(bench.recording.rows[0])
    ours = dict(alone, config=dict(alone["config"], in_turns_with="peer"), gbs=1.0, ms=alone["bytes"] / 1e6)
    peer = dict(alone, provider="peer", config={"in_turns_with": alone["provider"]}, gbs=2.0,
                ms=alone["bytes"] / 2e6)
    bench.recording.rows += [ours, peer]
    wanted = [dict(provider=alone["provider"], dtype=alone["dtype"], shape=alone["shape"], config=alone["config"],
                   bytes=alone["bytes"], setup=None),
              dict(provider="peer", dtype=alone["dtype"], shape=alone["shape"], config={}, bytes=alone["bytes"],
                   setup=None)]
    assert [r.gbs for r in bench.measure_together(wanted)] == [1.0, 2.0]
    assert bench.measure(**wanted[0]).gbs == alone["gbs"]  # the row timed alone, not the one in turns
    with pytest.raises(helpers.NotRecordedError, match="was not recorded on"):
        bench.measure(**wanted[1])  # "peer" was only ever timed in turns


def test_replay_without_a_recording_says_how_to_make_one(replay):
    with pytest.raises(helpers.NotRecordedError, match="BOOK_RECORD=1"):
        Bench("no-such-chapter", sources=["kernels/copy.cu"])


def test_source_hashes_are_relative_to_the_project():
    hashes = source_hashes(["copy.cu"])
    assert list(hashes) == ["kernels/copy.cu"]
    assert hashes["kernels/copy.cu"] == sha256_of(ROOT / "kernels" / "copy.cu")


@pytest.mark.parametrize("chapter", sanitize.chapter_modules(), ids=lambda m: m.__name__)
def test_a_chapter_hashes_every_header_its_kernels_include(chapter):
    """A recording is stale when a source it was measured with changes, and it knows its sources from
    the chapter's SOURCES: a header the kernel file includes but SOURCES leaves out could change
    without the recording noticing (softmax.cu's edges.cuh, until it was listed)."""
    included, unread = set(), [chapter.SOURCE]
    while unread:
        text = (KERNELS / unread.pop()).read_text()
        for name in re.findall(r'^#include "([^"]+)"', text, re.M):
            if name not in included:
                included.add(name)
                unread.append(name)
    listed = {Path(s).name for s in chapter.SOURCES}
    assert {chapter.SOURCE} | included <= listed, (chapter.__name__, sorted(included - listed))
