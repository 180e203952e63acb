"""Agents' sessions replayed through the router: static against adaptive retention (`run`), the
workload generator, the APIs' replies and the retention frontier."""
