"""The learning wing: what the router learns of its engines' costs and of the turns' paths.

`costmodel.py` (pure) holds the three paths' costs, the SLO bounds and the cheapest allowed
path; `wls.py` the online weighted least squares that fits them; `paths.py` their I/O side
(bounds, path counts, gauges); `forgetting.py` when P's prefix cache has dropped a history.
Independent of the retention wing: neither imports the other.
"""
