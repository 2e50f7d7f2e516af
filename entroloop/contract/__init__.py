"""The event contract, the ground floor: records, their codec, the topic registry, ids and settings.

Every stage (``collectors``, ``streams``, ``sinks``, ``training``) stands on this package and it
imports nothing of the project (the import contract in ``pyproject.toml`` checks it).
"""
