"""Runbook files: the repository's runbooks load, and a broken runbook is refused with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.actions.runbooks import RunbookError, load_runbooks, parse_runbook

REPO_RUNBOOKS = Path(__file__).resolve().parents[4] / "runbooks"

VALID = """
name: demo
version: 3
match: {rules: [gibberish]}
steps:
  - kind: pause_node
"""


def test_repository_runbooks_load_and_cover_every_step_kind():
    runbooks = load_runbooks(REPO_RUNBOOKS)
    assert len(runbooks) >= 5
    kinds = {s.kind for r in runbooks for s in r.steps}
    assert kinds == {"pause_node", "pause_route", "switch_fallback", "unload_adapter", "capture_bundle", "open_retrain"}
    assert all(r.version for r in runbooks)


def test_version_is_text_and_defaults_apply():
    rb = parse_runbook(VALID)
    assert rb.version == "3" and rb.on_failure == "stop" and not rb.dry_run
    assert rb.steps[0].url_path == "/admin/nodes/{subject_node}/pause"
    assert rb.matches("gibberish", "warning", 0.0) and not rb.matches("repetition_loop", "warning", 0.0)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (VALID.replace("kind: pause_node", "kind: reboot_cluster"), "steps.0.kind"),
        (VALID + "    colour: red\n", "colour"),
        (VALID.replace("kind: pause_node", "kind: pause_node\n    path: /x/{hostname}"), "unknown field"),
        (VALID.replace("version: 3", "version: ''"), "version"),
        (VALID.replace("match: {rules: [gibberish]}", "match: {rules: []}"), "match.rules"),
        ("- just a list", "YAML mapping"),
        ("name: [unclosed", "not valid YAML"),
    ],
)
def test_broken_runbooks_are_refused_with_the_reason(text, reason):
    with pytest.raises(RunbookError, match=reason.replace(".", r"\.")):
        parse_runbook(text, "x.yaml")


def test_duplicate_names_are_refused(tmp_path):
    (tmp_path / "a.yaml").write_text(VALID)
    (tmp_path / "b.yaml").write_text(VALID)
    with pytest.raises(RunbookError, match="used twice"):
        load_runbooks(tmp_path)
