"""Add a standard-library ``import NAME`` where isort (and ruff's ``I`` rules) would put it:
in sorted order among the file's plain standard-library imports, not after the last import.
"""

from __future__ import annotations

import sys

import libcst as cst


def _imported(stmt: cst.BaseStatement) -> tuple[str, bool] | None:
    """(top-level module, is a plain ``import``) of a one-import line; None otherwise."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    node = stmt.body[0]
    if isinstance(node, cst.Import):
        name = cst.Module([]).code_for_node(node.names[0].name)
        return name.split(".")[0], True
    if isinstance(node, cst.ImportFrom) and node.module is not None and not node.relative:
        return cst.Module([]).code_for_node(node.module).split(".")[0], False
    return None


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _has(module: cst.Module, name: str) -> bool:
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for node in stmt.body:
                if isinstance(node, cst.Import) and any(
                    cst.Module([]).code_for_node(a.name) == name and a.asname is None
                    for a in node.names
                ):
                    return True
    return False


def _position(module: cst.Module, name: str) -> tuple[int, bool]:
    """Where ``import name`` goes among the leading statements, and whether it opens a new
    section (then a blank line separates it from the third-party imports after it)."""
    body = list(module.body)
    first_import, after_last_plain, first_from = None, None, None
    start = 0
    for i, stmt in enumerate(body):
        found = _imported(stmt)
        if found is None:
            if i == 0 and _is_docstring(stmt):
                start = 1
                continue
            break
        module_name, plain = found
        if module_name == "__future__":
            start = i + 1
            continue
        first_import = i if first_import is None else first_import
        if module_name not in sys.stdlib_module_names:
            continue
        if plain:
            if module_name > name:
                return i, False
            after_last_plain = i + 1
        elif first_from is None:
            first_from = i
    if after_last_plain is not None:
        return after_last_plain, False
    if first_from is not None:
        return first_from, False
    return (first_import, True) if first_import is not None else (start, False)


def add_imports(module: cst.Module, names: list[str]) -> cst.Module:
    """``module`` with ``import NAME`` for each of ``names`` it does not import yet."""
    for name in dict.fromkeys(names):
        if _has(module, name):
            continue
        at, new_section = _position(module, name)
        line = cst.parse_statement(f"import {name}\n")
        body = list(module.body)
        if at < len(body):  # the new line takes the blank lines above its place
            line = line.with_changes(leading_lines=body[at].leading_lines)
            blank = [cst.EmptyLine()] if new_section else []
            body[at] = body[at].with_changes(leading_lines=blank)
        body.insert(at, line)
        module = module.with_changes(body=body)
    return module
