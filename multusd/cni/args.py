"""CNI_ARGS: parse the runtime's value and build the one each delegate plugin receives."""

from __future__ import annotations

from typing import Iterable, List, Sequence, Tuple

from multusd.errors import InvalidEnvironment

Pair = Tuple[str, str]

def parse_cni_args(value: str) -> List[Pair]:
    """Split ``"A=1;B=x=y"`` into ``[("A", "1"), ("B", "x=y")]``.

    Items are split on their first ``=`` only, so values may contain ``=``; empty items
    (``"A=1;"``, ``";;"``) are skipped and an empty string gives ``[]``.

    :raises InvalidEnvironment: for an item without ``=`` or with an empty key.
    """
    pairs: List[Pair] = []
    for item in value.split(";"):
        if not item:
            continue
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise InvalidEnvironment(
                f"invalid CNI_ARGS item {item!r} in {value!r}: expected KEY=VALUE items "
                "separated by ';'")
        pairs.append((key, val))
    return pairs


def build_delegate_args(namespace: str, name: str, infra_id: str, uid: str,
                        extra: Iterable[Pair] = ()) -> List[Pair]:
    """The CNI_ARGS pairs of a delegate: the pod identity first, then ``extra``.

    An ``extra`` key that is already present with an empty value fills it; one that
    already has a value keeps that value; a key not present yet is appended. (Upstream
    had both conditions inverted at different times; see the seeds.)
    """
    pairs: List[Pair] = [("IgnoreUnknown", "true"), ("K8S_POD_NAMESPACE", namespace),
                         ("K8S_POD_NAME", name), ("K8S_POD_INFRA_CONTAINER_ID", infra_id),
                         ("K8S_POD_UID", uid)]
    for key, val in extra:
        index = _index_of(pairs, key)
        if index is None:
            pairs.append((key, val))
        elif pairs[index][1] == "":
            pairs[index] = (key, val)
    return pairs


def format_cni_args(pairs: Sequence[Pair]) -> str:
    """``[("A", "1"), ("B", "")]`` -> ``"A=1;B="``."""
    return ";".join(f"{key}={val}" for key, val in pairs)


def _index_of(pairs: Sequence[Pair], key: str) -> int | None:
    for index, (existing, _) in enumerate(pairs):
        if existing == key:
            return index
    return None
