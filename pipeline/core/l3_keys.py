"""Page keys from a serving engine's own block hashes, so it keys L3 pages as it keys its
prefix cache: SGLang's hex strings, vLLM's ints or bytes.

An engine's block hash already names its whole prefix (each one folds in its parent's), so a
key is that hash alone, tagged with its type (the int 5, the string "5" and the bytes b"5"
are different hashes) and bound to the namespace, in the form `prefix_keys` makes: 32 hex
digits. BLAKE2b, never Python's `hash()`, so every process makes the same key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

BlockHash = str | int | bytes
"""What engines hash a block to: SGLang a hex string, vLLM an int or (newer) bytes."""
KEY_BYTES = 16
"""32 hex digits: `pipeline.core.l3.KEY`."""


class PageKey(str):
    """A page key that remembers what the engine said of its page: its block hash, the
    block hash before it (None: the first page, or not given) and its token ids (None: not
    given), so KV events name the page as the engine's own events do. Compares, hashes and
    names objects as the plain key."""

    block_hash: BlockHash
    parent: BlockHash | None
    token_ids: tuple[int, ...] | None

    def __new__(
        cls,
        key: str,
        block_hash: BlockHash,
        parent: BlockHash | None = None,
        token_ids: tuple[int, ...] | None = None,
    ) -> PageKey:
        made = super().__new__(cls, key)
        made.block_hash, made.parent, made.token_ids = block_hash, parent, token_ids
        return made

    def __getnewargs__(self) -> tuple[str, BlockHash, BlockHash | None, tuple[int, ...] | None]:  # type: ignore[override]
        return str(self), self.block_hash, self.parent, self.token_ids


def block_keys(
    hashes: Sequence[BlockHash],
    space: str,
    *,
    parent: BlockHash | None = None,
    token_ids: Sequence[int] | None = None,
    page_tokens: int = 1,
) -> list[PageKey]:
    """One page key per block hash, in order, each remembering its hash, the one before it
    (`parent` before the first) and its `page_tokens` of `token_ids` (every page's, in order,
    where given); ValueError where `hashes` is not a list of them (one bare hash included),
    naming the first that is not a non-empty str, bytes or int (a bool is not a hash), or
    where `token_ids` are not `page_tokens` a page."""
    if isinstance(hashes, str | bytes | bytearray):  # a str iterates as its characters
        raise ValueError(
            f"hashes: one {type(hashes).__name__}, not a list: pass a list of hashes, one per "
            "page (page_keys(job, [block_hash]) for one page)"
        )
    if not isinstance(hashes, Sequence):
        raise ValueError(
            "hashes: a list of block hashes (SGLang's hex strings, vLLM's ints or bytes), one "
            f"per page, got {type(hashes).__name__}"
        )
    pages = _page_tokens(token_ids, len(hashes), page_tokens)
    if parent is not None:
        _tagged(parent, "parent")  # the same checks as a hash's
    parents = [parent, *hashes[:-1]]
    return [PageKey(block_key(h, i, space), h, parents[i], pages[i]) for i, h in enumerate(hashes)]


def _page_tokens(
    token_ids: Sequence[int] | None, num_pages: int, page_tokens: int
) -> list[tuple[int, ...] | None]:
    """Each page's token ids (None each where none are given)."""
    if token_ids is None:
        return [None] * num_pages
    if isinstance(token_ids, str | bytes) or len(token_ids) != num_pages * page_tokens:
        given = len(token_ids) if isinstance(token_ids, Sequence) else type(token_ids).__name__
        raise ValueError(
            f"token_ids: {given} for {num_pages} pages: pass every page's token ids in order, "
            f"{page_tokens} a page ({num_pages * page_tokens} in all), or none"
        )
    ids = [int(t) for t in token_ids]
    return [tuple(ids[i * page_tokens : (i + 1) * page_tokens]) for i in range(num_pages)]


def key_list(keys: object) -> list[str]:
    """`keys` as a list; ValueError unless they are a list (or tuple) of keys: not one key,
    not None (each key is then `l3.check_keys`'s to check)."""
    if isinstance(keys, str | bytes):
        raise ValueError(
            f"keys: one {'str' if isinstance(keys, str) else 'bytes'}, not a list: pass [key], "
            "or a list of page keys"
        )
    if not isinstance(keys, Sequence):
        raise ValueError(
            "keys: a list of page keys (pipeline.page_keys(job, hashes), or Engine.l3_keys / "
            f"view.keys of token ids), got {type(keys).__name__}"
        )
    return list(keys)


def block_key(block_hash: BlockHash, index: int, space: str) -> str:
    tag, data = _tagged(block_hash, f"hashes[{index}]")
    digest = hashlib.blake2b(tag + data, digest_size=KEY_BYTES, person=b"hicache-page-key")
    digest.update(space.encode())  # after the hash: another namespace, another key
    return digest.hexdigest()


def _tagged(block_hash: object, name: str) -> tuple[bytes, bytes]:
    """(type tag, the hash's bytes) of one block hash (`name`: where the caller gave it)."""
    if isinstance(block_hash, bool):
        raise ValueError(f"{name}={block_hash!r}: a bool is not a block hash")
    if isinstance(block_hash, int):
        width = block_hash.bit_length() // 8 + 1  # room for the sign bit
        return b"i", len_prefixed(block_hash.to_bytes(width, "big", signed=True))
    if isinstance(block_hash, str | bytes) and len(block_hash) == 0:
        raise ValueError(f"{name}: an empty {type(block_hash).__name__} names no block")
    if isinstance(block_hash, str):
        return b"s", len_prefixed(block_hash.encode())
    if isinstance(block_hash, bytes):
        return b"b", len_prefixed(block_hash)
    raise ValueError(
        f"{name}: a {type(block_hash).__name__} is not a block hash (str, bytes or "
        "int: SGLang's hex strings, vLLM's ints or bytes)"
    )


def len_prefixed(data: bytes) -> bytes:
    """`data` after its length, so no hash's bytes run on into the namespace's."""
    return len(data).to_bytes(8, "little") + data


def object_keys(space: str, names: list[str]) -> list[str]:
    """The page keys of those of `names` that lie in `space`, as `PageObject.name` makes a name
    (space/<first 2 digits>/<32 digits><share>, any share)."""
    first = f"{space}/"
    at = len(first) + 3  # after space/ab/
    return [name[at : at + 2 * KEY_BYTES] for name in names if name.startswith(first)]
