"""``-hf``: a GGUF model from the Hugging Face Hub, through ``huggingface_hub`` (``bmoe[hf]``).

The files land in the user's Hugging Face cache (``HF_HOME``, ``HF_HUB_CACHE``), as
``llama-cpp-python``'s ``Llama.from_pretrained`` and every Hub tool put them, with
``huggingface_hub``'s progress bars while they download. Offline (``HF_HUB_OFFLINE=1``, or
when the Hub cannot be reached) the repository's cached snapshot answers: its files are
listed from the cache and nothing is fetched. Which file a spec names is
``bmoe.domain.hf_models``'s rule; the Hub's failures become ``ModelFetchError`` here.

The download is ``huggingface_hub``'s own writer: a file grows under ``<blob>.incomplete``
and is renamed into place when whole, so a download cut or out of space leaves nothing
under the model's name (the next run resumes or starts again). Before downloading, the
room the missing files need is checked against the cache's disk; a download that runs out
of space anyway says how much room the model needs.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any

from bmoe.domain.hf_models import HfSpec, pick_files, pick_mmproj
from bmoe.errors import ConfigError, ModelFetchError

INSTALL = "-hf needs huggingface_hub: .venv/bin/pip install '.[hf]' (from a checkout of bmoe)"


def _hub() -> Any:
    try:
        import huggingface_hub
        import huggingface_hub.constants
        import huggingface_hub.errors
    except ImportError:
        raise ConfigError(INSTALL, "hf_repo") from None
    return huggingface_hub


def _cached_files(hub: Any, repo: str) -> list[str]:
    """The files of ``repo``'s cached snapshot (its ``main``), as paths in the repository."""
    try:
        folder = Path(hub.snapshot_download(repo, local_files_only=True))
    except Exception as exc:
        raise ModelFetchError(
            f"{repo} is not in the Hugging Face cache ({hub.constants.HF_HUB_CACHE}) and the Hub "
            f"cannot be asked (offline): {exc}"
        ) from None
    return [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()]


def _files(hub: Any, repo: str, offline: bool) -> list[str]:
    if offline:
        return _cached_files(hub, repo)
    try:
        return list(hub.HfApi().list_repo_files(repo))
    except hub.errors.RepositoryNotFoundError:
        raise ModelFetchError(f"{repo}: no such model repository on the Hub (or it is private)") from None
    except Exception:
        return _cached_files(hub, repo)


def fetch_model(spec: str, hf_file: str | None = None) -> Path:
    """The local path of the model ``spec`` (``USER/REPO[:QUANT]``) names, downloading what
    the cache lacks; for a split model, the first shard (every shard fetched)."""
    hub = _hub()
    parsed = HfSpec.parse(spec)
    offline = bool(hub.constants.HF_HUB_OFFLINE)
    names = [hf_file] if hf_file else pick_files(parsed, _files(hub, parsed.repo, offline))
    need = 0 if offline else _room_needed(hub, parsed.repo, names)
    paths = []
    for name in names:
        try:
            paths.append(hub.hf_hub_download(parsed.repo, name, local_files_only=offline))
        except Exception as exc:
            if _out_of_space(exc):
                raise ModelFetchError(
                    f"{parsed.repo}: out of space getting {name} into {_cache(hub)}: the model needs "
                    f"{_gib(need)} there, {_gib(_free(hub))} is free now; nothing is kept under its name "
                    "(make room, or set HF_HOME to a larger disk, and run again)"
                ) from None
            where = "in the cache (offline)" if offline else "on the Hub"
            raise ModelFetchError(f"{parsed.repo}: cannot get {name} {where}: {exc}") from None
    return Path(paths[0])


def _cache(hub: Any) -> Path:
    return Path(hub.constants.HF_HUB_CACHE)


def _free(hub: Any) -> int:
    """Free bytes on the disk of the Hub's cache (its nearest folder that exists)."""
    folder = _cache(hub)
    for place in (folder, *folder.parents):
        try:
            return shutil.disk_usage(place).free
        except OSError:
            continue
    return 0


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def _room_needed(hub: Any, repo: str, names: list[str]) -> int:
    """The bytes the files of ``names`` not in the cache yet need (0 where the Hub does not
    say); ``ModelFetchError`` before anything is downloaded where the cache's disk has less."""
    need = 0
    for name in names:
        if isinstance(hub.try_to_load_from_cache(repo, name), str):
            continue
        try:
            need += int(hub.get_hf_file_metadata(hub.hf_hub_url(repo, name)).size or 0)
        except Exception:
            return 0  # the download itself says what is wrong
    free = _free(hub)
    if need > free:
        raise ModelFetchError(
            f"{repo}: the model needs {_gib(need)} in {_cache(hub)}, which has {_gib(free)} free "
            "(make room, or set HF_HOME to a larger disk)"
        )
    return need


def _out_of_space(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is a disk that is full."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def fetch_mmproj(spec: str) -> Path | None:
    """The vision encoder of ``spec``'s repository (its ``mmproj`` GGUF), fetched into the
    cache beside the model as llama.cpp's ``-hf`` does; None where the repository has none."""
    hub = _hub()
    parsed = HfSpec.parse(spec)
    offline = bool(hub.constants.HF_HUB_OFFLINE)
    name = pick_mmproj(_files(hub, parsed.repo, offline))
    if name is None:
        return None
    try:
        return Path(hub.hf_hub_download(parsed.repo, name, local_files_only=offline))
    except Exception as exc:
        raise ModelFetchError(f"{parsed.repo}: cannot get its vision encoder {name}: {exc}") from None
