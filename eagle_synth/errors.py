"""The error tree: what a user can fix, and everything else.

`UserError` is what the person running the command can fix: the CLI prints its one-line
message (exit status 2). Any other exception is a bug or an outage and keeps its traceback.

Every error raised on purpose derives from EagleSynthError: UserError (campaign, settings,
template, input, config, preflight and tool refusals, each in its module) or one that is not the
user's to fix (a damaged record or payload, a lost lease, a server's failure, a batch's endings).
Each subclass also derives from the builtin it stands for (ValueError, FileNotFoundError...)
where callers catch that.
"""

from __future__ import annotations

# Exit status of a command stopped by a UserError.
USER_ERROR_EXIT = 2


class EagleSynthError(Exception):
    """Base of every error eagle-synth raises on purpose."""


class UserError(EagleSynthError):
    """Something the user can fix; the message says what and how, in one line if it can."""

    exit_code = USER_ERROR_EXIT


class CampaignNotFound(UserError, KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no campaign named {name!r} in this Redis; `eagle-synth campaigns` lists them")
        self.name = name

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def clause(value: object) -> str:
    """`value` as text inside a sentence, without its full stop (so no message shows two)."""
    return str(value).rstrip().rstrip(".")
