"""The two spellings of a resources server's id: `mcqa` and `mcqa_resources_server` name the same block.

NeMo Gym v0.5 names most bundled resources servers after the server (`mcqa`, `math_with_judge`), a few with the
suffix (`arc_agi_resources_server`); our bundled servers were all `<server>_resources_server` before issue 35. So
a config written for either naming keeps working: where no block has the id asked for, the id with the suffix
added (or removed) is tried, and taken when it is a resources-server block. Used in one place per way an id is
written: `_inherit_from` / `_copy` / `${inherit_from:}` paths (directives), `{type: resources_servers, name: ...}`
references and server lookups by id (global_config), and a fragment block written under the other spelling, e.g.
`+mcqa_resources_server.resources_servers.mcqa.grading_mode=lenient_boxed` (merged into `mcqa`).

Agents keep one spelling (`<server>_simple_agent` in both namings), so they need no alias.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from nemo_gym.config.directives import deep_merge
from nemo_gym.config.values import is_mapping

__all__ = ["RESOURCES_SERVER_ID_SUFFIX", "other_spelling", "resources_server_alias", "fold_alias_fragments"]

RESOURCES_SERVER_ID_SUFFIX = "_resources_server"
_RESOURCES_SERVERS = "resources_servers"
_ENTRYPOINT = "entrypoint"


def other_spelling(server_id: str) -> str:
    """`mcqa` <-> `mcqa_resources_server`."""
    if server_id.endswith(RESOURCES_SERVER_ID_SUFFIX) and server_id != RESOURCES_SERVER_ID_SUFFIX:
        return server_id[: -len(RESOURCES_SERVER_ID_SUFFIX)]
    return server_id + RESOURCES_SERVER_ID_SUFFIX


def _implementation(block: Any) -> Optional[Mapping]:
    """The implementation dict of a resources-server-shaped block, else None."""
    if not is_mapping(block) or not is_mapping(block.get(_RESOURCES_SERVERS)):
        return None
    impls = block[_RESOURCES_SERVERS]
    if len(impls) != 1:
        return None
    impl = next(iter(impls.values()))
    return impl if is_mapping(impl) else None


def resources_server_alias(config: Mapping, server_id: Any) -> Optional[str]:
    """The id of the resources-server block that `server_id` stands for when `config` has no block `server_id`
    (its other spelling), else None."""
    if not isinstance(server_id, str) or server_id in config:
        return None
    other = other_spelling(server_id)
    return other if _implementation(config.get(other)) is not None else None


def fold_alias_fragments(data: dict) -> None:
    """Merge every fragment block (no `entrypoint`, so not a server of its own) whose id is the other spelling of a
    resources server into that server's block, in place; the fragment's keys win."""
    for fragment_id in [k for k in data if isinstance(k, str)]:
        fragment = _implementation(data[fragment_id])
        if fragment is None or _ENTRYPOINT in fragment:
            continue
        target_id = other_spelling(fragment_id)
        target = _implementation(data.get(target_id))
        if target is None or _ENTRYPOINT not in target:
            continue
        data[target_id] = deep_merge(data[target_id], data.pop(fragment_id))

