"""embkv.torch on CUDA (run by tests/gpu/run.sh on a machine with a GPU).

- Embedding and EmbeddingBag (sum, mean; per_sample_weights, padding_idx)
  with device="cuda" against the same modules on the CPU, over the same
  steps of adagrad: every output of Embedding equal bit for bit (the rows
  gathered into device memory are the CPU's), bag outputs within rounding
  (torch's CUDA kernel sums a bag in its own order), and the tables' rows
  and clocks equal bit for bit after the steps (the losses are linear, so
  each gradient is exact on both devices, and the device push sums them
  as the CPU push does).
- Against torch.nn.Embedding(sparse=True) on CUDA with torch's Adagrad,
  from the same rows: within float32 rounding after the steps.
- One step, one update: a module called twice in a step updates a row
  once (its clock 1), on CUDA as on the CPU.
- Ids on the GPU are accepted; outputs are on the module's device.
"""
import os
import shutil
import sys
import tempfile
import unittest

import numpy as np
import torch

import embkv
import embkv.torch as ekt

DEV = torch.device("cuda")


class TorchCuda(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="embkv-gpu-", dir=os.environ.get("EMBKV_GPU_DIR"))

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def conn(self, name):
        # (a CUDA backward pushes from autograd's device thread)
        return embkv.connect(os.path.join(self.dir, name + ".db"), check_same_thread=False)

    @staticmethod
    def rows(conn, table):
        """id -> (its vector, its clock)."""
        got = conn.execute("SELECT id, vec, clock FROM %s ORDER BY id" % table).fetchall()
        return {i: (np.frombuffer(v, np.float32), k) for i, v, k in got}

    @staticmethod
    def same(a, b):
        return a.keys() == b.keys() and all(np.array_equal(a[i][0], b[i][0]) and a[i][1] == b[i][1] for i in a)

    def make(self, cls, device, **kw):
        c = self.conn("%s-%s" % (cls.__name__, device))
        opts = dict(dim=32, optimizer="adagrad", lr=0.1, init="normal(0,0.1)", seed=5)
        m = cls(c, "t", device=device, **opts, **kw)
        return c, m

    def test_embedding_equals_cpu(self):
        cc, mc = self.make(ekt.Embedding, "cpu")
        cg, mg = self.make(ekt.Embedding, "cuda")
        g = torch.Generator().manual_seed(1)
        for step in range(20):
            ids = torch.randint(0, 500, (64, 3), generator=g)
            ids[0, 0] = ids[1, 1]  # a repeat at least
            w = torch.randn(64, 3, 32, generator=g)
            oc = mc(ids)
            og = mg(ids.to(DEV) if step % 2 else ids)
            self.assertEqual(og.device.type, "cuda")
            self.assertTrue(torch.equal(oc, og.cpu()), "step %d" % step)
            (oc * w).sum().backward()
            (og * w.to(DEV)).sum().backward()
        rc, rg = self.rows(cc, "t"), self.rows(cg, "t")
        self.assertTrue(self.same(rc, rg))
        self.assertEqual(max(k for _, k in rg.values()), max(k for _, k in rc.values()))

    def test_bag_equals_cpu(self):
        for mode in ("sum", "mean"):
            cc, mc = self.make(ekt.EmbeddingBag, "cpu", mode=mode, padding_idx=0)
            cg, mg = self.make(ekt.EmbeddingBag, "cuda", mode=mode, padding_idx=0)
            g = torch.Generator().manual_seed(2)
            for step in range(15):
                ids = torch.randint(0, 300, (200,), generator=g)
                offsets = torch.tensor([0, 50, 120, 121, 180])
                psw = torch.rand(200, generator=g) if mode == "sum" else None
                w = torch.randn(5, 32, generator=g)
                oc = mc(ids, offsets, per_sample_weights=psw)
                og = mg(ids.to(DEV), offsets.to(DEV), per_sample_weights=psw.to(DEV) if psw is not None else None)
                torch.testing.assert_close(og.cpu(), oc, rtol=1e-5, atol=1e-6)
                (oc * w).sum().backward()
                (og * w.to(DEV)).sum().backward()
            rc, rg = self.rows(cc, "t"), self.rows(cg, "t")
            self.assertNotIn(0, rg)
            if mode == "sum":
                self.assertTrue(self.same(rc, rg), mode)
            else:
                # torch's mean backward scales by 1/n on the CPU and divides by n on
                # CUDA: the gradients themselves may differ in the last bit
                self.assertEqual(rc.keys(), rg.keys())
                for i in rc:
                    np.testing.assert_allclose(rg[i][0], rc[i][0], rtol=1e-5, atol=1e-6)
                    self.assertEqual(rg[i][1], rc[i][1])
            for c in (cc, cg):
                c.close()
            for f in os.listdir(self.dir):
                shutil.rmtree(os.path.join(self.dir, f), ignore_errors=True) if os.path.isdir(
                    os.path.join(self.dir, f)) else os.remove(os.path.join(self.dir, f))

    def test_against_torch_cuda(self):
        c, m = self.make(ekt.Embedding, "cuda")
        n = 400
        with torch.no_grad():
            start = m(torch.arange(n, device=DEV)).clone()  # creates every row
        ref = torch.nn.Embedding(n, 32, sparse=True).to(DEV)
        with torch.no_grad():
            ref.weight.copy_(start)
        opt = torch.optim.Adagrad(ref.parameters(), lr=0.1, initial_accumulator_value=0.0, eps=1e-10)
        g = torch.Generator().manual_seed(3)
        for step in range(25):
            ids = torch.randint(0, n, (256,), generator=g).to(DEV)
            w = torch.randn(256, 32, generator=g).to(DEV)
            (m(ids) * w).sum().backward()
            opt.zero_grad()
            (ref(ids) * w).sum().backward()
            opt.step()
        with torch.no_grad():
            got = m(torch.arange(n, device=DEV))
        torch.testing.assert_close(got, ref.weight.detach(), rtol=2e-5, atol=2e-6)

    def test_one_update_per_step(self):
        c, m = self.make(ekt.Embedding, "cuda")
        i = torch.tensor([7], device=DEV)
        (m(i).sum() + 3 * m(i).sum()).backward()
        self.assertEqual(c.execute("SELECT clock FROM t WHERE id = 7").fetchone()[0], 1)
        self.assertEqual(m.device.type, "cuda")
        out = m(i)
        self.assertEqual(out.device.type, "cuda")


if __name__ == "__main__":
    unittest.main(verbosity=2)
