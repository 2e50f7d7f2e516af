"""The runbooks shipped with entroloop (YAML files, package data): the default of ENTROLOOP_ACTIONS_RUNBOOKS_DIR."""
