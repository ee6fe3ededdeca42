"""The CNI execution engine: our equivalent of libcni (plugin exec, conflists, results, cache).

Modules, one responsibility each:

* :mod:`.version`  -- spec versions (0.3.0 ... 1.1.0) and what each supports;
* :mod:`.args`     -- CNI_ARGS parsing and the delegate's CNI_ARGS;
* :mod:`.result`   -- result conversion between spec versions (dict based);
* :mod:`.invoke`   -- finding and executing plugin binaries (the only place that forks);
* :mod:`.cache`    -- libcni's ``results/`` cache files (``cniCacheV1``);
* :mod:`.conflist` -- :class:`NetworkConfigList`, :class:`RuntimeConf` and the
  :class:`Engine` that runs ADD/DEL/CHECK/STATUS/GC over a list.
"""
