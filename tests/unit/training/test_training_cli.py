"""The training commands exist in the light virtualenv and never import torch to be listed."""

from __future__ import annotations

import subprocess
import sys


def test_help_lists_training_commands_without_importing_torch() -> None:
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from entroloop.cli import app\n"
        "r = CliRunner().invoke(app, ['--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "for name in ('train', 'trainer', 'adapters'):\n"
        "    assert name in r.output, name\n"
        "r = CliRunner().invoke(app, ['adapters', '--help'])\n"
        "assert all(n in r.output for n in ('list', 'show', 'rollback')), r.output\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'peft', 'transformers')]\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
