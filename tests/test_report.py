"""`vtrain-fast report DIR -o OUT` (issue 14): one self-contained HTML page of a results folder.

The page has its sections, every image is an inline base64 PNG (also written next to it), no
network resource or script is named, text is escaped; the command refuses a non-empty folder
without --overwrite; and, where a Chromium is installed, the page is opened in headless Chromium
and its screenshot is looked at: the window's size, not blank, the title drawn at the top and
the frontier's GPU colours on screen."""
from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from vtrain_fast.analysis.html_report import SECTIONS, html_table, mfu_grid
from vtrain_fast.cli import app

SPEC = """\
name = "report-tiny"
[model]
presets = ["gpt3-1.3b"]
[training]
num_tokens = 1e10
global_batch_size = 64
micro_batch_size = [1, 2, 4]
recompute = ["none", "full"]
[cluster]
gpu = ["a100-sxm4-80gb", "h100-sxm-80gb"]
num_gpus = [8, 16, 32]
[parallel]
tp = [1, 2, 4, 8]
pp = [1, 2, 4]
"""

STUDY = """\
name = "report-study"
[optimal]
gpus = 64
days = 10
gpu = "a100-sxm4-80gb"
min_params = 1e8
max_params = 1e10
num_sizes = 5
"""

TAB10_BLUE, TAB10_ORANGE = (31, 119, 180), (255, 127, 14)     # the frontier's first two GPUs
WIDTH_PX, HEIGHT_PX = 1200, 3000


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A small sweep's folder and its report with the compute-optimal section."""
    tmp = tmp_path_factory.mktemp("report")
    (tmp / "spec.toml").write_text(SPEC)
    (tmp / "study.toml").write_text(STUDY)
    runner = CliRunner()
    r = runner.invoke(app, ["sweep", str(tmp / "spec.toml"), "-o", str(tmp / "res")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["report", str(tmp / "res"), "-o", str(tmp / "out"), "--optimal", str(tmp / "study.toml")])
    assert r.exit_code == 0, r.output
    return tmp


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(m, validate=True)
            for m in re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


def test_the_page_holds_its_sections_and_inline_pngs(built):
    page = (built / "out" / "index.html").read_text()
    for key in SECTIONS:
        assert f'<section id="{key}">' in page, key
    pngs = _images(page)
    assert len(pngs) == 4 == page.count("<img ")          # frontier, mfu, breakdown, optimal
    import matplotlib.image as mpimg
    for data, name in zip(pngs, ("frontier", "mfu", "breakdown", "optimal")):
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data == (built / "out" / f"{name}.png").read_bytes()
        img = mpimg.imread(io.BytesIO(data), format="png")
        assert img.shape[0] > 200 and img.shape[1] > 400 and img[..., :3].std() > 0.05
    assert not re.search(r"https?://|<script|<link|@import|src=\"(?!data:)", page)
    assert "micro-batch 4" in page or "micro-batch 2" in page or "micro-batch 1" in page
    assert "h100-sxm-80gb" in page and "a100-sxm4-80gb" in page and "report-tiny" in page
    assert "realistic optimum" in page and "naive (100 % utilisation)" in page
    assert "<th>cost_usd</th>" in page and "<th>memory_tight</th>" in page and "feasible (status ok)" in page
    assert not list(built.glob(".out.*"))                  # no temporary folder left


def test_the_mfu_grid_is_the_best_over_the_other_axes():
    plans = pl.DataFrame({"tp": [1, 1, 2, 2, 1], "pp": [1, 1, 1, 2, 2], "micro_batch_size": [2, 2, 2, 1, 1],
                          "mfu": [0.3, 0.5, 0.4, 0.6, 0.1]})
    mbs, tps, pps, grid = mfu_grid(plans)
    assert mbs == 1 and tps == [1, 2] and pps == [1, 2]
    assert np.isnan(grid[0, 0]) and np.isnan(grid[0, 1]) and grid[1, 1] == 0.6 and grid[1, 0] == 0.1
    mbs, _, _, grid = mfu_grid(plans.filter(pl.col("micro_batch_size") == 2))
    assert mbs == 2 and grid[0, 0] == 0.5 and grid[0, 1] == 0.4


def test_text_is_escaped():
    t = html_table(pl.DataFrame({"<th>": ["<script>&"], "mfu": [0.5]}))
    assert "<script>" not in t and "&lt;script&gt;&amp;" in t and "&lt;th&gt;" in t and "50.0%" in t


def test_cli_refuses_a_full_folder_and_overwrites_with_the_flag(built):
    runner = CliRunner()
    out = built / "out2"
    (out).mkdir()
    (out / "keep.txt").write_text("x")
    r = runner.invoke(app, ["report", str(built / "res"), "-o", str(out)])
    assert r.exit_code == 2 and "--overwrite" in r.output and "Traceback" not in r.output
    assert (out / "keep.txt").exists()
    r = runner.invoke(app, ["report", str(built / "res"), "-o", str(out), "--overwrite"])
    assert r.exit_code == 2 and "keep.txt" in r.output        # a file report did not write: never replaced
    assert (out / "keep.txt").read_text() == "x"
    (out / "keep.txt").rename(out / "index.html")              # an earlier report's folder: replaced
    r = runner.invoke(app, ["report", str(built / "res"), "-o", str(out), "--overwrite"])
    assert r.exit_code == 0, r.output
    assert not (out / "keep.txt").exists() and (out / "index.html").read_text() != "x"
    page = (out / "index.html").read_text()
    assert "--optimal STUDY.toml" in page and len(_images(page)) == 3     # says how to add the curve
    for args in (["report", str(built / "nope"), "-o", str(built / "o3")],
                 ["report", str(built / "res"), "-o", str(built / "spec.toml")],
                 ["report", str(built / "res"), "-o", str(built / "o4"), "--optimal", str(built / "spec.toml")]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert "error:" in r.output and "Traceback" not in r.output
    assert not (built / "o3").exists() and not (built / "o4").exists()


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("chromium-headless-shell")


def test_the_page_in_headless_chromium(built):
    browser = _chromium()
    if browser is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium); the browser check needs one")
    shot = built / "shot.png"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--window-size={WIDTH_PX},{HEIGHT_PX}", f"--screenshot={shot}", (built / "out" / "index.html").as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=60)
    if not shot.exists():                    # older Chromium: the new headless mode by name
        subprocess.run([cmd[0], "--headless=new"] + cmd[2:], capture_output=True, timeout=60)
    assert shot.exists(), "Chromium wrote no screenshot"
    import matplotlib.image as mpimg
    img = (mpimg.imread(shot)[..., :3] * 255).round().astype(np.int16)
    assert img.shape[:2] == (HEIGHT_PX, WIDTH_PX)
    assert img.std() > 10
    colours = np.unique(img.reshape(-1, 3), axis=0)
    assert len(colours) > 200
    top = img[:120]
    assert (top < 100).all(axis=2).sum() > 500          # the title's dark text is drawn at the top
    for colour in (TAB10_BLUE, TAB10_ORANGE):           # the frontier's GPU colours, above the heatmap
        near = (np.abs(img[:1000] - np.array(colour)) <= 12).all(axis=2)   # the first image: the frontier
        assert near.sum() > 200, colour


def test_where_and_memory_margin_narrow_every_part(built):
    """--where keeps one GPU's plans: its frontier table names only that GPU and the heatmap's
    best MFU is that GPU's; --memory-margin leaves the tight plans out of the frontier."""
    from vtrain_fast.analysis.query import feasible_plans, pareto
    runner = CliRunner()
    gpu = "h100-sxm-80gb"
    r = runner.invoke(app, ["report", str(built / "res"), "-o", str(built / "o5"), "--where", f"gpu=={gpu}",
                            "--memory-margin", "0.5"])
    assert r.exit_code == 0, r.output
    page = (built / "o5" / "index.html").read_text()
    tables = page.split('id="tables"')[1].split("<h3>Results folder</h3>")[0]
    assert gpu in tables and "a100-sxm4-80gb" not in tables
    assert f"only plans with gpu=={gpu}" in page and "50%" in page
    from vtrain_fast.analysis.query import with_memory_headroom
    from vtrain_fast.io.writer import read_manifest
    lf = feasible_plans(built / "res", where=[f"gpu=={gpu}"])
    best = (with_memory_headroom(lf, read_manifest(built / "res"), 0.5).filter(~pl.col("memory_tight"))
            .select(pl.col("mfu").max()).collect().item())
    unmargined = lf.select(pl.col("mfu").max()).collect().item()
    assert f"({best:.1%})" in page and best <= unmargined          # the heatmap leaves out the tight plans too
    front = pareto(built / "res", ["cost_usd", "train_days"], ["gpu"], where=[f"gpu=={gpu}"], memory_margin=0.5)
    assert front.height and not front["memory_tight"].any()
    for args in (["--where", "gpu==nope"], ["--memory-margin", "1.5"], ["--memory-margin", "0.99"]):
        r = runner.invoke(app, ["report", str(built / "res"), "-o", str(built / "o6"), *args])
        assert r.exit_code == 2 and "error:" in r.output and "Traceback" not in r.output, (args, r.output)
        assert not (built / "o6").exists()
