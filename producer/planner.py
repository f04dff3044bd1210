"""What the producer enqueues for a row: prompts to template, then their keyed items.

History `dataset` keys a prompt by its templated ids, sampling and sample index; history `own`
templates only turn 0 here and sends the rest of the row as the conversation state workers
render later turns from, keyed by the turn within its conversation (docs/producer.md). A
`--variants` entry, picked per conversation by a stable hash, sets template arguments and sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from eagle_synth.conversation import ConversationState, conversation_key, turn_key
from eagle_synth.ids import pack_ids
from eagle_synth.payload import PromptItem, prompt_key
from eagle_synth.sampling import SamplingParams
from eagle_synth.variants import Variant, pick_variant
from producer.options import EnqueueOptions
from producer.rows import Conversation, conversations_from_row, own_history_from_row


@dataclass
class PromptPlanner:
    """Plans a row's prompts and turns templated ids into keyed PromptItems, as the run's
    `options` ask (checked there); `no_tool_format` is resolve_tool_format's."""

    options: EnqueueOptions
    no_tool_format: str | None = None

    def __post_init__(self) -> None:
        self._variants = list(self.options.variants)
        self._key_sampling = _key_sampling(self.options.sampling)

    def plan(self, data: dict, *, source: str, line: int) -> list[Conversation]:
        """The row's prompts; raises producer.rows.RowError for a row that does not fit."""
        options = self.options
        if options.history == "own":
            own = own_history_from_row(
                data,
                source=source,
                line=line,
                default_system=options.system,
                max_turns=options.max_turns,
                no_tool_format=self.no_tool_format,
            )
            variant = pick_variant(
                self._variants, conversation_key(turns=own.turns, tools=own.tools, sample=0, steps=own.steps)
            )
            first = [dict(m) for m in own.turns[0]]
            return [Conversation(first, own.tools, own.row_id, 0, self._kwargs(variant), variant, own)]
        found = conversations_from_row(
            data, source=source, line=line, turns=options.turns, default_system=options.system
        )
        last = found[-1]
        variant = pick_variant(self._variants, conversation_key(turns=[last.messages], tools=last.tools, sample=0))
        kwargs = self._kwargs(variant)
        return [replace(c, template_kwargs=kwargs, variant=variant) for c in found]

    def items(self, planned: Conversation, ids: list[int], *, where: str) -> list[PromptItem]:
        """One PromptItem per sample of a templated prompt."""
        packed = pack_ids(ids)
        sampling = self.options.sampling
        variant = planned.variant
        key_sampling = self._key_sampling if variant is None else _key_sampling(variant.sampling_params(sampling))
        overrides = (variant.server_overrides(sampling) or None) if variant is not None else None
        items = []
        for sample in range(sampling.n):
            state = None
            if planned.own is not None:
                own = planned.own
                state = ConversationState(
                    key=conversation_key(turns=own.turns, tools=own.tools, sample=sample, steps=own.steps),
                    messages=planned.messages,
                    upcoming=[list(turn) for turn in own.turns[1:]],
                    tools=own.tools,
                    template_kwargs=planned.template_kwargs
                    if planned.template_kwargs is not None
                    else dict(self.options.chat_template_kwargs),
                    cut=own.cut,
                    steps=own.steps,
                )
                key = turn_key(state.key, 0)
            else:
                key = prompt_key(prompt_ids=packed, sampling=key_sampling, sample=sample)
            items.append(
                PromptItem(
                    key=key,
                    row_id=planned.row_id,
                    sample=sample,
                    ids=ids,
                    seed=sampling.sample_seed(prompt_key_material=packed, sample=sample, prompt_key=key),
                    source=where,
                    turn=planned.turn,
                    conversation=state.to_dict() if state is not None else None,
                    sampling_overrides=overrides,
                    variant=variant.name if variant is not None else None,
                )
            )
        return items

    def _kwargs(self, variant: Variant | None) -> dict | None:
        if variant is None or not variant.chat_template_kwargs:
            return None
        return {**self.options.chat_template_kwargs, **variant.chat_template_kwargs}


def _key_sampling(sampling: SamplingParams) -> dict:
    """What of the sampling goes into a prompt key (n does not: each sample has its own key)."""
    return {k: v for k, v in sampling.to_dict().items() if k != "n"}
