"""A CLI command: a config model plus `run(config) -> exit code`.

Everything around that is done here once, the same way for every command and every way to call it (`ng_<name>`,
`nemo_gym_<name>`, `ng <verb>`): the help (`+h=true`, `--help`, `ng help <verb>`), building the global config,
refusing unknown keys, and the one error path (a config mistake prints `error: ng_<name>: <message>` and exits 2,
Ctrl-C exits 130, no traceback for either).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Union

from nemo_gym.config.types import BaseNeMoGymCLIConfig, wants_help
from nemo_gym.errors import NeMoGymConfigError

OVERRIDES_NOTE = (
    "Keys are Hydra-style overrides: +key=value (nested keys with dots, lists as \"+config_paths=[a.yaml,b.yaml]\", "
    "quoted for the shell), ~key deletes. A key that is not a parameter, a global key or a key of the config files "
    "is refused as a likely typo; write ++key=value to add it anyway."
)
OVERRIDES_ONLY_NOTE = (
    "Keys are Hydra-style overrides (+key=value); no config file or env.yaml is read. A key that is not a parameter "
    "is refused as a likely typo; write ++key=value to pass it anyway."
)


class _HeldStderr(io.StringIO):
    def __init__(self, real) -> None:
        super().__init__()
        self._real = real

    def isatty(self) -> bool:  # warnings keep their colours on a terminal
        return bool(getattr(self._real, "isatty", lambda: False)())


@contextlib.contextmanager
def _warnings_after_errors():
    """Hold what is written to stderr while the config is built (warnings). Printed as soon as the build
    succeeds; when it fails with a `NeMoGymConfigError`, the error line comes first (the first line of stderr
    always says what is wrong) and `Command.main` prints the held warnings after it."""
    real = sys.stderr
    held = _HeldStderr(real)
    sys.stderr = held
    try:
        yield
    except NeMoGymConfigError as exc:
        exc.deferred_warnings = held.getvalue()
        raise
    except BaseException:
        real.write(held.getvalue())
        raise
    else:
        real.write(held.getvalue())
        real.flush()
    finally:
        sys.stderr = real


@dataclass(frozen=True)
class Command:
    """One command. `name` gives `ng_<name>` and `nemo_gym_<name>`, `verb` gives `ng <verb>`.

    `model` is the config model, or `"module:Class"` so that listing commands (and shell completion) does not
    import every command's dependencies. `run` gets the validated model, whose `global_config` is the merged
    config, and returns the exit code."""

    name: str
    verb: str
    summary: str
    model: Union[str, type[BaseNeMoGymCLIConfig]]
    run: Callable[[Any], int]
    reads_config_files: bool = True  # False: only the command-line keys (no config_paths, no env.yaml)
    allocate_ports: bool = False  # reserve a port for every server block without one (the commands that start servers)
    initial_config: Optional[Mapping[str, Any]] = None  # lowest-precedence keys merged before the config files
    examples: tuple[str, ...] = ()
    # Bare words fill these parameters in order (`ng help collect`, `ng export sft a.jsonl b.jsonl`); with more
    # words than names the last parameter gets the list of the remaining words.
    positionals: tuple[str, ...] = ()
    flags: Mapping[str, str] = field(default_factory=dict)  # short aliases: {"-o": "output_fpath"}
    # Commands whose parameters this one accepts without using them: job scripts pass one list of keys to `ng_run`
    # and to `ng_collect_rollouts`, and NeMo Gym's `ng_run` takes them silently.
    accepts_keys_of: tuple["Command", ...] = ()

    @property
    def script(self) -> str:
        return f"ng_{self.name}"

    @functools.cached_property
    def config_model(self) -> type[BaseNeMoGymCLIConfig]:
        if not isinstance(self.model, str):
            return self.model
        module, _, attr = self.model.partition(":")
        return getattr(importlib.import_module(module), attr)

    def accepted_keys(self) -> set[str]:
        """The top-level keys this command takes: its parameters and those of the commands in `accepts_keys_of`."""
        keys = set(self.config_model.parameter_keys())
        for other in self.accepts_keys_of:
            keys |= other.accepted_keys()
        return keys

    # ------------------------------------------------------------------------------------------------ running
    def main(self, args: list[str]) -> int:
        """Run the command with its command-line arguments; returns the exit code. Never raises for user mistakes."""
        try:
            return self._main(self._positionals(list(args)))
        except NeMoGymConfigError as exc:
            self.error(str(exc))
            warnings = getattr(exc, "deferred_warnings", "")
            if exc.already_reported:
                warnings = warnings.replace(exc.already_reported, "")
            if warnings.strip():
                sys.stderr.write(warnings if warnings.endswith("\n") else warnings + "\n")
            return exc.exit_code
        except KeyboardInterrupt:
            return 130
        except OSError as exc:  # a file or a server that is not there: say which, no traceback
            filename = getattr(exc, "filename", None)
            self.error(f"cannot access {filename}: {exc.strerror or exc}" if filename else str(exc))
            return 1

    def error(self, message: str) -> None:
        sys.stdout.flush()
        sys.stderr.write(f"error: {self.script}: {message}\n")
        sys.stderr.flush()

    def _positionals(self, args: list[str]) -> list[str]:
        """Turn the conventional argument shapes into overrides: bare words fill `positionals`, `--some-name value`
        / `--some-name=value` / a flag alias set `some_name`, a bare boolean `--some-name` sets it true and
        `--no-some-name` false. `+key=value`, `key=value`, `~key` and `--help` pass through untouched."""
        if not self.positionals and not self.flags and not any(a.startswith("--") for a in args):
            return args
        out: list[str] = []
        words: list[str] = []
        i = 0
        while i < len(args):
            arg = args[i]
            i += 1
            if arg in ("-h", "--help") or arg.startswith(("+", "~")):
                out.append(arg)
            elif arg in self.flags or (arg.startswith("--") and len(arg) > 2):
                name, has_value, value = (self.flags.get(arg) or arg[2:]).partition("=")
                name = name.replace("-", "_")
                if not has_value and self._is_bool(name):
                    value = "true"
                elif not has_value and name.startswith("no_") and self._is_bool(name[3:]):
                    name, value = name[3:], "false"
                elif not has_value:
                    if i >= len(args):
                        raise NeMoGymConfigError(f"{arg} needs a value ({arg} VALUE or {arg}=VALUE)")
                    value, i = args[i], i + 1
                out.append(f"+{name}={_literal(value)}")
            elif "=" not in arg and not arg.startswith("-") and self.positionals:
                words.append(arg)
            else:
                out.append(arg)
        names = list(self.positionals)
        for index, name in enumerate(names):
            taken = words[index:] if index == len(names) - 1 else words[index : index + 1]
            if len(taken) == 1:
                out.insert(index, f"+{name}={_literal(taken[0])}")
            elif taken:
                out.insert(index, f"+{name}=[{','.join(_literal(w) for w in taken)}]")
        return out

    def _is_bool(self, name: str) -> bool:
        fields = self.config_model.model_fields
        return name in fields and fields[name].annotation in (bool, Optional[bool])

    def _main(self, args: list[str]) -> int:
        if wants_help(args):
            sys.stdout.write(self.help_text())
            return 0
        from nemo_gym.config.known_keys import check_known_keys
        from nemo_gym.config.overrides import overrides_to_dict, parse_overrides

        overrides = parse_overrides(args)
        model = self.config_model
        if self.reads_config_files:
            from nemo_gym.config.global_config import parse_global_config

            with _warnings_after_errors():
                cfg = parse_global_config(
                    args,
                    initial_global_config_dict=dict(self.initial_config) if self.initial_config else None,
                    allocate_ports=self.allocate_ports,
                )
        else:
            cfg = overrides_to_dict(overrides)
        check_known_keys(
            overrides,
            command_name=self.script,
            parameters=model.parameter_keys(),
            more_parameters=self.accepted_keys if self.accepts_keys_of else None,
            global_config=cfg if self.reads_config_files else None,
            initial_config=self.initial_config,
        )
        try:
            config = model.from_global_config(cfg)
        except NeMoGymConfigError as exc:
            raise self._with_argument_hint(exc) from None
        return self.run(config)

    def _with_argument_hint(self, exc: NeMoGymConfigError) -> NeMoGymConfigError:
        """A missing parameter that has a shorter form (`-o OUT`, a bare word) says so where it is named."""
        message = str(exc)
        for name in dict.fromkeys((*self.positionals, *self.flags.values())):
            alias = next((a for a, n in self.flags.items() if n == name), None)
            form = f"`{alias} VALUE`" if alias else f"the {_ORDINALS[self.positionals.index(name)]} bare word"
            missing = f"missing required parameter `+{name}=...`"
            message = message.replace(missing, f"{missing} (or {form})")
        if message == str(exc):
            return exc
        hinted = NeMoGymConfigError(message)
        hinted.__dict__.update(exc.__dict__)
        return hinted

    # ------------------------------------------------------------------------------------------------ help
    def help_text(self) -> str:
        """What `ng_<name> +h=true`, `ng <verb> --help` and `ng help <verb>` all print."""
        model = self.config_model
        usage = "".join(f" [{name}]" for name in self.positionals[:-1])
        if self.positionals:  # the last one takes several words when its parameter can be a list
            last = self.positionals[-1]
            several = "list" in str(getattr(model.model_fields.get(last), "annotation", ""))
            usage += f" [{last}...]" if several else f" [{last}]"
        usage += "".join(f" [{alias} {name}]" for alias, name in self.flags.items()) + " [+key=value ...]"
        lines = [
            f"{self.script}: {self.summary}",
            "",
            f"Usage: {self.script}{usage}",
            f"   or: ng {self.verb}{usage}      (also nemo_gym_{self.name})",
        ]
        description = model.description()
        if description:
            lines += ["", description]
        lines += ["", *model.parameter_table()]
        if self.accepts_keys_of:
            others = ", ".join(other.script for other in self.accepts_keys_of)
            lines += ["", textwrap.fill(f"Also accepts, without using them, the parameters of {others} (a job script "
                                        "may pass the same keys to each).", 100)]
        if self.examples:
            lines += ["", "Examples:", *(f"  {example}" for example in self.examples)]
        lines += ["", textwrap.fill(OVERRIDES_NOTE if self.reads_config_files else OVERRIDES_ONLY_NOTE, 100)]
        return "\n".join(lines) + "\n"

    def console_script(self) -> Callable[[], None]:
        """The function a `[project.scripts]` entry points at."""

        def main() -> None:
            sys.exit(self.main(sys.argv[1:]))

        main.__name__ = self.name
        main.__doc__ = f"`{self.script}`: {self.summary}"
        return main


_ORDINALS = ("first", "second", "third", "fourth", "fifth")


def _literal(word: str) -> str:
    """A command-line word as a quoted override value, so paths with commas, brackets or quotes stay strings;
    numbers and booleans stay unquoted (typed by the parameter's model)."""
    if word and not any(c in word for c in "[]{},'\"\\$ ="):
        return word
    return "'" + word.replace("\\", "\\\\").replace("'", "\\'") + "'"
