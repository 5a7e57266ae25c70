"""What sample_cleanup attaches of a sample's egress record (a fake daemon,
tests/fakenode.py): the record the delete itself hands over
(``DELETE ...?egress_log=true``), so what the guests did between the
scorer's read and the delete is in it; a node that cannot hand it over gets
the record read before a plain delete; a sandbox already gone, or an
interrupted sample, attaches nothing."""

from __future__ import annotations

from typing import Any

import pytest
from fakenode import FakeNode
from inspect_ai.event import InfoEvent
from inspect_ai.log import Transcript
from inspect_ai.log._transcript import init_transcript
from inspect_ai.util import Store
from inspect_ai.util._store import init_subtask_store

from inspect_pve_inspect import (
    NodeConfig,
    PveInspectSandboxEnvironment,
    PveInspectSandboxEnvironmentConfig,
)
from inspect_pve_inspect.sandbox import EGRESS_STORE_KEY, _Run

pytestmark = pytest.mark.anyio


def _rec(seq: int, typ: str, name: str, **kw: Any) -> dict[str, Any]:
    verdict = "answered" if typ == "dns" else "allowed"
    return {"seq": seq, "type": typ, "name": name, "verdict": verdict, "vm": "vm0", **kw}


BEFORE = [
    _rec(1, "dns", "pypi.org", qtype="A"),
    _rec(2, "conn", "pypi.org", dest="203.0.113.5:443", bytes_out=100, bytes_in=900),
]
# What the guest did after the scorer's read, until its VM was gone.
AT_DELETE = [_rec(3, "conn", "exfil.example", dest="198.51.100.7:443", bytes_out=5000)]


@pytest.mark.parametrize(
    ("case", "want"),
    [
        # the delete hands the whole record over: the late connection in it
        (
            "handed over",
            {"reached": ["exfil.example", "pypi.org"], "bytes_out": 5100, "records": 3},
        ),
        # a node that keeps none to hand over: read, then a plain delete
        ("node hands none over", {"reached": ["pypi.org"], "bytes_out": 100, "records": 2}),
        # reaped before the cleanup: its record went with it
        ("already gone", None),
        ("interrupted", None),
    ],
)
async def test_sample_cleanup_attaches_the_record_the_delete_hands_over(
    fake_node: tuple[FakeNode, NodeConfig], case: str, want: dict[str, Any] | None
) -> None:
    fake, node = fake_node
    cfg = PveInspectSandboxEnvironmentConfig(nodes=(node,))
    envs = await PveInspectSandboxEnvironment.sample_init("t", cfg, {})
    env = next(iter(envs.values())).as_type(PveInspectSandboxEnvironment)
    sid = env.sandbox_id
    with fake.lock:
        fake.egress[sid] = list(BEFORE)
        fake.egress_dropped = 2
        fake.made_at_delete = list(AT_DELETE)
        fake.handover = case != "node hands none over"
        if case == "already gone":
            del fake.sandboxes[sid]
    store, tr = Store(), Transcript()
    init_subtask_store(store)
    init_transcript(tr)

    await PveInspectSandboxEnvironment.sample_cleanup("t", cfg, envs, case == "interrupted")

    with fake.lock:
        calls = [c for c in fake.calls if c.startswith(f"DELETE /v1/sandboxes/{sid}")]
        read = any(c.startswith(f"GET /v1/sandboxes/{sid}/egress/log") for c in fake.calls)
        assert sid not in fake.sandboxes, case
    assert sid not in _Run.live
    plain, keeping = f"DELETE /v1/sandboxes/{sid}", f"DELETE /v1/sandboxes/{sid}?egress_log=true"
    assert (
        calls
        == {
            "handed over": [keeping],
            "node hands none over": [keeping, plain],
            "already gone": [keeping],
            "interrupted": [plain],
        }[case]
    )
    assert read == (case == "node hands none over")
    att = store.get(EGRESS_STORE_KEY)
    info = [e for e in tr.events if isinstance(e, InfoEvent) and e.source == "pve_inspect"]
    if want is None:
        assert att is None and not info, att
        return
    assert isinstance(att, dict), att
    assert att["sandbox"] == sid and att["dropped"] == 2, att
    assert {k: att[k] for k in want} == want, att
    assert len(info) == 1 and str(want["reached"]) in str(info[0].data), info
