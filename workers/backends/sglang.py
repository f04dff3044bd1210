"""SGLang: the native `/generate` endpoint with `input_ids`, as docs/workers.md describes.

The campaign's sampling is stored in SGLang's own names, so it is sent as it is (after a check
that every key is one SGLang knows: an unknown key is an HTTP 500 on older servers). Replies
are checked by workers/replies.py `parse_generate_item`; preflight reads `/server_info` and
refuses the settings in workers/preflight.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from eagle_synth.sampling import SGLANG_SAMPLING_KEYS
from eagle_synth.state.node_state import ServerState
from workers import preflight
from workers.backends.base import SGLANG, UntranslatableSampling
from workers.client import ServerFacts, SGLangClient
from workers.preflight import Check, ContextLimits, context_message, fits_context
from workers.replies import GeneratedItem, parse_generate_item


class SGLangBackend:
    """Requests, replies, context rule and preflight of an SGLang server (see base.Backend)."""

    name: ClassVar[str] = SGLANG
    path: ClassVar[str] = "/generate"
    checks: ClassVar[Mapping[str, Check]] = preflight.CHECKS

    def translate_sampling(self, sampling: dict) -> dict:
        # Checked on every request: the subset test allocates nothing when all keys are known.
        if not SGLANG_SAMPLING_KEYS.issuperset(sampling):
            unknown = sorted(set(sampling) - SGLANG_SAMPLING_KEYS)
            raise UntranslatableSampling(f"sampling keys SGLang does not accept: {unknown}", status=None)
        return sampling

    def request(self, ids: list[int], sampling: dict) -> tuple[str, dict]:
        return self.path, {"input_ids": ids, "sampling_params": self.translate_sampling(sampling)}

    def parse(self, item: object, *, vocab_size: int, prompt_ids: list[int], sampling: dict) -> GeneratedItem:
        return parse_generate_item(item, vocab_size=vocab_size, prompt_len=len(prompt_ids), prompt_ids=prompt_ids)

    def context_problem(self, *, prompt_len: int, max_new_tokens: int, state: ServerState) -> str | None:
        limits = ContextLimits.from_state(state)
        if fits_context(prompt_len=prompt_len, max_new_tokens=max_new_tokens, limits=limits):
            return None
        return context_message(prompt_len=prompt_len, max_new_tokens=max_new_tokens, limits=limits)

    @staticmethod
    def facts(client: SGLangClient) -> ServerFacts:
        return client.facts()

    @staticmethod
    def apply_facts(state: ServerState, facts: ServerFacts, *, accepted: list[str]) -> None:
        preflight.apply_facts(state, facts, accepted=accepted)

    @classmethod
    def from_state(cls, state: ServerState) -> SGLangBackend:
        return cls()
