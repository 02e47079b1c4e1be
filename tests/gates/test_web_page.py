"""The web page in a real browser: Debian's chromium, headless, driven through chromium-driver
(Selenium), against a server this test starts on 127.0.0.1 with a tiny model.

Checked: the page loads with no console error; a message sent streams its reply into the page
(the reasoning apart, folded once the answer begins); the engine panel shows a hit rate and
its grid changes with the reply; stop cancels a long reply on the server; the decision form
shows each option's probability. Tokens are slowed down on the server (a sleep per token) so
that a human-speed reply can be watched arriving. Each test writes a screenshot under pytest's
temporary directory (``BMOE_WEB_SCREENSHOTS=DIR`` writes them there instead).

Skipped where chromium or chromedriver is not installed (``apt-get install chromium
chromium-driver``; CI installs both).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_server import Running, serving  # the in-process server of test_server.py

from bmoe.testing.fixtures import THINK_ANSWER, THINK_REASONING

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="the browser tests need Debian's chromium and chromium-driver: "
    "apt-get install chromium chromium-driver",
)
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra)")
from selenium.webdriver.common.by import By  # noqa: E402  (after the skip: selenium may be absent)
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

WAIT = 30.0
LONG = ["-c", "1024"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1280,800")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    chosen = os.environ.get("BMOE_WEB_SCREENSHOTS")
    folder = Path(chosen) if chosen else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def paced(s: Running, seconds: float) -> None:
    """Make each token of ``s``'s session take at least ``seconds`` (on the worker)."""
    session = s.served.session
    generate = session.generate

    def slow(request: Any, on_progress: Any = None, on_begin: Any = None, **kw: Any) -> Any:
        def report(p: Any) -> None:
            time.sleep(seconds)
            on_progress(p)

        return generate(request, report if on_progress is not None else None, on_begin, **kw)

    session.generate = slow  # type: ignore[method-assign]


def wait(driver: Any, what: Callable[[Any], Any], timeout: float = WAIT) -> Any:
    return WebDriverWait(driver, timeout, poll_frequency=0.02).until(what)


def text(driver: Any, css: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


@contextlib.contextmanager
def page(driver: Any, s: Running) -> Iterator[None]:
    """The page of ``s`` loaded (the model named, the first metrics event in); left for a
    blank page after, so that the server stops without a client attached."""
    driver.get_log("browser")  # drop what an earlier test left
    driver.get(s.url.removesuffix("/v1") + "/")
    try:
        wait(driver, lambda d: s.served.model_id in text(d, "#model"))
        wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-metrics"))
        yield
    finally:
        driver.get("about:blank")


def console_errors(driver: Any) -> list[dict[str, Any]]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def set_field(driver: Any, field: str, value: str) -> None:
    box = driver.find_element(By.ID, field)
    box.clear()
    box.send_keys(value)


def send(driver: Any, message: str, **settings: str) -> None:
    if settings:
        if not driver.find_element(By.ID, "settings").get_attribute("open"):
            driver.find_element(By.CSS_SELECTOR, "#settings summary").click()
        for field, value in settings.items():
            set_field(driver, field, value)
    set_field(driver, "prompt", message)
    driver.find_element(By.ID, "send").click()


def grid(driver: Any) -> tuple[str, str]:
    """The grid's cells (as the page drew them) and its pixels."""
    canvas = driver.find_element(By.ID, "grid")
    pixels = driver.execute_script("return arguments[0].toDataURL()", canvas)
    return str(canvas.get_attribute("data-cells")), str(pixels)


def reply_state(driver: Any) -> str | None:
    """The last reply's ``data-state``: None while it streams, then done, stopped or error."""
    bubbles = driver.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant")
    return bubbles[-1].get_attribute("data-state") if bubbles else None


def test_a_message_streams_its_reply_and_the_engine_panel_follows(
    browser: Any, tiny_model_path: Any, shots: Path
) -> None:
    with serving(tiny_model_path("qwen3moe-think"), "--moe-stream", "--decide") as s:
        paced(s, 0.15)
        with page(browser, s):
            assert grid(browser)[0] != ""  # the first metrics event is drawn
            assert text(browser, "#m-requests") == "0"
            before = grid(browser)
            send(browser, "Hello there", temperature="0", max_tokens="40")
            bubble = "#messages .msg.assistant"
            # the reasoning streams in first, shown apart, while the answer is still empty
            wait(browser, lambda d: THINK_REASONING in text(d, f"{bubble} .reasoning-text"))
            assert text(browser, f"{bubble} .content") == ""
            assert reply_state(browser) is None
            wait(browser, lambda d: reply_state(d) == "done")
            assert text(browser, f"{bubble} .content") == THINK_ANSWER
            fold = browser.find_element(By.CSS_SELECTOR, f"{bubble} .reasoning")
            assert fold.is_displayed() and not fold.get_attribute("open")  # folded once the answer began
            fold.find_element(By.TAG_NAME, "summary").click()
            assert THINK_REASONING in fold.text
            # the engine panel: the request ended, its hit rate shown, the grid redrawn
            wait(browser, lambda d: text(d, "#m-requests") == "1" and text(d, "#state") == "idle")
            hit = text(browser, "#m-hit")
            assert hit.endswith("%") and 0.0 <= float(hit.removesuffix("%")) <= 100.0
            assert "MiB" in text(browser, "#m-cache-text")
            after = grid(browser)
            assert after[0] != before[0] and after[1] != before[1]
            assert any(int(c, 16) & 1 for c in after[0].replace(" ", ""))  # experts now cached
            # a decision: each option's probability
            set_field(browser, "d-prefix", "Task: turn on Wi-Fi. ")
            set_field(browser, "d-suffix", "Options: A) Network B) Display. Answer with the letter.")
            set_field(browser, "d-choices", "A\nB")
            browser.find_element(By.ID, "d-go").click()
            wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#d-result .option")) == 2)
            shares = browser.find_elements(By.CSS_SELECTOR, "#d-result .p")
            assert sum(float(p.text.removesuffix("%")) for p in shares) == pytest.approx(100.0, abs=0.2)
            assert len(browser.find_elements(By.CSS_SELECTOR, "#d-result .option.best")) == 1
            browser.save_screenshot(str(shots / "web-page-chat.png"))
            assert console_errors(browser) == []


def test_stop_cancels_a_long_reply_on_the_server(browser: Any, tiny_model_path: Any, shots: Path) -> None:
    with serving(tiny_model_path("qwen3moe"), "--moe-stream", *LONG) as s:
        paced(s, 0.05)  # 900 tokens would take 45 s
        with page(browser, s):
            send(browser, "Tell me a long story", temperature="1", seed="7", max_tokens="900")
            content = "#messages .msg.assistant .content"
            lengths: set[int] = set()

            def grown(d: Any) -> bool:
                lengths.add(len(text(d, content)))
                return len(lengths - {0}) >= 3  # the reply arrived in pieces

            wait(browser, grown)
            wait(browser, lambda d: text(d, "#state") == "decode")
            browser.find_element(By.ID, "stop").click()
            t0 = time.monotonic()
            wait(browser, lambda d: reply_state(d) == "stopped")

            def ended(_: Any) -> bool:
                r = s.served.monitor.view().request
                return r is not None and r.outcome is not None

            wait(browser, ended, timeout=5.0)  # the server cancelled it at once
            assert time.monotonic() - t0 < 5.0
            request = s.served.monitor.view().request
            assert request is not None and request.outcome == "cancelled" and request.totals.tokens < 900
            wait(browser, lambda d: text(d, "#state") == "idle" and text(d, "#m-requests") == "1")
            assert browser.find_element(By.ID, "send").is_enabled()
            assert not browser.find_element(By.ID, "stop").is_enabled()
            browser.save_screenshot(str(shots / "web-page-stopped.png"))
            assert console_errors(browser) == []


def test_an_attached_image_is_sent_with_the_message(browser: Any, tmp_path: Path, shots: Path) -> None:
    """On a vision model (``--mmproj``): the picture chosen in the page goes with the message
    as an ``image_url`` part, shown in the conversation; the reply is the API's to the same
    parts."""
    import httpx
    from test_image_gates import PICTURE_A

    from bmoe.testing.fixtures.vision import vision_fixture

    fx = vision_fixture("qwen3vl")
    picture = tmp_path / "picture.png"
    picture.write_bytes(PICTURE_A)
    question = "What is in this picture?"
    with serving(fx.model, "--mmproj", str(fx.mmproj), *LONG) as s, page(browser, s):
        browser.find_element(By.ID, "attach").send_keys(str(picture))
        wait(browser, lambda d: text(d, "#attached") == "1 image")
        send(browser, question, temperature="0", max_tokens="8")
        wait(browser, lambda d: reply_state(d) == "done")
        shown = text(browser, "#messages .msg.assistant .content")
        assert browser.find_elements(By.CSS_SELECTOR, "#messages .msg.user img.thumb")
        assert text(browser, "#attached") == ""
        browser.save_screenshot(str(shots / "web-page-image.png"))
        assert console_errors(browser) == []
        import base64

        url = "data:image/png;base64," + base64.b64encode(PICTURE_A).decode()
        parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": question}]
        body = {"messages": [{"role": "user", "content": parts}], "temperature": 0, "max_tokens": 8}
        answered = httpx.post(s.url + "/chat/completions", json=body, timeout=60).json()
    assert shown == answered["choices"][0]["message"]["content"]
