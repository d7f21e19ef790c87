"""Prompt templates (NeMo Gym v0.5 `nemo_gym.prompt`): a dataset row's fields rendered into the model's input.

A prompt config is a small YAML file::

    system: You are a careful mathematician.          # optional
    user: "Solve: {question}\\nPut the answer in \\\\boxed{{}}."

`user` (required) and `system` are `str.format_map` templates over the row's **top-level** fields; literal braces
are doubled. Other keys in the file are ignored. The rendered messages become the row's
`responses_create_params.input`, so a row given to a template must not carry an input of its own (the two are
exclusive: `validate_prompt_compatibility`).

Why a separate step instead of writing the prompt into every row: the same questions are asked under several
prompts (benchmarks, ablations), so the data stays prompt-free and the template is chosen per run
(`prompt_config` of rollout collection, of a benchmark dataset, or offline with `materialize_prompts`).

Relative template paths are looked up in the search roots: `NEMO_GYM_EXTRA_ROOTS` (os.pathsep list), then the
current directory, then the nemo_gym install root; the first that has the file wins. Loaded templates are cached
(64, by resolved path), so applying one to every row of a large file reads the YAML once.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from nemo_gym import EXTRA_ROOTS_ENV_VAR_NAME, PARENT_DIR
from nemo_gym.config.types import BaseNeMoGymCLIConfig
from nemo_gym.errors import NeMoGymConfigError

__all__ = [
    "PromptConfig",
    "PromptFileNotFoundError",
    "MaterializePromptsConfig",
    "PROMPT_CONFIG_USED_KEY_NAME",
    "EXTRA_ROOTS_ENV_VAR_NAME",
    "prompt_search_roots",
    "resolve_prompt_config_path",
    "load_prompt_config",
    "fill_prompt",
    "validate_prompt_compatibility",
    "has_input",
    "apply_prompt_to_row",
    "prompt_row_applier",
    "materialize_prompts",
]

PROMPT_CONFIG_USED_KEY_NAME = "prompt_config_used"
_CACHE_SIZE = 64
_MAX_INDICES_SHOWN = 50

PathLike = Union[str, os.PathLike]


class PromptConfig(BaseModel):
    """A prompt template: `user` (required) and an optional `system`, both `str.format_map` templates."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    user: str
    system: Optional[str] = None

    # The file it was loaded from (None when built in code), for error messages and `prompt_config_used`.
    _source: Optional[str] = PrivateAttr(default=None)

    @property
    def source(self) -> Optional[str]:
        return self._source


class PromptFileNotFoundError(NeMoGymConfigError, FileNotFoundError):
    """A prompt config (or input file) path that is in none of the search roots."""


class MaterializePromptsConfig(BaseNeMoGymCLIConfig):
    """Render a prompt template into every row of a JSONL file, offline (`gym dataset render`). Each output row
    gets `responses_create_params.input` from the template and `prompt_config_used` (the template's path).

    Example: gym dataset render +input_jsonl_fpath=data/questions.jsonl \\
        +prompt_config=benchmarks/prompts/generic/math.yaml +output_jsonl_fpath=data/questions_rendered.jsonl
    """

    input_jsonl_fpath: str = Field(description="Rows to render (a JSONL file; relative paths via the search roots).")
    prompt_config: str = Field(description="The prompt template YAML (relative paths via the search roots).")
    output_jsonl_fpath: str = Field(description="Where to write the rendered rows.")


# --------------------------------------------------------------------------------------------------------
# Finding and loading a template


def prompt_search_roots() -> list[Path]:
    """Where relative paths are looked up, earliest first: `NEMO_GYM_EXTRA_ROOTS`, cwd, the install root."""
    roots: list[Path] = []
    extra = os.environ.get(EXTRA_ROOTS_ENV_VAR_NAME, "")
    for part in extra.split(os.pathsep):
        if part.strip():
            roots.append(Path(os.path.expanduser(part.strip())))
    roots.append(Path.cwd())
    roots.append(Path(PARENT_DIR))
    unique: list[Path] = []
    for root in roots:
        if root not in unique:
            unique.append(root)
    return unique


def resolve_prompt_config_path(path: PathLike, *, what: str = "prompt config") -> Path:
    """The absolute path of `path`: as is when absolute, else the first search root that has it."""
    candidate = Path(os.path.expanduser(os.fspath(path)))
    if candidate.is_absolute():
        if candidate.is_file():
            return candidate
        raise PromptFileNotFoundError(f"The {what} {candidate} does not exist.")
    tried = []
    for root in prompt_search_roots():
        full = root / candidate
        if full.is_file():
            return full.resolve()
        tried.append(str(full))
    raise PromptFileNotFoundError(
        f"The {what} `{os.fspath(path)}` was not found. Looked in: {', '.join(tried)}. Give an absolute path, run "
        f"from the directory that holds it, or add its root to {EXTRA_ROOTS_ENV_VAR_NAME}."
    )


@lru_cache(maxsize=_CACHE_SIZE)
def _load_resolved(path: str) -> PromptConfig:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise NeMoGymConfigError(f"Cannot read the prompt config {path}: {err.strerror or err}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).strip().splitlines()[0]
        raise NeMoGymConfigError(f"YAML syntax error in the prompt config {path}{where}: {problem}") from None
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise NeMoGymConfigError(
            f"The prompt config {path} must be a mapping with a `user` template (and optionally `system`), "
            f"not {got}."
        )
    try:
        config = PromptConfig.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(
            f"`{'.'.join(str(p) for p in e['loc']) or '(top level)'}`: {e['msg']}" for e in err.errors()
        )
        raise NeMoGymConfigError(
            f"The prompt config {path} is invalid: {problems}. It needs `user: <template>` (a string) and may "
            f"have `system: <template>`."
        ) from None
    config._source = path
    return config


def load_prompt_config(path: PathLike) -> PromptConfig:
    """The prompt template in YAML file `path` (relative: via the search roots). Cached by resolved path (64).

    Errors name the file: `PromptFileNotFoundError` when no root has it, `NeMoGymConfigError` for bad YAML
    (with line and column) or a missing/non-string `user`."""
    if isinstance(path, PromptConfig):
        return path
    return _load_resolved(str(resolve_prompt_config_path(path)))


load_prompt_config.cache_clear = _load_resolved.cache_clear  # type: ignore[attr-defined]
load_prompt_config.cache_info = _load_resolved.cache_info  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------------------
# Rendering


def _where(cfg: PromptConfig) -> str:
    return f"the prompt config {cfg.source}" if cfg.source else "the prompt template"


def _render(template: str, part: str, cfg: PromptConfig, row: Mapping[str, Any]) -> str:
    try:
        return template.format_map(row)
    except KeyError as err:
        field = err.args[0] if err.args else "?"
        fields = ", ".join(sorted(str(k) for k in row.keys())) or "(none)"
        raise KeyError(
            f"The `{part}` template of {_where(cfg)} uses the field {{{field}}}, which the row does not have. "
            f"The row's top-level fields are: {fields}. (Literal braces in a template are written {{{{ and }}}}.)"
        ) from None
    except (ValueError, IndexError, AttributeError) as err:
        raise ValueError(
            f"The `{part}` template of {_where(cfg)} cannot be rendered: {err}. Templates use str.format "
            f"syntax: fields as {{name}}, literal braces doubled ({{{{ and }}}})."
        ) from None


def fill_prompt(cfg: PromptConfig, row: Mapping[str, Any]) -> list[dict]:
    """The input messages for `row`: `{"role": "system", ...}` when the template has a system part, then
    `{"role": "user", ...}`, each rendered with `str.format_map` over the row's top-level fields.

    A field the template names but the row lacks raises `KeyError` listing the row's fields."""
    messages = []
    if cfg.system is not None:
        messages.append({"role": "system", "content": _render(cfg.system, "system", cfg, row)})
    messages.append({"role": "user", "content": _render(cfg.user, "user", cfg, row)})
    return messages


def has_input(row: Any) -> bool:
    if not isinstance(row, Mapping):
        return False
    params = row.get("responses_create_params")
    if not isinstance(params, Mapping):
        return False
    value = params.get("input")
    return value is not None and value != "" and value != []


def validate_prompt_compatibility(rows: Iterable[Mapping[str, Any]], cfg: Optional[PromptConfig] = None) -> None:
    """Raise `ValueError` listing every row index (0-based) whose `responses_create_params.input` is non-empty: a
    template writes the input, so rows given one must not bring their own."""
    bad = [index for index, row in enumerate(rows) if has_input(row)]
    if not bad:
        return
    shown = ", ".join(str(i) for i in bad[:_MAX_INDICES_SHOWN])
    if len(bad) > _MAX_INDICES_SHOWN:
        shown += f", ... ({len(bad)} rows in all)"
    where = _where(cfg) if cfg is not None else "a prompt template"
    raise ValueError(
        f"{len(bad)} row(s) already have a non-empty `responses_create_params.input`, but {where} writes the "
        f"input, so the two cannot be combined. Rows (0-based): {shown}. Remove their input (keep the fields the "
        f"template uses), or drop the prompt config."
    )


def apply_prompt_to_row(row: Mapping[str, Any], cfg: PromptConfig) -> dict:
    """A copy of `row` whose `responses_create_params.input` is `fill_prompt(cfg, row)`; the other create params
    are kept, and `responses_create_params` is created when the row has none. The row itself is not changed."""
    params = row.get("responses_create_params")
    new_params = dict(params) if isinstance(params, Mapping) else {}
    new_params["input"] = fill_prompt(cfg, row)
    new_row = dict(row)
    new_row["responses_create_params"] = new_params
    return new_row


def prompt_row_applier(prompt_config: Union[PathLike, PromptConfig]):
    """`apply(row) -> row` for a whole file (the collector's `prompt_config`): the template is loaded once, here,
    so a bad path or YAML fails before any row is read; each call only renders."""
    cfg = load_prompt_config(prompt_config)

    def apply(row: Mapping[str, Any]) -> dict:
        return apply_prompt_to_row(row, cfg)

    apply.prompt_config = cfg  # type: ignore[attr-defined]
    return apply


# --------------------------------------------------------------------------------------------------------
# Offline rendering


def _iter_rows(path: Path) -> Iterable[tuple[int, dict]]:
    with path.open("r", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise NeMoGymConfigError(
                    f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno})."
                ) from None
            if not isinstance(row, dict):
                raise NeMoGymConfigError(f"{path}:{number}: a row must be a JSON object, got {type(row).__name__}.")
            yield number, row


def materialize_prompts(
    input_jsonl: PathLike, prompt_config: Union[PathLike, PromptConfig], output_jsonl: PathLike
) -> Path:
    """Render `prompt_config` into every row of `input_jsonl` and write the rows to `output_jsonl`, each with
    `prompt_config_used` = the template's resolved path. All rows are checked first (no row may carry its own
    input); the output is written to a temporary file and renamed into place. Returns the output path."""
    cfg = load_prompt_config(prompt_config)
    source = resolve_prompt_config_path(input_jsonl, what="input JSONL file")
    output = Path(os.path.expanduser(os.fspath(output_jsonl)))
    if not output.is_absolute():
        output = Path.cwd() / output
    if output.resolve() == source.resolve():
        raise NeMoGymConfigError(f"materialize_prompts would overwrite its input {source}; choose another output path.")

    validate_prompt_compatibility((row for _, row in _iter_rows(source)), cfg)
    used = cfg.source
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp{os.getpid()}")
    try:
        with tmp.open("w", encoding="utf-8") as out:
            for number, row in _iter_rows(source):
                try:
                    rendered = apply_prompt_to_row(row, cfg)
                except KeyError as err:
                    raise KeyError(f"{source}:{number}: {err.args[0]}") from None
                if used is not None:
                    rendered[PROMPT_CONFIG_USED_KEY_NAME] = used
                out.write(json.dumps(rendered, ensure_ascii=False) + "\n")
        os.replace(tmp, output)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return output
