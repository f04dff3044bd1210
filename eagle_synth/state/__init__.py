"""A campaign's state in Redis: the one contract the producer, the workers and the tools share.

`keys` names every Redis key and counter; `campaign` is the campaign's record of
what was enqueued and what is done (the source of truth for exactly once, docs/reliability.md);
the other modules each own one kind of state beside it.
"""
