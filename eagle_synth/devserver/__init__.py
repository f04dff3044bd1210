"""The devserver: an HTTP stand-in for SGLang's native API, for tests, demos and benchmarks.

It speaks /generate and the info/health endpoints as SGLang does (see docs/devserver.md),
generates deterministic token ids from a real tokenizer without a GPU, and injects the
faults a long campaign meets: slow starts, warm-up 503s, 500s, dropped connections, death.

    from eagle_synth.devserver import DevServerConfig, start_devserver_thread
    server = start_devserver_thread(DevServerConfig(tokenizer=DIR, port=0))
    ... requests.post(server.url + "/generate", json={...}) ...
    server.stop()

or from a shell: `python -m eagle_synth.devserver --tokenizer DIR --port 30000`.
"""

from eagle_synth.devserver.config import DevServerConfig
from eagle_synth.devserver.server import (
    LISTENING_LINE,
    DevServer,
    run_devserver,
    start_devserver_thread,
    wait_listening,
)

__all__ = [
    "DevServer",
    "DevServerConfig",
    "LISTENING_LINE",
    "run_devserver",
    "start_devserver_thread",
    "wait_listening",
]
