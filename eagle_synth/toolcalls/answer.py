"""ParsedAnswer, the shared result of every tool-call parser, and the cursor parsers walk text with."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from eagle_synth.errors import Malformed


@dataclass(frozen=True, slots=True)
class ParsedAnswer:
    """The model's answer split into its text and its tool calls.

    Parameters:
        content: the text before the first tool call, stripped ("" when the answer is only calls).
        tool_calls: the calls in order, each {"name": str, "arguments": dict}, plus "id" when the
            format writes one (Kimi-K2's `functions.NAME:IDX`, which its template renders back).
        unparsed: True when the answer opens a tool call that does not parse (malformed, truncated,
            text after the calls); `tool_calls` then holds only the calls before the fault.
        problem: what did not parse, for a failure record; None when unparsed is False.
    """

    content: str
    tool_calls: list[dict] = field(default_factory=list)
    unparsed: bool = False
    problem: str | None = None


class Cursor:
    """A position `pos` in the `text` being parsed; every method either advances or raises Malformed."""

    def __init__(self, text: str, pos: int = 0) -> None:
        self.text = text
        self.pos = pos

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def take(self, literal: str) -> bool:
        """True, and `literal` consumed, if the text continues with it after any whitespace (the
        whitespace is consumed either way: every parser expects or ends after a take, both skip it)."""
        self.skip_space()
        if not self.text.startswith(literal, self.pos):
            return False
        self.pos += len(literal)
        return True

    def expect(self, literal: str) -> None:
        if not self.take(literal):
            raise Malformed(
                f"expected {literal!r} at character {self.pos}, found {self.text[self.pos : self.pos + 30]!r}"
            )

    def _nearest(self, literals: tuple[str, ...]) -> tuple[int, str]:
        found = [(at, literal) for literal in literals if (at := self.text.find(literal, self.pos)) >= 0]
        if not found:
            raise Malformed(f"truncated: no {' or '.join(map(repr, literals))} after character {self.pos}")
        return min(found, key=lambda place: place[0])

    def upto(self, *literals: str) -> str:
        """The text up to the nearest of `literals`, which is left unconsumed."""
        at, _ = self._nearest(literals)
        piece, self.pos = self.text[self.pos : at], at
        return piece

    def until(self, *literals: str) -> tuple[str, str]:
        """The text up to the nearest of `literals`, and which one ended it (consumed)."""
        at, literal = self._nearest(literals)
        piece, self.pos = self.text[self.pos : at], at + len(literal)
        return piece, literal


def json_call(text: str) -> dict:
    """A {"name", "arguments"} call written as one JSON object (arguments may be a JSON string)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise Malformed(f"tool call is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise Malformed(f"tool call is JSON but not an object: {text.strip()[:60]!r}")
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        raise Malformed(f"tool call has no function name: {text.strip()[:60]!r}")
    key = "arguments" if "arguments" in value or "parameters" not in value else "parameters"
    return {"name": name, "arguments": json_arguments(value.get(key, {}))}


def json_arguments(value: object) -> dict:
    """Arguments that must be a JSON object, given as one or as JSON text of one."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError as exc:
            raise Malformed(f"tool call arguments are not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise Malformed(f"tool call arguments are not a JSON object: {json.dumps(value)[:60]}")
    return value


def call_name(text: str) -> str:
    """A function name written between markers: stripped, one line, not empty."""
    name = text.strip()
    if not name or any(c.isspace() for c in name):
        raise Malformed(f"bad function name {text[:60]!r}")
    return name


@dataclass(frozen=True, slots=True)
class ToolFormat:
    """How one model family (`name`, a TOOL_FORMATS entry) writes tool calls in its answer.

    Parameters:
        start: the text that opens the tool calls; the answer's content is what precedes it.
        parse_section: (cursor at `start`, {function: {parameter: schema}}, calls) reads every
            call, appending each to `calls` as soon as it parses (so a fault keeps the calls
            before it), and raises Malformed on a fault.
        end_markers: end-of-turn text a decoded answer may still end with (the stop token).
    """

    name: str
    start: str
    parse_section: Callable[[Cursor, dict[str, dict], list[dict]], None]
    end_markers: tuple[str, ...] = ()
