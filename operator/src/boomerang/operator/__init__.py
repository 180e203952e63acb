"""The Boomerang operator: reconciles `DisaggregatedDeployment` into engines and a router."""
