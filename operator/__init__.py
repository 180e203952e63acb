"""The Boomerang operator: reconciles `DisaggregatedDeployment` into P/D StatefulSets and a router."""
