"""Run-level skills (NeMo Gym v0.5, `nemo_gym.skills`): a folder of skill folders that agent runtimes (Claude Code,
Codex, ...) load, named once per collection with `+skills.path=...` and carried to every agent as `skills_ref`.

`load_skill_directory(path)` reads it into a `SkillsRef`: the path, a content hash (so a result says exactly which
skills it ran with, and two runs compare) and each skill's metadata from the YAML front matter of its `SKILL.md`.
`stage_skills(path, dest_dir)` copies the skills where an agent runtime expects them.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any, Optional, Union

import yaml
from pydantic import BaseModel, Field

__all__ = ["SkillMetadata", "SkillsRef", "SkillsConfig", "SKILL_FILE_NAME", "load_skill_directory", "stage_skills"]

SKILL_FILE_NAME = "SKILL.md"
HASH_HEX_CHARS = 12


class SkillMetadata(BaseModel):
    """One skill, from its SKILL.md front matter (`name`, `description`, `metadata.version`)."""

    name: str
    description: Optional[str] = None
    version: Optional[str] = None


class SkillsRef(BaseModel):
    """What a row (and its result) carries as `skills_ref`."""

    path: str
    hash: str
    skills: list[SkillMetadata] = Field(default_factory=list)


class SkillsConfig(BaseModel):
    """`+skills.path=<folder of skill folders>` on a collection."""

    path: str = Field(description="A folder whose sub-folders are skills, each with a SKILL.md.")


def _front_matter(skill_file: Path) -> dict:
    text = skill_file.read_text(encoding="utf-8")
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        raise ValueError(f"{skill_file}: no YAML front matter (the file must start with a `---` line)")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise ValueError(f"{skill_file}: the YAML front matter has no closing `---` line") from None
    try:
        data = yaml.safe_load("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{skill_file}: invalid YAML front matter: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{skill_file}: the front matter must be a mapping (name: ..., description: ...)")
    return data


def _metadata(skill_file: Path) -> SkillMetadata:
    data = _front_matter(skill_file)
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{skill_file}: the front matter needs a `name` (a non-empty string)")
    description = data.get("description")
    meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
    version = meta.get("version")
    return SkillMetadata(
        name=name.strip(),
        description=None if description is None else str(description),
        version=None if version is None else str(version),
    )


def _content_hash(root: Path) -> str:
    """First 12 hex digits of sha256 over every file's relative path and bytes, in sorted path order."""
    digest = hashlib.sha256()
    for file in sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.relative_to(root).as_posix()):
        digest.update(file.relative_to(root).as_posix().encode("utf-8"))
        digest.update(file.read_bytes())
    return digest.hexdigest()[:HASH_HEX_CHARS]


def load_skill_directory(path: Union[str, Path]) -> SkillsRef:
    """The `SkillsRef` of a folder of skill folders; any problem is a `ValueError` naming the file."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ValueError(f"skills path {root} is not a folder (give a folder whose sub-folders each hold a SKILL.md)")
    skills = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        skill_file = folder / SKILL_FILE_NAME
        if not skill_file.is_file():
            raise ValueError(f"skill folder {folder} has no {SKILL_FILE_NAME}")
        skills.append(_metadata(skill_file))
    if not skills:
        raise ValueError(f"skills path {root} holds no skill folder (each sub-folder with a {SKILL_FILE_NAME})")
    names = [s.name for s in skills]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"skills path {root}: several skills are named {', '.join(duplicated)}")
    return SkillsRef(path=str(root), hash=_content_hash(root), skills=skills)


def stage_skills(path: Union[str, Path], dest_dir: Union[str, Path]) -> Path:
    """Copy the skill folders of `path` into `dest_dir` (created; existing files are overwritten) and return it."""
    ref = load_skill_directory(path)
    dest = Path(dest_dir).expanduser()
    dest.mkdir(parents=True, exist_ok=True)
    for folder in sorted(p for p in Path(ref.path).iterdir() if p.is_dir() and not p.name.startswith(".")):
        shutil.copytree(folder, dest / folder.name, dirs_exist_ok=True)
    return dest


def skills_ref_from_config(value: Any) -> Optional[dict]:
    """The `skills_ref` dict rows get from a collection's `skills` key (`{path}` or a bare path), or None."""
    if value is None:
        return None
    path = value.get("path") if isinstance(value, dict) else getattr(value, "path", value)
    return load_skill_directory(str(path)).model_dump()
