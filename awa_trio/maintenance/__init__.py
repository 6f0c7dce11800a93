"""The engine-neutral core both storage engines' branches are written against:
the drain loop and tick budget, the rescue outcome and its side effects,
and the constants every engine shares. Nothing here knows an engine's
tables."""
