"""multusd.core.unreleasedwarning: an unreleased sandbox said once, in the journal, as an Event."""

from __future__ import annotations

import logging

from multusd.core import unreleased, unreleasedwarning
from failingdel import FAILED, del_request

LOG = logging.LoggerAdapter(logging.getLogger("test"), {})


def test_an_announcement_waits_for_the_pod_cache_unless_told_not_to(tmp_path, kube_api, caplog):
    from multusd.kube.client import KubeClient

    cni_dir = str(tmp_path)
    mark = unreleased.record(cni_dir, del_request(cni_dir), FAILED, "m", window=1, now=1.0)
    unsynced = KubeClient(kube_api.kubeconfig_path, kube_api.node, request_timeout=5.0)
    with caplog.at_level(logging.WARNING):
        assert not unreleasedwarning.announce(unsynced, mark, LOG)  # its Event needs the cache
        assert not caplog.records
        assert unreleasedwarning.announce(unsynced, mark, LOG, without_cache=True)
        assert unreleasedwarning.announce(None, mark, LOG)  # no Kubernetes: nothing to wait for
    assert len([r for r in caplog.records if "has failed since" in r.getMessage()]) == 2
