"""The one bridge from command-line flags to settings: every flag that sets a settings field is
declared as a `Flag` on that field (eagle_synth/flags.py); `settings_flags` gives a command those
fields as typer options, and `settings_from` reads the parsed flags back into the settings object.

    @app.command()
    @settings_flags(WorkerConfig)
    def worker(ctx: typer.Context, ...) -> None:
        config = settings_from(WorkerConfig, ctx)

An environment-backed model (eagle_synth.settings.EnvSettings) takes only the flags given: the
rest come from its environment variables, then its defaults; its --help names both.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from eagle_synth.flags import FIELD_DEFAULT, Flag, FlagGroup

Model = TypeVar("Model")
Command = TypeVar("Command", bound=Callable[..., Any])
# Defaults an environment-backed flag's help leaves unsaid: "unset", "none", "off".
UNSAID_DEFAULTS: tuple[Any, ...] = (None, (), False)
# The module of EnvSettings, the environment-backed models' base; not imported here: the record
# commands' flags need no pydantic.
SETTINGS_MODULE = "eagle_synth.settings"
# The name click gives a parameter left at its default (ParameterSource.DEFAULT), compared by
# name: typer vendors its own click, whose enum is not click's.
DEFAULT_SOURCE = "DEFAULT"


@dataclass(frozen=True, slots=True)
class FieldFlag:
    """One settings field and its flag.

    Parameters:
        model: the settings model the field belongs to.
        name: the field's name, which is the command parameter's too.
        flag: its declaration.
        field_type: the field's type.
        field_default: its default (inspect.Parameter.empty: required).
    """

    model: type
    name: str
    flag: Flag
    field_type: Any
    field_default: Any

    @property
    def env_backed(self) -> bool:
        return env_backed(self.model)

    @property
    def option_name(self) -> str:
        """The flag as messages name it: its first name, else --field-name."""
        return self.flag.names[0] if self.flag.names else "--" + self.name.replace("_", "-")

    def help_text(self, worded: str | None = None) -> str:
        """The flag's help (`worded`: a command's own wording of it), with an environment-backed
        model's default and variable."""
        text = self.flag.help if worded is None else worded
        if not (self.env_backed and self.flag.shows_env):
            return text
        default = self.field_default
        unsaid = default in UNSAID_DEFAULTS or isinstance(default, Path) or default is inspect.Parameter.empty
        shown = "" if unsaid else f" [default: {default}]"
        return f"{text}{shown} [env: {self.model.env_name(self.name)}]"  # type: ignore[attr-defined]

    def parameter(self, worded: str | None = None) -> inspect.Parameter:
        """The command parameter typer makes the option from (`worded`: as help_text)."""
        cli_type = self.field_type if self.flag.type is FIELD_DEFAULT else self.flag.type
        default: Any
        if self.flag.required:
            default = inspect.Parameter.empty
        elif self.flag.default is not FIELD_DEFAULT:
            default = self.flag.default
        elif self.env_backed:  # unset: the environment, then the field's default, fill it
            default = False if cli_type is bool else None
        else:
            default = self.field_default
        names = self.flag.names
        if not names and not self.flag.negatable:
            names = (self.option_name,)  # typer adds --no-X to a bool flag only when it names it
        option = typer.Option(*names, help=self.help_text(worded))
        return inspect.Parameter(
            self.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[cli_type, option]
        )


def env_backed(model: type) -> bool:
    """Whether a model reads its fields from the environment (an EnvSettings). Such a model's
    module has imported eagle_synth.settings, its base's; while nothing has, no model is one."""
    settings = sys.modules.get(SETTINGS_MODULE)
    return settings is not None and issubclass(model, settings.EnvSettings)


def _field_defaults(model: type) -> dict[str, Any]:
    """Each field's default (inspect.Parameter.empty when it has none), dataclass or pydantic."""
    if dataclasses.is_dataclass(model):
        found = {}
        for f in dataclasses.fields(model):
            if f.default is not dataclasses.MISSING:
                found[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                found[f.name] = f.default_factory()
            else:
                found[f.name] = inspect.Parameter.empty
        return found
    fields = model.model_fields  # type: ignore[attr-defined]
    return {
        name: inspect.Parameter.empty if info.is_required() else info.get_default(call_default_factory=True)
        for name, info in fields.items()
    }


def _declared(model: type) -> dict[str, tuple[Any, Any]]:
    """Each field's type and its Flag or FlagGroup (None for a field no flag sets)."""
    plain = typing.get_type_hints(model)
    extras = typing.get_type_hints(model, include_extras=True)
    found = {}
    for name, hint in extras.items():
        marks = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, (Flag, FlagGroup))]
        found[name] = (plain[name], marks[0] if marks else None)
    return found


@functools.cache
def field_flags(model: type) -> tuple[FieldFlag, ...]:
    """The flags of a settings model's fields, in field order, a FlagGroup's flags in its place."""
    defaults = _field_defaults(model)
    found: list[FieldFlag] = []
    for name, (field_type, mark) in _declared(model).items():
        if isinstance(mark, FlagGroup):
            found.extend(field_flags(field_type))
        elif isinstance(mark, Flag):
            found.append(FieldFlag(model, name, mark, field_type, defaults[name]))
    return tuple(found)


def settings_flags(
    *models: type, order: Sequence[str] = (), helps: Mapping[str, str] | None = None
) -> Callable[[Command], Command]:
    """Give a command the flags of the models' fields: after its own parameters without a
    default (its arguments, its context), before its own options; or in `order` (every
    parameter's name) where a command interleaves them. `helps`: the command's own wording of a
    flag's help, by field (vocab's --split). The command itself receives only its own
    parameters; `settings_from` reads the flags."""

    def decorate(command: Command) -> Command:
        # Keyword-only, every one: typer passes them by name, and lists them in this order.
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in inspect.signature(command, eval_str=True).parameters.values()
        ]
        worded = helps or {}
        generated = [f.parameter(worded.get(f.name)) for model in models for f in field_flags(model)]
        leading = [p for p in own if p.default is inspect.Parameter.empty]
        trailing = [p for p in own if p.default is not inspect.Parameter.empty]
        parameters = [*leading, *generated, *trailing]
        if order:
            by_name = {p.name: p for p in parameters}
            if set(order) != set(by_name):
                raise TypeError(f"{command.__name__}: order names {sorted(set(order) ^ set(by_name))} wrongly")
            parameters = [by_name[name] for name in order]
        own_names = {p.name for p in own}

        @functools.wraps(command)
        def run(**values: Any) -> Any:
            return command(**{name: value for name, value in values.items() if name in own_names})

        run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        return typing.cast(Command, run)

    return decorate


def settings_from(model: type[Model], ctx: typer.Context, **given: Any) -> Model:
    """The settings object of a command's flags: each flagged field from its flag (parsed), a
    FlagGroup field built the same way, `given` fields as they are; a flag left unset (None)
    leaves its field's default. An environment-backed model takes the flags given and reads the
    rest from its environment (`EnvSettings.load`)."""
    values: dict[str, Any] = {}
    for name, (field_type, mark) in _declared(model).items():
        if name in given:
            values[name] = given[name]
        elif isinstance(mark, FlagGroup):
            values[name] = settings_from(field_type, ctx)
        elif isinstance(mark, Flag) and _taken(model, ctx, name) and ctx.params[name] is not None:
            raw = ctx.params[name]
            values[name] = raw if mark.parse is None else mark.parse(raw)
    if env_backed(model):
        return typing.cast(Model, model.load(**values))  # type: ignore[attr-defined]
    return model(**values)


def _taken(model: type, ctx: typer.Context, name: str) -> bool:
    """Whether a flag's value sets its field: always, but for an environment-backed model only
    when the flag was given (its environment variable, else its default, fills the rest)."""
    if not env_backed(model):
        return True
    source = ctx.get_parameter_source(name)
    return source is not None and source.name != DEFAULT_SOURCE


def flag_names(model: type) -> dict[str, str]:
    """Each flagged field's flag as messages name it (max_attempts: --max-attempts), by field."""
    return {f.name: f.option_name for f in field_flags(model)}
