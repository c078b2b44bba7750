"""The dashboard in real headless Chromium: rendered by its JavaScript from live data.

Needs Debian's ``chromium`` (``bash scripts/browser.sh install``): skipped when missing,
failed when ``CI`` is set. The screenshot is kept as ``tests/artifacts/dashboard.png``;
``docs/dashboard.png`` (the README's picture) is written when missing or when
``NOTIFY_UPDATE_DOCS=1``.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from notify.testing import BrokerProcess
from tests.conftest import IN_CI
from tests.helpers import WireClient
from tests.http.conftest import Http, prepare_xa, xid

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


def _devtools_eval(browser: str, tmp: Path, url: str, expression: str) -> str:
    """Open ``url`` in headless Chromium and evaluate ``expression`` (a promise) in the page
    through the DevTools protocol (loopback); its string value."""
    profile = tmp / f"profile-{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", f"--user-data-dir={profile}",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", url],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )

    async def run() -> str:
        last: object = None
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        async with aiohttp.ClientSession() as s:
            while True:
                async with s.get(f"http://127.0.0.1:{port}/json/list") as r:
                    pages = [t for t in await r.json() if t["type"] == "page"]
                if pages:
                    break
                await asyncio.sleep(0.1)
            async with s.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                for attempt in range(1, 50):  # the first ones may run before the page loaded
                    await ws.send_json({"id": attempt, "method": "Runtime.evaluate", "params": {
                        "expression": expression, "awaitPromise": True, "returnByValue": True}})
                    async for m in ws:
                        reply = json.loads(m.data)
                        if reply.get("id") == attempt:
                            break
                    res = reply.get("result")
                    if res is not None and "exceptionDetails" not in res:
                        return str(res["result"]["value"])
                    last = reply
                    await asyncio.sleep(0.2)
        raise AssertionError(f"no answer from the page: {last}")

    try:
        return asyncio.run(asyncio.wait_for(run(), 60))
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


def test_dashboard_queue_groups_and_dead_letter_replay(
    browser: str, http_broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    b = http_broker_factory({"jobs": 1}, adminSecret="adm-pw")
    with WireClient(b.addr) as c:  # three jobs: two rejected (dead letters), one accepted
        c.send(b"".join(b"put jobs 0 4 0 %d\r\njob%d" % (i, i) for i in range(3)))
        assert all(r.code == 200 for r in c.replies(3))
        c.send(b"qsub jobs workers 10 earliest 9\r\n")
        got = c.replies(4)
        offs = [r.offset for r in got if r.kind == "qmsg"]
        assert len(offs) == 3
        items = b"X 0 %d\nX 0 %d\nA 0 %d\n" % tuple(offs)
        r = c.call(b"qack jobs workers %d 10\r\n%s" % (len(items), items))
        assert r.code == 200 and r.body.startswith(b"3 0"), r
    h = Http(b.http_url, token="adm-pw")
    # the group table and its dead letters, opened by the URL's #dlq=
    dom = chromium(browser, tmp_path, b.http_url + "/?token=adm-pw#dlq=jobs/workers", "--dump-dom")
    html = dom.stdout.decode()
    assert 'data-queue="jobs/workers"' in html, html[-3000:]
    assert "Dead letters of jobs/workers" in html
    assert f'data-dead="0:{offs[0]}"' in html and f'data-dead="0:{offs[1]}"' in html
    assert "job0" in html and "2 dead letter(s)" in html and ">Replay<" in html
    # without the adminSecret the groups show, their dead letters are refused (and it says so)
    html2 = chromium(browser, tmp_path, b.http_url + "/#dlq=jobs/workers", "--dump-dom")
    text2 = html2.stdout.decode()
    assert 'data-queue="jobs/workers"' in text2 and "dead letters are an admin view" in text2
    assert 'data-dead="' not in text2
    # a click on Replay: the page's POST passes the server's auth and cross-site checks
    value = _devtools_eval(browser, tmp_path, b.http_url + "/?token=adm-pw#dlq=jobs/workers", f"""
        new Promise((resolve, reject) => {{
          const t0 = Date.now();
          const tick = () => {{
            const btn = document.querySelector('tr[data-dead="0:{offs[0]}"] button');
            const h = document.getElementById("dlq-hint");  // null until the page loaded
            const hint = h ? h.textContent : "";
            if (hint.startsWith("replayed")) return resolve(hint);
            if (btn && !btn.dataset.clicked) {{ btn.dataset.clicked = "1"; btn.click(); }}
            if (Date.now() - t0 > 20000) return reject(new Error("no replay: " + hint));
            setTimeout(tick, 100);
          }};
          tick();
        }})""")
    assert value == "replayed 1", value
    dl = h.get("/api/queues/jobs/workers/dead-letters").json()
    assert [d["offset"] for d in dl["dead_letters"]] == [offs[1]]


def test_dashboard_deletes_a_queue_group(
    browser: str, http_broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """The open group's Delete group button (after its confirm) deletes the group through
    the admin REST route; the page says so and the group is gone from the broker."""
    b = http_broker_factory({"jobs": 1}, adminSecret="adm-pw")
    with WireClient(b.addr) as c:
        assert c.call(b"qsub jobs idle 10 latest 1\r\n").code == 200
        assert c.call(b"qunsub jobs idle 2\r\n").code == 200
    value = _devtools_eval(browser, tmp_path, b.http_url + "/?token=adm-pw#dlq=jobs/idle", """
        new Promise((resolve, reject) => {
          window.confirm = () => true;
          const t0 = Date.now();
          const tick = () => {
            const btn = document.getElementById("queue-delete");
            const h = document.getElementById("queues-hint");
            const hint = h ? h.textContent : "";
            if (hint.startsWith("deleted")) return resolve(hint);
            const box = document.getElementById("dlq");
            if (btn && box && !box.hidden && !btn.dataset.clicked) {
              btn.dataset.clicked = "1"; btn.click();
            }
            if (Date.now() - t0 > 20000) return reject(new Error("no deletion: " + hint));
            setTimeout(tick, 100);
          };
          tick();
        })""")
    assert value == "deleted jobs/idle", value
    assert Http(b.http_url, token="adm-pw").get("/api/queues").json()["queues"] == []
