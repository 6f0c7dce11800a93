"""The two storage engines, one package each, with the same module name for
the same branch in both. An engine imports only the shared core
(:mod:`awa_trio.maintenance`) and the driver, never the other engine;
:mod:`awa_trio.registry` alone knows which engine's set runs when."""
