"""The fleet's per-node figures from the stand-in's ledger, and the tables fleet.py prints.

:func:`node_figures` reads one node's windows (its start, the idle time, the restarts) from
the stand-in's per-client ledger (tests/kubeclients.py); :func:`summarise` gives each figure's
median, min, max and total over a fleet; :func:`print_tables` prints the per-node table, the
summary side by side and the first node's requests.
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any, Dict, List

from fleetnodes import Node

# the per-node columns of the table: (JSON key, heading, width)
COLUMNS = [("ready_s", "ready s", 7), ("start_requests", "start req", 9),
           ("start_kb", "start KB", 8), ("start_lists", "lists c/s", 9),
           ("start_storage_objects", "stor.obj", 8), ("idle_requests_per_h", "idle req/h", 10),
           ("idle_kb_per_h", "idle KB/h", 9), ("idle_cpu_s_per_h", "CPU s/h", 7),
           ("restart_requests", "rst req", 7),
           ("restart_lists", "rst c/s", 7), ("restart_first_list_s", "rst 1st", 7),
           ("relist_requests", "410 req", 7), ("relist_lists", "410 c/s", 7),
           ("relist_storage_objects", "410 st.obj", 10), ("relist_first_list_s", "410 1st", 7),
           ("rss_mb", "RSS MB", 7)]
# the windows after the start, common to every node: (name, what happened at its start)
RESTARTS = (("restart", "the stand-in restarted (history kept: watches resume)"),
            ("relist", "the stand-in restarted and compacted (watches resuming get 410 Gone)"))
SUMMARY_ROWS = (
    ("ready_s", "s until ready"), ("start_requests", "requests at start"),
    ("start_kb", "KB at start"), ("start_cache_lists", "cache LISTs at start"),
    ("start_storage_lists", "storage LISTs at start"),
    ("start_storage_objects", "objects read from storage"),
    ("idle_requests_per_h", "requests per idle hour"), ("idle_kb_per_h", "KB per idle hour"),
    ("idle_cpu_s_per_h", "daemon CPU s per idle hour"),
    ("restart_requests", "requests, 30 s after restart"),
    ("restart_storage_objects", "  objects read from storage"),
    ("restart_first_list_s", "  first LIST after, s"),
    ("relist_requests", "requests, 30 s after rst+410"),
    ("relist_kb", "  KB"), ("relist_storage_objects", "  objects read from storage"),
    ("relist_first_list_s", "  first LIST after, s"), ("rss_mb", "RSS MB (end of idle)"))


def window_figures(prefix: str, window: Dict[str, Any], since: float) -> Dict[str, Any]:
    """One ledger window as ``<prefix>_*`` figures (first LIST: s after ``since``)."""
    first = window["first_list"]
    return {f"{prefix}_requests": window["requests"],
            f"{prefix}_kb": round(window["bytes"] / 1024, 1),
            f"{prefix}_lists": f"{window['cache_lists']}/{window['storage_lists']}",
            f"{prefix}_cache_lists": window["cache_lists"],
            f"{prefix}_storage_lists": window["storage_lists"],
            f"{prefix}_storage_objects": window["storage_objects"],
            f"{prefix}_first_list_s": round(first - since, 2) if first is not None else None,
            f"{prefix}_by_kind": window["by_kind"]}


def node_figures(kube_api, node: Node, settle: float, windows: Dict[str, tuple],
                 trace: bool = False) -> Dict[str, Any]:
    """One node's figures from the stand-in's ledger: its own start window, then the common
    ones (``trace``: every request's time in its window, kind and query too)."""
    ledger = kube_api.clients
    end = node.ready + settle if node.ready else float("inf")
    spans = {"start": (node.launched, end), **windows}
    seen = {name: ledger.window(node.client, *span) for name, span in spans.items()}
    row: Dict[str, Any] = {"ready_s": round(node.ready - node.launched, 2) if node.ready
                           else None}
    for name, window in seen.items():
        row.update(window_figures(name, window, spans[name][0]))
    hours = (windows["idle"][1] - windows["idle"][0]) / 3600
    row["idle_requests_per_h"] = round(row["idle_requests"] / hours, 1)
    row["idle_kb_per_h"] = round(row["idle_kb"] / hours, 1)
    if trace:
        row["trace"] = {name: [(round(t - spans[name][0], 2), kind, query)
                               for t, kind, query in window["trace"]]
                        for name, window in seen.items()}
    return row


def summarise(rows: List[Dict[str, Any]], hours: float) -> Dict[str, Any]:
    """Median, min, max and total of each number over a fleet's nodes; request kinds per node
    (per node and hour for the idle window)."""
    out: Dict[str, Any] = {"nodes": len(rows)}
    for key in sorted(rows[0]):
        values = [row[key] for row in rows if isinstance(row.get(key), (int, float))]
        if values and not isinstance(rows[0][key], str):
            out[key] = {"median": round(statistics.median(values), 2), "min": min(values),
                        "max": max(values), "total": round(sum(values), 1), "n": len(values)}
    for window in ("start", "idle") + tuple(name for name, _ in RESTARTS):
        kinds: Dict[str, float] = {}
        for row in rows:
            for kind, count in row[f"{window}_by_kind"].items():
                kinds[kind] = kinds.get(kind, 0) + count
        scale = len(rows) * (hours if window == "idle" else 1) or 1
        out[f"{window}_by_kind_per_node"] = {k: round(v / scale, 2)
                                             for k, v in sorted(kinds.items())}
    return out


def print_tables(report: Dict[str, Any]) -> None:
    err = sys.stderr
    cluster = report["cluster"]
    print(f"\nfleet benchmark, {report['date']}: {cluster['pods']} pods, {cluster['nads']} NADs; "
          f"idle {report['idle_minutes_measured']} min; load average "
          f"{report['machine']['loadavg_at_start'][0]} at start, "
          f"{report['machine']['loadavg_at_end'][0]} at end", file=err)
    print("  c/s: LISTs read from the watch cache / from storage; st.obj: the objects etcd "
          "read for them;\n  rst: the 30 s after a restart; 410: after a restart that also "
          "compacted; 1st: s to the first LIST", file=err)
    head = " ".join(f"{title:>{width}}" for _key, title, width in COLUMNS)
    for label, fleet in report["fleets"].items():
        late = f"; NOT READY: {fleet['not_ready']}" if fleet["not_ready"] else ""
        print(f"\n  {label} ({fleet['summary']['nodes']} nodes, all ready in "
              f"{fleet['all_ready_s']} s{late})", file=err)
        print(f"  {'node':22} {head}", file=err)
        for row in fleet["per_node"]:
            cells = " ".join(f"{str(row.get(key)):>{width}}" for key, _t, width in COLUMNS)
            print(f"  {row['node']:22} {cells}", file=err)
    labels = list(report["fleets"])
    print("\n  per node: median (min-max) over each fleet", file=err)
    print(f"  {'figure':30}" + "".join(f"{label:>28}" for label in labels), file=err)
    for key, title in SUMMARY_ROWS:
        cells = []
        for label in labels:
            stats = report["fleets"][label]["summary"].get(key)
            cells.append(f"{stats['median']} ({stats['min']}-{stats['max']})" if stats else "-")
        print(f"  {title:30}" + "".join(f"{cell:>28}" for cell in cells), file=err)
    for window in ("start", "idle") + tuple(name for name, _ in RESTARTS):
        print(f"\n  {window}: requests by kind per node{' and hour' if window == 'idle' else ''}",
              file=err)
        for label in labels:
            kinds = report["fleets"][label]["summary"][f"{window}_by_kind_per_node"]
            print(f"    {label}: {json.dumps(kinds).replace(chr(34), '')}", file=err)
    for label in labels:
        first = report["fleets"][label]["per_node"][0]
        print(f"\n  {label}, {first['node']}: its requests (s into the window, kind, query)",
              file=err)
        for window, requests in first["trace"].items():
            for seconds, kind, query in requests[:8]:
                print(f"    {window:8} {seconds:7.2f}  {kind:16} "
                      f"{'&'.join(f'{k}={v}' for k, v in query.items())}", file=err)
            if len(requests) > 8:
                print(f"    {window:8} ... {len(requests) - 8} more", file=err)
