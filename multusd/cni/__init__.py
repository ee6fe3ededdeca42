"""The CNI execution engine: our equivalent of libcni.

It has no Kubernetes client and reads no Multus config; what it knows of them is the pod
identity a delegate gets in CNI_ARGS (:mod:`.args`) and Multus's default cache directory
(:data:`multusd.DEFAULT_CNI_DIR`). Modules, one responsibility each:

* :mod:`.version`  -- spec versions parsed and compared, and what a config's version allows;
* :mod:`.result`   -- results converted between versions, failing with CNI errors, queried,
  and their default routes taken out or added (the versions and the conversion themselves
  are :mod:`multusd`'s, shared with the shim);
* :mod:`.names`    -- the container-ID, network-name and interface-name rules;
* :mod:`.args`     -- CNI_ARGS parsing and the delegate's CNI_ARGS;
* :mod:`.invoke`   -- finding and executing plugin binaries;
* :mod:`.resultcache` -- :class:`RuntimeConf` (one attachment) and libcni's ``results/`` cache
  files (``cniCacheV1``);
* :mod:`.conflist` -- :class:`NetworkConfigList` and the :class:`Engine` that runs
  ADD/DEL/CHECK/STATUS/GC over a list;
* :mod:`.passthru` -- the no-op plugin at the head of an auxiliary chain (its own program).
"""
