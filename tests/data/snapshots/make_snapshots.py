#!/usr/bin/env python3
"""Writes the test snapshots of tests/snapshot_test.cpp with the standard library's pickle only.

Each file has the structure torch.cuda.memory._dump_snapshot() writes: it pickles (Python's
pickle.dump, torch/cuda/memory.py) the dict built by _memory_snapshot_pickled in
torch/csrc/cuda/memory_snapshot.cpp:
  {"segments": [{device, address, total_size, allocated_size, active_size, requested_size,
                 stream, segment_type, segment_pool_id, is_expandable, frames,
                 blocks: [{address, size, requested_size, state, frames}]}],
   "device_traces": [[{action, addr, size, stream, time_us, frames}]],  # one list per device
   "allocator_settings": {...}}
The figures the tests expect are worked by hand in the comments below (and in the test).

Run: /usr/bin/python3 tests/data/snapshots/make_snapshots.py   (rewrites the .pickle files)
"""
import datetime
import os
import pickle

HERE = os.path.dirname(os.path.abspath(__file__))
KiB = 1024
MiB = 1024 * KiB
FRAME = [{"filename": "train.py", "line": 42, "name": "step"}]


def block(address, size, state):
    return {"address": address, "size": size, "requested_size": size, "state": state, "frames": FRAME}


def segment(device, address, blocks, segment_type="large", stream=0):
    total = sum(b["size"] for b in blocks)
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    active = sum(b["size"] for b in blocks if b["state"] != "inactive")
    return {
        "device": device, "address": address, "total_size": total, "allocated_size": allocated,
        "active_size": active, "requested_size": allocated, "stream": stream,
        "segment_type": segment_type, "segment_pool_id": (0, 0), "is_expandable": False,
        "frames": FRAME, "blocks": blocks,
    }


def entry(action, addr, size, time_us, stream=0):
    e = {"action": action, "addr": addr, "size": size, "stream": stream, "frames": FRAME, "time_us": time_us}
    if action == "oom":  # memory_snapshot.cpp writes device_free instead of addr for OOM
        e["device_free"] = e.pop("addr")
    return e


def settings():
    return {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "garbage_collection_threshold": 0.0,
            "expandable_segments": False, "roundup_power2_divisions": {"1": 0, "2": 0}}


def simple():
    """One device. Before the window: a 2 MiB segment holding a 512 KiB block (start: allocated
    512 KiB, reserved 2 MiB). Peak allocated 21.5 MiB at entry 3; peak reserved 22 MiB; end:
    allocated 768 KiB, reserved 2 MiB, one inactive block of 1,280 KiB (fragmentation 0)."""
    base, big = 0x7F0000000000, 0x7F0000200000
    trace = [
        entry("alloc", base + 512 * KiB, 1 * MiB, 1000),        # 1: 1.5 MiB
        entry("segment_alloc", big, 20 * MiB, 1010),            # 2: reserved 22 MiB
        entry("alloc", big, 20 * MiB, 1020),                    # 3: 21.5 MiB (peak)
        entry("free_requested", base + 512 * KiB, 1 * MiB, 1030),  # 4: 20.5 MiB
        entry("free_completed", base + 512 * KiB, 1 * MiB, 1031),
        entry("free_requested", big, 20 * MiB, 1040),           # 6: 0.5 MiB
        entry("free_completed", big, 20 * MiB, 1041),
        entry("segment_free", big, 20 * MiB, 1050),             # 8: reserved 2 MiB
        entry("alloc", base + 512 * KiB, 256 * KiB, 1060),      # 9: 0.75 MiB
        entry("snapshot", 0, 0, 1070),
    ]
    seg = segment(0, base, [block(base, 512 * KiB, "active_allocated"),
                            block(base + 512 * KiB, 256 * KiB, "active_allocated"),
                            block(base + 768 * KiB, 1280 * KiB, "inactive")])
    return {"segments": [seg], "device_traces": [trace], "allocator_settings": settings()}


def two_devices():
    """Device 0: a 2 MiB small-pool segment, no trace. Device 1 (shown: larger peak reserved):
    one 20 MiB segment filled by five allocations (peak allocated 20 MiB), then 2 and 6 MiB
    freed and 4 MiB free-requested but pending on another stream. End: allocated 8 MiB, active
    12 MiB, inactive 8 MiB in blocks of 2 and 6 MiB → fragmentation 1 − 6/8 = 0.25."""
    a = 0x7E0000000000
    sizes = [4 * MiB, 2 * MiB, 4 * MiB, 6 * MiB, 4 * MiB]
    addrs = [a + sum(sizes[:i]) for i in range(len(sizes))]
    trace = [entry("segment_alloc", a, 20 * MiB, 10)]
    trace += [entry("alloc", addrs[i], sizes[i], 20 + i) for i in range(5)]
    trace += [entry("free_requested", addrs[1], sizes[1], 30), entry("free_completed", addrs[1], sizes[1], 31),
              entry("free_requested", addrs[3], sizes[3], 32), entry("free_completed", addrs[3], sizes[3], 33),
              entry("free_requested", addrs[2], sizes[2], 34, stream=7)]
    states = ["active_allocated", "inactive", "active_pending_free", "inactive", "active_allocated"]
    seg1 = segment(1, a, [block(addrs[i], sizes[i], states[i]) for i in range(5)])
    small = 0x7D0000000000
    seg0 = segment(0, small, [block(small, 512, "active_allocated"), block(small + 512, 2 * MiB - 512, "inactive")],
                   segment_type="small")
    return {"segments": [seg0, seg1], "device_traces": [[], trace], "allocator_settings": settings()}


def old_trace():
    """As older releases wrote it: no time_us, no free_requested (only free_completed), no
    allocator_settings, segments without blocks. Peak allocated 3 MiB, reserved 4 MiB."""
    s = 0x7C0000000000
    trace = [{"action": "segment_alloc", "addr": s, "size": 4 * MiB, "stream": 0},
             {"action": "alloc", "addr": s, "size": 1 * MiB, "stream": 0},
             {"action": "alloc", "addr": s + MiB, "size": 2 * MiB, "stream": 0},
             {"action": "free_completed", "addr": s + MiB, "size": 2 * MiB, "stream": 0},
             {"action": "oom", "device_free": 0, "size": 80 * 1024 * MiB, "stream": 0}]
    seg = {"device": 0, "address": s, "total_size": 4 * MiB, "allocated_size": 1 * MiB, "active_size": 1 * MiB,
           "stream": 0, "segment_type": "large"}
    return {"segments": [seg], "device_traces": [trace]}


def long_trace():
    """5,000 entries in one 64 MiB segment: allocation i is (i mod 97 + 1) KiB and every
    allocation is freed two entries later, except that entry 3,000 allocates 32 MiB (the peak).
    The expected peaks are computed by replaying the list (reference_peaks below)."""
    s = 0x7B0000000000
    trace = [entry("segment_alloc", s, 64 * MiB, 0)]
    live = []
    t = 1
    while len(trace) < 5000:
        size = 32 * MiB if len(trace) == 3000 else ((len(trace) % 97) + 1) * KiB
        addr = s + (len(trace) % 8) * 4 * MiB
        trace.append(entry("alloc", addr, size, t))
        live.append((addr, size))
        t += 1
        if len(live) > 1 and len(trace) < 5000:
            fa, fs = live.pop(0)
            trace.append(entry("free_requested", fa, fs, t))
            t += 1
    end_alloc = sum(sz for _, sz in live)
    seg = segment(0, s, [block(s, end_alloc, "active_allocated"), block(s + end_alloc, 64 * MiB - end_alloc, "inactive")])
    return {"segments": [seg], "device_traces": [trace], "allocator_settings": settings()}


def reference_peaks(snap):
    """An independent replay (forward from zero, no reconstruction) for long_trace's figures."""
    allocated = reserved = peak_a = peak_r = 0
    for e in snap["device_traces"][0]:
        allocated += {"alloc": e["size"], "free_requested": -e["size"]}.get(e["action"], 0)
        reserved += {"segment_alloc": e["size"], "segment_free": -e["size"]}.get(e["action"], 0)
        peak_a, peak_r = max(peak_a, allocated), max(peak_r, reserved)
    return peak_a, peak_r


def write(name, obj, protocol=pickle.DEFAULT_PROTOCOL):
    with open(os.path.join(HERE, name), "wb") as f:
        pickle.dump(obj, f, protocol=protocol)


if __name__ == "__main__":
    write("simple.pickle", simple())               # protocol 4: FRAME, MEMOIZE, SHORT_BINUNICODE
    write("simple_protocol2.pickle", simple(), 2)  # BINPUT/BINGET, no frames
    write("simple_protocol5.pickle", simple(), 5)
    write("two_devices.pickle", two_devices())
    write("old_trace.pickle", old_trace(), 2)
    lt = long_trace()
    write("long_trace.pickle", lt)
    print("long_trace peaks (allocated, reserved):", reference_peaks(lt))
    # Hostile: one segment of 2,000 blocks listed 20,000 times through memo references (BINGET):
    # 120 KB that a naive walk would expand into 40 million blocks.
    seg = segment(0, 0x7A0000000000, [block(0x7A0000000000 + i * 512, 512, "inactive") for i in range(2000)])
    write("hostile_memo_bomb.pickle", {"segments": [seg] * 20000, "device_traces": [[]]})
    # Not a snapshot: a pickle that would call a Python function (datetime.date via REDUCE).
    write("hostile_reduce.pickle", {"segments": [], "when": datetime.date(2024, 1, 1)})
