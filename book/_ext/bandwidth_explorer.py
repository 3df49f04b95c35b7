"""Sphinx extension: the recorded measurements, explorable in the published pages.

At the end of an HTML build, each ``book/data/<chapter>.json`` is written to
``_static/data/<chapter>.js`` as ``window.BOOK_DATA["<chapter>"] = {...}``, which
``explorer.js`` reads. A script (not a fetch) so that the explorer works even when
the site is opened from the file system, without a web server.
"""
import json
from pathlib import Path


def write_recorded_data(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir) / "_static" / "data"
    out.mkdir(parents=True, exist_ok=True)
    for source in sorted((Path(app.srcdir) / "book" / "data").glob("*.json")):
        data = json.loads(source.read_text())
        (out / f"{source.stem}.js").write_text(
            "window.BOOK_DATA = window.BOOK_DATA || {};\n"
            f"window.BOOK_DATA[{json.dumps(source.stem)}] = {json.dumps(data)};\n")


def drop_duplicate_scripts(app, pagename, templatename, context, doctree):
    """sphinx-thebe adds its inline configuration once per "env-before-read-docs"
    event, which a jupyter-book build fires twice: the second copy redeclares a
    const and is a JavaScript error on every page. Keep the first of identical scripts."""
    seen, kept = set(), []
    for script in context.get("script_files", []):
        # the copies differ only in filename None vs "": compare what ends up in the page
        key = (getattr(script, "filename", str(script)) or "",
               tuple(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    context["script_files"] = kept


def setup(app):
    app.add_js_file("explorer.js")
    app.add_css_file("explorer.css")
    app.connect("build-finished", write_recorded_data)
    app.connect("html-page-context", drop_duplicate_scripts, priority=990)  # after the others
    return {"parallel_read_safe": True, "parallel_write_safe": True}
