"""A Hugging Face hub repo id, resolved to a local checkpoint directory.

The id is resolved through huggingface-hub's cache; the cache is tried first
(``local_files_only``), so a model that was downloaded once converts
offline. The directory is then read like any other
(formats/hf_checkpoint.py), every file resolving inside the repo's cache
folder.
"""

from __future__ import annotations

from pathlib import Path

from iekit.formats.errors import IEError
from iekit.formats.hf_checkpoint import HFSource, from_dir

HUB_PATTERNS = ["*.safetensors", "*.json", "tokenizer.model", "vocab.txt", "merges.txt"]


def from_hub(repo_id: str, revision: str | None = None) -> HFSource:
    """Resolve through the HF cache first; download only if not cached."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        try:
            path = snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS,
                                     local_files_only=True)
        except LocalEntryNotFoundError:
            path = snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS)
    except HFValidationError as e:
        raise IEError(f"--repo-id {repo_id!r}: {e}") from None
    except Exception as e:  # network errors, missing repo, gated repo...
        raise IEError(f"{repo_id}: not in the local Hugging Face cache and could not be downloaded "
                      f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    snap = Path(path)
    # Cache layout: models--org--name/snapshots/<commit sha>/ -- the revision
    # actually used; its files are symlinks into models--org--name/blobs/, so
    # the repo's cache folder is the directory files must stay inside.
    root = snap.parent.parent if snap.parent.name == "snapshots" else snap
    return from_dir(snap, kind="hf_hub", name=repo_id, revision=snap.name, root=root)
