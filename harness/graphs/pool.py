"""The emulator's graph memory pools, as CUDA's caching allocator keeps them.

On CUDA, a capture allocates from its graph's private memory pool, and graphs captured with the
same `pool=` share one. A block whose tensors the program has dropped goes back to the pool: a
later allocation, in the same capture or in a later one sharing the pool, may get it, although
the graph that first used it still writes there on every replay. So a graph captured later can
keep its output where an earlier graph keeps an intermediate, and replaying the earlier graph
after the later one overwrites that output (graphs sharing a pool are safe when each output is
read before another graph replays).

The emulator does the same with host memory: every tensor an op allocates during a capture is
moved into a block of the capture's pool, a freed one where one is large enough (the smallest
that fits, as the caching allocator picks), else a new one. A block is free when no tensor
outside the emulator refers to its memory: the emulator watches each such tensor through a weak
reference and records the ops over aliases of its own, so that what it records keeps nothing alive.
"""
from __future__ import annotations

import itertools
import weakref

import torch

_handles = itertools.count(1)
_pools: "weakref.WeakValueDictionary[tuple[int, int], Pool]" = weakref.WeakValueDictionary()
_blocks: dict[int, "Block"] = {}  # every live pool's blocks, by address (a pool's leave with it)
# How many references a storage has (tensors and storage objects); private in torch, so optional.
_use_count = getattr(torch._C, "_storage_Use_Count", None)


class Block:
    """One allocation's memory, and how many tensors outside the emulator refer to it (each
    watched through a weak reference: when the last goes, the block is free)."""

    def __init__(self, storage: torch.UntypedStorage, pool: "Pool"):
        self.storage, self.nbytes, self.address, self.device = storage, storage.nbytes(), storage.data_ptr(), storage.device
        self.bytes = _bytes(storage)  # its memory as one byte tensor, to copy an allocation's values in
        self.pool = weakref.ref(pool)
        self.users: list[weakref.ref] = []
        self.live = 0
        self.aliases: weakref.WeakSet = weakref.WeakSet()  # the emulator's own tensors over this memory

    def use(self, tensor: torch.Tensor) -> None:
        self.live += 1
        self.users.append(weakref.ref(tensor, self._gone))

    def _gone(self, _) -> None:
        self.live -= 1
        pool = self.pool()
        if not self.live and pool is not None:
            pool.free.add(self)

    def free_now(self) -> bool:
        """No watched tensor is alive, and (where torch can say) no other tensor refers to the memory
        either: a view the program made outside a capture holds it too."""
        if self.live:
            return False
        if _use_count is None:
            return True
        return _use_count(self.storage._cdata) <= 2 + len(self.aliases)  # this block's own two references, the aliases


class Pool:
    """The blocks captures into one pool allocated, by address, and which of them are free."""

    def __init__(self, handle: tuple[int, int]):
        self.handle = handle
        self.blocks: dict[int, Block] = {}
        self.free: set[Block] = set()
        weakref.finalize(self, _forget, self.blocks)

    @property
    def nbytes(self) -> int:
        return sum(block.nbytes for block in self.blocks.values())

    def allocate(self, storage: torch.UntypedStorage) -> tuple[Block, bool]:
        """The block an allocation of this storage's size gets: the smallest free one that holds it
        (its values are copied there), or the storage itself as a new block. (block, reused?) The
        block is in use from here: give it its users (Block.use) before the next allocation."""
        size, device = storage.nbytes(), storage.device
        block = None  # the smallest that fits (the first of equals), asking free_now() only of a smaller one
        for candidate in self.free:
            if (candidate.nbytes >= size and (block is None or candidate.nbytes < block.nbytes)
                    and candidate.device == device and candidate.free_now()):
                block = candidate
        if block is not None:
            self.free.discard(block)
            block.bytes[:size].copy_(_bytes(storage))
            block.users.clear()
            return block, True
        block = self.blocks[storage.data_ptr()] = _blocks[storage.data_ptr()] = Block(storage, self)
        return block, False


def _forget(blocks: dict[int, Block]) -> None:
    for address in blocks:
        _blocks.pop(address, None)


def block_of(tensor: torch.Tensor) -> Block | None:
    """The pool block a tensor's memory is, in any pool; None for memory allocated outside captures."""
    return _blocks.get(tensor.untyped_storage().data_ptr())


def new_handle() -> tuple[int, int]:
    """A handle no pool has yet (torch.cuda.graph_pool_handle)."""
    return (next(_handles), 0)


def pool_for(handle: tuple[int, int] | None) -> Pool:
    """The pool a handle names (a graph's pool() or graph_pool_handle()); None: a private one."""
    handle = handle or new_handle()
    pool = _pools.get(handle)
    if pool is None:
        pool = _pools[handle] = Pool(handle)
    return pool


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def alias(tensor: torch.Tensor, block: Block) -> torch.Tensor:
    """Another tensor object over the same memory, shape and strides (what the emulator records):
    detach() makes one that shares the memory and keeps no reference to the tensor itself."""
    copy = tensor.detach()
    block.aliases.add(copy)
    return copy


def move(tensor: torch.Tensor, block: Block) -> None:
    """Point a tensor at a block's memory (its values were copied there), keeping its layout."""
    tensor.set_(block.storage, tensor.storage_offset(), tensor.size(), tensor.stride())
