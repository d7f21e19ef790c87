"""Where a server's code may come from: its implementation folder lies under a server root, its entrypoint inside
that folder.

Why a rule of its own: a server block names an implementation (`resources_servers: {mcqa: {...}}`) and an
`entrypoint`; `ng_run` joins them into paths, builds the folder's venv (`pip install -e <folder>` runs its build
code) and runs `python <entrypoint>` in it. Without a rule, a `..`, an absolute path or a symlink in a config file
or a `+key=value` override runs any file on the machine. So every path that starts or imports server code
(`ng_run`'s processes and Ray actors, venv builds, `ng_prepare_data`'s look at a verifier, the key check of
`config/block_keys.py`, `ng_validate`) asks `locate_server`, and `ng_test`'s folder goes through `server_folder_of`.

The roots are the two places v0.2 looks: `<folder ng_run runs in>/<server type>/` and the same under the install
root. An implementation is a folder name under one of them (nested names like `group/impl` are fine); `..` parts
and absolute paths are refused before the disk is looked at, and a folder or entrypoint that is a symlink to
somewhere outside its root is refused after resolving it. A whole `<server type>/` folder that is itself a link is
a root, so it may point anywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from nemo_gym import PARENT_DIR
from nemo_gym.errors import NeMoGymConfigError, did_you_mean

SERVER_FOLDER_MARKERS = ("requirements.txt", "pyproject.toml")


class OutsideServerRootsError(NeMoGymConfigError):
    """An implementation folder or entrypoint that would run code from outside the server roots (as opposed to
    one that is merely missing, which some commands tolerate)."""


@dataclass(frozen=True)
class ServerLocation:
    """A server's folder and its entrypoint (relative to the folder), both checked against the roots."""

    server_dir: Path
    entrypoint: str


def server_roots(cwd: Path) -> list[Path]:
    """The folders server types live under, in lookup order: the current folder, then the install root."""
    return list(dict.fromkeys([Path(cwd), Path(PARENT_DIR)]))


def refuse_escaping_parts(text: str, *, what: str, inside: str, fix: str) -> Path:
    """`text` as a relative path with no `..` part; a config error naming `what` otherwise. `inside` names the
    folder it must stay in, `fix` says what to write instead."""
    path = Path(text)
    if path.is_absolute():
        reason = "is an absolute path"
    elif ".." in path.parts:
        reason = "climbs out with `..`"
    elif not path.parts:
        reason = "names no folder or file"
    else:
        return path
    raise OutsideServerRootsError(
        f"{what} {reason}; nemo_gym runs server code only from inside {inside}. {fix}"
    )


def is_strictly_inside(path: Path, folder: Path) -> bool:
    """Whether `path`, symlinks resolved, lies below `folder` (also resolved), and is not `folder` itself."""
    real, base = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    return real != base and real.is_relative_to(base)


def find_server_dir(server_id: str, server_type: str, impl: str, cwd: Path) -> Path:
    """The folder of implementation `impl` of `server_type`: under the current folder when it is a server folder
    (has requirements.txt or pyproject.toml), else under the install root, as v0.2 does; a folder that exists in
    only one place is used as is. Refuses names and links that leave `<root>/<server_type>/`."""
    where = f"`{server_id}.{server_type}`"
    roots = server_roots(cwd)
    rel = refuse_escaping_parts(
        str(impl),
        what=f"Server '{server_id}': the implementation name {impl!r} under {where}",
        inside=" or ".join(str(root / server_type) for root in roots),
        fix=f"Name a folder there (e.g. `{server_type}: {{my_server: ...}}`), moving or copying the server into it.",
    )
    candidates = [(root / server_type, root / server_type / rel) for root in roots]
    chosen = next(
        (pair for pair in candidates if any((pair[1] / marker).exists() for marker in SERVER_FOLDER_MARKERS)),
        None,
    ) or next((pair for pair in candidates if pair[1].is_dir()), None)
    if chosen is None:
        looked = ", ".join(str(folder) for _, folder in candidates)
        existing = {d.name for base, _ in candidates if base.is_dir() for d in base.iterdir() if d.is_dir()}
        raise NeMoGymConfigError(
            f"Server '{server_id}': no folder for implementation '{impl}' of {server_type}."
            f"{did_you_mean(str(impl), sorted(existing))} Looked in: {looked}. Check the implementation name under "
            f"{where} or create the folder (ng_init_resources_server scaffolds one)."
        )
    base, folder = chosen
    if not is_strictly_inside(folder, base):
        raise OutsideServerRootsError(
            f"Server '{server_id}': the folder of implementation '{impl}', {folder}, is a link to "
            f"{os.path.realpath(folder)}, outside {base}; nemo_gym runs server code only from inside it. Move or copy "
            f"the server into {base} instead of linking it."
        )
    return folder


def check_entrypoint(server_id: str, key: str, entrypoint: str, server_dir: Path) -> str:
    """`entrypoint` (the value of `key`) when it names a file inside `server_dir`, links resolved; refused
    otherwise, with the reason."""
    fix = f"Put the script in {server_dir} and name it relative to that folder (e.g. `entrypoint: app.py`)."
    what = f"Server '{server_id}': `{key}` ({entrypoint!r})"
    if not entrypoint:
        raise NeMoGymConfigError(f"{what} is empty. {fix}")
    refuse_escaping_parts(entrypoint, what=what, inside=str(server_dir), fix=fix)
    if entrypoint.startswith("-"):  # `python -c...` would read it as an option, not a file
        raise NeMoGymConfigError(f"{what} starts with `-`, which python reads as an option. Rename the script.")
    path = server_dir / entrypoint
    if not path.is_file():
        raise NeMoGymConfigError(f"Server '{server_id}': entrypoint {entrypoint!r} not found in {server_dir}.")
    if not is_strictly_inside(path, server_dir):
        raise OutsideServerRootsError(
            f"{what} is a link to {os.path.realpath(path)}, outside the server folder; nemo_gym runs server code "
            f"only from inside {server_dir}. {fix}"
        )
    return entrypoint


def locate_server(spec, cwd: Path) -> ServerLocation:
    """The one check every path that starts a server's code goes through: `spec` (a `ServerInstanceSpec`)'s folder
    under the roots and its entrypoint inside that folder."""
    server_dir = find_server_dir(spec.server_id, spec.server_type, spec.impl, cwd)
    key = f"{spec.server_id}.{spec.server_type}.{spec.impl}.entrypoint"
    entrypoint = check_entrypoint(spec.server_id, key, str(spec.config.get("entrypoint") or ""), server_dir)
    return ServerLocation(server_dir=server_dir, entrypoint=entrypoint)


def server_folder_of(path_text: str, cwd: Path, server_types: Iterable[str]) -> Optional[Path]:
    """For a command given a server folder as a path (`ng_test +entrypoint=resources_servers/mcqa`): the folder,
    absolute, when it exists (relative to the current folder, then the install root; an absolute path is taken as
    is); None when it does not. A path with `..`, or one that leads, links resolved, outside every
    `<root>/<server type>/`, is refused."""
    roots = server_roots(cwd)
    types = list(server_types)
    inside = f"a server type folder ({', '.join(types)}) under {' or '.join(str(root) for root in roots)}"
    what = f"The server folder {path_text!r}"
    fix = "Pass a folder like resources_servers/<name>, moving or copying the server there."
    path = Path(os.path.expanduser(str(path_text).strip()))
    if ".." in path.parts:
        raise OutsideServerRootsError(
            f"{what} climbs out with `..`; nemo_gym runs server code only from inside {inside}. {fix}"
        )
    candidates = [path] if path.is_absolute() else [root / path for root in roots]
    found = next((candidate for candidate in candidates if candidate.is_dir()), None)
    if found is None:
        return None
    if not any(is_strictly_inside(found, root / server_type) for root in roots for server_type in types):
        raise OutsideServerRootsError(
            f"{what} is {os.path.realpath(found)}, outside the server roots; nemo_gym runs server code only from "
            f"inside {inside}. {fix}"
        )
    return Path(os.path.normpath(os.path.abspath(found)))
