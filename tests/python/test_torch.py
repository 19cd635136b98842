"""embkv.torch against torch.nn: the same rows, the same outputs, and
permits that always go back.

For the same initial weights and batches, Embedding and EmbeddingBag over an
embkv table (the table's optimizer) must hold the same rows after N steps as
torch.nn.Embedding / EmbeddingBag (sparse) trained with torch.optim.SGD /
Adagrad, within float32 tolerance: every mode, duplicates, per_sample_weights,
padding_idx, empty bags."""
import gc
import json
import sqlite3
import sys
import threading
import time
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


class TestOneUpdatePerStep(Base):
    """All forwards of a table in one backward pass make one update (the
    summed gradient, one optimizer step, one tick of the clock), as torch's
    optimizer steps a parameter once whatever number of times the model
    used it."""

    def test_repro_two_forwards_adagrad(self):
        self.conn.execute("CREATE VIRTUAL TABLE t USING embkv(dim=2, optimizer='adagrad', lr=0.1)")
        self.conn.execute("INSERT INTO t(id, vec) VALUES (0, '[1,-2]')")
        emb = ekt.Embedding(self.conn, "t")
        i = torch.tensor([0])
        (emb(i).sum() + 3 * emb(i).sum()).backward()
        ref = torch.nn.Embedding(1, 2, sparse=True)
        with torch.no_grad():
            ref.weight.copy_(torch.tensor([[1.0, -2.0]]))
        opt = torch.optim.Adagrad(ref.parameters(), lr=0.1, initial_accumulator_value=0.0, eps=1e-10)
        (ref(i).sum() + 3 * ref(i).sum()).backward()
        opt.step()
        vec, clock = self.conn.execute("SELECT vec, clock FROM t WHERE id = 0").fetchone()
        np.testing.assert_allclose(np.frombuffer(vec, np.float32), ref.weight.detach().numpy()[0], rtol=1e-6)
        np.testing.assert_allclose(np.frombuffer(vec, np.float32), [0.9, -2.1], rtol=1e-6)
        self.assertEqual(clock, 1)

    def test_several_modules_and_roles_match_torch(self):
        """A TransE-like step: one table called for heads, tails and
        corrupted tails through an Embedding and an EmbeddingBag, at
        staleness 0 (the roles share ids: no forward waits for another)."""
        w0 = self.rng.normal(0, 1, (NUM, DIM)).astype(np.float32)
        for kind in ("sgd", "adagrad", "adam"):
            name = "kg_" + kind
            self.table_like(name, w0, optimizer=kind, lr=0.05, staleness=0, wait_ms=200)
            e1 = ekt.Embedding(self.conn, name)
            e2 = ekt.EmbeddingBag(self.conn, name, mode="sum")
            ref = torch.nn.Parameter(torch.from_numpy(w0.copy()))
            opt = (torch.optim.SGD([ref], lr=0.05) if kind == "sgd" else
                   torch.optim.Adagrad([ref], lr=0.05, initial_accumulator_value=0.0, eps=1e-10) if kind == "adagrad"
                   else torch.optim.Adam([ref], lr=0.05, eps=1e-8))
            steps_of = np.zeros(NUM, np.int64)  # steps in which each row took part
            for step in range(8):
                h = torch.from_numpy(self.rng.integers(0, NUM, 6))
                t = torch.from_numpy(self.rng.integers(0, NUM, 6))
                c = t.clone()
                c[::2] = h[::2]  # corrupted tails share ids with the heads
                bags = torch.from_numpy(self.rng.integers(0, NUM, 6))

                def loss(emb_h, emb_t, emb_c, emb_b):
                    return ((emb_h - emb_t) ** 2).sum() - 0.5 * ((emb_h - emb_c) ** 2).sum() + emb_b.sum()

                mine = loss(e1(h), e1(t), e1(c), e2(bags, torch.tensor([0, 3])))
                theirs = loss(F_emb(h, ref), F_emb(t, ref), F_emb(c, ref),
                              torch.nn.functional.embedding_bag(bags, ref, torch.tensor([0, 3]), mode="sum"))
                if kind != "adam":  # (see below)
                    np.testing.assert_allclose(mine.item(), theirs.item(), rtol=1e-5)
                mine.backward()
                opt.zero_grad()
                theirs.backward()
                opt.step()
                steps_of[np.unique(torch.cat([h, t, c, bags]).numpy())] += 1
            clocks = dict(self.conn.execute("SELECT id, clock FROM %s" % name).fetchall())
            self.assertEqual(clocks, {i: int(steps_of[i]) for i in range(NUM)}, kind)
            ids, got = self.rows(name)
            if kind == "adam":
                # torch's Adam steps every row each step (a dense parameter,
                # moments decaying where the gradient is 0); the table steps
                # the rows of the step only, by their clock: the clocks
                # above are the check (test_adam_counts_one_step the value).
                continue
            np.testing.assert_allclose(got, ref.detach().numpy()[ids], rtol=1e-5, atol=1e-5, err_msg=kind)

    def test_adam_counts_one_step(self):
        self.conn.execute("CREATE VIRTUAL TABLE a USING embkv(dim=2, optimizer='adam', lr=0.1)")
        self.conn.execute("INSERT INTO a(id, vec) VALUES (0, '[1,1]')")
        emb = ekt.Embedding(self.conn, "a")
        i = torch.tensor([0, 0])
        (emb(i).sum() + emb(i).sum()).backward()
        vec, clock = self.conn.execute("SELECT vec, clock FROM a").fetchone()
        self.assertEqual(clock, 1)
        # Adam's first step moves each element by lr (bias-corrected m / sqrt(v))
        np.testing.assert_allclose(np.frombuffer(vec, np.float32), [0.9, 0.9], rtol=1e-5)

    def test_rows_without_gradient_get_their_permits_back(self):
        self.table_like("u", np.zeros((NUM, DIM), np.float32), staleness=0, wait_ms=200)
        emb = ekt.Embedding(self.conn, "u")
        used, unused = emb(torch.tensor([1, 2])), emb(torch.tensor([3, 4]))
        used.sum().backward()
        del unused
        ids = np.array([1, 2, 3, 4], np.int64)
        embkv.pull(self.conn, "u", ids)  # no permit left out: no wait
        self.assertEqual(embkv.release(self.conn, "u", ids), 4)
        clocks = dict(self.conn.execute("SELECT id, clock FROM u WHERE id IN (1, 2, 3, 4)").fetchall())
        self.assertEqual(clocks, {1: 1, 2: 1, 3: 0, 4: 0})

    def test_shared_id_with_and_without_gradient(self):
        """Two forwards share id 2; only the first gets a gradient: 2 is
        updated once (the push returns its one permit), 3 goes back without
        an update."""
        self.table_like("v", np.zeros((NUM, DIM), np.float32), staleness=0, wait_ms=200)
        emb = ekt.Embedding(self.conn, "v")
        used, unused = emb(torch.tensor([1, 2, 2])), emb(torch.tensor([2, 3]))
        used.sum().backward()
        del unused
        ids = np.array([1, 2, 3], np.int64)
        embkv.pull(self.conn, "v", ids)  # no permit left out: no wait
        self.assertEqual(embkv.release(self.conn, "v", ids), 3)
        rows = dict(self.conn.execute("SELECT id, clock FROM v WHERE id IN (1, 2, 3)").fetchall())
        self.assertEqual(rows, {1: 1, 2: 1, 3: 0})
        v2 = np.frombuffer(self.conn.execute("SELECT vec FROM v WHERE id = 2").fetchone()[0], np.float32)
        np.testing.assert_allclose(v2, np.full(DIM, -0.01 * 2, np.float32), rtol=1e-6)  # two occurrences, sgd

    def test_in_place_on_the_output(self):
        """An Embedding's output is its own tensor, as torch's: in-place
        operations on it work and the gradient flows through them."""
        self.table_like("ip", np.ones((NUM, DIM), np.float32))
        emb = ekt.Embedding(self.conn, "ip")
        x = emb(torch.tensor([[4, 5], [4, 6]]))
        x.mul_(3.0)
        x.sum().backward()
        got = dict((i, np.frombuffer(v, np.float32)[0]) for i, v in
                   self.conn.execute("SELECT id, vec FROM ip WHERE id IN (4, 5, 6)").fetchall())
        np.testing.assert_allclose([got[4], got[5], got[6]], [1 - 0.01 * 6, 1 - 0.01 * 3, 1 - 0.01 * 3], rtol=1e-6)

    def test_no_grad_forward_inside_a_step(self):
        self.table_like("g", np.ones((NUM, DIM), np.float32), staleness=0, wait_ms=200)
        emb = ekt.Embedding(self.conn, "g")
        out = emb(torch.tensor([1, 2]))
        with torch.no_grad():
            seen = emb(torch.tensor([2, 3]))  # 2 from the step, 3 pulled and released
        np.testing.assert_array_equal(seen.numpy(), np.ones((2, DIM), np.float32))
        out.sum().backward()
        self.assertEqual(self.conn.execute("SELECT clock FROM g WHERE id = 2").fetchone()[0], 1)

    def test_update_step_accumulates_until_step(self):
        w0 = self.rng.normal(0, 1, (NUM, DIM)).astype(np.float32)
        self.table_like("acc", w0, optimizer="adagrad", lr=0.1)
        emb = ekt.EmbeddingBag(self.conn, "acc", mode="mean", update="step")
        ref = torch.nn.EmbeddingBag(NUM, DIM, mode="mean", sparse=True)
        with torch.no_grad():
            ref.weight.copy_(torch.from_numpy(w0))
        opt = torch.optim.Adagrad(ref.parameters(), lr=0.1, initial_accumulator_value=0.0, eps=1e-10)
        for step in range(4):
            opt.zero_grad()
            for micro in range(3):  # three micro-batches, one update
                ids = torch.from_numpy(self.rng.integers(0, NUM, 8))
                off = torch.tensor([0, 5])
                out, out_ref = emb(ids, off), ref(ids, off)
                np.testing.assert_allclose(out.detach().numpy(), out_ref.detach().numpy(), rtol=1e-5, atol=1e-6)
                (out ** 2).sum().backward()
                (out_ref ** 2).sum().backward()
            if step == 0:  # nothing applied before step()
                ids, got = self.rows("acc")
                np.testing.assert_array_equal(got, w0[ids])
            self.assertGreater(emb.step(), 0)
            opt.step()
        ids, got = self.rows("acc")
        np.testing.assert_allclose(got, ref.weight.detach().numpy()[ids], rtol=1e-5, atol=1e-5)
        self.assertLessEqual(self.conn.execute("SELECT max(clock) FROM acc").fetchone()[0], 4)
        self.assertEqual(emb.step(), 0)  # nothing open

    def test_modes_must_agree(self):
        self.table_like("m", np.zeros((NUM, DIM), np.float32))
        a = ekt.Embedding(self.conn, "m")
        b = ekt.Embedding(self.conn, "m", update="step")
        out = a(torch.tensor([1]))
        with self.assertRaisesRegex(ValueError, "modules of table 'm' on one connection disagree: "
                                                "update='backward' and 'step'"):
            b(torch.tensor([1]))
        out.sum().backward()
        with self.assertRaisesRegex(ValueError, "update must be 'backward'"):
            ekt.Embedding(self.conn, "m", update="each")

    def test_a_later_backward_is_its_own_update(self):
        self.table_like("l", np.zeros((NUM, DIM), np.float32), init="zeros")
        emb = ekt.Embedding(self.conn, "l")
        x, y = emb(torch.tensor([1])), emb(torch.tensor([1]))
        x.sum().backward()   # the step's update: clock 1
        y.sum().backward()   # y's step is over: an update of its own
        self.assertEqual(self.conn.execute("SELECT clock FROM l WHERE id = 1").fetchone()[0], 2)


class TestAdmission(Base):
    def test_rows_from_the_nth_step(self):
        """admit='count(3)': the first two steps of a new id read its
        initial values and update nothing; the third stores it (from those
        values) and its update applies."""
        emb = ekt.Embedding(self.conn, "adm", dim=DIM, optimizer="sgd", lr=0.5, init="uniform(-1,1)",
                            admit="count(3)")
        ids = torch.tensor([7, 8])
        first = None
        for step in range(3):
            out = emb(ids)
            if first is None:
                first = out.detach().numpy().copy()
            np.testing.assert_array_equal(out.detach().numpy(), first)  # nothing applied before
            out.sum().backward()
            rows = self.conn.execute("SELECT count(*) FROM adm").fetchone()[0]
            self.assertEqual(rows, 0 if step < 2 else 2)
        vec, clock = self.conn.execute("SELECT vec, clock FROM adm WHERE id = 7").fetchone()
        np.testing.assert_allclose(np.frombuffer(vec, np.float32), first[0] - 0.5, rtol=1e-6)
        self.assertEqual(clock, 1)
        # step() says the rows updated: none while they are not admitted
        acc = ekt.Embedding(self.conn, "adm2", dim=DIM, init="zeros", admit="count(3)", update="step")
        acc(torch.tensor([1, 2, 3])).sum().backward()
        self.assertEqual(acc.step(), 0)
        for _ in range(2):
            acc(torch.tensor([1, 2, 3])).sum().backward()
            n = acc.step()
        self.assertEqual(n, 3)


class TestDtype(Base):
    def test_bf16_rows_train_as_rounded_float32(self):
        """dtype='bf16': the module's rows are bfloat16 values (their low
        16 bits zero as float32), and follow a float32 torch model to
        within bfloat16's step; the records are smaller."""
        emb = ekt.Embedding(self.conn, "bf", dim=8, dtype="bf16", init="uniform(-1,1)", seed=3,
                            optimizer="sgd", lr=0.1)
        ids = torch.tensor([1, 2, 3])
        ref = torch.nn.Parameter(emb(ids).detach().clone())
        for step in range(5):
            g = torch.linspace(-1, 1, 24).reshape(3, 8) * (step + 1)
            (emb(ids) * g).sum().backward()
            with torch.no_grad():
                ref -= 0.1 * g
                ref.copy_(ref.to(torch.bfloat16).to(torch.float32))
        rows = np.stack([np.frombuffer(v, np.float32) for (v,) in
                         self.conn.execute("SELECT vec FROM bf ORDER BY id")])
        self.assertTrue(np.all(rows.view(np.uint32) & 0xFFFF == 0))
        np.testing.assert_allclose(rows, ref.detach().numpy(), rtol=2 ** -7, atol=1e-6)
        st = json.loads(self.conn.execute("SELECT embkv_stats('bf')").fetchone()[0])
        self.assertEqual((st["dtype"], st["record_bytes"]), ("bf16", 64))


class TestEviction(Base):
    def evict(self, table):
        return json.loads(self.conn.execute("SELECT embkv_evict(?)", (table,)).fetchone()[0])

    def test_ttl_steps_count_training_steps(self):
        """ttl_steps=2: a step is one update of the table (one push a
        backward pass, however many forwards); an id not in the last two
        steps' checkpoints is evicted."""
        emb = ekt.Embedding(self.conn, "ev", dim=DIM, init="zeros", ttl_steps=2)
        batches = [[1, 2], [1], [1]]
        for step, ids in enumerate(batches, 1):
            x = torch.tensor(ids)
            (emb(x).sum() + emb(x).sum()).backward()  # two forwards, one step
            self.conn.execute("SELECT embkv_checkpoint('ev')").fetchone()
            st = json.loads(self.conn.execute("SELECT embkv_stats('ev')").fetchone()[0])
            self.assertEqual(st["training"]["eviction"]["step"], step)
            got = self.evict("ev")
            self.assertEqual(got["expired"], 1 if step == 3 else 0)
        ids = [r[0] for r in self.conn.execute("SELECT id FROM ev ORDER BY id")]
        self.assertEqual(ids, [1])

    def test_rows_of_a_step_in_flight_stay(self):
        """max_rows=1: rows pulled by a forward whose backward has not
        run are kept (counted), and evicted once it has."""
        emb = ekt.Embedding(self.conn, "mx", dim=DIM, init="zeros", max_rows=1, evict="lru")
        out = emb(torch.tensor([5, 6]))
        self.conn.execute("SELECT embkv_checkpoint('mx')").fetchone()  # (rows since the last are never evicted)
        got = self.evict("mx")
        self.assertEqual((got["over_max_rows"], got["kept_pulled"]), (0, 1))
        self.assertEqual(self.conn.execute("SELECT count(*) FROM mx").fetchone()[0], 2)
        out.sum().backward()
        self.conn.execute("SELECT embkv_checkpoint('mx')").fetchone()
        got = self.evict("mx")
        self.assertEqual((got["over_max_rows"], got["kept_pulled"]), (1, 0))
        self.assertEqual([r[0] for r in self.conn.execute("SELECT id FROM mx")], [6])


def F_emb(ids, weight):
    return torch.nn.functional.embedding(ids, weight)


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

    def test_a_push_refused_in_a_transaction_returns_them(self):
        """A backward (or step()) while the connection has uncommitted
        writes to the table: the push is refused, and its permits go back
        all the same, so that after the COMMIT the ids can be pulled again
        from this connection and from another."""
        for update in ("backward", "step"):
            emb = ekt.EmbeddingBag(self.conn, "s", dim=DIM, mode="sum", init="zeros", staleness=0, wait_ms=300,
                                   update=update)
            out = emb(self.ids, self.offsets)
            self.conn.execute("BEGIN")
            self.conn.execute("INSERT INTO s(id, vec) VALUES (-7, ?)", (np.zeros(DIM, np.float32).tobytes(),))
            with self.assertRaisesRegex(sqlite3.OperationalError, "embkv_push: table s: this connection has "
                                        "uncommitted writes to the table; COMMIT them first"):
                out.sum().backward()
                if update == "step":
                    emb.step()
            self.conn.execute("COMMIT")
            del out
            self.pull_again()
            other = embkv.connect(self.db)
            ids = np.array([5, 6, 7], dtype=np.int64)
            embkv.pull(other, "s", ids)
            self.assertEqual(embkv.release(other, "s", ids), 3)
            other.close()
            self.assertEqual(self.conn.execute("SELECT max(clock) FROM s").fetchone()[0], 0)
            self.conn.execute("DELETE FROM s WHERE id = -7")

    def test_a_nan_returns_the_permits_at_the_next_forward(self):
        """The pass raised in the step's own hook, the batch tensor still
        alive: the table's next forward returns the failed step's permits
        (not its backward), and the failed step updates nothing."""
        out = self.emb(self.ids, self.offsets)
        with self.assertRaisesRegex(ValueError, "id 5: gradient element 0 is NaN"):
            (out * float("nan")).sum().backward()
        nxt = self.emb(torch.tensor([8]), torch.tensor([0]))
        other = embkv.connect(self.db)
        self.addCleanup(other.close)
        ids = np.array([5, 6, 7], dtype=np.int64)
        embkv.pull(other, "s", ids)  # at staleness 0: would wait 300 ms and fail if one were out
        self.assertEqual(embkv.release(other, "s", ids), 3)
        nxt.sum().backward()
        self.assertEqual(dict(self.conn.execute("SELECT id, clock FROM s").fetchall()), {5: 0, 6: 0, 7: 0, 8: 1})
        del out

    def test_a_nan_in_one_table_updates_no_table_of_the_pass(self):
        """One backward over three tables, one gradient NaN: the pass
        raises naming the table and the id, no table is updated, and each
        step's permits go back once its tensors are freed."""
        mods = {n: ekt.Embedding(self.conn, n, dim=2, init="zeros", lr=1, staleness=0, wait_ms=100) for n in "abc"}
        oa, ob, oc = (mods[n](torch.tensor([1, 3])) for n in "abc")
        with self.assertRaises(ValueError) as cm:
            (oa.sum() + (ob * torch.tensor([[1.0, 1.0], [1.0, float("inf")]])).sum() + oc.sum()).backward()
        self.assertEqual(str(cm.exception), "embkv.torch: table 'b': id 3: gradient element 1 is infinite: the "
                                            "backward pass updated no table")
        del oa, ob, oc, cm
        for n in "abc":
            self.assertEqual(self.conn.execute("SELECT max(clock) FROM %s" % n).fetchone()[0], 0, n)
        # (torch's engine may keep the nodes the failed pass did not reach
        # until the thread's next backward: the next step ends them)
        (mods["a"](torch.tensor([1])).sum() + mods["b"](torch.tensor([1])).sum() +
         mods["c"](torch.tensor([1])).sum()).backward()
        other = embkv.connect(self.db)
        for n in "abc":
            self.assertEqual(self.conn.execute("SELECT group_concat(id || ':' || clock) FROM "
                                               "(SELECT id, clock FROM %s ORDER BY id)" % n).fetchone()[0],
                             "1:1,3:0", n)
            embkv.pull(other, n, [1, 3])  # free: no permit left out
            embkv.release(other, n, [1, 3])
        other.close()

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

    def test_freed_on_another_thread_then_a_plain_pull(self):
        """A plain embkv.pull on the connection returns the permits the
        collector could not return on its thread before it pulls."""
        box = [self.emb(self.ids, self.offsets)]
        t = threading.Thread(target=lambda: (box.clear(), gc.collect()))
        t.start()
        t.join()
        self.pull_again()


def no_grad_forward_in_a_thread(emb, ids, caught):
    """A torch.no_grad() forward of ids in a thread of its own, waited for;
    the RuntimeError it raises, if any, goes to caught."""
    def forward():
        try:
            with torch.no_grad():
                emb(torch.tensor(ids))
        except RuntimeError as e:
            caught.append(str(e))
    t = threading.Thread(target=forward)
    t.start()
    t.join()


class TestThreads(Base):
    def test_no_step_keeps_its_connection(self):
        """A no_grad forward, and a forward whose pull failed, leave no
        step behind: the connection goes when the program lets it go."""
        import weakref
        conn = embkv.connect(self.db)
        emb = ekt.Embedding(conn, "t", dim=2, init="zeros", staleness=0, wait_ms=50)
        with torch.no_grad():
            emb(torch.tensor([1]))
        embkv.pull(self.conn, "t", [2])  # (another connection holds 2's permit)
        with self.assertRaisesRegex(sqlite3.OperationalError, "staleness bound 0 reached"):
            emb(torch.tensor([2]))
        ref = weakref.ref(conn)
        del emb, conn
        gc.collect()
        self.assertIsNone(ref())
        embkv.release(self.conn, "t", [2])

    def test_a_no_grad_forward_of_another_thread_is_refused(self):
        """Inference in one thread beside a step open in another, on one
        connection: refused at once (its pull would wait for the step's
        permits holding the connection the step's update needs, until
        wait_ms), and the step still trains."""
        conn = embkv.connect(self.db, check_same_thread=False)
        self.addCleanup(conn.close)
        emb = ekt.Embedding(conn, "th", dim=1, init="zeros", lr=1.0, staleness=0, wait_ms=5000)
        out = emb(torch.tensor([1, 2]))
        caught = []
        t0 = time.monotonic()
        no_grad_forward_in_a_thread(emb, [2], caught)
        self.assertLess(time.monotonic() - t0, 4.0)  # (not the 5 s of wait_ms)
        self.assertEqual(caught, ["embkv.torch: table 'th': a training step on this connection is open in another "
                                  "thread (its forward is not updated yet), and this thread makes a forward: threads "
                                  "that train at once need a connection each (embkv.connect in each thread)"])
        out.sum().backward()
        no_grad_forward_in_a_thread(emb, [2], caught)  # (taking turns: fine)
        self.assertEqual(len(caught), 1)
        self.assertEqual(conn.execute("SELECT id, clock FROM th ORDER BY id").fetchall(), [(1, 1), (2, 1)])

    def test_a_connection_trains_in_one_thread_at_a_time(self):
        """A forward while another thread's step is open on the connection
        raises (it would join that step, whose update would end the other's
        half-way, silently losing gradients); once that step is updated the
        other thread trains, and every update reached the rows."""
        conn = embkv.connect(self.db, check_same_thread=False)
        emb = ekt.Embedding(conn, "th", dim=1, init="zeros", lr=1.0)
        out = emb(torch.tensor([1, 2]))
        caught = []

        def other(ids):
            try:
                emb(torch.tensor(ids)).sum().backward()
            except RuntimeError as e:
                caught.append(str(e))
        t = threading.Thread(target=other, args=([2, 3],))
        t.start()
        t.join()
        self.assertEqual(caught, ["embkv.torch: table 'th': a training step on this connection is open in another "
                                  "thread (its forward is not updated yet), and this thread makes a forward: threads "
                                  "that train at once need a connection each (embkv.connect in each thread)"])
        out.sum().backward()
        t = threading.Thread(target=other, args=([2, 3],))
        t.start()
        t.join()
        self.assertEqual(len(caught), 1)
        self.assertEqual(conn.execute("SELECT group_concat(id || ':' || embkv_json(vec) || ':' || clock) "
                                      "FROM (SELECT id, vec, clock FROM th ORDER BY id)").fetchone()[0],
                         "1:[-1]:1,2:[-2]:2,3:[-1]:1")
        conn.close()


EXIT_WITH_AN_OUTPUT_ALIVE = r"""
import sys, torch, embkv, embkv.torch as ekt
conn = embkv.connect(sys.argv[1])
emb = ekt.Embedding(conn, "user", dim=2, init="zeros", lr=1.0)
for step in range(20):
    emb(torch.tensor([step % 5, 7])).sum().backward()
pred = emb(torch.tensor([1, 2]))  # alive at exit: its step holds the connection
"""


EXIT_WITH_A_THREADS_CONNECTION = r"""
import sys, threading, embkv, numpy as np
keep = []
started, never = threading.Event(), threading.Event()
def work():
    c = embkv.connect(sys.argv[1])
    c.execute("CREATE VIRTUAL TABLE user USING embkv(dim=2, init='zeros', lr=1)")
    embkv.push(c, "user", [7], np.ones((1, 2), np.float32))
    embkv.checkpoint(c, "user")
    embkv.push(c, "user", [7], np.ones((1, 2), np.float32))
    keep.append(c)
    started.set()
    if sys.argv[2] == "runs":
        never.wait()  # (a daemon thread still running at exit)
t = threading.Thread(target=work, name="trainer", daemon=True)
t.start()
started.wait()
if sys.argv[2] == "ended":
    t.join()
"""


# A collection started by an allocation inside the package's locked
# sections runs finalizers (a batch tensor's, returning its step's permits)
# that take the same locks in the same thread: argv[2] says where.
COLLECTION_INSIDE_A_LOCK = r"""
import faulthandler, gc, sys, torch, numpy as np, embkv, embkv.torch as ekt
conn = embkv.connect(sys.argv[1])
emb = ekt.Embedding(conn, "t", dim=2, init="zeros")
emb2 = ekt.Embedding(conn, "u", dim=2, init="zeros")
gc.disable()
out = emb(torch.tensor([1]))
box = [out]
box.append(box)  # (a cycle: only a collection frees it)
del out, box
fired = []
def at(frame, event, arg):
    if fired:
        return
    if sys.argv[2] == "deferred":
        hit = event == "c_call" and frame.f_code.co_name == "_flush_deferred" and getattr(arg, "__name__", "") == "pop"
    else:
        hit = event == "call" and frame.f_code.co_name == "__init__" and type(frame.f_locals.get("self")).__name__ == "_Step"
    if hit:
        fired.append(1)
        sys.setprofile(None)
        gc.collect()
faulthandler.dump_traceback_later(20, exit=True)
if sys.argv[2] == "deferred":
    embkv._defer_release(conn, "t", np.array([99], np.int64))
    sys.setprofile(at)
    embkv.pull(conn, "t", [5])
else:
    sys.setprofile(at)
    with torch.no_grad():
        emb2(torch.tensor([7]))
sys.setprofile(None)
print("done", fired)
"""


class TestFinalizers(Base):
    def test_a_collection_inside_a_lock(self):
        """No deadlock when a finalizer runs inside the package's own
        locked sections (the deferred permits', a step's making)."""
        import subprocess
        for where in ("deferred", "step"):
            out = subprocess.run([sys.executable, "-c", COLLECTION_INSIDE_A_LOCK, self.db + where, where],
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual((out.returncode, out.stdout), (0, "done [1]\n"), (where, out.stderr[-2000:]))

    def test_another_threads_forward_during_a_backward(self):
        """A forward of another thread in the middle of the owner's
        backward pass is refused, and leaves the owner's update whole (it
        once took the step for a failed one and dropped it)."""
        conn = embkv.connect(self.db, check_same_thread=False)
        self.addCleanup(conn.close)
        emb = ekt.Embedding(conn, "t", dim=2, init="zeros", lr=1.0, staleness=0, wait_ms=200)
        caught = []

        class Meanwhile(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 1

            @staticmethod
            def backward(ctx, g):
                no_grad_forward_in_a_thread(emb, [9], caught)
                return g
        x = torch.ones(1, requires_grad=True)
        y = Meanwhile.apply(x)  # (made first: the pass reaches it after the embedding's hook)
        out = emb(torch.tensor([1, 2]))
        (out.sum() + y.sum()).backward()
        self.assertEqual(len(caught), 1)
        self.assertIn("a training step on this connection is open in another thread", caught[0])
        self.assertEqual(conn.execute("SELECT id, clock FROM t ORDER BY id").fetchall(), [(1, 1), (2, 1)])


class TestExit(Base):
    def exit_with_a_threads_connection(self, how):
        import subprocess
        out = subprocess.run([sys.executable, "-c", EXIT_WITH_A_THREADS_CONNECTION, self.db, how],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        got = self.conn.execute("SELECT clock, embkv_json(vec) FROM user WHERE id = 7").fetchone()
        recovered = json.loads(self.conn.execute("SELECT embkv_stats('user')").fetchone()[0])["durability"]["recovered"]
        return out.stderr, got, recovered

    def test_a_connection_of_an_ended_thread_closes_at_exit(self):
        """Only its thread may close it (check_same_thread), but once the
        thread has ended the interpreter's exit frees it: a close as any,
        the push after the checkpoint kept, nothing said."""
        self.assertEqual(self.exit_with_a_threads_connection("ended"), ("", (2, "[-2,-2]"), False))

    def test_a_connection_of_a_running_thread_is_named_at_exit(self):
        """A daemon thread still running at exit holds its connection: the
        exit names it (database and thread), and its store is as of its
        last checkpoint, as the message says."""
        err, got, recovered = self.exit_with_a_threads_connection("runs")
        self.assertEqual(err, "embkv: the connection to %s made in thread 'trainer', which still runs, was open at "
                              "exit; only that thread may close it (sqlite3's check_same_thread), so its stores keep "
                              "what their last checkpoint holds: close it in its thread (or checkpoint there) before "
                              "the exit to keep the rest\n" % self.db)
        self.assertEqual((got, recovered), ((1, "[-1,-1]"), True))

    def test_a_normal_exit_closes_the_connection(self):
        """Training since the last checkpoint is kept at a normal exit,
        also with an output (and so its connection) alive then."""
        import subprocess
        out = subprocess.run([sys.executable, "-c", EXIT_WITH_AN_OUTPUT_ALIVE, self.db], capture_output=True,
                             text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        got = self.conn.execute("SELECT count(*), sum(clock), embkv_json(vec) FROM user WHERE id = 7").fetchone()
        self.assertEqual(got, (1, 20, "[-20,-20]"))
        self.assertEqual(self.conn.execute("SELECT sum(clock) FROM user").fetchone()[0], 40)
        self.assertFalse(json.loads(self.conn.execute("SELECT embkv_stats('user')").fetchone()[0])
                         ["durability"]["recovered"])


class TestMisuse(Base):
    """What a training loop may do that a plain one would not expect:
    a backward that raises, ids changed in place, one table under two
    names, a backward long after its step."""

    def setUp(self):
        super().setUp()
        self.other = embkv.connect(self.db)
        self.emb = ekt.Embedding(self.conn, "t", dim=2, init="zeros", lr=1.0, staleness=0, wait_ms=200)

    def tearDown(self):
        self.other.close()
        super().tearDown()

    def free(self, ids):
        """Another connection pulls ids at once (no permit left out)."""
        a = np.array(ids, np.int64)
        embkv.pull(self.other, "t", a)
        embkv.release(self.other, "t", a)

    def clock(self, i):
        return self.conn.execute("SELECT clock FROM t WHERE id = ?", (i,)).fetchone()[0]

    def test_a_backward_that_raises(self):
        """The pass fails after the embedding's hook: no update, the permits
        go back, and the table trains at the next step."""
        class Boom(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.clone()

            @staticmethod
            def backward(ctx, g):
                raise RuntimeError("boom")

        w = torch.ones(1, requires_grad=True)
        b = Boom.apply(w)  # made first: autograd runs it after the embedding's branch
        x = self.emb(torch.tensor([1]))
        with self.assertRaises(RuntimeError):
            (b.sum() + x.sum()).backward()
        del b, x
        gc.collect()
        for _ in range(3):
            self.emb(torch.tensor([2])).sum().backward()
        self.assertEqual(self.clock(2), 3)
        self.assertEqual(self.clock(1), 0)
        self.free([1, 2])

    def test_ids_changed_in_place_before_backward(self):
        buf = torch.tensor([1, 2])
        out = self.emb(buf)
        buf.copy_(torch.tensor([6, 7]))
        out.sum().backward()
        self.assertEqual(dict(self.conn.execute("SELECT id, clock FROM t").fetchall()), {1: 1, 2: 1})
        self.free([1, 2, 6, 7])

    def test_one_table_two_names(self):
        other = ekt.Embedding(self.conn, "main.T")
        i = torch.tensor([1])
        (self.emb(i).sum() + other(i).sum()).backward()  # at staleness 0: no wait for itself
        self.assertEqual(self.clock(1), 1)
        vec = np.frombuffer(self.conn.execute("SELECT vec FROM t WHERE id = 1").fetchone()[0], np.float32)
        np.testing.assert_array_equal(vec, [-2, -2])

    def test_late_backward_leaves_the_open_steps_permits(self):
        a, b = self.emb(torch.tensor([10, 12])), self.emb(torch.tensor([11]))
        b.sum().backward()                 # step 1: 10 and 12 back without an update
        y = self.emb(torch.tensor([10]))   # step 2 holds 10
        a.sum().backward()                 # late: 12 its own update, 10 joins step 2's
        self.assertEqual((self.clock(12), self.clock(10)), (1, 0))
        with self.assertRaises(sqlite3.OperationalError):
            embkv.pull(self.other, "t", np.array([10], np.int64))  # still step 2's
        y.sum().backward()
        self.assertEqual(self.clock(10), 1)
        vec = np.frombuffer(self.conn.execute("SELECT vec FROM t WHERE id = 10").fetchone()[0], np.float32)
        np.testing.assert_array_equal(vec, [-2, -2])
        self.free([10, 11, 12])


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

    def test_an_unknown_option_is_named_as_such(self):
        self.conn.execute("CREATE VIRTUAL TABLE t USING embkv(dim=3)")
        with self.assertRaises(ValueError) as cm:
            ekt.Embedding(self.conn, "t", dim=3, weight_decay=0.1)
        self.assertTrue(str(cm.exception).startswith("embkv.torch: table 't': unknown option 'weight_decay' "
                                                     "(options: dim, path, "), str(cm.exception))

    def test_a_schema_not_attached(self):
        """schema.name of a database not attached is refused (it would
        make a table of main named with the dot), naming the schema; the
        quoted name makes that table when it is meant."""
        with self.assertRaises(ValueError) as cm:
            ekt.Embedding(self.conn, "nosch.tt", dim=2)
        self.assertEqual(str(cm.exception), "embkv.torch: table 'nosch.tt': no database 'nosch' is attached to this "
                                            "connection: ATTACH it first, or, for a table of main whose name holds "
                                            "the dot, quote the name as SQL does ('\"nosch.tt\"')")
        self.assertEqual(self.conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0], 0)
        ekt.Embedding(self.conn, '"nosch.tt"', dim=2)
        ekt.Embedding(self.conn, "nosch.tt", dim=2)  # (now a table of main: found as it is)
        self.conn.execute("ATTACH ? AS nosch", (self.db + "-other",))
        self.assertEqual(ekt.Embedding(self.conn, "nosch.tt", dim=2)._key, ("nosch", "tt"))

    def test_a_module_is_not_pickled(self):
        import copy
        import pickle
        emb = ekt.Embedding(self.conn, "t", dim=3, init="zeros")
        for f in (copy.deepcopy, pickle.dumps):
            with self.assertRaises(TypeError) as cm:
                f(emb)
            self.assertTrue(str(cm.exception).startswith("embkv.torch: a module over table 't' holds its database "
                                                         "connection, which cannot be pickled or copied"))
        self.assertEqual(list(torch.nn.Sequential(emb).state_dict()), [])

    def test_a_closed_connection_is_named_with_the_table(self):
        emb = ekt.Embedding(self.conn, "t", dim=3, init="zeros")
        out = emb(torch.tensor([1]))
        self.conn.close()
        with self.assertRaises(sqlite3.ProgrammingError) as cm:
            out.sum().backward()
        self.assertEqual(str(cm.exception), "embkv.push: table t: Cannot operate on a closed database.")
        self.assertNotIn(id(self.conn), embkv._deferred)  # (nothing kept for it: its permits went with it)
        self.conn = embkv.connect(self.db)  # (for tearDown)

    def test_ids_must_be_integers(self):
        emb = ekt.Embedding(self.conn, "t", dim=3, init="zeros")
        for bad in (torch.tensor([1.7]), torch.tensor([True])):
            with self.assertRaisesRegex(TypeError, "LongTensor or IntTensor"):
                emb(bad)
        bag = ekt.EmbeddingBag(self.conn, "t", mode="sum")
        for m in (emb, bag):
            for bad, name in (([1, 2], "list"), (np.array([1]), "ndarray"), (3, "int")):
                with self.assertRaises(TypeError) as e:
                    m(bad)
                self.assertEqual(str(e.exception), "embkv.torch: ids must be a LongTensor or IntTensor (as "
                                                   "torch.nn.Embedding's), not %s" % name)
        with self.assertRaisesRegex(TypeError, "ids must be integers"):
            embkv.pull(self.conn, "t", np.array([1.9]))
        with self.assertRaisesRegex(ValueError, "does not fit in int64"):
            embkv.pull(self.conn, "t", np.array([2**64 - 1], dtype=np.uint64))
        self.assertEqual(embkv.pull(self.conn, "t", []).shape, (0, 3))
        with self.assertRaisesRegex(ValueError, "grads must have shape"):
            embkv.push(self.conn, "t", [1, 2], np.zeros((1, 3), np.float32))

    def test_module_arguments_as_torch_takes_them(self):
        for kw, err in ((dict(dim=True), "dim must be an integer, not True"),
                        (dict(dim=4.0), "dim must be an integer, not 4.0"),
                        (dict(dim="4"), "dim must be an integer, not '4'"),
                        (dict(dim=4, padding_idx=1.9), "padding_idx must be an integer, not 1.9"),
                        (dict(dim=4, padding_idx=True), "padding_idx must be an integer, not True")):
            with self.assertRaises(TypeError) as cm:
                ekt.Embedding(self.conn, "p", **kw)
            self.assertEqual(str(cm.exception), "embkv.torch: " + err)
        for kw, err in ((dict(dim=0), "dim must be from 1 to 8192, not 0"),
                        (dict(dim=4, padding_idx=2 ** 70), "padding_idx 1180591620717411303424 does not fit in "
                                                           "int64 (ids are int64)"),
                        (dict(dim=4, **{"lr=1, dim": 5}), "'lr=1, dim' is not an option name (options are the "
                                                          "table's, as in CREATE VIRTUAL TABLE ... USING "
                                                          "embkv(...))")):
            with self.assertRaises(ValueError) as cm:
                ekt.Embedding(self.conn, "p", **kw)
            self.assertEqual(str(cm.exception), "embkv.torch: " + err)
        with self.assertRaises(TypeError) as cm:
            ekt.Embedding(self.conn, "p", dim=4, max_norm=1.0)
        self.assertEqual(str(cm.exception), "embkv.torch: torch.nn.Embedding's argument max_norm is not "
                                            "embkv.torch's: the rows are the table's (float32 vectors its optimizer "
                                            "updates, its dtype option for reduced precision)")
        self.assertIsNone(self.conn.execute("SELECT 1 FROM sqlite_schema WHERE name = 'p'").fetchone())
        emb = ekt.Embedding(self.conn, "p", dim=np.int64(2), padding_idx=np.int64(3), init="zeros")
        self.assertEqual(repr(emb), "Embedding(table='p', dim=2, padding_idx=3)")
        for bad, err in ((torch.tensor([1.5]), TypeError), (torch.tensor([True]), TypeError), ([2.5], TypeError),
                         (np.array([2 ** 64 - 1], np.uint64), ValueError)):
            with self.assertRaises(err):
                emb.lookahead(bad)

    def test_batches_without_rows_are_outputs_of_the_graph(self):
        """An empty batch, and a bag of padding only, give outputs that
        require grad, as torch's do: a loss over them may call backward."""
        emb = ekt.Embedding(self.conn, "g", dim=2, padding_idx=0, init="zeros")
        bag = ekt.EmbeddingBag(self.conn, "g", padding_idx=0)
        for out in (emb(torch.tensor([], dtype=torch.long)), bag(torch.tensor([], dtype=torch.long), torch.tensor([0])),
                    bag(torch.tensor([0, 0]), torch.tensor([0]))):
            self.assertTrue(out.requires_grad)
            out.sum().backward()
        self.assertEqual(self.conn.execute("SELECT count(*) FROM g").fetchone()[0], 0)

    def test_lookahead_without_an_ssd_tier_queues_nothing(self):
        emb = ekt.Embedding(self.conn, "t", dim=3, init="zeros")
        self.assertEqual(emb.lookahead(torch.tensor([1, 2, 3])), 0)
        self.assertEqual(emb.lookahead(torch.tensor([], dtype=torch.int64)), 0)  # (as embkv.pull takes no ids)

    def test_bad_mode(self):
        with self.assertRaisesRegex(ValueError, "mode must be 'sum' or 'mean'"):
            ekt.EmbeddingBag(self.conn, "t", dim=3, mode="max")

    def test_missing_row_without_initializer_names_the_id(self):
        emb = ekt.Embedding(self.conn, "t", dim=3)
        with self.assertRaisesRegex(Exception, "id 42"):
            emb(torch.tensor([42]))


if __name__ == "__main__":
    unittest.main()
