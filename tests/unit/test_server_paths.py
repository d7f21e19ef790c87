"""The confinement rule of config/server_paths.py: a server's folder lies under `<root>/<server type>/`, its
entrypoint inside that folder; `..`, absolute paths and links that leave them are refused with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nemo_gym import PARENT_DIR
from nemo_gym.config.server_paths import (
    OutsideServerRootsError,
    find_server_dir,
    locate_server,
    server_folder_of,
)
from nemo_gym.config.types import SERVER_TYPES, ServerInstanceSpec
from nemo_gym.errors import NeMoGymConfigError

RS = "resources_servers"


def make_server(root: Path, impl: str = "my_env", app: str = "app.py") -> Path:
    folder = root / RS / impl
    folder.mkdir(parents=True)
    (folder / "requirements.txt").write_text("")
    (folder / app).write_text("print('hi')\n")
    return folder


def spec(impl: str, entrypoint: str, server_id: str = "srv") -> ServerInstanceSpec:
    return ServerInstanceSpec(server_id, RS, impl, OmegaConf.create({"entrypoint": entrypoint}))


def test_a_plain_server_is_located(tmp_path):
    folder = make_server(tmp_path)
    location = locate_server(spec("my_env", "app.py"), tmp_path)
    assert location.server_dir == folder and location.entrypoint == "app.py"


def test_nested_names_and_entrypoints_inside_are_fine(tmp_path):
    folder = make_server(tmp_path, "group/my_env", app="app.py")
    (folder / "sub").mkdir()
    (folder / "sub" / "main.py").write_text("")
    assert locate_server(spec("group/my_env", "sub/main.py"), tmp_path).server_dir == folder


def test_the_install_root_is_a_root(tmp_path):
    location = locate_server(spec("example_single_tool_call", "app.py"), tmp_path)
    assert location.server_dir == PARENT_DIR / RS / "example_single_tool_call"


@pytest.mark.parametrize("entrypoint", ["../../../outside/x.py", "../other/app.py", "sub/../../other/app.py"])
def test_entrypoint_with_dotdot_is_refused(tmp_path, entrypoint):
    make_server(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.py").write_text("")
    make_server(tmp_path, "other")
    with pytest.raises(OutsideServerRootsError) as err:
        locate_server(spec("my_env", entrypoint), tmp_path)
    message = str(err.value)
    assert "srv.resources_servers.my_env.entrypoint" in message and entrypoint in message
    assert "climbs out with `..`" in message and str(tmp_path / RS / "my_env") in message


def test_absolute_entrypoint_is_refused_even_inside_the_folder(tmp_path):
    folder = make_server(tmp_path)
    with pytest.raises(OutsideServerRootsError, match="is an absolute path"):
        locate_server(spec("my_env", str(folder / "app.py")), tmp_path)


def test_entrypoint_linking_outside_is_refused(tmp_path):
    folder = make_server(tmp_path)
    outside = tmp_path / "evil.py"
    outside.write_text("")
    (folder / "link.py").symlink_to(outside)
    with pytest.raises(OutsideServerRootsError) as err:
        locate_server(spec("my_env", "link.py"), tmp_path)
    assert f"is a link to {outside}" in str(err.value)


def test_entrypoint_linking_inside_is_fine(tmp_path):
    folder = make_server(tmp_path)
    (folder / "alias.py").symlink_to(folder / "app.py")
    assert locate_server(spec("my_env", "alias.py"), tmp_path).entrypoint == "alias.py"


@pytest.mark.parametrize("entrypoint", ["", "-c", "."])
def test_entrypoint_that_is_no_file_is_refused(tmp_path, entrypoint):
    make_server(tmp_path)
    (tmp_path / RS / "my_env" / "-c").write_text("")
    with pytest.raises(NeMoGymConfigError, match="srv"):
        locate_server(spec("my_env", entrypoint), tmp_path)


def test_missing_entrypoint_is_not_an_escape(tmp_path):
    make_server(tmp_path)
    with pytest.raises(NeMoGymConfigError, match="entrypoint 'nope.py' not found") as err:
        locate_server(spec("my_env", "nope.py"), tmp_path)
    assert not isinstance(err.value, OutsideServerRootsError)


@pytest.mark.parametrize("impl", ["../../dir", "..", "../" + RS + "/my_env"])
def test_implementation_name_with_dotdot_is_refused(tmp_path, impl):
    make_server(tmp_path)
    (tmp_path.parent / "dir").mkdir(exist_ok=True)
    with pytest.raises(OutsideServerRootsError) as err:
        find_server_dir("srv", RS, impl, tmp_path)
    message = str(err.value)
    assert f"implementation name {impl!r} under `srv.{RS}`" in message and "`..`" in message


def test_absolute_implementation_folder_is_refused(tmp_path):
    folder = make_server(tmp_path)
    with pytest.raises(OutsideServerRootsError, match="is an absolute path"):
        find_server_dir("srv", RS, str(folder), tmp_path)


def test_implementation_folder_linking_outside_is_refused(tmp_path):
    elsewhere = make_server(tmp_path / "elsewhere", "real")
    (tmp_path / "cwd" / RS).mkdir(parents=True)
    (tmp_path / "cwd" / RS / "linked").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(OutsideServerRootsError) as err:
        find_server_dir("srv", RS, "linked", tmp_path / "cwd")
    assert f"is a link to {elsewhere}" in str(err.value)


def test_a_linked_server_type_folder_is_a_root(tmp_path):
    make_server(tmp_path / "elsewhere")
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / RS).symlink_to(tmp_path / "elsewhere" / RS, target_is_directory=True)
    assert locate_server(spec("my_env", "app.py"), tmp_path / "cwd").entrypoint == "app.py"


def test_missing_implementation_keeps_its_did_you_mean(tmp_path):
    make_server(tmp_path)
    with pytest.raises(NeMoGymConfigError, match="no folder for implementation 'my_en'.*Did you mean `my_env`"):
        find_server_dir("srv", RS, "my_en", tmp_path)


# ------------------------------------------------------------------------------------- ng_test's folder argument


def test_server_folder_of_accepts_folders_under_the_roots(tmp_path):
    folder = make_server(tmp_path)
    assert server_folder_of(f"{RS}/my_env", tmp_path, SERVER_TYPES) == folder
    assert server_folder_of(str(folder), tmp_path, SERVER_TYPES) == folder
    assert server_folder_of(f"{RS}/missing", tmp_path, SERVER_TYPES) is None


def test_server_folder_of_refuses_dotdot_and_outside_folders(tmp_path):
    make_server(tmp_path / "cwd")
    outside = make_server(tmp_path / "outside")
    with pytest.raises(OutsideServerRootsError, match="`..`"):
        server_folder_of(f"../outside/{RS}/my_env", tmp_path / "cwd", SERVER_TYPES)
    with pytest.raises(OutsideServerRootsError, match="outside the server roots"):
        server_folder_of(str(outside), tmp_path / "cwd", SERVER_TYPES)
