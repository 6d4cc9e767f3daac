"""Pydantic models of the API bodies, for the OpenAPI document only.

Requests are parsed by the core model's `from_dict` (one wire format for
HTTP and SQLite, one set of error messages); these models describe it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from pydantic import BaseModel, Field


class GpuRequestBody(BaseModel):
    count: int = Field(1, ge=1, description="number of distinct GPUs")
    fraction: Optional[float] = Field(None, gt=0, le=1, description="share of each GPU's memory")
    memory_mib: Optional[int] = Field(None, ge=1, description="MiB of each GPU (instead of fraction)")
    filters: List[str] = Field(default_factory=list, examples=[["device.name=*A100*", "device.memory>=16GiB"]])


class ClaimBody(BaseModel):
    requests: List[GpuRequestBody]
    policy: str = Field("binpack", description="binpack or spread")


class HolderBody(BaseModel):
    name: str = Field("", description="set by the server from the token's name when auth is on")
    pid: int = 0
    host: str = ""
    label: str = ""


class ClaimRequest(BaseModel):
    claim: ClaimBody
    holder: HolderBody = Field(default_factory=lambda: HolderBody.model_validate({}))
    wait_s: float = Field(0.0, ge=0, description="seconds to wait in the FIFO queue; 0 fails at once")
    ttl_s: float = Field(30.0, gt=0, description="the lease expires this long after the last heartbeat")


class TokenRequest(BaseModel):
    name: str
    admin: bool = False


class SliceBody(BaseModel):
    uuid: str
    memory_mib: int
    group: int


class LeaseBody(BaseModel):
    id: str
    holder: HolderBody
    devices: List[SliceBody]
    ttl_s: float
    created_at: float
    expires_at: float


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


MODELS = (ClaimRequest, TokenRequest, LeaseBody, ErrorBody)
REF = "#/components/schemas/{model}"


def body_schema(model: type) -> Dict[str, Any]:
    """`openapi_extra` that documents a JSON request body we parse ourselves."""
    ref = {"$ref": REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def component_schemas() -> Dict[str, Any]:
    """Every model above (nested ones included) as OpenAPI component schemas."""
    from pydantic.json_schema import models_json_schema

    _, top = models_json_schema([(m, "validation") for m in MODELS], ref_template=REF)
    schemas: Dict[str, Any] = top.get("$defs", {})
    return schemas
