"""The Lua scripts the state modules run in Redis, one per .lua file (each file's header says
its KEYS and ARGV). A script is the text of its files joined, shared functions first, with each
`$NAME` replaced by that counter's name (eagle_synth.state.keys.in_lua). `LuaScript` runs one by
EVALSHA, so its text crosses the network once per server, not on every call."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from functools import cache
from importlib.resources import files
from typing import Any

import redis
from redis.commands.core import Script

from eagle_synth.state.keys import in_lua


@cache
def script(*names: str) -> str:
    """The joined text of `names`.lua from this folder."""
    return in_lua("".join(files(__package__).joinpath(f"{name}.lua").read_text() for name in names))


class LuaScript:
    """The script joined from `names`.lua (shared functions first), run by EVALSHA.

    It is registered once per client, as `register_script` registers it: redis-py's Script sends
    EVALSHA, and when a server answers NOSCRIPT (restarted, flushed, or a replica promoted by a
    Sentinel failover) it loads the text and sends EVALSHA again; on a pipeline it is queued as
    EVALSHA and the pipeline checks before EXEC that the server has it (SCRIPT EXISTS / LOAD).
    The registration holds its client weakly, so it goes with the client (a pipeline's with the
    pipeline)."""

    def __init__(self, *names: str) -> None:
        self.names = names
        self.text = script(*names)
        self._registered: weakref.WeakKeyDictionary[Any, Script] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __call__(self, client: redis.Redis, keys: Sequence[Any], args: Sequence[Any] = ()) -> Any:
        """Run the script on `client` (a client or a pipeline) with KEYS `keys` and ARGV `args`:
        its reply, or on a pipeline the pipeline (the reply comes with the others)."""
        return self._on(client)(keys=list(keys), args=list(args), client=client)

    def _on(self, client: redis.Redis) -> Script:
        with self._lock:
            registered = self._registered.get(client)
            if registered is None:
                # Script(client, text) is what client.register_script returns; a weak proxy of the
                # client (Script asks it only for the text's encoding) lets the client go.
                registered = Script(weakref.proxy(client), self.text)
                self._registered[client] = registered
            return registered
