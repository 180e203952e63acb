"""The local runtime: `boomerang up/down/demo` run a DisaggregatedDeployment as processes on one
machine, rendered by the operator's own functions (a second renderer of the resource, beside
the operator)."""
