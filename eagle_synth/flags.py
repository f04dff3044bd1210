"""A setting's command-line flag, declared once, on the settings field it sets.

A field of a settings model (a dataclass such as producer/options.py's `EnqueueOptions`, or a
pydantic model such as workers/config.py's `WorkerConfig`) that a command takes as a flag says
so in its type: `max_attempts: Annotated[int, Flag("Attempts per prompt ...")] = 6`. The CLI's
bridge (eagle_synth/cli/flags.py) makes the typer option from it and reads the value back into
the field, so a flag's journey is: this declaration, the bridge, the field. Light to import: no
typer, no pydantic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class _FieldDefault:
    """The marker of a Flag whose default is its field's."""

    def __repr__(self) -> str:
        return "FIELD_DEFAULT"


# A Flag's `type` and `default` when they are its field's own.
FIELD_DEFAULT: Any = _FieldDefault()


@dataclass(frozen=True, slots=True)
class Flag:
    """How one settings field is given on the command line.

    Parameters:
        help: the flag's --help text (an environment-backed model adds its default and variable).
        names: the flag's names; none: `--field-name` (a bool field: `--field-name/--no-field-name`,
            or `--field-name` alone when not `negatable`).
        type: what the flag reads, when it is not the field's type (a path for a string field, a
            repeated flag for a comma list).
        default: the flag's default, when it is not the field's.
        parse: turns the flag's value into the field's; None: the value is the field's as it is.
        required: the command needs the flag although the field has a default.
        shows_env: an environment-backed model's help names the variable and the default.
        negatable: a bool field's flag has its `--no-` form too.
    """

    help: str
    names: tuple[str, ...] = ()
    type: Any = FIELD_DEFAULT
    default: Any = FIELD_DEFAULT
    parse: Callable[[Any], Any] | None = None
    required: bool = False
    shows_env: bool = True
    negatable: bool = True


@dataclass(frozen=True, slots=True)
class FlagGroup:
    """A field that is a settings model itself: its fields' flags are the command's flags too
    (`EnqueueOptions.sampling`: the sampling flags), and the bridge builds it from them."""


# The flags of the commands that check Redis is fit for a campaign (enqueue, worker).
ALLOW_EVICTING_REDIS = Flag(
    "Accept a Redis whose maxmemory-policy may evict keys (it can lose or double work).", shows_env=False
)
ALLOW_VOLATILE_REDIS = Flag(
    "Accept a Redis with no appendonly and no RDB save (a restart loses the campaign).", shows_env=False
)
