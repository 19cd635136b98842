"""embkv.torch against torch.nn: the same rows, the same outputs, and
permits that always go back.

For the same initial weights and batches, Embedding and EmbeddingBag over an
embkv table (the table's optimizer) must hold the same rows after N steps as
torch.nn.Embedding / EmbeddingBag (sparse) trained with torch.optim.SGD /
Adagrad, within float32 tolerance: every mode, duplicates, per_sample_weights,
padding_idx, empty bags."""
import gc
import sys
import threading
import unittest

import numpy as np

from embkv_test import TempDirTest

try:
    import torch
except ImportError:  # pragma: no cover
    sys.exit("embkv Python tests: PyTorch is required (Debian package python3-torch; `make deps` installs it)")

import embkv  # noqa: E402
import embkv.torch as ekt  # noqa: E402

NUM, DIM, STEPS = 40, 4, 25


class Base(TempDirTest):
    def setUp(self):
        super().setUp()
        self.conn = embkv.connect(self.db)
        self.rng = np.random.default_rng(11)
        torch.manual_seed(0)

    def tearDown(self):
        self.conn.close()
        super().tearDown()

    def table_like(self, name, w0, padding_idx=None, **options):
        opts = ", ".join("%s=%s" % (k, repr(v) if not isinstance(v, str) else "'%s'" % v) for k, v in options.items())
        self.conn.execute("CREATE VIRTUAL TABLE %s USING embkv(dim=%d, %s)" % (name, DIM, opts))
        self.conn.execute("BEGIN")
        self.conn.executemany("INSERT INTO %s(id, vec) VALUES (?, ?)" % name,
                              [(i, w0[i].tobytes()) for i in range(NUM) if i != padding_idx])
        self.conn.execute("COMMIT")

    def rows(self, name, padding_idx=None):
        ids = np.array([i for i in range(NUM) if i != padding_idx], dtype=np.int64)
        out = np.array(embkv.pull(self.conn, name, ids))
        embkv.release(self.conn, name, ids)
        return ids, out

    def optimizers(self, params, kind, lr):
        if kind == "sgd":
            return torch.optim.SGD(params, lr=lr)
        return torch.optim.Adagrad(params, lr=lr, initial_accumulator_value=0.0, eps=1e-10)


class TestExactness(Base):
    def run_bag(self, mode, kind, padding_idx=None, weighted=False):
        w0 = self.rng.normal(0, 1, (NUM, DIM)).astype(np.float32)
        if padding_idx is not None:
            w0[padding_idx] = 0
        lr = 0.1
        ref = torch.nn.EmbeddingBag(NUM, DIM, mode=mode, sparse=True, padding_idx=padding_idx)
        with torch.no_grad():
            ref.weight.copy_(torch.from_numpy(w0))
        opt = self.optimizers(ref.parameters(), kind, lr)
        name = "b_%s_%s_%s_%d" % (mode, kind, "p" if padding_idx is not None else "n", weighted)
        self.table_like(name, w0, padding_idx, optimizer=kind, lr=lr)
        emb = ekt.EmbeddingBag(self.conn, name, dim=DIM, mode=mode, padding_idx=padding_idx)
        for step in range(STEPS):
            n = 14
            ids = torch.from_numpy(self.rng.integers(0, 8 if step % 3 == 0 else NUM, n))  # many duplicates
            if padding_idx is not None:
                ids[::5] = padding_idx
            offsets = torch.tensor([0, 3, 3, 9])  # the second bag is empty
            psw = torch.from_numpy(self.rng.normal(0, 1, n).astype(np.float32)) if weighted else None
            target = torch.from_numpy(self.rng.normal(0, 1, (4, DIM)).astype(np.float32))
            out_ref = ref(ids, offsets, per_sample_weights=psw)
            out = emb(ids, offsets, per_sample_weights=psw)
            np.testing.assert_allclose(out.detach().numpy(), out_ref.detach().numpy(), rtol=1e-5, atol=1e-6)
            opt.zero_grad()
            ((out_ref - target) ** 2).sum().backward()
            opt.step()
            ((out - target) ** 2).sum().backward()
        ids, got = self.rows(name, padding_idx)
        want = ref.weight.detach().numpy()[ids]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        self.assertFalse(np.allclose(got, w0[ids]), "nothing was trained")

    def test_bag_sum_sgd(self):
        self.run_bag("sum", "sgd")

    def test_bag_mean_sgd(self):
        self.run_bag("mean", "sgd")

    def test_bag_sum_adagrad_weighted(self):
        self.run_bag("sum", "adagrad", weighted=True)

    def test_bag_mean_adagrad_padding(self):
        self.run_bag("mean", "adagrad", padding_idx=3)

    def test_bag_sum_sgd_padding_weighted(self):
        self.run_bag("sum", "sgd", padding_idx=0, weighted=True)

    def run_embedding(self, kind, padding_idx=None):
        w0 = self.rng.normal(0, 1, (NUM, DIM)).astype(np.float32)
        if padding_idx is not None:
            w0[padding_idx] = 0
        lr = 0.05
        ref = torch.nn.Embedding(NUM, DIM, sparse=True, padding_idx=padding_idx)
        with torch.no_grad():
            ref.weight.copy_(torch.from_numpy(w0))
        opt = self.optimizers(ref.parameters(), kind, lr)
        name = "e_%s_%s" % (kind, "p" if padding_idx is not None else "n")
        self.table_like(name, w0, padding_idx, optimizer=kind, lr=lr)
        emb = ekt.Embedding(self.conn, name, padding_idx=padding_idx)
        for step in range(STEPS):
            ids = torch.from_numpy(self.rng.integers(0, NUM, (3, 5)))
            if padding_idx is not None:
                ids[0, 0] = padding_idx
            target = torch.from_numpy(self.rng.normal(0, 1, (3, 5, DIM)).astype(np.float32))
            out_ref, out = ref(ids), emb(ids)
            self.assertEqual(tuple(out.shape), (3, 5, DIM))
            np.testing.assert_allclose(out.detach().numpy(), out_ref.detach().numpy(), rtol=1e-5, atol=1e-6)
            opt.zero_grad()
            ((out_ref - target) ** 2).sum().backward()
            opt.step()
            ((out - target) ** 2).sum().backward()
        ids, got = self.rows(name, padding_idx)
        np.testing.assert_allclose(got, ref.weight.detach().numpy()[ids], rtol=1e-5, atol=1e-5)

    def test_embedding_sgd(self):
        self.run_embedding("sgd")

    def test_embedding_adagrad_padding(self):
        self.run_embedding("adagrad", padding_idx=7)

    def test_clock_counts_one_update_per_distinct_id_and_step(self):
        emb = ekt.Embedding(self.conn, "c", dim=DIM, init="zeros")
        ids = torch.tensor([1, 1, 2])
        emb(ids).sum().backward()
        emb(ids).sum().backward()
        clocks = dict(self.conn.execute("SELECT id, clock FROM c").fetchall())
        self.assertEqual(clocks, {1: 2, 2: 2})
        vec1 = np.frombuffer(self.conn.execute("SELECT vec FROM c WHERE id = 1").fetchone()[0], np.float32)
        np.testing.assert_allclose(vec1, np.full(DIM, -0.01 * 2 * 2, np.float32), rtol=1e-6)  # sgd lr 0.01


class TestPermits(Base):
    def setUp(self):
        super().setUp()
        self.emb = ekt.EmbeddingBag(self.conn, "s", dim=DIM, mode="sum", init="zeros", staleness=0, wait_ms=300)
        self.ids = torch.tensor([5, 6, 7, 5])
        self.offsets = torch.tensor([0, 2])

    def pull_again(self):
        """A pull of the same ids: at staleness 0 it fails with BUSY after
        300 ms if any permit is still out."""
        ids = np.array([5, 6, 7], dtype=np.int64)
        embkv.pull(self.conn, "s", ids)
        self.assertEqual(embkv.release(self.conn, "s", ids), 3)

    def test_forward_without_backward_releases(self):
        out = self.emb(self.ids, self.offsets)
        self.assertEqual(tuple(out.shape), (2, DIM))
        del out  # the graph goes, and with it the permits
        self.pull_again()

    def test_exception_inside_the_step_releases(self):
        try:
            out = self.emb(self.ids, self.offsets)
            raise ValueError("the model failed")
        except ValueError:
            pass
        del out
        self.pull_again()

    def test_no_grad_releases_at_once(self):
        with torch.no_grad():
            out = self.emb(self.ids, self.offsets)
        self.pull_again()
        self.assertEqual(out.sum().item(), 0.0)

    def test_backward_returns_them_and_updates(self):
        out = self.emb(self.ids, self.offsets)
        out.sum().backward()
        self.pull_again()
        clocks = dict(self.conn.execute("SELECT id, clock FROM s").fetchall())
        self.assertEqual(clocks, {5: 1, 6: 1, 7: 1})

    def test_held_permit_blocks_then_release(self):
        out = self.emb(self.ids, self.offsets)
        with self.assertRaises(Exception) as cm:
            embkv.pull(self.conn, "s", np.array([6], dtype=np.int64))
        self.assertIn("staleness bound 0", str(cm.exception))
        self.emb.release()
        self.pull_again()
        out.sum().backward()  # after release(): pushes nothing
        self.assertEqual(self.conn.execute("SELECT max(clock) FROM s").fetchone()[0], 0)

    def test_failed_push_returns_them(self):
        out = self.emb(self.ids, self.offsets)
        with self.assertRaisesRegex(Exception, "NaN"):
            (out * float("nan")).sum().backward()
        del out
        self.pull_again()
        self.assertEqual(self.conn.execute("SELECT max(clock) FROM s").fetchone()[0], 0)

    def test_module_dropped_before_backward(self):
        emb = ekt.Embedding(self.conn, "s")
        out = emb(torch.tensor([6]))
        del emb
        gc.collect()
        out.sum().backward()  # still pushes, and returns the permit
        self.pull_again()
        self.assertEqual(self.conn.execute("SELECT clock FROM s WHERE id = 6").fetchone()[0], 1)

    def test_second_backward_is_an_error(self):
        out = self.emb(self.ids, self.offsets)
        out.sum().backward(retain_graph=True)
        with self.assertRaisesRegex(RuntimeError, "second backward through one forward of table 's'"):
            (2 * out).sum().backward()
        self.assertEqual(self.conn.execute("SELECT max(clock) FROM s").fetchone()[0], 1)

    def test_freed_on_another_thread(self):
        box = [self.emb(self.ids, self.offsets)]
        t = threading.Thread(target=box.clear)
        t.start()
        t.join()
        gc.collect()
        out = self.emb(self.ids, self.offsets)  # returns the deferred ones first
        out.sum().backward()
        self.assertEqual(self.conn.execute("SELECT max(clock) FROM s").fetchone()[0], 1)


class TestErrors(Base):
    def test_missing_table_needs_dim(self):
        with self.assertRaisesRegex(ValueError, "does not exist: give dim"):
            ekt.Embedding(self.conn, "nope")

    def test_dim_mismatch(self):
        self.conn.execute("CREATE VIRTUAL TABLE t USING embkv(dim=3)")
        with self.assertRaisesRegex(ValueError, "has dim 3, not 4"):
            ekt.Embedding(self.conn, "t", dim=4)

    def test_options_of_an_existing_table(self):
        self.conn.execute("CREATE VIRTUAL TABLE t USING embkv(dim=3, lr=0.25)")
        ekt.Embedding(self.conn, "t", dim=3, lr=0.25)  # the same: a second run of a script
        ekt.Embedding(self.conn, "T", lr=0.25)
        with self.assertRaisesRegex(ValueError, "table 't' exists with other options: .*option lr: .*lr=0.25, not 0.5"):
            ekt.Embedding(self.conn, "t", lr=0.5)
        self.assertEqual(self.conn.execute("SELECT count(*) FROM temp.sqlite_schema").fetchone()[0], 0)

    def test_ids_must_be_integers(self):
        emb = ekt.Embedding(self.conn, "t", dim=3, init="zeros")
        for bad in (torch.tensor([1.7]), torch.tensor([True])):
            with self.assertRaisesRegex(TypeError, "LongTensor or IntTensor"):
                emb(bad)
        with self.assertRaisesRegex(TypeError, "ids must be integers"):
            embkv.pull(self.conn, "t", np.array([1.9]))
        with self.assertRaisesRegex(ValueError, "does not fit in int64"):
            embkv.pull(self.conn, "t", np.array([2**64 - 1], dtype=np.uint64))
        self.assertEqual(embkv.pull(self.conn, "t", []).shape, (0, 3))
        with self.assertRaisesRegex(ValueError, "grads must have shape"):
            embkv.push(self.conn, "t", [1, 2], np.zeros((1, 3), np.float32))

    def test_lookahead_without_an_ssd_tier_queues_nothing(self):
        emb = ekt.Embedding(self.conn, "t", dim=3, init="zeros")
        self.assertEqual(emb.lookahead(torch.tensor([1, 2, 3])), 0)

    def test_bad_mode(self):
        with self.assertRaisesRegex(ValueError, "mode must be 'sum' or 'mean'"):
            ekt.EmbeddingBag(self.conn, "t", dim=3, mode="max")

    def test_missing_row_without_initializer_names_the_id(self):
        emb = ekt.Embedding(self.conn, "t", dim=3)
        with self.assertRaisesRegex(Exception, "id 42"):
            emb(torch.tensor([42]))


if __name__ == "__main__":
    unittest.main()
