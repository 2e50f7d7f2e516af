"""Runbook files: the repository's runbooks load, and a broken runbook is refused with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from entroloop.streams.actions.runbooks import (
    BUILTIN_RUNBOOKS_DIR,
    RunbookError,
    load_runbooks,
    parse_runbook,
)

REPO_RUNBOOKS = BUILTIN_RUNBOOKS_DIR

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


def test_settings_default_to_the_packaged_runbooks():
    from entroloop.streams.actions.runbooks import runbooks_from_settings

    from entroloop.contract.settings import load_settings

    names = {r.name for r in runbooks_from_settings(load_settings())}
    assert "pause-node-on-gibberish" in names and len(names) == len(list(BUILTIN_RUNBOOKS_DIR.glob("*.yaml")))


@pytest.mark.parametrize("make", ["missing", "empty", "invalid"])
def test_a_bad_runbook_folder_is_an_error_naming_the_setting_and_the_fix(make, tmp_path):
    from entroloop.streams.actions.runbooks import runbooks_from_settings

    from entroloop.contract.settings import load_settings

    folder = tmp_path / "runbooks"
    if make != "missing":
        folder.mkdir()
    if make == "invalid":
        (folder / "bad.yaml").write_text("name: x\nversion: 1\nmatch: {rules: [gibberish]}\nsteps: [{kind: reboot}]\n")
    with pytest.raises(RunbookError) as caught:
        runbooks_from_settings(load_settings(actions_runbooks_dir=folder))
    message = str(caught.value)
    assert "ENTROLOOP_ACTIONS_RUNBOOKS_DIR" in message and "unset it" in message and str(folder) in message


def test_unload_can_go_straight_to_vllm_and_rollback_goes_to_the_gateway():
    direct = parse_runbook("name: u\nversion: 1\nmatch: {rules: [r]}\nsteps: [{kind: unload_adapter, endpoint: vllm}]\n")
    assert (direct.steps[0].endpoint, direct.steps[0].url_path) == ("vllm", "/v1/unload_lora_adapter")
    back = parse_runbook("name: b\nversion: 1\nmatch: {rules: [r]}\nsteps: [{kind: rollback_adapter}]\n")
    assert (back.steps[0].endpoint, back.steps[0].url_path) == ("gateway", "/admin/adapters/{adapter}/rollback")
    with pytest.raises(RunbookError, match="endpoint"):
        parse_runbook("name: c\nversion: 1\nmatch: {rules: [r]}\nsteps: [{kind: pause_node, endpoint: vllm}]\n")


def test_the_embedded_runner_refuses_a_missing_runbook_folder_before_opening_anything(tmp_path):
    from entroloop.contract.settings import load_settings
    from entroloop.runner import EmbeddedRunner

    data = tmp_path / "data"
    with pytest.raises(RunbookError, match="ENTROLOOP_ACTIONS_RUNBOOKS_DIR"):
        EmbeddedRunner(load_settings(data_dir=data, actions_runbooks_dir=tmp_path / "typo"))
    assert not data.exists()


def test_the_runbooks_are_package_data():
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[4] / "pyproject.toml").read_text())
    assert (BUILTIN_RUNBOOKS_DIR / "__init__.py").exists()  # a package, so setuptools' find ships its data
    assert "*.yaml" in pyproject["tool"]["setuptools"]["package-data"]["*"]
