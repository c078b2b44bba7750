"""The dashboard in real headless Chromium: rendered by its JavaScript from live data.

Needs Debian's ``chromium`` (``bash scripts/browser.sh install``): skipped when missing,
failed when ``CI`` is set. The screenshot is kept as ``tests/artifacts/dashboard.png``;
``docs/dashboard.png`` (the README's picture) is written when missing or when
``NOTIFY_UPDATE_DOCS=1``.
"""

from __future__ import annotations

import math
import os
import shutil
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from notify.testing import BrokerProcess
from tests.conftest import IN_CI
from tests.http.conftest import Http, prepare_xa, xid
from tests.wireclient import WireClient

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
DOCS_PNG = ROOT / "docs" / "dashboard.png"
MAX_DOCS_PNG = 300 * 1024
BROWSER = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
SHOWCASE = {
    "orders": {"numPartitions": 4, "unflushThreshold": 0},
    "payments": 2,
    "events": 8,
    "audit": 1,
}


@pytest.fixture
def browser() -> str:
    if BROWSER is None:
        msg = "chromium not installed (bash scripts/browser.sh install)"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return BROWSER


def chromium(browser: str, tmp: Path, url: str, *mode: str) -> subprocess.CompletedProcess[bytes]:
    profile = tmp / f"profile-{time.monotonic_ns()}"
    cmd = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--user-data-dir={profile}",
        "--window-size=1400,900",
        "--virtual-time-budget=5000",
        *mode,
        url,
    ]
    try:
        return subprocess.run(cmd, capture_output=True, timeout=90, check=False, cwd=tmp)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def busy_broker(
    http_broker_factory: Callable[..., BrokerProcess],
) -> Iterator[BrokerProcess]:
    """A broker with traffic (waves of puts, two consumer groups) and an in-doubt tx."""
    b = http_broker_factory(SHOWCASE)
    h = Http(b.http_url)
    stop = threading.Event()
    errors: list[BaseException] = []

    def traffic() -> None:
        i = 0
        try:
            with WireClient(b.addr) as c:
                while not stop.is_set():
                    wave = 1 + math.sin(i / 6)
                    n = 4 + int(10 * wave)
                    h.post("/api/topics/orders/messages", json_body=[{"text": f"order {i}"}] * n)
                    h.post("/api/topics/events/messages", json_body=[{"text": "e" * 180}] * n * 2)
                    if i % 3 == 0:
                        h.post("/api/topics/payments/messages", json_body={"text": "pay"})
                    c.call(b"get orders billing 0 0 65536 1\r\n")
                    c.call(b"get events analytics 3 %d 65536 2\r\n" % (i * 900))
                    c.call(b"get events analytics 5 0 4096 3\r\n")
                    i += 1
                    stop.wait(0.05)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=traffic, name="dashboard-traffic")
    t.start()
    try:
        prepare_xa(b.addr, xid(0x2A, "shop"), "payments", 0, [b"charge", b"receipt"])
        with WireClient(b.addr) as c:  # an active local transaction, in flight
            assert c.call(b"transaction TX:web-7:1 web-7 BEGIN 1\r\n").code == 200
            time.sleep(5)  # samples for the charts
            yield b
    finally:
        stop.set()
        t.join(10)
    assert not errors, errors


def test_dashboard_renders_live_data(
    browser: str, busy_broker: BrokerProcess, tmp_path: Path
) -> None:
    url = busy_broker.http_url + "/"
    dom = chromium(browser, tmp_path, url, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout.decode()
    assert 'data-ready="1"' in html, html[:2000]  # rendered by the script from api/overview
    for text in ("orders", "payments", "events", "audit", "billing", "analytics", "in doubt"):
        assert text in html, text
    assert xid(0x2A, "shop") in html and "TX:web-7:1" in html
    assert 'class="banner"' in html and "hidden" in html.split('id="banner"')[1][:40]
    assert "group commit" in html  # orders is unflushThreshold=0

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    shot.unlink(missing_ok=True)
    run = chromium(browser, tmp_path, url, f"--screenshot={shot}")
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1400, 900)
    assert 30_000 < len(data) < MAX_DOCS_PNG  # a rendered page, not a blank one
    if not DOCS_PNG.exists() or os.environ.get("NOTIFY_UPDATE_DOCS") == "1":
        DOCS_PNG.parent.mkdir(exist_ok=True)
        shutil.copyfile(shot, DOCS_PNG)


def test_dashboard_with_auth(
    browser: str, http_broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    b = http_broker_factory({"secured": 1}, authSecret="dash-pw")
    assert Http(b.http_url).get("/dashboard.js").status == 401
    ok = chromium(browser, tmp_path, b.http_url + "/?token=dash-pw", "--dump-dom")
    html = ok.stdout.decode()
    assert 'data-ready="1"' in html and "secured" in html, html[:2000]
    assert "auth on" in html
    assert "metrics?token=dash-pw" in html  # links keep the token
