import ast
import importlib
import inspect
import json

import matplotlib
import pytest

matplotlib.use("Agg")

from helpers.bench import Row  # noqa: E402
from helpers.display import (kernel_markdown, kernel_source, new_figure, plot_bandwidth, size_label,  # noqa: E402
                             summary_table)
from helpers.paths import KERNELS, ROOT, kernel_path  # noqa: E402


def test_kernel_source_takes_the_comment_template_and_body():
    text = kernel_source("copy.cu", "copy_packed")
    assert text.startswith("// Step 5") and "template <typename T, int PackSize, int BlockSize, int Unroll>" in text
    assert text.rstrip().endswith("}") and "copy_packed_grid_stride" not in text
    assert "struct alignas" in kernel_source("pack.cuh", "Pack")
    with pytest.raises(KeyError):
        kernel_source("copy.cu", "no_such_kernel")


def test_kernel_source_stops_at_a_one_line_definition_above():
    # finish() follows row_norm(), a one-line "{ ... }" with no blank line between them:
    # finish's text starts at its own template line, and row_norm's keeps its comment.
    finish = kernel_source("softmax.cu", "finish")
    assert finish.startswith("template <bool Log>") and "row_norm" not in finish
    assert kernel_source("softmax.cu", "row_norm").startswith("// The output rule")


def chapter_code_cells() -> dict:
    """Each chapter notebook's code cells, each with its parsed source: {name: [(cell, tree)]}."""
    return {notebook.name: [(cell, ast.parse("".join(cell["source"])))
                            for cell in json.loads(notebook.read_text())["cells"] if cell["cell_type"] == "code"]
            for notebook in sorted((ROOT / "book").glob("*.ipynb"))}


def show_kernel_calls() -> list:
    """(notebook, cell, file, names) of every show_kernel call in the chapters, in order."""
    calls = []
    for notebook, cells in chapter_code_cells().items():
        for cell, tree in cells:
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "show_kernel":
                    file, *names = [ast.literal_eval(arg) for arg in node.args]
                    calls.append((notebook, cell, file, names))
    return calls


def test_every_kernel_a_chapter_shows_is_in_its_source():
    # A renamed kernel or struct would otherwise surface only when the notebook runs on a GPU.
    shown = [(notebook, file, name) for notebook, _, file, names in show_kernel_calls() for name in names]
    assert len(shown) > 20
    for notebook, file, name in shown:
        assert kernel_source(file, name), (notebook, file, name)


def test_every_kernel_a_chapter_shows_opens_with_its_comment():
    # kernel_source takes the comment lines right above a definition: a declaration put between
    # a kernel and its comment (a constant for __launch_bounds__, say) shows it bare. A definition
    # with no comment of its own passes only where it follows the one shown before it in the same
    # call, blank lines apart, so that the comment above the pair describes both.
    bare = []
    for notebook, _, file, names in show_kernel_calls():
        text, previous_end = kernel_path(file).read_text(), None
        for name in names:
            source = kernel_source(file, name)
            start = text.index(source)
            follows = previous_end is not None and not text[previous_end:start].strip()
            if not source.startswith("//") and not follows:
                bare.append((notebook, file, name))
            previous_end = start + len(source)
    assert bare == [], f"shown without the comment that says what they are: {bare}"


def test_show_kernel_without_names_shows_the_whole_file():
    text = kernel_markdown("pack.cuh")
    assert text.startswith("`kernels/pack.cuh`\n```cuda\n// Pack<T, N>") and "struct alignas" in text
    assert text.endswith("};\n```")


def test_the_kernels_a_chapter_shows_are_the_current_source():
    # The book is built from the notebooks' stored outputs: a comment edited in a kernel file
    # must reach the chapter that shows it, as its recording must (a kernel edit makes both stale).
    for notebook, cell, file, names in show_kernel_calls():
        stored = ["".join(output["data"]["text/markdown"]) for output in cell.get("outputs", [])
                  if "text/markdown" in output.get("data", {})]
        assert kernel_markdown(file, *names) in stored, f"{notebook}: stale output of show_kernel({file!r}, ...)"


def test_kernel_lines_fit_the_page():
    # The chapters show the kernels as they are in kernels/: a line past 120 columns scrolls
    # sideways in the rendered code block (and every file was wrapped to 120 on 2026-11-28).
    long_lines = [f"{path.name}:{number} ({len(line)} columns)"
                  for path in sorted(KERNELS.iterdir())
                  for number, line in enumerate(path.read_text().splitlines(), start=1) if len(line) > 120]
    assert long_lines == []


def test_size_labels():
    assert [size_label(s) for s in (512, 1 << 20, 3 << 29)] == ["512 B", "1 MiB", "1.5 GiB"]


def test_plot_and_table_from_rows():
    rows = [Row("copy_packed", "float32", [n], {"pack_size": 4}, 8 * n, 8 * n / 4e6, 4000.0,
                rel_err=0.0, ms_q1=0.1, ms_q3=0.2) for n in (1 << 20, 1 << 22)]
    fig, ax = new_figure()
    plot_bandwidth(ax, {"ours": rows}, ceiling_gbs=4200, label="measured on X on 2026-11-20")
    assert len(ax.lines) == 2 and "2026-11-20" in ax.get_title(loc="right")
    table = summary_table(rows, ceiling_gbs=4200, reference=rows[0]).data
    assert "95.2%" in table and "1.00×" in table


def test_the_python_a_chapter_prints_is_the_current_source():
    # Chapters print dispatch rules with print(inspect.getsource(f)). Their stored outputs are
    # what the published book shows, so a rule changed without re-running the chapter would be
    # shown as it was; each must hold the function's current text.
    printed = []
    for notebook, cells in chapter_code_cells().items():
        imported = {}  # name in the notebook -> (module, attribute)
        for _, tree in cells:
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("helpers"):
                    imported.update({a.asname or a.name: (node.module, a.name) for a in node.names})
        for cell, tree in cells:
            output = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "getsource"
                        and isinstance(node.args[0], ast.Name)):
                    name = node.args[0].id
                    assert name in imported, f"{notebook} prints {name}, which it does not import from helpers"
                    module, attribute = imported[name]
                    source = inspect.getsource(getattr(importlib.import_module(module), attribute))
                    assert source in output, f"{notebook}: the stored output of {name}'s source is stale"
                    printed.append((notebook, name))
    assert len(printed) >= 15, printed
