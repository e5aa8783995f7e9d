"""The device KV cache's arena: a new cache of the same shape reuses a gone cache's device memory
(so the CUDA backend's captured graphs stay valid) and starts as empty as a fresh one. Runs on the
GPU or under the simulator."""
import numpy as np

from coldkv.runtime.kv_cache_cuda import DevicePagedKVCache, device_kv_nbytes
from coldkv.runtime.kv_table import resolve_table

H, D, P = 2, 64, 16


def _planes(cache):
    return [a for kv in cache.pools for pool in kv for a in (pool.codes, pool.scales)]


def test_reused_arena_starts_empty():
    table = resolve_table("nvfp4", 2)
    old = DevicePagedKVCache(table, H, D, 100, P)
    old.extend(70)
    old.sync(0)
    old.gscale_dev.copy_to_device(np.full(old.gscale.shape, 7.0, np.float32))  # what calibration leaves
    arena = old.arena
    del old

    new = DevicePagedKVCache(table, H, D, 97, P, arena)  # same page count: reused
    fresh = DevicePagedKVCache(table, H, D, 97, P)
    assert new.arena is arena and fresh.arena is not arena
    assert all(a is b for a, b in zip(_planes(new), [x for kv in arena.pools for plane in kv for x in plane]))
    for c in (new, fresh):
        assert c.length == 0 and (c.block_table == -1).all() and not c.calibrated.any()
        c.extend(40)
        c.sync(0)
    np.testing.assert_array_equal(new.table_dev.copy_to_host(), fresh.table_dev.copy_to_host())
    np.testing.assert_array_equal(new.gscale_dev.copy_to_host(), np.ones_like(new.gscale))  # not the stale 7s
    assert new.max_tokens == 97 and new.reserved_nbytes == fresh.reserved_nbytes


def test_other_shape_gets_a_new_arena():
    table = resolve_table("bf16", 2)
    a = DevicePagedKVCache(table, H, D, 64, P).arena
    assert DevicePagedKVCache(table, H, D, 65, P, a).arena is not a  # one page more
    assert DevicePagedKVCache(resolve_table("int8", 2), H, D, 64, P, a).arena is not a
    assert DevicePagedKVCache(table, H, D, 64, P, a).arena is a


def test_arena_bytes_are_what_check_memory_counts():
    """device_kv_nbytes (what check_memory asks for) == the arena's device arrays, the 16-bit
    prefill scratch of 4-bit tables included (none for bf16 / int8)."""
    for name, scratch in (("nvfp4", True), ("bf16", False), ("int8", False), ("default", True)):
        table = resolve_table(name, 3)
        a = DevicePagedKVCache(table, H, D, 100, P).arena
        assert a.nbytes == device_kv_nbytes(table, H, D, 100, P), name
        assert (sum(x.size for x in a.prefill_scratch) > 0) == scratch, name
        # without the scratch (the "wg" prefill kernel's backends): the pools alone, a key of its own
        c = DevicePagedKVCache(table, H, D, 100, P, prefill_scratch=False)
        assert c.arena.prefill_scratch is None and c.arena.key != a.key, name
        assert c.arena.nbytes == device_kv_nbytes(table, H, D, 100, P, prefill_scratch=False), name
        assert a.nbytes - c.arena.nbytes == sum(x.nbytes for x in a.prefill_scratch), name
        assert DevicePagedKVCache(table, H, D, 100, P, c.arena, prefill_scratch=False).arena is c.arena
        assert DevicePagedKVCache(table, H, D, 100, P, c.arena).arena is not c.arena
