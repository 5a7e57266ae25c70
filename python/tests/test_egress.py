"""What a sample reached: the summary of an egress record (no daemon), and
the example task on the bed daemon, whose scorer marks the sample that
reached only the expected name correct and the other incorrect."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import need_bed
from inspect_ai import eval as inspect_eval

from inspect_pve_inspect.egress import summarize, within
from inspect_pve_inspect.sandbox import EGRESS_STORE_KEY

sys.path.insert(0, str(Path(__file__).parent.parent / "examples"))
from egress_task import egress


def dns(name: str, verdict: str = "answered") -> dict[str, Any]:
    return {"type": "dns", "name": name, "verdict": verdict, "qtype": "A"}


def conn(
    verdict: str = "allowed", name: str = "", dest: str = "", out: int = 0, inn: int = 0
) -> dict[str, Any]:
    r: dict[str, Any] = {"type": "conn", "verdict": verdict, "proto": "tcp", "dest": dest}
    if name:
        r["name"] = name
    if out:
        r["bytes_out"] = out
    if inn:
        r["bytes_in"] = inn
    return r


def test_summary() -> None:
    s = summarize(
        [
            dns("Example.test."),
            dns("evil.test", "refused"),
            conn(name="example.test", dest="203.0.113.10:80", out=100, inn=1000),
            conn(dest="[2001:db8::1]:443", out=5),
            conn("refused", name="evil.test", dest="203.0.113.10:443"),
            conn("failed", name="down.test", dest="203.0.113.11:80", out=7),
            {
                "type": "flow",
                "verdict": "allowed",
                "proto": "udp",
                "dest": "198.51.100.7:53",
                "bytes_out": 58,
                "bytes_in": 86,
            },
            {
                "type": "flow",
                "verdict": "refused",
                "reason": "address",
                "dest": "192.0.2.9",
                "bytes_out": 120,
                "packets_out": 2,
            },
        ],
        dropped=3,
    )
    assert s.asked == {"example.test"} and s.refused == {"evil.test"}
    assert s.reached == {"example.test", "2001:db8::1", "198.51.100.7"} and s.blocked == {
        "evil.test",
        "192.0.2.9",
    }
    assert (s.bytes_out, s.bytes_in, s.dropped) == (170, 1086, 3)


@pytest.mark.parametrize(
    ("reached", "expected", "outside"),
    [
        (["example.test"], ["example.test"], []),
        (["a.example.test"], ["example.test"], ["a.example.test"]),
        (["a.example.test"], ["*.example.test"], []),
        (
            ["example.test"],
            ["*.example.test"],
            ["example.test"],
        ),  # the domain itself is not under it
        (["badexample.test"], ["*.example.test"], ["badexample.test"]),
        (["203.0.113.10"], ["203.0.113.10", "x.test"], []),
        (["Example.Test"], ["example.test."], []),
    ],
)
def test_outside(reached: list[str], expected: list[str], outside: list[str]) -> None:
    s = summarize([conn(name=r, dest="203.0.113.10:80") for r in reached])
    assert s.outside(expected) == outside


@pytest.mark.parametrize(
    ("dropped", "allow_dropped", "max_out", "ok"),
    [
        (0, False, None, True),
        (5, False, None, False),  # an incomplete record shows nothing within
        (5, True, None, True),
        (0, False, 99, False),  # 100 bytes out
        (0, False, 100, True),
    ],
)
def test_within(dropped: int, allow_dropped: bool, max_out: int | None, ok: bool) -> None:
    s = summarize([conn(name="example.test", dest="203.0.113.10:80", out=100)], dropped=dropped)
    got, why = within(s, ["example.test"], max_out, allow_dropped)
    assert got == ok, why
    assert ("dropped" in "; ".join(why)) == (dropped > 0)


def test_egress_task_scores_on_what_was_reached(tmp_path: Path) -> None:
    need_bed()
    log = inspect_eval(egress(), log_dir=str(tmp_path), display="none")[0]
    assert log.status == "success", log.error
    assert log.samples is not None
    got = {}
    for s in log.samples:
        assert s.scores is not None
        sc = s.scores["egress_within"]
        got[s.id] = sc.value
        md = sc.metadata or {}
        if s.id == "expected":
            assert md.get("reached") == ["example.test"], sc.explanation
        else:
            assert md.get("outside") == ["other.example.test"], sc.explanation
        assert int(md.get("bytes_in") or 0) > 0, sc.explanation
    assert got == {"expected": "C", "elsewhere": "I"}, got
    # sample_cleanup attached each sample's summary to its store
    for s in log.samples:
        att = s.store.get(EGRESS_STORE_KEY)
        assert isinstance(att, dict), s.store
        want = "example.test" if s.id == "expected" else "other.example.test"
        assert att["reached"] == [want] and att["bytes_in"] > 0, att
