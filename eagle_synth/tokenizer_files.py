"""The files of a model folder that a campaign's tokenizer code comes from (`--trust-remote-code`):
their names and hashes are recorded with the campaign, and a worker renders follow-up turns only
with a local folder (`worker --tokenizer DIR`) holding the very same files. Nothing executable
is ever read from Redis; the check reads files only, so a differing folder's code never runs.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from eagle_synth.errors import TokenizerFolderError

# Files beside the Python code that decide how text becomes ids and chats become prompts.
TOKENIZER_DATA_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "tiktoken.model",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)
# Hex digits of each file's sha256 kept (collisions are not a concern at 64 bits for a check).
FILE_HASH_CHARS = 16


def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:FILE_HASH_CHARS]


def covered_files(folder: str | os.PathLike) -> dict[str, str]:
    """{file name: hash} of the folder's Python files and tokenizer files (top level only: the
    code transformers and the encoders load lives there)."""
    path = Path(folder).expanduser()
    names = sorted(p.name for p in path.glob("*.py") if p.is_file())
    names += [name for name in TOKENIZER_DATA_FILES if (path / name).is_file()]
    return {name: _file_hash(path / name) for name in sorted(names)}


def folder_problem(folder: str | os.PathLike, expected: dict[str, str]) -> str | None:
    """Why `folder` is not the campaign's (a file missing, differing, or one more Python file), else None."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        return f"{path} is no folder"
    for name, digest in sorted(expected.items()):
        if not (path / name).is_file():
            return f"{path} has no {name}"
        if _file_hash(path / name) != digest:
            return f"{path}/{name} differs from the campaign's (sha256 {_file_hash(path / name)}, campaign {digest})"
    extra = sorted(set(covered_files(path)) - set(expected))
    if extra:
        return f"{path} has {', '.join(extra)}, which the campaign's tokenizer folder had not"
    return None


def matching_folder(folders: list[Path], expected: dict[str, str], *, campaign: str) -> Path:
    """The first of the worker's `--tokenizer` folders holding exactly the campaign's files;
    TokenizerFolderError (one line) when none does."""
    covered = ", ".join(sorted(expected))
    if not folders:
        raise TokenizerFolderError(
            f"campaign {campaign!r} runs tokenizer code from its model folder ({covered}): start the worker "
            "with --tokenizer DIR, the folder its server loads (nothing executable is read from Redis)"
        )
    problems = []
    for folder in folders:
        if (problem := folder_problem(folder, expected)) is None:
            return folder
        problems.append(problem)
    raise TokenizerFolderError(
        f"campaign {campaign!r}: no --tokenizer folder holds its tokenizer files ({'; '.join(problems)}); "
        "refusing to render its follow-up turns"
    )
