"""A Faust worker that runs only the action runner: alerts in, runbook steps executed, Action
records out (``streams/actions/runner.py``).

`entroloop worker` runs the analytics processors of ``streams.defaults`` and no action runner
(only the embedded runner, ``entroloop.runner``, adds one), and it has no option to add it. The
runner's own docstring asks for a worker of its own in a deployment (a slow webhook must not
hold up the analytics), so ``bench lag`` starts this module beside `entroloop worker`: the same
``streams.app.build_streams_app`` with the runner as its only processor and its own app id
(consumer group). Settings come from the environment, like the worker command's.

Run: ``python -m entroloop.benchmarks.action_worker [LOGLEVEL]``.
"""

from __future__ import annotations

import sys

ACTIONS_APP_ID = "entroloop-actions"


def main(loglevel: str = "warn") -> None:
    from entroloop.contract.settings import load_settings
    from streams.actions import ActionRunner
    from streams.app import build_streams_app

    settings = load_settings()
    # no ClickHouse here: capture_bundle steps report `failed` (no query function), the rest run
    runner = ActionRunner.from_settings(settings)
    build_streams_app(settings, processors=[runner], app_id=ACTIONS_APP_ID).run(loglevel=loglevel)


if __name__ == "__main__":
    main(*sys.argv[1:2])
