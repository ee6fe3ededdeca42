"""The CNI execution engine: our equivalent of libcni; knows nothing of Kubernetes or Multus.

Modules, one responsibility each:

* :mod:`.version`  -- spec versions (0.3.0 ... 1.1.0) and what each supports;
* :mod:`.names`    -- the container-ID, network-name and interface-name rules;
* :mod:`.args`     -- CNI_ARGS parsing and the delegate's CNI_ARGS;
* :mod:`.result`   -- result conversion between spec versions (dict based);
* :mod:`.invoke`   -- finding and executing plugin binaries;
* :mod:`.cache`    -- :class:`RuntimeConf` (one attachment) and libcni's ``results/`` cache
  files (``cniCacheV1``);
* :mod:`.conflist` -- :class:`NetworkConfigList` and the :class:`Engine` that runs
  ADD/DEL/CHECK/STATUS/GC over a list;
* :mod:`.passthru` -- the no-op plugin at the head of an auxiliary chain (its own program).
"""
