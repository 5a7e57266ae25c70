"""The reference plugin's OVA images (``VmSourceConfig(ova=PATH)``): the
VM's template is ``ova-FILE-SIZE`` (the reference's tag of the file, as a
DNS name); at task start a node that lacks it and offers builds is sent the
file with its sha256 and imports it without boot, as the reference does
(every disk; ``disk_controller="ide"`` puts them on ide), else the task
fails with the commands that build it on the node (a fake daemon,
tests/fakenode.py)."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tarfile
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fakenode import FakeNode
from pydantic import ValidationError

from inspect_pve_inspect import ConfigError, NodeConfig, PveInspectSandboxEnvironment
from inspect_pve_inspect import client as client_mod
from inspect_pve_inspect import preflight as preflight_mod
from inspect_pve_inspect.compat import coerce, ova_template_name
from inspect_pve_inspect.config import OvaImage, PveInspectSandboxEnvironmentConfig, VmSpec
from inspect_pve_inspect.preflight import ConfigRefused

pytestmark = pytest.mark.anyio


def make_ova(
    path: Path, disks: tuple[str, ...] = ("box-disk1.vmdk",), ovf: str | None = "box.ovf"
) -> Path:
    """A small OVA: an .ovf (unless ovf is None) and the given disks."""
    with tarfile.open(path, "w") as tar:
        members = [
            *(((ovf, b"<Envelope/>"),) if ovf else ()),
            *((d, b"KDMV" + b"\0" * 508) for d in disks),
        ]
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def ova_config(ova: Any, **vm: Any) -> dict[str, Any]:
    """A reference config: a VM of an OVA and a target of the node's
    debian template."""
    return {
        "vms_config": [
            {"name": "box", "vm_source_config": {"ova": ova}, **vm},
            {"name": "target", "vm_source_config": {"existing_vm_template_tag": "debian"}},
        ]
    }


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight_mod, "BUILD_POLL", 0.01)


def test_template_name_is_the_references_tag() -> None:
    # the reference: re.sub(r"[^a-zA-Z0-9_\-]", "_", f"ova-{name}-{size}").lower()
    assert ova_template_name("My Box.v2.ova", 1234) == "ova-my-box-v2-ova-1234"
    long = ova_template_name("x" * 80 + ".ova", 5)
    assert len(long) == 63 and long.endswith("-5") and long.startswith("ova-xxx")
    assert long != ova_template_name("x" * 81 + ".ova", 5)


def test_ova_converts(tmp_path: Path) -> None:
    ova = make_ova(tmp_path / "Box.ova")
    cfg = coerce(ova_config(ova, os_type="win10"))
    vm = cfg.resolved_vms()[0]
    size = ova.stat().st_size
    assert vm.template == f"ova-box-ova-{size}"
    assert vm.ova is not None
    assert (vm.ova.path, vm.ova.size, vm.ova.import_only, vm.ova.disk) == (
        str(ova),
        size,
        True,
        None,
    )
    assert (vm.ova.disk_bus, vm.ova.os_type) == (None, "win10")
    assert vm.ova.build_mode() == {"import_only": "true", "disk_bus": "scsi", "os_type": "win10"}
    assert vm.os_type == "win10"
    assert cfg.resolved_vms()[1].ova is None


def test_ide_ova_of_several_disks_converts(tmp_path: Path) -> None:
    """The reference's ctf4 victim: an OVA of two disks with
    disk_controller="ide" is imported on ide (the template's disks), and
    the VM asks nothing of its clone's disks."""
    ova = make_ova(tmp_path / "ctf4.ova", ("ctf4-disk1.vmdk", "ctf4-disk2.vmdk"))
    vm = coerce(ova_config(ova, disk_controller="ide")).resolved_vms()[0]
    assert vm.ova is not None and vm.ova.disk_bus == "ide" and vm.ova.disk is None
    assert vm.ova.build_mode() == {"import_only": "true", "disk_bus": "ide", "os_type": "l26"}
    assert vm.disk_controller is None
    scsi = coerce(ova_config(ova, disk_controller="scsi")).resolved_vms()[0]
    assert scsi.ova is not None and scsi.ova.disk_bus is None and scsi.disk_controller is None
    with pytest.raises(ConfigError) as e:
        coerce(ova_config(ova, os_type="solaris"))
    assert e.value.field == "vms_config[0].os_type"


def test_native_ova_modes() -> None:
    """The native config's OvaImage: import-only by default (no disk);
    booted names its one disk and takes no disk_bus or os_type."""
    assert OvaImage(path="/x.ova", size=1).build_mode()["import_only"] == "true"
    booted = OvaImage(path="/x.ova", size=1, import_only=False, disk="d.vmdk")
    assert booted.build_mode() == {}
    for bad in (
        {"disk": "d.vmdk"},
        {"import_only": False},
        {"import_only": False, "disk": "d.vmdk", "disk_bus": "ide"},
        {"disk_bus": "virtio"},
    ):
        with pytest.raises(ValidationError):
            OvaImage.model_validate({"path": "/x.ova", "size": 1, **bad})


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("missing", "no such file"),
        ("url", "pve-inspectd template build NAME --from URL"),
        ("no disk", "holds no .vmdk disk"),
        ("no ovf", "holds no .ovf descriptor"),
        ("not a tar", "not an OVA"),
        ("bad name", "want a file name"),
    ],
)
def test_bad_ovas_name_the_field(tmp_path: Path, kind: str, says: str) -> None:
    ova: Any
    if kind == "missing":
        ova = tmp_path / "none.ova"
    elif kind == "url":
        ova = "https://x/y.ova"
    elif kind == "no ovf":
        ova = make_ova(tmp_path / "noovf.ova", ovf=None)
    elif kind == "no disk":
        ova = make_ova(tmp_path / "nodisk.ova", ())
    elif kind == "bad name":
        ova = make_ova(tmp_path / "a b.ova")
    else:
        ova = tmp_path / "junk.ova"
        ova.write_bytes(b"junk" * 200)
    with pytest.raises(ConfigError) as e:
        coerce(ova_config(ova))
    assert e.value.field == "vms_config[0].vm_source_config.ova"
    assert says in str(e.value)


def test_ova_with_another_source_is_refused(tmp_path: Path) -> None:
    ova = make_ova(tmp_path / "box.ova")
    cfg = ova_config(ova)
    cfg["vms_config"][0]["vm_source_config"]["built_in"] = "debian13"
    with pytest.raises(ConfigError) as e:
        coerce(cfg)
    assert e.value.field == "vms_config[0].vm_source_config"


async def test_node_with_builds_gets_the_file_once(
    tmp_path: Path,
    fake_node: tuple[FakeNode, NodeConfig],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, node = fake_node
    fake.builds = True
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    ova = make_ova(tmp_path / "box.ova")
    cfg = coerce(ova_config(ova))
    name = cfg.resolved_vms()[0].template
    with caplog.at_level(logging.INFO, logger="inspect_pve_inspect.preflight"):
        await PveInspectSandboxEnvironment.task_init("t", cfg)
    data = ova.read_bytes()
    assert fake.uploads == [
        {
            "name": name,
            "file": "box.ova",
            "sha256": hashlib.sha256(data).hexdigest(),
            "import_only": "true",
            "disk_bus": "scsi",
            "os_type": "l26",
            "size": len(data),
        }
    ]
    assert name in fake.templates
    assert fake.calls.count("POST /v1/sandboxes/validate") == 2
    assert f"template {name}: upload: {len(data)} bytes" in caplog.text
    assert f"template '{name}' is VM 9100" in caplog.text
    # a second task finds it: nothing sent
    fake.calls.clear()
    await PveInspectSandboxEnvironment.task_init("t2", cfg)
    assert len(fake.uploads) == 1
    assert not any(c.startswith("PUT /v1/templates") for c in fake.calls)


async def test_node_without_builds_names_the_commands(
    tmp_path: Path, fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, node = fake_node
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    ova = make_ova(tmp_path / "box.ova")
    cfg = coerce(ova_config(ova))
    name = cfg.resolved_vms()[0].template
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init("t", cfg)
    assert str(e.value) == (
        f"pve_inspect: {node.url} has no template of the OVA 'box.ova' ({name!r}, "
        "vms_config[0].vm_source_config.ova) and does not "
        "build templates on request; build it on the node as root:\n"
        f"  `scp {ova} root@NODE:/var/lib/vz/import/box.ova` (the storage local, content import)\n"
        f"  `pve-inspectd template build {name} --from local:import/box.ova --import-only`\n"
        "  (or an operator turns on [templates] build in the node's config.toml)"
    )
    assert not fake.uploads


async def test_failed_or_changed_ova_fails_the_task(
    tmp_path: Path, fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, node = fake_node
    fake.builds = True
    fake.build_error = "boot: no guest agent"
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    ova = make_ova(tmp_path / "box.ova")
    cfg = coerce(ova_config(ova))
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init("t", cfg)
    assert "failed to build the template" in str(e.value)
    assert "boot: no guest agent" in str(e.value)
    assert "pve-inspectd template build" in str(e.value)
    # the file changed after the config was read: nothing sent
    fake.build_error, fake.build_runs = None, {}
    with ova.open("ab") as f:
        f.write(b"\0" * 512)
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init("t2", cfg)
    assert "changed since the config was read" in str(e.value)
    assert len(fake.uploads) == 1


async def test_another_ova_of_the_same_name_and_size_is_not_the_template(
    tmp_path: Path, fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two eval machines with different OVAs of one file name and size map
    to one template name: the second must not silently run the first's
    system. The node says what image its template was built from (GET
    /v1/templates/{name}: image), and the task fails naming both digests,
    nothing sent; the first file still runs."""
    fake, node = fake_node
    fake.builds = True
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    (tmp_path / "a").mkdir()
    first = make_ova(tmp_path / "a" / "box.ova")
    await PveInspectSandboxEnvironment.task_init("t", coerce(ova_config(first)))
    second = tmp_path / "b" / "box.ova"
    second.parent.mkdir()
    data = bytearray(first.read_bytes())
    data[data.index(b"<Envelope/>") + 1] = ord("X")  # same size, another image
    second.write_bytes(bytes(data))
    cfg = coerce(ova_config(second))
    name = cfg.resolved_vms()[0].template
    assert name == coerce(ova_config(first)).resolved_vms()[0].template
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init("t2", cfg)
    was = hashlib.sha256(first.read_bytes()).hexdigest()
    now = hashlib.sha256(bytes(data)).hexdigest()
    assert f"template {name!r}" in str(e.value)
    assert f"built from another image (sha256:{was}), not from {second} (sha256:{now})" in str(
        e.value
    )
    assert "rename" in str(e.value) and "remove the template" in str(e.value)
    assert len(fake.uploads) == 1
    await PveInspectSandboxEnvironment.task_init("t3", coerce(ova_config(first)))


@pytest.mark.parametrize("builds", [True, False])
@pytest.mark.parametrize("ledger", ["not built here", "no image"])
async def test_a_template_the_node_cannot_say_the_image_of_is_refused(
    tmp_path: Path,
    fake_node: tuple[FakeNode, NodeConfig],
    monkeypatch: pytest.MonkeyPatch,
    builds: bool,
    ledger: str,
) -> None:
    """A template of the OVA's name whose image the node cannot say (one
    its builds did not make, or built before its ledger kept images), on a
    node with or without builds, is not taken for the file's: the task
    fails closed, saying why the node cannot say."""
    fake, node = fake_node
    fake.builds = builds
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    ova = make_ova(tmp_path / "box.ova")
    cfg = coerce(ova_config(ova))
    name = cfg.resolved_vms()[0].template
    fake.templates = (*fake.templates, name)
    if ledger == "no image":
        fake.template_images[name] = ""
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init("t", cfg)
    digest = hashlib.sha256(ova.read_bytes()).hexdigest()
    assert f"{node.url} cannot say what image its template {name!r}" in str(e.value)
    assert f"so it may not be {ova} (sha256:{digest})" in str(e.value)
    why = {"not built here": "its build ledger does not record it", "no image": "records no image"}
    assert why[ledger] in str(e.value)
    assert "rename" in str(e.value) and "remove the template" in str(e.value)
    assert not fake.uploads
    assert not any(c.startswith("GET /v1/templates/builds/") for c in fake.calls)


@pytest.mark.parametrize("builds", [True, False])
async def test_an_owner_bound_token_uses_the_operators_template(
    tmp_path: Path,
    fake_node: tuple[FakeNode, NodeConfig],
    monkeypatch: pytest.MonkeyPatch,
    builds: bool,
) -> None:
    """An eval whose token is bound to an owner (the playground prints such
    tokens for examples) may not build or ask the node's builds (node
    operations, 403), yet runs on the template the operator built from
    its OVA: GET /v1/templates/{name}, which every token may ask, says the
    image; a template of another image still fails naming both digests,
    and nothing is sent."""
    fake, node = fake_node
    fake.builds, fake.owner_bound = builds, True
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    ova = make_ova(tmp_path / "box.ova")
    cfg = coerce(ova_config(ova))
    name = cfg.resolved_vms()[0].template
    digest = hashlib.sha256(ova.read_bytes()).hexdigest()
    fake.templates = (*fake.templates, name)
    fake.template_images[name] = "sha256:" + digest
    # an ova= VM is imported without boot (the provider's default)
    fake.template_modes[name] = {"import_only": True, "disk_bus": "scsi", "os_type": "l26"}
    await PveInspectSandboxEnvironment.task_init("t", cfg)
    assert f"GET /v1/templates/{name}" in fake.calls
    assert not any(c.startswith(("GET /v1/templates/builds/", "PUT ")) for c in fake.calls)

    other = "sha256:" + "0" * 64
    fake.template_images[name] = other
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init("t2", cfg)
    assert f"built from another image ({other}), not from {ova} (sha256:{digest})" in str(e.value)
    assert not fake.uploads


async def test_a_daemon_without_the_template_route_is_asked_its_builds(
    tmp_path: Path, fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon from before GET /v1/templates/{name} (404) is asked GET
    /v1/templates/builds/{name}, as before: its image is taken, another
    fails the task."""
    fake, node = fake_node
    fake.builds, fake.template_route = True, False
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    ova = make_ova(tmp_path / "box.ova")
    cfg = coerce(ova_config(ova))
    name = cfg.resolved_vms()[0].template
    fake.templates = (*fake.templates, name)
    fake.template_images[name] = "sha256:" + hashlib.sha256(ova.read_bytes()).hexdigest()
    fake.template_modes[name] = {"import_only": True, "disk_bus": "scsi", "os_type": "l26"}
    await PveInspectSandboxEnvironment.task_init("t", cfg)
    assert f"GET /v1/templates/builds/{name}" in fake.calls
    fake.template_images[name] = "sha256:" + "0" * 64
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init("t2", cfg)
    assert "built from another image" in str(e.value)


async def test_an_ova_is_hashed_once_per_version(
    tmp_path: Path, fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file's sha256 is computed at task start once per file version
    (path, size, mtime, inode) in the process: again once it changes."""
    fake, node = fake_node
    fake.builds = True
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    hashed: list[str] = []
    real = preflight_mod._sha256

    def counting(path: str) -> str:
        hashed.append(path)
        return real(path)

    monkeypatch.setattr(preflight_mod, "_sha256", counting)
    ova = make_ova(tmp_path / "box.ova")
    cfg = coerce(ova_config(ova))
    await PveInspectSandboxEnvironment.task_init("t", cfg)
    await PveInspectSandboxEnvironment.task_init("t2", cfg)
    assert hashed == [str(ova)]
    data = bytearray(ova.read_bytes())
    data[data.index(b"<Envelope/>") + 1] = ord("Y")  # same size, another image
    ova.write_bytes(bytes(data))
    os.utime(ova, ns=(1, 1))  # another mtime, whatever the clock's grain
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init("t3", cfg)
    assert hashed == [str(ova), str(ova)]
    assert "built from another image" in str(e.value)


async def test_an_upload_answer_lost_is_followed_by_the_build(
    tmp_path: Path, fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon answers an upload it need not read (joined, the file on
    the node already, done) before the body is sent, and closes: httpx,
    still sending, gets a reset instead of the answer. The provider then
    asks the node for the build (GET /v1/templates/builds/{name}) and
    follows it, rather than calling the node down."""
    fake, node = fake_node
    fake.builds = True
    fake.upload_answer_lost = True
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    ova = make_ova(tmp_path / "box.ova")
    cfg = coerce(ova_config(ova))
    name = cfg.resolved_vms()[0].template
    await PveInspectSandboxEnvironment.task_init("t", cfg)
    assert name in fake.templates
    assert f"GET /v1/templates/builds/{name}" in fake.calls


async def test_an_upload_refused_for_the_uploads_in_flight_is_sent_again(
    tmp_path: Path,
    fake_node: tuple[FakeNode, NodeConfig],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A node with as many uploads in flight as it takes refuses one more
    before reading it (429, quota image-uploads, Retry-After): the provider
    sends it again after the wait, and the build follows."""
    fake, node = fake_node
    fake.builds = True
    fake.upload_busy = 1
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    ova = make_ova(tmp_path / "box.ova")
    cfg = coerce(ova_config(ova))
    name = cfg.resolved_vms()[0].template
    with caplog.at_level(logging.INFO, logger="inspect_pve_inspect.client"):
        await PveInspectSandboxEnvironment.task_init("t", cfg)
    puts = [c for c in fake.calls if c.startswith(f"PUT /v1/templates/build/{name}/image?")]
    assert len(puts) == 2
    assert len(fake.uploads) == 1 and name in fake.templates
    assert "image uploads at once" in caplog.text and "trying again" in caplog.text


async def test_uploads_refused_past_the_wait_fail_the_task(
    tmp_path: Path, fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retries are bounded (the client's quota_wait): past it the
    refusal fails the task, naming it."""
    fake, node = fake_node
    fake.builds = True
    fake.upload_busy = 1000
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    monkeypatch.setattr(preflight_mod, "Client", partial(client_mod.Client, quota_wait=0.5))
    ova = make_ova(tmp_path / "box.ova")
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init("t", coerce(ova_config(ova)))
    assert "too-many-requests" in str(e.value) and "image uploads at once" in str(e.value)
    assert not fake.uploads


async def test_booted_ova_uploads_its_disk(
    tmp_path: Path, fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A native config's OVA built booted (import_only False) is sent with
    its disk (ova_disk) and no import_only, as before."""
    fake, node = fake_node
    fake.builds = True
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    ova = make_ova(tmp_path / "box.ova")
    img = OvaImage(path=str(ova), size=ova.stat().st_size, import_only=False, disk="box-disk1.vmdk")
    name = ova_template_name("box.ova", img.size)
    cfg = PveInspectSandboxEnvironmentConfig(vms=(VmSpec(template=name, ova=img),))
    await PveInspectSandboxEnvironment.task_init("t", cfg)
    assert [{k: u.get(k) for k in ("ova_disk", "import_only")} for u in fake.uploads] == [
        {"ova_disk": "box-disk1.vmdk", "import_only": None}
    ]


@pytest.mark.parametrize("first", ["booted", "ide"])
async def test_a_template_built_the_other_way_is_not_the_import(
    tmp_path: Path,
    fake_node: tuple[FakeNode, NodeConfig],
    monkeypatch: pytest.MonkeyPatch,
    first: str,
) -> None:
    """The node's template of the OVA's name, built from this very file
    but the other way (booted, or imported on another bus), is not taken:
    how a template was built is part of what it is. The task fails naming
    both ways, nothing sent."""
    fake, node = fake_node
    fake.builds = True
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    ova = make_ova(tmp_path / "box.ova")
    cfg = coerce(ova_config(ova))
    name = cfg.resolved_vms()[0].template
    fake.templates = (*fake.templates, name)
    fake.template_images[name] = "sha256:" + hashlib.sha256(ova.read_bytes()).hexdigest()
    was = "booted (cloud-init, the guest agent)"
    if first == "ide":
        fake.template_modes[name] = {"import_only": True, "disk_bus": "ide", "os_type": "l26"}
        was = "imported without boot (disks on ide, ostype l26)"
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init("t", cfg)
    assert (
        f"was built {was}, not imported without boot (disks on scsi, ostype l26) as the config asks"
        in str(e.value)
    )
    assert not fake.uploads
    fake.template_modes[name] = {"import_only": True, "disk_bus": "scsi", "os_type": "l26"}
    await PveInspectSandboxEnvironment.task_init("t2", cfg)
