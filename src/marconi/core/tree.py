"""A radix tree over token arrays: structure only, no policy, no clock, no torch.

Edges are stored as the raw bytes of int32 token arrays, so comparing an edge with
the input is one `bytes ==` (a memcmp in C), and children are keyed by the 4 bytes of
their first token. Only on a mismatch does numpy find the first differing token.

A node `v` stands for the prefix spelled from the root to the end of its edge;
`v.depth` is that prefix's length. What a node holds (`kv`, `state`) is opaque here:
the cache decides what it means and how it is split or joined.

Namespaces (`salt`): each salt has a root of its own, so sequences under different salts
never share a node; the default namespace (`None`) is `tree.root`. A root has no edge and
no parent; an emptied namespace's root is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

TOKEN_BYTES = 4  # edges hold int32 tokens
Salt = str | bytes | int | None  # a cache-key namespace (LoRA adapter, tenant, media hash)


def check_salt(salt: object) -> Salt:
    """`salt` itself, or ValueError unless it is None, a str, bytes or an int."""
    if salt is None or (isinstance(salt, str | bytes | int) and not isinstance(salt, bool)):
        return salt
    raise ValueError(f"salt must be None, a str, bytes or an int, got {type(salt).__name__}")


class Node:
    """One radix-tree node; `key` is its edge, `depth` the length of its whole prefix."""

    __slots__ = ("children", "depth", "has_state", "id", "key", "kv", "parent", "pins", "state")

    def __init__(self, key: bytes, parent: Node | None, node_id: int) -> None:
        self.key = key  # edge tokens, int32 bytes
        self.parent = parent
        self.children: dict[bytes, Node] = {}  # first token's 4 bytes -> child
        self.depth: int = (parent.depth if parent else 0) + len(key) // TOKEN_BYTES
        self.has_state = False  # holds an SSM checkpoint after `depth` tokens
        self.state: Any = None  # the engine's handle for that checkpoint
        self.kv: Any = None  # the engine's handle for this edge's KV
        self.pins = 0  # running requests using this node
        self.id = node_id  # creation order: deterministic tie-breaks

    @property
    def edge_len(self) -> int:
        return len(self.key) // TOKEN_BYTES

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def tokens(self) -> np.ndarray:
        """This edge's tokens as a read-only int32 array (no copy)."""
        return np.frombuffer(self.key, dtype=np.int32)

    def __repr__(self) -> str:
        state = " state" if self.has_state else ""
        return f"Node(id={self.id}, depth={self.depth}, edge={self.edge_len}{state})"


@dataclass(frozen=True, slots=True)
class Match:
    """Where an input sits in the tree.

    ```
    | path[0] | path[1] | ... | path[-1] | partial (first `offset` tokens) |
    0                                    node.depth                  length
    ```
    `path` holds the fully matched nodes, root excluded; `partial` is the node whose
    edge the input leaves (or ends) in the middle of, if any.
    """

    path: tuple[Node, ...]
    partial: Node | None
    offset: int  # tokens of `partial`'s edge that match
    length: int  # tokens of the input found in the tree

    @property
    def node(self) -> Node | None:
        """Deepest fully matched node (None: nothing matched in full)."""
        return self.path[-1] if self.path else None


def first_mismatch(a: bytes, b: bytes) -> int:
    """Number of leading int32 tokens equal in two token byte strings."""
    n = min(len(a), len(b)) // TOKEN_BYTES
    x = np.frombuffer(a, dtype=np.int32, count=n)
    y = np.frombuffer(b, dtype=np.int32, count=n)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


class RadixTree:
    """Token radix tree. Every method keeps it well formed: a non-root node has a
    non-empty edge, and siblings differ in their first token."""

    def __init__(self) -> None:
        self._last_id = 0  # node ids in creation order (an int: a tree copies plainly)
        self.root = Node(b"", None, 0)
        self.roots: dict[Salt, Node] = {None: self.root}  # one root per namespace
        self._salts: dict[Node, Salt] = {self.root: None}  # the reverse map
        self.size = 0  # nodes, roots excluded
        self.version = 0  # bumped by every change of shape: a `Match` taken before is stale

    def namespace(self, salt: Salt) -> Node:
        """The root of namespace `salt`, created if absent."""
        root = self.roots.get(salt)
        if root is None:
            self._last_id += 1
            root = self.roots[salt] = Node(b"", None, self._last_id)
            self._salts[root] = salt
            self.version += 1
        return root

    def salt_of(self, root: Node) -> Salt:
        """The namespace whose root is `root`."""
        return self._salts[root]

    def match(self, key: bytes, salt: Salt = None, *, after: Match | None = None) -> Match:
        """Follow `key` (int32 bytes) from namespace `salt`'s root as far as it matches.

        `after`: a match of a prefix of `key` in namespace `salt`, taken at the current
        `version` (the caller checks both): the walk resumes at its deepest full node, the
        path a walk from the root would take (a commit after its request's lookup)."""
        node, pos, path = self.roots.get(salt), 0, []
        if node is None:
            return Match((), None, 0, 0)
        if after is not None and after.path:
            path = list(after.path)
            node = path[-1]
            pos = node.depth * TOKEN_BYTES
        total = len(key)
        while pos < total:
            child = node.children.get(key[pos : pos + TOKEN_BYTES])
            if child is None:
                break
            end = pos + len(child.key)
            if key[pos:end] == child.key:
                path.append(child)
                node, pos = child, end
                continue
            offset = first_mismatch(child.key, key[pos:end])
            return Match(tuple(path), child, offset, pos // TOKEN_BYTES + offset)
        return Match(tuple(path), None, 0, pos // TOKEN_BYTES)

    def split(self, node: Node, at: int) -> Node:
        """Cut `node`'s edge after `at` tokens; return the new parent holding the head.

        `node` keeps its identity, children and state; the new parent starts with no
        state and no KV, and inherits `node`'s pins (pins cover whole paths).
        """
        if not 0 < at < node.edge_len:
            raise ValueError(f"split offset {at} outside edge of length {node.edge_len}")
        parent = node.parent
        assert parent is not None, "the root has no edge to split"
        cut = at * TOKEN_BYTES
        self._last_id += 1
        head = Node(node.key[:cut], parent, self._last_id)
        head.pins = node.pins  # every pin through `node` runs through its new parent
        self.version += 1
        parent.children[head.key[:TOKEN_BYTES]] = head
        node.key = node.key[cut:]
        node.parent = head
        head.children[node.key[:TOKEN_BYTES]] = node
        self.size += 1
        return head

    def insert(self, parent: Node, key: bytes) -> Node:
        """Add a leaf under `parent` with edge `key`; its first token must be new there."""
        first = key[:TOKEN_BYTES]
        if not key or first in parent.children:
            raise ValueError("insert needs a non-empty edge starting with a new token")
        self._last_id += 1
        leaf = Node(key, parent, self._last_id)
        parent.children[first] = leaf
        self.size += 1
        self.version += 1
        return leaf

    def remove_leaf(self, node: Node) -> None:
        """Detach a leaf from its parent."""
        if node.children or node.parent is None:
            raise ValueError(f"{node!r} is not a removable leaf")
        parent = node.parent
        del parent.children[node.key[:TOKEN_BYTES]]
        node.parent = None
        self.size -= 1
        self.version += 1
        if parent.parent is None and not parent.children and parent is not self.root:
            del self.roots[self._salts.pop(parent)]

    def merge_into_child(self, node: Node) -> Node:
        """Remove a one-child node; its only child takes over its edge. Returns the child."""
        if len(node.children) != 1 or node.parent is None:
            raise ValueError(f"{node!r} must have exactly one child to merge")
        (child,) = node.children.values()
        parent = node.parent
        child.key = node.key + child.key
        child.parent = parent
        parent.children[node.key[:TOKEN_BYTES]] = child
        node.children = {}
        node.parent = None
        self.size -= 1
        self.version += 1
        return child

    def nodes(self) -> list[Node]:
        """Every node but the roots, parents before children (a full walk: tests only)."""
        out = []
        stack = [child for root in self.roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def path_to(self, node: Node) -> list[Node]:
        """Nodes from its namespace's root (excluded) down to `node`."""
        path = []
        cur: Node | None = node
        while cur is not None and cur.key:  # a root has no edge
            path.append(cur)
            cur = cur.parent
        path.reverse()
        return path

    def check(self) -> None:
        """Assert the tree is well formed (tests and debugging; walks everything)."""
        count = 0
        assert self.roots.get(None) is self.root, "the default namespace lost its root"
        for root in self.roots.values():
            assert root.parent is None and not root.key, f"{root!r} is not a root"
            assert root is self.root or root.children, f"empty namespace root {root!r} kept"
        stack = list(self.roots.values())
        while stack:
            node = stack.pop()
            for first, child in node.children.items():
                assert child.parent is node, f"{child!r} has the wrong parent"
                assert child.key, f"{child!r} has an empty edge"
                assert child.key[:TOKEN_BYTES] == first, f"{child!r} is filed under another token"
                assert child.depth == node.depth + child.edge_len, f"{child!r} has a wrong depth"
                count += 1
                stack.append(child)
        assert count == self.size, f"tree counts {self.size} nodes, holds {count}"
