"""The real vLLM OpenAI server (CPU build) for the tiny test model, with runtime LoRA updating on.

Shared by the training and adapter-routing tests: ``start`` boots it in the background (a test
can train while it boots), ``wait_until_serving`` blocks until it lists the base model, ``stop``
ends it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from entroloop.training.publisher import VllmError, VllmLoraClient


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model_path: Path, served_name: str, log: Path, cwd: Path) -> tuple[subprocess.Popen[bytes], VllmLoraClient]:
    """Start the server for ``model_path`` served as ``served_name``; its output goes to ``log``."""
    port = free_port()
    env = {
        **os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "ENTROLOOP_ENTROPY_TAP_ENABLED": "false",
    }
    # ``python -m ...api_server`` rather than the ``vllm`` script: the script asks for the version of
    # a distribution named "vllm", and the CPU build is distributed as "vllm-cpu".
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_path),
           "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--enforce-eager", "--max-model-len", "256", "--enable-lora", "--max-lora-rank", "8",
           "--max-loras", "2", "--max-num-seqs", "8", "--seed", "0"]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    return proc, VllmLoraClient(f"http://127.0.0.1:{port}", timeout=30)


def wait_until_serving(proc: subprocess.Popen[bytes], client: VllmLoraClient, served_name: str, log: Path,
                       timeout_s: float) -> None:
    """Return once the server lists ``served_name``; fail the test with the log's tail otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if served_name in client.models():
                return
        except VllmError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"vLLM server did not come up (exit {proc.poll()}):\n{log.read_text()[-3000:]}")
        time.sleep(1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
