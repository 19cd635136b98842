"""Rows into device memory (docs/gpu.md; run by tests/gpu/run.sh on a GPU machine).

Zipf(0.99) batches of 512 to 65,536 ids over 2,000,000 rows of dim 64 and
128 (rows of 256 and 512 bytes), in an embkv store on /dev/shm (pool only),
and the same rows as torch tensors; rows/s into a device buffer for
  (a) embkv's GPU gather (embkv_get_batch_device: the GPU reads the pool's
      rows where they lie, from the registered mapping),
  (b) embkv's CPU gather into pinned memory, then one async copy
      (embkv_get_batch, two pinned buffers in turn),
  (c) torch's CPU embedding, then .cuda(),
  (d) torch.nn.Embedding resident on the GPU (the upper bound),
and the host-to-device bandwidth of a pinned copy (the link's limit),
measured in the same run.  The engine is called through ctypes (the C API
of build/libembkv.so, or $EMBKV_LIB), so no SQLite is involved.

    python3 bench/bench_gpu.py [--rows N] [--out results.json]
"""
import argparse
import ctypes
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Options(ctypes.Structure):  # embkv_options (ext/embkv.h)
    _fields_ = [("dim", ctypes.c_uint32), ("state_floats", ctypes.c_uint32), ("dtype", ctypes.c_uint32),
                ("expected_rows", ctypes.c_uint64), ("pool_size", ctypes.c_uint64), ("max_load", ctypes.c_double),
                ("ssd_size", ctypes.c_uint64), ("ssd_path", ctypes.c_char_p), ("cache_size", ctypes.c_uint64),
                ("migrate_rate", ctypes.c_uint64)]


def load_lib():
    path = os.environ.get("EMBKV_LIB") or os.path.join(ROOT, "build", "libembkv.so")
    lib = ctypes.CDLL(path)
    P, U64, SZ = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t
    lib.embkv_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(Options), ctypes.c_uint, ctypes.POINTER(P)]
    lib.embkv_put.argtypes = [P, ctypes.c_int64, P, P, ctypes.c_uint]
    lib.embkv_get_batch.argtypes = [P, P, SZ, P, P, P]
    lib.embkv_get_batch_device.argtypes = [P, P, SZ, P, P, P]
    lib.embkv_close.argtypes = [P]
    lib.embkv_errmsg.restype = ctypes.c_char_p
    lib.embkv_gpu_status.argtypes = [ctypes.c_char_p, SZ]
    del U64
    return lib


def check(lib, rc, what):
    if rc != 0:
        sys.exit("bench_gpu: %s: %s" % (what, lib.embkv_errmsg().decode()))


def zipf_batches(n_rows, batch, count, rng):
    """count batches of Zipf(0.99) ids, the ranks scattered over the ids."""
    w = 1.0 / np.arange(1, n_rows + 1, dtype=np.float64) ** 0.99
    cdf = np.cumsum(w)
    perm = rng.permutation(n_rows).astype(np.int64)
    out = []
    for _ in range(count):
        u = rng.random(batch) * cdf[-1]
        out.append(np.ascontiguousarray(perm[np.searchsorted(cdf, u)]))
    return out


def timed(fn, iters):
    torch.cuda.synchronize()
    fn(0)  # warm
    torch.cuda.synchronize()
    t = time.perf_counter()
    for k in range(1, iters + 1):
        fn(k)
    torch.cuda.synchronize()
    return time.perf_counter() - t


def link_bandwidth():
    """Bytes/s of a pinned 256 MiB host-to-device copy (best of 5)."""
    src = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty_like(src, device="cuda")
    best = 1e9
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return src.numel() / best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--batches", default="512,4096,65536")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--out")
    ap.add_argument("--dir", help="where the stores go (default: /dev/shm, else the temporary directory)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gpu: this PyTorch has no CUDA")
    lib = load_lib()
    why = ctypes.create_string_buffer(512)
    if lib.embkv_gpu_status(why, 512) != 0:
        sys.exit("bench_gpu: no usable GPU: %s" % why.value.decode())
    rng = np.random.default_rng(7)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    bw = link_bandwidth()
    print("device: %s; pinned host-to-device copy: %.1f GB/s" % (torch.cuda.get_device_name(), bw / 1e9))
    results = {"device": torch.cuda.get_device_name(), "link_bytes_per_s": bw, "runs": []}
    tmp = tempfile.mkdtemp(prefix="embkv-bench-gpu-", dir=a.dir or ("/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        for dim in [int(x) for x in a.dims.split(",")]:
            W = rng.standard_normal((a.rows, dim), dtype=np.float32)
            s = ctypes.c_void_p()
            o = Options(dim=dim, expected_rows=a.rows)
            check(lib, lib.embkv_open(os.path.join(tmp, "d%d" % dim).encode(), ctypes.byref(o), 1, ctypes.byref(s)),
                  "open")
            t = time.perf_counter()
            base, stride = W.ctypes.data, dim * 4
            put = lib.embkv_put
            for i in range(a.rows):
                if put(s, i, base + i * stride, None, 0) != 0:
                    check(lib, 1, "put %d" % i)
            print("dim %d: %d rows loaded in %.1f s" % (dim, a.rows, time.perf_counter() - t))
            emb_cpu = torch.nn.Embedding.from_pretrained(torch.from_numpy(W))
            emb_gpu = torch.nn.Embedding.from_pretrained(torch.from_numpy(W).cuda())
            for batch in [int(x) for x in a.batches.split(",")]:
                iters = max(20, min(400, 4_000_000 // batch))
                ids = zipf_batches(a.rows, batch, iters + 1, rng)
                ids_t = [torch.from_numpy(x) for x in ids]
                ids_g = [x.cuda() for x in ids_t]
                outs = [torch.empty((batch, dim), device="cuda") for _ in range(2)]
                pinned = [torch.empty((batch, dim), pin_memory=True) for _ in range(2)]
                events = [None, None]

                def gpu_gather(k):
                    check(lib, lib.embkv_get_batch_device(s, ids[k].ctypes.data, batch, outs[k % 2].data_ptr(),
                                                          stream, None), "gather")

                def cpu_gather(k):
                    if events[k % 2] is not None:
                        events[k % 2].synchronize()
                    check(lib, lib.embkv_get_batch(s, ids[k].ctypes.data, batch, pinned[k % 2].data_ptr(), None,
                                                   None), "get_batch")
                    outs[k % 2].copy_(pinned[k % 2], non_blocking=True)
                    events[k % 2] = torch.cuda.Event()
                    events[k % 2].record()

                def torch_cpu(k):
                    outs[k % 2] = emb_cpu(ids_t[k]).cuda()

                def torch_gpu(k):
                    outs[k % 2] = emb_gpu(ids_g[k])

                # (a) and (b) give the same bytes: checked once
                gpu_gather(0)
                cpu_gather(1)
                torch.cuda.synchronize()
                ok = torch.equal(outs[0], emb_gpu(ids_g[0])) and torch.equal(outs[1], emb_gpu(ids_g[1]))
                row = {"dim": dim, "batch": batch, "row_bytes": dim * 4, "equal": bool(ok)}
                for name, fn in (("embkv_gpu_gather", gpu_gather), ("embkv_cpu_gather_copy", cpu_gather),
                                 ("torch_cpu_then_cuda", torch_cpu), ("torch_on_gpu", torch_gpu)):
                    secs = timed(fn, iters)
                    row[name] = batch * iters / secs
                best = max(row["embkv_gpu_gather"], row["embkv_cpu_gather_copy"])
                row["best_vs_torch_cpu"] = best / row["torch_cpu_then_cuda"]
                row["best_row_bytes_vs_link"] = best * dim * 4 / bw
                results["runs"].append(row)
                print("dim %3d batch %6d: rows/s  gpu gather %11.0f  cpu gather+copy %11.0f  torch cpu+cuda %11.0f"
                      "  torch gpu %12.0f | best %.2fx torch cpu, %.2f of the link%s"
                      % (dim, batch, row["embkv_gpu_gather"], row["embkv_cpu_gather_copy"],
                         row["torch_cpu_then_cuda"], row["torch_on_gpu"], row["best_vs_torch_cpu"],
                         row["best_row_bytes_vs_link"], "" if ok else "  (BYTES DIFFER)"))
            check(lib, lib.embkv_close(s), "close")
            shutil.rmtree(os.path.join(tmp, "d%d" % dim), ignore_errors=True)
            del W, emb_cpu, emb_gpu
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    goal = [r for r in results["runs"] if r["row_bytes"] == 256]
    met2 = all(r["best_vs_torch_cpu"] >= 2 for r in results["runs"])
    meth = all(r["best_row_bytes_vs_link"] >= 0.5 for r in goal)
    print("goals: best of (a),(b) >= 2x (c) everywhere: %s; >= half the link for 256-byte rows: %s"
          % ("met" if met2 else "missed", "met" if meth else "missed"))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(r["equal"] for r in results["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
