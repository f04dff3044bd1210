"""Preflight: before a worker sends a server any prompt, check that it returns raw ids.

Parsers do not touch `/generate`'s output_ids, but a server launched with a reasoning or
tool-call parser is a sign the operator expects parsed text somewhere, and a server with
`skip_tokenizer_init` stops on the model config's EOS rather than the chat template's, which
changes where generations end. Each of these refuses the server unless overridden.
"""

from __future__ import annotations

from workers.client import ServerFacts

# server_info keys whose truthy value changes what a campaign would capture, and why.
REFUSED_SETTINGS = {
    "reasoning_parser": "the server runs a reasoning parser (launch it without --reasoning-parser)",
    "tool_call_parser": "the server runs a tool-call parser (launch it without --tool-call-parser)",
    "skip_tokenizer_init": (
        "the server skips its tokenizer (--skip-tokenizer-init): it stops on the model "
        "config's EOS, not the chat template's"
    ),
}


class PreflightError(RuntimeError):
    """The server is configured in a way that would change the records; says how to fix it."""


def preflight_problems(facts: ServerFacts) -> list[str]:
    """Every reason this server would not give the campaign raw, template-true ids."""
    problems = []
    for key, why in REFUSED_SETTINGS.items():
        value = facts.server_info.get(key)
        if value:
            problems.append(f"{why} [{key}={value!r}]")
    if facts.model_info.get("is_generation") is False:
        problems.append("the model is not a generation model (is_generation=false)")
    return problems


def check_server(facts: ServerFacts, *, allow_server_parsers: bool) -> list[str]:
    """Raise PreflightError for a refused server; return the overridden problems otherwise."""
    problems = preflight_problems(facts)
    if problems and not allow_server_parsers:
        raise PreflightError(
            f"refusing server {facts.url}:\n  - " + "\n  - ".join(problems)
            + "\nRelaunch it without these options, or pass --allow-server-parsers to accept them."
        )
    return problems


def provenance(facts: ServerFacts) -> dict:
    """What a campaign keeps about the server that generated its records."""
    launch_args = {
        k: v for k, v in facts.server_info.items()
        if isinstance(v, (str, int, float, bool)) or v is None
    }
    return {
        "url": facts.url,
        "version": facts.version,
        "model_path": facts.server_info.get("model_path") or facts.model_info.get("model_path"),
        "weight_version": facts.model_info.get("weight_version"),
        "context_length": facts.context_length,
        "launch_args": launch_args,
    }
