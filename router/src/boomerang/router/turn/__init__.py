"""The turn wing: one client request from its arrival to its answer, in the order reuse needs.

`flow.py` finds the conversation, verifies and plans; `plan.py` (pure) orders the legs a
verified turn tries; `legs.py` and `serving.py` run them on the engines; `state.py` is a turn's
handle state machine; `reuse.py` (pure) decides hit, partial or rejected; `decode.py` answers
the client and carries a stream over (`migration.py`) when D dies; `affinity.py`,
`decode_first.py`, `degraded.py` and `cache_salt.py` are the small pure rules a turn applies.
It sits above the other wings and may import each of them; none imports it.
"""
