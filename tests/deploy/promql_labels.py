"""Checks a PromQL expression against a catalogue of exported series (sample name -> label names): every
metric it selects exists, every label it matches, groups by or joins on exists where it is used, and a
one-to-one operation joins series with the same labels (otherwise Prometheus silently returns nothing).

Walks promql-parser's syntax tree, inferring the labels each sub-expression's series carry: a selector has
its metric's, ``sum by (a)`` has ``a``, ``histogram_quantile`` drops ``le``, ``group_left(g)`` adds ``g``.
``problems`` lists what is wrong, in words; empty when the expression is sound.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import promql_parser as pq

Labels = frozenset[str]

# Grafana's variables, replaced before parsing by a value of the right kind.
_INTERVAL_VARIABLES = {"__rate_interval", "__interval", "__range"}
_VARIABLE = re.compile(r"\$\{?(\w+)\}?")
_SET_OPERATORS = {"and", "or", "unless"}


def substitute_grafana_variables(expr: str) -> str:
    """``$__rate_interval`` -> ``5m``, any other ``$name`` -> ``x`` (inside a label value)."""
    return _VARIABLE.sub(lambda m: "5m" if m.group(1) in _INTERVAL_VARIABLES else "x", expr)


class Checker:
    def __init__(self, catalogue: Mapping[str, Labels]) -> None:
        self.catalogue = catalogue
        self.problems: list[str] = []

    def check(self, expr: str) -> Labels | None:
        """Parse and walk ``expr``; the labels of its result (None: a scalar or string)."""
        try:
            tree = pq.parse(substitute_grafana_variables(expr))
        except Exception as exc:  # the parser raises its own error types
            self.problems.append(f"does not parse: {exc}")
            return None
        return self._labels(tree)

    def _need(self, wanted: list[str] | set[str], have: Labels, where: str) -> None:
        for label in sorted(set(wanted) - have):
            self.problems.append(f"{where}: label {label!r} is not on these series ({sorted(have)})")

    def _labels(self, node: object) -> Labels | None:
        if isinstance(node, pq.VectorSelector):
            return self._selector(node)
        if isinstance(node, pq.MatrixSelector):
            return self._selector(node.vector_selector)
        if isinstance(node, (pq.SubqueryExpr, pq.ParenExpr, pq.UnaryExpr)):
            return self._labels(node.expr)
        if isinstance(node, (pq.NumberLiteral, pq.StringLiteral)):
            return None
        if isinstance(node, pq.Call):
            return self._call(node)
        if isinstance(node, pq.AggregateExpr):
            return self._aggregate(node)
        if isinstance(node, pq.BinaryExpr):
            return self._binary(node)
        self.problems.append(f"unexpected syntax {type(node).__name__}")
        return None

    def _selector(self, node: pq.VectorSelector) -> Labels:
        matchers = [*node.matchers.matchers, *(m for group in node.matchers.or_matchers for m in group)]
        name = node.name or next((m.value for m in matchers if m.name == "__name__"), None)
        if name is None or name not in self.catalogue:
            self.problems.append(f"metric {name!r} is not exported by any service or recording rule")
            return frozenset()
        labels = self.catalogue[name]
        self._need([m.name for m in matchers if m.name != "__name__"], labels, f"{name}{{...}}")
        return labels

    def _call(self, node: pq.Call) -> Labels | None:
        name = node.func.name
        args = [self._labels(arg) for arg in node.args]
        vectors = [labels for labels in args if labels is not None]
        if name == "histogram_quantile":
            self._need({"le"}, vectors[0], "histogram_quantile")
            return vectors[0] - {"le"}
        if name in ("scalar", "time", "pi"):
            return None
        if name in ("vector", "absent", "absent_over_time"):
            return frozenset()
        if name in ("label_replace", "label_join"):
            destination = node.args[1].val
            sources = [arg.val for arg in node.args[3:] if isinstance(arg, pq.StringLiteral) and arg.val]
            if name == "label_replace":
                sources = sources[:1]
            self._need(set(sources), vectors[0], name)
            return vectors[0] | {destination}
        return vectors[0] if vectors else None

    def _aggregate(self, node: pq.AggregateExpr) -> Labels:
        inner = self._labels(node.expr) or frozenset()
        op = str(node.op)
        modifier = node.modifier
        if modifier is not None and modifier.type == pq.AggModifierType.By:
            self._need(set(modifier.labels), inner, f"{op} by (...)")
        if op in ("topk", "bottomk", "limitk", "limit_ratio"):
            return inner
        if modifier is None:
            grouped: Labels = frozenset()
        elif modifier.type == pq.AggModifierType.By:
            grouped = frozenset(modifier.labels)
        else:
            grouped = inner - set(modifier.labels)
        if op == "count_values" and isinstance(node.param, pq.StringLiteral):
            grouped |= {node.param.val}
        return grouped

    def _binary(self, node: pq.BinaryExpr) -> Labels | None:
        lhs, rhs = self._labels(node.lhs), self._labels(node.rhs)
        if lhs is None or rhs is None:
            return rhs if lhs is None else lhs
        op, modifier = str(node.op), node.modifier
        matching = modifier.matching if modifier is not None else None
        if matching is not None and matching.type == pq.LabelModifierType.Include:
            self._need(set(matching.labels), lhs, f"{op} on (...): left side")
            self._need(set(matching.labels), rhs, f"{op} on (...): right side")
        if op in _SET_OPERATORS:
            return lhs | rhs if op == "or" else lhs
        card = modifier.card if modifier is not None else pq.VectorMatchCardinality.OneToOne
        group = set(getattr(modifier, "group_labels", None) or [])
        if card == pq.VectorMatchCardinality.ManyToOne:
            self._need(group, rhs, f"{op} group_left (...)")
            return lhs | group
        if card == pq.VectorMatchCardinality.OneToMany:
            self._need(group, lhs, f"{op} group_right (...)")
            return rhs | group
        if matching is None and lhs != rhs:
            self.problems.append(
                f"{op} joins series labelled {sorted(lhs)} with series labelled {sorted(rhs)} one to one: "
                "no pair matches (aggregate both sides by the same labels, or use on (...))"
            )
        return lhs
