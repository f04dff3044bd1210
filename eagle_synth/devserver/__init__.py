"""The devserver: an HTTP stand-in for SGLang's native API (or vLLM's), for tests, demos and
benchmarks; see docs/devserver.md. `python -m eagle_synth.devserver --tokenizer DIR` from a
shell, or `run_devserver(DevServerConfig(tokenizer=DIR))` in-process (it blocks)."""

from eagle_synth.devserver.app import run_devserver
from eagle_synth.devserver.config import DevServerConfig

__all__ = ["DevServerConfig", "run_devserver"]
