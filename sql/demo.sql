-- embkv in the sqlite3 shell: a five-minute walkthrough.
--
-- Run it with `make demo` (a fresh temporary directory, cleaned up after), or
-- by hand from the repository root after `make`:
--     sqlite3 demo.db < sql/demo.sql
-- Each statement is echoed before its result.

-- 1. Load the extension.  The file is build/embkv.so; the shell adds the
--    suffix and finds the entry point (sqlite3_embkv_init) from the name.
.load ./build/embkv
.headers on
.mode box
.nullvalue NULL
SELECT embkv_version() AS version;
--    embkv_build() says, as JSON, which optional parts were compiled in.
SELECT key AS part,
       CASE type WHEN 'true' THEN 'yes' WHEN 'false' THEN 'no' ELSE value END AS value
FROM json_each(embkv_build());

-- 2. Create an embedding table: int64 id -> float32[8] vector.  Its data
--    lives in a directory of its own (here demo_item.embkv, beside demo.db).
--    Columns: id INTEGER PRIMARY KEY, vec BLOB, plus the hidden read-only
--    columns clock (updates applied to the row) and tier (where it lives).
CREATE VIRTUAL TABLE item USING embkv(dim=8, path='demo_item.embkv');

-- 3. Fill it with 1000 rows from a recursive CTE.  Each vector is built as a
--    JSON array of 8 numbers and turned into a float32 BLOB by embkv_vec().
--    Row id belongs to cluster id % 10: its vector is the cluster's centre
--    plus a little noise, so rows of one cluster point the same way (we will
--    find them again by cosine similarity in step 6).  The noise and centres
--    come from h(x) = (x * 2654435761 mod 4294967291) mod 2001 / 1000 - 1, a
--    deterministic pseudo-random number in [-1, 1] hashed from an integer.
WITH RECURSIVE
  n(id) AS (SELECT 1 UNION ALL SELECT id + 1 FROM n WHERE id < 1000),
  k(j)  AS (SELECT 0 UNION ALL SELECT j + 1 FROM k WHERE j < 7)
INSERT INTO item(id, vec)
SELECT id, (SELECT embkv_vec(json_group_array(
                     ((1000 + (id % 10) * 8 + j) * 2654435761 % 4294967291) % 2001 / 1000.0 - 1.0
              + 0.2 * (((100000 + id * 8 + j) * 2654435761 % 4294967291) % 2001 / 1000.0 - 1.0)))
            FROM k)                    -- h(cluster, j) + 0.2 * h(id, j)
FROM n;
SELECT count(*) AS rows FROM item;

-- 4. Read rows back.  `id = ?` is a point lookup; embkv_json() shows a vector
--    as JSON (the shortest decimals that read back to the same float32s).
SELECT id, embkv_json(vec) AS vec, clock, tier FROM item WHERE id = 42;
--    `id IN (...)` is served by ONE batched lookup (ids that do not exist,
--    like 5000, are simply absent); EXPLAIN QUERY PLAN shows which plan the
--    virtual table chose.
SELECT id, embkv_dims(vec) AS dims, round(embkv_norm(vec), 4) AS norm
FROM item WHERE id IN (7, 42, 999, 5000) ORDER BY id;
EXPLAIN QUERY PLAN SELECT id, vec FROM item WHERE id IN (7, 42, 999);

-- Vectors may also be written as JSON text (or as a float32 BLOB from a
-- program), and updated in place; each update increments the row's clock.
INSERT INTO item(id, vec) VALUES (1001, '[1, 0, 0, 0, 0, 0, 0, 0]');
UPDATE item SET vec = embkv_scale(vec, 2) WHERE id = 1001;
SELECT id, embkv_json(vec) AS vec, clock FROM item WHERE id = 1001;

-- 5. Vector math in SQL (reductions are computed in double precision).
SELECT round(embkv_dot(a.vec, b.vec), 4)    AS dot,
       round(embkv_cosine(a.vec, b.vec), 4) AS cosine,
       round(embkv_l2(a.vec, b.vec), 4)     AS l2
FROM item a, item b WHERE a.id = 42 AND b.id = 52;
SELECT embkv_json(embkv_add('[1, 2]', '[10, 20]'))  AS added,
       embkv_json(embkv_sub('[1, 2]', '[10, 20]'))  AS subtracted,
       embkv_json(embkv_scale('[1, 2]', 0.5))       AS scaled,
       embkv_cosine('[1, 0]', '[0, 0]')             AS cosine_of_zero_is_null;

-- 6. Top-5 nearest neighbours of row 42 by cosine similarity.  This is a scan
--    of the table; the neighbours are all in 42's cluster (id % 10 = 2).
SELECT id, id % 10 AS cluster,
       round(embkv_cosine(vec, (SELECT vec FROM item WHERE id = 42)), 4) AS cosine
FROM item WHERE id <> 42
ORDER BY cosine DESC, id LIMIT 5;

-- 7. Aggregates: the mean vector of each cluster (embkv_avg; embkv_sum also
--    exists), and how far row 42 is from each cluster's mean.
SELECT id % 10 AS cluster, count(*) AS n,
       round(embkv_l2(embkv_avg(vec), (SELECT vec FROM item WHERE id = 42)), 4) AS l2_to_42
FROM item WHERE id <= 1000 GROUP BY cluster ORDER BY l2_to_42 LIMIT 3;

-- 8. Writes obey transactions: a rolled-back DELETE leaves no trace.
BEGIN;
DELETE FROM item WHERE id > 900;
SELECT count(*) AS rows_inside_transaction FROM item;
ROLLBACK;
SELECT count(*) AS rows_after_rollback FROM item;

-- 9. Make the current state durable (a COMMIT of SQL writes is one too), and
--    look at the store's statistics, returned as JSON.
SELECT embkv_checkpoint('item') AS checkpoint;
SELECT key, value FROM json_each(embkv_stats('item'));
