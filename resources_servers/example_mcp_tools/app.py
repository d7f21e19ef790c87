"""example_mcp_tools: a small warehouse whose tools are served over HTTP and over MCP, with state per rollout.

Each rollout gets its own stock (item -> quantity), seeded by `/seed_session` from the row's `initial_stock`.
The model lists, checks, ships and restocks items with tools, then tells the user the quantity of one item.

What it teaches:

* `expose_tools_over_mcp: true` (in `configs/example_mcp_tools.yaml`): the same tool routes are also served at
  `/mcp` for agents that speak MCP. Nothing in the handlers changes. `/seed_session` answers gain an `mcp` entry
  with the endpoint and a session token; an MCP `tools/call` with that token runs the handler with the rollout's
  session, so HTTP and MCP tool calls of one rollout share its stock.
* `mcp_allowed_tools_for_session(seed_body)`: a row may limit its rollout to some tools (`allowed_tools`, e.g. a
  read-only question); over MCP the session then lists and calls only those.
* Tool errors the model can read: an unknown item is HTTP 404, shipping more than is in stock HTTP 409. Over MCP
  they become tool errors `HTTP 409 from POST /ship: ...`.
* A verifier that checks the work, not the words alone: the rollout's final stock must be the row's
  `expected_stock`, and the final answer must state the quantity of `report_item` that a tool returned (so the
  model had to call a tool and use its output). MCP clients name tools `mcp__<server>__<tool>`; `/verify` sees
  them as the bare names.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar, Optional

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    ReverifyMode,
    SimpleResourcesServer,
)
from nemo_gym.server_utils import SESSION_ID_KEY

TOOL_NAMES = ("list_items", "check_stock", "ship", "restock")


class ExampleMCPToolsResourcesServerConfig(BaseResourcesServerConfig):
    # Verify reads the stock the rollout left in this process, so a stored rollout cannot be re-scored alone.
    REVERIFY_MODE: ClassVar[ReverifyMode] = ReverifyMode.UNSUPPORTED


# ------------------------------------------------------------------------------------------------ seed + tools


class WarehouseSeedSessionRequest(BaseSeedSessionRequest):
    """`/seed_session` gets the whole row; these are the fields it reads."""

    initial_stock: dict[str, int] = Field(default_factory=dict)
    allowed_tools: Optional[list[str]] = None  # read by mcp_allowed_tools_for_session (the raw row)


class ListItemsRequest(BaseModel):
    pass


class ListItemsResponse(BaseModel):
    items: dict[str, int]


class CheckStockRequest(BaseModel):
    item: str = Field(description="The item's name, e.g. 'apples'.")


class CheckStockResponse(BaseModel):
    item: str
    quantity: int


class MoveRequest(BaseModel):
    item: str = Field(description="The item's name, e.g. 'apples'.")
    quantity: int = Field(ge=1, description="How many (at least 1).")


class ShipResponse(BaseModel):
    item: str
    shipped: int
    remaining: int


class RestockResponse(BaseModel):
    item: str
    added: int
    quantity: int


# ------------------------------------------------------------------------------------------------------ verify


class WarehouseVerifyRequest(BaseVerifyRequest):
    expected_stock: dict[str, int]
    report_item: str


class WarehouseVerifyResponse(WarehouseVerifyRequest, BaseVerifyResponse):
    final_stock: Optional[dict[str, int]]  # None: the rollout was never seeded (or already verified)
    stock_ok: bool
    tool_calls: list[str]  # the names of the function calls the model made, in order (bare names)
    reported_quantity: Optional[int]  # report_item's quantity as the last tool output that gave it said
    answer_ok: bool  # reported_quantity is the true quantity and the final answer states it


class ExampleMCPToolsResourcesServer(SimpleResourcesServer):
    config: ExampleMCPToolsResourcesServerConfig
    # session id -> that rollout's stock
    stock_by_session: dict[str, dict[str, int]] = Field(default_factory=dict)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/list_items")(self.list_items)
        app.post("/check_stock")(self.check_stock)
        app.post("/ship")(self.ship)
        app.post("/restock")(self.restock)
        return app

    def mcp_allowed_tools_for_session(self, seed_body: dict) -> Optional[list[str]]:
        """A row's `allowed_tools` limits what its rollout may call over MCP (None: every tool)."""
        allowed = seed_body.get("allowed_tools")
        return [name for name in allowed if name in TOOL_NAMES] if isinstance(allowed, list) else None

    async def seed_session(self, request: Request, body: WarehouseSeedSessionRequest) -> BaseSeedSessionResponse:
        stock = {item.strip().lower(): quantity for item, quantity in body.initial_stock.items()}
        self.stock_by_session[request.session[SESSION_ID_KEY]] = stock
        return BaseSeedSessionResponse()

    def _stock(self, request: Request) -> dict[str, int]:
        return self.stock_by_session.setdefault(request.session[SESSION_ID_KEY], {})

    def _known(self, stock: dict[str, int], item: str) -> str:
        name = item.strip().lower()
        if name not in stock:
            known = ", ".join(sorted(stock)) or "nothing"
            raise HTTPException(404, f"no item named {item!r} in this warehouse; it holds: {known}")
        return name

    async def list_items(self, request: Request, body: ListItemsRequest) -> ListItemsResponse:
        """List every item in the warehouse with its quantity."""
        return ListItemsResponse(items=dict(sorted(self._stock(request).items())))

    async def check_stock(self, request: Request, body: CheckStockRequest) -> CheckStockResponse:
        """How many of one item are in stock."""
        stock = self._stock(request)
        item = self._known(stock, body.item)
        return CheckStockResponse(item=item, quantity=stock[item])

    async def ship(self, request: Request, body: MoveRequest) -> ShipResponse:
        """Ship some of an item out of the warehouse (fails if fewer are in stock)."""
        stock = self._stock(request)
        item = self._known(stock, body.item)
        if body.quantity > stock[item]:
            raise HTTPException(409, f"only {stock[item]} {item} in stock; ship at most {stock[item]}")
        stock[item] -= body.quantity
        return ShipResponse(item=item, shipped=body.quantity, remaining=stock[item])

    async def restock(self, request: Request, body: MoveRequest) -> RestockResponse:
        """Add some of an item to the warehouse (a new item is created)."""
        stock = self._stock(request)
        item = body.item.strip().lower()
        stock[item] = stock.get(item, 0) + body.quantity
        return RestockResponse(item=item, added=body.quantity, quantity=stock[item])

    async def verify(self, request: Request, body: WarehouseVerifyRequest) -> WarehouseVerifyResponse:
        final_stock = self.stock_by_session.pop(request.session[SESSION_ID_KEY], None)
        output = [_as_dict(item) for item in body.response.output]
        tool_calls = [item.get("name", "") for item in output if item.get("type") == "function_call"]
        reported = _reported_quantity(output, body.report_item.lower())
        true_quantity = None if final_stock is None else final_stock.get(body.report_item.lower())
        answer_ok = (
            reported is not None
            and reported == true_quantity
            and _states_number(_final_answer(output), reported)
        )
        stock_ok = final_stock is not None and final_stock == body.expected_stock
        return WarehouseVerifyResponse(
            **body.model_dump(),
            reward=1.0 if stock_ok and answer_ok else 0.0,
            final_stock=final_stock,
            stock_ok=stock_ok,
            tool_calls=tool_calls,
            reported_quantity=reported,
            answer_ok=answer_ok,
        )


def _as_dict(item: Any) -> dict:
    return item if isinstance(item, dict) else item.model_dump(mode="json")


def _reported_quantity(output: list[dict], item: str) -> Optional[int]:
    """The quantity of `item` in the last tool output that gave one (`quantity` of check_stock and restock,
    `remaining` of ship, `items` of list_items)."""
    reported = None
    for entry in output:
        if entry.get("type") != "function_call_output":
            continue
        try:
            value = json.loads(entry.get("output") or "")
        except (TypeError, ValueError):
            continue
        if not isinstance(value, dict):
            continue
        if value.get("item") == item:
            quantity = value.get("remaining", value.get("quantity"))
            if isinstance(quantity, int):
                reported = quantity
        elif isinstance(value.get("items"), dict) and isinstance(value["items"].get(item), int):
            reported = value["items"][item]
    return reported


def _final_answer(output: list[dict]) -> str:
    """The text of the model's last assistant message ("" if it ended on a tool call)."""
    for entry in reversed(output):
        if entry.get("type") == "function_call":
            return ""
        if entry.get("type") == "message" and entry.get("role") == "assistant":
            content = entry.get("content")
            if isinstance(content, str):
                return content
            return " ".join(part.get("text", "") for part in content or [] if isinstance(part, dict))
    return ""


def _states_number(text: str, number: int) -> bool:
    """Whether `number` appears in `text` as a whole number ("8 left", not "18")."""
    return str(number) in re.findall(r"\d+", text)


if __name__ == "__main__":
    ExampleMCPToolsResourcesServer.run_webserver()
