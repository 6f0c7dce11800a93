"""Maintenance branches, one module each: defaults, ``run_once(ctx)``, SQL."""
