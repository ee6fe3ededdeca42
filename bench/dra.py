#!/usr/bin/env python3
"""What a DRA claim adds to an ADD: pods with and without a ResourceClaim, in alternation.

One daemon (bench.py's: socket-activated, the packaged launcher, the real shim and real
plugins, the fake API server); every pod gets eth0 and two secondary networks, of which
``bench-net2`` carries ``k8s.v1.cni.cncf.io/resourceName``, so every ADD asks the kubelet
checkpoint for devices (an empty one here). Half the pods also hold a ResourceClaim whose
allocation is a VF of this node's ResourceSlice plus a GPU of another driver (skipped): for
them the daemon reads the claim (one GET per ADD) and looks both devices up in its
ResourceSlice cache (one list per driver for the whole run); the VF's ID reaches bench-net2
as ``deviceID`` (the bridge plugin ignores it). Another node publishes devices of the same
names, as a cluster does.

ADDs alternate claim / no claim pod by pod, ``--rounds`` times ``--pods`` of each (then their
DELs, likewise), so that a slow minute on a shared machine lands on both. Printed: ADD and
DEL p50/p95 of each kind and their difference, the API requests per ADD by kind (watches
excluded) and the ResourceSlice lists, the first claim ADD of a fresh cache, and the machine's
load. One JSON line on stdout, a table on stderr; everything made is removed. Needs root.

    .venv/bin/python bench/dra.py [--pods 30] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any, Dict, List, Optional, Sequence

import phases
import rig  # puts tests/ on the path
import stats
from kubedra import gpu_device, network_device

RESOURCE = "example.com/sriov_vf"
SRIOV, GPU = "sriov.example.com", "gpu.example.com"
VFS = 64
KINDS = ("claim", "plain")


def prepare(scratch: rig.Scratch, kube_api) -> dict:
    """The daemon config, bench-net2 with a resourceName, this node's and another's slices."""
    config = rig.daemon_config(scratch, kube_api, "verbose")
    net2 = kube_api._nads[(rig.NAMESPACE, rig.SECONDARY[1])]["spec"]["config"]
    kube_api.add_nad(rig.NAMESPACE, rig.SECONDARY[1], net2,
                     annotations={"k8s.v1.cni.cncf.io/resourceName": RESOURCE})
    kubelet = os.path.join(scratch.workdir, "kubelet")
    os.makedirs(os.path.join(kubelet, "device-plugins"))
    with open(os.path.join(kubelet, "device-plugins", "kubelet_internal_checkpoint"), "w") as f:
        json.dump({"Data": {"PodDeviceEntries": [], "RegisteredDevices": {}}, "Checksum": 0}, f)
    for node, base in ((kube_api.node, 3), ("node-b", 0x81)):
        kube_api.add_resource_slice(f"{node}-sriov", node=node, driver=SRIOV, pool="pool-0",
                                    devices=[network_device(f"vf-{i}",
                                                            f"0000:{base:02x}:{i // 8:02x}.{i % 8}",
                                                            RESOURCE) for i in range(VFS)])
        kube_api.add_resource_slice(f"{node}-gpu", node=node, driver=GPU, pool="pool-0",
                                    devices=[gpu_device(f"gpu-{i}") for i in range(8)])
    config.update(kubeletRootDir=kubelet, deviceInfoDir=os.path.join(scratch.workdir, "devinfo"))
    return config


def make_pod(scratch: rig.Scratch, kube_api, kind: str, number: int) -> rig.Pod:
    netns_name, netns_path = scratch.netns()
    pod = rig.Pod(f"dra-{scratch.tag}-{kind}-{number}", os.urandom(16).hex(), netns_name,
                    netns_path)
    status: Dict[str, Any] = {}
    if kind == "claim":
        claim = f"{pod.name}-net"
        kube_api.add_resource_claim(rig.NAMESPACE, claim, [
            ("vf", SRIOV, "pool-0", f"vf-{number % VFS}"), ("gpu", GPU, "pool-0", "gpu-0")])
        status = {"resourceClaimStatuses": [{"name": "net", "resourceClaimName": claim}]}
    created = kube_api.add_pod(rig.NAMESPACE, pod.name, status=status, annotations={
        rig.NETWORKS_ANNOTATION: ",".join(rig.SECONDARY)})
    pod.uid = created["metadata"]["uid"]
    return pod


def requests_by_kind(kube_api, start: int) -> Dict[str, int]:
    kinds: Dict[str, int] = {}
    for method, path, query in list(kube_api.requests)[start:]:
        if query.get("watch", "").lower() in ("true", "1") or "/events" in path:
            continue  # events go out asynchronously: counted per pod elsewhere (bench.py)
        if "resource.k8s.io" in path:
            kind = f"{method} " + ("resourceclaim" if "resourceclaims" in path
                                   else "resourceslices")
        else:
            kind = phases.request_kind(method, path)
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def one_round(daemon, kube_api, scratch: rig.Scratch, pods: int, start_number: int,
              figures: Dict[str, Dict[str, List[float]]], requests: Dict[str, Dict[str, int]],
              failures: List[str]) -> None:
    conf = daemon.shim_conf()
    made = {kind: [make_pod(scratch, kube_api, kind, start_number + i) for i in range(pods)]
            for kind in KINDS}
    try:
        for command in ("ADD", "DEL"):
            for i in range(pods):
                for kind in (KINDS if i % 2 == 0 else KINDS[::-1]):
                    pod = made[kind][i]
                    before = len(kube_api.requests)
                    ms, out = stats.timed(lambda: rig.shim(command, conf, pod))
                    if rig.check(out, f"{command} {pod.name}", failures):
                        figures[kind][command].append(ms)
                    if command == "ADD":
                        for key, count in requests_by_kind(kube_api, before).items():
                            requests[kind][key] = requests[kind].get(key, 0) + count
    finally:
        for kind in KINDS:
            for pod in made[kind]:
                remove_pod(scratch, kube_api, kind, pod)


def remove_pod(scratch: rig.Scratch, kube_api, kind: str, pod: rig.Pod) -> None:
    scratch.drop_netns(pod.netns_name)
    kube_api.delete_pod(rig.NAMESPACE, pod.name)
    if kind == "claim":
        kube_api.delete_resource_claim(rig.NAMESPACE, f"{pod.name}-net")


def first_claim_add(scratch: rig.Scratch, kube_api, config: dict,
                    failures: List[str]) -> Optional[float]:
    """A fresh daemon (empty ResourceSlice cache), warmed by one plain pod: its first claim
    ADD, which also lists the slices of both drivers."""
    daemon = scratch.daemon(config, "first").start(activate=True)
    try:
        rig.wait_ready(daemon)
        times = {}
        for kind in ("plain", "claim"):
            pod = make_pod(scratch, kube_api, kind, 10_000)
            try:
                ms, out = stats.timed(lambda: rig.shim("ADD", daemon.shim_conf(), pod))
                if rig.check(out, f"first {kind} ADD", failures):
                    times[kind] = ms
                rig.shim("DEL", daemon.shim_conf(), pod)
            finally:
                remove_pod(scratch, kube_api, kind, pod)
        return round(times["claim"], 1) if "claim" in times else None
    finally:
        daemon.cleanup()


def lookup_ms(repeats: int = 200) -> Dict[str, Any]:
    """The lookup alone, in this process: ``KubeClient.pod_dra_devices`` for a pod with one
    claim (a VF and a GPU) against its own fake API server, with the ResourceSlice cache warm
    (one claim GET) and fresh (plus one list per driver)."""
    import tempfile
    import time

    from kubeapi import FakeKubeAPI
    from multusd.kube import draclaims
    from multusd.kube.client import KubeClient
    from multusd.kube.objects import pod_from_object

    workdir = tempfile.mkdtemp(prefix="multusd-bench-dra-")
    api = FakeKubeAPI(workdir).start()
    client = None
    try:
        for driver, devices in ((SRIOV, [network_device(f"vf-{i}", f"0000:03:{i // 8:02x}.{i % 8}",
                                                        RESOURCE) for i in range(VFS)]),
                                (GPU, [gpu_device(f"gpu-{i}") for i in range(8)])):
            api.add_resource_slice(driver, node=api.node, driver=driver, pool="pool-0",
                                   devices=devices)
        api.add_resource_claim(rig.NAMESPACE, "c", [("vf", SRIOV, "pool-0", "vf-1"),
                                                      ("gpu", GPU, "pool-0", "gpu-0")])
        pod = pod_from_object(api.add_pod(rig.NAMESPACE, "p", status={
            "resourceClaimStatuses": [{"name": "net", "resourceClaimName": "c"}]}))
        client = KubeClient(api.kubeconfig_path, api.node)
        client.pod_dra_devices(pod)  # connection made
        figures = {}
        for label, fresh in (("warm_cache", False), ("fresh_cache", True)):
            samples = []
            for _ in range(repeats if not fresh else repeats // 4):
                if fresh:
                    client._dra_slices = draclaims.SliceCache()  # noqa: SLF001 - measured
                started = time.perf_counter()
                client.pod_dra_devices(pod, deadline=time.monotonic() + 10)
                samples.append((time.perf_counter() - started) * 1000)
            figures[label] = stats.percentiles(samples)
        return figures
    finally:
        if client is not None:
            client.stop()
        api.stop()
        import shutil
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=30, help="pods of each kind per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/dra.py needs root (network namespaces, bridges)", file=sys.stderr)
        return 2
    scratch = rig.Scratch()
    failures: List[str] = []
    report: Optional[Dict[str, Any]] = None
    try:
        kube_api = rig.start_kube_api(scratch)
        config = prepare(scratch, kube_api)
        load_start = stats.load_average()
        first = first_claim_add(scratch, kube_api, config, failures)
        daemon = scratch.daemon(config, "dra").start(activate=True)
        rig.wait_ready(daemon)
        one_round(daemon, kube_api, scratch, 2, 20_000, {k: {"ADD": [], "DEL": []}
                                                         for k in KINDS},
                  {k: {} for k in KINDS}, failures)  # warm-up: slice cache, connections
        lists_before = len(kube_api.dra_requests("resourceslices"))
        figures = {kind: {"ADD": [], "DEL": []} for kind in KINDS}
        requests: Dict[str, Dict[str, int]] = {kind: {} for kind in KINDS}
        medians: Dict[str, List[float]] = {"claim": [], "plain": []}
        for number in range(args.rounds):
            before = {kind: len(figures[kind]["ADD"]) for kind in KINDS}
            one_round(daemon, kube_api, scratch, args.pods, number * args.pods, figures,
                      requests, failures)
            for kind in KINDS:
                medians[kind].append(statistics.median(figures[kind]["ADD"][before[kind]:]))
            stats.log(f"round {number + 1}: ADD p50 claim {medians['claim'][-1]:.1f} ms, "
                      f"plain {medians['plain'][-1]:.1f} ms")
        adds = {kind: len(figures[kind]["ADD"]) for kind in KINDS}
        report = {
            "pods_per_kind": adds, "rounds": args.rounds,
            "add_ms": {k: stats.percentiles(figures[k]["ADD"]) for k in KINDS},
            "del_ms": {k: stats.percentiles(figures[k]["DEL"]) for k in KINDS},
            "add_p50_round_medians": {k: [round(m, 1) for m in medians[k]] for k in KINDS},
            "claim_minus_plain_add_p50_ms": round(
                statistics.median(figures["claim"]["ADD"])
                - statistics.median(figures["plain"]["ADD"]), 1),
            "api_requests_per_add": {k: {key: round(v / max(adds[k], 1), 2)
                                         for key, v in sorted(requests[k].items())}
                                     for k in KINDS},
            "resourceslice_lists_during_rounds":
                len(kube_api.dra_requests("resourceslices")) - lists_before,
            "first_claim_add_fresh_cache_ms": first,
            "lookup_in_process_ms": lookup_ms(),
            "machine": stats.machine(), "loadavg_start": load_start,
            "loadavg_end": stats.load_average(), "failures": failures,
        }
    finally:
        scratch.cleanup()
    if report is None:
        return 1
    print(json.dumps(report), flush=True)
    print_table(report)
    return 1 if failures else 0


def print_table(report: Dict[str, Any]) -> None:
    out = sys.stderr
    print(f"DRA claim cost per ADD ({report['pods_per_kind']['claim']} pods of each kind, "
          f"{report['rounds']} rounds; load {report['loadavg_start']} -> "
          f"{report['loadavg_end']})", file=out)
    for kind in KINDS:
        add, dele = report["add_ms"][kind], report["del_ms"][kind]
        print(f"  {kind:<6} ADD p50 {add.get('p50')} p95 {add.get('p95')} ms   "
              f"DEL p50 {dele.get('p50')} ms   round medians "
              f"{report['add_p50_round_medians'][kind]}", file=out)
        print(f"         API requests per ADD: {report['api_requests_per_add'][kind]}", file=out)
    print(f"  claim - plain ADD p50: {report['claim_minus_plain_add_p50_ms']} ms; "
          f"ResourceSlice lists during the rounds: "
          f"{report['resourceslice_lists_during_rounds']}; first claim ADD of a fresh "
          f"cache: {report['first_claim_add_fresh_cache_ms']} ms", file=out)
    lookup = report["lookup_in_process_ms"]
    print(f"  the lookup alone (KubeClient.pod_dra_devices, in process): p50 "
          f"{lookup['warm_cache'].get('p50')} ms with the slice cache warm, "
          f"{lookup['fresh_cache'].get('p50')} ms fresh", file=out)


if __name__ == "__main__":
    sys.exit(main())
