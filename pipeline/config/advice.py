"""Advice that stops nothing: what `validate` warns of in a config that runs."""

from __future__ import annotations

from pipeline.config.build import built
from pipeline.config.compose import Session
from pipeline.core.checks import Problem
from pipeline.core.model import ModelGeometry

PREFIX_TOKENS = 128 * 1024
"""The prefix a page size is judged at: a long context's (no model here states its own)."""
MOST_OBJECTS_PER_PREFIX = 100_000
"""More store objects than this for one prefix is a warning: a file store makes a file of
each, Mooncake a key, and each is written, listed and checked on its own."""
SHIPPED_PAGE = 64
"""The page size of the shipped full-size models, shown as the way out."""


def page_warnings(session: Session) -> list[Problem]:
    """`model.page_size` so small that one long prefix makes too many store objects."""
    model = built(session.cfg.model, ModelGeometry, "model")
    if not isinstance(model.obj, ModelGeometry) or "model.page_size" in model.stand_ins:
        return []
    page = model.obj.page_size
    objects = -(-PREFIX_TOKENS // page)
    if objects <= MOST_OBJECTS_PER_PREFIX:
        return []
    message = (
        f"model.page_size={page} makes {objects} store objects per prefix of {PREFIX_TOKENS} "
        "tokens (one per page): a store writes, lists and checks each one; raise "
        f"model.page_size ({SHIPPED_PAGE} makes {PREFIX_TOKENS // SHIPPED_PAGE})"
    )
    return [Problem("model.page_size", message)]
