"""What a config file may point at: a file to read only inside its own config folder, a
listener only on loopback. The command line and the library call (the operator's own choice)
may name any file and any address."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_hostile_configs import SECRET, attempt, refused

import pipeline
from pipeline.config.links import links_of
from pipeline.core.checks import ConfigError

SECRET_LINKS = f"machine: x\nh2d_gbps: hunter2\nd2h_gbps: {SECRET}\n"
MEASURED = "defaults: [base_runtime]\nlinks: links/measured.yaml\n"


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """As test_hostile_configs' own: a victim file, a marker, a config folder, a secret."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    monkeypatch.setenv("SECRET", SECRET)
    monkeypatch.chdir(tmp_path)
    return {"victim": victim, "marker": tmp_path / "marker", "dir": tmp_path / "conf"}


def option(world: dict[str, Path], group: str, name: str, text: str) -> list[str]:
    """An option file `group/name.yaml` in the user folder; the arguments that give it."""
    path = world["dir"] / group / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return ["--config-dir", str(world["dir"]), f"{group}={name}"]


def measured_links(folder: Path) -> Path:
    """A good links file at folder/links/measured.yaml."""
    path = folder / "links" / "measured.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = {k: v for k, v in links_of("cpu").__dict__.items() if k != "machine"}
    path.write_text("machine: mine\n" + "".join(f"{k}: {v}\n" for k, v in fields.items()))
    return path


@pytest.mark.parametrize(
    "value",
    ["{outside}", "../secret.yaml", "escape/secret.yaml", "{dir}/../secret.yaml"],
    ids=["absolute", "dotdot", "linked_folder", "absolute_dotdot"],
)
@pytest.mark.parametrize("command", ["validate", "explain"])
def test_a_config_file_reads_no_links_file_outside_its_folder(
    value: str, command: str, world, capsys, caplog
) -> None:
    """A config file's runtime.links named any YAML file and echoed its values in the error
    (`runtime.links.h2d_gbps='hunter2' is not a float`)."""
    outside = world["victim"].parent / "secret.yaml"
    outside.write_text(SECRET_LINKS)
    world["dir"].mkdir()
    (world["dir"] / "escape").symlink_to(outside.parent)
    text = "defaults: [base_runtime]\nlinks: " + value.format(outside=outside, dir=world["dir"])
    args = option(world, "runtime", "theirs", text + "\n")
    said = refused(command, args[:2] if command == "validate" else args, world, capsys, caplog)
    assert "hunter2" not in said
    assert "runtime.links" in said and "theirs.yaml" in said
    assert "inside its config folder" in said, said


def test_a_config_file_reads_a_links_file_inside_its_folder_and_names_presets(world) -> None:
    """A relative path in a config file is the folder's; a preset name stays a preset; the
    command line names any file."""
    measured = measured_links(world["dir"])
    args = option(world, "runtime", "mine", MEASURED)
    folder = args[1]
    job = pipeline.compose(["runtime=mine"], config_dir=folder)
    assert job.runtime.links == str(measured)
    option(world, "runtime", "preset", "defaults: [base_runtime]\nlinks: cpu\n")
    assert pipeline.compose(["runtime=preset"], config_dir=folder).runtime.links == "cpu"
    elsewhere = measured_links(world["victim"].parent)
    job = pipeline.compose([f"runtime.links={elsewhere}"], config_dir=folder)
    assert job.runtime.links == str(elsewhere)


def test_validate_takes_a_folder_whose_links_file_is_yaml(world, capsys, caplog) -> None:
    """The links file an option names is not refused as a stray YAML file of the folder."""
    measured_links(world["dir"])
    args = option(world, "runtime", "mine", MEASURED)
    code, out, err = attempt("validate", args[:2], capsys, caplog)
    assert code == 0, out + err


@pytest.mark.parametrize("value", ["/etc/machine-id", "../l3.key", "${{runtime.trace_file}}"])
def test_a_config_file_names_no_key_file_outside_its_folder(value: str, world, capsys, caplog):
    text = f"defaults: [base_storage]\nkind: file\nauth_key_file: {value}\n"
    args = option(world, "storage", "theirs", text.format())
    said = refused("explain", args, world, capsys, caplog)
    assert "storage.auth_key_file" in said and "theirs.yaml" in said
    assert "inside its config folder" in said, said


def test_a_config_file_may_name_a_key_file_inside_its_folder(world) -> None:
    key = world["dir"] / "keys" / "l3.key"
    key.parent.mkdir(parents=True)
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    text = "defaults: [base_storage]\nkind: file\nauth_key_file: keys/l3.key\n"
    args = option(world, "storage", "mine", text)
    job = pipeline.compose(["storage=mine"], config_dir=args[1])
    assert job.storage.auth_key_file == str(key)


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "10.1.2.3", "example.com"])
@pytest.mark.parametrize("command", ["validate", "explain"])
def test_a_config_file_opens_no_listener_beyond_loopback(
    address: str, command: str, world, capsys, caplog
) -> None:
    """`runtime.metrics_address: 0.0.0.0` in a config file made `run` listen on every
    address."""
    text = f"defaults: [base_runtime]\nmetrics_port: 9400\nmetrics_address: '{address}'\n"
    args = option(world, "runtime", "open", text)
    said = refused(command, args[:2] if command == "validate" else args, world, capsys, caplog)
    assert "runtime.metrics_address" in said and "open.yaml" in said
    assert "on the command line" in said, said


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_a_config_file_may_listen_on_loopback_and_the_operator_anywhere(address, world) -> None:
    text = f"defaults: [base_runtime]\nmetrics_port: 9400\nmetrics_address: '{address}'\n"
    args = option(world, "runtime", "local", text)
    job = pipeline.compose(["runtime=local"], config_dir=args[1])
    assert job.runtime.metrics_address == address
    job = pipeline.compose(["runtime=local", "runtime.metrics_address=0.0.0.0"], config_dir=args[1])
    assert job.runtime.metrics_address == "0.0.0.0"


@pytest.mark.parametrize("key", ["endpoint", "replay_endpoint"])
@pytest.mark.parametrize("host", ["0.0.0.0", "[::]", "10.1.2.3"])
def test_a_config_file_publishes_kv_events_on_loopback_only(key: str, host: str, world) -> None:
    """The events group's sockets are listeners too: a config file binds loopback only, the
    operator's command line anywhere."""
    text = f"defaults: [base_events]\nkind: zmq\n{key}: 'tcp://{host}:6001'\n"
    args = option(world, "events", "open", text)
    with pytest.raises(ConfigError, match=f"events.{key}.*loopback"):
        pipeline.compose(["events=open"], config_dir=args[1])
    (world["dir"] / "events" / "open.yaml").unlink()  # the folder is checked whole
    text = f"defaults: [base_events]\nkind: zmq\n{key}: 'tcp://127.0.0.1:6001'\n"
    args = option(world, "events", "local", text)
    assert pipeline.compose(["events=local"], config_dir=args[1]).events.kind.value == "zmq"
    override = f"events.{key}='tcp://{host}:6002'"  # quoted: Hydra reads [ as a list
    opened = pipeline.compose(["events=local", override], config_dir=args[1])
    assert f"{host}:6002" in (opened.events.endpoint + str(opened.events.replay_endpoint))


def test_validate_json_places_each_refusal_at_its_line(world, capsys, caplog) -> None:
    text = "defaults: [base_runtime]\nmetrics_address: 0.0.0.0\nlinks: /etc/hosts\n"
    args = option(world, "runtime", "open", text)
    code, out, _ = attempt("validate", [*args[:2], "--json"], capsys, caplog)
    errors = json.loads(out)["errors"]
    assert code == 1
    got = sorted((Path(e["file"]).name, e["line"], e["key"]) for e in errors)
    assert got == [
        ("open.yaml", 2, "runtime.metrics_address"),
        ("open.yaml", 3, "runtime.links"),
    ], errors
