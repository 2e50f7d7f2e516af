"""Reader labels for the tiny LM's traces (tests/corpora/lm_traces.py): the sheet a person reads shows
nothing that gives the answer away, labels land on the right lines, and a mistake in the labels file
is an error, not a silently half-labelled corpus (pure logic, no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.corpora.lm_traces import (
    DEV2_OUTPUT,
    FRESH_OUTPUT,
    OUTPUTS,
    READ_OUTPUTS,
    READER_LABELS,
    Regime,
    Request,
    add_sampling_entropies,
    apply_read_labels,
    dev2_requests,
    read_lines,
    read_split_requests,
    relabel,
    sheet_key,
    write_lines,
    write_reading_sheet,
)


def _line(request_id: str, regime: str, text: str) -> dict:
    return {
        "id": request_id,
        "model": "tiny",
        "entropy": [3.25, 4.5],
        "token_ids": [7, 8],
        "label": {"loop": False, "gibberish": regime == "very-hot"},
        "generator": {"regime": regime, "temperature": 2.0, "prompt": "git ", "text": text,
                      "label_evidence": {"gibberish": "40% unknown"}},
    }


def test_the_sheet_shows_prompt_and_text_only(tmp_path: Path) -> None:
    lines = [_line("lmr-0004", "very-hot", "xq zzv 乱码"), _line("lmr-0000", "greedy", "%s: 无此文件")]
    write_reading_sheet(lines, tmp_path / "read_sheet.md")
    sheet = (tmp_path / "read_sheet.md").read_text()
    assert "read_labels.jsonl" in sheet.splitlines()[0]
    for hidden in ("lmr-", "very-hot", "greedy", "temperature", "3.25", "unknown", "gibberish"):
        assert hidden not in sheet, hidden
    assert "xq zzv 乱码" in sheet and "%s: 无此文件" in sheet and "prompt: git " in sheet
    # ordered by key, not by id: ids are numbered prompt by prompt and regime by regime
    keys = [line[3:] for line in sheet.splitlines() if line.startswith("## ")]
    assert keys == sorted(sheet_key(line["id"]) for line in lines)


def test_labels_land_by_key_and_the_rules_verdict_is_kept(tmp_path: Path) -> None:
    traces = tmp_path / "traces.jsonl"
    write_lines([_line("lmr-0001", "very-hot", "a"), _line("lmr-0002", "greedy", "b")], traces)
    labels = tmp_path / "labels.jsonl"
    labels.write_text(
        json.dumps({"key": sheet_key("lmr-0002"), "loop": True, "gibberish": False, "why": "x"}) + "\n"
        + json.dumps({"key": sheet_key("lmr-0001"), "loop": False, "gibberish": False, "why": "y"}) + "\n"
    )
    assert apply_read_labels(traces, labels) == 2
    lines = {json.loads(raw)["id"]: json.loads(raw) for raw in traces.read_text().splitlines()}
    assert lines["lmr-0002"]["label"] == {"loop": True, "gibberish": False}
    assert lines["lmr-0001"]["label"] == {"loop": False, "gibberish": False}
    assert lines["lmr-0001"]["generator"]["rule_label"] == {"loop": False, "gibberish": True}
    # applied again (say after a correction): the rules' verdict is not replaced by the reader's
    assert apply_read_labels(traces, labels) == 2
    again = {json.loads(raw)["id"]: json.loads(raw) for raw in traces.read_text().splitlines()}
    assert again["lmr-0001"]["generator"]["rule_label"] == {"loop": False, "gibberish": True}


@pytest.mark.parametrize("problem", ["missing", "twice", "unknown"])
def test_a_wrong_labels_file_is_an_error(tmp_path: Path, problem: str) -> None:
    traces = tmp_path / "traces.jsonl"
    write_lines([_line("lmr-0001", "greedy", "a"), _line("lmr-0002", "greedy", "b")], traces)
    before = traces.read_text()
    keys = {"missing": ["lmr-0001"], "twice": ["lmr-0001", "lmr-0001", "lmr-0002"],
            "unknown": ["lmr-0001", "lmr-0002", "lmr-9999"]}[problem]
    labels = tmp_path / "labels.jsonl"
    labels.write_text("".join(
        json.dumps({"key": sheet_key(k), "loop": False, "gibberish": False}) + "\n" for k in keys
    ))
    with pytest.raises(ValueError, match="labels.jsonl"):
        apply_read_labels(traces, labels)
    assert traces.read_text() == before  # nothing half-labelled


def test_relabel_updates_the_rules_verdict_not_the_readers(tmp_path: Path) -> None:
    """`--relabel` recomputes what the text rules say; on a reader-labelled line that is
    ``generator.rule_label``, never the reader's ``label``."""
    line = _line("lm-0001", "greedy", "plain readable text")
    line["generator"]["rule_label"] = {"loop": True, "gibberish": True}  # stale: the rules say neither now
    line["label"] = {"loop": True, "gibberish": False}  # the reader's
    path = tmp_path / "dev.jsonl"
    write_lines([line], path)
    changed = relabel({"dev": path})
    stored = json.loads(path.read_text())
    assert stored["label"] == {"loop": True, "gibberish": False}
    assert stored["generator"]["rule_label"] == {"loop": False, "gibberish": False}
    assert changed == [("lm-0001", {"loop": True, "gibberish": True}, {"loop": False, "gibberish": False})]


def test_every_reader_labelled_file_is_fully_labelled_by_its_labels_file() -> None:
    """The checked-in corpora and their labels files agree line for line (a relabelled or
    regenerated file that was not read again would fail here)."""
    for traces, labels in READER_LABELS.items():
        read = {json.loads(raw)["key"]: json.loads(raw) for raw in labels.read_text().splitlines()}
        lines = [json.loads(raw) for raw in traces.read_text().splitlines()]
        assert len(read) == len(lines), traces.name
        for line in lines:
            entry = read[sheet_key(line["id"])]
            assert line["label"] == {"loop": entry["loop"], "gibberish": entry["gibberish"]}, line["id"]
            assert "rule_label" in line["generator"], line["id"]


def test_the_command_line_names_each_split_and_refuses_the_rest(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import tests.corpora.lm_traces as lm_traces

    asked: list[str] = []
    monkeypatch.setattr(lm_traces, "main", asked.append)  # no model: only which split is asked for
    for argv, split in (([], "dev+test"), (["--fresh"], "fresh"), (["--read", "read2"], "read2"), (["--dev2"], "dev2")):
        lm_traces._command_line(argv)
        assert asked.pop() == split
    for wrong in (["--read", "read9"], ["--fresh", "--relabel"], ["--bogus"]):
        with pytest.raises(SystemExit) as exit_info:
            lm_traces._command_line(wrong)
        assert exit_info.value.code == 2, wrong
    assert "invalid choice: 'read9'" in capsys.readouterr().err
    assert asked == []


def test_each_read_split_holds_its_planned_requests_and_no_earlier_prompt() -> None:
    """A READ split is blind only if its prompts are new: the checked-in lines are exactly what
    ``read_split_requests`` plans (ids, prompts, regimes, lengths), and none of their prompts is in a
    split made before it (DEV, TEST, FRESH, the earlier READ splits, DEV2 for READ4 and READ5); DEV2 likewise."""
    earlier = {line["generator"]["prompt"] for line in read_lines((*OUTPUTS.values(), FRESH_OUTPUT)).values()}
    # in the order they were made: DEV2 came after READ3 and before READ4
    made = [(name, read_split_requests(name), path) for name, path in READ_OUTPUTS.items()]
    made.insert([name for name, *_ in made].index("read3") + 1, ("dev2", dev2_requests(), DEV2_OUTPUT))
    for name, requests, path in made:
        planned = {r.id: r for r in requests}
        stored = read_lines((path,))
        assert planned.keys() == stored.keys() and len(stored) == 200, name
        for request_id, line in stored.items():
            request = planned[request_id]
            assert line["generator"]["prompt"] == request.prompt, request_id
            assert line["generator"]["regime"] == request.regime.name, request_id
            assert len(line["token_ids"]) == request.max_tokens, request_id  # ignore_eos: every token
            if name in ("dev2", "read4", "read5"):  # made with the tap's sampling entropies: none for greedy requests
                expected = len(line["token_ids"]) if request.regime.temperature else 0
                assert len(line.get("sampling_entropy", [])) == expected, request_id
        prompts = {r.prompt for r in planned.values()}
        assert not prompts & earlier, name
        earlier |= prompts


def test_sampling_entropies_are_added_only_to_a_split_the_same_weights_made(tmp_path: Path) -> None:
    """--add-sampling regenerates the split; it refuses, writing nothing, when the file names other
    weights than the model at hand (the texts would differ and the labels would not be theirs)."""
    path = tmp_path / "split.jsonl"
    lines = [_line("lmr3-0001", "very-hot", "x")]
    lines[0]["generator"]["weights_sha256"] = "0" * 64
    write_lines(lines, path)
    before = path.read_text()
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"other weights")
    request = Request("lmr3-0001", "p", "en", Regime("very-hot", 2.0), 2, 1)
    with pytest.raises(ValueError, match="other weights"):
        add_sampling_entropies(path, [request], model)
    with pytest.raises(ValueError, match="not the split's planned requests"):
        add_sampling_entropies(path, [], model)
    assert path.read_text() == before
