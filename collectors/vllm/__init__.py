"""entroloop's vLLM plugin: the on-device entropy tap.

Enabled by installing entroloop into the serving environment (``pip install entroloop[vllm]``):
vLLM loads ``EntropyTapLogitsProcessor`` through the ``vllm.logits_processors`` entry point in
every engine core, and ``ENTROLOOP_ENTROPY_TAP_*`` settings configure it. Nothing here imports
vLLM or torch at package import time; ``entroloop.collectors.vllm.vllm_adapter`` is the only module that
touches vLLM.
"""

from entroloop.collectors.vllm.ledger import AddedRow, MovedRow, RowLedger, ShippedChunk

__all__ = ["AddedRow", "MovedRow", "RowLedger", "ShippedChunk"]
