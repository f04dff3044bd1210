"""The Lua scripts the state modules run in Redis, one per .lua file (each file's header says
its KEYS and ARGV). A script is the text of its files joined, shared functions first, with each
`$NAME` replaced by that counter's name (eagle_synth.state.keys.in_lua)."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from eagle_synth.state.keys import in_lua


@cache
def script(*names: str) -> str:
    """The joined text of `names`.lua from this folder."""
    return in_lua("".join(files(__package__).joinpath(f"{name}.lua").read_text() for name in names))
