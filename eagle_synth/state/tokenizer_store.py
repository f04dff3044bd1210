"""A campaign's tokenizer files in Redis (zstd msgpack, keyed by fingerprint and template hash),
so with `--history own` every worker renders follow-up turns with the producer's very tokenizer;
workers unpack them into a local cache on first need (workers/renderer.py checks them).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import msgspec
import redis
import zstandard

from eagle_synth.errors import TokenizerUnavailable
from eagle_synth.state.keys import tokenizer_blob

# zstd level of the stored files: 3.5 MB for Qwen3.5's 12.8 MB tokenizer.json in 0.4 s.
TOKENIZER_ZSTD_LEVEL = 10
# Format tag of the stored blob.
BLOB_FORMAT = "eagle-synth-tokenizer-1"
# Written last into an unpacked folder: its presence means the folder is complete.
COMPLETE_MARKER = ".complete"


def cache_root() -> Path:
    """Where workers unpack stored tokenizers (a local disk; one folder per fingerprint)."""
    return Path(os.environ.get("EAGLE_SYNTH_CACHE_DIR") or Path.home() / ".cache" / "eagle-synth") / "tokenizers"


def store_tokenizer(client: redis.Redis, tokenizer, *, fingerprint: str, chat_template_hash: str) -> None:
    """Store the tokenizer's files under their Redis key (keys.tokenizer_blob) unless they are there already."""
    key = tokenizer_blob(fingerprint, chat_template_hash)
    if not client.exists(key):
        with tempfile.TemporaryDirectory(prefix="eagle-synth-tokenizer-") as folder:
            tokenizer.save_pretrained(folder)
            files = {path.name: path.read_bytes() for path in sorted(Path(folder).iterdir()) if path.is_file()}
        blob = msgspec.msgpack.encode({"format": BLOB_FORMAT, "files": files})
        client.set(key, zstandard.ZstdCompressor(level=TOKENIZER_ZSTD_LEVEL).compress(blob), nx=True)


def unpack_tokenizer(blob: bytes, folder: Path) -> None:
    """Write the stored files into `folder` (created; must not exist), atomically."""
    data = msgspec.msgpack.decode(zstandard.ZstdDecompressor().decompress(blob))
    if not isinstance(data, dict) or data.get("format") != BLOB_FORMAT:
        raise TokenizerUnavailable(f"the stored tokenizer is not in format {BLOB_FORMAT}: upgrade eagle-synth")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
    try:
        for name, content in data["files"].items():
            if not name or name != os.path.basename(name) or name.startswith("."):
                raise TokenizerUnavailable(f"the stored tokenizer has a file name that is not plain: {name!r}")
            (staging / name).write_bytes(content)
        (staging / COMPLETE_MARKER).write_text("")
        try:
            os.rename(staging, folder)
        except OSError:
            if not (folder / COMPLETE_MARKER).exists():  # another thread or process won the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def fetch_tokenizer(client: redis.Redis, *, fingerprint: str, chat_template_hash: str) -> Path:
    """A local folder holding the campaign's stored tokenizer files (fetched on first need)."""
    folder = cache_root() / f"{fingerprint}-{chat_template_hash}"
    if (folder / COMPLETE_MARKER).exists():
        return folder
    blob = client.get(tokenizer_blob(fingerprint, chat_template_hash))
    if blob is None:
        raise TokenizerUnavailable(
            f"the campaign's tokenizer ({fingerprint}, template {chat_template_hash}) is not stored in Redis "
            "(deleted, or evicted by a Redis that may evict): run the same `eagle-synth enqueue ... --history own` "
            "again to store it, then `eagle-synth retry-failed CAMPAIGN`"
        )
    unpack_tokenizer(blob if isinstance(blob, bytes) else blob.encode(), folder)
    return folder
