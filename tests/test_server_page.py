"""The page at ``/`` in a real headless browser (Debian's chromium, driven by Playwright): upload a
clip, watch the transcript arrive, download the subtitles. Skipped where no browser is installed."""
import os
import shutil
from pathlib import Path

import pytest

sync_api = pytest.importorskip("playwright.sync_api")
pytest.importorskip("fastapi")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip("no chromium installed", allow_module_level=True)

from test_server import Server  # noqa: E402

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOT = Path(os.environ.get("OSTINATO_SCREENSHOT", "/tmp/ostinato_page.png"))


def test_upload_stream_and_download(data_dir, tmp_path):
    import httpx

    clip = data_dir / "clips" / "c02_numbers.flac"
    server = Server("--batch-size", "4")
    try:
        # what the API answers for the same upload and the same (default) options
        want = httpx.post(server.url + "/v1/audio/transcriptions", files={"file": ("c02.flac", clip.read_bytes())},
                          timeout=120).json()["text"]
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)  # a fresh profile each launch
            page = browser.new_page()
            page.goto(server.url + "/")
            page.wait_for_selector("#model option", state="attached")
            page.set_input_files("#file", str(clip))
            page.wait_for_function("document.getElementById('state').textContent === 'Done.'", timeout=120_000)
            assert page.text_content("#transcript") == want
            with page.expect_download() as download:
                page.click("#srt")
            srt = Path(download.value.path()).read_text(encoding="utf-8")
            assert download.value.suggested_filename == "c02_numbers.srt"
            assert srt.startswith("1\n00:00:") and "-->" in srt
            page.wait_for_selector("#vtt:enabled")
            with page.expect_download() as download:
                page.click("#vtt")
            assert Path(download.value.path()).read_text(encoding="utf-8").startswith("WEBVTT")
            assert page.text_content("#state") == "Done."
            page.screenshot(path=str(SCREENSHOT), full_page=True)
            browser.close()
    finally:
        server.stop()
