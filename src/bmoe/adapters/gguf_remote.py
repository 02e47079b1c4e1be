"""``python -m bmoe.plan -hf USER/REPO[:QUANT]``: a Hub model's GGUF header(s), and nothing
else, fetched with HTTP range requests.

The repository's files are listed (``GET {endpoint}/api/models/{repo}``, its ``siblings``),
the model's file or every shard of a split model is picked by ``-hf``'s own rule
(``bmoe.domain.hf_models.pick_files``), and each file's header is read from
``{endpoint}/{repo}/resolve/main/{file}`` in ranges (``bmoe.adapters.gguf_header``) into a
scratch folder, as files named like the shards, so that ggml's parser reads them as it
reads a local model (``gguf_layout``). The endpoint is ``$HF_ENDPOINT`` (the Hub by
default), the token ``$HF_TOKEN`` where set. A server that ignores ranges, a truncated
answer or one that is not GGUF is a ``ModelFetchError`` naming the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import attrs

from bmoe.adapters.file_writes import scratch_folder, write_file
from bmoe.adapters.gguf_header import HeaderCursor, header_length
from bmoe.domain.hf_models import HfSpec, pick_files
from bmoe.errors import ModelFetchError, ModelLoadError

HUB = "https://huggingface.co"
TIMEOUT_S = 30
_TOTAL = re.compile(r"bytes \d+-\d+/(\d+)")


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", HUB).rstrip("/")


@attrs.frozen
class RemoteHeaders:
    """Each file's header, fetched into ``paths`` (scratch files named as the repository's);
    ``sizes``: each whole file's length on the server; ``fetched_bytes``: what came over
    the network in all; ``names``: the files in the repository."""

    repo: str
    names: tuple[str, ...]
    paths: tuple[Path, ...]
    sizes: tuple[int, ...]
    fetched_bytes: int

    def describe(self) -> str:
        files = f"{len(self.names)} files' headers" if len(self.names) > 1 else "its header"
        return (
            f"{self.repo}/{self.names[0]}: read {files} only, {self.fetched_bytes / 1024:.0f} KiB fetched "
            f"of {sum(self.sizes) / (1 << 30):.2f} GiB"
        )


def _request(url: str, headers: dict[str, str] | None = None) -> urllib.request.Request:
    out = dict(headers or {})
    if token := os.environ.get("HF_TOKEN"):
        out["Authorization"] = f"Bearer {token}"
    out.setdefault("User-Agent", "bmoe-plan")
    return urllib.request.Request(url, headers=out)


def list_files(repo: str) -> list[str]:
    """The files of ``repo`` on the endpoint (``ModelFetchError`` when it cannot say)."""
    url = f"{endpoint()}/api/models/{repo}"
    try:
        with urllib.request.urlopen(_request(url), timeout=TIMEOUT_S) as answer:
            doc = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        raise ModelFetchError(
            f"{repo}: the Hub answered {exc.code} to {url} (no such repository, or private)"
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ModelFetchError(f"{repo}: cannot list its files at {url}: {exc}") from None
    siblings = doc.get("siblings") if isinstance(doc, dict) else None
    if not isinstance(siblings, list):
        raise ModelFetchError(f"{repo}: {url} did not answer a file list")
    return [str(s["rfilename"]) for s in siblings if isinstance(s, dict) and "rfilename" in s]


class _Ranges:
    """Byte ranges of one file on the server; counts what comes back."""

    def __init__(self, url: str, name: str) -> None:
        self.url, self.name = url, name
        self.fetched = 0
        self.size: int | None = None

    def __call__(self, start: int, end: int) -> bytes:
        request = _request(self.url, {"Range": f"bytes={start}-{end - 1}"})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
                if answer.status != 206:
                    raise ModelFetchError(
                        f"{self.name}: the server answered {answer.status}, not 206, to a range request: "
                        "it would send the whole file"
                    )
                total = _TOTAL.match(answer.headers.get("Content-Range", ""))
                if total is not None:
                    self.size = int(total.group(1))
                data = bytes(answer.read(end - start))
        except urllib.error.HTTPError as exc:
            if exc.code == 416:  # past the end
                return b""
            raise ModelFetchError(f"{self.name}: the server answered {exc.code} to {self.url}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ModelFetchError(f"{self.name}: cannot read {self.url}: {exc}") from None
        self.fetched += len(data)
        return data


def _fetch_header(repo: str, name: str, into: Path) -> tuple[Path, int, int]:
    """``(scratch file, the file's size, bytes fetched)``."""
    quoted = urllib.parse.quote(name)
    ranges = _Ranges(f"{endpoint()}/{repo}/resolve/main/{quoted}", f"{repo}/{name}")
    cursor = HeaderCursor(ranges, f"{repo}/{name}")
    try:
        end = header_length(cursor)
    except ModelLoadError as exc:
        raise ModelFetchError(str(exc)) from None
    if ranges.size is None:
        raise ModelFetchError(f"{repo}/{name}: the server did not say the file's length (Content-Range)")
    path = write_file(
        into / name.rsplit("/", 1)[-1], bytes(cursor.data[:end]), f"the header of {repo}/{name}"
    )
    return path, ranges.size, ranges.fetched


@contextlib.contextmanager
def remote_headers(spec: str, hf_file: str | None = None) -> Iterator[RemoteHeaders]:
    """The headers of the model ``spec`` names, in a scratch folder removed afterwards."""
    parsed = HfSpec.parse(spec)
    names = [hf_file] if hf_file else pick_files(parsed, list_files(parsed.repo))
    with scratch_folder("bmoe-plan-", "the model's headers") as folder:
        got = [_fetch_header(parsed.repo, name, folder) for name in names]
        yield RemoteHeaders(
            repo=parsed.repo,
            names=tuple(names),
            paths=tuple(p for p, _, _ in got),
            sizes=tuple(s for _, s, _ in got),
            fetched_bytes=sum(f for _, _, f in got),
        )
