"""`python -m eagle_synth.devserver --tokenizer DIR [--port P] ...`: run a devserver.

Flags are generated from DevServerConfig's fields (name with dashes, help from metadata), so
the CLI and the dataclass cannot drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import logging
import sys
import types
import typing
from collections.abc import Sequence

from eagle_synth.devserver.config import DevServerConfig
from eagle_synth.devserver.server import run_devserver
from eagle_synth.errors import USER_ERROR_EXIT
from eagle_synth.templating import TemplateError, check_tokenizer_path

# Log line format on stderr (stdout carries only the "listening" line).
LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"


def _scalar_type(hint: typing.Any) -> type:
    """int for `int | None`, str for `str`, ..."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0]
    return hint


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser for every CLI-visible DevServerConfig field."""
    parser = argparse.ArgumentParser(
        prog="python -m eagle_synth.devserver",
        description="SGLang (or, with --api vllm, vLLM) stand-in for tests, demos and benchmarks (no GPU needed).",
    )
    hints = typing.get_type_hints(DevServerConfig)
    for f in dataclasses.fields(DevServerConfig):
        if not f.metadata.get("cli", True):
            continue
        flag = "--" + f.name.replace("_", "-")
        flags = (flag, *f.metadata.get("aliases", ()))
        kind = _scalar_type(hints[f.name])
        help_text = f.metadata.get("help", "")
        if f.default is dataclasses.MISSING:
            parser.add_argument(*flags, dest=f.name, type=kind, required=True, help=help_text)
        elif kind is bool:
            parser.add_argument(*flags, dest=f.name, action="store_true", help=help_text)
        else:
            parser.add_argument(
                *flags,
                dest=f.name,
                type=kind,
                default=f.default,
                help=help_text if f.default is None else f"{help_text} (default: {f.default})",
            )
    return parser


def config_from_argv(argv: Sequence[str] | None = None) -> DevServerConfig:
    """Parse CLI arguments into a validated DevServerConfig (exits with usage on errors)."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return DevServerConfig(**vars(ns))
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def _stop(message: str) -> int:
    """One `error: ...` line on stderr, as every eagle-synth command says it; exit status 2."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    return USER_ERROR_EXIT


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the process exit status (2, with one line, for a flag to fix)."""
    config = config_from_argv(argv)
    port_taken = (
        f"--port {config.port}: address {config.host}:{config.port} is already in use; "
        "pick another port (--port 0 takes a free one)"
    )
    try:
        check_tokenizer_path(config.tokenizer)
    except TemplateError as exc:
        return _stop(str(exc))
    if config.port and not _can_bind(config.host, config.port):
        return _stop(port_taken)  # before the tokenizer's seconds of loading
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    try:
        run_devserver(config)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        return _stop(port_taken)  # taken while the tokenizer loaded
    return 0


def _can_bind(host: str, port: int) -> bool:
    """Whether (host, port) can be bound now, as the HTTP server binds it (SO_REUSEADDR)."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


if __name__ == "__main__":
    sys.exit(main())
