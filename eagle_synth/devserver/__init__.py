"""The devserver: an HTTP stand-in for SGLang's native API (or vLLM's), for tests, demos and
benchmarks; see docs/devserver.md. `python -m eagle_synth.devserver --tokenizer DIR` from a
shell, or `start_devserver_thread(DevServerConfig(tokenizer=DIR, port=0))` in-process."""

from eagle_synth.devserver.app import LISTENING_LINE, DevServer, run_devserver, start_devserver_thread, wait_listening
from eagle_synth.devserver.config import DevServerConfig

__all__ = [
    "DevServer",
    "DevServerConfig",
    "LISTENING_LINE",
    "run_devserver",
    "start_devserver_thread",
    "wait_listening",
]
