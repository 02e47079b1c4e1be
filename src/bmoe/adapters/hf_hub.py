"""``-hf``: a GGUF model from the Hugging Face Hub, through ``huggingface_hub`` (``bmoe[hf]``).

The files land in the user's Hugging Face cache (``HF_HOME``, ``HF_HUB_CACHE``), as
``llama-cpp-python``'s ``Llama.from_pretrained`` and every Hub tool put them, with
``huggingface_hub``'s progress bars while they download. Offline (``HF_HUB_OFFLINE=1``, or
when the Hub cannot be reached) the repository's cached snapshot answers: its files are
listed from the cache and nothing is fetched. Which file a spec names is
``bmoe.domain.hf_models``'s rule; the Hub's failures become ``ModelFetchError`` here.
"""

from __future__ import annotations

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
    paths = []
    for name in names:
        try:
            paths.append(hub.hf_hub_download(parsed.repo, name, local_files_only=offline))
        except Exception as exc:
            where = "in the cache (offline)" if offline else "on the Hub"
            raise ModelFetchError(f"{parsed.repo}: cannot get {name} {where}: {exc}") from None
    return Path(paths[0])


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
