"""Names of a campaign's counters: the fields of its counters hash (CampaignKeys.counters).

The one place they are spelled. Lua scripts that count get them through `in_lua`, so a
script and the Python that reads its counts cannot drift apart. Renaming one would orphan
the counts of running campaigns: these names are part of the Redis data layout.
"""

from __future__ import annotations

from string import Template

# Input rows the producer read and skipped; prompt keys it enqueued for the first time.
ROWS_READ = "rows-read"
ROWS_SKIPPED = "rows-skipped"
PROMPTS_ENQUEUED = "prompts-enqueued"
# Records on disk (keys marked done), and their prompt and output tokens.
RECORDS = "records"
TOKENS_IN = "tokens-in"
TOKENS_OUT = "tokens-out"
# Records whose output began with prompt-tail ids the worker dropped (an old SGLang bug).
REPAIRED_PREFIX = "repaired-prefix"
# Done keys `repair` took back out of done because their record file was damaged.
RECORDS_DAMAGED = "records-damaged"
# Conversations the producer started (`--history own`).
CONVERSATIONS = "conversations"
# Prefixes of the per-reason counts of failures ever recorded (`failed-server-error`) and of
# conversation ends (`conversations-complete`).
FAILED_PREFIX = "failed-"
CONVERSATION_END_PREFIX = "conversations-"

# What `in_lua` substitutes: `$RECORDS` in a script becomes RECORDS's value (every name above).
_LUA_NAMES = {name: value for name, value in dict(globals()).items() if name.isupper() and isinstance(value, str)}


def failed(reason: str) -> str:
    """Counter of failures ever recorded with this reason (retries do not lower it)."""
    return FAILED_PREFIX + reason


def conversation_end(reason: str) -> str:
    return CONVERSATION_END_PREFIX + reason  # eagle_synth.conversation.END_REASONS


def in_lua(script: str) -> str:
    """A Lua script's text with each `$NAME` replaced by the counter name NAME of this module
    (KeyError for an unknown one, so a typo fails at import, not in Redis)."""
    return Template(script).substitute(_LUA_NAMES)
