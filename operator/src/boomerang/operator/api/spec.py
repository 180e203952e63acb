"""The spec's fields, assembled from its parts, and the values derived from them.

Why apart from the validated `DisaggregatedDeploymentSpec` (resource.py): the admission rules
(rules.py) read the fields' defaults from this class to build their CEL, and the spec's
validator runs those rules. Declaring the fields here and the validation on a subclass keeps
that a straight line (fields, then rules, then the validated resource) with no import cycle.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from boomerang.facts import default_handle_ttl
from boomerang.operator.api.durations import parse_duration
from boomerang.operator.api.fields import Model
from boomerang.operator.api.kvtransfer import KVTransferSpec
from boomerang.operator.api.router import RouterSpec
from boomerang.operator.api.serving import EfaSpec, EngineSpec, ModelSpec, PlacementSpec, RoleSpec


class SpecFields(Model):
    """The fields of `DisaggregatedDeploymentSpec`, without its cross-field rules."""

    model: ModelSpec = Field(description="The served model.")
    engine: EngineSpec = Field(
        default_factory=lambda: EngineSpec(), description="The engine image."
    )
    prefill: RoleSpec = Field(default_factory=lambda: RoleSpec(), description="The prefill role.")
    decode: RoleSpec = Field(default_factory=lambda: RoleSpec(), description="The decode role.")
    kv_transfer: KVTransferSpec = Field(
        default_factory=lambda: KVTransferSpec(), description="KV transfer between P and D."
    )
    router: RouterSpec = Field(default_factory=lambda: RouterSpec(), description="The router.")
    placement: PlacementSpec = Field(
        default_factory=lambda: PlacementSpec(), description="Network placement of P and D."
    )
    efa: EfaSpec = Field(
        default_factory=lambda: EfaSpec(),
        description="How the engine pods use AWS EFA (when the roles request interfaces).",
    )

    # Derived values: the one place each default that depends on other fields is computed.
    @property
    def uses_efa(self) -> bool:
        return self.prefill.resources.efa > 0 or self.decode.resources.efa > 0

    @property
    def backend(self) -> Literal["UCX", "LIBFABRIC"]:
        if self.kv_transfer.backend:
            return self.kv_transfer.backend
        return "LIBFABRIC" if self.uses_efa else "UCX"

    @property
    def router_ttl_seconds(self) -> float:
        if self.router.conversation_ttl is not None:
            return parse_duration(self.router.conversation_ttl)
        return float(default_handle_ttl(self.kv_transfer.decoder_blocks_ttl_s))
