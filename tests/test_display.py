import ast
import importlib
import inspect
import json

import matplotlib
import pytest

matplotlib.use("Agg")

from helpers.bench import Row  # noqa: E402
from helpers.display import kernel_source, new_figure, plot_bandwidth, size_label, summary_table  # noqa: E402


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
    from helpers.paths import ROOT
    return {notebook.name: [(cell, ast.parse("".join(cell["source"])))
                            for cell in json.loads(notebook.read_text())["cells"] if cell["cell_type"] == "code"]
            for notebook in sorted((ROOT / "book").glob("*.ipynb"))}


def test_every_kernel_a_chapter_shows_is_in_its_source():
    # A renamed kernel or struct would otherwise surface only when the notebook runs on a GPU.
    shown = []
    for notebook, cells in chapter_code_cells().items():
        for _, tree in cells:
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "show_kernel":
                    file, *names = [ast.literal_eval(arg) for arg in node.args]
                    shown += [(notebook, file, name) for name in names]
    assert len(shown) > 20
    for notebook, file, name in shown:
        assert kernel_source(file, name), (notebook, file, name)


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
