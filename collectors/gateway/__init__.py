"""The audit gateway: an OpenAI-compatible proxy that publishes Audit, Span and (for engines without
the entropy tap) approximate TokenEntropy records. Needs the ``gateway`` extra (starlette, httpx, uvicorn)."""
