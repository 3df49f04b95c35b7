"""The publishing configuration: what readers of a jupyter-book expect, kept consistent."""
import json
import re

import yaml

from helpers.paths import KERNELS, ROOT

CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
README = (ROOT / "README.md").read_text()


def readme_command(heading: str) -> str:
    """The command in the code block that follows a bold heading of the README."""
    found = re.search(rf"\*\*{re.escape(heading)}\*\*.*?```bash\n(.+?)\n```", README, re.S)
    assert found, f"no command under **{heading}** in README.md"
    return found.group(1).strip()


def test_the_workflow_builds_with_the_readme_command():
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "book.yml").read_text())
    runs = [step.get("run") for step in workflow["jobs"]["build"]["steps"]]
    assert readme_command("Build the book") in runs
    uses = [step.get("uses", "") for job in workflow["jobs"].values() for step in job["steps"]]
    assert any(u.startswith("actions/deploy-pages") for u in uses)
    assert any(u.startswith("actions/upload-pages-artifact") for u in uses)


def test_ci_runs_the_readme_commands():
    ci = (ROOT / ".ci" / "run").read_text()
    assert readme_command("Run the tests") in ci and readme_command("Build the book") in ci


def test_the_book_leaves_out_the_virtual_environment_the_readme_creates():
    # The README creates its environment inside the project; the build reads every page under
    # the root, and the packages' own README.md files would fail `jupyter-book build . -W`.
    found = re.search(r"python3 -m venv (\S+)", README)
    assert found, "no `python3 -m venv` command in README.md"
    assert found.group(1) in CONFIG["exclude_patterns"]


def test_the_config_has_what_readers_expect():
    assert CONFIG["execute"]["execute_notebooks"] == "off"  # built from the GPU run's outputs
    assert CONFIG["repository"]["url"].startswith("https://github.com/")
    html, launch = CONFIG["html"], CONFIG["launch_buttons"]
    assert html["use_repository_button"] and html["use_edit_page_button"] and html["use_download_button"]
    assert launch["colab_url"] and launch["binderhub_url"]
    overrides = CONFIG["sphinx"]["config"]["nb_mime_priority_overrides"]
    assert min(overrides, key=lambda o: o[2])[1] == "application/vnd.jupyter.widget-view+json"


def test_every_chapter_starts_with_a_hidden_install_cell_that_clones_this_repository():
    for notebook in sorted((ROOT / "book").glob("*.ipynb")):
        cells = json.loads(notebook.read_text())["cells"]
        first_code = next(c for c in cells if c["cell_type"] == "code")
        assert "remove-cell" in first_code["metadata"].get("tags", []), notebook.name
        source = "".join(first_code["source"])
        assert CONFIG["repository"]["url"] in source and 'find_spec("helpers") is None' in source


def test_every_chapter_has_an_explorer_of_its_recording():
    for notebook in sorted((ROOT / "book").glob("*.ipynb")):
        cells = json.loads(notebook.read_text())["cells"]
        markdown = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        assert f'class="bandwidth-explorer" data-chapter="{notebook.stem}"' in markdown, notebook.name
        assert (ROOT / "book" / "data" / f"{notebook.stem}.json").is_file()


def test_the_introduction_names_the_gpu_and_the_dates_of_the_recordings():
    # The introduction says when the figures were measured, chapter by chapter: re-recording a
    # chapter must move its date there too.
    intro = (ROOT / "book" / "intro.md").read_text()
    section = intro.split("## Which GPU produced the figures", 1)[1].split("\n## ", 1)[0]
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    chapters = [entry["file"].split("/")[-1] for part in toc["parts"] if part.get("numbered")
                for entry in part["chapters"]]
    said = {}
    for date, which in re.findall(r"\*\*(\d{4}-\d\d-\d\d)\*\* \(chapters? ([\d, and]+)\)", section):
        for number in re.findall(r"\d+", which):
            said[int(number)] = date
    recordings = {number: json.loads((ROOT / "book" / "data" / f"{name}.json").read_text())
                  for number, name in enumerate(chapters, start=1)}
    recorded = {number: recording["recorded"] for number, recording in recordings.items()}
    assert said == recorded
    # ...and on which GPU: one, for every chapter (a chapter recorded on another card would
    # sit beside prose and ceilings measured on this one)
    gpu = re.search(r"measured on one \*\*(.+?)\*\*", section).group(1)
    devices = {chapters[number - 1]: recording["device"] for number, recording in recordings.items()}
    assert set(devices.values()) == {gpu}, devices
    latest = max(recorded.values())
    assert f"recorded on {gpu} on {latest}" in intro


def test_the_appendix_shows_every_kernel_source():
    # book/kernels.md promises "every kernel of the book": a source file added to kernels/ (a header
    # shared by two chapters, say) must get its own section there.
    appendix = (ROOT / "book" / "kernels.md").read_text()
    shown = set(re.findall(r"```\{literalinclude\} \.\./kernels/(\S+)", appendix))
    sources = {p.name for p in KERNELS.iterdir() if p.suffix in (".cu", ".cuh")}
    assert sources - shown == set(), f"kernels missing from book/kernels.md: {sorted(sources - shown)}"
    assert shown - sources == set(), f"book/kernels.md includes files that are gone: {sorted(shown - sources)}"
