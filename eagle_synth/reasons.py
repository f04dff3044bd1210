"""Failure reasons: the slugs a prompt's recorded failure carries (Failure.reason).

The one place they are spelled. They are stored in Redis (the failed hash, the per-reason
counts, the `failed-<reason>` counters) and typed by users (`retry-failed --reason`), so
renaming one orphans the failures of running campaigns. Each one's comment says what it means.
Conversation ends (eagle_synth.conversation.END_REASONS) and producer skip reasons are other
lists; `prompt-too-long` is spelled the same in all three.
"""

from __future__ import annotations

INVALID_TOKEN_ID = "invalid-token-id"  # a prompt id is outside the model's vocabulary; never sent
EMPTY_PROMPT = "empty-prompt"  # the prompt has no ids; never sent
PROMPT_TOO_LONG = "prompt-too-long"  # the prompt does not fit the server's context (checked before sending, or its 400)
BAD_REQUEST = "bad-request"  # the server refused the prompt with a 400 about something else than its length
# The server refuses the campaign's sampling parameters (campaign-level; fix the server).
BAD_SAMPLING_PARAMS = "bad-sampling-params"
SERVER_ERROR = "server-error"  # the server failed on the prompt (5xx, broken reply) on every attempt
BAD_RESPONSE = "bad-response"  # the server's reply was malformed on every attempt
ABORTED = "aborted"  # the server aborted the prompt on every attempt
PROMPT_MISMATCH = "prompt-mismatch"  # the server generated from other prompt ids than were sent
# The campaign's settings are gone from Redis, so its batch cannot run.
CAMPAIGN_SETTINGS_MISSING = "campaign-settings-missing"
# The campaign's tokenizer, needed to render follow-up turns, cannot be loaded.
TOKENIZER_UNAVAILABLE = "tokenizer-unavailable"
WORKER_ERROR = "worker-error"  # an unexpected error in the worker on every attempt (the catch-all's last step)
RECORD_DAMAGED = "record-damaged"  # `repair`: the prompt's record file is damaged and its prompt cannot be read back
