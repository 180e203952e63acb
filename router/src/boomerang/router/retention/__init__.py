"""The retention wing: how long D keeps a conversation's blocks, and how the router says so.

`policy.py` (pure) learns the gaps between turns and bounds retention; `leases.py` files a
lease per handle, renews and ends it; `claims.py` has D confirm a lease before P may read it;
`lease_client.py` calls D's lease API; `hooks.py` are what the turn calls. A client's cache
hint is parsed with the APIs (`apis/hints.py`); its effect on retention is here.
"""
