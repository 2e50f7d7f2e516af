"""`entroloop eval pii FILE.jsonl [--json] [--predictions OUT]` on small files, bad lines, and the
hand-written corpus in tests/data/pii (its figures are what the README reports)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.entroloop.eval_files import run_eval, write_lines

CORPUS = Path(__file__).resolve().parents[2] / "data" / "pii"


def test_spans_give_recall_and_false_positives_as_the_last_json_line(tmp_path: Path) -> None:
    data = write_lines(tmp_path / "labelled.jsonl", [
        {"id": "a", "text": "我的手机号13900001111，邮箱是bob.jones@example.org谢谢", "source": "ignored",
         "spans": [{"kind": "mobile", "value": "13900001111", "pii": True},
                   {"kind": "email", "value": "bob.jones@example.org", "pii": True, "note": "ignored too"}]},
        "",
        {"id": 7, "text": "热线400-820-8820，订单号4111111111111111，版本1.2.3.4",
         "spans": [{"kind": "hotline", "value": "400-820-8820", "pii": False},
                   {"kind": "order_number", "value": "4111111111111111", "pii": False},
                   {"kind": "version", "value": "1.2.3.4", "pii": False}]},
        {"text": "张伟说他明天来", "spans": [{"kind": "name", "value": "张伟", "pii": True}]},
    ])
    out = tmp_path / "predictions.jsonl"
    result = run_eval("pii", str(data), "--json", "--predictions", str(out))
    assert result.exit_code == 0, result.output
    last = result.stdout.strip().splitlines()[-1]
    assert json.loads(last) == {
        "recall": {"email": {"recall": 1.0, "support": 1}, "mobile": {"recall": 1.0, "support": 1},
                   "name": {"recall": 0.0, "support": 1}},
        "false_positives": {"hotline": {"rate": 0.0, "support": 1}, "order_number": {"rate": 0.0, "support": 1},
                            "version": {"rate": 0.0, "support": 1}},
        "lines": 3,
    }
    assert "mobile" in result.stdout and "recall" in result.stdout  # the table
    predictions = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [p["id"] for p in predictions] == ["a", 7, None]
    assert predictions[0]["text"].startswith("我的手机号[PHONE:") and "13900001111" not in predictions[0]["text"]
    assert predictions[1]["text"] == "热线400-820-8820，订单号4111111111111111，版本1.2.3.4"


def test_lines_without_spans_still_give_predictions(tmp_path: Path) -> None:
    data = write_lines(tmp_path / "plain.jsonl", [{"id": "x", "text": "身份证110105491231002"}, {"text": "没有个人信息"}])
    out = tmp_path / "p.jsonl"
    result = run_eval("pii", str(data), "--json", "--predictions", str(out))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"recall": {}, "false_positives": {}, "lines": 2}
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert rows[0]["id"] == "x" and rows[0]["text"].startswith("身份证[CN_ID:") and rows[1]["text"] == "没有个人信息"


def test_without_json_no_json_line(tmp_path: Path) -> None:
    data = write_lines(tmp_path / "one.jsonl", [{"text": "mail a@b.io", "spans": [{"kind": "email", "value": "a@b.io", "pii": True}]}])
    result = run_eval("pii", str(data))
    assert result.exit_code == 0 and "email" in result.stdout
    assert not result.stdout.strip().splitlines()[-1].startswith("{")


@pytest.mark.parametrize(
    ("lines", "line_no", "words"),
    [
        ([{"text": "ok"}, "{not json", {"text": "ok"}], 2, ["not valid JSON"]),
        ([{"text": "ok"}, {"text": "ok"}, {"id": 3}], 3, ["text"]),
        ([[1, 2]], 1, ["JSON object"]),
        ([{"text": "abc", "spans": [{"kind": "email", "value": "x@y.io", "pii": True}]}], 1, ["spans[0].value"]),
        ([{"text": "abc", "spans": [{"kind": "email", "value": "abc"}]}], 1, ["pii"]),
        ([{"text": 5}], 1, ["text"]),
    ],
)
def test_a_bad_line_exits_2_naming_its_line(tmp_path: Path, lines: list[object], line_no: int, words: list[str]) -> None:
    data = write_lines(tmp_path / "bad.jsonl", lines)
    result = run_eval("pii", str(data), "--json")
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert f"bad.jsonl:{line_no}:" in message and all(w in message for w in words), message
    assert "Traceback" not in result.output


def test_the_hand_written_corpus() -> None:
    """The figures the README quotes (tests/data/pii/README.md says where the lines come from)."""
    figures = {}
    for name in ("zh.jsonl", "en.jsonl"):
        result = run_eval("pii", str(CORPUS / name), "--json")
        assert result.exit_code == 0, result.output
        figures[name] = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["zh.jsonl"]["lines"] + figures["en.jsonl"]["lines"] >= 120
    found = support = altered = looked = 0
    structured = ("cn_id18", "cn_id15", "mobile", "landline", "bank_card", "email", "ipv4", "ipv6", "passport")
    for f in figures.values():
        for kind, v in f["recall"].items():
            found += round(v["recall"] * v["support"])
            support += v["support"]
            if kind in structured:
                assert v["recall"] == 1.0, (kind, v)
        for v in f["false_positives"].values():
            altered += round(v["rate"] * v["support"])
            looked += v["support"]
    assert found / support >= 0.95, (found, support)  # measured 112/114 (SSN and a name without context missed)
    assert altered / looked <= 0.03, (altered, looked)  # measured 1/74 (an IP-shaped rule number)


def test_the_held_out_corpus() -> None:
    """Lines written after the redactor was frozen: the figure not tuned on."""
    result = run_eval("pii", str(CORPUS / "heldout.jsonl"), "--json")
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    found = sum(round(v["recall"] * v["support"]) for v in figures["recall"].values())
    support = sum(v["support"] for v in figures["recall"].values())
    altered = sum(round(v["rate"] * v["support"]) for v in figures["false_positives"].values())
    assert found / support >= 0.9 and altered == 0, figures  # measured 21/22 and 0/15
