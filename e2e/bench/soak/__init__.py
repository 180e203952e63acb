"""Hours of traffic with faults through two router replicas (`run`): lost turns, recovery and
leaks (docs/reliability.md)."""
