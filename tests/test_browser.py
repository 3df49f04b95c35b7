"""The published book and the interactive notebooks, in a real browser (Debian's Chromium).

Without Chromium, ChromeDriver and Selenium these tests are skipped, except where
BOOK_BROWSER_TESTS=1 (set by .ci/run, which installs them): there they fail.
A failing test leaves a screenshot in test-artifacts/.
"""
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from helpers.paths import DATA, ROOT

ARTIFACTS = ROOT / "test-artifacts"
REQUIRED = os.environ.get("BOOK_BROWSER_TESTS") == "1"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _need_browser():
    missing = [name for name, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)) if path is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium")
    if missing:
        message = (f"browser tests need {', '.join(missing)} "
                   "(apt-get install chromium chromium-driver; pip install selenium)")
        if REQUIRED:
            pytest.fail(message)
        pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_http(url: str, seconds: float = 60.0):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {seconds} s")


@pytest.fixture(scope="module")
def browser():
    _need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1300,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@contextlib.contextmanager
def screenshot_on_failure(driver, name: str):
    try:
        yield
    except BaseException:
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))
        raise


def wait(driver, condition, seconds: float = 30.0, what: str = "condition"):
    """Wait for a condition; elements replaced while it is checked (a redrawn plot) are retried."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, seconds, poll_frequency=0.2,
                         ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)
                         ).until(condition, f"timed out waiting for {what}")


# ------------------------------------------------------------------ the built site

@pytest.fixture(scope="module")
def site(tmp_path_factory):
    _need_browser()
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "jupyter_book", "build", str(ROOT), "--path-output", str(out), "-W"],
                           capture_output=True, text=True)
    if built.returncode != 0:  # older jupyter-book: the CLI module is jupyter_book.cli.main
        built = subprocess.run(["jupyter-book", "build", str(ROOT), "--path-output", str(out), "-W"],
                               capture_output=True, text=True)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(out / "_build" / "html")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/"
    try:
        wait_for_http(base)
        yield base
    finally:
        server.terminate()
        server.wait(10)


def toc_pages() -> list:
    """Every page of _toc.yml, as paths of the built site."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]] + [c["file"] for part in toc.get("parts", []) for c in part["chapters"]]
    return [f"{f}.html" for f in files]


def console_problems(driver, base: str) -> list:
    """Errors in the console, except external resources this offline machine cannot
    fetch (MathJax, the widget manager and require.js come from CDNs on the real site)."""
    problems = []
    for entry in driver.get_log("browser"):
        if entry["level"] != "SEVERE":
            continue
        message = entry["message"]
        if not message.startswith(base) and "net::ERR_NAME_NOT_RESOLVED" in message:
            continue
        problems.append(message)
    return problems


def open_page(driver, url: str):
    driver.get(url)
    wait(driver, lambda d: d.execute_script("return document.readyState") == "complete", what=f"{url} to load")


def test_every_page_loads_without_console_errors(browser, site):
    for page in toc_pages():
        with screenshot_on_failure(browser, f"page-{Path(page).stem}"):
            open_page(browser, site + page)
            time.sleep(0.3)  # scripts that run after load (the explorer) get their turn
            assert browser.title.strip(), page
            assert console_problems(browser, site) == [], page


def test_chapters_show_their_figures_and_the_recorded_gpu(browser, site):
    from selenium.webdriver.common.by import By
    for recording in sorted(DATA.glob("*.json")):
        data = json.loads(recording.read_text())
        with screenshot_on_failure(browser, f"figures-{recording.stem}"):
            open_page(browser, f"{site}book/{recording.stem}.html")
            images = browser.find_elements(By.CSS_SELECTOR, "main .cell_output img")  # the figures
            assert len(images) >= 2, f"{recording.stem}: {len(images)} figures"
            for image in images:
                browser.execute_script("arguments[0].scrollIntoView()", image)
                wait(browser, lambda d: d.execute_script("return arguments[0].complete", image), what="an image")
                width = browser.execute_script("return arguments[0].naturalWidth", image)
                assert width > 0 and image.size["height"] > 0, image.get_attribute("src")[:80]
            text = browser.find_element(By.TAG_NAME, "main").text
            assert f"measured on {data['device']} on {data['recorded']}" in text


def test_the_tables_chapters_print_render_as_tables(browser, site):
    # The results tables are Markdown that the cells display; rendered as CommonMark (myst-nb's
    # default) they came out as lines of pipes, in every chapter, until nb_render_markdown_format.
    from selenium.webdriver.common.by import By
    for recording in sorted(DATA.glob("*.json")):
        chapter = recording.stem
        notebook = json.loads((ROOT / "book" / f"{chapter}.ipynb").read_text())
        printed = sum("".join(o.get("data", {}).get("text/markdown", "")).count("\n|---")
                      for cell in notebook["cells"] if cell["cell_type"] == "code" for o in cell.get("outputs", []))
        with screenshot_on_failure(browser, f"tables-{chapter}"):
            open_page(browser, f"{site}book/{chapter}.html")
            tables = browser.find_elements(By.CSS_SELECTOR, "main .cell_output table")
            raw = [p.text[:80] for p in browser.find_elements(By.CSS_SELECTOR, "main .cell_output p")
                   if p.text.lstrip().startswith("|")]
            assert printed > 0 and len(tables) >= printed and raw == [], (chapter, printed, len(tables), raw[:3])


def test_internal_links_resolve(browser, site):
    from selenium.webdriver.common.by import By
    checked = set()
    for page in toc_pages():
        open_page(browser, site + page)
        for link in browser.find_elements(By.CSS_SELECTOR, "a[href]"):
            href = link.get_attribute("href")
            target = urllib.parse.urldefrag(href).url
            if not target.startswith(site) or target in checked:
                continue
            checked.add(target)
            with urllib.request.urlopen(target, timeout=10) as answer:
                assert answer.status == 200, f"{page} links to {href}"
    assert len(checked) >= len(toc_pages())


def test_the_explorer_follows_its_control(browser, site):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    for chapter in ("bandwidth", "gelu"):
        with screenshot_on_failure(browser, f"explorer-{chapter}"):
            open_page(browser, f"{site}book/{chapter}.html")
            root = wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, ".bandwidth-explorer[data-drawn]"),
                        what="the explorer")
            browser.execute_script("arguments[0].scrollIntoView()", root)
            before_count = int(root.get_attribute("data-drawn"))
            before = root.find_element(By.CSS_SELECTOR, "polyline.series").get_attribute("points")
            assert before and "recorded on" in root.text
            dtype = Select(root.find_element(By.CSS_SELECTOR, "select[name=dtype]"))
            selected = dtype.first_selected_option.get_attribute("value")
            other = next(o.get_attribute("value") for o in dtype.options if o.get_attribute("value") != selected)
            dtype.select_by_value(other)
            wait(browser, lambda d: int(root.get_attribute("data-drawn")) > before_count, what="a redraw")
            after = root.find_element(By.CSS_SELECTOR, "polyline.series").get_attribute("points")
            assert after and after != before
            assert "not recorded" not in root.text


# ------------------------------------------------------------------ JupyterLab

@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    _need_browser()
    folder = tmp_path_factory.mktemp("lab")
    shutil.copy(ROOT / "book" / "bandwidth.ipynb", folder)  # a copy: autosave never touches the book
    port = free_port()
    env = dict(os.environ, BOOK_REPLAY="1", BOOK_ROOT=str(ROOT))  # replay: the same on every machine
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
         f"--ServerApp.root_dir={folder}", "--ServerApp.allow_root=True", "--LabApp.expose_app_in_browser=True",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}/"
    try:
        wait_for_http(base + "api/status", 90)
        yield base
    finally:
        server.terminate()  # shut the server (and its kernels) down
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()


def test_a_chapter_runs_in_jupyterlab_and_its_panel_follows_the_block_size(browser, jupyterlab):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    with screenshot_on_failure(browser, "jupyterlab"):
        browser.get(jupyterlab + "lab/tree/bandwidth.ipynb")
        wait(browser, lambda d: d.execute_script(
            "const app = window.jupyterapp; const w = app && app.shell.currentWidget;"
            "return !!(w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
            " && w.sessionContext.session.kernel.status === 'idle');"), 120, "the notebook's kernel")
        browser.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        # Every cell has run (no "[*]" prompt left) and the kernel is idle: the panel's
        # first sweep is over, so the plot changes only when we move the control.
        wait(browser, lambda d: d.execute_script(
            "const prompts = Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt'));"
            "const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;"
            "return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent))"
            " && kernel.status === 'idle';"), 300, "all cells to run")
        label = "//label[normalize-space()='block_size']/following-sibling::select"
        select_element = wait(browser, lambda d: d.find_element(By.XPATH, label), 60, "the panel's block-size control")
        panel = select_element.find_element(By.XPATH, "ancestor::div[contains(@class,'widget-vbox')][1]")
        plot = lambda: panel.find_element(By.CSS_SELECTOR, "img").get_attribute("src")  # noqa: E731
        before = wait(browser, lambda d: plot(), 60, "the panel's plot")
        block = Select(select_element)
        current = block.first_selected_option.text
        other = next(o.text for o in block.options if o.text != current)
        block.select_by_visible_text(other)
        wait(browser, lambda d: plot() != before, 120, "the plot to follow the block size")
        errors = browser.find_elements(By.CSS_SELECTOR,
                                       ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
        tracebacks = [e.text for e in errors if "Traceback" in e.text or "Error" in e.text]
        assert tracebacks == []
