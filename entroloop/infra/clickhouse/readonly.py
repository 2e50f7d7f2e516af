"""Ad-hoc SQL for analysts: read-only, and only over entroloop's own tables.

Why: ``entroloop query`` hands user SQL to the same ClickHouse engine that can read any file
(``file('/etc/passwd')``, ``file('DATA/worm/audit/*/*/*.parquet', Parquet)``), fetch URLs, reach
other servers and write files (``INSERT INTO FUNCTION file``, ``INTO OUTFILE``). Audit text must be
readable only by audit id or user id (``entroloop audit get``), so a query must not be a way around
that rule.

Two layers, both always on:

1. ClickHouse parses the query (``EXPLAIN AST``, nothing is executed) and the tree is checked
   against allow-lists: the statement kinds (SELECT / WITH / UNION / INTERSECT / EXCEPT, SHOW TABLES,
   SHOW COLUMNS, SHOW CREATE, DESCRIBE, EXPLAIN of those), the clauses of a statement (no
   ``INTO OUTFILE``), the table sources (tables of the entroloop database, a few system tables that
   hold no text, and table functions that generate numbers only). Scalar functions that read files,
   dictionaries or models (``file``, ``dictGet*``, ``joinGet``, ``catboostEvaluate``...) and every
   user-defined function are refused.
2. The query runs with ``readonly=1``, which also forbids every write, DDL, setting change and
   table function with a data source (ClickHouse checks table functions against the
   ``CREATE TEMPORARY TABLE`` grant, which ``readonly=1`` revokes). ``readonly=1`` alone is not
   enough: the scalar ``file()`` function and ``INTO OUTFILE`` pass it in chDB.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

READONLY_SETTINGS: dict[str, object] = {"readonly": 1}

#: Statements an analyst may run (the root node of ClickHouse's AST).
ALLOWED_STATEMENTS = frozenset(
    {
        "SelectWithUnionQuery",
        "SelectIntersectExceptQuery",
        "SelectQuery",
        "ShowTables",
        "ShowColumns",
        "ShowCreateTableQuery",
        "DescribeQuery",
        "Explain",
    }
)

#: Direct children a SELECT statement's root may have: the union list, SETTINGS and FORMAT.
#: Anything else there is ``INTO OUTFILE`` (a Literal path) and is refused.
ALLOWED_SELECT_ROOT_CHILDREN = frozenset({"ExpressionList", "Set", "Identifier"})

#: System tables that describe structure and counters, never stored text (no query text, no
#: error messages, no log lines): query_log, processes, text_log, errors, mutations... are out.
ALLOWED_SYSTEM_TABLES = frozenset(
    {
        "one",
        "numbers",
        "numbers_mt",
        "zeros",
        "zeros_mt",
        "databases",
        "tables",
        "columns",
        "parts",
        "parts_columns",
        "functions",
        "table_functions",
        "table_engines",
        "formats",
        "data_type_families",
        "aggregate_function_combinators",
        "build_options",
        "time_zones",
        "metrics",
        "events",
        "asynchronous_metrics",
        "disks",
    }
)
ALLOWED_INFORMATION_SCHEMA = frozenset({"tables", "columns", "schemata", "views"})

#: Table functions that generate values and read no source.
ALLOWED_TABLE_FUNCTIONS = frozenset(
    {"numbers", "numbers_mt", "zeros", "zeros_mt", "generate_series", "generateseries", "values", "view", "null"}
)

#: Scalar functions that reach past the query's tables: files, dictionaries (whose sources can be
#: files, URLs or other servers), Join tables, model files, the server's binary and settings.
DENIED_FUNCTIONS = frozenset(
    {
        "file",
        "joinget",
        "joingetornull",
        "catboostevaluate",
        "modelevaluate",
        "naivebayesclassifier",
        "addresstoline",
        "addresstolinewithinlines",
        "addresstosymbol",
        "getserversetting",
        "getmacro",
        "input",
        "url",
        "s3",
        "remote",
        "remotesecure",
    }
)
DENIED_FUNCTION_PREFIXES = ("dict",)

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_TABLE_LINE = re.compile(rf"({_NAME})(?:\.({_NAME}))?(?: \(alias .*\))?(?: \(children \d+\))?")
_FUNCTION_LINE = re.compile(rf"({_NAME})(?: \(alias .*\))?(?: \(children \d+\))?")


class QueryRefused(ValueError):
    """The query reaches outside entroloop's tables or is not a read; the message says why."""


@dataclass
class AstNode:
    """One line of ``EXPLAIN AST``: the node kind, the rest of the line, its children."""

    kind: str
    text: str
    children: list[AstNode] = field(default_factory=list)


def parse_explain_ast(lines: list[str]) -> AstNode:
    """The tree of ``EXPLAIN AST`` output (one space of indent per level)."""
    root: AstNode | None = None
    stack: list[tuple[int, AstNode]] = []
    for line in lines:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip(" "))
        kind, _, text = line.strip().partition(" ")
        node = AstNode(kind, text)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            stack[-1][1].children.append(node)
        elif root is None:
            root = node
        else:
            raise QueryRefused("one statement at a time")
        stack.append((depth, node))
    if root is None:
        raise QueryRefused("empty query")
    return root


@dataclass
class QueryGuard:
    """Checks an analyst's query against the allow-lists (see the module docstring)."""

    database: str
    databases: frozenset[str] = frozenset({"system", "information_schema", "default"})
    user_functions: frozenset[str] = frozenset()

    def check(self, root: AstNode) -> None:
        """Raise ``QueryRefused`` naming the first thing that is not allowed."""
        self._statement(root)

    def _statement(self, node: AstNode) -> None:
        if node.kind not in ALLOWED_STATEMENTS:
            raise QueryRefused(
                f"only SELECT, WITH, SHOW TABLES/COLUMNS/CREATE, DESCRIBE and EXPLAIN are allowed, not {node.kind}"
            )
        if node.kind == "Explain":
            if not node.children:
                raise QueryRefused("EXPLAIN of nothing")
            self._statement(node.children[0])
            for child in node.children[1:]:
                self._walk(child)
            return
        if node.kind == "SelectWithUnionQuery":
            for child in node.children:
                if child.kind not in ALLOWED_SELECT_ROOT_CHILDREN:
                    raise QueryRefused("INTO OUTFILE is not allowed: results go to the terminal only")
        self._walk(node)

    def _walk(self, node: AstNode) -> None:
        if node.kind.endswith("Query") and node.kind not in ALLOWED_STATEMENTS | {"TablesInSelectQuery"}:
            raise QueryRefused(f"{node.kind} is not allowed: queries are read-only")
        if node.kind == "TableExpression":
            for child in node.children:
                if child.kind == "TableIdentifier":
                    self._table(child.text)
                elif child.kind == "Function":
                    self._table_function(child)
                else:
                    self._walk(child)
            return
        if node.kind == "TableIdentifier":
            self._table(node.text)
        elif node.kind == "Function":
            self._function(node.text)
        elif node.kind == "Identifier":
            self._identifier(node.text)
        for child in node.children:
            self._walk(child)

    def _table(self, text: str) -> None:
        match = _TABLE_LINE.fullmatch(text)
        if not match:
            raise QueryRefused(f"table name {text!r}: use plain names (letters, digits, _) of entroloop tables")
        first, second = match.group(1), match.group(2)
        if second is None:
            return  # the current database (set to entroloop) or a WITH name
        self._qualified(first, second)

    def _qualified(self, db: str, table: str) -> None:
        if db == self.database:
            return
        if db == "system" and table in ALLOWED_SYSTEM_TABLES:
            return
        if db.lower() == "information_schema" and table.lower() in ALLOWED_INFORMATION_SCHEMA:
            return
        raise QueryRefused(
            f"{db}.{table} is not readable here: query the tables of the `{self.database}` database "
            f"(and system tables without text: {', '.join(sorted(ALLOWED_SYSTEM_TABLES))})"
        )

    def _table_function(self, node: AstNode) -> None:
        match = _FUNCTION_LINE.fullmatch(node.text)
        name = match.group(1) if match else node.text
        if not match or name.lower() not in ALLOWED_TABLE_FUNCTIONS:
            raise QueryRefused(
                f"table function {name}() is not allowed: queries read only the `{self.database}` "
                "tables (no files, URLs, S3, other servers or dictionaries); audit text is read by id "
                "with `entroloop audit get`"
            )
        for child in node.children:
            self._walk(child)

    def _function(self, text: str) -> None:
        match = _FUNCTION_LINE.fullmatch(text)
        if not match:
            raise QueryRefused(f"function name {text!r}: use plain names")
        name = match.group(1)
        low = name.lower()
        if low in DENIED_FUNCTIONS or low.startswith(DENIED_FUNCTION_PREFIXES) or low in self.user_functions:
            raise QueryRefused(
                f"function {name}() is not allowed: it reads outside the `{self.database}` tables "
                "(files, dictionaries, models or user-defined programs)"
            )

    def _identifier(self, text: str) -> None:
        # `x IN system.query_log` reads a table through an Identifier, not a TableIdentifier.
        name = text.split(" (alias ", 1)[0].split(" (children ", 1)[0]
        parts = name.split(".")
        if len(parts) >= 2 and parts[0] in self.databases and parts[0] != self.database:
            self._qualified(parts[0], parts[1])


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0][:500] if str(exc) else type(exc).__name__


def guard_for(client: Any, database: str) -> QueryGuard:
    """A guard knowing this server's database names and user-defined functions."""
    dbs = {r[0] for r in client.query("SELECT name FROM system.databases", settings=READONLY_SETTINGS).result_rows}
    udfs = {
        str(r[0]).lower()
        for r in client.query(
            "SELECT name FROM system.functions WHERE origin != 'System'", settings=READONLY_SETTINGS
        ).result_rows
    }
    return QueryGuard(database, frozenset(dbs | {"system", "information_schema", "INFORMATION_SCHEMA"}), frozenset(udfs))


def check_query(client: Any, sql: str, database: str) -> None:
    """Raise ``QueryRefused`` unless ``sql`` only reads entroloop's tables (parsed by ClickHouse)."""
    if not sql.strip():
        raise QueryRefused("empty query")
    try:
        lines = [str(r[0]) for r in client.query(f"EXPLAIN AST {sql}", settings=READONLY_SETTINGS).result_rows]
    except Exception as exc:  # noqa: BLE001 - ClickHouse could not parse it (or refused it): say so plainly
        user_format = re.search(r"\bFORMAT\s+\w+\s*;?\s*$", sql, flags=re.IGNORECASE)
        hint = " (leave out FORMAT: use --json for JSON lines)" if user_format else ""
        raise QueryRefused(f"ClickHouse could not parse the query{hint}: {_first_line(exc)}") from None
    guard_for(client, database).check(parse_explain_ast(lines))


def run_readonly_query(client: Any, sql: str, database: str) -> Any:
    """Check ``sql`` (``check_query``), then run it with ``readonly=1`` in ``database``."""
    check_query(client, sql, database)
    try:
        client.database = database  # unqualified names resolve to entroloop's tables
    except Exception as exc:  # noqa: BLE001 - chDB and the HTTP client raise different types
        raise QueryRefused(
            f"no `{database}` database here yet: run `entroloop demo` or `entroloop migrate` first ({_first_line(exc)})"
        ) from None
    return client.query(sql, settings=READONLY_SETTINGS)


__all__ = [
    "READONLY_SETTINGS",
    "AstNode",
    "QueryGuard",
    "QueryRefused",
    "check_query",
    "parse_explain_ast",
    "run_readonly_query",
]
