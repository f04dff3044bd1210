"""A real vLLM OpenAI server (CPU build) on a tiny Qwen3 checkpoint, for tests and benchmarks.

The venv comes from tests/vllm_env.py, the checkpoint from tests/tiny_qwen3.py (built by the
venv's python, cached beside the venvs under a hash of the builder and the tokenizer). The
server runs as `python -m vllm.entrypoints.openai.api_server` (`vllm serve` looks up a
distribution named `vllm`, which the CPU build is not), guarded so that it ends with the test
run however that ends (tests/process_guard.py), with what vLLM's CPU runner needs on a 2-core
machine:

* `--enforce-eager`: no graph capture, a much faster start;
* `--no-enable-chunked-prefill --max-num-batched-tokens <max-model-len>`: a seeded request
  whose prompt is prefilled in chunks crashes the CPU runner ("CPU Generator does not use
  offset") and the engine dies with it;
* `VLLM_CPU_KVCACHE_SPACE=1` (GiB): the default takes a share of the host's memory;
* `--generation-config auto`: the model's generation_config.json, as a real deployment has.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from eagle_synth.testing.harness import free_port
from tests import vllm_env
from tests.process_guard import GuardedProcess

ROOT = Path(__file__).resolve().parent.parent
BUILDER = ROOT / "tests" / "tiny_qwen3.py"
# The context the tests' server serves; short prompts and outputs fit many times over.
MAX_MODEL_LEN = 1024
# Seconds a start may take: 20 s to 3 min seen on 2 busy cores (import, load, KV cache set-up).
START_TIMEOUT = 420.0
# Seconds the checkpoint build may take (torch import and a 130 MB save).
BUILD_TIMEOUT = 300.0
# Seconds the server gets to exit after SIGTERM before it is killed.
STOP_TIMEOUT = 20.0
# The CPU backend's KV cache, GiB (VLLM_CPU_KVCACHE_SPACE).
KV_CACHE_GIB = "1"
# Served name of the model (what /v1/models lists as `id`).
SERVED_NAME = "tiny-qwen3"


def model_dir(tokenizer: Path) -> Path:
    """The cached checkpoint's folder: named by the builder's and the tokenizer's content."""
    digest = hashlib.sha256(BUILDER.read_bytes())
    for name in sorted(os.listdir(tokenizer)):
        digest.update(name.encode())
        digest.update((tokenizer / name).read_bytes())
    return vllm_env.cache_root() / "models" / f"tiny-qwen3-{digest.hexdigest()[:12]}"


def build_model(tokenizer: Path) -> Path:
    """The tiny checkpoint around `tokenizer`, built once (atomically) and reused."""
    out = model_dir(tokenizer)
    if not (out / "tiny_qwen3.json").exists():
        subprocess.run(
            [str(vllm_env.require()), str(BUILDER), str(tokenizer), str(out)],
            check=True,
            timeout=BUILD_TIMEOUT,
            capture_output=True,
        )
    return out


@dataclass
class VllmServer:
    """One vLLM server process on `model`, on its own port.

    Parameters:
        model: the checkpoint folder.
        logdir: where its log goes.
        port: the port (0 picks a free one).
        max_model_len: --max-model-len (also the batched-token budget, see the module doc).
        extra: more command-line arguments.
    """

    model: Path
    logdir: Path
    port: int = 0
    max_model_len: int = MAX_MODEL_LEN
    extra: list[str] = field(default_factory=list)
    process: GuardedProcess | None = None
    started_in: float | None = None

    def __post_init__(self) -> None:
        self.port = self.port or free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        return [
            str(vllm_env.require()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            SERVED_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--enforce-eager",
            "--dtype",
            "float32",
            "--max-model-len",
            str(self.max_model_len),
            "--no-enable-chunked-prefill",
            "--max-num-batched-tokens",
            str(self.max_model_len),
            "--generation-config",
            "auto",
            *self.extra,
        ]

    def start(self, *, wait: bool = True) -> VllmServer:
        env = dict(os.environ)
        # The project venv's variables must not leak into the vLLM venv's python.
        for name in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
            env.pop(name, None)
        env.update(VLLM_CPU_KVCACHE_SPACE=KV_CACHE_GIB, PYTHONUNBUFFERED="1", VLLM_NO_USAGE_STATS="1")
        env.update(DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self._launched = time.monotonic()
        # Guarded: the server and its engine process end with the test run, however it ends.
        log_path = self.logdir / f"vllm-{self.port}.log"
        self.process = GuardedProcess(args=self.argv(), env=env, log_path=log_path).start()
        if wait:
            self.wait_ready()
        return self

    def ready(self) -> bool:
        try:
            return requests.get(f"{self.url}/health", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Until /health answers 200; RuntimeError with the log's tail if the process exits."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            assert self.process is not None
            if not self.process.alive():
                raise RuntimeError(f"vLLM exited while starting:\n{self.process.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"vLLM not ready after {timeout:.0f} s:\n{self.process.log()[-4000:]}")
            time.sleep(0.5)
        self.started_in = time.monotonic() - self._launched

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(sig=signal.SIGTERM, timeout=STOP_TIMEOUT)

    def kill(self) -> None:
        """SIGKILL the server's whole process group (its engine core is a child process)."""
        if self.process is not None and self.process.proc is not None:
            try:
                os.killpg(self.process.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.proc.wait(timeout=STOP_TIMEOUT)
            self.process.release()

    def log(self) -> str:
        return self.process.log() if self.process else ""
