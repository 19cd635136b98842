-- embkv_knn: the k nearest rows, exact values on a small table whose
-- distances are exactly representable; every metric, batches, filters,
-- the open transaction's own writes, ties, and every error.
.headers off
.mode list
.nullvalue NULL
.bail off

CREATE VIRTUAL TABLE item USING embkv(dim=2);
INSERT INTO item(id, vec) VALUES (1, '[0,0]'), (2, '[3,4]'), (3, '[0,2]'), (4, '[-3,-4]'), (5, '[6,8]'), (6, '[0,-2]');

-- L2 (the default): Euclidean distance, nearest first; equal distances by smaller id (3 and 6).
SELECT 'l2', id, distance FROM embkv_knn('item', '[0,0]', 4);
SELECT 'l2-named', id, distance FROM embkv_knn('item', '[3,4]', 2, 'L2');
-- k as a REAL with no fraction (a float from Python, 1e1) counts.
SELECT 'k-real', id, distance FROM embkv_knn('item', '[3,4]', 2.0);
SELECT 'k-real', count(*) FROM embkv_knn('item', '[3,4]', 1e1);
-- The column form: ids with no metric is l2.
SELECT 'col-ids', id, distance FROM embkv_knn WHERE tbl = 'item' AND q = '[3,4]' AND k = 2 AND ids = '[1,2]';
-- cosine: 1 - cosine similarity; the zero row (id 1) has none and is left out.
SELECT 'cosine', id, round(distance, 6) FROM embkv_knn('item', '[3,4]', 6, 'cosine');
-- dot: minus the inner product.
SELECT 'dot', id, distance FROM embkv_knn('item', '[1,0.5]', 3, 'dot');
-- A batch: a JSON array of arrays (or n x dim float32), answered in one pass;
-- query numbers its vector, rank its place.
SELECT 'batch', query, rank, id, distance FROM embkv_knn('item', '[[0,0],[6,8],[0,-1]]', 2);
SELECT 'batch-blob', query, rank, id FROM embkv_knn('item', x'0000000000000000000040c000000041', 1);
-- Fewer rows than k: what there is.
SELECT 'k-large', count(*) FROM embkv_knn('item', '[0,0]', 100);
-- ids (argument 5): the nearest among those ids, not the k nearest filtered
-- (NULL for the metric: the default).
SELECT 'ids', id, distance FROM embkv_knn('item', '[0,0]', 2, 'l2', '[5, 4, 2, 99, 4]');
SELECT 'ids-one', id, distance FROM embkv_knn('item', '[0,0]', 3, NULL, 5);
SELECT 'ids-blob', id FROM embkv_knn('item', '[0,0]', 3, 'dot', x'0500000000000000');
SELECT 'ids-none', count(*) FROM embkv_knn('item', '[0,0]', 3, 'l2', '[98, 99]');
-- WHERE id filters the k found afterwards, as SQL does (and so does a join).
SELECT 'where', id, distance FROM embkv_knn('item', '[0,0]', 2) WHERE id IN (5, 4, 2, 3);
-- Hidden columns read back; ORDER BY and LIMIT as usual.
SELECT 'cols', y.tbl, y.k, y.metric, x.ids FROM embkv_knn('item', '[0,0]', 1, 'dot') AS y, embkv_knn('item', '[0,0]', 1, 'l2', '[2]') AS x;
SELECT 'order', id FROM embkv_knn('item', '[0,0]', 6) ORDER BY id DESC LIMIT 2;
-- Joined with the table for the vectors.
SELECT 'join', k.id, embkv_json(i.vec) FROM embkv_knn('item', '[6,7]', 2) AS k JOIN item AS i ON i.id = k.id ORDER BY k.rank;
-- The open transaction's writes count as written: 7 is nearer than any stored row, 1 is gone.
BEGIN;
INSERT INTO item(id, vec) VALUES (7, '[0.5,0]');
DELETE FROM item WHERE id = 1;
UPDATE item SET vec = '[0,1]' WHERE id = 3;
SELECT 'txn', id, distance FROM embkv_knn('item', '[0,0]', 3);
SELECT 'txn-ids', id, distance FROM embkv_knn('item', '[0,0]', 3, 'l2', '[1, 3, 7]');
ROLLBACK;
SELECT 'rolled-back', id, distance FROM embkv_knn('item', '[0,0]', 2);
-- An empty table.
CREATE VIRTUAL TABLE empty USING embkv(dim=3);
SELECT 'empty', count(*) FROM embkv_knn('empty', '[1,2,3]', 5);

-- Hidden columns without their argument: NULL (ids), the metric used.
SELECT 'hidden', quote(ids), quote(q), metric FROM embkv_knn('item', '[0,0]', 1);
-- k as integer text (SQL's affinity), NULL ids: every row.
SELECT 'k-text', count(*) FROM embkv_knn('item', '[0,0]', '2', 'dot', NULL);
-- Vectors float products cannot hold (norms near 1e20 and 1e-25): scored
-- in double, so distances are right and in order, cosine within [0, 2].
CREATE VIRTUAL TABLE wide USING embkv(dim=2);
INSERT INTO wide(id, vec) VALUES (1, '[1e20,1e20]'), (2, '[1e-25,1e-25]'), (3, '[3e38,3e38]'),
                                 (4, '[1e-40,0]'), (5, '[-1e20,0]'), (6, '[1,1]');
SELECT 'wide-cos', id, round(distance, 6) FROM embkv_knn('wide', '[1,1]', 6, 'cosine');
SELECT 'wide-l2', id, printf('%.6e', distance) FROM embkv_knn('wide', '[0,0]', 6);
SELECT 'wide-l2-batch', query, id, printf('%.6e', distance) FROM embkv_knn('wide', '[[0,0],[1e20,1e20],[1,1]]', 2);
SELECT 'wide-dot', id, printf('%.6e', distance) FROM embkv_knn('wide', '[1,0]', 3, 'dot');
SELECT 'tiny-query', id FROM embkv_knn('wide', '[1e-45,1e-45]', 1, 'cosine');
-- A row equal to the query is at cosine distance 0, its opposite at 2
-- (not a rounding either side of them).
CREATE VIRTUAL TABLE cs USING embkv(dim=3);
INSERT INTO cs(id, vec) VALUES (1, '[1,1,0.1]'), (2, '[-1,-1,-0.1]');
SELECT 'cos-ends', id, distance FROM embkv_knn('cs', '[1,1,0.1]', 2, 'cosine');

-- Errors: each names the table, the argument and what it must be.
SELECT * FROM embkv_knn('item', '[0,0]', 0);
SELECT * FROM embkv_knn('item', '[0,0]', 100001);
SELECT * FROM embkv_knn('item', '[0,0]', 'ten');
SELECT * FROM embkv_knn('item', '[0,0]', NULL);
SELECT * FROM embkv_knn('item', '[0,0]', 2.5);
SELECT * FROM embkv_knn('item', '[0,0,0]', 1);
SELECT * FROM embkv_knn('item', '[[0,0],[1]]', 1);
SELECT * FROM embkv_knn('item', '[0,"a"]', 1);
SELECT * FROM embkv_knn('item', 'not json', 1);
SELECT * FROM embkv_knn('item', '[]', 1);
SELECT * FROM embkv_knn('item', x'000000', 1);
SELECT * FROM embkv_knn('item', x'0000c07f00000000', 1);
SELECT * FROM embkv_knn('item', '[1e39,0]', 1);
SELECT * FROM embkv_knn('item', 42, 1);
SELECT * FROM embkv_knn('item', NULL, 1);
SELECT * FROM embkv_knn('item', '[0,0]', 1, 'hamming');
SELECT * FROM embkv_knn('item', '[0,0]', 1, 'cosine');
SELECT * FROM embkv_knn('item', '[0,0]');
SELECT * FROM embkv_knn('item');
SELECT * FROM embkv_knn(1, '[0,0]', 1);
SELECT * FROM embkv_knn('nosuch', '[0,0]', 1);
CREATE TABLE plain(x);
SELECT * FROM embkv_knn('plain', '[0,0]', 1);
SELECT * FROM embkv_knn('item', zeroblob(8 * 200), 100000);
SELECT * FROM embkv_knn('item', '[0,0]', 1, 'l2', '[1, "x"]');
SELECT * FROM embkv_knn('item', '[0,0]', 1, 'l2', 1.5);
SELECT * FROM embkv_knn('item', '[0,0]', 1, 3);
SELECT * FROM embkv_knn('item', '[[1,2],5,6]', 1);
SELECT * FROM embkv_knn('item', '[0,0]', x'02');
