"""A conversation with screenshots in its history against the same one with text in their
place: what a turn costs once the history holds pictures (issue 64).

Two conversations on one session with the prompt cache on (``--cache-ram``): ``images``,
whose first ``--shots`` user turns each carry a screenshot (a PNG drawn here, ``--shot-size``),
and ``text``, whose same turns carry code-like text of as many tokens as the screenshot's
rows instead. Both are played turn by turn, alternating (so each turn's state comes back
from the prompt cache, warm), then the turn after the shots, a short question whose request
carries the whole history (as a client sends it), is timed ``--repeats`` times for each,
alternating. Reported: the median time of that turn for each conversation (from the request
to its last token, ``--gen`` tokens), their ratio, tokens prefilled and restored, and how
many pictures the vision encoder decoded and encoded during the timed turns (bmoe since
issue 64 decodes and encodes none; before, it decoded and resized all of them each turn).

Run it alone on a quiet machine, on a commit before and after to compare:

    python tools/bench_image_turns.py -m Qwen3-VL-30B-A3B-Q4_K_M.gguf --mmproj mmproj-F16.gguf
    python tools/bench_image_turns.py            # the tiny qwen3vl fixture (a smoke run)

Extra flags (``--moe-stream``, ``--cache-mb 2048``, ``-t 8``, ``-c``: default 16384...) go to
the session as the server's flags (``python -m bmoe.serve``'s parser). To time the code
before issue 64's image keep, run this file with an older checkout first on the path:
``git worktree add /tmp/before 645ec2a~1``, copy ``src/bmoe/cext/*.so`` there, then
``PYTHONPATH=/tmp/before/src python tools/bench_image_turns.py ...`` (it then prints no
decode counts).
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from PIL import Image as PILImage
from PIL import ImageDraw

from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.media import MEDIA_MARKER, Image
from bmoe.domain.sampling import SamplingParams
from bmoe.runtime import Session
from bmoe.serve.flags import build_parser, session_config

CODE = "def handler_{i}(request):\n    value = request.get('field_{i}', {i})\n    return value * {j} + {i}\n"
QUESTION = "Describe what changed on the screen."


def screenshot(seed: int, size: tuple[int, int]) -> bytes:
    """A PNG that compresses as a screenshot does: flat panels, bars and lines of 'text'."""
    rng = np.random.default_rng(seed)
    w, h = size
    picture = PILImage.new("RGB", size, (246, 246, 246))
    draw = ImageDraw.Draw(picture)
    draw.rectangle((0, 0, w, 28), fill=(40, 44, 52))
    draw.rectangle((0, 28, w // 5, h), fill=(225, 228, 232))
    for y in range(40, h - 12, 16):
        x = w // 5 + 12
        while x < w - 40:
            word = int(rng.integers(12, 60))
            shade = int(rng.integers(20, 90))
            draw.rectangle((x, y, x + word, y + 8), fill=(shade, shade, shade + 20))
            x += word + 8
    out = io.BytesIO()
    picture.save(out, "PNG", optimize=True)
    return out.getvalue()


def code_text(tokens: int, tokenize: Callable[[str], list[int]], seed: int) -> str:
    out: list[str] = []
    i = seed
    while len(tokenize("".join(out))) < tokens:
        out.append(CODE.format(i=i, j=i % 7 + 1))
        i += 1
    return "".join(out)


def play(session: Session, history: list[ChatMessage], request: GenerateRequest, conversation: str) -> tuple:
    """One turn: its wall time, the result, and the turn's messages appended to ``history``."""
    asked = GenerateRequest(
        request.prompt,
        n_predict=request.n_predict,
        images=request.images,
        clear_kv=False,
        conversation=conversation,
        think=False,
        sampling=SamplingParams(),  # greedy
    )
    start = time.perf_counter()
    result = session.generate(asked, history=list(history))
    took = time.perf_counter() - start
    history += [ChatMessage("user", asked.prompt, images=asked.images), ChatMessage("assistant", result.text)]
    return took, result


def counters(session: Session) -> tuple[int, int]:
    encoder = session.vision
    return (getattr(encoder, "decoded", -1), getattr(encoder, "encoded", -1))  # -1: before issue 64


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("-m", "--model", default=None, help="a vision model's GGUF (default: the qwen3vl fixture)")
    p.add_argument("--mmproj", default=None, help="its projector (default: the fixture's)")
    p.add_argument("--shots", type=int, default=5, help="screenshots in the history (default 5)")
    p.add_argument("--shot-size", default="1280x800", help="each screenshot's size, WxH (default 1280x800)")
    p.add_argument("--gen", type=int, default=8, help="tokens each turn generates (default 8)")
    p.add_argument("--repeats", type=int, default=5, help="timed turns per conversation (default 5)")
    args, rest = p.parse_known_args(argv)
    if args.model is None:
        from bmoe.testing.fixtures.vision import vision_fixture

        fx = vision_fixture("qwen3vl")
        args.model, args.mmproj = str(fx.model), str(fx.mmproj)
        rest = ["-c", "8192", *rest]
        w, h = (int(x) for x in args.shot_size.split("x"))
        args.shot_size = f"{min(w, 320)}x{min(h, 200)}"  # the fixture's context
    if not {"-c", "--ctx-size"} & set(rest):
        rest = ["-c", "16384", *rest]  # five screenshots of a real model: some 5,000 rows
    flags = build_parser().parse_args(
        ["-m", args.model, "--mmproj", args.mmproj, "--cache-ram", "4096", *rest]
    )
    size = tuple(int(x) for x in args.shot_size.split("x"))
    with Session.open(session_config(flags, flags.model)) as session:
        if session.vision is None:
            print("the session has no vision encoder", file=sys.stderr)
            return 2
        shots = [screenshot(i, size) for i in range(args.shots)]  # type: ignore[arg-type]
        rows = [
            len([t for t in session.vision.tokenize(MEDIA_MARKER, [Image(s)]).tokens if t < 0]) for s in shots
        ]
        texts = [code_text(n, session.model.tokenize, 100 * i) for i, n in enumerate(rows)]
        histories: dict[str, list[ChatMessage]] = {"images": [], "text": []}
        for i in range(args.shots):
            ask = f"Step {i + 1}: here is the screen."
            play(
                session,
                histories["images"],
                GenerateRequest(f"{MEDIA_MARKER}\n{ask}", n_predict=args.gen, images=(Image(shots[i]),)),
                "images",
            )
            play(
                session, histories["text"], GenerateRequest(f"{texts[i]}\n{ask}", n_predict=args.gen), "text"
            )
        times: dict[str, list[float]] = {"images": [], "text": []}
        seen: dict[str, tuple[int, int, int]] = {}
        before = counters(session)
        for _ in range(args.repeats):
            for name in ("images", "text"):
                history = list(histories[name])
                took, result = play(session, history, GenerateRequest(QUESTION, n_predict=args.gen), name)
                times[name].append(took)
                seen[name] = (result.n_prompt, result.n_restored, len(result.tokens))
        after = counters(session)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"model {args.model}; {args.shots} screenshots of {args.shot_size} ({sum(rows)} rows)")
    print("| conversation | median turn (s) | min | max | prefilled | restored | generated |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in ("images", "text"):
        n_prompt, restored, generated = seen[name]
        spread = f"{min(times[name]):.3f} | {max(times[name]):.3f}"
        print(f"| {name} | {med[name]:.3f} | {spread} | {n_prompt} | {restored} | {generated} |")
    print(f"images / text: {med['images'] / med['text']:.2f}x (issue 64 asks at most 1.10x)")
    if before[0] >= 0:
        decoded, encoded = after[0] - before[0], after[1] - before[1]
        print(f"pictures decoded during the timed turns: {decoded}, encoded: {encoded}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
